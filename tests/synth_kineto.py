"""Deterministic synthetic multi-rank Kineto (PyTorch profiler) traces of a MoE EP decode loop.

The layout imitates the real 4-rank run in ``../shared/realdata/kineto_cpu_ep4_hot1``
(torch.profiler 2.13, CPU + gloo): the same top-level key order, the same one-key-per-line
event layout, ``ts``/``dur`` in µs with exactly 3 decimals relative to ``baseTimeNanoseconds``,
the same metadata events, the same region nesting and the same op arguments.

Region nesting on the main (python) thread of every rank, per decode step ``s`` and MoE layer ``l``::

    decode_step_<s>                               user_annotation
      moe_layer_<l>                               user_annotation
        [filler cpu_ops, only with events_per_rank]
        MoeGatingTopK                             user_annotation
          aten::matmul > aten::mm                 Input Dims [[T, H], [H, E]]
          aten::add, aten::argmax, aten::floor_divide, aten::argsort > aten::sort, aten::bincount
        aten::empty_like
        MoeDistributeDispatch                     user_annotation
          c10d::alltoall_base_                    token-count exchange, Concrete Inputs[3]/[4] = "[]"
          aten::sum, aten::item > aten::_local_scalar_dense, aten::empty, aten::index
          c10d::alltoall_base_                    the token exchange; Concrete Inputs[3] = output
                                                  split sizes (rows received from each rank),
                                                  [4] = input split sizes (rows sent to each rank)
        GroupedMatmul                             user_annotation
          aten::empty_like
          per local expert with rows > 0:
            aten::index, aten::select, aten::matmul > aten::mm, aten::relu,
            aten::matmul > aten::mm, aten::index_put_      (mm Input Dims [[rows, H], [H, H]])
        MoeDistributeCombine                      user_annotation
          aten::empty, c10d::alltoall_base_       splits mirrored from the dispatch
        aten::index_put_

``style="gloo"``: each ``c10d::alltoall_base_`` is a short launch; the collective itself is a
``gloo:all_to_all`` user_annotation on one of two ``pt_gloo_runloop`` threads (even collective
index -> thread A, odd -> thread B, as in the real run); the main thread has no event while it
waits. ``style="nccl"``: each ``c10d::alltoall_base_`` contains ``record_param_comms`` (collective
args) > ``nccl:all_to_all`` > ``cudaLaunchKernel``; the collective is the GPU ``kernel``
``ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)`` on pid = device (rank % 8), tid =
stream 20, carrying the Kineto collective args; the CPU then blocks in ``cudaStreamSynchronize``
until the kernel ends. Every ``aten::mm`` also gets a ``cudaLaunchKernel`` child and a GEMM
``kernel`` on stream 7 inside the mm's time (compute is modelled as synchronous). Launches and
kernels are joined by ``ac2g`` flows (``s`` on the CPU, ``f`` with ``bp: "e"`` on the GPU).

Time model (integer nanoseconds internally; one true clock shared by all ranks):

- per layer: gating (1.2 µs per token), dispatch, GroupedMatmul (``aten::mm`` = 2 µs per row per mm,
  so GroupedMatmul time is proportional to the rows its experts received), combine;
- a collective is synchronous: rank i ARRIVES (its ``gloo:all_to_all`` / NCCL kernel starts) when
  its preceding compute (and the launch) is done; every rank LEAVES at
  ``max(arrival) + transfer_i + U(0, 2 µs)``, so a rank's collective duration = its wait
  (max(arrival) - its arrival) + its own transfer: the last arriver's is the shortest unless its
  transfer is much longer, fast ranks' include their wait. The dispatch holds two sync points
  (count exchange, then token exchange), the combine one: 3 collectives per layer. ``transfer_i`` = 40 µs + 0.25 µs per remote row
  sent or received by rank i (25 µs for the count exchange);
- routing: every rank routes ``tokens_per_rank`` tokens (top-1) over ``ranks*experts_per_rank``
  experts by a weight vector (each weight jittered ±10% per step, layer and source rank; counts by
  largest remainder), which fixes the dispatch/combine split sizes and the GroupedMatmul rows;
- durations get a small jitter (compute ±2%, transfer ±3%) plus ``±noise`` (uniform, relative);
- ``clock_offsets_us={rank: µs}`` is added to every ``ts`` of that rank at write time only.

All randomness comes from one ``random.Random(seed)``; same arguments -> byte-identical files
(gzip is written with mtime 0 and no file name).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import random
import zlib
from pathlib import Path

__all__ = [
    "SCENARIOS",
    "HIDDEN",
    "BASE_TIME_NS",
    "MM_NS_PER_ROW",
    "HEADER_VARIANTS",
    "VARIANT_PH_COUNTS",
    "VARIANT_RANK",
    "VARIANT_WORLD",
    "VARIANT_FIRST_X_NS",
    "VARIANT_NAMES",
    "FILLER_NAMES",
    "spike_position",
    "ep_event_counts",
    "write_ep_run",
    "write_kineto_header_variants",
    "trace_text",
    "cut_trace",
]

SCENARIOS: dict[str, str] = {
    "balanced": "even routing, equal compute and links: no anomaly.",
    "token_skew": (
        "routing biased to slow_rank's experts: that rank's GroupedMatmul sees ~3.5x the mean rows "
        "(share min(3.5/ranks, 0.9) of every rank's tokens), it arrives last at every combine and "
        "has the shortest combine collectives; the others wait."
    ),
    "slow_compute": (
        "even routing, but slow_rank's GroupedMatmul ops (mm, index, relu, ...) take 3x longer for "
        "the same rows: same token load, slow device."
    ),
    "slow_link": (
        "even routing and compute, but slow_rank's own transfer is 3x longer in every collective "
        "(dispatch, combine and the count exchange): its compute is normal and it leaves every "
        "collective late (end_i = max(arrival) + transfer_i, transfer_slow = 3x). The late leave carries "
        "into its next arrival (it is the last arriver without extra compute), so its collectives last "
        "about its own 3x transfer while the others' last wait + 1x transfer: about equal durations, "
        "unlike slow_compute/token_skew where the slow rank's are far shorter."
    ),
    "noisy": (
        "balanced routing; every collective transfer is jittered +-40% and every compute op +-10%, "
        "independently per event on every rank: no persistent anomaly."
    ),
    "spike": (
        "balanced, except slow_rank's GroupedMatmul is 5x slower in exactly one (step, layer): "
        "step = steps // 2, layer = layers // 2 (see spike_position())."
    ),
}

HIDDEN = 256  # hidden size in every Input Dims
BASE_TIME_NS = 1790857026000000000  # baseTimeNanoseconds of the real run (shared by all ranks)
T0_NS = 5367150393171791  # relative ns of the profiler start, as in the real run
PID0 = 15068  # rank r runs in OS pid PID0 + r
MM_NS_PER_ROW = 2000  # 2 µs per token-row per aten::mm
GATE_NS_PER_TOKEN = 1200
XFER_BASE_NS = 40_000
XFER_NS_PER_ROW = 250
COUNT_XFER_NS = 25_000
FILLER_DUR_NS = 800
FILLER_GAP_NS = 400
EXT_BLOCK = 512  # External ids are handed out per thread in blocks of 512
GPUS_PER_HOST = 8
NCCL_STREAM = 20
COMPUTE_STREAM = 7
FILLER_NAMES = ("aten::add", "aten::mul", "aten::copy_", "aten::silu", "aten::to", "aten::view")

_RFID = '"Record function id": 0'
_SEQ = '"Sequence number": 0, "Fwd thread id": 0, "Record function id": 0'


def spike_position(steps: int, layers: int) -> tuple[int, int]:
    """(step, layer) whose GroupedMatmul is 5x on slow_rank in the "spike" scenario."""
    return steps // 2, layers // 2


def ep_event_counts(style: str, active_experts: int) -> dict[str, int]:
    """Events one rank writes per (step, layer), given its number of local experts with >= 1 row.

    gloo: main-thread X = 25 + 8a, gloo-thread X = 3 (all ``gloo:all_to_all``).
    nccl: main-thread X = 38 + 10a (incl. cuda_runtime), GPU kernels = 4 + 2a, flows s = f = 4 + 2a.
    Per step add 1 X (``decode_step_<s>``). Per file: gloo 12 M events, nccl 13 M events; both
    1 ``Trace`` X (pid "Spans") and 2 ``i`` events (Iteration Start, Record Window End).
    """
    a = active_experts
    if style == "gloo":
        return {"main_X": 25 + 8 * a, "gloo_X": 3, "kernel_X": 0, "s": 0, "f": 0}
    return {"main_X": 38 + 10 * a, "gloo_X": 0, "kernel_X": 4 + 2 * a, "s": 4 + 2 * a, "f": 4 + 2 * a}


# --------------------------------------------------------------------------------------------
# formatting helpers (string templates: the layout is the real file's, byte for byte)


def _t(ns: int) -> str:
    """µs with exactly 3 decimals from integer ns (Kineto writes {}.{:03})."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def _jl(v) -> str:
    """Compact JSON list with ', ' separators as torch writes Input Dims etc."""
    return json.dumps(v)


def _strides(dims: list) -> list:
    out = []
    for d in dims:
        if not d:
            out.append([])
            continue
        s, acc = [], 1
        for x in reversed(d):
            s.append(acc)
            acc *= max(int(x), 1)
        out.append(list(reversed(s)))
    return out


def _op_args(
    types: list, dims: list, concrete: list | None = None, seq: bool = True, strides: list | None = None
) -> str:
    """The args text between "External id" and "Ev Idx" of a cpu_op, in torch's key order."""
    if concrete is None:
        concrete = [""] * len(types)
    if strides is None:
        strides = _strides(dims)
    head = _SEQ if seq else _RFID
    return (
        f'{head}, "Concrete Inputs": {_jl(concrete)}, "Input type": {_jl(types)}, '
        f'"Input Strides": {_jl(strides)}, "Input Dims": {_jl(dims)}'
    )


def _split_str(xs: list[int]) -> str:
    return "[" + ", ".join(str(int(x)) for x in xs) + "]"


def _gz_open(path: Path):
    raw = open(path, "wb")
    return raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6)


# --------------------------------------------------------------------------------------------
# simulation


class _Ids:
    """Per-process External id allocator: each thread takes blocks of 512 ids on first need."""

    def __init__(self) -> None:
        self.next_block = 0
        self.cur: dict[str, list[int]] = {}

    def take(self, thread: str) -> int:
        return self.take_many(thread, 1)[0][0]

    def take_many(self, thread: str, n: int) -> list[tuple[int, int]]:
        """n ids for one thread as (first, count) ranges."""
        out: list[tuple[int, int]] = []
        while n > 0:
            c = self.cur.get(thread)
            if c is None or c[0] > c[1]:
                start = self.next_block * EXT_BLOCK + 1
                self.next_block += 1
                c = [start, start + EXT_BLOCK - 1]
                self.cur[thread] = c
            k = min(n, c[1] - c[0] + 1)
            out.append((c[0], k))
            c[0] += k
            n -= k
        return out


class _Rank:
    """One rank's timeline while the run is simulated. Events are lists:

    main/gloo/gpu X: [kind, cat, name, tid, ts_ns, dur_ns, ext_id, args_mid, extra]
      kind "X" (cpu_op / user_annotation: gets Ev Idx), "R" (cuda_runtime), "K" (kernel),
      "s"/"f" flows (args_mid = flow id), "F" filler block (name = count, args_mid = id ranges).
    """

    def __init__(self, rank: int, world: int, style: str, t_ns: int) -> None:
        self.rank = rank
        self.pid = PID0 + rank
        self.tid = self.pid
        base = PID0 + world + 10 + 2 * rank
        self.gloo_tid = {"B": base, "A": base + 1}
        self.device = rank % GPUS_PER_HOST
        self.style = style
        self.t = t_ns
        self.ids = _Ids()
        self.main: list[list] = []
        self.gloo: dict[str, list[list]] = {"A": [], "B": []}
        self.gpu: list[list] = []
        self.stack: list[list] = []
        self.n_coll = 0
        self.corr = 1_000_000 + 3 * rank  # CUPTI correlation ids (process-local counter)
        self.pending: dict | None = None

    # main-thread primitives -----------------------------------------------------------------
    def open(self, cat: str, name: str, args_mid: str, gap: int = 2000) -> list:
        self.t += gap
        ev = ["X", cat, name, self.tid, self.t, 0, self.ids.take("main"), args_mid, None]
        self.main.append(ev)
        self.stack.append(ev)
        return ev

    def close(self, pad: int = 1000) -> list:
        self.t += pad
        ev = self.stack.pop()
        ev[5] = self.t - ev[4]
        return ev

    def leaf(self, name: str, dur: int, args_mid: str, gap: int = 2000, cat: str = "cpu_op") -> list:
        self.t += gap
        ev = ["X", cat, name, self.tid, self.t, dur, self.ids.take("main"), args_mid, None]
        self.main.append(ev)
        self.t += dur
        return ev

    def runtime(self, name: str, dur: int, cbid: int, linked_ext: int, gap: int = 500) -> tuple[int, int, int]:
        """A cuda_runtime event on the main thread (+ ac2g flow start for launches)."""
        self.t += gap
        ts = self.t
        corr = self.corr
        self.corr += 1
        self.main.append(
            ["R", "cuda_runtime", name, self.tid, ts, dur, linked_ext, f'"cbid": {cbid}, "correlation": {corr}', None]
        )
        if name.startswith("cudaLaunch"):
            self.main.append(["s", "ac2g", "ac2g", self.tid, ts, 0, 0, corr, None])
        self.t += dur
        return ts, dur, corr

    def kernel(self, name: str, stream: int, ts: int, dur: int, linked_ext: int, corr: int, args: str) -> None:
        self.gpu.append(
            [
                "K",
                "kernel",
                name,
                stream,
                ts,
                dur,
                linked_ext,
                f'"queued": 0, "device": {self.device}, "context": 1, "stream": {stream}, '
                f'"correlation": {corr}, {args}',
                None,
            ]
        )
        self.gpu.append(["f", "ac2g", "ac2g", stream, ts, 0, 0, corr, None])


class _Sim:
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
        style,
        noise,
        seed,
        n_fill,
    ) -> None:
        self.R, self.S, self.L = ranks, steps, layers
        self.epr, self.T = experts_per_rank, tokens_per_rank
        self.E = ranks * experts_per_rank
        self.scenario, self.slow, self.style = scenario, slow_rank, style
        self.noise, self.n_fill = noise, n_fill
        self.rng = random.Random(seed)
        rng = self.rng
        self.trace_ids = [f"{rng.getrandbits(128):032X}" for _ in range(ranks)]
        self.cjit = 0.10 if scenario == "noisy" else 0.02
        self.xjit = 0.40 if scenario == "noisy" else 0.03
        # per-rank profiler start and first-step start differ (processes start at different times)
        self.span_start = [T0_NS + rng.randrange(0, 400_000) for _ in range(ranks)]
        self.meta_ts = [s + rng.randrange(50_000, 100_000) for s in self.span_start]
        self.ranks = [
            _Rank(r, ranks, style, self.span_start[r] + rng.randrange(150_000, 350_000)) for r in range(ranks)
        ]
        # routing weights over the global experts
        w = [1.0] * self.E
        if scenario == "token_skew" and ranks > 1:
            hot = min(3.5 / ranks, 0.9)
            for e in range(self.E):
                on_slow = e // experts_per_rank == slow_rank
                w[e] = (hot / experts_per_rank) if on_slow else ((1 - hot) / (self.E - experts_per_rank))
        self.weights = w
        self.spike = spike_position(steps, layers)

    # jitter ------------------------------------------------------------------------------------
    def cdur(self, ns: float, factor: float = 1.0) -> int:
        rng = self.rng
        v = ns * factor * rng.uniform(1 - self.cjit, 1 + self.cjit)
        if self.noise:
            v *= rng.uniform(1 - self.noise, 1 + self.noise)
        return max(int(v), 50)

    def xdur(self, ns: float) -> int:
        rng = self.rng
        v = ns * rng.uniform(1 - self.xjit, 1 + self.xjit)
        if self.noise:
            v *= rng.uniform(1 - self.noise, 1 + self.noise)
        return max(int(v), 1000)

    def gap(self, lo: int = 1500, hi: int = 4000) -> int:
        return self.rng.randrange(lo, hi)

    # routing -------------------------------------------------------------------------------------
    def route(self) -> list[list[int]]:
        """cnt[src][expert]: tokens of rank src routed to global expert (top-1)."""
        out = []
        for _src in range(self.R):
            w = [x * self.rng.uniform(0.9, 1.1) for x in self.weights]
            tot = sum(w)
            q = [self.T * x / tot for x in w]
            c = [int(math.floor(x)) for x in q]
            rest = self.T - sum(c)
            order = sorted(range(self.E), key=lambda e: (-(q[e] - c[e]), e))
            for e in order[:rest]:
                c[e] += 1
            out.append(c)
        return out

    # one collective: launch on every rank, then resolve arrival/leave -----------------------------
    def launch(self, rk: _Rank, kind: str, out_splits: list[int] | None, in_splits: list[int] | None) -> int:
        """CPU side of a collective; returns the arrival time (collective event start)."""
        R, H = self.R, HIDDEN
        if out_splits is None:  # count exchange: int64[R] -> int64[R], no split lists
            dims = [[R], [R], [], [], [], [], []]
            strides = [[1], [1], [], [], [], [], []]
            types = ["long int", "long int", "", "ScalarList", "ScalarList", "Scalar", "Scalar"]
            concrete = ["", "", "", "[]", "[]", "False", "-1"]
            out_rows = in_rows = R
            coll, dtype, in_n, out_n = "all_to_all", "Long", R, R
            in_s = out_s = "[]"
        else:
            out_rows, in_rows = sum(out_splits), sum(in_splits)
            dims = [[out_rows, H], [in_rows, H], [], [], [], [], []]
            strides = [[H, 1], [H, 1], [], [], [], [], []]
            types = ["float", "float", "", "ScalarList", "ScalarList", "Scalar", "Scalar"]
            concrete = ["", "", "", _split_str(out_splits), _split_str(in_splits), "False", "-1"]
            coll, dtype, in_n, out_n = "all_to_allv", "Float", in_rows * H, out_rows * H
            in_s, out_s = _split_str(in_splits), _split_str(out_splits)
        k = rk.n_coll
        rk.n_coll += 1
        rk.pending = {
            "k": k,
            "kind": kind,
            "in_rows": in_rows,
            "out_rows": out_rows,
            "coll": coll,
            "dtype": dtype,
            "in_n": in_n,
            "out_n": out_n,
            "in_s": in_s,
            "out_s": out_s,
        }
        base_args = _op_args(types, dims, concrete, strides=strides)
        if self.style == "gloo":
            rk.leaf("c10d::alltoall_base_", self.cdur(55_000), base_args, gap=self.gap(20_000, 60_000))
            return rk.t + self.gap(10_000, 25_000)  # the gloo runloop thread picks the work up
        # nccl: alltoall_base_ > record_param_comms > nccl:all_to_all > cudaLaunchKernel
        rk.open("cpu_op", "c10d::alltoall_base_", base_args, gap=self.gap(20_000, 60_000))
        pg_ranks = _split_str(list(range(R)))
        rpc = rk.open(
            "cpu_op",
            "record_param_comms",
            f'{_RFID}, "Collective name": "{coll}", "dtype": "{dtype}", '
            f'"In msg nelems": {in_n}, "Out msg nelems": {out_n}, "Group size": {R}, '
            f'"In split size": "{in_s}", "Out split size": "{out_s}", '
            f'"Global rank start": 0, "Global rank stride": 1, "Process Group Name": "0", '
            f'"Process Group Description": "default_pg", "Process Group Ranks": "{pg_ranks}", '
            f'"Rank": {rk.rank}, "Seq": {k + 1}',
            gap=self.gap(3000, 6000),
        )
        rk.open("user_annotation", "nccl:all_to_all", _RFID, gap=self.gap(1000, 3000))
        ts, dur, corr = rk.runtime("cudaLaunchKernel", self.cdur(6_000), 211, rpc[6], gap=self.gap(2000, 4000))
        rk.pending.update(corr=corr, ext=rpc[6])
        arrival = ts + dur + self.gap(2000, 5000)
        rk.close(self.gap(1000, 2000))
        rk.close(self.gap(1000, 2000))
        rk.close(self.gap(2000, 4000))
        return arrival

    def transfer(self, rk: _Rank, kind: str, out_splits, in_splits) -> int:
        if out_splits is None:
            ns = COUNT_XFER_NS
        else:
            remote = (sum(out_splits) - out_splits[rk.rank]) + (sum(in_splits) - in_splits[rk.rank])
            ns = XFER_BASE_NS + XFER_NS_PER_ROW * remote
        if self.scenario == "slow_link" and rk.rank == self.slow:
            ns *= 3
        return self.xdur(ns)

    def finish(self, rk: _Rank, arrival: int, leave: int) -> None:
        p = rk.pending
        if self.style == "gloo":
            th = "A" if p["k"] % 2 == 0 else "B"
            if p["kind"] == "count":
                a = (
                    '"Concrete Inputs": [""], "Input type": ["long int"], "Input Strides": [[1]], '
                    f'"Input Dims": [[{self.R}]]'
                )
            else:
                a = (
                    '"Concrete Inputs": [""], "Input type": ["float"], '
                    f'"Input Strides": [[{HIDDEN}, 1]], "Input Dims": [[{p["in_rows"]}, {HIDDEN}]]'
                )
            rk.gloo[th].append(
                [
                    "X",
                    "user_annotation",
                    "gloo:all_to_all",
                    rk.gloo_tid[th],
                    arrival,
                    leave - arrival,
                    rk.ids.take(th),
                    f"{_RFID}, {a}",
                    None,
                ]
            )
            rk.t = leave + self.gap(5000, 12_000)
            return
        kargs = (
            f'"registers per thread": 96, "shared memory": 0, "blocks per SM": 0.121212, '
            f'"warps per SM": 1.939394, "grid": [16, 1, 1], "block": [512, 1, 1], '
            f'"est. achieved occupancy %": 0, "Collective name": "{p["coll"]}", '
            f'"In msg nelems": {p["in_n"]}, "Out msg nelems": {p["out_n"]}, "Group size": {self.R}, '
            f'"dtype": "{p["dtype"]}", "In split size": "{p["in_s"]}", "Out split size": "{p["out_s"]}", '
            f'"Process Group Name": "0", "Process Group Description": "default_pg", '
            f'"Process Group Ranks": "{_split_str(list(range(self.R)))}", "Seq": {p["k"] + 1}'
        )
        rk.kernel(
            "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
            NCCL_STREAM,
            arrival,
            leave - arrival,
            p["ext"],
            p["corr"],
            kargs,
        )
        # the CPU blocks until the kernel is done (counts are needed on the host; data before reuse)
        start = rk.t + self.gap(1000, 3000)
        end = max(leave, start) + self.gap(3000, 6000)
        rk.t = start
        rk.runtime("cudaStreamSynchronize", end - start, 131, 0, gap=0)

    def collective(self, kind: str, splits: list | None) -> None:
        """splits[r] = (out_splits, in_splits) or None for the count exchange."""
        arr = []
        for rk in self.ranks:
            o, i = splits[rk.rank] if splits is not None else (None, None)
            arr.append(self.launch(rk, kind, o, i))
        last = max(arr)
        for rk in self.ranks:
            o, i = splits[rk.rank] if splits is not None else (None, None)
            leave = last + self.transfer(rk, kind, o, i) + self.rng.randrange(0, 2000)
            self.finish(rk, arr[rk.rank], leave)

    # compute blocks --------------------------------------------------------------------------------
    def mm(self, rk: _Rank, dims: list, dur: int) -> None:
        rk.open("cpu_op", "aten::matmul", _op_args(["float", "float"], dims), gap=self.gap(800, 2000))
        mm = rk.open("cpu_op", "aten::mm", _op_args(["float", "float"], dims), gap=self.gap(500, 1500))
        if self.style == "nccl":
            ts, ldur, corr = rk.runtime("cudaLaunchKernel", self.cdur(5_000), 211, mm[6], gap=1000)
            kts = ts + ldur + 2000
            kdur = max(dur - 9000, 1000)
            rk.kernel(
                "ampere_sgemm_128x64_tn",
                COMPUTE_STREAM,
                kts,
                kdur,
                mm[6],
                corr,
                '"registers per thread": 122, "shared memory": 32768, "blocks per SM": 0.5, '
                '"warps per SM": 4.0, "grid": [2, 4, 1], "block": [128, 1, 1], '
                '"est. achieved occupancy %": 6',
            )
            rk.t = max(mm[4] + dur, kts + kdur)
        else:
            rk.t += dur
        rk.close(self.gap(300, 900))
        rk.close(self.gap(300, 900))

    def gating(self, rk: _Rank) -> None:
        T, E = self.T, self.E
        g = GATE_NS_PER_TOKEN * T
        rk.open("user_annotation", "MoeGatingTopK", _RFID, gap=self.gap(3000, 8000))
        self.mm(rk, [[T, HIDDEN], [HIDDEN, E]], self.cdur(0.40 * g))
        rk.leaf(
            "aten::add",
            self.cdur(0.08 * g),
            _op_args(["float", "float", "Scalar"], [[T, E], [E], []], ["", "", "1"]),
            gap=self.gap(),
        )
        rk.leaf(
            "aten::argmax",
            self.cdur(0.12 * g),
            _op_args(["float", "Scalar", "Scalar"], [[T, E], [], []], ["", "-1", "False"]),
            gap=self.gap(),
        )
        rk.leaf(
            "aten::floor_divide", self.cdur(0.08 * g), _op_args(["long int", "long int"], [[T], []]), gap=self.gap()
        )
        rk.open(
            "cpu_op",
            "aten::argsort",
            _op_args(["long int", "Scalar", "Scalar"], [[T], [], []], ["", "-1", "False"]),
            gap=self.gap(),
        )
        rk.leaf(
            "aten::sort",
            self.cdur(0.18 * g),
            _op_args(["long int", "Scalar", "Scalar"], [[T], [], []], ["", "-1", "False"]),
            gap=self.gap(500, 1500),
        )
        rk.close(self.gap(300, 900))
        rk.leaf(
            "aten::bincount",
            self.cdur(0.12 * g),
            _op_args(["long int", "", "Scalar"], [[T], [], []], ["", "", str(self.R)]),
            gap=self.gap(),
        )
        rk.close(self.gap(3000, 8000))

    def grouped_matmul(self, rk: _Rank, rows: list[int], factor: float) -> None:
        H, recv = HIDDEN, sum(rows)
        rk.open("user_annotation", "GroupedMatmul", _RFID, gap=self.gap(10_000, 20_000))
        rk.leaf(
            "aten::empty_like",
            self.cdur(20_000, factor),
            _op_args(
                ["float", "", "", "", "Scalar", ""],
                [[recv, H], [], [], [], [], []],
                ["", "", "", "", "False", ""],
                seq=False,
            ),
            gap=self.gap(10_000, 30_000),
        )
        for e, n in enumerate(rows):
            if n <= 0:
                continue
            rk.leaf(
                "aten::index",
                self.cdur(8_000 + 200 * n, factor),
                _op_args(["float", ""], [[recv, H], []]),
                gap=self.gap(),
            )
            rk.leaf(
                "aten::select",
                self.cdur(4_000, factor),
                _op_args(["float", "Scalar", "Scalar"], [[self.epr, H, H], [], []], ["", "0", str(e)]),
                gap=self.gap(),
            )
            self.mm(rk, [[n, H], [H, H]], self.cdur(MM_NS_PER_ROW * n, factor))
            rk.leaf("aten::relu", self.cdur(5_000 + 50 * n, factor), _op_args(["float"], [[n, H]]), gap=self.gap())
            self.mm(rk, [[n, H], [H, H]], self.cdur(MM_NS_PER_ROW * n, factor))
            rk.leaf(
                "aten::index_put_",
                self.cdur(8_000 + 150 * n, factor),
                _op_args(["float", "", "float", "Scalar"], [[recv, H], [], [n, H], []], ["", "", "", "False"]),
                gap=self.gap(),
            )
        rk.close(self.gap(5000, 12_000))

    def fillers(self, rk: _Rank) -> None:
        if not self.n_fill:
            return
        rk.t += 2000
        rk.main.append(["F", "cpu_op", self.n_fill, rk.tid, rk.t, 0, 0, rk.ids.take_many("main", self.n_fill), None])
        rk.t += self.n_fill * (FILLER_DUR_NS + FILLER_GAP_NS)

    # the run ------------------------------------------------------------------------------------------
    def run(self) -> None:
        R, epr, T, H = self.R, self.epr, self.T, HIDDEN
        for s in range(self.S):
            for rk in self.ranks:
                rk.open("user_annotation", f"decode_step_{s}", _RFID, gap=self.gap(20_000, 40_000))
            for l in range(self.L):
                cnt = self.route()
                in_sp = [[sum(cnt[r][d * epr : (d + 1) * epr]) for d in range(R)] for r in range(R)]
                out_sp = [[in_sp[src][r] for src in range(R)] for r in range(R)]
                rows = [[sum(cnt[src][r * epr + e] for src in range(R)) for e in range(epr)] for r in range(R)]
                for rk in self.ranks:
                    rk.open("user_annotation", f"moe_layer_{l}", _RFID, gap=self.gap(5000, 12_000))
                    self.fillers(rk)
                    self.gating(rk)
                    rk.leaf(
                        "aten::empty_like",
                        self.cdur(12_000),
                        _op_args(
                            ["long int", "", "", "", "Scalar", ""],
                            [[R], [], [], [], [], []],
                            ["", "", "", "", "False", ""],
                            seq=False,
                        ),
                        gap=self.gap(20_000, 40_000),
                    )
                    rk.open("user_annotation", "MoeDistributeDispatch", _RFID, gap=self.gap(5000, 12_000))
                self.collective("count", None)
                for rk in self.ranks:
                    recv = sum(out_sp[rk.rank])
                    rk.leaf(
                        "aten::sum",
                        self.cdur(35_000),
                        _op_args(["long int", ""], [[R], []]),
                        gap=self.gap(5000, 12_000),
                    )
                    rk.open("cpu_op", "aten::item", _op_args(["long int"], [[]]), gap=self.gap())
                    rk.leaf(
                        "aten::_local_scalar_dense",
                        self.cdur(2_000),
                        _op_args(["long int"], [[]]),
                        gap=self.gap(500, 1500),
                    )
                    rk.close(self.gap(300, 900))
                    rk.leaf(
                        "aten::empty",
                        self.cdur(12_000),
                        _op_args(
                            ["ScalarList", "", "", "", "Scalar", ""],
                            [[], [], [], [], [], []],
                            [f"[{recv}, {H}]", "", "", "", "False", ""],
                            seq=False,
                        ),
                        gap=self.gap(),
                    )
                    rk.leaf("aten::index", self.cdur(1_000 * T), _op_args(["float", ""], [[T, H], []]), gap=self.gap())
                self.collective("dispatch", [(out_sp[r], in_sp[r]) for r in range(R)])
                for rk in self.ranks:
                    rk.close(self.gap(5000, 15_000))  # MoeDistributeDispatch
                    r = rk.rank
                    factor = 1.0
                    if r == self.slow and self.scenario == "slow_compute":
                        factor = 3.0
                    if r == self.slow and self.scenario == "spike" and (s, l) == self.spike:
                        factor = 5.0
                    self.grouped_matmul(rk, rows[r], factor)
                    rk.open("user_annotation", "MoeDistributeCombine", _RFID, gap=self.gap(10_000, 30_000))
                    rk.leaf(
                        "aten::empty",
                        self.cdur(8_000),
                        _op_args(
                            ["ScalarList", "", "", "", "Scalar", ""],
                            [[], [], [], [], [], []],
                            [f"[{T}, {H}]", "", "", "", "False", ""],
                            seq=False,
                        ),
                        gap=self.gap(10_000, 30_000),
                    )
                # combine: send back what was received, receive what was sent
                self.collective("combine", [(in_sp[r], out_sp[r]) for r in range(R)])
                for rk in self.ranks:
                    rk.close(self.gap(5000, 15_000))  # MoeDistributeCombine
                    rk.leaf(
                        "aten::index_put_",
                        self.cdur(250 * T),
                        _op_args(["float", "", "float", "Scalar"], [[T, H], [], [T, H], []], ["", "", "", "False"]),
                        gap=self.gap(10_000, 30_000),
                    )
                    rk.close(self.gap(5000, 12_000))  # moe_layer
            for rk in self.ranks:
                rk.close(self.gap(10_000, 20_000))  # decode_step
        self.span_end = [rk.t + self.rng.randrange(20_000, 60_000) for rk in self.ranks]
        self.window_end = [e + self.rng.randrange(1_000_000, 1_600_000) for e in self.span_end]

    def n_events(self, r: int) -> int:
        rk = self.ranks[r]
        n = len(rk.main) + len(rk.gloo["A"]) + len(rk.gloo["B"]) + len(rk.gpu)
        return n + (12 if self.style == "gloo" else 13) + 3


# --------------------------------------------------------------------------------------------
# writing


def _x_event(cat: str, name: str, pid, tid, ts: int, dur: int, args: str) -> str:
    return (
        f'  {{\n    "ph": "X",\n    "cat": "{cat}",\n    "name": "{name}",\n    "pid": {pid},\n'
        f'    "tid": {tid},\n    "ts": {_t(ts)},\n    "dur": {_t(dur)}\n    ,\n    "args": {{\n'
        f"      {args}\n    }}\n  }}"
    )


def _m_event(name: str, ts: int, pid, tid, key: str, val) -> str:
    v = f'"{val}"' if isinstance(val, str) else str(val)
    pid_s = f'"{pid}"' if isinstance(pid, str) else str(pid)
    return (
        f'  {{\n    "ph": "M",\n    "name": "{name}",\n    "ts": {_t(ts)},\n    "pid": {pid_s},\n'
        f'    "tid": {tid},\n    "args": {{\n      "{key}": {v}\n    }}\n  }}'
    )


def _flow(ph: str, fid: int, pid, tid, ts: int) -> str:
    bp = ',\n    "bp": "e"' if ph == "f" else ""
    return (
        f'  {{\n    "ph": "{ph}",\n    "id": {fid},\n    "pid": {pid},\n    "tid": {tid},\n'
        f'    "ts": {_t(ts)},\n    "cat": "ac2g",\n    "name": "ac2g"{bp}\n  }}'
    )


_DEVPROPS = (
    '{{\n      "id": {d}, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912,\n'
    '      "computeMajor": 9, "computeMinor": 0,\n'
    '      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,\n'
    '      "regsPerBlock": 65536, "warpSize": 32,\n'
    '      "sharedMemPerBlock": 49152, "numSms": 132\n'
    '    , "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448, '
    '"sharedMemPerMultiprocessor": 233472\n    }}'
)


def _header(sim: _Sim, r: int, host: str) -> str:
    R = sim.R
    ranks = _split_str(list(range(R)))
    if sim.style == "gloo":
        dev = "[]"
        dist = (
            f'{{"backend": "gloo", "rank": {r}, "world_size": {R}, "pg_count": 1, "pg_config": '
            f'[{{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo,cuda:gloo", '
            f'"pg_size": {R}, "ranks": {ranks}}}]}}'
        )
    else:
        devs = ",\n    ".join(_DEVPROPS.format(d=d) for d in range(min(R, GPUS_PER_HOST)))
        dev = f"[\n    {devs}\n    ]"
        dist = (
            f'{{"backend": "nccl", "rank": {r}, "world_size": {R}, "pg_count": 1, "pg_config": '
            f'[{{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", '
            f'"pg_size": {R}, "ranks": {ranks}}}], "nccl_version": "2.21.5"}}'
        )
    return (
        f' {{\n    "schemaVersion": 1,\n    "deviceProperties": {dev},\n    \n'
        f'      "trace_id": "{sim.trace_ids[r]}",\n      "record_shapes": 1,\n'
        f'      "distributedInfo": {dist},\n      "host_name": "{host}",\n'
        f'    "displayTimeUnit": "ms",\n    "baseTimeNanoseconds": {BASE_TIME_NS},\n'
        f'    "traceEvents": [\n    \n'
    )


def _filler_texts(ev: list, off: int, counter: list[int]) -> list[str]:
    ts = ev[4] + off
    pid = tid = ev[3]
    args_mid = _op_args(["float", "float", "Scalar"], [[HIDDEN, HIDDEN], [HIDDEN, HIDDEN], []], ["", "", "1"])
    out = []
    k = 0
    for first, n in ev[7]:
        for eid in range(first, first + n):
            name = FILLER_NAMES[k % len(FILLER_NAMES)]
            out.append(
                _x_event(
                    "cpu_op",
                    name,
                    pid,
                    tid,
                    ts,
                    FILLER_DUR_NS,
                    f'"External id": {eid},{args_mid}, "Ev Idx": {counter[0]}',
                )
            )
            counter[0] += 1
            ts += FILLER_DUR_NS + FILLER_GAP_NS
            k += 1
    return out


def _write_rank(sim: _Sim, r: int, path: Path, off: int, host: str, gz: bool) -> None:
    rk = sim.ranks[r]
    pid = rk.pid
    mts = sim.meta_ts[r] + off
    ga, gb = rk.gloo_tid["A"], rk.gloo_tid["B"]
    parts: list[str] = [
        _m_event("process_name", mts, pid, 0, "name", "python"),
        _m_event("process_labels", mts, pid, 0, "labels", "CPU"),
        _m_event("process_sort_index", mts, pid, 0, "sort_index", pid),
    ]
    if sim.style == "gloo":
        for tid, label in ((ga, "pt_gloo_runloop"), (gb, "pt_gloo_runloop"), (pid, "python"), (gb, "python")):
            parts.append(_m_event("thread_name", mts, pid, tid, "name", f"thread {tid} ({label})"))
            parts.append(_m_event("thread_sort_index", mts, pid, tid, "sort_index", tid))
    else:
        parts.append(_m_event("thread_name", mts, pid, pid, "name", f"thread {pid} (python)"))
        parts.append(_m_event("thread_sort_index", mts, pid, pid, "sort_index", pid))
        d = rk.device
        parts.append(_m_event("process_name", mts, d, 0, "name", "python"))
        parts.append(_m_event("process_labels", mts, d, 0, "labels", f"GPU {d}"))
        parts.append(_m_event("process_sort_index", mts, d, 0, "sort_index", 16777216 + d))
        for st in (COMPUTE_STREAM, NCCL_STREAM):
            parts.append(_m_event("thread_name", mts, d, st, "name", f"stream {st} "))
            parts.append(_m_event("thread_sort_index", mts, d, st, "sort_index", st))

    counter = [0]  # Ev Idx, in file order over cpu_op / user_annotation events

    def emit(ev: list, pid_) -> str | list[str]:
        kind = ev[0]
        if kind == "X":
            s = _x_event(
                ev[1], ev[2], pid_, ev[3], ev[4] + off, ev[5], f'"External id": {ev[6]},{ev[7]}, "Ev Idx": {counter[0]}'
            )
            counter[0] += 1
            return s
        if kind in ("R", "K"):
            ext = f'"External id": {ev[6]},' if ev[6] else ""
            return _x_event(ev[1], ev[2], pid_, ev[3], ev[4] + off, ev[5], f"{ext}{ev[7]}")
        if kind in ("s", "f"):
            return _flow(kind, ev[7], pid_, ev[3], ev[4] + off)
        return _filler_texts(ev, off, counter)

    head = _header(sim, r, host)
    if gz:
        raw, fh = _gz_open(path)
    else:
        raw, fh = None, open(path, "wb")
    try:
        fh.write(head.encode())
        buf: list[str] = parts
        size = 0

        def push(x) -> None:
            nonlocal size
            if isinstance(x, list):
                buf.extend(x)
                size += 330 * len(x)
            else:
                buf.append(x)
                size += len(x)
            if size > (1 << 20):
                flush(False)

        first = [True]

        def flush(final: bool) -> None:
            nonlocal size
            if buf:
                txt = ",\n".join(buf)
                if not first[0]:
                    txt = ",\n" + txt
                first[0] = False
                fh.write(txt.encode())
                buf.clear()
            size = 0

        for ev in rk.gloo["B"]:
            push(emit(ev, pid))
        for ev in rk.main:
            push(emit(ev, pid))
        for ev in rk.gloo["A"]:
            push(emit(ev, pid))
        for ev in rk.gpu:
            push(emit(ev, rk.device))
        ss, se, we = sim.span_start[r] + off, sim.span_end[r] + off, sim.window_end[r] + off
        push(_x_event("Trace", "PyTorch Profiler (0)", '"Spans"', '"PyTorch Profiler"', ss, se - ss, '"Op count": 0'))
        push(_m_event("process_sort_index", ss, "Spans", 0, "sort_index", 536870912))
        push(
            f'  {{\n    "ph": "i",\n    \n    "s": "g",\n    "name": "Iteration Start: PyTorch Profiler",\n'
            f'    "pid": "Traces",\n    "tid": "Trace PyTorch Profiler",\n    "ts": {_t(ss)}\n    \n  }}'
        )
        push(
            f'  {{\n    "ph": "i",\n    \n    "s": "g",\n    "name": "Record Window End",\n'
            f'    "pid": "",\n    "tid": "",\n    "ts": {_t(we)}\n    \n  }}'
        )
        flush(True)
        fh.write(f'\n  ],"traceName": "{path.name.removesuffix(".gz")}" }}'.encode())
    finally:
        fh.close()
        if raw is not None:
            raw.close()


def write_ep_run(
    out_dir,
    *,
    ranks: int = 4,
    steps: int = 4,
    layers: int = 4,
    experts_per_rank: int = 4,
    tokens_per_rank: int = 256,
    scenario: str = "balanced",
    slow_rank: int = 1,
    style: str = "gloo",
    clock_offsets_us: dict | None = None,
    noise: float = 0.0,
    gz: bool = True,
    seed: int = 0,
    events_per_rank: int | None = None,
) -> list[Path]:
    """Write ``rank{r}.pt.trace.json[.gz]`` for r in range(ranks) into out_dir; return the paths.

    scenario: one of SCENARIOS. slow_rank: the anomalous rank (ignored by "balanced"/"noisy").
    style: "gloo" (CPU, like the real run) or "nccl" (GPU kernel collectives, see module doc).
    clock_offsets_us: {rank: µs} added to every ts of that rank (a rank on another host); ranks
    sharing an offset share a ``host_name`` (``node0`` = first offset seen, 0 for absent ranks).
    noise: extra uniform relative jitter on every duration, on every rank.
    events_per_rank: pad every rank with filler cpu_ops (aten::add/mul/copy_/silu/to/view, 0.8 µs
    each, 1.2 µs apart, Input Dims [[256, 256], [256, 256], []]) at the start of every
    ``moe_layer_<l>``, the same number on every rank (so timing stays balanced), so that the mean
    rank has about that many events in total.

    Events per file (a = local experts with >= 1 row in that (step, layer); a = experts_per_rank
    with the default sizes in every scenario): see ``ep_event_counts``. For style "gloo":
    ``M`` 12, ``i`` 2, ``X`` = 1 (Trace span) + steps + sum over (step, layer) of (28 + 8a), all
    ``gloo:all_to_all`` = 3 * steps * layers, ``c10d::alltoall_base_`` = 3 * steps * layers,
    ``aten::mm`` in GroupedMatmul = 2a per (step, layer) plus one gating ``aten::mm`` per layer.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {sorted(SCENARIOS)}")
    if style not in ("gloo", "nccl"):
        raise ValueError(f"style must be 'gloo' or 'nccl', not {style!r}")
    if ranks < 1 or steps < 1 or layers < 1 or experts_per_rank < 1 or tokens_per_rank < 1:
        raise ValueError("ranks, steps, layers, experts_per_rank and tokens_per_rank must be >= 1")
    if not 0 <= slow_rank < ranks:
        raise ValueError(f"slow_rank {slow_rank} is not in range(0, {ranks})")
    if not 0.0 <= noise < 1.0:
        raise ValueError("noise must be in [0, 1)")
    offsets = {int(k): int(round(float(v) * 1000)) for k, v in (clock_offsets_us or {}).items()}
    for k in offsets:
        if not 0 <= k < ranks:
            raise ValueError(f"clock_offsets_us names rank {k}, not in range(0, {ranks})")
    kw = dict(
        ranks=ranks,
        steps=steps,
        layers=layers,
        experts_per_rank=experts_per_rank,
        tokens_per_rank=tokens_per_rank,
        scenario=scenario,
        slow_rank=slow_rank,
        style=style,
        noise=noise,
        seed=seed,
    )
    sim = _Sim(n_fill=0, **kw)
    sim.run()
    if events_per_rank:
        base = sum(sim.n_events(r) for r in range(ranks)) / ranks
        n_fill = max(0, math.ceil((events_per_rank - base) / (steps * layers)))
        if n_fill:
            sim = _Sim(n_fill=n_fill, **kw)  # same seed: the same routing and jitter, shifted
            sim.run()
    hosts: dict[int, int] = {}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(ranks):
        off = offsets.get(r, 0)
        h = hosts.setdefault(off, len(hosts))
        name = f"rank{r}.pt.trace.json" + (".gz" if gz else "")
        p = out_dir / name
        _write_rank(sim, r, p, off, f"node{h}", gz)
        paths.append(p)
    return paths


# --------------------------------------------------------------------------------------------
# truncated files (a profiler killed mid-write)


def trace_text(path) -> bytes:
    """The JSON text of a written trace (``.gz`` decompressed, also when the stream was cut)."""
    raw = Path(path).read_bytes()
    return zlib.decompressobj(31).decompress(raw) if str(path).endswith(".gz") else raw


def cut_trace(path, keep: int) -> int:
    """Rewrite a trace as a profiler killed mid-write leaves it: only the first ``keep`` bytes of
    its JSON text (negative: all but the last -keep). Kineto writes lane by lane (gloo thread B,
    the main thread, gloo thread A, then the device stream, see ``_write_rank``), so a cut also
    drops every lane written after it whole. A ``.gz`` file becomes a gzip stream of the kept text
    that stops without its end marker (sync-flushed, no final block, no CRC trailer), like a
    killed ``gzip`` writer. Returns the number of JSON bytes kept."""
    path = Path(path)
    text = trace_text(path)
    kept = text[:keep]
    if not 0 < len(kept) < len(text):
        raise ValueError(f"cut at {keep} keeps {len(kept)} of {len(text)} bytes: nothing would be cut")
    if str(path).endswith(".gz"):
        z = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: gzip wrapper, mtime 0
        path.write_bytes(z.compress(kept) + z.flush(zlib.Z_SYNC_FLUSH))
    else:
        path.write_bytes(kept)
    return len(kept)


# --------------------------------------------------------------------------------------------
# header / layout variants for ingest tests

HEADER_VARIANTS: dict[str, dict] = {
    "kineto_standard.json": {
        "desc": "torch 2.x libkineto layout: distributedInfo before traceEvents, baseTimeNanoseconds, "
        "ts relative (3 decimals), traceName last",
        "dist_position": "before",
        "base_time": True,
        "gz": False,
        "bom": False,
        "layout": "kineto",
    },
    "ondemand_distinfo_after.json.gz": {
        "desc": "on-demand style: distributedInfo (pg_config ranks as a STRING, nccl_version) written "
        "AFTER traceEvents, then traceName",
        "dist_position": "after",
        "base_time": True,
        "gz": True,
        "bom": False,
        "layout": "kineto",
    },
    "legacy_abs_epoch.json": {
        "desc": "older Kineto: no baseTimeNanoseconds / displayTimeUnit, ts and dur are integer absolute "
        "epoch µs (ns fractions truncated)",
        "dist_position": "before",
        "base_time": False,
        "gz": False,
        "bom": False,
        "layout": "kineto",
    },
    "indented.json.gz": {
        "desc": "json.dumps(indent=4) of the standard document (pretty, one value per line)",
        "dist_position": "before",
        "base_time": True,
        "gz": True,
        "bom": False,
        "layout": "indent",
    },
    "compact.json": {
        "desc": "json.dumps(separators=(',', ':')): the whole document on one line",
        "dist_position": "before",
        "base_time": True,
        "gz": False,
        "bom": False,
        "layout": "compact",
    },
    "bom.json": {
        "desc": "the standard document preceded by a UTF-8 BOM (EF BB BF)",
        "dist_position": "before",
        "base_time": True,
        "gz": False,
        "bom": True,
        "layout": "kineto",
    },
}
"""Files written by write_kineto_header_variants, all of rank 1 of world 2 (nccl, pg "0",
ranks [0, 1]) and all holding the SAME 25 events (VARIANT_PH_COUNTS: X 12, B 1, E 1, i 3, C 1,
s 1, f 1, M 5), including:

- ``gpu_memcpy`` X with ``args.bytes`` = 1048576 and a ``[memory]`` instant with ``args.Bytes`` = 4096
  (keys that collide when case-folded);
- a huge integer ``args.Addr`` = 2**64 + 12345 (> 2**64) on the ``[memory]`` instant and
  ``"Comms Id"`` = 2**70 + 1 on ``record_param_comms``;
- the profiler span X on pid ``"Spans"`` / tid ``"PyTorch Profiler"``, ``Iteration Start`` on pid
  ``"Traces"``, ``Record Window End`` with pid ``""`` and tid ``""``;
- ph variety: X, B/E (``custom_region``), i, C (``GPU Memory``), s/f (``ac2g``, f has ``bp: "e"``), M.
"""

VARIANT_PH_COUNTS = {"X": 12, "B": 1, "E": 1, "i": 3, "C": 1, "s": 1, "f": 1, "M": 5}
VARIANT_RANK, VARIANT_WORLD = 1, 2
VARIANT_FIRST_X_NS = BASE_TIME_NS + T0_NS + 250_123  # abs ns of the first X (decode_step_0)
VARIANT_NAMES = (
    "decode_step_0",
    "moe_layer_0",
    "MoeGatingTopK",
    "MoeDistributeDispatch",
    "c10d::alltoall_base_",
    "record_param_comms",
    "cudaLaunchKernel",
    "GroupedMatmul",
    "aten::mm",
    "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
    "Memcpy DtoD (Device -> Device)",
    "PyTorch Profiler (0)",
)


def _variant_events(abs_us: bool) -> list[dict]:
    """The shared event body. Relative ns -> ts string; abs_us -> integer epoch µs."""
    pid, tid, dev = 2001, 2001, 1
    t0 = T0_NS + 250_123

    def ts(ns: int):
        if abs_us:
            return (BASE_TIME_NS + ns) // 1000
        return _Raw(_t(ns))

    def du(ns: int):
        return ns // 1000 if abs_us else _Raw(_t(ns))

    def X(cat, name, p, t, start, dur, args):
        return {"ph": "X", "cat": cat, "name": name, "pid": p, "tid": t, "ts": ts(start), "dur": du(dur), "args": args}

    coll = {
        "Collective name": "all_to_allv",
        "dtype": "Float",
        "In msg nelems": 65536,
        "Out msg nelems": 131072,
        "Group size": 2,
        "In split size": "[128, 128]",
        "Out split size": "[256, 256]",
        "Process Group Name": "0",
        "Process Group Description": "default_pg",
        "Process Group Ranks": "[0, 1]",
        "Seq": 1,
    }
    ev = [
        {"ph": "M", "name": "process_name", "ts": ts(T0_NS + 60_000), "pid": pid, "tid": 0, "args": {"name": "python"}},
        {
            "ph": "M",
            "name": "thread_name",
            "ts": ts(T0_NS + 60_000),
            "pid": pid,
            "tid": tid,
            "args": {"name": "thread 2001 (python)"},
        },
        {"ph": "M", "name": "process_name", "ts": ts(T0_NS + 60_000), "pid": dev, "tid": 0, "args": {"name": "python"}},
        {
            "ph": "M",
            "name": "process_labels",
            "ts": ts(T0_NS + 60_000),
            "pid": dev,
            "tid": 0,
            "args": {"labels": "GPU 1"},
        },
        X(
            "user_annotation",
            "decode_step_0",
            pid,
            tid,
            t0,
            900_000,
            {"External id": 1, "Record function id": 0, "Ev Idx": 0},
        ),
        X(
            "user_annotation",
            "moe_layer_0",
            pid,
            tid,
            t0 + 10_000,
            880_000,
            {"External id": 2, "Record function id": 0, "Ev Idx": 1},
        ),
        X(
            "user_annotation",
            "MoeGatingTopK",
            pid,
            tid,
            t0 + 20_000,
            100_000,
            {"External id": 3, "Record function id": 0, "Ev Idx": 2},
        ),
        X(
            "user_annotation",
            "MoeDistributeDispatch",
            pid,
            tid,
            t0 + 130_000,
            300_000,
            {"External id": 4, "Record function id": 0, "Ev Idx": 3},
        ),
        X(
            "cpu_op",
            "c10d::alltoall_base_",
            pid,
            tid,
            t0 + 140_000,
            60_000,
            {
                "External id": 5,
                "Sequence number": 0,
                "Fwd thread id": 0,
                "Record function id": 0,
                "Concrete Inputs": ["", "", "", "[256, 256]", "[128, 128]", "False", "-1"],
                "Input type": ["float", "float", "", "ScalarList", "ScalarList", "Scalar", "Scalar"],
                "Input Strides": [[256, 1], [256, 1], [], [], [], [], []],
                "Input Dims": [[512, 256], [256, 256], [], [], [], [], []],
                "Ev Idx": 4,
            },
        ),
        X(
            "cpu_op",
            "record_param_comms",
            pid,
            tid,
            t0 + 145_000,
            40_000,
            {"External id": 6, "Record function id": 0, **coll, "Comms Id": 2**70 + 1, "Ev Idx": 5},
        ),
        X(
            "cuda_runtime",
            "cudaLaunchKernel",
            pid,
            tid,
            t0 + 150_000,
            8_000,
            {"External id": 6, "cbid": 211, "correlation": 77},
        ),
        {"ph": "s", "id": 77, "pid": pid, "tid": tid, "ts": ts(t0 + 150_000), "cat": "ac2g", "name": "ac2g"},
        X(
            "kernel",
            "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
            dev,
            20,
            t0 + 162_000,
            250_000,
            {
                "External id": 6,
                "queued": 0,
                "device": dev,
                "context": 1,
                "stream": 20,
                "correlation": 77,
                "registers per thread": 96,
                "shared memory": 0,
                "blocks per SM": 0.121212,
                "warps per SM": 1.939394,
                "grid": [16, 1, 1],
                "block": [512, 1, 1],
                "est. achieved occupancy %": 0,
                **coll,
            },
        ),
        {"ph": "f", "id": 77, "pid": dev, "tid": 20, "ts": ts(t0 + 162_000), "cat": "ac2g", "name": "ac2g", "bp": "e"},
        X(
            "user_annotation",
            "GroupedMatmul",
            pid,
            tid,
            t0 + 450_000,
            300_000,
            {"External id": 7, "Record function id": 0, "Ev Idx": 6},
        ),
        X(
            "cpu_op",
            "aten::mm",
            pid,
            tid,
            t0 + 460_000,
            256_000,
            {
                "External id": 8,
                "Sequence number": 0,
                "Fwd thread id": 0,
                "Record function id": 0,
                "Concrete Inputs": ["", ""],
                "Input type": ["float", "float"],
                "Input Strides": [[256, 1], [256, 1]],
                "Input Dims": [[128, 256], [256, 256]],
                "Ev Idx": 7,
            },
        ),
        X(
            "gpu_memcpy",
            "Memcpy DtoD (Device -> Device)",
            dev,
            7,
            t0 + 760_000,
            5_000,
            {
                "device": dev,
                "context": 1,
                "stream": 7,
                "correlation": 78,
                "bytes": 1048576,
                "memory bandwidth (GB/s)": 209.7152,
            },
        ),
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "s": "t",
            "name": "[memory]",
            "pid": pid,
            "tid": tid,
            "ts": ts(t0 + 770_000),
            "args": {
                "Device Type": 1,
                "Device Id": 1,
                "Addr": 2**64 + 12345,
                "Bytes": 4096,
                "Total Allocated": 8192,
                "Total Reserved": 2097152,
                "Ev Idx": 8,
            },
        },
        {
            "ph": "B",
            "cat": "user_annotation",
            "name": "custom_region",
            "pid": pid,
            "tid": tid,
            "ts": ts(t0 + 800_000),
            "args": {"note": "B/E pair"},
        },
        {"ph": "E", "cat": "user_annotation", "name": "custom_region", "pid": pid, "tid": tid, "ts": ts(t0 + 850_000)},
        {"ph": "C", "name": "GPU Memory", "pid": dev, "tid": 0, "ts": ts(t0 + 860_000), "args": {"allocated": 8192}},
        X("Trace", "PyTorch Profiler (0)", "Spans", "PyTorch Profiler", T0_NS, 1_200_000, {"Op count": 0}),
        {
            "ph": "M",
            "name": "process_sort_index",
            "ts": ts(T0_NS),
            "pid": "Spans",
            "tid": 0,
            "args": {"sort_index": 536870912},
        },
        {
            "ph": "i",
            "s": "g",
            "name": "Iteration Start: PyTorch Profiler",
            "pid": "Traces",
            "tid": "Trace PyTorch Profiler",
            "ts": ts(T0_NS),
        },
        {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": ts(T0_NS + 1_300_000)},
    ]
    return ev


class _Raw(str):
    """A number already formatted with 3 decimals (emitted verbatim, like Kineto's {}.{:03})."""


def _dumps(v, indent: int | None = None, compact: bool = False) -> str:
    """json.dumps that writes _Raw numbers verbatim (json would print 5367150393421.914 differently)."""
    marker = "\u0000RAW\u0000"

    def conv(x):
        if isinstance(x, _Raw):
            return marker + str(x) + marker
        if isinstance(x, dict):
            return {k: conv(y) for k, y in x.items()}
        if isinstance(x, list):
            return [conv(y) for y in x]
        return x

    seps = (",", ":") if compact else None
    s = json.dumps(conv(v), indent=indent, separators=seps, ensure_ascii=False)
    enc = json.dumps(marker)[1:-1]
    return s.replace('"' + enc, "").replace(enc + '"', "")


def _kineto_event(e: dict) -> str:
    """One event in libkineto's 2-space layout (top-level keys one per line, args values inline)."""
    lines = []
    for k, v in e.items():
        if k == "args":
            inner = ", ".join(f"{json.dumps(a)}: {_dumps(b)}" for a, b in v.items())
            lines.append(f'    "args": {{\n      {inner}\n    }}')
        else:
            lines.append(f"    {json.dumps(k)}: {_dumps(v)}")
    return "  {\n" + ",\n".join(lines) + "\n  }"


def write_kineto_header_variants(out_dir) -> dict[str, Path]:
    """Write the small single-rank files described in HEADER_VARIANTS; return {file name: path}.

    Every file is rank 1 of world 2 (distributedInfo backend "nccl", pg_config one group "0"
    ranks [0, 1]) and holds the same events, ph counts VARIANT_PH_COUNTS =
    {X: 12, B: 1, E: 1, i: 3, C: 1, s: 1, f: 1, M: 5} (25 events). Names: see VARIANT_NAMES.
    The first X (``decode_step_0``) starts at absolute ns VARIANT_FIRST_X_NS (legacy file: the
    same instant truncated to whole µs). Keys: schemaVersion, deviceProperties, distributedInfo,
    [displayTimeUnit, baseTimeNanoseconds], traceEvents, traceName — except
    ``ondemand_distinfo_after.json.gz`` whose distributedInfo comes right after traceEvents
    (``pg_config[0].ranks`` is the string "[0, 1]" there, plus ``nccl_version``) and
    ``legacy_abs_epoch.json`` without displayTimeUnit/baseTimeNanoseconds. ``bom.json`` starts with
    the UTF-8 BOM. traceName is always the last key.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dist = {
        "backend": "nccl",
        "rank": VARIANT_RANK,
        "world_size": VARIANT_WORLD,
        "pg_count": 1,
        "pg_config": [
            {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": 2, "ranks": [0, 1]}
        ],
    }
    dev = [
        {
            "id": 1,
            "name": "NVIDIA H100 80GB HBM3",
            "totalGlobalMem": 85029158912,
            "computeMajor": 9,
            "computeMinor": 0,
            "maxThreadsPerBlock": 1024,
            "warpSize": 32,
            "numSms": 132,
        }
    ]
    out: dict[str, Path] = {}
    for fname, spec in HEADER_VARIANTS.items():
        events = _variant_events(abs_us=not spec["base_time"])
        trace_name = fname.removesuffix(".gz")
        if spec["layout"] == "kineto":
            head = ['{\n  "schemaVersion": 1,', f'  "deviceProperties": {json.dumps(dev)},']
            if spec["dist_position"] == "before":
                head.append(f'  "distributedInfo": {json.dumps(dist)},')
            head.append('  "record_shapes": 1,')
            if spec["base_time"]:
                head.append('  "displayTimeUnit": "ms",')
                head.append(f'  "baseTimeNanoseconds": {BASE_TIME_NS},')
            head.append('  "traceEvents": [')
            body = ",\n".join(_kineto_event(e) for e in events)
            tail = ["\n  ],"]
            if spec["dist_position"] == "after":
                d2 = dict(dist)
                d2["pg_config"] = [dict(dist["pg_config"][0], ranks="[0, 1]")]
                d2["nccl_version"] = "unknown"
                tail.append(f'\n  "distributedInfo": {json.dumps(d2)},')
            tail.append(f'\n  "traceName": "{trace_name}"\n}}')
            text = "\n".join(head) + "\n" + body + "".join(tail)
        else:
            doc = {
                "schemaVersion": 1,
                "deviceProperties": dev,
                "distributedInfo": dist,
                "record_shapes": 1,
                "displayTimeUnit": "ms",
                "baseTimeNanoseconds": BASE_TIME_NS,
                "traceEvents": events,
                "traceName": trace_name,
            }
            if spec["layout"] == "indent":
                text = _dumps(doc, indent=4)
            else:
                text = _dumps(doc, compact=True)
        data = text.encode("utf-8")
        if spec["bom"]:
            data = b"\xef\xbb\xbf" + data
        p = out_dir / fname
        if spec["gz"]:
            buf = io.BytesIO()
            with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as g:
                g.write(data)
            p.write_bytes(buf.getvalue())
        else:
            p.write_bytes(data)
        out[fname] = p
    return out
