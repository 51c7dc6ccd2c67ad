"""A real Prometheus server (the apt-installed `prometheus` binary) on loopback for the tests that
scrape exporters through it: started with a 1 s scrape interval over the given targets (and rule
files), queried through its HTTP API, killed by ``close()`` whatever happens."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
from pathlib import Path

from slowcard.watch import http_get

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
NO_PROMETHEUS = "the `prometheus` binary is not installed (Debian package prometheus; .ci/run installs it)"
NO_PROMTOOL = "the `promtool` binary is not installed (Debian package prometheus; .ci/run installs it)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """One server scraping ``targets`` (``host:port`` each, one job per target) every second."""

    def __init__(self, folder: Path, targets: list[str], rule_files: list[Path] = ()):
        assert PROMETHEUS is not None, NO_PROMETHEUS
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = folder / "prometheus.yml"
        jobs = "".join(
            f"  - job_name: job{i}\n    static_configs:\n      - targets: ['{t}']\n" for i, t in enumerate(targets)
        )
        rules = "rule_files:\n" + "".join(f"  - {Path(r).resolve()}\n" for r in rule_files) if rule_files else ""
        cfg.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n" + rules + "scrape_configs:\n" + jobs
        )
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={folder / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def api(self, path: str, **params) -> dict:
        """The JSON answer of ``/api/v1/<path>`` ({} when there is none yet)."""
        assert self.proc.poll() is None, self.proc.stderr.read().decode()[-500:]
        got = http_get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}", 2.0)
        try:
            return json.loads(got.body or "{}")
        except ValueError:
            return {}

    def query(self, expr: str) -> list:
        """The instant vector of ``expr`` (empty when it has no result yet)."""
        return self.api("query", query=expr).get("data", {}).get("result", [])

    def wait_for(self, expr: str, bound_s: float = 25.0) -> list:
        """The result of ``expr`` once it has one, polled every 0.5 s up to ``bound_s`` (a bound on
        waiting for the server, not a timing assertion); [] when it never had one."""
        deadline = time.monotonic() + bound_s
        while time.monotonic() < deadline:
            got = self.query(expr)
            if got:
                return got
            time.sleep(0.5)
        return []

    def scrapes(self) -> int:
        """Scrapes of the first target in the last minute."""
        try:
            return int(self.query("count_over_time(up[1m])")[0]["value"][1])
        except (IndexError, KeyError, ValueError):
            return 0

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.proc.stderr.close()
