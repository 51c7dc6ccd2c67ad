"""Deterministic synthetic multi-rank GPU Kineto traces for the host- vs device-bound question
(issue 18): per step, the host launches ``kernels`` GEMM kernels one by one (Python work between
launches, then ``cudaLaunchKernel``), then an NCCL all-reduce that every rank leaves together.

Scenarios (``slow_rank`` is the anomalous rank):
- ``balanced``: host 8 µs of Python + 5 µs launch per kernel, kernels 40 µs: the host runs ahead,
  the device is busy;
- ``host_bound``: on slow_rank the Python work between launches is 80 µs: its device idles
  between kernels waiting for launches (big launch gaps), and it arrives last at the all-reduce;
- ``device_slow``: on slow_rank every kernel takes 100 µs (slower device): the device is busy
  and the host waits for it at the all-reduce;
- ``slow_link``: on slow_rank the all-reduce transfer runs at half the bandwidth (twice the
  transfer time) while every rank sends the same bytes.

The all-reduce kernels carry Kineto's NCCL args (``Collective name``, ``In msg nelems``,
``Out msg nelems``, ``dtype``, ``Group size``, ``Process Group Name`` / ``Ranks``), so the bytes
of each transfer are in the trace. Written with ``synth_gpu_ep.write_events``.
"""

from __future__ import annotations

import random
from pathlib import Path

from synth_gpu_ep import COMPUTE_STREAM, NCCL_STREAM, _Rank, write_events

SCENARIOS = ("balanced", "host_bound", "device_slow", "slow_link")
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NELEMS = 4 * 1024 * 1024  # bf16 elements per all-reduce: 8 MiB
BYTES_PER_NS = 100.0  # 100 GB/s: 8 MiB in ~84 µs
LAUNCH_NS = 5_000
LAUNCH_LATENCY_NS = 4_000


def write_host_device_run(
    out_dir,
    *,
    ranks: int = 4,
    steps: int = 6,
    kernels: int = 8,
    scenario: str = "balanced",
    slow_rank: int = 1,
    seed: int = 0,
) -> list[Path]:
    """Write ``rank{r}.pt.trace.json.gz`` for r in range(ranks); return the paths."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")
    if not 0 <= slow_rank < ranks:
        raise ValueError(f"slow_rank {slow_rank} is not in range(0, {ranks})")
    rng = random.Random(seed)
    rks = [_Rank(r, 1_000_000) for r in range(ranks)]
    group = str(list(range(ranks)))
    for s in range(steps):
        for rk in rks:
            rk.open("user_annotation", f"ProfilerStep#{s}", gap=2_000)
            slow = rk.rank == slow_rank
            for _ in range(kernels):
                python_ns = 80_000 if slow and scenario == "host_bound" else 8_000
                kernel_ns = 100_000 if slow and scenario == "device_slow" else 40_000
                start, corr = rk.runtime("cudaLaunchKernel", LAUNCH_NS, gap=python_ns + rng.randint(0, 500))
                rk.kernel(GEMM, COMPUTE_STREAM, start + LAUNCH_LATENCY_NS, kernel_ns + rng.randint(0, 500), corr)
        # the all-reduce: each rank's kernel starts when launched and its compute is done; every
        # rank leaves at the last start + its own transfer
        starts, corrs = [], []
        for rk in rks:
            launch, corr = rk.runtime("cudaLaunchKernel", LAUNCH_NS, gap=2_000)
            starts.append(max(launch + LAUNCH_LATENCY_NS, rk.ready[COMPUTE_STREAM], rk.ready[NCCL_STREAM]))
            corrs.append(corr)
        last = max(starts)
        for rk, start, corr in zip(rks, starts, corrs):
            transfer = int(2 * NELEMS / BYTES_PER_NS)
            if scenario == "slow_link" and rk.rank == slow_rank:
                transfer *= 2
            args = {
                "Collective name": "allreduce",
                "In msg nelems": NELEMS,
                "Out msg nelems": NELEMS,
                "dtype": "BFloat16",
                "Group size": ranks,
                "Process Group Name": "0",
                "Process Group Ranks": group,
            }
            rk.kernel(ALLREDUCE, NCCL_STREAM, start, last + transfer + rng.randint(0, 1_000) - start, corr, args)
        # the host synchronises with the stream, then ends the step
        for rk in rks:
            end = rk.ready[NCCL_STREAM]
            sync_start = rk.t + 500
            rk.t = max(sync_start, end) + 1_000
            rk._x("cuda_runtime", "cudaStreamSynchronize", sync_start, rk.t - sync_start, {"correlation": rk.corr})
            rk.corr += 1
            rk.close()
    return [
        write_events(Path(out_dir) / f"rank{rk.rank}.pt.trace.json.gz", rk.events, rank=rk.rank, world=ranks)
        for rk in rks
    ]
