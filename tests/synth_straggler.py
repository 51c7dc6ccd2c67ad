"""Lock-step Kineto CPU traces of a straggler whose lateness comes from OUTSIDE its MoE work
(issue 42), with exact, chosen timings (as ``ep_lockstep``) plus a seeded jitter.

Each rank's main thread (tid 1) runs, per step (``ProfilerStep#<s>``) and layer:

    nn.Module: SelfAttention_0 (aten::bmm, aten::softmax)   ATTN_US
    [a CPU op aten::_unique2 (a tokenizer-like op)]          UNIQUE_US
    [nothing: a host sleep]                                  scenario host_sleep
    c10d::alltoall_base_ > gloo:all_to_all (tid 2)           the ranks meet; leave TRANSFER_US after the last
    nn.Module: MoE_0 (aten::mm)                              MOE_US
    c10d::allreduce_ > gloo:all_reduce (tid 2)               the ranks meet again

Every rank leaves a collective ``TRANSFER_US`` after the last one arrives. Scenarios (the slow
rank is ``slow_rank``; ``factor`` scales its slow part):

- ``balanced``: every rank alike (jitter only);
- ``slow_attention``: its SelfAttention (and the ops in it) takes ``factor`` (1.57) x; its MoE
  work is normal;
- ``host_sleep``: it sleeps ``sleep_us`` with no op on the thread before its all-to-all send;
- ``slow_op``: its aten::_unique2 takes ``factor`` (3.0) x;
- ``mixed``: slow attention (``factor``) AND a host sleep (``sleep_us``): neither carries 80 %.

``jitter`` is the relative spread (uniform +-) of every duration, per rank and layer, seeded.
"""

from __future__ import annotations

import random
from pathlib import Path

from ep_lockstep import _x, write_traces  # the same trace files as the EP lock-step runs

ATTN_US = 400.0
UNIQUE_US = 60.0
MOE_US = 600.0
TRANSFER_US = 80.0
SCENARIOS = ("balanced", "slow_attention", "host_sleep", "slow_op", "mixed")
DEFAULT_FACTOR = {"balanced": 1.0, "slow_attention": 1.57, "host_sleep": 1.0, "slow_op": 3.0, "mixed": 1.57}


def write_run(
    out: Path,
    scenario: str = "slow_attention",
    *,
    ranks: int = 4,
    steps: int = 3,
    layers: int = 4,
    slow_rank: int = 1,
    factor: float | None = None,
    sleep_us: float = 150.0,
    jitter: float = 0.02,
    seed: int = 0,
) -> list[Path]:
    """Write ``rank{r}.pt.trace.json`` for r in range(ranks) into ``out``; return the paths."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")
    f = DEFAULT_FACTOR[scenario] if factor is None else factor
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    events: dict[int, list] = {r: [] for r in range(ranks)}

    def j(us: float) -> float:
        return us * (1 + rng.uniform(-jitter, jitter))

    leave = 10.0  # every rank leaves the previous collective together
    for s in range(steps):
        step_start = leave
        for _layer in range(layers):
            arrive_a2a = {}
            for r in range(ranks):
                slow = r == slow_rank
                ev = events[r]
                t = leave + 2
                attn = j(ATTN_US) * (f if slow and scenario in ("slow_attention", "mixed") else 1.0)
                ev.append(_x("nn.Module: SelfAttention_0", 1, t, attn, cat="python_function"))
                ev.append(_x("aten::bmm", 1, t + 0.05 * attn, 0.6 * attn, cat="cpu_op"))
                ev.append(_x("aten::softmax", 1, t + 0.7 * attn, 0.25 * attn, cat="cpu_op"))
                t += attn + 2
                uniq = j(UNIQUE_US) * (f if slow and scenario == "slow_op" else 1.0)
                ev.append(_x("aten::_unique2", 1, t, uniq, cat="cpu_op"))
                t += uniq + 2
                if slow and scenario in ("host_sleep", "mixed"):
                    t += sleep_us  # time.sleep(): no op on the thread
                arrive_a2a[r] = t
            leave_a2a = max(arrive_a2a.values()) + TRANSFER_US
            arrive_ar = {}
            for r in range(ranks):
                ev = events[r]
                a = arrive_a2a[r]
                ev.append(_x("c10d::alltoall_base_", 1, a - 1, 1.0, cat="cpu_op"))
                ev.append(_x("gloo:all_to_all", 2, a, leave_a2a - a))
                t = leave_a2a + 2
                moe = j(MOE_US)
                ev.append(_x("nn.Module: MoE_0", 1, t, moe, cat="python_function"))
                ev.append(_x("aten::mm", 1, t + 0.05 * moe, 0.9 * moe, cat="cpu_op"))
                t += moe + 2
                arrive_ar[r] = t
            leave = max(arrive_ar.values()) + TRANSFER_US
            for r in range(ranks):
                a = arrive_ar[r]
                events[r].append(_x("c10d::allreduce_", 1, a - 1, 1.0, cat="cpu_op"))
                events[r].append(_x("gloo:all_reduce", 2, a, leave - a))
        for r in range(ranks):
            events[r].append(_x(f"ProfilerStep#{s}", 1, step_start, leave - step_start + 1))
        leave += 30
    return write_traces(out, events)
