"""Deterministic synthetic multi-rank Kineto traces of a MoE EP step loop, shaped like GPU runs.

The CPU-shaped generator (``synth_kineto.py``) puts every MoE region on the host thread and
models compute as synchronous. Real GPU traces differ in the ways that broke layer detection:

- the host thread only LAUNCHES work (``cudaLaunchKernel`` / ``cudaGraphLaunch``, a few µs) and
  runs ahead of the device; kernels run later on CUDA streams (pid = device, tid = stream),
  linked to their launch by a correlation id (``args.correlation`` on both, plus an ``ac2g``
  flow: ``s`` on the CPU at the launch, ``f`` with ``bp: "e"`` on the GPU at the kernel);
- record_function ranges appear twice: as a host ``user_annotation`` and as a
  ``gpu_user_annotation`` on the device spanning the kernels launched inside it;
- MoE work is split over streams: gating and the expert GEMMs on the compute stream (7), the
  all-to-alls on the NCCL stream (20); a stream waits for the other where data flows;
- torch ``all_to_all_single`` on NCCL runs as ``ncclDevKernel_SendRecv`` kernels; the kind is
  only in the host ops around the launch (``record_param_comms`` "Collective name", with the
  split sizes, > ``nccl:all_to_all``) unless ``kernel_coll_args`` puts the args on the kernel;
- under CUDA-graph replay (``graph=True``) the host issues one ``cudaGraphLaunch`` per step and
  every kernel of the step carries its correlation; no host op or annotation runs per layer.

Per rank, step ``s`` and MoE layer ``l`` (eager mode)::

    ProfilerStep#<s>                        user_annotation (host)
      [nn.Module: MoELayer_<l>]             python_function, with layer_marks="module"
        cudaLaunchKernel -> topkGatingSoftmax + moe_align_block_size kernels     (stream 7)
        dispatch(F)                         user_annotation + gpu_user_annotation
          record_param_comms > nccl:all_to_all > cudaLaunchKernel -> SendRecv    count exchange
          cudaMemcpyAsync, cudaStreamSynchronize      (the host needs the counts: it waits)
          record_param_comms > nccl:all_to_all > cudaLaunchKernel -> SendRecv    token exchange
        mlp(F)                              user_annotation + gpu_user_annotation
          cudaLaunchKernel -> DeepGEMM m-grouped GEMM (gate/up), act_and_mul, grouped GEMM (down)
        combine(F)                          user_annotation + gpu_user_annotation
          record_param_comms > nccl:all_to_all > cudaLaunchKernel -> SendRecv

``comm="deepep"`` replaces the three SendRecv kernels by DeepEP low-latency
``deep_ep::internode_ll::dispatch`` / ``combine`` kernels (no NCCL, no split sizes in the trace).

Time model: the same as ``synth_kineto`` (one true clock; 1.2 µs gating per token, 2 µs per row
per expert GEMM, transfer 40 µs + 0.25 µs per remote row, 25 µs count exchange; a collective
kernel on rank i starts when it is launched and its stream is ready, and every rank leaves at
max(start) + transfer_i + U(0, 2 µs)), and the same scenarios (``synth_kineto.SCENARIOS``) with
the same slow-rank factors, so the EP verdicts can be compared with the CPU-shaped runs.
All randomness comes from one ``random.Random(seed)``.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

from synth_kineto import (
    COUNT_XFER_NS,
    GATE_NS_PER_TOKEN,
    MM_NS_PER_ROW,
    SCENARIOS,
    XFER_BASE_NS,
    XFER_NS_PER_ROW,
    spike_position,
)

__all__ = [
    "write_gpu_ep_run",
    "write_events",
    "T0_US",
    "COMPUTE_STREAM",
    "NCCL_STREAM",
    "GEMM_KERNEL",
    "SENDRECV_KERNEL",
    "DEEPEP_DISPATCH",
    "DEEPEP_COMBINE",
]

T0_US = 1_790_000_000_000_000 // 1000  # absolute epoch µs, like real Kineto traces without base time
COMPUTE_STREAM = 7
NCCL_STREAM = 20
LAUNCH_NS = 5_000
LAUNCH_LATENCY_NS = 4_000
GEMM_KERNEL = (
    "void deep_gemm::fp8_gemm_kernel<7168u, 2048u, 128u, 128u, 128u, 16u, 6u, 1u, 1u, "
    "(deep_gemm::GemmType)1>(__nv_bfloat16*, float*, int*, unsigned int, CUtensorMap, "
    "CUtensorMap, CUtensorMap, CUtensorMap)"
)
ACT_KERNEL = "void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel<c10::BFloat16>, true>(c10::BFloat16*, c10::BFloat16 const*, int)"
GATE_KERNEL = (
    "void vllm::moe::topkGatingSoftmax<8, 128, 4, 16, int>(float const*, bool const*, "
    "float*, int, int*, int*, int, int, int)"
)
ALIGN_KERNEL = (
    "void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, "
    "int, int, int, unsigned long, int*)"
)
SENDRECV_KERNEL = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
DEEPEP_DISPATCH = "void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*, float*, int*, long*, void*, int*, int*)"
RANGES = {
    "record_function": ("user_annotation", "dispatch(F)", "mlp(F)", "combine(F)"),
    "megatron": (
        "python_function",
        "megatron/core/transformer/moe/token_dispatcher.py(611): token_dispatch",
        "megatron/core/transformer/moe/experts.py(240): forward",
        "megatron/core/transformer/moe/token_dispatcher.py(650): token_combine",
    ),
}
DEEPEP_COMBINE = (
    "void deep_ep::internode_ll::combine<3, 7168, 128>(void*, void*, int*, void*, long const*, float const*)"
)


def _us(ns: int) -> float:
    return round(T0_US + ns / 1000.0, 3)


def _dur(ns: int) -> float:
    return round(ns / 1000.0, 3)


class _Rank:
    def __init__(self, rank: int, t0: int) -> None:
        self.rank = rank
        self.pid = 3000 + rank
        self.dev = rank % 8
        self.t = t0  # host clock
        self.ready = {COMPUTE_STREAM: t0, NCCL_STREAM: t0}
        self.events: list[dict] = []
        self.stack: list[dict] = []
        self.corr = 100_000 + 7 * rank
        self.ext = 1
        self.open_gpu: list[dict] = []  # gpu_user_annotations being filled

    # host --------------------------------------------------------------------------------------
    def _x(self, cat, name, ts, dur, args=None, pid=None, tid=None) -> dict:
        ev = {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": self.pid if pid is None else pid,
            "tid": self.pid if tid is None else tid,
            "ts": ts,
            "dur": dur,
            "args": args or {},
        }
        self.events.append(ev)
        return ev

    def open(self, cat, name, args=None, gap=1_000) -> dict:
        self.t += gap
        ev = self._x(cat, name, self.t, 0, dict(args or {}, **{"External id": self.ext}))
        self.ext += 1
        self.stack.append(ev)
        if cat == "user_annotation":
            self.open_gpu.append({"name": name, "kernels": []})
        return ev

    def close(self, pad=1_000) -> None:
        self.t += pad
        ev = self.stack.pop()
        ev["dur"] = self.t - ev["ts"]
        if ev["cat"] == "user_annotation":
            g = self.open_gpu.pop()
            ks = g["kernels"]
            if ks:  # Kineto's device-side copy of the range: the span of its kernels
                s = min(k["ts"] for k in ks)
                e = max(k["ts"] + k["dur"] for k in ks)
                self._x(
                    "gpu_user_annotation",
                    g["name"],
                    s,
                    e - s,
                    {"External id": ev["args"]["External id"]},
                    pid=self.dev,
                    tid=ks[0]["tid"],
                )
            if self.open_gpu:
                self.open_gpu[-1]["kernels"].extend(ks)

    def runtime(self, name, dur, gap=500) -> tuple[int, int]:
        self.t += gap
        corr = self.corr
        self.corr += 1
        self._x("cuda_runtime", name, self.t, dur, {"correlation": corr, "cbid": 211})
        if "Launch" in name:
            self.events.append(
                {"ph": "s", "id": corr, "pid": self.pid, "tid": self.pid, "ts": self.t, "cat": "ac2g", "name": "ac2g"}
            )
        start = self.t
        self.t += dur
        return start, corr

    # device ------------------------------------------------------------------------------------
    def kernel(self, name, stream, ready_ns, dur, corr, args=None) -> dict:
        ts = max(ready_ns, self.ready[stream])
        ev = self._x(
            "kernel",
            name,
            ts,
            dur,
            dict({"device": self.dev, "stream": stream, "correlation": corr}, **(args or {})),
            pid=self.dev,
            tid=stream,
        )
        self.events.append(
            {"ph": "f", "id": corr, "pid": self.dev, "tid": stream, "ts": ts, "cat": "ac2g", "name": "ac2g", "bp": "e"}
        )
        self.ready[stream] = ts + dur
        if self.open_gpu:
            self.open_gpu[-1]["kernels"].append(ev)
        return ev


class _GpuSim:
    def __init__(
        self,
        *,
        ranks,
        steps,
        layers,
        experts_per_rank,
        tokens_per_rank,
        scenario,
        slow_rank,
        comm,
        graph,
        layer_marks,
        kernel_coll_args,
        ranges,
        seed,
    ) -> None:
        self.R, self.S, self.L = ranks, steps, layers
        self.epr, self.T, self.E = experts_per_rank, tokens_per_rank, ranks * experts_per_rank
        self.scenario, self.slow = scenario, slow_rank
        self.comm, self.graph, self.marks, self.kargs = comm, graph, layer_marks, kernel_coll_args
        # the host ranges around dispatch / expert MLP / combine: record_function annotations
        # (host + device copy) or Megatron-Core python frames (host only, with_stack)
        self.region = RANGES[ranges]
        self.rng = random.Random(seed)
        self.cjit = 0.10 if scenario == "noisy" else 0.02
        self.xjit = 0.40 if scenario == "noisy" else 0.03
        self.ranks = [_Rank(r, self.rng.randrange(100_000, 400_000)) for r in range(ranks)]
        w = [1.0] * self.E
        if scenario == "token_skew" and ranks > 1:
            hot = min(3.5 / ranks, 0.9)
            for e in range(self.E):
                on_slow = e // experts_per_rank == slow_rank
                w[e] = (hot / experts_per_rank) if on_slow else ((1 - hot) / (self.E - experts_per_rank))
        self.weights = w
        self.spike = spike_position(steps, layers)
        self.seq = 0

    def cdur(self, ns, factor=1.0) -> int:
        return max(int(ns * factor * self.rng.uniform(1 - self.cjit, 1 + self.cjit)), 500)

    def xdur(self, ns) -> int:
        return max(int(ns * self.rng.uniform(1 - self.xjit, 1 + self.xjit)), 1000)

    def route(self) -> list[list[int]]:
        out = []
        for _src in range(self.R):
            w = [x * self.rng.uniform(0.9, 1.1) for x in self.weights]
            tot = sum(w)
            q = [self.T * x / tot for x in w]
            c = [int(math.floor(x)) for x in q]
            for e in sorted(range(self.E), key=lambda e: (-(q[e] - c[e]), e))[: self.T - sum(c)]:
                c[e] += 1
            out.append(c)
        return out

    # one synchronous exchange over all ranks ---------------------------------------------------
    def exchange(self, kind: str, splits, launches: dict, deps: dict) -> dict:
        """launches[r] = (launch_ts, corr); deps[r] = device time the data is ready on rank r.
        Returns {rank: kernel event}."""
        name = SENDRECV_KERNEL if self.comm == "nccl" else (DEEPEP_DISPATCH if kind != "combine" else DEEPEP_COMBINE)
        stream = NCCL_STREAM
        starts = {}
        for rk in self.ranks:
            lt, _ = launches[rk.rank]
            starts[rk.rank] = max(lt + LAUNCH_NS + LAUNCH_LATENCY_NS, deps[rk.rank], rk.ready[stream])
        last = max(starts.values())
        self.seq += 1
        out = {}
        for rk in self.ranks:
            r = rk.rank
            if splits is None:
                ns = COUNT_XFER_NS
            else:
                o, i = splits[r]
                ns = XFER_BASE_NS + XFER_NS_PER_ROW * ((sum(o) - o[r]) + (sum(i) - i[r]))
            if self.scenario == "slow_link" and r == self.slow:
                ns *= 3
            leave = last + self.xdur(ns) + self.rng.randrange(0, 2000)
            args = {}
            if self.comm == "nccl" and self.kargs:
                args = {
                    "Collective name": "all_to_allv" if splits else "all_to_all",
                    "Seq": self.seq,
                    "Process Group Name": "0",
                    "Group size": self.R,
                }
                if splits:
                    args["Out split size"] = str(splits[r][0]).replace(" ", "")
            out[r] = rk.kernel(name, stream, starts[r], leave - starts[r], launches[r][1], args)
        return out

    def host_collective(self, rk: _Rank, splits_r, kind: str = "dispatch") -> tuple[int, int]:
        """record_param_comms > nccl:all_to_all > cudaLaunchKernel on the host; (launch ts, corr)."""
        if self.comm == "deepep":
            rk.open("cpu_op", f"deep_ep::Buffer::low_latency_{kind}", gap=3_000)
            lt = rk.runtime("cudaLaunchKernel", LAUNCH_NS)
            rk.close(1_000)
            return lt
        args = {
            "Collective name": "all_to_all" if splits_r is None else "all_to_allv",
            "Process Group Name": "0",
            "Group size": self.R,
            "Rank": rk.rank,
        }
        if splits_r is not None:
            args["In split size"] = str(splits_r[1]).replace(" ", "")
            args["Out split size"] = str(splits_r[0]).replace(" ", "")
        rk.open("cpu_op", "record_param_comms", args, gap=3_000)
        rk.open("user_annotation", "nccl:all_to_all", gap=1_000)
        lt = rk.runtime("cudaLaunchKernel", LAUNCH_NS)
        rk.close(1_000)
        rk.close(1_000)
        return lt

    def run(self) -> None:
        R, epr, T = self.R, self.epr, self.T
        for s in range(self.S):
            graph_corr = {}
            for rk in self.ranks:
                rk.open("user_annotation", f"ProfilerStep#{s}", gap=30_000)
                if self.graph:
                    # one launch replays the whole step; every kernel carries its correlation
                    graph_corr[rk.rank] = rk.runtime("cudaGraphLaunch", 12_000)
            for l in range(self.L):
                cnt = self.route()
                in_sp = [[sum(cnt[r][d * epr : (d + 1) * epr]) for d in range(R)] for r in range(R)]
                out_sp = [[in_sp[src][r] for src in range(R)] for r in range(R)]
                recv = [sum(out_sp[r]) for r in range(R)]

                def launch(rk, name_k=None):
                    if self.graph:
                        return (rk.t, graph_corr[rk.rank][1])  # noqa: B023 (called in this iteration)
                    return rk.runtime("cudaLaunchKernel", LAUNCH_NS)

                gate_end = {}
                for rk in self.ranks:
                    if self.marks == "module" and not self.graph:
                        rk.open("python_function", f"nn.Module: MoELayer_{l}", gap=5_000)
                    lt, corr = launch(rk)
                    # the layer's input is the previous layer's combine output: the compute stream
                    # waits for it (a stream wait on the NCCL stream's event)
                    rk.kernel(
                        GATE_KERNEL,
                        COMPUTE_STREAM,
                        max(lt + LAUNCH_NS + LAUNCH_LATENCY_NS, rk.ready[NCCL_STREAM]),
                        self.cdur(0.6 * GATE_NS_PER_TOKEN * T),
                        corr,
                    )
                    lt, corr = launch(rk)
                    a = rk.kernel(
                        ALIGN_KERNEL,
                        COMPUTE_STREAM,
                        lt + LAUNCH_NS + LAUNCH_LATENCY_NS,
                        self.cdur(0.2 * GATE_NS_PER_TOKEN * T),
                        corr,
                    )
                    gate_end[rk.rank] = a["ts"] + a["dur"]
                    if not self.graph:
                        rk.open(self.region[0], self.region[1], gap=3_000)
                # dispatch: count exchange (NCCL only), then the token exchange
                if self.comm == "nccl":
                    launches = {
                        rk.rank: (launch(rk) if self.graph else self.host_collective(rk, None)) for rk in self.ranks
                    }
                    ks = self.exchange("count", None, launches, gate_end)
                    for rk in self.ranks:
                        if not self.graph:  # the host needs the counts: it waits for the kernel
                            rk.runtime("cudaMemcpyAsync", 3_000)
                            k = ks[rk.rank]
                            end = max(k["ts"] + k["dur"] + 4_000, rk.t + 1_000)
                            st, _ = rk.runtime("cudaStreamSynchronize", max(end - rk.t - 500, 1_000))
                    deps = {r: ks[r]["ts"] + ks[r]["dur"] for r in ks}
                else:
                    deps = gate_end
                launches = {
                    rk.rank: (launch(rk) if self.graph else self.host_collective(rk, (out_sp[rk.rank], in_sp[rk.rank])))
                    for rk in self.ranks
                }
                ks = self.exchange("dispatch", [(out_sp[r], in_sp[r]) for r in range(R)], launches, deps)
                gemm_end = {}
                for rk in self.ranks:
                    r = rk.rank
                    if not self.graph:
                        rk.close(2_000)  # dispatch(F)
                        rk.open(self.region[0], self.region[2], gap=3_000)
                    factor = 1.0
                    if r == self.slow and self.scenario == "slow_compute":
                        factor = 3.0
                    if r == self.slow and self.scenario == "spike" and (s, l) == self.spike:
                        factor = 5.0
                    ready = ks[r]["ts"] + ks[r]["dur"]  # the experts wait for the tokens
                    for name, ns in (
                        (GEMM_KERNEL, MM_NS_PER_ROW * recv[r]),
                        (ACT_KERNEL, 3_000 + 20 * recv[r]),
                        (GEMM_KERNEL, MM_NS_PER_ROW * recv[r]),
                    ):
                        lt, corr = launch(rk)
                        k = rk.kernel(
                            name,
                            COMPUTE_STREAM,
                            max(ready, lt + LAUNCH_NS + LAUNCH_LATENCY_NS),
                            self.cdur(max(ns, 1_000), factor),
                            corr,
                        )
                        ready = k["ts"] + k["dur"]
                    gemm_end[r] = ready
                    if not self.graph:
                        rk.close(2_000)  # mlp(F)
                        rk.open(self.region[0], self.region[3], gap=3_000)
                launches = {
                    rk.rank: (
                        launch(rk)
                        if self.graph
                        else self.host_collective(rk, (in_sp[rk.rank], out_sp[rk.rank]), "combine")
                    )
                    for rk in self.ranks
                }
                self.exchange("combine", [(in_sp[r], out_sp[r]) for r in range(R)], launches, gemm_end)
                for rk in self.ranks:
                    if not self.graph:
                        rk.close(2_000)  # combine(F)
                        if self.marks == "module":
                            rk.close(2_000)  # nn.Module: MoELayer_l
            for rk in self.ranks:
                if self.graph:  # the host waits for the replay before the next step
                    end = max(rk.ready.values())
                    rk.runtime("cudaStreamSynchronize", max(end - rk.t, 1_000))
                rk.close(10_000)  # ProfilerStep#s


def write_events(path: Path, events: list[dict], *, rank: int, world: int, host: str = "node0") -> Path:
    """One Kineto-style JSON trace (ts / dur in µs) of ``events`` (ns times) for ``rank``."""
    out = []
    for e in events:
        e2 = dict(e)
        e2["ts"] = _us(e["ts"])
        if "dur" in e:
            e2["dur"] = _dur(e["dur"])
        out.append(e2)
    pids = sorted({e["pid"] for e in events})
    meta = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": p,
            "tid": 0,
            "ts": _us(0),
            "args": {"name": "python" if p >= 1000 else f"GPU {p}"},
        }
        for p in pids
    ]
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "host_name": host,
        "displayTimeUnit": "ms",
        "traceEvents": meta + out,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(doc).encode()
    if path.suffix == ".gz":
        with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as g:
            g.write(data)
    else:
        path.write_bytes(data)
    return path


def write_gpu_ep_run(
    out_dir,
    *,
    ranks: int = 4,
    steps: int = 3,
    layers: int = 3,
    experts_per_rank: int = 4,
    tokens_per_rank: int = 256,
    scenario: str = "balanced",
    slow_rank: int = 1,
    comm: str = "nccl",
    graph: bool = False,
    layer_marks: str = "none",
    kernel_coll_args: bool = False,
    ranges: str = "record_function",
    clock_offsets_us: dict | None = None,
    seed: int = 0,
) -> list[Path]:
    """Write ``rank{r}.pt.trace.json.gz`` for r in range(ranks); return the paths.

    comm: "nccl" (torch all_to_all_single on NCCL: SendRecv kernels) or "deepep" (DeepEP
    low-latency kernels). graph: CUDA-graph replay (one cudaGraphLaunch per step, no per-layer
    host ops or annotations). layer_marks: "none" (layers are the dispatch → combine pairs) or
    "module" (an ``nn.Module: MoELayer_<l>`` host range around each layer). kernel_coll_args:
    the NCCL kernels carry Kineto's collective args (newer PyTorch); else only the host ops do.
    ranges: "record_function" (dispatch(F) / mlp(F) / combine(F) user annotations, each with its
    gpu_user_annotation copy) or "megatron" (Megatron-Core token_dispatch / experts forward /
    token_combine python frames, host only: the device never names dispatch or combine).
    clock_offsets_us: {rank: µs} added to every ts of that rank (a rank on another host).
    """
    if ranges not in RANGES:
        raise ValueError(f"ranges must be one of {sorted(RANGES)}, not {ranges!r}")
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {sorted(SCENARIOS)}")
    if comm not in ("nccl", "deepep"):
        raise ValueError(f"comm must be 'nccl' or 'deepep', not {comm!r}")
    if layer_marks not in ("none", "module"):
        raise ValueError(f"layer_marks must be 'none' or 'module', not {layer_marks!r}")
    if not 0 <= slow_rank < ranks:
        raise ValueError(f"slow_rank {slow_rank} is not in range(0, {ranks})")
    sim = _GpuSim(
        ranks=ranks,
        steps=steps,
        layers=layers,
        experts_per_rank=experts_per_rank,
        tokens_per_rank=tokens_per_rank,
        scenario=scenario,
        slow_rank=slow_rank,
        comm=comm,
        graph=graph,
        layer_marks=layer_marks,
        kernel_coll_args=kernel_coll_args,
        ranges=ranges,
        seed=seed,
    )
    sim.run()
    offsets = {int(k): int(round(float(v) * 1000)) for k, v in (clock_offsets_us or {}).items()}
    hosts: dict[int, int] = {}
    paths = []
    for rk in sim.ranks:
        off = offsets.get(rk.rank, 0)
        h = hosts.setdefault(off, len(hosts))
        evs = [dict(e, ts=e["ts"] + off) for e in rk.events]
        paths.append(
            write_events(
                Path(out_dir) / f"rank{rk.rank}.pt.trace.json.gz", evs, rank=rk.rank, world=ranks, host=f"node{h}"
            )
        )
    return paths
