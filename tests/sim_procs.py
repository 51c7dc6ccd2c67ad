"""Simulated vLLM exporter processes (tests/vllm_sim.py) for the tests that watch, capture and
report on live metrics: each process listens on 127.0.0.1, stops by itself after ``duration``
seconds and is killed by ``close()`` whatever happens."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

SIM = Path(__file__).resolve().parent / "vllm_sim.py"


class Sims:
    """Exporter processes, each killed at the end of the test."""

    def __init__(self, duration: float = 20.0):
        self.duration = duration
        self.procs: list[subprocess.Popen] = []
        self.started: dict[int, float] = {}  # port -> wall time its simulation clock started

    def start(self, *args: str, port: int = 0, duration: float | None = None) -> int:
        seconds = self.duration if duration is None else duration
        proc = subprocess.Popen(
            [sys.executable, str(SIM), "--port", str(port), "--duration", str(seconds), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(15)
        if not got or not got[0].startswith("PORT "):
            proc.kill()
            raise RuntimeError(
                f"exporter did not start: {proc.stderr.read() if proc.poll() is not None else 'no port'}"
            )
        port = int(got[0].split()[1])
        self.started[port] = time.time()
        return port

    def stop(self, proc: subprocess.Popen) -> None:
        proc.kill()
        proc.wait(5)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(5)
            p.stdout.close()
            p.stderr.close()
