"""A small lock-step EP simulator that writes Kineto traces with exact, chosen timings.

Unlike ``synth_kineto`` (realistic event mix, noise), every time here follows from a few numbers
per (rank, step, layer), so a test can put a rule exactly on its edge: the ranks enter each layer
together, gate, meet at the dispatch all-to-all (everyone leaves ``TRANSFER_US`` after the last
arrival), run GroupedMatmul, meet again at the combine all-to-all, and leave the layer together.
Each rank's trace has the same shape as the real CPU/gloo runs: ``decode_step_<s>`` >
``moe_layer_<l>`` > ``MoeGatingTopK`` / ``MoeDistributeDispatch`` (with a ``c10d::alltoall_base_``
whose 4th Concrete Input is the output split list = tokens received) / ``GroupedMatmul`` /
``MoeDistributeCombine``, and the ``gloo:all_to_all`` calls on a communication thread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

GATE_US = 300.0
TRANSFER_US = 100.0
GMM_US = 1000.0  # GroupedMatmul time of a rank with TOKENS tokens
TOKENS = 64
BASE_NS = 1_790_000_000_000_000_000


@dataclass
class Cell:
    """What one rank does in one layer instance."""

    tokens: int = TOKENS
    gmm_us: float = GMM_US
    pre_dispatch_us: float = 0.0  # extra host time before the dispatch (delays its arrival)
    pre_combine_us: float = 0.0  # extra time after GroupedMatmul, before the combine
    transfer_us: float = 0.0  # extra transfer time of this rank in both all-to-alls (a slow link: it leaves later)


def _x(name, tid, ts_us, dur_us, cat="user_annotation", args=None):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 100,
        "tid": tid,
        "ts": round(ts_us, 3),
        "dur": round(dur_us, 3),
        "args": args or {},
    }


def _leave(arrive: dict, c: dict, last_pays_us: float) -> dict:
    """When each rank leaves an all-to-all: TRANSFER_US after the last arrival, plus its own extra
    transfer, plus last_pays_us for the last arriver."""
    last = max(arrive.values())
    last_rank = max(arrive, key=lambda r: (arrive[r], r))
    return {r: last + TRANSFER_US + c[r].transfer_us + (last_pays_us if r == last_rank else 0.0) for r in arrive}


def write_run(
    out: Path,
    cells,
    ranks: int = 4,
    steps: int = 4,
    layers: int = 4,
    after_layer_collective: bool = False,
    last_pays_us: float = 0.0,
) -> list[Path]:
    """Write one trace per rank into ``out``. ``cells(rank, step, layer) -> Cell``.

    ``after_layer_collective``: each rank also runs one ``gloo:all_to_all`` between two layers
    (outside every ``moe_layer_<l>``), arriving in reverse rank order, so a rule that counted it
    in a layer would see the ranks arrive in another order.
    ``last_pays_us``: the last rank to arrive at an all-to-all leaves it that much later (it still
    has all its sends and receives to do when it arrives; the others did theirs while waiting),
    as gloo and NCCL all-to-alls behave. A rank's ``Cell.transfer_us`` adds its own slow link.
    """
    out.mkdir(parents=True, exist_ok=True)
    events = {r: [] for r in range(ranks)}
    t = 10.0
    for s in range(steps):
        step_start = t
        for layer in range(layers):
            c = {r: cells(r, s, layer) for r in range(ranks)}
            start = t
            arrive_d = {r: start + 5 + GATE_US + c[r].pre_dispatch_us for r in range(ranks)}
            leave_d = _leave(arrive_d, c, last_pays_us)
            arrive_c = {r: leave_d[r] + 5 + c[r].gmm_us + c[r].pre_combine_us for r in range(ranks)}
            leave_c = _leave(arrive_c, c, last_pays_us)
            end = max(leave_c.values()) + 5
            for r in range(ranks):
                ev = events[r]
                splits = [c[r].tokens // ranks] * (ranks - 1)
                splits.append(c[r].tokens - sum(splits))
                ev.append(_x(f"moe_layer_{layer}", 1, start, end - start))
                ev.append(_x("MoeGatingTopK", 1, start + 5, GATE_US + c[r].pre_dispatch_us - 10))
                ev.append(_x("MoeDistributeDispatch", 1, arrive_d[r] - 2, leave_d[r] - arrive_d[r] + 4))
                ev.append(
                    _x(
                        "c10d::alltoall_base_",
                        1,
                        arrive_d[r] - 1,
                        1.0,
                        cat="cpu_op",
                        args={"Concrete Inputs": ["", "", "", str(splits), "[]", "False", "-1"]},
                    )
                )
                ev.append(_x("gloo:all_to_all", 2, arrive_d[r], leave_d[r] - arrive_d[r]))
                ev.append(_x("GroupedMatmul", 1, leave_d[r] + 5, c[r].gmm_us))
                ev.append(_x("MoeDistributeCombine", 1, arrive_c[r] - 2, leave_c[r] - arrive_c[r] + 4))
                ev.append(_x("gloo:all_to_all", 2, arrive_c[r], leave_c[r] - arrive_c[r]))
            t = end + 20
            if after_layer_collective:
                arrive = {r: t + 50 * (ranks - r) for r in range(ranks)}
                leave = max(arrive.values()) + TRANSFER_US
                for r in range(ranks):
                    events[r].append(_x("gloo:all_to_all", 2, arrive[r], leave - arrive[r]))
                t = leave + 20
        for r in range(ranks):
            events[r].append(_x(f"decode_step_{s}", 1, step_start - 5, t - step_start))
        t += 50
    return write_traces(out, events)


def write_traces(out: Path, events: dict) -> list[Path]:
    """rank<r>.pt.trace.json per rank of ``events`` (rank -> its events, times in us from
    BASE_NS), as Kineto writes a gloo run."""
    paths = []
    for r in sorted(events):
        doc = {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "gloo", "rank": r, "world_size": len(events)},
            "baseTimeNanoseconds": BASE_NS,
            "traceEvents": sorted(events[r], key=lambda e: e["ts"]),
        }
        p = out / f"rank{r}.pt.trace.json"
        p.write_text(json.dumps(doc))
        paths.append(p)
    return paths
