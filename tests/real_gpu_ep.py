"""Multi-rank GPU expert-parallel runs built from a REAL single-rank GPU trace, with known effects.

The source is a real vLLM MoE decode step on one GPU (../shared/realdata/thirdparty/
tracelens_vllm_decode/graph_execution.json.gz: 24 MoE layers, 425 kernels, their real names and
durations: attention, dense GEMMs, the triton_kernels routing and ``_matmul_ogs`` expert GEMMs).
Each rank replays that kernel sequence ``steps`` times in eager mode, with DeepEP low-latency
``dispatch`` / ``combine`` kernels inserted around the expert GEMMs of every MoE layer (on a
communication stream), and writes a Kineto trace: kernels on the device (stream 7 compute, 20
communication) linked by correlation id to a ``cudaLaunchKernel`` call on the host thread, a
``vllm::moe_forward`` range around each MoE block's launches, ``ProfilerStep#<s>`` per step.

Re-timed causally, rank by rank and kernel by kernel:
- the host launches kernel after kernel (python overhead ~8 us + the launch call ~5 us, jittered,
  with rare hiccups on every rank) and runs ahead of the device; at the end of each step it
  waits for the device (the sampled tokens);
- a kernel starts when it has been launched (+3 us), its stream is free and what it depends on
  has ended (the dispatch waits for the routing, the GEMMs for the dispatch, the combine for the
  scatter, the next layer for the combine); its duration is the real one, jittered (lognormal
  sigma 0.03);
- a DeepEP kernel ends on every rank when the last rank's has started plus its transfer
  (every other rank waits for the last one inside its kernel).

Effects (per rank, ``Effect``): ``gemm_factor`` slower expert GEMMs (a slow device);
``host_delay_us`` more host time before each launch inside the MoE blocks (a slow host);
``late_us`` host time before each dispatch launch (a late rank at the collectives); each from
step ``from_step`` on (an effect that starts mid-profile: EPLB drift, a traffic shift).

``dualpipe=True`` shapes the run like DualPipe's overlapped chunks: after every MoE block a second,
lone ``combine`` in a ``vllm::moe_forward`` range of its own, so every other MoE layer instance
has no expert GEMMs and its one launch comes from a side stream of the host, not the MoE launches
a slow host delays (an effect present in one instance kind only).
Token counts are not in the trace (no shapes on kernels, no split sizes in DeepEP), as in the
real stacks.

``measure`` reads the truth back from the written files, never from the knobs.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

SOURCE = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "realdata"
    / "thirdparty"
    / "tracelens_vllm_decode"
    / "graph_execution.json.gz"
)
COMPUTE_STREAM, COMM_STREAM = 7, 20
DISPATCH = "void deep_ep::internode_ll::dispatch<false, false, 7168>(void*, float*, int*, long*, void*, int*, int*, void*, int*, void*, int*, int, void const*, float*, long const*, int*, int*, int, int, int, int, int, int, int, int, bool)"
COMBINE = "void deep_ep::internode_ll::combine<false, 7168>(void*, void*, int*, void*, void const*, long const*, int const*, int const*, void*, int*, int, int, int, int, int, int, int, int, bool)"
BASE_US = 1_790_000_000_000_000 // 1000  # absolute epoch us
PY_GAP_US, LAUNCH_US, LATENCY_US = 8.0, 5.0, 3.0
XFER_US = 45.0  # DeepEP low-latency dispatch / combine of a decode batch
STEP_TAIL_US = 60.0  # host work after the step's sync (sampling, scheduling)


@dataclass(frozen=True)
class Effect:
    gemm_factor: float = 1.0
    host_delay_us: float = 0.0
    late_us: float = 0.0
    from_step: int = 0


def source_kernels(source: Path = SOURCE) -> list[tuple[str, float]]:
    """(name, duration us) of the real step's kernels, in order."""
    with gzip.open(source, "rb") as fh:
        events = json.load(fh)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    return [(e["name"], float(e["dur"])) for e in kernels]


def _role(name: str) -> str:
    if name.startswith("_matmul_ogs"):
        return "gemm"
    if name == "_combined_routing_compute":
        return "routing_end"
    if name.startswith("_finalize_matmul_scatter"):
        return "scatter"
    if name.startswith("triton_poi_fused_constant_pad_nd_moe_forward"):
        return "moe_start"
    return ""


def plan(kernels: list[tuple[str, float]], dualpipe: bool = False) -> list[dict]:
    """The per-step kernel sequence with the DeepEP kernels inserted: dicts with name, dur_us,
    stream, role, moe (inside a MoE block) and dep (index of the kernel it waits for). With
    ``dualpipe``, a lone second combine ("combine2") after each MoE block."""
    out: list[dict] = []
    in_moe = False
    for name, dur in kernels:
        role = _role(name)
        if role == "moe_start":
            in_moe = True
        if role == "gemm" and out and out[-1]["role"] == "routing_end":
            out.append(
                dict(name=DISPATCH, dur_us=XFER_US, stream=COMM_STREAM, role="dispatch", moe=True, dep=len(out) - 1)
            )
        dep = len(out) - 1 if out and out[-1]["role"] in ("dispatch", "combine", "combine2") else None
        out.append(dict(name=name, dur_us=dur, stream=COMPUTE_STREAM, role=role, moe=in_moe, dep=dep))
        if role == "scatter":
            out.append(
                dict(name=COMBINE, dur_us=XFER_US, stream=COMM_STREAM, role="combine", moe=True, dep=len(out) - 1)
            )
            if dualpipe:
                out.append(
                    dict(name=COMBINE, dur_us=XFER_US, stream=COMM_STREAM, role="combine2", moe=False, dep=len(out) - 1)
                )
            in_moe = False
    return out


def write_run(
    out: Path,
    ranks: int = 8,
    steps: int = 4,
    effects: dict[int, Effect] | None = None,
    seed: int = 0,
    source: Path = SOURCE,
    dualpipe: bool = False,
) -> list[Path]:
    """Write rank<r>.pt.trace.json.gz for each rank; returns the paths. The noise draws do not
    depend on the effects: the same seed without an effect is the run with that rank fixed."""
    effects = effects or {}
    seq = plan(source_kernels(source), dualpipe)
    rng = random.Random(seed)
    host = [1000.0 + 20 * rng.random() for _ in range(ranks)]  # host clocks (us from BASE)
    free = [{COMPUTE_STREAM: 0.0, COMM_STREAM: 0.0} for _ in range(ranks)]
    events: list[list[dict]] = [[] for _ in range(ranks)]
    corr = [0] * ranks
    for s in range(steps):
        step_start = list(host)
        ends: list[list[float]] = [[0.0] * len(seq) for _ in range(ranks)]
        moe_open: list[float | None] = [None] * ranks
        for i, k in enumerate(seq):
            starts, launches = [], []
            for r in range(ranks):
                eff = effects.get(r, Effect())
                if s < eff.from_step:
                    eff = Effect()
                gap = PY_GAP_US * rng.lognormvariate(0, 0.3)
                if rng.random() < 0.003:
                    gap += rng.uniform(50, 300)  # a host hiccup (GC, scheduler): any rank, now and then
                if k["moe"]:
                    gap += eff.host_delay_us
                if k["role"] == "dispatch":
                    gap += eff.late_us
                if k["role"] == "moe_start":
                    moe_open[r] = host[r]
                if k["role"] == "combine2":  # after the previous block's range (it ends 0.5 us on)
                    moe_open[r] = host[r] + 1.0
                launch = host[r] + gap
                launch_dur = LAUNCH_US * rng.lognormvariate(0, 0.2)
                host[r] = launch + launch_dur
                corr[r] += 1
                events[r].append(
                    _x(
                        "cuda_runtime",
                        "cudaLaunchKernel",
                        1000 + r,
                        1000 + r,
                        launch,
                        launch_dur,
                        {"correlation": corr[r]},
                    )
                )
                ready = launch + launch_dur + LATENCY_US
                dep_end = ends[r][k["dep"]] if k["dep"] is not None else 0.0
                if k["role"] == "dispatch":  # waits for the routing on the compute stream
                    dep_end = max(dep_end, free[r][COMPUTE_STREAM])
                starts.append(max(ready, free[r][k["stream"]], dep_end))
                launches.append(corr[r])
            if k["role"] in ("dispatch", "combine", "combine2"):
                meet = max(starts)
                durs = [meet - starts[r] + k["dur_us"] * rng.lognormvariate(0, 0.05) for r in range(ranks)]
            else:
                durs = [
                    k["dur_us"]
                    * rng.lognormvariate(0, 0.03)
                    * (_gemm_factor(effects.get(r), s) if k["role"] == "gemm" else 1.0)
                    for r in range(ranks)
                ]
            for r in range(ranks):
                end = starts[r] + durs[r]
                ends[r][i] = end
                free[r][k["stream"]] = end
                args = {"correlation": launches[r], "stream": k["stream"], "device": 0}
                events[r].append(_x("kernel", k["name"], 0, k["stream"], starts[r], durs[r], args))
                if k["role"] in ("combine", "combine2") and moe_open[r] is not None:
                    events[r].append(
                        _x(
                            "cpu_op",
                            "vllm::moe_forward",
                            1000 + r,
                            1000 + r,
                            moe_open[r],
                            host[r] - moe_open[r] + 0.5,
                            {},
                        )
                    )
                    moe_open[r] = None
        for r in range(ranks):  # the host waits for the step's last kernel, then samples
            done = max(free[r].values())
            if done > host[r]:
                events[r].append(
                    _x("cuda_runtime", "cudaStreamSynchronize", 1000 + r, 1000 + r, host[r], done - host[r], {})
                )
                host[r] = done
            host[r] += STEP_TAIL_US
            events[r].append(
                _x(
                    "user_annotation",
                    f"ProfilerStep#{s}",
                    1000 + r,
                    1000 + r,
                    step_start[r],
                    host[r] - step_start[r],
                    {},
                )
            )
    paths = []
    out.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        doc = {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": ranks},
            "traceEvents": sorted(events[r], key=lambda e: e["ts"]),
        }
        p = out / f"rank{r}.pt.trace.json.gz"
        with gzip.open(p, "wt", encoding="utf-8", compresslevel=3) as fh:
            json.dump(doc, fh)
        paths.append(p)
    return paths


def _gemm_factor(eff: Effect | None, step: int) -> float:
    return eff.gemm_factor if eff is not None and step >= eff.from_step else 1.0


def step_us(out: Path, ranks: int) -> float:
    """The run's profiled time read from the written traces: the mean over ranks of the sum of
    their ProfilerStep durations (ranks meet at every all-to-all, so they differ by little)."""
    total = 0.0
    for r in range(ranks):
        with gzip.open(out / f"rank{r}.pt.trace.json.gz", "rb") as fh:
            ev = json.load(fh)["traceEvents"]
        total += sum(e["dur"] for e in ev if e["name"].startswith("ProfilerStep#"))
    return total / ranks


def saving_pct(work: Path, ranks: int, effects: dict[int, Effect], fix: set[int], **kw) -> float:
    """What fixing the ranks ``fix`` saves, measured from written files: the run as it is and the
    same run (same seed, same noise) without their effects, each written and read back; % of the
    run's profiled time."""
    actual, fixed = work / "actual", work / ("fixed-" + "-".join(map(str, sorted(fix))))
    if not actual.is_dir():
        write_run(actual, ranks=ranks, effects=effects, **kw)
    write_run(fixed, ranks=ranks, effects={r: e for r, e in effects.items() if r not in fix}, **kw)
    before = step_us(actual, ranks)
    return 100.0 * (before - step_us(fixed, ranks)) / before


def _x(cat: str, name: str, pid: int, tid: int, ts_us: float, dur_us: float, args: dict) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": round(BASE_US + ts_us, 3),
        "dur": round(dur_us, 3),
        "args": args,
    }


def measure(out: Path, ranks: int) -> dict[int, dict]:
    """Per rank, read from the written traces: step_us (its ProfilerStep time), gemm_us (expert
    GEMM kernels), host_wait_us (compute-stream idle inside MoE blocks before a kernel launched
    after the previous one ended), wait_us (inside DeepEP kernels, waiting for the last rank to
    start), moe_us (MoE blocks: first to last device kernel launched inside vllm::moe_forward);
    against the median rank: cost_pct (the rank's GEMM + host-wait excess over the median rank's,
    in % of the median rank's step time), cause (slow-compute or host-bound: the larger excess;
    None without one), and the run's waiting share of MoE time per rank (wait_pct)."""
    facts: dict[int, dict] = {}
    starts: dict[int, list[float]] = {}
    for r in range(ranks):
        with gzip.open(out / f"rank{r}.pt.trace.json.gz", "rb") as fh:
            ev = json.load(fh)["traceEvents"]
        launch = {e["args"]["correlation"]: e["ts"] for e in ev if e["name"] == "cudaLaunchKernel"}
        kernels = sorted((e for e in ev if e["cat"] == "kernel"), key=lambda e: e["ts"])
        blocks = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"] == "vllm::moe_forward")
        comp = [e for e in kernels if e["tid"] == COMPUTE_STREAM]
        host_wait, prev_end, moe_us = 0.0, None, 0.0
        for e in comp:
            lt = launch[e["args"]["correlation"]]
            inside = any(a <= lt < b for a, b in blocks)
            if inside and prev_end is not None and lt > prev_end:
                host_wait += min(lt, e["ts"]) - prev_end
            prev_end = e["ts"] + e["dur"]
        for a, b in blocks:
            ks = [e for e in kernels if a <= launch[e["args"]["correlation"]] < b]
            moe_us += max(e["ts"] + e["dur"] for e in ks) - min(e["ts"] for e in ks)
        ep = [e for e in kernels if "deep_ep::" in e["name"]]
        starts[r] = [e["ts"] for e in ep]
        facts[r] = {
            "step_us": sum(e["dur"] for e in ev if e["name"].startswith("ProfilerStep#")),
            "gemm_us": sum(e["dur"] for e in kernels if e["name"].startswith("_matmul_ogs")),
            "host_wait_us": host_wait,
            "moe_us": moe_us,
            "ep_ends": [e["ts"] + e["dur"] for e in ep],
        }
    n = min(len(v) for v in starts.values())
    meet = [max(starts[r][i] for r in range(ranks)) for i in range(n)]
    for r in range(ranks):
        facts[r]["wait_us"] = sum(meet[i] - starts[r][i] for i in range(n))
        facts[r]["wait_pct"] = 100.0 * facts[r]["wait_us"] / facts[r]["moe_us"]
        del facts[r]["ep_ends"]
    med = {k: statistics.median(f[k] for f in facts.values()) for k in ("step_us", "gemm_us", "host_wait_us")}
    for f in facts.values():
        gemm_x = max(f["gemm_us"] - med["gemm_us"], 0.0)
        host_x = max(f["host_wait_us"] - med["host_wait_us"], 0.0)
        f["excess_us"] = gemm_x + host_x
        f["cost_pct"] = round(100.0 * f["excess_us"] / med["step_us"], 2)
        f["cause"] = None if f["excess_us"] <= 0 else ("slow-compute" if gemm_x >= host_x else "host-bound")
    return facts


if __name__ == "__main__":  # a quick look: python tests/real_gpu_ep.py OUT
    import sys

    dest = Path(sys.argv[1])
    write_run(dest, ranks=4, steps=2, effects={1: Effect(gemm_factor=1.2), 2: Effect(host_delay_us=60)})
    for rank, f in measure(dest, 4).items():
        print(rank, {k: round(v, 1) if isinstance(v, float) else v for k, v in f.items()})
    print(f"{math.fsum(1 for _ in dest.iterdir())} files")
