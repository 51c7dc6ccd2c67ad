"""Deterministic msServiceProfiler output for a service with N data-parallel (DP) domains.

A small discrete simulation of vLLM-style continuous batching, one scheduler per DP domain:
requests arrive at a steady rate and are assigned to DP domains by a (weighted) round robin;
each domain admits waiting requests while it has room (``max_running`` sequences and KV
blocks), runs one iteration (a ``batchFrameworkProcessing`` batching row followed by a
``modelExec`` execution row) over its prefill and decode requests, and repeats. Queue wait,
first-token latency, KV usage and execution time therefore follow from the load, as they do
in a real service: a domain that receives more (or heavier) work than it can serve queues.

Written files (columns exactly as in ../shared/docs/formats.md section 1):
``batch.csv`` (res_list as a Python literal, optional KV and speculative-decoding columns),
``request.csv``, ``kvcache.csv`` (new ``blocks`` shape or old ``device`` shape),
``forward.csv`` and ``chrome_tracing.json`` (``process_labels`` "<host>,dp<N>", KV counters
``Schedule.KVCache-dp<N>``, queue counters, optionally an X event per batch).

Scenarios (the hot domain is ``hot_dp``):
- ``balanced``: equal requests, equal token mix, equal speed;
- ``request_skew``: the hot domain gets ``skew_weight`` x the requests of another domain;
- ``token_skew``: equal request counts, the hot domain's requests are ``token_factor`` x longer;
- ``slow_execution``: equal requests and tokens, the hot domain executes ``slow_factor`` x slower;
- ``burst``: a request skew lasting only ``burst_len_s`` seconds (traffic jitter);
- ``hot_no_impact``: a request skew on a service with ample capacity (nobody waits);
- ``kv_pressure``: equal traffic and speed, but the hot domain was started with ``kv_factor`` x
  the KV blocks of the others (a configuration mismatch: its KV cache fills, its requests queue);
- ``no_dp_rank``: balanced, but no DP id anywhere (``dp_rank`` is ``<NA>``, labels without dp).

Traffic: ``arrivals="steady"`` (a fixed gap with a little jitter, the default) or ``"poisson"``
(exponential gaps: real traffic); ``assign="round_robin"`` (smooth weighted round robin, the
default; a dispatcher that balances counts) or ``"random"`` (each request draws its domain with
the scenario's weights, so counts per domain are Poisson/binomial); ``prompt_dist="uniform"``
(``prompt_tokens`` range, the default) or ``"lognormal"`` (median ``prompt_median``, log-sd
``prompt_sigma``, capped at ``prompt_max``: real prompt lengths are heavy-tailed).
``realistic_config`` is the calibration preset (bench/calibrate_dp.py).

Nothing here is random at run time: a seeded ``random.Random`` gives the same files every time.

    python -m tests.synth_service --write testdata/service_dp4_request_skew
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import random
import sys
from collections import deque
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

SCENARIOS = (
    "balanced",
    "request_skew",
    "token_skew",
    "slow_execution",
    "burst",
    "hot_no_impact",
    "kv_pressure",
    "no_dp_rank",
)

SHANGHAI = timezone(timedelta(hours=8))  # msServiceProfiler renders datetimes in Asia/Shanghai
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass
class ServiceConfig:
    """Everything that shapes one generated service run (defaults: the test size)."""

    scenario: str = "balanced"
    n_dp: int = 4
    hot_dp: int = 1
    duration_s: float = 20.0  # arrivals stop here; queued work then drains
    rate_rps: float = 8.0  # arrivals per second, all domains together
    prompt_tokens: tuple[int, int] = (400, 800)
    output_tokens: tuple[int, int] = (48, 80)
    # iteration time = (base + prefill_ms_per_token * prefill tokens + decode_ms_per_seq * decodes) * slow
    base_ms: float = 60.0
    prefill_ms_per_token: float = 0.1
    decode_ms_per_seq: float = 1.0
    sched_ms: float = 1.5  # batching (scheduling) time per iteration
    gap_ms: float = 0.5
    max_running: int = 32
    total_blocks: int = 96  # KV blocks per domain
    block_tokens: int = 128
    skew_weight: float = 2.0  # request_skew / hot_no_impact / burst: hot share vs one other
    token_factor: float = 2.0  # token_skew
    slow_factor: float = 2.0  # slow_execution
    kv_factor: float = 0.25  # kv_pressure: the hot domain's KV blocks vs the others'
    arrivals: str = "steady"  # "steady" | "poisson"
    assign: str = "round_robin"  # "round_robin" | "random"
    prompt_dist: str = "uniform"  # "uniform" (prompt_tokens range) | "lognormal"
    prompt_median: float = 2400.0
    prompt_sigma: float = 0.8
    prompt_max: int = 32000
    burst_start_s: float = 8.0
    burst_len_s: float = 4.0
    start_epoch_us: int = 1773992798_000000  # 2026-03-20 15:46:38 Asia/Shanghai
    time_unit: str = "us"  # what batch.csv `start_time(ms)` holds: "us" (the exporter) or "ms"
    kv_columns: bool = True
    spec_columns: bool = False
    na_dp: str = "<NA>"  # how an unknown dp_rank is written ("" is the other form)
    batch_dp: bool = True  # False: batch.csv has no dp_rank even though the trace labels have one
    kvcache_shape: str = "blocks"  # "blocks" (vLLM KVCacheStatus) or "device" (MindIE)
    trace_batches: bool = False  # an X event per batching / execution row in chrome_tracing.json
    host: str = "node0"
    first_pid: int = 201330
    seed: int = 7

    @property
    def has_dp(self) -> bool:
        return self.scenario != "no_dp_rank"

    def blocks(self, dp: int) -> int:
        """The KV pool of domain ``dp`` (smaller on the hot domain of kv_pressure)."""
        if self.scenario == "kv_pressure" and dp == self.hot_dp:
            return max(1, int(self.total_blocks * self.kv_factor))
        return self.total_blocks


def config_for(scenario: str, **overrides) -> ServiceConfig:
    """The preset of a scenario, with any field overridden."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
    cfg = ServiceConfig(scenario=scenario)
    if scenario == "hot_no_impact":
        # plenty of room: the busier domain never queues and its KV stays low
        cfg = replace(cfg, skew_weight=1.6, max_running=256, total_blocks=4096, rate_rps=6.0)
    if scenario == "burst":
        cfg = replace(cfg, skew_weight=3.0)
    return replace(cfg, **overrides)


def realistic_config(scenario: str = "balanced", **overrides) -> ServiceConfig:
    """Calibration traffic: Poisson arrivals at 0.8 requests/s per domain, lognormal prompts with a
    median of 2,400 tokens, 120 s, 4 domains, a KV pool of 640 blocks of 128 tokens."""
    base = dict(
        duration_s=120.0,
        rate_rps=3.2,
        arrivals="poisson",
        prompt_dist="lognormal",
        prompt_median=2400.0,
        prompt_sigma=0.8,
        output_tokens=(16, 64),
        base_ms=60.0,
        prefill_ms_per_token=0.1,
        decode_ms_per_seq=1.0,
        max_running=32,
        total_blocks=640,
        block_tokens=128,
        burst_len_s=3.0,
        burst_start_s=50.0,
        skew_weight=1.5,
        token_factor=2.0,
        slow_factor=1.5,
        kv_factor=0.175,
    )
    base.update(overrides)
    return config_for(scenario, **base)


def small_config(scenario: str = "request_skew", **overrides) -> ServiceConfig:
    """The committed example's size: 4 domains, ~20 s, slow heavy iterations, short outputs."""
    # skew 3x: 48 requests are too few to tell a 2x skew from chance (binomial z 2.4, dp-imbalance v2)
    base = dict(
        duration_s=20.0,
        rate_rps=2.4,
        skew_weight=3.0,
        prompt_tokens=(1500, 2500),
        output_tokens=(2, 4),
        base_ms=350.0,
        prefill_ms_per_token=0.02,
        decode_ms_per_seq=10.0,
        sched_ms=3.0,
        max_running=4,
        total_blocks=96,
        trace_batches=False,
    )
    base.update(overrides)
    return config_for(scenario, **base)


# ----------------------------------------------------------------------------- simulation


@dataclass
class Req:
    idx: int
    rid: str
    arrival_us: int
    dp: int
    prompt: int
    output: int
    blocks: int = 0
    generated: int = 0
    first_sched_us: int | None = None
    first_token_us: int | None = None
    finish_us: int | None = None


@dataclass
class Iteration:
    """One scheduler step of one domain: its batching row and its execution row."""

    dp: int
    sched_start_us: int
    sched_dur_us: int
    exec_start_us: int
    exec_dur_us: int
    prefill: list  # [Req]
    decode: list  # [(Req, iter)]
    used_blocks: int
    allocated: int
    freed: int
    waiting: int
    running: int


def _weights(cfg: ServiceConfig, t_s: float) -> list[float]:
    w = [1.0] * cfg.n_dp
    if cfg.scenario in ("request_skew", "hot_no_impact"):
        w[cfg.hot_dp] = cfg.skew_weight
    elif cfg.scenario == "burst" and cfg.burst_start_s <= t_s < cfg.burst_start_s + cfg.burst_len_s:
        w[cfg.hot_dp] = cfg.skew_weight
    return w


def make_requests(cfg: ServiceConfig) -> list[Req]:
    """Arrivals (steady or Poisson) assigned by smooth weighted round robin or a weighted draw."""
    rng = random.Random(cfg.seed)
    n = int(cfg.duration_s * cfg.rate_rps)
    if cfg.arrivals == "poisson":
        n = 3 * n + 100  # a bound only: Poisson arrivals stop at duration_s
    gap_us = 1e6 / cfg.rate_rps
    current = [0.0] * cfg.n_dp
    reqs = []
    t_poisson = 0.0
    for i in range(n):
        if cfg.arrivals == "poisson":
            t_poisson += rng.expovariate(1.0) * gap_us
            if t_poisson >= cfg.duration_s * 1e6:
                break
            t_us = cfg.start_epoch_us + int(t_poisson)
        else:
            t_us = cfg.start_epoch_us + int(i * gap_us + rng.uniform(0.0, 0.3) * gap_us)
        w = _weights(cfg, (t_us - cfg.start_epoch_us) / 1e6)
        total = sum(w)
        if cfg.assign == "random":
            dp = rng.choices(range(cfg.n_dp), weights=w)[0]
        else:
            for d in range(cfg.n_dp):
                current[d] += w[d]
            dp = max(range(cfg.n_dp), key=lambda d: (current[d], -d))
            current[dp] -= total
        if cfg.prompt_dist == "lognormal":
            prompt = min(cfg.prompt_max, max(1, int(rng.lognormvariate(math.log(cfg.prompt_median), cfg.prompt_sigma))))
        else:
            prompt = rng.randint(*cfg.prompt_tokens)
        output = rng.randint(*cfg.output_tokens)
        if cfg.scenario == "token_skew" and dp == cfg.hot_dp:
            prompt, output = int(prompt * cfg.token_factor), int(output * cfg.token_factor)
        reqs.append(Req(i, f"cmpl-{cfg.seed:02x}{i:06x}-0", t_us, dp, prompt, output))
    return reqs


def simulate_dp(cfg: ServiceConfig, dp: int, reqs: list[Req], rng: random.Random):
    """Yield the Iterations of one domain in time order (a generator: memory stays flat)."""
    slow = cfg.slow_factor if (cfg.scenario == "slow_execution" and dp == cfg.hot_dp) else 1.0
    total_blocks = cfg.blocks(dp)
    queue = deque()
    running: list[Req] = []
    used = 0
    freed_last = 0
    i = 0
    t = reqs[0].arrival_us if reqs else 0
    while i < len(reqs) or queue or running:
        while i < len(reqs) and reqs[i].arrival_us <= t:
            queue.append(reqs[i])
            i += 1
        if not queue and not running:
            t = reqs[i].arrival_us
            continue
        new = []
        while queue and len(running) + len(new) < cfg.max_running:
            r = queue[0]
            need = math.ceil((r.prompt + r.output) / cfg.block_tokens)  # reserved for the whole sequence
            if used + need > total_blocks and (running or new):
                break
            queue.popleft()
            r.blocks = need
            used += need
            new.append(r)
        decode = [(r, r.generated) for r in running]
        prefill_tokens = sum(r.prompt for r in new)
        jitter = 1.0 + rng.uniform(-0.04, 0.04)
        exec_ms = (
            (cfg.base_ms + cfg.prefill_ms_per_token * prefill_tokens + cfg.decode_ms_per_seq * len(decode))
            * slow
            * jitter
        )
        sched_us = int(cfg.sched_ms * 1000 * (1.0 + rng.uniform(-0.2, 0.2)))
        exec_start = t + sched_us + int(cfg.gap_ms * 1000)
        exec_us = int(exec_ms * 1000)
        exec_end = exec_start + exec_us
        it = Iteration(
            dp,
            t,
            sched_us,
            exec_start,
            exec_us,
            new,
            decode,
            used,
            sum(r.blocks for r in new),
            freed_last,
            len(queue),
            len(running) + len(new),
        )
        freed_last = 0
        for r in new:
            r.first_sched_us = t
            r.first_token_us = exec_end
            r.generated = 1
        for r, _ in decode:
            r.generated += 1
        still = []
        for r in running + new:
            if r.generated >= r.output:
                r.finish_us = exec_end
                used -= r.blocks
                freed_last += r.blocks
            else:
                still.append(r)
        running = still
        yield it
        t = exec_end + int(cfg.gap_ms * 1000)


def iterations(cfg: ServiceConfig, reqs: list[Req]):
    """Every domain's iterations merged in start-time order."""
    per_dp = [[r for r in reqs if r.dp == d] for d in range(cfg.n_dp)]
    gens = [simulate_dp(cfg, d, per_dp[d], random.Random(cfg.seed * 1000 + d)) for d in range(cfg.n_dp)]
    return heapq.merge(*gens, key=lambda it: (it.sched_start_us, it.dp))


# ----------------------------------------------------------------------------- formatting


class _Clock:
    """µs since epoch -> 'YYYY-MM-DD HH:MM:SS:ffffff' in Asia/Shanghai, cached per second."""

    def __init__(self):
        self.sec = None
        self.prefix = ""

    def __call__(self, us: int) -> str:
        s, frac = divmod(us, 1_000_000)
        if s != self.sec:
            self.sec = s
            self.prefix = (EPOCH + timedelta(seconds=s)).astimezone(SHANGHAI).strftime("%Y-%m-%d %H:%M:%S")
        return f"{self.prefix}:{frac:06d}"


def _q(text: str) -> str:
    """CSV-quote a field when it needs it (as pandas / the csv module do)."""
    if any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _ms(us: int) -> str:
    return repr(round(us / 1000.0, 3))


def _batch_type(it: Iteration) -> str:
    kinds = (["Prefill"] if it.prefill else []) + (["Decode"] if it.decode else [])
    return ",".join(kinds)


def _res_list_batching(it: Iteration) -> str:
    items = [
        f"{{'rid': '{r.rid}', 'iter': 0, 'type': 0, 'num_scheduled_tokens': {r.prompt}, "
        f"'num_prompt_tokens': {r.prompt}, 'num_computed_tokens': 0}}"
        for r in it.prefill
    ]
    items += [
        f"{{'rid': '{r.rid}', 'iter': {k}, 'type': 1, 'num_scheduled_tokens': 1, "
        f"'num_prompt_tokens': {r.prompt}, 'num_computed_tokens': {r.prompt + k - 1}}}"
        for r, k in it.decode
    ]
    return "[" + ", ".join(items) + "]"


def _res_list_exec(it: Iteration) -> str:
    rids = [r.rid for r in it.prefill] + [r.rid for r, _ in it.decode]
    return "[" + ", ".join(f"{{'rid': '{rid}'}}" for rid in rids) + "]"


def batch_header(cfg: ServiceConfig) -> list[str]:
    cols = [
        "name",
        "res_list",
        "start_datetime",
        "end_datetime",
        "during_time(ms)",
        "batch_type",
        "prof_id",
        "batch_size",
    ]
    if cfg.kv_columns:
        cols += ["total_blocks", "used_blocks", "free_blocks", "blocks_allocated", "blocks_freed", "kvcache_usage_rate"]
    cols += [
        "prefill_batch_size",
        "decode_batch_size",
        "prefill_scheduled_tokens",
        "decode_scheduled_tokens",
        "total_scheduled_tokens",
        "dp_rank",
    ]
    if cfg.spec_columns:
        cols += ["accepted_ratio", "accepted_ratio_per_pos"]
    return cols + ["start_time(ms)", "end_time(ms)"]


class Writer:
    """Writes one run's folder while the simulation runs (rows are never all held in memory)."""

    def __init__(self, cfg: ServiceConfig, out: Path):
        self.cfg = cfg
        self.out = out
        self.clock = _Clock()
        self.forward_iter = [0] * cfg.n_dp
        self.last_forward: list[list | None] = [None] * cfg.n_dp
        self.first_forward_us: int | None = None
        self.n_trace = 0

    def pid(self, dp: int) -> int:
        return self.cfg.first_pid + dp

    def prof_id(self, dp: int) -> str:
        return f"ms_service_{self.cfg.host}-{self.pid(dp)}"

    def dp_text(self, dp: int) -> str:
        return str(dp) if self.cfg.has_dp and self.cfg.batch_dp else self.cfg.na_dp

    def t_text(self, us: int) -> str:
        if self.cfg.time_unit == "ms":
            return repr(us / 1000.0)
        return f"{us}.0"

    def batch_rows(self, it: Iteration) -> list[str]:
        cfg, c = self.cfg, self.clock
        s_end = it.sched_start_us + it.sched_dur_us
        e_end = it.exec_start_us + it.exec_dur_us
        btype = _q(_batch_type(it))
        prof = self.prof_id(it.dp)
        n_pf, n_dec = len(it.prefill), len(it.decode)
        pf_tok = sum(r.prompt for r in it.prefill)
        rows = []
        # batching row: what the scheduler put into this iteration
        f = [
            "batchFrameworkProcessing",
            _q(_res_list_batching(it)),
            c(it.sched_start_us),
            c(s_end),
            _ms(it.sched_dur_us),
            btype,
            prof,
            f"{float(n_pf + n_dec)}",
        ]
        if cfg.kv_columns:
            total = cfg.blocks(it.dp)
            free = total - it.used_blocks
            f += [
                str(total),
                str(it.used_blocks),
                str(free),
                str(it.allocated),
                str(it.freed),
                repr(round(it.used_blocks / total, 4)),
            ]
        f += [str(n_pf), str(n_dec), str(pf_tok), str(n_dec), str(pf_tok + n_dec), self.dp_text(it.dp)]
        if cfg.spec_columns:
            f += ["", ""]
        f += [self.t_text(it.sched_start_us), self.t_text(s_end)]
        rows.append(",".join(f))
        # execution row: vLLM's modelExec (batch_size = scheduled tokens; items without type count
        # as decode, the exporter's quirk, see formats.md 1.3)
        f = [
            "modelExec",
            _q(_res_list_exec(it)),
            c(it.exec_start_us),
            c(e_end),
            _ms(it.exec_dur_us),
            btype,
            prof,
            f"{float(pf_tok + n_dec)}",
        ]
        if cfg.kv_columns:
            f += ["0", "0", "0", "0", "0", "0"]
        f += ["0", str(n_pf + n_dec), "0", "0", "0", self.dp_text(it.dp)]
        if cfg.spec_columns:
            f += ["", ""]
        f += [self.t_text(it.exec_start_us), self.t_text(e_end)]
        rows.append(",".join(f))
        if cfg.spec_columns and it.decode:
            sp_end = e_end + 200
            f = ["specDecoding", _q(_res_list_exec(it)), c(e_end), c(sp_end), _ms(200), btype, prof, f"{float(n_dec)}"]
            if cfg.kv_columns:
                f += ["0", "0", "0", "0", "0", "0"]
            f += [
                "0",
                str(n_pf + n_dec),
                "0",
                "0",
                "0",
                self.dp_text(it.dp),
                "0.8125",
                _q(json.dumps({"0": 0.9, "1": 0.725})),
            ]
            f += [self.t_text(e_end), self.t_text(sp_end)]
            rows.append(",".join(f))
        return rows

    def forward_row(self, it: Iteration, fw) -> None:
        """forward.csv: one row per execution; bubble = next start - this end (same prof_id)."""
        d = it.dp
        if self.first_forward_us is None:
            self.first_forward_us = it.exec_start_us
        prev = self.last_forward[d]
        if prev is not None:
            prev[5] = _ms(it.exec_start_us - prev[-1])
            fw.write(",".join(prev[:-1]) + "\n")
        self.forward_iter[d] += 1
        end = it.exec_start_us + it.exec_dur_us
        row = [
            "forward",
            _ms(it.exec_start_us - self.first_forward_us),
            self.clock(it.exec_start_us),
            self.clock(end),
            _ms(it.exec_dur_us),
            "",
            str(len(it.prefill) + len(it.decode)),
            _q(_batch_type(it)),
            str(self.forward_iter[d]),
            str(d) if self.cfg.has_dp else "0",
            self.prof_id(d),
            self.cfg.host,
            _ms(it.exec_start_us),
            _ms(end),
            end,
        ]
        self.last_forward[d] = row

    def flush_forward(self, fw) -> None:
        for prev in self.last_forward:
            if prev is not None:
                fw.write(",".join(prev[:-1]) + "\n")

    def kv_rows(self, it: Iteration, kv) -> None:
        cfg = self.cfg
        total = cfg.blocks(it.dp)
        if cfg.kvcache_shape == "blocks":
            free = total - it.used_blocks
            kv.write(
                f"KVCacheStatus,{self.clock(it.sched_start_us)},{total},{it.used_blocks},"
                f"{free},{it.allocated},{it.freed},{round(it.used_blocks / total, 4)!r}\n"
            )
        else:
            free = total - it.used_blocks
            rate = round(it.used_blocks / total, 4)
            for r in it.prefill:
                kv.write(f"{r.rid},Allocate,{self.clock(it.sched_start_us)},{free},{rate!r}\n")

    def trace_events(self, it: Iteration, tf) -> None:
        """Counters (and optionally X events) of one iteration, streamed into chrome_tracing.json."""
        cfg = self.cfg
        pid = self.pid(it.dp)
        suffix = f"-dp{it.dp}" if cfg.has_dp else ""
        free = cfg.blocks(it.dp) - it.used_blocks
        ts = f"{it.sched_start_us}.0"
        tf.write(
            f',\n{{"name":"Schedule.KVCache{suffix}","ph":"C","ts":{ts},"pid":{pid},'
            f'"tid":"Schedule.KVCache","args":{{"Device Block":{free}}}}}'
            f',\n{{"name":"WaitingQueue","ph":"C","ts":{ts},"pid":{pid},"tid":"Queue",'
            f'"args":{{"Queue Size":{it.waiting}}}}}'
        )
        self.n_trace += 2
        if not cfg.trace_batches:
            return
        sched_items = [{"rid": r.rid, "iter": 0, "type": 0, "num_scheduled_tokens": r.prompt} for r in it.prefill] + [
            {"rid": r.rid, "iter": k, "type": 1, "num_scheduled_tokens": 1} for r, k in it.decode
        ]
        for e in (
            {
                "name": "batchFrameworkProcessing",
                "ph": "X",
                "ts": float(it.sched_start_us),
                "dur": float(it.sched_dur_us),
                "pid": pid,
                "tid": f"Schedule({pid})",
                "args": {
                    "batch_type": _batch_type(it),
                    "batch_size": str(len(sched_items)),
                    "res_list": sched_items,
                    "tid": pid,
                },
            },
            {
                "name": "modelExec",
                "ph": "X",
                "ts": float(it.exec_start_us),
                "dur": float(it.exec_dur_us),
                "pid": pid,
                "tid": f"Execute({pid})",
                "args": {"batch_type": _batch_type(it), "tid": pid},
            },
        ):
            tf.write(",\n" + json.dumps(e, separators=(",", ":")))
            self.n_trace += 1

    def trace_head(self, tf) -> None:
        """The metadata events: process names and the "<host>,dp<N>" labels."""
        out = []
        for d in range(self.cfg.n_dp):
            pid = self.pid(d)
            label = f"{self.cfg.host},dp{d}" if self.cfg.has_dp else self.cfg.host
            out.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": str(pid)}})
            out.append({"name": "process_labels", "ph": "M", "pid": pid, "args": {"labels": label}})
        tf.write("[\n" + ",\n".join(json.dumps(e, separators=(",", ":")) for e in out))
        self.n_trace += len(out)


class _Discard:
    """A file that is not wanted: writes go nowhere."""

    def write(self, text: str) -> int:
        return len(text)


def _open(out: Path, name: str, only) -> object:
    if only is not None and name not in only:
        return contextlib.nullcontext(_Discard())
    return open(out / name, "w", encoding="utf-8", newline="")


def write_run(out: str | Path, cfg: ServiceConfig, only: tuple[str, ...] | None = None) -> dict:
    """Write one generated run into folder ``out``; returns counts (rows per file, requests).
    ``only``: the file names to write (default all; the calibration writes batch.csv and request.csv)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    reqs = make_requests(cfg)
    w = Writer(cfg, out)
    n_batch = 0
    with (
        _open(out, "batch.csv", only) as bf,
        _open(out, "forward.csv", only) as fw,
        _open(out, "kvcache.csv", only) as kv,
        _open(out, "chrome_tracing.json", only) as tf,
    ):
        w.trace_head(tf)
        bf.write(",".join(batch_header(cfg)) + "\n")
        fw.write(
            "name,relative_start_time(ms),start_datetime,end_datetime,during_time(ms),bubble_time(ms),"
            "batch_size,batch_type,forward_iter,dp_rank,prof_id,hostname,start_time(ms),end_time(ms)\n"
        )
        if cfg.kvcache_shape == "blocks":
            kv.write(
                "name,start_time,total_blocks,used_blocks,free_blocks,blocks_allocated,blocks_freed,"
                "kvcache_usage_rate\n"
            )
        else:
            kv.write("rid,name,start_time,device_kvcache_left,kvcache_usage_rate\n")
        for it in iterations(cfg, reqs):
            rows = w.batch_rows(it)
            bf.write("\n".join(rows) + "\n")
            n_batch += len(rows)
            w.forward_row(it, fw)
            w.kv_rows(it, kv)
            w.trace_events(it, tf)
        w.flush_forward(fw)
        tf.write("\n]\n")
    with _open(out, "request.csv", only) as rf:
        rf.write(
            "http_rid,start_datetime,recv_token_size,reply_token_size,execution_time(ms),"
            "queue_wait_time(ms),first_token_latency(ms),cache_hit_rate,start_time(ms)\n"
        )
        for r in reqs:
            rf.write(
                f"{r.rid},{w.clock(r.arrival_us)},{r.prompt},{r.output},"
                f"{_ms(r.finish_us - r.arrival_us)},{_ms(r.first_sched_us - r.arrival_us)},"
                f"{_ms(r.first_token_us - r.arrival_us)},N/A,{r.arrival_us // 1000}\n"
            )
    per_dp = [0] * cfg.n_dp
    for r in reqs:
        per_dp[r.dp] += 1
    return {"batch_rows": n_batch, "requests": len(reqs), "requests_per_dp": per_dp, "trace_events": w.n_trace}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", metavar="DIR", required=True, help="folder to write the run into")
    ap.add_argument("--scenario", default="request_skew", choices=SCENARIOS)
    ap.add_argument(
        "--size",
        default="small",
        choices=("small", "test"),
        help="small: the committed example (< 200 KB); test: the size the tests use",
    )
    args = ap.parse_args(argv)
    cfg = small_config(args.scenario) if args.size == "small" else config_for(args.scenario)
    counts = write_run(args.write, cfg)
    total = sum(p.stat().st_size for p in Path(args.write).iterdir())
    sys.stdout.write(f"{args.write}: {counts} ({total / 1024:.0f} KB)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
