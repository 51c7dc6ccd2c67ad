"""An in-process vLLM-shaped profiler endpoint on 127.0.0.1 for the capture tests: it serves
POST /start_profile and /stop_profile, records each request in order (``events``) and says
whether "the profiler" is on, so a test can wait for the start (event ordering, never a sleep)
and check that slowcard stopped what it started.

    with ProfilerStub(out_dir, files={"r0.pt.trace.json.gz": data}) as stub:
        url = stub.base            # http://127.0.0.1:PORT
        stub.wait_for("start")     # the start request arrived

Modes:
  ok           200 on both; at the stop, ``files`` are written into ``out_dir``
  hang_start   the start turns the profiler on, then answers only when the stop arrives (or the
               block ends): the client's request times out after the start took effect
  status_N     HTTP N on both requests (the profiler stays off)
Every handler ends by itself: the server stops with the block.
"""

from __future__ import annotations

import http.server
import threading
from pathlib import Path


class ProfilerStub:
    def __init__(self, out_dir: Path | None = None, files: dict[str, bytes] | None = None, mode: str = "ok"):
        self.out_dir = out_dir
        self.files = files or {}
        self.mode = mode
        self.events: list[str] = []
        self.on = False
        self._cond = threading.Condition()
        self._released = threading.Event()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int) -> None:
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                what = self.path.split("?")[0].strip("/")
                if what not in ("start_profile", "stop_profile"):
                    return self._send(404)
                if owner.mode.startswith("status_"):
                    owner._record(what.split("_")[0])
                    return self._send(int(owner.mode[len("status_") :]))
                if what == "start_profile":
                    owner._record("start", on=True)
                    if owner.mode == "hang_start":
                        owner._released.wait(60)
                    return self._send(200)
                if owner.out_dir is not None:
                    for name, data in owner.files.items():
                        (owner.out_dir / name).write_bytes(data)
                owner._record("stop", on=False)
                owner._released.set()
                try:
                    return self._send(200)
                except OSError:
                    return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _record(self, event: str, on: bool | None = None) -> None:
        with self._cond:
            self.events.append(event)
            if on is not None:
                self.on = on
            self._cond.notify_all()

    def wait_for(self, event: str, count: int = 1, timeout_s: float = 120.0) -> bool:
        """Block until ``event`` was received ``count`` times (the timeout only keeps a broken
        run from hanging the suite; nothing is measured by it)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.events.count(event) >= count, timeout_s)

    def __enter__(self) -> ProfilerStub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._released.set()
        self.server.shutdown()
        self.server.server_close()
