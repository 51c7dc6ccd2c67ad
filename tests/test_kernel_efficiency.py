"""why-kernel-efficiency (issue 30 item 3): GEMM / attention FLOPs from the CPU op's Input Dims,
over the GPU kernels linked by correlation id, in TFLOP/s vs the median rank and the device peak;
on generated traces (numbers known exactly), on the real Kineto traces (numbers computed here from
the events read), and in the "Why is rank N slow" block of a GPU trace."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_gemm  # noqa: E402
from conftest import ingest_ok  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.diagnosis import diagnose  # noqa: E402

CATALOG = queries.load_catalog()
QUERY = "why-kernel-efficiency"


def judge(db, run_name="r", **params):
    con = queries.open_readonly(db)
    try:
        return queries.run_query(con, CATALOG[QUERY], run_name, params)
    finally:
        con.close()


def synth(tmp_path, **kw):
    paths = synth_gemm.write_run(tmp_path / "trace", **kw)
    ingest_ok(tmp_path / "g.duckdb", paths, "r")
    return judge(tmp_path / "g.duckdb")


def rows_of(res, kind):
    return {r["rank"]: r for r in res.rows if r["kind"] == kind}


def trace_tflops(path: Path, kind: str) -> tuple[float, float]:
    """(FLOPs, kernel ns) of a generated trace's GEMM or attention ops, from its own events."""
    ev = json.loads(path.read_text())["traceEvents"]
    kernels = {e["args"]["correlation"]: e["dur"] for e in ev if e["cat"] == "kernel"}
    flops = ns = 0.0
    for op in (e for e in ev if e["cat"] == "cpu_op"):
        d = op["args"]["Input Dims"]
        if kind == "gemm" and op["name"] == "aten::addmm":
            (m, k), (_, n) = d[1], d[2]
        elif kind == "gemm" and op["name"] == "aten::mm":
            (m, k), (_, n) = d[0], d[1]
        elif kind == "attention" and op["name"] == "aten::_scaled_dot_product_flash_attention":
            b, h, lq, dq = d[0]
            lk, dv = d[1][2], d[2][3]
            assert op["args"]["Concrete Inputs"][4] == "True"  # is_causal: half the score matrix
            flops += 2 * b * h * lq * lk * (dq + dv) / 2
        else:
            continue
        if kind == "gemm":
            flops += 2 * m * k * n
        launches = [
            e["args"]["correlation"]
            for e in ev
            if e["cat"] == "cuda_runtime" and e["tid"] == op["tid"] and op["ts"] <= e["ts"] < op["ts"] + op["dur"]
        ]
        ns += sum(kernels[c] for c in launches) * 1000
    return flops, ns


# ------------------------------------------------------------------ generated traces


def test_a_slow_gpu_runs_the_same_gemms_at_half_the_tflops_of_the_median_rank(tmp_path):
    res = synth(tmp_path, slow={2: 2.0})
    assert res.status == "INFO", res.summary
    gemm, attn = rows_of(res, "gemm"), rows_of(res, "attention")
    assert sorted(gemm) == [0, 1, 2, 3] and sorted(attn) == [0, 1, 2, 3]
    for kind, rows in (("gemm", gemm), ("attention", attn)):
        for rank, row in rows.items():
            flops, ns = trace_tflops(tmp_path / "trace" / f"rank{rank}.pt.trace.json", kind)
            assert row["gflop"] == pytest.approx(flops / 1e9, abs=1e-6)
            assert row["kernel_ms"] == pytest.approx(ns / 1e6, abs=1e-4)
            assert row["tflops"] == pytest.approx(flops / ns / 1e3, rel=1e-3)
            assert row["dtype"] == "16-bit" and row["device"] == "H100 SXM" and row["peak_tflops"] == 989.4
            assert row["peak_pct"] == pytest.approx(100 * row["tflops"] / 989.4, abs=0.01)
    # 3 steps: (2 M K N + the mm's 2 x 1024 x 4096 x 1024) and the causal attention's half
    assert gemm[0]["gflop"] == pytest.approx(3 * (synth_gemm.GEMM_FLOPS + synth_gemm.MM_FLOPS) / 1e9, abs=1e-6)
    assert attn[0]["gflop"] == pytest.approx(3 * 2 * 4 * 32 * 2048 * 2048 * 256 / 2 / 1e9, abs=1e-6)
    assert gemm[0]["ops"] == 6 and gemm[0]["kernels"] == 9  # addmm: bias copy + GEMM; mm: GEMM
    assert gemm[0]["largest_shape"] == "4096x8192 @ 8192x8192"
    assert gemm[0]["tflops"] == pytest.approx(500, rel=0.01) and attn[0]["tflops"] == pytest.approx(500, rel=0.01)
    slow = gemm[2]
    assert slow["vs_median_pct"] == pytest.approx(50, abs=1) and slow["work_ratio"] == 1.0
    assert slow["reading"].startswith("the same work runs slower: 50.")
    assert attn[2]["reading"].startswith("the same work runs slower")
    assert all(gemm[r]["reading"].startswith("as efficient as the median rank") for r in (0, 1, 3))
    assert "% of the H100 SXM 16-bit peak (989.4 TFLOP/s)" in slow["vs_peak"]


def test_slightly_slower_is_as_efficient_and_two_ranks_have_no_median_rank(tmp_path):
    # near miss of "runs slower": 0.95x the median rank's rate is within same_work_ratio (1.1)
    res = synth(tmp_path / "a", slow={2: 1.05})
    assert rows_of(res, "gemm")[2]["reading"].startswith("as efficient as the median rank")
    # near miss of min_ranks: two ranks, compared with the peak only
    res = synth(tmp_path / "b", ranks=2, slow={1: 2.0})
    row = rows_of(res, "gemm")[1]
    assert (
        row["median_rank_tflops"] is None and row["reading"] == "fewer than 3 ranks ran it: compared with the peak only"
    )
    assert row["tflops"] == pytest.approx(250, rel=0.01)
    assert row["peak_pct"] == pytest.approx(100 * row["tflops"] / 989.4, abs=0.01)


def test_attention_counted_on_the_inner_flash_forward_op_in_its_own_layout(tmp_path):
    # _scaled_dot_product_flash_attention -> _flash_attention_forward ([B, L, H, D], 8 key heads,
    # is_causal at input 9) launches the kernel: the same FLOPs as the [B, H, L, D] op, counted once
    res = synth(tmp_path, flash_forward=True)
    row = rows_of(res, "attention")[0]
    assert row["gflop"] == pytest.approx(3 * 2 * 4 * 32 * 2048 * 2048 * 256 / 2 / 1e9, abs=1e-6)
    assert row["ops"] == 3 and row["kernels"] == 3 and row["tflops"] == pytest.approx(500, rel=0.01)
    assert row["largest_shape"] == "4x2048x32x128 @ 4x2048x8x128"


def test_no_shapes_says_record_with_record_shapes(tmp_path):
    res = synth(tmp_path, shapes=False)
    assert res.status == "SKIP" and res.summary.startswith("no shapes: record with record_shapes=True")


@pytest.mark.parametrize(
    "device, says",
    [
        (None, "no peak: device unknown (no deviceProperties)"),
        ("NVIDIA GeForce RTX 4090", 'no peak: device unknown: "NVIDIA GeForce RTX 4090"'),
    ],
)
def test_an_unknown_device_has_no_peak_and_says_why(tmp_path, device, says):
    row = rows_of(synth(tmp_path, device=device), "gemm")[0]
    assert row["peak_tflops"] is None and row["peak_pct"] is None and row["vs_peak"].startswith(says)
    assert row["tflops"] == pytest.approx(500, rel=0.01)


# ------------------------------------------------------------------ real Kineto traces


def _real(realdata, rel):
    p = realdata / rel
    if not p.is_file():
        pytest.skip(f"{p} not found")
    return p


def test_real_rocm_trace_gemm_tflops_checked_by_hand(realdata, tmp_path):
    """mi250_minitoy (HTA's AMD test trace, record_shapes=1, an MI250 GCD: gfx 9.0, 104 CUs): one
    aten::addmm forward and one aten::mm backward with shapes, each launching its kernels by HIP."""
    path = _real(realdata, "kineto/mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    addmm = next(e for e in ev if e.get("name") == "aten::addmm")
    mm = next(e for e in ev if e.get("name") == "aten::mm")
    assert addmm["args"]["Input Dims"][1:3] == [[5, 128], [128, 128]] and mm["args"]["Input Dims"] == [
        [128, 5],
        [5, 128],
    ]
    flops = 2 * 5 * 128 * 128 + 2 * 128 * 5 * 128  # 2 M K N each
    kernels = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "kernel"}
    launched = [
        kernels[e["args"]["correlation"]]
        for op in (addmm, mm)
        for e in ev
        if e.get("cat") == "cuda_runtime"
        and e["tid"] == op["tid"]
        and op["ts"] <= e["ts"] < op["ts"] + op["dur"]
        and e["args"]["correlation"] in kernels
    ]
    # addmm: a copy of the bias and the Tensile GEMM (Cijk_...); mm: the GEMM
    assert [k["name"][:4] for k in launched] == ["void", "Cijk", "Cijk"]
    kernel_us = sum(k["dur"] for k in launched)
    assert kernel_us == pytest.approx(6.88 + 17.6 + 12.64)
    ingest_ok(tmp_path / "k.duckdb", [path], "r")
    res = judge(tmp_path / "k.duckdb")
    assert res.status == "INFO", res.summary
    (row,) = res.rows
    assert (row["rank"], row["kind"], row["dtype"], row["ops"], row["kernels"]) == (None, "gemm", "fp32", 2, 3)
    assert row["gflop"] == pytest.approx(flops / 1e9, abs=1e-6)
    assert row["kernel_ms"] == pytest.approx(kernel_us / 1e3, abs=1e-4)
    assert row["tflops"] == pytest.approx(flops / (kernel_us * 1e-6) / 1e12, rel=1e-3)
    assert row["device"] == "MI250 GCD" and row["peak_tflops"] == 45.3
    assert row["reading"] == "a trace without a rank: compared with the peak only"


def test_real_a100_traces_of_two_ranks_tf32_gemms(realdata, tmp_path):
    """sampled_rank-0 / -1 (HTA: 2 ranks of a 128-rank job, record_shapes=1, no deviceProperties):
    the GEMMs run as cutlass TF32 tensor-core kernels (s1688gemm) on float inputs."""
    p0 = _real(realdata, "kineto/sampled_rank-0.json.gz")
    p1 = _real(realdata, "kineto/sampled_rank-1.json.gz")
    ev = json.loads(gzip.decompress(p0.read_bytes()))["traceEvents"]
    # the largest GEMM: an aten::mm, a [512, 2048] x [2048, 38313] projection (twice), and its kernel
    big = [e for e in ev if e.get("name") == "aten::mm" and e["args"]["Input Dims"] == [[512, 2048], [2048, 38313]]]
    assert big
    kernels = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "kernel"}
    op = big[0]
    mine = [
        kernels[e["args"]["correlation"]]
        for e in ev
        if e.get("cat") == "cuda_runtime"
        and e["tid"] == op["tid"]
        and op["ts"] <= e["ts"] < op["ts"] + op["dur"]
        and e["args"]["correlation"] in kernels
    ]
    assert len(mine) == 1 and "s1688gemm" in mine[0]["name"]
    one_tflops = 2 * 512 * 2048 * 38313 / (mine[0]["dur"] * 1e-6) / 1e12
    ingest_ok(tmp_path / "k.duckdb", [p0, p1], "r")
    res = judge(tmp_path / "k.duckdb", min_ranks=2)
    tf32 = {r["rank"]: r for r in res.rows if r["dtype"] == "tf32"}
    assert sorted(tf32) == [0, 1]
    row = tf32[0]
    # two shapes tie for the largest (2048x512 @ 512x38313, its backward, has the same FLOPs): the
    # first by name is shown
    assert row["largest_shape"] == "2048x512 @ 512x38313" and row["kind"] == "gemm"
    assert row["gflop"] >= len(big) * 2 * 512 * 2048 * 38313 / 1e9
    # the rank's rate is of the order of its largest GEMM's (tens of TFLOP/s, TF32 on an A100)
    assert 0.3 * one_tflops < row["tflops"] < 1.5 * one_tflops and 10 < row["tflops"] < 156
    assert row["device"] == "device unknown (no deviceProperties)" and row["peak_tflops"] is None
    # same job, same work: the two ranks within 10 % of each other's FLOPs and rate
    assert row["work_ratio"] == pytest.approx(1.0, abs=0.1) and row["reading"].startswith("as efficient")


def test_real_vllm_decode_on_mi300x_lm_head_tflops_checked_by_hand(realdata, tmp_path):
    """TraceLens' vLLM decode graph-execution trace (MI300X: gfx 9.4, 304 CUs, name empty): the
    decoder layers replay as a CUDA graph (kernels launched by hipGraphLaunch, no op), the LM head
    runs eagerly: aten::linear -> aten::matmul -> aten::mm [32, 2880] x [2880, 201088], one GEMM."""
    path = _real(realdata, "thirdparty/tracelens_vllm_decode/graph_execution.json.gz")
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    (mm,) = [e for e in ev if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"]
    assert mm["args"]["Input Dims"] == [[32, 2880], [2880, 201088]]
    assert mm["args"]["Input type"][:2] == ["c10::BFloat16", "c10::BFloat16"]
    kernels = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "kernel"}
    (gemm,) = [
        kernels[e["args"]["correlation"]]
        for e in ev
        if e.get("cat") == "cuda_runtime"
        and e["tid"] == mm["tid"]
        and mm["ts"] <= e["ts"] < mm["ts"] + mm["dur"]
        and e["args"]["correlation"] in kernels
    ]
    assert gemm["name"].startswith("Cijk_")  # a hipBLASLt / Tensile GEMM
    flops = 2 * 32 * 2880 * 201088
    tflops = flops / (gemm["dur"] * 1e-6) / 1e12
    ingest_ok(tmp_path / "k.duckdb", [path], "r")
    res = judge(tmp_path / "k.duckdb")
    (row,) = res.rows
    assert (row["rank"], row["kind"], row["dtype"], row["ops"], row["kernels"]) == (0, "gemm", "16-bit", 1, 1)
    assert row["gflop"] == pytest.approx(flops / 1e9, abs=1e-6)
    assert row["tflops"] == pytest.approx(tflops, rel=1e-4) and 130 < row["tflops"] < 140
    assert row["device"] == "MI300X" and row["peak_pct"] == pytest.approx(100 * tflops / 1307.4, abs=0.01)
    assert row["largest_shape"] == "32x2880 @ 2880x201088"


@pytest.mark.parametrize(
    "rel",
    [
        "kineto/rank_not_found.json.gz",
        "thirdparty/tracelens_vllm_decode/capture_traces/graph_capture_rank_0.1773709742341309550.pt.trace.json.gz",
    ],
)
def test_real_traces_with_shapes_but_no_gemm_kernel_skip_with_the_reason(realdata, tmp_path, rel):
    # rank_not_found: CPU ops only; the vLLM capture: CUDA-graph capture, its addmm kernels are
    # captured, not run (7 kernels in the whole trace, none a GEMM)
    path = _real(realdata, rel)
    ingest_ok(tmp_path / "k.duckdb", [path], "r")
    res = judge(tmp_path / "k.duckdb")
    assert res.status == "SKIP" and "have shapes but no GPU kernel was launched inside them" in res.summary


# ------------------------------------------------------------------ the why block


def _with_mm_ops(paths, dims):
    """Wrap every GEMM launch of synth_host_device's traces in an aten::mm CPU op (with dims, or
    without when ``dims`` is None: record_shapes=False)."""
    import synth_host_device

    for p in paths:
        doc = json.loads(gzip.decompress(p.read_bytes()))
        ev = doc["traceEvents"]
        gemm = {e["args"]["correlation"] for e in ev if e.get("name") == synth_host_device.GEMM}
        ops = []
        for e in ev:
            if e.get("cat") == "cuda_runtime" and e["args"].get("correlation") in gemm:
                args = {"Input Dims": dims, "Input type": ["c10::BFloat16"] * 2} if dims else {}
                ops.append(
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "aten::mm",
                        "pid": e["pid"],
                        "tid": e["tid"],
                        "ts": e["ts"] - 0.5,
                        "dur": e["dur"] + 1,
                        "args": args,
                    }
                )
        doc["traceEvents"] = ev + ops
        p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return paths


@pytest.mark.parametrize("shapes", [True, False])
def test_why_block_of_a_slow_gpu_gives_its_gemm_tflops_or_says_record_shapes(tmp_path, shapes):
    import synth_host_device

    paths = synth_host_device.write_host_device_run(tmp_path / "t", scenario="device_slow", slow_rank=2)
    _with_mm_ops(paths, [[2048, 2048], [2048, 2048]] if shapes else None)
    ingest_ok(tmp_path / "d.duckdb", paths, "r")
    con = queries.open_readonly(tmp_path / "d.duckdb")
    try:
        diag = diagnose(con, "r", CATALOG)
    finally:
        con.close()
    card = diag.why[0]
    assert card["card"] == "rank 2"
    part = next(p for p in card["parts"] if p["query"].startswith(f"{QUERY}@"))
    if shapes:
        (row,) = part["rows"]
        # 8 GEMMs per step of 2 x 2048^3 FLOPs, 100 us on rank 2 vs 40 us on the others
        assert row["rank"] == 2 and row["vs_median_pct"] == pytest.approx(40, abs=1)
        assert row["tflops"] == pytest.approx(2 * 2048**3 / 100e-6 / 1e12, rel=0.01)
        assert "the same work runs slower" in part["lines"][0] and "H100 SXM" in part["lines"][0]
    else:
        assert part["status"] == "SKIP" and part["summary"].startswith("no shapes: record with record_shapes=True")
