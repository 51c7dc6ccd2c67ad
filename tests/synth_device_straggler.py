"""Device-lane stragglers for why-straggler (issue 42 item 4), with exact, chosen timings plus a
seeded jitter: a GPU (Kineto) run with two streams, and an Ascend run of operator CSVs.

GPU (``write_gpu_run``): each rank's device runs, per iteration, after the ranks leave an NCCL
all-reduce (process group "0", stream ``COMM_STREAM``) together:

    stream COMM_STREAM:    an overlapped NCCL all-gather (group "1", AG_US), every rank alike
    stream COMPUTE_STREAM: attention ATTN_US, a GEMM GEMM_US, a norm NORM_US
    then the all-reduce, where the ranks meet; they leave it XFER_US after the last arrives.

``late_rank`` is host-bound: its first compute kernel starts ``delay_us`` after each all-reduce
ends (a timely rank's, 3 us): its host reaches that launch late (``cudaLaunchKernel`` calls on the host thread, linked
to their kernels by correlation id and ac2g flows; a timely host runs AHEAD_US ahead). With
``overlap`` (default) that idle time falls inside the all-gather on the communication stream:
the device as a whole is busy, only the compute stream is starved. Without ``overlap`` there is no all-gather and the whole device idles.

Ascend (``write_ascend_run``): per rank ``rank<r>_ascend_pt/profiler_info_<r>.json`` and
``ASCEND_PROFILER_OUTPUT/kernel_details.csv`` (torch_npu's columns): on stream 16, per
iteration, FlashAttentionScore ATTN_US, MatMulV2 MATMUL_US, Add ADD_US, then an
``hcom_allReduce_`` HCCL row (Stream ID N/A) where the ranks meet. ``slow_rank``'s MatMulV2 takes
``factor`` x. With ``timeline=True`` the rank writes the same run as an Ascend timeline instead,
``ASCEND_PROFILER_OUTPUT/trace_view.json`` (a top-level array, ``ts`` as decimal strings): the
device tasks on ``Ascend Hardware`` (thread ``Stream 16``), each launched by an ``aten::`` op on
``Python`` (host time that is not the device's), the ``hcom_allReduce_`` big ops on ``HCCL``
(thread ``Group hccl_world_group Communication``) and ``Overlap Analysis``' Computing / Free /
Communication ranges, as formats.md 2.4 describes them.

``jitter`` is the relative spread (uniform +-) of every duration, per rank and iteration, seeded.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

COMPUTE_STREAM, COMM_STREAM = 7, 20
AG_US, ATTN_US, GEMM_US, NORM_US, XFER_US = 300.0, 200.0, 100.0, 30.0, 40.0
T0_US = 1_790_000_000_000_000 // 1000  # absolute epoch us
LAUNCH_US, AHEAD_US = 4.0, 60.0  # a launch call; how far ahead of its device a timely host runs
AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _kernel(rank: int, name: str, stream: int, ts: float, dur: float, args: dict | None = None) -> dict:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": rank % 8,
        "tid": stream,
        "ts": round(ts, 3),
        "dur": round(dur, 3),
        "args": dict({"device": rank % 8, "stream": stream}, **(args or {})),
    }


def _launched(rank: int, corr: int, launch_ts: float, kernel: dict) -> list[dict]:
    """The host's cudaLaunchKernel of ``kernel`` at ``launch_ts`` and Kineto's flow between them."""
    host = 1000 + rank
    kernel["args"]["correlation"] = corr
    return [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": host, "tid": host,
         "ts": round(launch_ts, 3), "dur": LAUNCH_US, "args": {"correlation": corr, "cbid": 211}},
        {"ph": "s", "id": corr, "pid": host, "tid": host, "ts": round(launch_ts, 3), "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": corr, "pid": rank % 8, "tid": kernel["tid"], "ts": kernel["ts"], "cat": "ac2g",
         "name": "ac2g", "bp": "e"},
        kernel,
    ]  # fmt: skip


def write_gpu_run(
    out: Path,
    *,
    ranks: int = 4,
    iters: int = 12,
    late_rank: int = 2,
    delay_us: float = 150.0,
    overlap: bool = True,
    jitter: float = 0.02,
    seed: int = 0,
) -> list[Path]:
    """Write ``rank{r}.pt.trace.json`` for r in range(ranks) into ``out``; return the paths."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    events: dict[int, list[dict]] = {r: [] for r in range(ranks)}

    def j(us: float) -> float:
        return us * (1 + rng.uniform(-jitter, jitter))

    leave = float(T0_US)
    corr = {r: 1000 * (r + 1) for r in range(ranks)}
    host_t: dict[int, float] = {}  # where each host is in its launches

    def launch(r: int, ts: float, kernel: dict) -> None:
        corr[r] += 1
        events[r].extend(_launched(r, corr[r], ts, kernel))

    for i in range(iters):
        arrive = {}
        ag_end = leave + 5 + AG_US  # every rank's all-gather meets and ends together
        for r in range(ranks):
            # a timely host runs AHEAD_US ahead of its device; the late rank's host reaches its
            # first compute launch delay_us after the all-reduce ends (its device waits)
            h = leave - AHEAD_US
            if overlap:
                ag = {"Collective name": "all_gather", "Seq": i, "Process Group Name": "1"}
                launch(r, h, _kernel(r, AG, COMM_STREAM, leave + 5, AG_US, ag))
                h += LAUNCH_US + 2
            if r == late_rank and delay_us > 0:
                h = max(h, leave + delay_us - 3)
            t = leave + 3
            for name, us in (
                ("flash_fwd_kernel", ATTN_US),
                ("sm90_xmma_gemm_bf16bf16", GEMM_US),
                ("rms_norm_kernel", NORM_US),
            ):
                d = j(us)
                t = max(t, h + 3)  # a kernel starts 3 us after its launch at the earliest
                launch(r, h, _kernel(r, name, COMPUTE_STREAM, t, d))
                h += LAUNCH_US + 2
                t += d + 2
            host_t[r] = h
            arrive[r] = max(t, ag_end + 2) if overlap else t
        leave = max(arrive.values()) + XFER_US
        for r in range(ranks):
            ar = {"Collective name": "allreduce", "Seq": i, "Process Group Name": "0"}
            launch(r, host_t[r], _kernel(r, AR, COMM_STREAM, arrive[r], leave - arrive[r], ar))
        leave += 5
    paths = []
    for r in range(ranks):
        doc = {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": ranks},
            "traceEvents": [
                {"ph": "M", "name": "process_name", "pid": r % 8, "tid": 0, "args": {"name": f"GPU {r % 8}"}},
                {"ph": "M", "name": "process_name", "pid": 1000 + r, "tid": 0, "args": {"name": "python"}},
                *events[r],
            ],
        }
        p = out / f"rank{r}.pt.trace.json"
        p.write_text(json.dumps(doc))
        paths.append(p)
    return paths


ASCEND_COLUMNS = [
    "Step Id", "Model ID", "Task ID", "Stream ID", "Name", "Type", "Accelerator Core",
    "Start Time(us)", "Duration(us)", "Wait Time(us)", "Block Dim", "Mix Block Dim",
    "Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types", "Output Formats",
]  # fmt: skip
ATTN_OP_US, MATMUL_US, ADD_US, HCCL_XFER_US = 300.0, 150.0, 20.0, 60.0


def write_ascend_run(
    out: Path,
    *,
    ranks: int = 4,
    iters: int = 12,
    slow_rank: int = 1,
    factor: float = 1.6,
    jitter: float = 0.02,
    seed: int = 0,
    timeline: bool = False,
) -> list[Path]:
    """Write one ``rank<r>_ascend_pt`` folder per rank into ``out``; return the written files."""
    rng = random.Random(seed)
    rows: dict[int, list[list]] = {r: [] for r in range(ranks)}

    def j(us: float) -> float:
        return us * (1 + rng.uniform(-jitter, jitter))

    ops = (
        ("aclnnFlashAttentionScore_FlashAttentionScore_FlashAttentionScore", "FlashAttentionScore", ATTN_OP_US),
        ("aclnnMatmul_MatMulCommon_MatMulV2", "MatMulV2", MATMUL_US),
        ("aclnnAdd_AddAiCore_Add", "Add", ADD_US),
    )
    leave = float(T0_US)
    task = 1
    for i in range(iters):
        arrive = {}
        for r in range(ranks):
            t = leave + 3
            for name, typ, us in ops:
                d = j(us) * (factor if r == slow_rank and typ == "MatMulV2" else 1.0)
                rows[r].append(
                    [1, 4294967295, task, 16, name, typ, "AI_CORE", f"{t:.3f}", f"{d:.3f}", 0, 48, 0] + ["N/A"] * 6
                )
                task += 1
                t += d + 2
            arrive[r] = t
        leave = max(arrive.values()) + HCCL_XFER_US
        for r in range(ranks):
            rows[r].append(
                [1, 4294967295, "N/A", "N/A", f"hcom_allReduce__{100 + r}_{i}", "hcom_allReduce_", "HCCL",
                 f"{arrive[r]:.3f}", f"{leave - arrive[r]:.3f}", 0, 0] + ["N/A"] * 7
            )  # fmt: skip
        leave += 5
    paths = []
    for r in range(ranks):
        root = out / f"rank{r}_ascend_pt"
        (root / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True, exist_ok=True)
        (root / f"profiler_info_{r}.json").write_text(json.dumps({"rank_id": r}))
        if timeline:
            p = root / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
            p.write_text(json.dumps(_timeline(rows[r])))
            paths.append(p)
            continue
        p = root / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
        with p.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(ASCEND_COLUMNS)
            w.writerows(rows[r])
        paths.append(p)
    return paths


PY_PID, HW_PID, HCCL_PID, OVERLAP_PID = 437675, 800, 43767503, 4376751100


def _timeline(rows: list[list]) -> list[dict]:
    """trace_view.json events of one rank from its kernel_details rows."""

    def x(pid, tid, name, ts_us: float, dur_us: float, args=None, cat=None) -> dict:
        ev = {
            "ph": "X",
            "name": name,
            "pid": pid,
            "tid": tid,
            "ts": f"{ts_us:.3f}",
            "dur": round(dur_us, 3),
            "args": args or {},
        }
        if cat:
            ev["cat"] = cat
        return ev

    def meta(pid, name, threads) -> list[dict]:
        out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}]
        out += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": n}} for t, n in threads]
        return out

    events = (
        meta(PY_PID, "Python", [(PY_PID, "Thread 1")])
        + meta(HW_PID, "Ascend Hardware", [(16, "Stream 16")])
        + meta(HCCL_PID, "HCCL", [(0, "Group hccl_world_group Communication")])
        + meta(OVERLAP_PID, "Overlap Analysis", [(0, "Computing"), (1, "Communication"), (2, "Free")])
    )
    prev_end = None
    for row in rows:
        name, typ, core, ts, dur = row[4], row[5], row[6], float(row[7]), float(row[8])
        if core == "HCCL":
            events.append(
                x(HCCL_PID, 0, name, ts, dur, {"model id": 4294967295, "data_type": "FP16", "alg_type": "RING"})
            )
            events.append(x(OVERLAP_PID, 1, "Communication", ts, dur))
        else:
            # the host launches each op well before the device runs it (host time, not read)
            events.append(x(PY_PID, PY_PID, f"aten::{typ.lower()}", ts - 40.0, 8.0, cat="cpu_op"))
            hw = {"Model Id": 4294967295, "Task Type": core, "Stream Id": 16, "Task Id": row[2]}
            events.append(x(HW_PID, 16, name, ts, dur, hw))
            events.append(x(OVERLAP_PID, 0, "Computing", ts, dur))
        if prev_end is not None and ts > prev_end:
            events.append(x(OVERLAP_PID, 2, "Free", prev_end, ts - prev_end))
        prev_end = ts + dur
    return events
