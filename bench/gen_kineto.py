#!/usr/bin/env python3
"""Stream large, realistic Kineto (PyTorch profiler) traces of a MoE EP decode loop, for benchmarks.

    python bench/gen_kineto.py --out big.pt.trace.json --mb 300 [--gz]
    python bench/gen_kineto.py --ranks 64 --events-per-rank 1000000 --out-dir DIR [--gz] [--jobs 2]

Layout: libkineto's ``output_json.cpp`` (2-space indented ``traceEvents``, top-level keys of an
event on one or two lines, ``"args": {`` block), ``ts``/``dur`` µs with 3 decimals relative to
``baseTimeNanoseconds``, metadata (``distributedInfo`` with pg_config, ``deviceProperties``,
``trace_id``...) before ``traceEvents`` and ``traceName`` as the trailing key.

Each (decode step, MoE layer) block on rank r holds, in this order on the main thread:
``decode_step_<s>`` (first layer only) > ``moe_layer_<l>`` > N filler "model" units, then
``MoeGatingTopK`` > ``aten::mm``, ``MoeDistributeDispatch`` > ``c10d::alltoall_base_`` >
``record_param_comms`` (collective args, ``Comms Id`` = a 62-bit hash) > ``nccl:all_to_all`` >
``cudaLaunchKernel``, ``cudaStreamSynchronize``; ``GroupedMatmul`` > per local expert
``aten::mm`` [[rows, H], [H, H]] > ``cudaLaunchKernel``; ``MoeDistributeCombine`` (like dispatch).
GPU side (pid = device, tid = stream): GEMM kernels with full kernel args, the
``ncclDevKernel_SendRecv(...)`` collective kernels with the Kineto collective args
(``all_to_allv``, split sizes, ``Seq``), ``gpu_memcpy`` with ``bytes``; ``ac2g`` flows ``s``/``f``.
A filler unit = ``python_function`` (some names UTF-8) > ``cpu_op`` (Input Dims, Concrete Inputs)
> ``cudaLaunchKernel`` + ``s`` flow, GPU ``kernel`` + ``f`` flow; every 4th unit adds a ``[memory]``
instant with ``args.Bytes``; every 8th a ``cudaMemcpyAsync`` + ``gpu_memcpy`` (``args.bytes``).

Time model (same as tests/synth_kineto.py, simplified): per block every rank does the same filler
and gating work; dispatch and combine are synchronous (leave = max(arrival) + transfer_i);
GroupedMatmul time is 4 µs per routed row (2 mm). ``--scenario`` token_skew (default: slow rank's
experts get 3.5x the mean rows), balanced, slow_compute (3x GMM) or slow_link (3x transfer).
Everything is derived from ``--seed``; the same arguments give the same bytes. Nothing is kept in
memory beyond the per-block cross-rank plan (a few ints per rank and block): output is written in
~4 MB chunks. ``--gz`` uses gzip level 1 (speed) with mtime 0.
"""

from __future__ import annotations

import argparse
import gzip
import math
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

BASE_TIME_NS = 1790857026000000000
T0_NS = 5367150393171791
H = 2048  # hidden size in Input Dims
EPR = 4  # experts per rank
TOKENS = 256  # tokens routed per rank per layer
GPUS_PER_HOST = 8
UNIT_NS = 14_000  # one filler unit (python_function > cpu_op > launch)
GATE_NS = 300_000
MM_NS_PER_ROW = 2_000
XFER_BASE_NS = 40_000
XFER_NS_PER_ROW = 250
CHUNK = 4 << 20
SCENARIOS = ("token_skew", "balanced", "slow_compute", "slow_link")

_PY_NAMES = (
    "torch/nn/modules/linear.py(125): forward",
    "model/attention.py(211): forward",
    "模型/moe_layer.py(88): forward",  # UTF-8 file names do occur in real traces
    "model/rms_norm.py(40): forward",
    "ünïcode_helpers/route.py(12): top_k",
    "torch/nn/modules/module.py(1750): _call_impl",
)
_OPS = (
    (
        "aten::linear",
        '"Concrete Inputs": ["", "", ""], "Input type": ["c10::BFloat16", "c10::BFloat16", ""], '
        f'"Input Strides": [[{H}, 1], [{H}, 1], []], "Input Dims": [[256, {H}], [{H}, {H}], []]',
    ),
    (
        "aten::add",
        '"Concrete Inputs": ["", "", "1"], "Input type": ["c10::BFloat16", "c10::BFloat16", "Scalar"], '
        f'"Input Strides": [[{H}, 1], [{H}, 1], []], "Input Dims": [[256, {H}], [256, {H}], []]',
    ),
    (
        "aten::silu",
        '"Concrete Inputs": [""], "Input type": ["c10::BFloat16"], '
        f'"Input Strides": [[{H}, 1]], "Input Dims": [[256, {H}]]',
    ),
    (
        "aten::_rms_norm",
        '"Concrete Inputs": ["", "[2048]", "", "1e-06"], '
        '"Input type": ["c10::BFloat16", "ScalarList", "c10::BFloat16", "Scalar"], '
        f'"Input Strides": [[{H}, 1], [], [1], []], "Input Dims": [[256, {H}], [], [{H}], []]',
    ),
)
_KERNELS = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"
    "_execute_segment_k_off_kernel__5x_cublas",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
    "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
)


def _t(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def _split(xs) -> str:
    return "[" + ", ".join(str(x) for x in xs) + "]"


# ----------------------------------------------------------------------------------------------
# cross-rank plan


def plan(world: int, blocks: int, units: int, scenario: str, slow: int, seed: int):
    """Per block: rows[r][e], splits, and per rank the key times (ns) of the block."""
    rng = random.Random(seed)
    E = world * EPR
    w = [1.0] * E
    if scenario == "token_skew" and world > 1:
        hot = min(3.5 / world, 0.9)
        w = [(hot / EPR) if e // EPR == slow else ((1 - hot) / (E - EPR)) for e in range(E)]
    t = [T0_NS + 300_000 + rng.randrange(0, 300_000) for _ in range(world)]
    out = []
    fill = units * UNIT_NS
    for _b in range(blocks):
        cnt = []
        for _src in range(world):
            ww = [x * rng.uniform(0.9, 1.1) for x in w]
            tot = sum(ww)
            q = [TOKENS * x / tot for x in ww]
            c = [int(x) for x in q]
            for e in sorted(range(E), key=lambda e: (-(q[e] - c[e]), e))[: TOKENS - sum(c)]:
                c[e] += 1
            cnt.append(c)
        send = [[sum(cnt[r][d * EPR : (d + 1) * EPR]) for d in range(world)] for r in range(world)]
        recv = [[send[s][r] for s in range(world)] for r in range(world)]
        rows = [[sum(cnt[s][r * EPR + e] for s in range(world)) for e in range(EPR)] for r in range(world)]

        def xfer(r):
            remote = sum(send[r]) - send[r][r] + sum(recv[r]) - recv[r][r]  # noqa: B023 (called in this iteration)
            ns = XFER_BASE_NS + XFER_NS_PER_ROW * remote
            return int(ns * (3 if scenario == "slow_link" and r == slow else 1) * rng.uniform(0.97, 1.03))

        start = [x + 5_000 for x in t]
        arr_d = [start[r] + 5_000 + fill + int(GATE_NS * rng.uniform(0.98, 1.02)) + 40_000 for r in range(world)]
        m = max(arr_d)
        leave_d = [m + xfer(r) + rng.randrange(0, 2000) for r in range(world)]
        gmm_end = []
        for r in range(world):
            f = 3.0 if scenario == "slow_compute" and r == slow else 1.0
            g = 20_000 + sum(
                2 * int(MM_NS_PER_ROW * n * f * rng.uniform(0.98, 1.02)) + 12_000 for n in rows[r] if n > 0
            )
            gmm_end.append(leave_d[r] + 15_000 + g)
        arr_c = [x + 40_000 for x in gmm_end]
        m = max(arr_c)
        leave_c = [m + xfer(r) + rng.randrange(0, 2000) for r in range(world)]
        end = [x + 20_000 for x in leave_c]
        out.append((rows, send, recv, start, arr_d, leave_d, gmm_end, arr_c, leave_c, end))
        t = end
    return out


# ----------------------------------------------------------------------------------------------
# event text (libkineto output_json.cpp templates)


def _x(cat, name, pid, tid, ts, dur, args):
    return (
        f'\n  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {pid}, "tid": {tid},\n'
        f'    "ts": {ts // 1000}.{ts % 1000:03d}, "dur": {dur // 1000}.{dur % 1000:03d},\n'
        f'    "args": {{\n      {args}\n    }}\n  }},'
    )


def _flow(ph, fid, pid, tid, ts):
    bp = ', "bp": "e"' if ph == "f" else ""
    return (
        f'\n  {{\n    "ph": "{ph}", "id": {fid}, "pid": {pid}, "tid": {tid}, "ts": {ts // 1000}.{ts % 1000:03d},\n'
        f'    "cat": "ac2g", "name": "ac2g"{bp}\n  }},'
    )


_KDUR = tuple(_t(4_000 + k * 300) for k in range(7))
_KARGS = (
    '"registers per thread": {reg}, "shared memory": {smem}, "blocks per SM": {bps}, '
    '"warps per SM": {wps}, "grid": [{g}, 1, 1], "block": [{blk}, 1, 1], "est. achieved occupancy %": {occ}'
)


class RankWriter:
    def __init__(self, rank: int, world: int, seed: int, scenario: str, clock_off_ns: int = 0, layers: int = 16):
        self.rank, self.world, self.layers, self.seed = rank, world, layers, seed
        self.pid = 40_000 + rank
        self.tid = self.pid
        self.dev = rank % GPUS_PER_HOST
        self.off = clock_off_ns
        self.rng = random.Random(seed * 1_000_003 + rank)
        self.ext = 0
        self.evidx = 0
        self.corr = 100_000
        self.pyid = 0
        self.seq = 0
        self.scenario = scenario
        self.addr = 139_926_520_725_504 + rank * (1 << 32)
        r = self.rng
        # a pool of realistic launch configs, picked round-robin (no rng call per event: speed)
        self.kargs = [
            _KARGS.format(
                reg=r.choice((32, 64, 96, 128)),
                smem=r.choice((0, 16384, 49152)),
                bps=round(r.uniform(0.1, 8), 6),
                wps=round(r.uniform(1, 64), 6),
                g=r.choice((8, 132, 264, 1024)),
                blk=r.choice((128, 256, 512)),
                occ=r.randrange(0, 100),
            )
            for _ in range(61)
        ]
        self.alloc = 5_435_638_784

    # ids
    def _ext(self):
        self.ext += 1
        return self.ext

    def _ev(self):
        self.evidx += 1
        return self.evidx - 1

    def header(self, trace_id: str) -> str:
        R = self.world
        dev = ",\n    ".join(
            f'{{\n      "id": {d}, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912,\n'
            f'      "computeMajor": 9, "computeMinor": 0,\n'
            f'      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,\n'
            f'      "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,\n'
            f'      "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 233472,\n'
            f'      "numSms": 132, "sharedMemPerBlockOptin": 232448\n    }}'
            for d in range(min(R, GPUS_PER_HOST))
        )
        dist = (
            f'{{"backend": "nccl", "rank": {self.rank}, "world_size": {R}, "pg_count": 1, '
            f'"pg_config": [{{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", '
            f'"pg_size": {R}, "ranks": {_split(range(R))}}}], "nccl_version": "2.21.5"}}'
        )
        ts = T0_NS + self.off
        pid, d = self.pid, self.dev
        meta = [
            ("process_name", pid, 0, '"name": "python3.11"'),
            ("process_labels", pid, 0, '"labels": "CPU"'),
            ("process_sort_index", pid, 0, f'"sort_index": {pid}'),
            ("thread_name", pid, pid, f'"name": "thread {pid} (python3.11)"'),
            ("thread_sort_index", pid, pid, f'"sort_index": {pid}'),
            ("process_name", d, 0, '"name": "python3.11"'),
            ("process_labels", d, 0, f'"labels": "GPU {d}"'),
            ("process_sort_index", d, 0, f'"sort_index": {16777216 + d}'),
        ]
        for st in (7, 20):
            meta.append(("thread_name", d, st, f'"name": "stream {st} "'))
            meta.append(("thread_sort_index", d, st, f'"sort_index": {st}'))
        m = "".join(
            f'\n  {{\n    "name": "{n}", "ph": "M", "ts": {_t(ts)}, "pid": {p}, "tid": {tid},\n'
            f'    "args": {{\n      {a}\n    }}\n  }},'
            for n, p, tid, a in meta
        )
        return (
            f'\n  {{\n    "schemaVersion": 1,\n    "deviceProperties": [\n    {dev}\n    ],\n'
            f'      "distributedInfo": {dist},\n      "record_shapes": 1,\n      "with_stack": 1,\n'
            f'      "profile_memory": 1,\n      "trace_id": "{trace_id}",\n'
            f'  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": {BASE_TIME_NS},\n'
            f'  "traceEvents": [{m}'
        )

    def trailer(self, span_start: int, span_end: int, path_name: str) -> str:
        off = self.off
        s, e = span_start + off, span_end + off
        return (
            f'\n  {{\n    "ph": "X", "cat": "Trace", "ts": {_t(s)}, "dur": {_t(e - s)},\n'
            f'    "pid": "Spans", "tid": "PyTorch Profiler",\n    "name": "PyTorch Profiler (0)",\n'
            f'    "args": {{\n      "Op count": 0\n    }}\n  }},'
            f'\n  {{\n    "name": "process_sort_index", "ph": "M", "ts": {_t(s)},\n'
            f'    "pid": "Spans", "tid": 0,\n    "args": {{\n      "sort_index": 536870912\n    }}\n  }},'
            f'\n  {{\n    "name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",\n'
            f'    "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": {_t(s)}\n  }},'
            f'\n  {{\n    "name": "Record Window End", "ph": "i", "s": "g",\n'
            f'    "pid": "", "tid": "", "ts": {_t(e + 1_000_000)}\n  }}\n  ],'
            f'\n  "traceName": "{path_name}"\n}}\n'
        )

    # pieces ------------------------------------------------------------------------------------
    def launch(
        self, ts: int, ext: int, kname: str, kts: int, kdur: int, stream: int, kextra: str = ""
    ) -> tuple[str, str]:
        """cudaLaunchKernel (CPU) + kernel (GPU) + ac2g flows. Returns (cpu_text, gpu_text)."""
        c = self.corr
        self.corr += 1
        pid, dev = self.pid, self.dev
        cpu = _x(
            "cuda_runtime",
            "cudaLaunchKernel",
            pid,
            self.tid,
            ts,
            4_100,
            f'"External id": {ext},\n      "cbid": 211, "correlation": {c}',
        ) + _flow("s", c, pid, self.tid, ts)
        kargs = self.kargs[c % 61]
        gpu = _x(
            "kernel",
            kname,
            dev,
            stream,
            kts,
            kdur,
            f'"External id": {ext},\n      "queued": 0, "device": {dev}, "context": 1,\n'
            f'      "stream": {stream}, "correlation": {c},\n      {kargs}{kextra}',
        ) + _flow("f", c, dev, stream, kts)
        return cpu, gpu

    def unit(self, i: int, t: int) -> tuple[str, str]:
        """One filler unit starting at t (UNIT_NS long), as one fused template (the hot path).

        python_function [t, t+12 µs] > cpu_op [t+1, t+11] > cudaLaunchKernel [t+3, t+7.1] + s flow;
        GPU kernel at t+9 (+ f flow); every 4th unit a [memory] instant at t+8; every 8th a
        cudaMemcpyAsync [t+9, t+10.5] + gpu_memcpy at t+15.
        """
        pid = self.pid
        us, fr = divmod(t, 1000)
        f = f".{fr:03d}"
        self.pyid += 1
        pyid = self.pyid
        ev = self.evidx
        ext = self.ext + 1
        self.ext = ext
        c = self.corr
        self.corr = c + 1
        name, args = _OPS[i % 4]
        dev = self.dev
        cpu = (
            f'\n  {{\n    "ph": "X", "cat": "python_function", "name": "{_PY_NAMES[i % 6]}", "pid": {pid}, '
            f'"tid": {pid},\n    "ts": {us}{f}, "dur": 12.000,\n    "args": {{\n      "Python parent id": '
            f'{pyid - 1}, "Python id": {pyid}, "Ev Idx": {ev}\n    }}\n  }},'
            f'\n  {{\n    "ph": "X", "cat": "cpu_op", "name": "{name}", "pid": {pid}, "tid": {pid},\n'
            f'    "ts": {us + 1}{f}, "dur": 10.000,\n    "args": {{\n      "External id": {ext},'
            f'"Sequence number": {ext}, "Fwd thread id": 0, "Record function id": 0, {args}, '
            f'"Ev Idx": {ev + 1}\n    }}\n  }},'
            f'\n  {{\n    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {pid}, '
            f'"tid": {pid},\n    "ts": {us + 3}{f}, "dur": 4.100,\n    "args": {{\n      "External id": '
            f'{ext},\n      "cbid": 211, "correlation": {c}\n    }}\n  }},'
            f'\n  {{\n    "ph": "s", "id": {c}, "pid": {pid}, "tid": {pid}, "ts": {us + 3}{f},\n'
            f'    "cat": "ac2g", "name": "ac2g"\n  }},'
        )
        gpu = (
            f'\n  {{\n    "ph": "X", "cat": "kernel", "name": "{_KERNELS[i % 3]}", "pid": {dev}, "tid": 7,\n'
            f'    "ts": {us + 9}{f}, "dur": {_KDUR[i % 7]},\n    "args": {{\n      "External id": {ext},\n'
            f'      "queued": 0, "device": {dev}, "context": 1,\n      "stream": 7, "correlation": {c},\n'
            f"      {self.kargs[c % 61]}\n    }}\n  }},"
            f'\n  {{\n    "ph": "f", "id": {c}, "pid": {dev}, "tid": 7, "ts": {us + 9}{f},\n'
            f'    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  }},'
        )
        ev += 2
        if i % 4 == 0:
            b = 512 * (1 + (i % 64))
            self.alloc += b if (i // 4) % 2 == 0 else -b
            cpu += (
                f'\n  {{\n    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",\n'
                f'    "pid": {pid}, "tid": {pid},\n    "ts": {us + 8}{f},\n    "args": {{\n'
                f'      "Total Reserved": 12782141440, "Total Allocated": {self.alloc}, "Bytes": {b}, '
                f'"Addr": {self.addr + i * 4096}, "Device Id": {dev}, "Device Type": 1, '
                f'"Ev Idx": {ev}\n    }}\n  }},'
            )
            ev += 1
            if i % 8 == 0:
                c2 = self.corr
                self.corr = c2 + 1
                nbytes = 4096 * (1 + i % 256)
                cpu += (
                    f'\n  {{\n    "ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": {pid}, '
                    f'"tid": {pid},\n    "ts": {us + 9}{f}, "dur": 1.500,\n    "args": {{\n      "External id": '
                    f'{ext},\n      "cbid": 41, "correlation": {c2}\n    }}\n  }},'
                    f'\n  {{\n    "ph": "s", "id": {c2}, "pid": {pid}, "tid": {pid}, "ts": {us + 9}{f},\n'
                    f'    "cat": "ac2g", "name": "ac2g"\n  }},'
                )
                gpu += (
                    f'\n  {{\n    "ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", '
                    f'"pid": {dev}, "tid": 7,\n    "ts": {us + 15}{f}, "dur": 1.200,\n    "args": {{\n'
                    f'      "External id": {ext},\n      "device": {dev}, "context": 1,\n      "stream": 7, '
                    f'"correlation": {c2},\n      "bytes": {nbytes}, "memory bandwidth (GB/s)": '
                    f"{nbytes / 1200:.4f}\n    }}\n  }},"
                    f'\n  {{\n    "ph": "f", "id": {c2}, "pid": {dev}, "tid": 7, "ts": {us + 15}{f},\n'
                    f'    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  }},'
                )
        self.evidx = ev
        return cpu, gpu

    def ua(self, name: str, ts: int, dur: int) -> str:
        return _x(
            "user_annotation",
            name,
            self.pid,
            self.tid,
            ts,
            dur,
            f'"External id": {self._ext()},"Record function id": 0, "Ev Idx": {self._ev()}',
        )

    def mm(self, ts: int, dur: int, rows: int, n_cols: int) -> tuple[str, str]:
        ext = self._ext()
        cpu = _x(
            "cpu_op",
            "aten::mm",
            self.pid,
            self.tid,
            ts,
            dur,
            f'"External id": {ext},"Sequence number": {ext}, "Fwd thread id": 0, "Record function id": 0, '
            f'"Concrete Inputs": ["", ""], "Input type": ["c10::BFloat16", "c10::BFloat16"], '
            f'"Input Strides": [[{H}, 1], [{n_cols}, 1]], "Input Dims": [[{rows}, {H}], [{H}, {n_cols}]], '
            f'"Ev Idx": {self._ev()}',
        )
        c2, g = self.launch(ts + 1_000, ext, _KERNELS[1], ts + 6_000, max(dur - 7_000, 1_000), 7)
        return cpu + c2, g

    def collective(self, ts: int, arrive: int, leave: int, send, recv) -> tuple[str, str]:
        """alltoall_base_ > record_param_comms > nccl:all_to_all > launch; then stream sync."""
        pid, tid, R = self.pid, self.tid, self.world
        self.seq += 1
        in_s, out_s = _split(send), _split(recv)
        in_n, out_n = sum(send) * H, sum(recv) * H
        ranks = _split(range(R))
        launch_ts = arrive - 6_000
        base_end = arrive + 3_000
        e1 = self._ext()
        s = _x(
            "cpu_op",
            "c10d::alltoall_base_",
            pid,
            tid,
            ts,
            base_end - ts,
            f'"External id": {e1},"Sequence number": {e1}, "Fwd thread id": 0, "Record function id": 0, '
            f'"Concrete Inputs": ["", "", "", "{out_s}", "{in_s}", "False", "-1"], '
            f'"Input type": ["c10::BFloat16", "c10::BFloat16", "", "ScalarList", "ScalarList", "Scalar", "Scalar"], '
            f'"Input Strides": [[{H}, 1], [{H}, 1], [], [], [], [], []], '
            f'"Input Dims": [[{sum(recv)}, {H}], [{sum(send)}, {H}], [], [], [], [], []], "Ev Idx": {self._ev()}',
        )
        e2 = self._ext()
        # a 62-bit hash (> 2**53, exact only as an integer), equal on every rank for the same Seq
        comms_id = ((self.seq * 0x9E3779B97F4A7C15 + self.seed * 0xBF58476D1CE4E5B9) & ((1 << 62) - 1)) | (1 << 61)
        coll = (
            f'"Collective name": "all_to_allv", "dtype": "BFloat16", "In msg nelems": {in_n}, '
            f'"Out msg nelems": {out_n}, "Group size": {R}, "In split size": "{in_s}", '
            f'"Out split size": "{out_s}", "Process Group Name": "0", '
            f'"Process Group Description": "default_pg", "Process Group Ranks": "{ranks}"'
        )
        s += _x(
            "cpu_op",
            "record_param_comms",
            pid,
            tid,
            ts + 2_000,
            base_end - ts - 3_000,
            f'"External id": {e2},"Record function id": 0, {coll}, "Global rank start": 0, '
            f'"Global rank stride": 1, "Rank": {self.rank}, "Seq": {self.seq}, "Comms Id": {comms_id}, '
            f'"Ev Idx": {self._ev()}',
        )
        s += _x(
            "user_annotation",
            "nccl:all_to_all",
            pid,
            tid,
            ts + 3_000,
            base_end - ts - 5_000,
            f'"External id": {self._ext()},"Record function id": 0, "Ev Idx": {self._ev()}',
        )
        cpu, gpu = self.launch(
            launch_ts,
            e2,
            "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
            arrive,
            leave - arrive,
            20,
            f', {coll}, "Seq": {self.seq}',
        )
        c = self.corr
        self.corr += 1
        sync = _x(
            "cuda_runtime",
            "cudaStreamSynchronize",
            pid,
            tid,
            base_end + 1_000,
            leave + 4_000 - base_end - 1_000,
            f'"cbid": 131, "correlation": {c}',
        )
        return s + cpu + sync, gpu

    def block(self, b: int, blk, units: int, step_info) -> str:
        rows, send, recv, start, arr_d, leave_d, gmm_end, arr_c, leave_c, end = blk
        r, off = self.rank, self.off
        s0, a_d, l_d, g_e, a_c, l_c, e0 = (x[r] + off for x in (start, arr_d, leave_d, gmm_end, arr_c, leave_c, end))
        cpu = []
        gpu = []
        if step_info is not None:
            step, st_start, st_end = step_info
            cpu.append(self.ua(f"decode_step_{step}", st_start + off - 2_000, st_end - st_start + 4_000))
        layer = b % self.layers
        cpu.append(self.ua(f"moe_layer_{layer}", s0, e0 - s0 - 1_000))
        t = s0 + 5_000
        for i in range(units):
            c, g = self.unit(i, t)
            cpu.append(c)
            gpu.append(g)
            t += UNIT_NS
        gate_end = a_d - 40_000
        cpu.append(self.ua("MoeGatingTopK", t, gate_end - t))
        c, g = self.mm(t + 5_000, gate_end - t - 10_000, TOKENS, self.world * EPR)
        cpu.append(c)
        gpu.append(g)
        cpu.append(self.ua("MoeDistributeDispatch", gate_end + 10_000, l_d + 8_000 - gate_end - 10_000))
        c, g = self.collective(gate_end + 15_000, a_d, l_d, send[r], recv[r])
        cpu.append(c)
        gpu.append(g)
        gs = l_d + 15_000
        cpu.append(self.ua("GroupedMatmul", gs, g_e - gs))
        t = gs + 10_000
        active = [n for n in rows[r] if n > 0]
        span = g_e - 10_000 - t
        per = span // max(2 * len(active), 1)
        for n in active:
            for _ in range(2):
                c, g = self.mm(t, per - 2_000, n, H)
                cpu.append(c)
                gpu.append(g)
                t += per
        cs = g_e + 10_000
        cpu.append(self.ua("MoeDistributeCombine", cs, l_c + 8_000 - cs))
        c, g = self.collective(cs + 5_000, a_c, l_c, recv[r], send[r])
        cpu.append(c)
        gpu.append(g)
        return "".join(cpu) + "".join(gpu)


def _count_events(text: str) -> int:
    return text.count('"ph": ')


def generate_rank(
    path: Path,
    rank: int,
    world: int,
    *,
    blocks: int,
    layers: int,
    units: int,
    scenario: str,
    slow: int,
    seed: int,
    gz: bool,
    clock_off_us: float = 0.0,
    the_plan=None,
) -> tuple[int, int]:
    """Stream one rank's trace to path. Returns (bytes written uncompressed, events)."""
    pl = the_plan if the_plan is not None else plan(world, blocks, units, scenario, slow, seed)
    w = RankWriter(rank, world, seed, scenario, int(round(clock_off_us * 1000)), layers)
    rng = random.Random(seed * 7 + rank)
    trace_id = f"{rng.getrandbits(128):032X}"
    raw = open(path, "wb")
    fh = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=1) if gz else raw
    total = 0
    events = 0
    try:
        head = w.header(trace_id)
        buf = [head]
        size = len(head)
        for b in range(blocks):
            step_info = None
            if b % layers == 0:
                last = min(b + layers, blocks) - 1
                step_info = (b // layers, pl[b][3][rank], pl[last][9][rank])
            txt = w.block(b, pl[b], units, step_info)
            buf.append(txt)
            size += len(txt)
            if size >= CHUNK:
                data = "".join(buf).encode()
                events += _count_events_bytes(data)
                fh.write(data)
                total += len(data)
                buf, size = [], 0
        span_start = T0_NS + 100_000
        span_end = pl[-1][9][rank] + 50_000
        tail = w.trailer(span_start, span_end, path.name.removesuffix(".gz"))
        # every event text ends with "," ; the trailer's last event (Record Window End) does not
        data = "".join(buf).encode()
        events += _count_events_bytes(data)
        fh.write(data)
        total += len(data)
        t = tail.encode()
        events += _count_events_bytes(t)
        fh.write(t)
        total += len(t)
    finally:
        if gz:
            fh.close()
        raw.close()
    return total, events


def _count_events_bytes(b: bytes) -> int:
    return b.count(b'"ph": ')


def _sample_block(world: int, units: int, scenario: str, slow: int, seed: int) -> tuple[int, int]:
    """(bytes, events) of one typical block, to size the run."""
    pl = plan(world, 1, units, scenario, slow, seed)
    w = RankWriter(0, world, seed, scenario)
    txt = w.block(0, pl[0], units, (0, pl[0][3][0], pl[0][9][0]))
    return len(txt.encode()), _count_events(txt)


def _job(args):
    return generate_rank(**args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, help="single output file (one rank of --world)")
    ap.add_argument("--mb", type=float, help="target uncompressed size in MB (10**6 bytes) for --out")
    ap.add_argument("--out-dir", type=Path, help="directory for rank{r}.pt.trace.json[.gz]")
    ap.add_argument("--ranks", type=int, help="number of rank files to write into --out-dir")
    ap.add_argument("--events-per-rank", type=int, default=100_000)
    ap.add_argument("--world", type=int, default=8, help="world size for --out (default 8)")
    ap.add_argument("--rank", type=int, default=0, help="which rank --out holds (default 0)")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--units", type=int, default=120, help="filler units per (step, layer) block")
    ap.add_argument("--scenario", choices=SCENARIOS, default="token_skew")
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument(
        "--clock-offset",
        action="append",
        default=[],
        metavar="RANK=US",
        help="add US µs to every ts of RANK (repeatable)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gz", action="store_true", help="gzip (level 1) and add .gz to names")
    ap.add_argument("--jobs", type=int, default=1, help="processes for --out-dir mode")
    a = ap.parse_args(argv)
    offsets = {}
    for item in a.clock_offset:
        k, _, v = item.partition("=")
        offsets[int(k)] = float(v)
    t0 = time.perf_counter()
    c0 = time.process_time()
    if a.out is not None:
        if a.mb is None:
            ap.error("--out needs --mb")
        world = a.world
        if not 0 <= a.rank < world or not 0 <= a.slow_rank < world:
            ap.error("--rank and --slow-rank must be < --world")
        bb, _ = _sample_block(world, a.units, a.scenario, a.slow_rank, a.seed)
        blocks = max(1, math.ceil(a.mb * 1e6 / bb))
        out = a.out
        if a.gz and not out.name.endswith(".gz"):
            out = out.with_name(out.name + ".gz")
        out.parent.mkdir(parents=True, exist_ok=True)
        n, ev = generate_rank(
            out,
            a.rank,
            world,
            blocks=blocks,
            layers=a.layers,
            units=a.units,
            scenario=a.scenario,
            slow=a.slow_rank,
            seed=a.seed,
            gz=a.gz,
            clock_off_us=offsets.get(a.rank, 0.0),
        )
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        print(
            f"{out}: {n / 1e6:.1f} MB uncompressed, {ev} events, {n / ev:.0f} B/event, "
            f"{dt:.1f} s wall ({n / 1e6 / dt:.0f} MB/s), {dc:.1f} s CPU ({n / 1e6 / dc:.0f} MB/s)",
            file=sys.stderr,
        )
        return 0
    if a.out_dir is None or a.ranks is None:
        ap.error("give either --out FILE --mb N, or --ranks N --out-dir DIR")
    world = a.ranks
    if not 0 <= a.slow_rank < world:
        ap.error("--slow-rank must be < --ranks")
    _, be = _sample_block(world, a.units, a.scenario, a.slow_rank, a.seed)
    blocks = max(1, round(a.events_per_rank / be))
    a.out_dir.mkdir(parents=True, exist_ok=True)
    jobs = []
    for r in range(world):
        p = a.out_dir / (f"rank{r}.pt.trace.json" + (".gz" if a.gz else ""))
        jobs.append(
            dict(
                path=p,
                rank=r,
                world=world,
                blocks=blocks,
                layers=a.layers,
                units=a.units,
                scenario=a.scenario,
                slow=a.slow_rank,
                seed=a.seed,
                gz=a.gz,
                clock_off_us=offsets.get(r, 0.0),
            )
        )
    total = events = 0
    if a.jobs > 1:
        with ProcessPoolExecutor(max_workers=a.jobs) as ex:
            for n, ev in ex.map(_job, jobs):
                total += n
                events += ev
    else:
        pl = plan(world, blocks, a.units, a.scenario, a.slow_rank, a.seed)
        for j in jobs:
            n, ev = generate_rank(**j, the_plan=pl)
            total += n
            events += ev
    dt = time.perf_counter() - t0
    print(
        f"{a.out_dir}: {world} ranks, {total / 1e6:.1f} MB uncompressed, {events} events "
        f"({events // world} per rank), {dt:.1f} s wall, {total / 1e6 / dt:.0f} MB/s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
