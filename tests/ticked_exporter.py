"""A vLLM-shaped /metrics exporter whose traffic advances by scrapes, not by the wall clock, and a
fake clock for slowcard.watch: together a `slowcard watch` test whose every window, rate and
verdict is the same on an idle machine and on one running two test suites.

``TickedExporter``: an in-process HTTP server on 127.0.0.1 port 0. Each GET /metrics first
advances the simulated time by ``per_scrape_s`` (in ticks of 0.05 s), then answers: the same
traffic model as tests/vllm_sim.py (engines at ``rate`` requests/s with jitter; the hot engine
gets ``hot_factor`` times the requests in [hot_from, hot_to) and its TTFT grows meanwhile), from a
seeded RNG. ``FakeClock``: monotonic / time_ns / sleep for ``slowcard.watch.time``: time moves
only when the watch sleeps, so a `--duration 7.5s --interval 0.5s` watch makes exactly 16
collections however long each one takes."""

from __future__ import annotations

import http.server
import random
import threading
import time


class FakeClock:
    """Stands in for the ``time`` module in slowcard.watch: the watch's sleeps advance it."""

    def __init__(self, start_ns: int | None = None):
        self.start_ns = time.time_ns() if start_ns is None else start_ns
        self.elapsed_s = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return 1000.0 + self.elapsed_s

    def time_ns(self) -> int:
        return self.start_ns + int(round(self.elapsed_s * 1e9))

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.elapsed_s += max(0.0, s)


class TickedExporter:
    def __init__(
        self,
        engines=(0, 1, 2, 3),
        rate: float = 40.0,
        tick_s: float = 0.05,
        per_scrape_s: float = 0.5,
        hot_engine: int | None = None,
        hot_from: float = 0.0,
        hot_to: float = 1e9,
        hot_factor: float = 2.5,
        jitter: float = 0.1,
        seed: int = 7,
    ):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

        self._latest = generate_latest
        self.engines, self.rate, self.tick_s, self.per_scrape_s = list(engines), rate, tick_s, per_scrape_s
        self.hot_engine, self.hot_from, self.hot_to, self.hot_factor = hot_engine, hot_from, hot_to, hot_factor
        self.jitter, self.rng = jitter, random.Random(seed)
        self.t = 0.0
        self.scrapes = 0
        self.reg = reg = CollectorRegistry()
        lab = ["engine", "model_name"]
        self.running = Gauge("vllm:num_requests_running", "Running requests.", lab, registry=reg)
        self.waiting = Gauge("vllm:num_requests_waiting", "Waiting requests.", lab, registry=reg)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage 0-1.", lab, registry=reg)
        self.success = Counter("vllm:request_success", "Finished requests.", lab + ["finished_reason"], registry=reg)
        self.prompt = Counter("vllm:prompt_tokens", "Prompt tokens.", lab, registry=reg)
        self.gen = Counter("vllm:generation_tokens", "Generated tokens.", lab, registry=reg)
        buckets = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", lab, buckets=buckets, registry=reg)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "E2E latency.",
            lab,
            buckets=(0.5, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 20.0, 40.0),
            registry=reg,
        )
        self.carry = {e: 0.0 for e in self.engines}
        self._lock = threading.Lock()
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                with exporter._lock:
                    exporter._advance(exporter.per_scrape_s)
                    exporter.scrapes += 1
                    body = exporter._latest(exporter.reg)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"

    def _advance(self, span_s: float) -> None:
        for _ in range(int(round(span_s / self.tick_s))):
            t = self.t
            for e in self.engines:
                hot = e == self.hot_engine and self.hot_from <= t < self.hot_to
                factor = self.hot_factor if hot else 1.0
                self.carry[e] += self.rate * factor * (1 + self.rng.uniform(-self.jitter, self.jitter)) * self.tick_s
                n = int(self.carry[e])
                self.carry[e] -= n
                labels = {"engine": str(e), "model_name": "sim"}
                base_ttft = 0.04 + (0.12 * (t - self.hot_from) if hot else 0.0)
                for _ in range(n):
                    self.success.labels(**labels, finished_reason="stop").inc()
                    self.prompt.labels(**labels).inc(self.rng.randint(200, 400))
                    self.gen.labels(**labels).inc(self.rng.randint(50, 150))
                    self.ttft.labels(**labels).observe(base_ttft * self.rng.uniform(0.7, 1.3))
                    self.e2e.labels(**labels).observe(1.0 + base_ttft + self.rng.uniform(0, 0.5))
                self.running.labels(**labels).set(8 * factor)
                self.waiting.labels(**labels).set(int(6 * (t - self.hot_from)) if hot else self.rng.randint(0, 1))
                self.kv.labels(**labels).set(min(0.98, 0.35 * factor))
            self.t += self.tick_s

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
