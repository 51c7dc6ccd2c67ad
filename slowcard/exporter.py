"""The watch's current verdicts as Prometheus metrics (`slowcard watch --serve HOST:PORT`), with
the official client (the ``metrics`` extra: prometheus_client).

Series, refreshed after every judged collection:

- ``slowcard_verdict{query, subject, cause}``: 0 PASS, 1 WARN, 2 FAIL. One series per watched
  query with ``subject=""`` and ``cause=""`` (the query's status; absent while it SKIPs or
  ERRORs), and one per finding (``subject="DP domain 2"``, its cause) while it holds: a finding
  that clears disappears, so an alert on it resolves;
- ``slowcard_cost_pct{query, subject, cause}``: a finding's cost, % of the time it belongs to
  (findings that give one);
- ``slowcard_last_window_timestamp_seconds``: end of the newest window judged (staleness: alert
  when it stops moving);
- ``slowcard_last_judged_timestamp_seconds``: when the verdicts were judged.

Every series carries ``run`` (the watch's run name). Library code: no printing.
"""

from __future__ import annotations

import threading

from . import findings as findings_mod
from .errors import UsageError

LEVELS = {"PASS": 0, "WARN": 1, "FAIL": 2}


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0: any free one)."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--serve {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9464 (port 0: any free port)")
    return host, int(port)


def _client():
    try:
        import prometheus_client
        from prometheus_client.core import GaugeMetricFamily
    except ImportError:
        raise UsageError(
            "--serve needs prometheus_client: pip install 'slowcard[metrics]' (or pip install prometheus_client)"
        ) from None
    return prometheus_client, GaugeMetricFamily


class VerdictCollector:
    """A prometheus_client collector of the latest judged step (``update``); thread-safe: the
    HTTP server's thread reads what the watch's thread wrote."""

    def __init__(self, run: str):
        self.run = run
        self._lock = threading.Lock()
        self._results: dict = {}
        self._window_ts_ns: int | None = None
        self._judged_ts_ns: int | None = None

    def update(self, step) -> None:
        """Take the verdicts of a watch step (a step that judged nothing keeps the previous ones)."""
        if not step.results:
            return
        with self._lock:
            self._results = dict(step.results)
            self._judged_ts_ns = step.ts_ns
            if step.windows:
                self._window_ts_ns = max(r["ts_ns"] for r in step.windows)

    def describe(self):
        return []  # no fixed set: the series follow the findings

    def collect(self):
        _, Gauge = _client()
        with self._lock:
            results, window_ns, judged_ns = self._results, self._window_ts_ns, self._judged_ts_ns
        labels = ["run", "query", "subject", "cause"]
        verdict = Gauge("slowcard_verdict", "slowcard verdict: 0 PASS, 1 WARN, 2 FAIL", labels=labels)
        cost = Gauge("slowcard_cost_pct", "cost of a slowcard finding, % of the time it belongs to", labels=labels)
        for name, res in results.items():
            status = str(res.status)
            if status in LEVELS:
                verdict.add_metric([self.run, name, "", ""], LEVELS[status])
            seen = set()
            for f in findings_mod.findings(res):
                key = (f.label, f.causes or f.cause or "")
                if key in seen:
                    continue  # one series per (subject, cause): a subject's rows by layer are one card
                seen.add(key)
                verdict.add_metric([self.run, name, *key], LEVELS[str(f.level)])
                if f.cost_pct is not None:
                    cost.add_metric([self.run, name, *key], f.cost_pct)
        yield verdict
        yield cost
        for metric, ts, help_text in (
            ("slowcard_last_window_timestamp_seconds", window_ns, "end of the newest window judged, unix seconds"),
            ("slowcard_last_judged_timestamp_seconds", judged_ns, "when the verdicts were judged, unix seconds"),
        ):
            g = Gauge(metric, help_text, labels=["run"])
            if ts is not None:
                g.add_metric([self.run], ts / 1e9)
            yield g


class Exporter:
    """An HTTP server of the collector on ``host:port`` (``port`` 0: any free port; ``.port``
    tells which), in a daemon thread; ``close`` stops it."""

    def __init__(self, run: str, host: str, port: int):
        prometheus_client, _ = _client()
        self.collector = VerdictCollector(run)
        self.registry = prometheus_client.CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        try:
            self._server, self._thread = prometheus_client.start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise UsageError(f"--serve {host}:{port}: cannot listen there ({exc.strerror or exc})") from None
        self.host, self.port = host, self._server.server_port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def update(self, step) -> None:
        self.collector.update(step)

    def text(self) -> str:
        """The exposition as a scrape would read it."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode("utf-8")

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
