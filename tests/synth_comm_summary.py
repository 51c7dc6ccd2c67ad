"""A small msprof-analyze ``cluster_communication.json`` (the shape of the real one in
../shared/realdata/ascend): one rank set, ``ops`` all-reduce ops, every rank moving the same HCCS
and RDMA bytes; ``slow`` maps rank -> (link, factor): that rank's transit time on that link is
``factor`` times the others' (factor 2: half the bandwidth)."""

from __future__ import annotations

import json
from pathlib import Path

LINKS = ("RDMA", "HCCS", "PCIE", "SDMA")
SIZE_MB = {"RDMA": 16.0, "HCCS": 64.0}
GBPS = {"RDMA": 20.0, "HCCS": 80.0}  # GB/s = MB per ms


def write_cluster_communication(path, *, ranks: int = 4, ops: int = 6, slow: dict | None = None) -> Path:
    slow = slow or {}
    rank_set = "(" + ", ".join(map(str, range(ranks))) + ")"
    step: dict = {}
    for k in range(ops):
        per_rank = {}
        for r in range(ranks):
            bw_info = {}
            for link in LINKS:
                mb = SIZE_MB.get(link, 0.0)
                ms = mb / GBPS[link] if mb else 0.0
                if slow.get(r, (None,))[0] == link:
                    ms *= slow[r][1]
                bw_info[link] = {
                    "Transit Size(MB)": mb,
                    "Transit Time(ms)": ms,
                    "Bandwidth(GB/s)": round(mb / ms, 4) if ms else 0,
                    "Large Packet Ratio": 1.0 if mb else 0,
                    "Size Distribution": {},
                }
            transit = sum(v["Transit Time(ms)"] for v in bw_info.values())
            per_rank[str(r)] = {
                "Communication Time Info": {
                    "Start Timestamp(us)": 1_695_054_582_608_213.0 + 10_000 * k,
                    "Elapse Time(ms)": transit + 1.0,
                    "Transit Time(ms)": transit,
                    "Wait Time(ms)": 1.0,
                    "Synchronization Time(ms)": 0.5,
                    "Idle Time(ms)": 0.0,
                    "Wait Time Ratio": 0.5,
                    "Synchronization Time Ratio": 0.3,
                },
                "Communication Bandwidth Info": bw_info,
            }
        step[f"hcom_allReduce__501_{k}@6297232067196334501"] = per_rank
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({rank_set: {"step": step}}))
    return path


def write_cluster_comm_matrix(
    path,
    *,
    ranks: int = 8,
    ops: int = 6,
    link: str = "HCCS",
    size_mb: float = 20.97152,
    gbps: float = 19.2,
    jitter: float = 0.05,
    seed: int = 0,
    slow_pairs: dict | None = None,
    slow_ranks: dict | None = None,
    slow_ops: int | None = None,
) -> Path:
    """msprof-analyze's ``cluster_communication_matrix.json`` (the shape of the real one in
    ../shared/realdata/thirdparty/msinsight): one rank set, ``ops`` all-gathers in which every
    rank sends ``size_mb`` to every other rank over ``link`` at ``gbps`` GB/s, each transfer's
    time off by a uniform +-``jitter`` (seeded), plus each rank's LOCAL copy.
    ``slow_pairs`` maps (src, dst) -> factor: that link's transit time is ``factor`` times longer
    (factor 2: half the bandwidth); ``slow_ranks`` maps rank -> factor: every link in or out of
    that rank. ``slow_ops``: only the first that many ops are slow (default all)."""
    import random

    rng = random.Random(seed)
    slow_pairs, slow_ranks = slow_pairs or {}, slow_ranks or {}
    step: dict = {}
    for k in range(ops):
        links = {}
        for src in range(ranks):
            links[f"{src}-{src}"] = {
                "Transport Type": "LOCAL",
                "Transit Size(MB)": 2 * size_mb,
                "Transit Time(ms)": 2 * size_mb / 700.0,
                "Bandwidth(GB/s)": 700.0,
            }
            for dst in range(ranks):
                if dst == src:
                    continue
                factor = 1.0
                if slow_ops is None or k < slow_ops:
                    factor = slow_pairs.get((src, dst), 1.0) * max(slow_ranks.get(src, 1.0), slow_ranks.get(dst, 1.0))
                ms = size_mb / gbps * factor * (1 + rng.uniform(-jitter, jitter))
                links[f"{src}-{dst}"] = {
                    "Transport Type": link,
                    "Transit Size(MB)": size_mb,
                    "Transit Time(ms)": ms,
                    "Bandwidth(GB/s)": round(size_mb / ms, 4),
                }
        step[f"hcom_allGather__483_{k}@9350434047717501483"] = links
    step["Total Op Info"] = {
        "0-1": {"Transport Type": link, "Transit Size(MB)": 1.0, "Transit Time(ms)": 1.0, "Bandwidth(GB/s)": 1.0}
    }
    rank_set = "(" + ", ".join(map(str, range(ranks))) + ")"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({rank_set: {"step2": step}}))
    return path


STEP_TRACE_HEADER = (
    "Step,Type,Index,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,"
    "Stage,Bubble,Communication(Not Overlapped and Exclude Receive)"
)


def write_step_trace_csv(path, computing: dict[int, float], comm: float = 200.0, free: float = 50.0) -> Path:
    """A cluster_step_trace_time.csv of one step, rank rows only (no stage statement)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        f"1,rank,{r},{c},{comm},1.5,{comm + 1.5},{free},{c + comm + free},0.0,{comm}" for r, c in computing.items()
    ]
    path.write_text("\n".join([STEP_TRACE_HEADER, *lines]) + "\n")
    return path
