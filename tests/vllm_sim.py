"""A vLLM-shaped Prometheus exporter driven by a small traffic simulation (for the watch tests).

Run as a process: ``python tests/vllm_sim.py --engines 0,1,2,3 [options]``. It serves
``/metrics`` on 127.0.0.1 (``--port 0``: any free port), prints ``PORT <n>`` on stdout once
listening, and exits by itself after ``--duration`` seconds. Every ``--tick`` seconds each
engine (DP domain, label ``engine``) finishes requests at its rate; each request adds prompt and
generation tokens and one TTFT / e2e observation. Metric names and types are vLLM's
(``vllm:num_requests_running``, ``vllm:prompt_tokens_total``,
``vllm:time_to_first_token_seconds`` histogram, …).

Scenario knobs (times in seconds since start):

- ``--hot-engine E --hot-from A --hot-to B --hot-factor F``: engine E gets F times the requests
  in [A, B) and its requests' TTFT grows with the time since A (a queue building up), so the
  instance P99 rises while the domain stays hot;
- ``--jitter J``: every tick each engine's rate is multiplied by a uniform factor in [1-J, 1+J];
- ``--hot-experts L:R:S,…``: expert slots (layer, EP rank, slot) that get 4x the tokens in
  ``vllm:expert_tokens_total`` (``--expert-layers/ranks/slots`` size the MoE);
- ``--seed``: the RNG seed (same arguments -> same counts per tick).

Profiling (``--profile-dir DIR``, for `slowcard watch --capture vllm`): the exporter also serves
vLLM's ``POST /start_profile`` and ``POST /stop_profile`` (and answers 404 on other paths, as
vLLM's API server does). At the stop it writes one torch-profiler trace per engine into DIR,
named as vLLM's workers name theirs (``dp<E>_rank<E>.<ms>.pt.trace.json.gz``), from the Kineto
generator of tests/synth_kineto.py (``write_ep_run``, gloo style): one EP rank per DP engine
(vLLM data parallel + expert parallel with TP 1), scenario ``token_skew`` on the hot engine when
it was hot during the capture (its GroupedMatmul gets ~3.5x the rows, the others wait for it at
every combine: ep-slow-rank names that rank, cause token-skew), ``balanced`` otherwise.
``--profile-status CODE`` answers both endpoints with that HTTP status instead (404, 500);
``--profile-write never`` writes nothing, ``half`` leaves rank 0's file cut short (a profiler
killed mid-write), ``slow`` writes the first half of each file, the rest 1.5 s later (files still growing);
``--profile-delay S`` waits S seconds after the stop before writing.
"""

from __future__ import annotations

import argparse
import http.server
import random
import sys
import tempfile
import threading
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--engines", default="0,1,2,3")
    ap.add_argument("--rate", type=float, default=40.0, help="requests/s per engine")
    ap.add_argument("--tick", type=float, default=0.05)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--hot-engine", type=int, default=None)
    ap.add_argument("--hot-from", type=float, default=0.0)
    ap.add_argument("--hot-to", type=float, default=1e9)
    ap.add_argument("--hot-factor", type=float, default=2.5)
    ap.add_argument("--jitter", type=float, default=0.1)
    ap.add_argument("--hot-experts", default="")
    ap.add_argument("--expert-layers", type=int, default=2)
    ap.add_argument("--expert-ranks", type=int, default=4)
    ap.add_argument("--expert-slots", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--profile-dir", default=None)
    ap.add_argument("--profile-status", type=int, default=200)
    ap.add_argument("--profile-write", choices=("ok", "never", "half", "slow"), default="ok")
    ap.add_argument("--profile-delay", type=float, default=0.2)
    a = ap.parse_args(argv)

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

    reg = CollectorRegistry()
    lab = ["engine", "model_name"]
    running = Gauge("vllm:num_requests_running", "Running requests.", lab, registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "Waiting requests.", lab, registry=reg)
    kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage 0-1.", lab, registry=reg)
    success = Counter("vllm:request_success", "Finished requests.", lab + ["finished_reason"], registry=reg)
    prompt = Counter("vllm:prompt_tokens", "Prompt tokens.", lab, registry=reg)
    gen = Counter("vllm:generation_tokens", "Generated tokens.", lab, registry=reg)
    buckets = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
    ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", lab, buckets=buckets, registry=reg)
    e2e = Histogram(
        "vllm:e2e_request_latency_seconds",
        "E2E latency.",
        lab,
        buckets=(0.5, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 20.0, 40.0),
        registry=reg,
    )
    hot_slots = set()
    for spec in filter(None, a.hot_experts.split(",")):
        layer, rank, slot = (int(x) for x in spec.split(":"))
        hot_slots.add((layer, rank, slot))
    experts = (
        Counter("vllm:expert_tokens", "Tokens routed to each expert slot.", ["layer", "rank", "slot"], registry=reg)
        if hot_slots
        else None
    )

    t0 = time.monotonic()
    if a.profile_dir:
        server = _profiling_server(a, reg, lambda: time.monotonic() - t0)
    else:
        server, _thread = start_http_server(a.port, addr="127.0.0.1", registry=reg)
    print(f"PORT {server.server_port}", flush=True)

    rng = random.Random(a.seed)
    engines = [int(e) for e in a.engines.split(",")]
    carry = {e: 0.0 for e in engines}
    while True:
        t = time.monotonic() - t0
        if t >= a.duration:
            break
        for e in engines:
            hot = e == a.hot_engine and a.hot_from <= t < a.hot_to
            rate = a.rate * (a.hot_factor if hot else 1.0) * (1 + rng.uniform(-a.jitter, a.jitter))
            carry[e] += rate * a.tick
            n = int(carry[e])
            carry[e] -= n
            labels = {"engine": str(e), "model_name": "sim"}
            # the hot domain's queue grows while it stays hot: its TTFT climbs with time
            base_ttft = 0.04 + (0.12 * (t - a.hot_from) if hot else 0.0)
            for _ in range(n):
                success.labels(**labels, finished_reason="stop").inc()
                prompt.labels(**labels).inc(rng.randint(200, 400))
                gen.labels(**labels).inc(rng.randint(50, 150))
                ttft.labels(**labels).observe(base_ttft * rng.uniform(0.7, 1.3))
                e2e.labels(**labels).observe(1.0 + base_ttft + rng.uniform(0, 0.5))
            running.labels(**labels).set(8 * (a.hot_factor if hot else 1.0))
            waiting.labels(**labels).set(int(6 * (t - a.hot_from)) if hot else rng.randint(0, 1))
            kv.labels(**labels).set(min(0.98, 0.35 * (a.hot_factor if hot else 1.0)))
        if experts is not None:
            for layer in range(a.expert_layers):
                for rank in range(a.expert_ranks):
                    for slot in range(a.expert_slots):
                        tok = 100 * (4 if (layer, rank, slot) in hot_slots else 1) * (1 + rng.uniform(-0.05, 0.05))
                        experts.labels(layer=str(layer), rank=str(rank), slot=str(slot)).inc(tok * a.tick)
        time.sleep(a.tick)
    server.shutdown()
    return 0


def write_capture(a, out_dir: Path, hot_during_capture: bool) -> list[Path]:
    """The trace set of one capture: one Kineto trace per engine (EP rank = DP engine)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from synth_kineto import cut_trace, write_ep_run

    engines = sorted(int(e) for e in a.engines.split(","))
    hot = a.hot_engine if hot_during_capture and a.hot_engine in engines else None
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_ep_run(
            tmp,
            ranks=len(engines),
            scenario="token_skew" if hot is not None else "balanced",
            slow_rank=engines.index(hot) if hot is not None else 0,
            seed=a.seed,
        )
        stamp = int(time.time() * 1000)
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for r, p in enumerate(paths):
            dest = out_dir / f"dp{engines[r]}_rank{r}.{stamp}.pt.trace.json.gz"
            data = p.read_bytes()
            if a.profile_write == "slow":
                dest.write_bytes(data[: len(data) // 2])
                written.append((dest, data))
            else:
                dest.write_bytes(data)
            if a.profile_write == "half" and r == 0:
                cut_trace(dest, 4000)
        if written:
            time.sleep(1.5)  # the second halves, once every first half has been there a while
        for dest, data in written:
            dest.write_bytes(data)
    return sorted(out_dir.iterdir())


def _profiling_server(a, reg, now_s):
    """/metrics plus vLLM's /start_profile and /stop_profile on 127.0.0.1 (threaded)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    state = {"started_at": None}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.split("?")[0] == "/metrics":
                self._send(200, generate_latest(reg), CONTENT_TYPE_LATEST)
            else:
                self._send(404, b'{"detail":"Not Found"}', "application/json")

        def do_POST(self):
            what = self.path.split("?")[0]
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            if what not in ("/start_profile", "/stop_profile"):
                self._send(404, b'{"detail":"Not Found"}', "application/json")
                return
            if a.profile_status != 200:
                self._send(a.profile_status, b'{"detail":"profiler failed"}', "application/json")
                return
            if what == "/start_profile":
                state["started_at"] = now_s()
                self._send(200, b"")
                return
            started, state["started_at"] = state["started_at"], None
            self._send(200, b"")
            if started is None or a.profile_write == "never":
                return
            end = now_s()
            hot = a.hot_engine is not None and started < a.hot_to and end > a.hot_from

            def later():
                time.sleep(a.profile_delay)
                write_capture(a, Path(a.profile_dir), hot)

            threading.Thread(target=later, daemon=True).start()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    sys.exit(main())
