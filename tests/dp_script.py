"""Scripted msServiceProfiler runs: every request, execution time and KV level exactly as given.

tests/synth_service.py simulates a service, so its numbers follow from the load; a near-miss test
of dp-imbalance needs the opposite: one condition of a verdict missed on purpose while every other
one holds, which needs each number chosen. This writer takes the run as data and writes the two
files dp-imbalance reads (``batch.csv`` with dp_rank, ``request.csv``):

- ``Request(dp, t_s, ...)``: one request arriving ``t_s`` seconds after the run's start, with its
  prompt / output tokens and its queue wait, first-token latency and end-to-end time (ms). Its
  first scheduling is a batching row of its domain ``wait_ms`` after arrival (res_list names it),
  so its DP domain comes from batch.csv as in a real run;
- ``Exec(dp, t_s, dur_ms)``: one ``modelExec`` execution row;
- ``Kv(dp, t_s, usage, total_blocks)``: one batching row carrying the domain's KV level.

Every domain also gets an empty batching row at t = 0, so the run's windows start exactly at 0
(``window_s`` windows are counted from the run's first row). Same arguments -> identical files.

``counts_run(counts)`` spreads ``counts[(window, dp)]`` arrivals evenly over each 5 s window.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

START_US = 1_773_992_798_000_000  # 2026-03-20 15:46:38 Asia/Shanghai
WINDOW_S = 5.0  # dp-imbalance's default window


@dataclass(frozen=True)
class Request:
    dp: int
    t_s: float
    prompt: int = 500
    output: int = 50
    wait_ms: float = 10.0
    ttft_ms: float = 100.0
    e2e_ms: float = 500.0


@dataclass(frozen=True)
class Exec:
    dp: int
    t_s: float
    dur_ms: float


@dataclass(frozen=True)
class Kv:
    dp: int
    t_s: float
    usage: float
    total_blocks: int = 1000


BATCH_HEADER = (
    "name,res_list,start_time(ms),end_time(ms),during_time(ms),batch_type,prof_id,batch_size,"
    "total_blocks,used_blocks,free_blocks,kvcache_usage_rate,dp_rank"
)
REQUEST_HEADER = (
    "http_rid,recv_token_size,reply_token_size,execution_time(ms),queue_wait_time(ms),"
    "first_token_latency(ms),cache_hit_rate,start_time(ms)"
)


def _us(t_s: float) -> int:
    return START_US + int(round(t_s * 1e6))


def write_run(out: str | Path, requests, execs=(), kvs=(), n_dp: int | None = None) -> Path:
    """Write batch.csv and request.csv into folder ``out``; returns the folder."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    domains = range(n_dp if n_dp is not None else 1 + max(r.dp for r in requests))
    rows = []  # (start_us, text)

    def batch(name, items, start_us, dur_ms, dp, kv=("", "", "", "")):
        rl = '"[' + ", ".join(items) + ']"'
        end_us = start_us + int(round(dur_ms * 1000))
        text = f"{name},{rl},{start_us}.0,{end_us}.0,{dur_ms!r},Prefill,ms_service_node0-{201330 + dp},{len(items)}.0,"
        rows.append((start_us, text + ",".join(str(x) for x in kv) + f",{dp}"))

    for dp in domains:
        batch("batchFrameworkProcessing", [], START_US, 1.0, dp)
    lines = [REQUEST_HEADER]
    for i, r in enumerate(requests):
        rid = f"req-{i:05d}"
        item = (
            f"{{'rid': '{rid}', 'iter': 0, 'type': 0, 'num_scheduled_tokens': {r.prompt}, "
            f"'num_prompt_tokens': {r.prompt}, 'num_computed_tokens': 0}}"
        )
        batch("batchFrameworkProcessing", [item], _us(r.t_s) + int(round(r.wait_ms * 1000)), 1.0, r.dp)
        lines.append(
            f"{rid},{r.prompt},{r.output},{r.e2e_ms!r},{r.wait_ms!r},{r.ttft_ms!r},N/A,{_us(r.t_s) / 1000:.3f}"
        )
    for e in execs:
        batch("modelExec", [], _us(e.t_s), e.dur_ms, e.dp)
    for k in kvs:
        used = int(round(k.usage * k.total_blocks))
        batch(
            "batchFrameworkProcessing",
            [],
            _us(k.t_s),
            1.0,
            k.dp,
            (k.total_blocks, used, k.total_blocks - used, k.usage),
        )
    rows.sort(key=lambda x: x[0])
    (out / "batch.csv").write_text(BATCH_HEADER + "\n" + "\n".join(t for _, t in rows) + "\n", encoding="utf-8")
    (out / "request.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def counts_run(counts: dict[tuple[int, int], int], fields=None) -> list[Request]:
    """Requests from ``{(window, dp): n}``: n arrivals evenly spread over the 5 s window (each
    domain offset a little, so no two arrivals coincide); ``fields(window, dp, i)`` gives the
    other Request fields of the i-th request of a cell (default: the Request defaults)."""
    out = []
    for (w, dp), n in sorted(counts.items()):
        for i in range(n):
            t = w * WINDOW_S + (i + 0.5) * WINDOW_S / n + 0.001 * (dp + 1)
            out.append(Request(dp, t, **(fields(w, dp, i) if fields else {})))
    return out


def per_window_execs(n_windows: int, n_dp: int, dur_ms) -> list[Exec]:
    """One execution row per domain in the middle of every window; ``dur_ms(window, dp)``."""
    return [Exec(dp, w * WINDOW_S + 2.5, dur_ms(w, dp)) for w in range(n_windows) for dp in range(n_dp)]


def per_window_kv(n_windows: int, n_dp: int, usage, total_blocks: int = 1000) -> list[Kv]:
    """One KV row per domain in the middle of every window; ``usage(window, dp)``."""
    return [Kv(dp, w * WINDOW_S + 2.6, usage(w, dp), total_blocks) for w in range(n_windows) for dp in range(n_dp)]
