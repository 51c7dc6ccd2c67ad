#!/usr/bin/env python3
"""Real torch.profiler (Kineto) traces of a tiny expert-parallel MoE decode loop on CPU processes.

    python bench/torch_ep_trace.py OUT_DIR --world 4 --scenario token_skew --effect 0.5 --seed 0

Needs torch (the ``bench`` extra: ``pip install -e '.[bench]'``); never a CI dependency.
``world`` processes (gloo, 127.0.0.1 only) each run ``steps`` decode steps of ``layers`` MoE layers
under ``torch.profiler`` with shapes recorded, and write ``rank{r}.pt.trace.json.gz``. Inside
``decode_step_<s>`` each layer is a ``moe_layer_<l>`` range holding the regions of the built-in
taxonomy (``slowcard show-taxonomy``), like ../shared/realdata/kineto_cpu_ep_noise
(``--profiler-steps``: the steps are marked by ``prof.step()`` under a schedule instead, as a
training loop's ``ProfilerStep#N``):

- ``MoeGatingTopK``: router matmul, top-1 expert per token, tokens sorted by destination rank;
- ``MoeDistributeDispatch``: a real ``all_to_all_single`` of the per-rank counts, then of the
  token rows (so the trace carries exact split sizes);
- ``GroupedMatmul``: the received rows split over the rank's local experts, two ``aten::mm`` per
  expert (up and down projection);
- ``MoeDistributeCombine``: the rows sent back by ``all_to_all_single``.

Scenarios (the anomaly sits on ``slow_rank``):
- ``balanced``: uniform routing;
- ``token_skew``: a share ``effect`` of every rank's tokens is pinned to slow_rank's experts
  (slow_rank then receives ``(1 - effect) + effect x world`` times the mean rows);
- ``slow_compute``: slow_rank's GroupedMatmul does ``effect`` times the matmul work on the same
  rows (a slower device);
- ``slow_comm``: slow_rank sleeps ``effect`` ms before each of its all-to-alls (a slow link or
  NIC as seen from the host: its sends start late, so everyone else waits for it).
``noise_us``: every rank sleeps an exponential time (that mean, µs) before each all-to-all and
at random points of the layer (host noise); the OS scheduler adds its own when world > cores.
``routing``: ``random`` (each token to a uniformly random expert: binomial jitter only) or
``argmax`` (the router's argmax over its logits, as a real top-1 gate: an untrained router favours
a few experts, so ranks receive uneven rows on their own). ``slow_device_rank`` /
``slow_device_factor``: a slow device on another rank beside the scenario (mixed runs). A slow
device's extra matmul work runs as ``aten::bmm``, so the rows through the expert ``aten::mm``
calls stay the rows it received (``measure_truth``).

``generate`` returns the measured cost of the anomaly, as the shared set's README defines it:
the slow rank's GroupedMatmul time above the median rank's, as a % of the median rank's MoE time
(for slow_comm, where every rank waits the delay out: the delays, 3 all-to-alls per layer
instance). None for balanced runs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import socket
import statistics
import time
from pathlib import Path

SCENARIOS = ("balanced", "token_skew", "slow_compute", "slow_comm")
HIDDEN = 256
TOKENS = 256
EXPERTS_PER_RANK = 4


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, cfg: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(1)
    world, slow = cfg["world"], cfg["slow_rank"]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank, world_size=world, timeout=None
    )
    rng = random.Random(f"{cfg['seed']}-{rank}")
    gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + rank)
    n_exp = world * EXPERTS_PER_RANK
    layers = cfg["layers"]
    w_gate = [torch.randn(HIDDEN, n_exp, generator=gen) / 16 for _ in range(layers)]
    w_up = [torch.randn(EXPERTS_PER_RANK, HIDDEN, HIDDEN, generator=gen) / 16 for _ in range(layers)]
    w_down = [torch.randn(EXPERTS_PER_RANK, HIDDEN, HIDDEN, generator=gen) / 16 for _ in range(layers)]
    scenario, effect, noise_us = cfg["scenario"], cfg["effect"], cfg["noise_us"]
    me_slow = rank == slow and scenario != "balanced"
    # matmul work factor of this rank's GroupedMatmul (a slower device: same rows, more work)
    reps = effect if me_slow and scenario == "slow_compute" else 1.0
    if rank == cfg["slow_device_rank"]:
        reps = cfg["slow_device_factor"]

    def host_noise() -> None:
        if noise_us > 0:
            time.sleep(rng.expovariate(1.0 / noise_us) / 1e6)

    def before_send() -> None:
        host_noise()
        if me_slow and scenario == "slow_comm":
            time.sleep(effect / 1e3)

    def layer(step: int, li: int) -> None:
        x = torch.randn(TOKENS, HIDDEN, generator=gen)
        with record_function(f"moe_layer_{li}"):
            with record_function("MoeGatingTopK"):
                # the router's work is real, its choice is uniform: a random router's argmax
                # favours a few experts, which would make every run a token-skew run
                logits = x @ w_gate[li]
                if cfg["routing"] == "argmax":
                    expert = logits.argmax(dim=-1)
                else:
                    expert = torch.randint(0, n_exp, (TOKENS,), generator=gen) + 0 * logits.argmax(dim=-1)
                if scenario == "token_skew":
                    pin = torch.rand(TOKENS, generator=gen) < effect
                    hot = slow * EXPERTS_PER_RANK + torch.randint(0, EXPERTS_PER_RANK, (TOKENS,), generator=gen)
                    expert = torch.where(pin, hot, expert)
                dest = torch.div(expert, EXPERTS_PER_RANK, rounding_mode="floor")
                order = torch.argsort(dest, stable=True)
                send_counts = torch.bincount(dest, minlength=world)
            with record_function("MoeDistributeDispatch"):
                recv_counts = torch.empty_like(send_counts)
                before_send()
                dist.all_to_all_single(recv_counts, send_counts)
                send_split = send_counts.tolist()
                recv_split = recv_counts.tolist()
                recv = torch.empty(sum(recv_split), HIDDEN)
                before_send()
                dist.all_to_all_single(recv, x[order], recv_split, send_split)
            with record_function("GroupedMatmul"):
                out = torch.empty_like(recv)
                for e, idx in enumerate(torch.arange(recv.shape[0]).chunk(EXPERTS_PER_RANK)):
                    if idx.numel() == 0:
                        continue
                    rows = recv[idx]
                    h = torch.relu(rows @ w_up[li][e])
                    out[idx] = h @ w_down[li][e]
                    extra = reps - 1.0
                    while extra > 1e-9:  # a slower device: the same rows, more matmul work (bmm)
                        n = rows.shape[0] if extra >= 1 else max(1, int(rows.shape[0] * extra))
                        part = rows[:n].unsqueeze(0)
                        torch.bmm(torch.relu(torch.bmm(part, w_up[li][e].unsqueeze(0))), w_down[li][e].unsqueeze(0))
                        extra -= 1.0
            host_noise()
            with record_function("MoeDistributeCombine"):
                back = torch.empty(TOKENS, HIDDEN)
                before_send()
                dist.all_to_all_single(back, out, send_split, recv_split)

    for li in range(layers):  # warm-up outside the profile (gloo connections, allocator)
        layer(0, li)
    dist.barrier()
    if cfg["profiler_steps"]:
        # steps as a training loop under torch.profiler marks them: prof.step() with a schedule
        # makes Kineto write ProfilerStep#N ranges (what HTA's analyses need) instead of decode_step_N
        from torch.profiler import schedule

        sched = schedule(wait=0, warmup=1, active=cfg["steps"], repeat=1)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=sched) as prof:
            for step in range(cfg["steps"] + 1):  # the first one is the schedule's warm-up
                for li in range(layers):
                    layer(step, li)
                prof.step()
    else:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for step in range(cfg["steps"]):
                with record_function(f"decode_step_{step}"):
                    for li in range(layers):
                        layer(step, li)
    dist.barrier()
    dist.destroy_process_group()
    raw = Path(cfg["out"]) / f"rank{rank}.pt.trace.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(str(raw) + ".gz", "wb", compresslevel=3) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


def measured_cost(out: Path, world: int, slow_rank: int, scenario: str, delay_ms: float = 0.0) -> float | None:
    """The anomaly's cost from the raw traces (see the module doc)."""
    if scenario == "balanced":
        return None
    own, moe, layers = {}, {}, 0
    for r in range(world):
        with gzip.open(out / f"rank{r}.pt.trace.json.gz", "rb") as fh:
            events = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
        own[r] = sum(e["dur"] for e in events if e["name"] == "GroupedMatmul")
        moe[r] = sum(e["dur"] for e in events if e["name"].startswith("moe_layer_"))
        layers = sum(e["name"].startswith("moe_layer_") for e in events)
    med_moe = statistics.median(moe.values())
    if scenario == "slow_comm":
        # every rank waits out the slow rank's late sends (3 all-to-alls per layer): the delay
        # is the cost, it does not show as the slow rank's own excess
        return round(100.0 * 3 * delay_ms * 1000.0 * layers / med_moe, 2)
    return round(100.0 * max(0.0, own[slow_rank] - statistics.median(own.values())) / med_moe, 2)


def _rank_events(out: Path, r: int) -> list[dict]:
    with gzip.open(out / f"rank{r}.pt.trace.json.gz", "rb") as fh:
        return [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]


def _inside(events: list[dict], name: str, outer: str) -> list[dict]:
    """The events called name that lie inside an ``outer`` range of the same thread."""
    spans = sorted((e["tid"], e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == outer)
    return [e for e in events if e["name"] == name and any(t == e["tid"] and s <= e["ts"] < end for t, s, end in spans)]


def shapley_token_share(rt: float | None, rs: float | None) -> float:
    """The token part's share of an excess rt x rs - 1 (Shapley split, negative parts as 0);
    rt None: the reference has no tokens (all tokens)."""
    if rt is None:
        return 1.0
    if rs is None:
        return 0.0
    tok, spd = max((rt - 1) * (1 + rs) / 2, 0.0), max((rs - 1) * (1 + rt) / 2, 0.0)
    return tok / (tok + spd) if tok + spd > 0 else 0.0


def measure_truth(out: Path, world: int) -> dict[int, dict]:
    """Per rank, what the raw trace shows (never the generator's knobs): rows through the expert
    matmuls (the first input's M of each ``aten::mm`` inside ``GroupedMatmul``, halved: the up
    and down projection see the same rows), GroupedMatmul time, MoE time; and against the median
    rank (median of each over ranks): ``cost_pct`` = GroupedMatmul time above the median rank's,
    in % of the median rank's MoE time (0 when below), ``token_share`` of that excess by the
    Shapley split of rows ratio x time-per-row ratio, and ``cause`` (token-skew / slow-compute,
    the larger part; None without an excess)."""
    facts = {}
    for r in range(world):
        ev = _rank_events(out, r)
        mms = _inside(ev, "aten::mm", "GroupedMatmul")
        rows = sum(e["args"]["Input Dims"][0][0] for e in mms) / 2
        facts[r] = {
            "rows": rows,
            "gmm_us": sum(e["dur"] for e in ev if e["name"] == "GroupedMatmul"),
            "moe_us": sum(e["dur"] for e in ev if e["name"].startswith("moe_layer_")),
        }
    med = {k: statistics.median(f[k] for f in facts.values()) for k in ("rows", "gmm_us", "moe_us")}
    for f in facts.values():
        excess = f["gmm_us"] - med["gmm_us"]
        f["cost_pct"] = round(100.0 * max(excess, 0.0) / med["moe_us"], 2)
        rt = f["rows"] / med["rows"] if med["rows"] > 0 else None
        rs = (f["gmm_us"] / med["gmm_us"]) / rt if rt else None
        f["rows_ratio"], f["time_per_row_ratio"] = rt, rs
        f["token_share"] = shapley_token_share(rt, rs)
        f["cause"] = None if excess <= 0 else ("token-skew" if f["token_share"] >= 0.5 else "slow-compute")
    return facts


def generate(
    out_dir: Path,
    *,
    world: int = 4,
    scenario: str = "balanced",
    effect: float = 0.0,
    slow_rank: int = 1,
    seed: int = 0,
    steps: int = 6,
    layers: int = 4,
    noise_us: float = 0.0,
    profiler_steps: bool = False,
    routing: str = "random",
    slow_device_rank: int | None = None,
    slow_device_factor: float = 1.0,
) -> float | None:
    """Write one run's traces into out_dir; return the measured cost of the anomaly (% of MoE time)."""
    import torch.multiprocessing as mp

    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")
    if not 0 <= slow_rank < world:
        raise ValueError(f"slow_rank {slow_rank} is not in range(0, {world})")
    if scenario == "token_skew" and not 0.0 <= effect <= 1.0:
        raise ValueError("token_skew: effect is the share of tokens pinned to the slow rank, in [0, 1]")
    if scenario == "slow_compute" and effect < 1.0:
        raise ValueError("slow_compute: effect is the matmul work factor, >= 1")
    if routing not in ("random", "argmax"):
        raise ValueError(f"unknown routing {routing!r}; expected random or argmax")
    if slow_device_rank is not None and not (0 <= slow_device_rank < world and slow_device_factor >= 1.0):
        raise ValueError("slow_device_rank must be in range(0, world) and slow_device_factor >= 1")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cfg = dict(
        world=world,
        scenario=scenario,
        effect=effect,
        slow_rank=slow_rank,
        seed=seed,
        steps=steps,
        layers=layers,
        noise_us=noise_us,
        profiler_steps=profiler_steps,
        routing=routing,
        slow_device_rank=slow_device_rank,
        slow_device_factor=slow_device_factor,
        out=str(out_dir),
        port=_free_port(),
    )
    mp.start_processes(_worker, args=(cfg,), nprocs=world, join=True, start_method="spawn")
    return measured_cost(out_dir, world, slow_rank, scenario, effect)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--scenario", choices=SCENARIOS, default="balanced")
    ap.add_argument("--effect", type=float, default=0.0)
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--noise-us", type=float, default=0.0)
    ap.add_argument("--routing", choices=("random", "argmax"), default="random")
    ap.add_argument("--slow-device-rank", type=int, default=None, help="a slow device on this rank too")
    ap.add_argument("--slow-device-factor", type=float, default=1.0)
    ap.add_argument(
        "--profiler-steps",
        action="store_true",
        help="mark steps with prof.step() (ProfilerStep#N) instead of decode_step_N",
    )
    a = ap.parse_args()
    t0 = time.perf_counter()
    cost = generate(
        a.out,
        world=a.world,
        scenario=a.scenario,
        effect=a.effect,
        slow_rank=a.slow_rank,
        seed=a.seed,
        steps=a.steps,
        layers=a.layers,
        noise_us=a.noise_us,
        profiler_steps=a.profiler_steps,
        routing=a.routing,
        slow_device_rank=a.slow_device_rank,
        slow_device_factor=a.slow_device_factor,
    )
    print(f"wrote {a.world} traces to {a.out} in {time.perf_counter() - t0:.1f} s; measured cost {cost} % of MoE time")


if __name__ == "__main__":
    main()
