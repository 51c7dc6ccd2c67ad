"""EP analysis on GPU-shaped traces: kernels on streams launched from the host, host annotations
and their device copies, NCCL all-to-all as SendRecv kernels, DeepEP kernels, CUDA-graph replay.

The verdicts must be those of the CPU-shaped runs (test_ep_queries.EXPECTED), layers and their
parts must sit on one timeline (never negative), and the breakdown must add up to 100 %.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_gpu_ep as gpu  # noqa: E402
from test_ep_queries import EXPECTED  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

CATALOG = queries.load_catalog()
STEPS, LAYERS = 3, 3


@pytest.fixture(scope="module")
def gpu_db(tmp_path_factory):
    cache: dict = {}

    def make(scenario="balanced", **kw):
        key = (scenario, repr(sorted(kw.items())))
        if key not in cache:
            d = tmp_path_factory.mktemp(f"gpu_{scenario}")
            gpu.write_gpu_ep_run(
                d / "trace", scenario=scenario, steps=kw.pop("steps", STEPS), layers=kw.pop("layers", LAYERS), **kw
            )
            db = d / "run.duckdb"
            report = ingest_paths(db, [d / "trace"], run="r")
            assert all(f.status == "ok" for f in report.files), report.files
            cache[key] = db
        return cache[key]

    return make


def run(db, name="ep-slow-rank", **params):
    con = queries.open_readonly(db)
    try:
        return queries.run_query(con, CATALOG[name], "r", params)
    finally:
        con.close()


def sql(db, text, params=None):
    con = queries.open_readonly(db)
    try:
        return con.execute(text, params or []).fetchall()
    finally:
        con.close()


def assert_same_verdict(res, scenario):
    cause = EXPECTED[scenario]
    if cause is None:
        assert res.status == "PASS", res.rows
    else:
        assert res.status == "FAIL", res.summary
        assert [(r["rank"], r["cause"]) for r in res.rows] == [(1, cause)], res.rows


@pytest.mark.parametrize("scenario", list(EXPECTED))
def test_gpu_shaped_run_gives_the_cpu_verdict(gpu_db, scenario):
    """Layers from dispatch(F) → combine(F) device annotations, tokens from record_param_comms
    moved onto the device timeline, waits from SendRecv kernels named all_to_all by their launch.

    The noisy scenario is drawn with seed 1: seed 0's rank 2 waits for its host more than its
    peers in 8 of 9 instances, an exact permutation tail of 0.0012 (x2 = 0.0023 < alpha / 4), so
    ep-slow-rank v9 rightly WARNs it at 1.3 % (1 of seeds 0-11 does; v8's normal tail missed it).
    At alpha 0.01 about one balanced run in a hundred is named per quantity by design: that rate
    is measured by the calibration benches over many runs, not by one fixture."""
    assert_same_verdict(run(gpu_db(scenario, **({"seed": 1} if scenario == "noisy" else {}))), scenario)


@pytest.mark.parametrize("scenario", ["token_skew", "slow_compute", "slow_link", "balanced"])
def test_module_marks_and_kernel_args_give_the_same_verdict(gpu_db, scenario):
    """Host nn.Module ranges mapped to the device by launch; NCCL kernels with collective args."""
    assert_same_verdict(run(gpu_db(scenario, layer_marks="module", kernel_coll_args=True)), scenario)


@pytest.mark.parametrize("scenario", ["token_skew", "slow_compute", "slow_link", "balanced"])
def test_host_only_python_frames_give_the_same_verdict(gpu_db, scenario):
    """Megatron-Core names dispatch/combine only in host python frames around generic NCCL
    kernels: the frames are moved onto the device as the span of the kernels they launched."""
    db = gpu_db(scenario, ranges="megatron")
    assert_same_verdict(run(db), scenario)
    moved = sql(
        db,
        """SELECT op_class, count(*) FROM _ep_ops WHERE cat = 'host_range_on_device'
                       GROUP BY ALL ORDER BY 1""",
    )
    assert moved == [("combine", 4 * STEPS * LAYERS), ("dispatch", 4 * STEPS * LAYERS)]


def test_clock_offset_between_hosts_changes_nothing(gpu_db):
    res = run(gpu_db("slow_compute", clock_offsets_us={2: 40_000, 3: 40_000}))
    assert_same_verdict(res, "slow_compute")


@pytest.mark.parametrize(
    "kw", [{}, {"layer_marks": "module"}, {"comm": "deepep"}, {"comm": "deepep", "graph": True}, {"ranges": "megatron"}]
)
def test_layers_on_one_timeline(gpu_db, kw):
    db = gpu_db("token_skew", **kw)
    layers = sql(db, "SELECT rank, count(*), min(dur_ns), max(step) FROM moe_layers GROUP BY rank ORDER BY rank")
    assert [(r, n) for r, n, _, _ in layers] == [(r, STEPS * LAYERS) for r in range(4)]
    assert all(mn > 0 for _, _, mn, _ in layers)
    assert all(st == STEPS - 1 for *_, st in layers)
    # every part of a layer is a device operation inside the layer's device span
    bad = sql(
        db,
        """SELECT count(*) FILTER (WHERE NOT on_device),
                            count(*) FILTER (WHERE ts_ns < layer_start_ns OR ts_ns >= layer_end_ns)
                     FROM _layer_ops WHERE op_class IN ('grouped_matmul', 'dispatch', 'combine', 'gating')""",
    )
    assert bad == [(0, 0)]
    neg = sql(
        db,
        """SELECT count(*) FROM moe_layer_facts WHERE layer_ns < 0 OR gmm_ns < 0 OR dispatch_ns < 0
                     OR combine_ns < 0 OR overlap_ns < 0 OR other_ns < 0""",
    )
    assert neg == [(0,)]


def test_graph_replay_kernels_link_to_their_graph_launch(gpu_db):
    db = gpu_db("slow_compute", comm="deepep", graph=True)
    rows = sql(
        db,
        """SELECT count(*), count(launch_ns), count(DISTINCT launch_ns)
                      FROM op_classes WHERE on_device AND cat = 'kernel' AND rank = 0""",
    )
    n, linked, launches = rows[0]
    assert n > 0 and linked == n and launches == STEPS  # one cudaGraphLaunch per step
    # no per-layer host range, yet every step has its layers, and slow rank 1's GEMMs stand out
    gmm = dict(sql(db, "SELECT rank, median(gmm_ns) FROM moe_layer_facts GROUP BY rank"))
    others = sorted(v for r, v in gmm.items() if r != 1)
    assert gmm[1] > 2.5 * others[len(others) // 2]


def test_sendrecv_kernels_of_a_host_all_to_all_are_all_to_all(gpu_db):
    db = gpu_db("balanced")
    kinds = sql(
        db,
        """SELECT coll_kind, pattern, count(*) FROM op_classes
                       WHERE on_device AND cat = 'kernel' AND name LIKE 'ncclDevKernel_SendRecv%' GROUP BY ALL""",
    )
    assert len(kinds) == 1
    kind, pattern, n = kinds[0]
    assert kind == "all_to_all" and "host all_to_all" in pattern
    assert n == 4 * STEPS * LAYERS * 3  # count exchange, token exchange, combine per layer
    # and they are matched across ranks as all_to_all collectives with the host's splits as tokens
    assert sql(db, "SELECT DISTINCT coll_kind FROM collective_waits") == [("all_to_all",)]
    assert sql(db, "SELECT count(*) FROM moe_layer_facts WHERE tokens IS NULL") == [(0,)]


def test_breakdown_shares_add_up_to_100(gpu_db):
    for kw in ({}, {"layer_marks": "module"}):
        res = run(gpu_db("token_skew", **kw), "moe-breakdown")
        assert res.status == "INFO" and len(res.rows) == 4
        for r in res.rows:
            parts = ("gmm", "dispatch", "combine", "gating", "overlap", "other")
            assert sum(r[f"{p}_pct"] for p in parts) == pytest.approx(100.0, abs=1.0), r
            assert sum(r[f"{p}_ms"] for p in parts) == pytest.approx(r["moe_ms"], abs=0.01), r
        if kw:  # the module range covers the gating kernels too
            assert all(r["gating_ms"] > 0 for r in res.rows)


# ------------------------------------------------------------------ hand-made traces


def _k(name, ts_us, dur_us, stream, corr, pid=0):
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": pid,
        "tid": stream,
        "ts": ts_us * 1000,
        "dur": dur_us * 1000,
        "args": {"stream": stream, "correlation": corr},
    }


def _h(cat, name, ts_us, dur_us, args=None, pid=3000):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": pid,
        "ts": ts_us * 1000,
        "dur": dur_us * 1000,
        "args": args or {},
    }


def _launch(ts_us, corr, pid=3000):
    return [
        _h("cuda_runtime", "cudaLaunchKernel", ts_us, 5, {"correlation": corr}, pid),
        {"ph": "s", "id": corr, "pid": pid, "tid": pid, "ts": ts_us * 1000, "cat": "ac2g", "name": "ac2g"},
    ]


def _ingest(tmp_path, events):
    gpu.write_events(tmp_path / "t" / "rank0.pt.trace.json", events, rank=0, world=1)
    db = tmp_path / "h.duckdb"
    report = ingest_paths(db, [tmp_path / "t"], run="r")
    assert all(f.status == "ok" for f in report.files), report.files
    return db


def test_host_annotation_never_pairs_with_a_kernel_of_another_layer(tmp_path):
    """The −911 µs case: a training step whose host annotations (dispatch(F), combine(B)) run
    far ahead of the DeepEP kernels they launch. Layers come from the kernels alone."""
    ev = [_h("user_annotation", "ProfilerStep#0", 0, 10_000)]
    corr = 1
    for layer in range(2):
        t = 100 + layer * 400  # host launches: all done before the device starts
        ev.append(_h("user_annotation", "dispatch(F)", t, 20))
        ev += _launch(t + 2, corr)
        ev.append(_k(gpu.DEEPEP_DISPATCH, 2_000 + layer * 1_000, 100, 20, corr))
        corr += 1
        ev.append(_h("user_annotation", "mlp(F)", t + 50, 20))
        ev += _launch(t + 52, corr)
        ev.append(_k(gpu.GEMM_KERNEL, 2_150 + layer * 1_000, 300, 7, corr))
        corr += 1
        ev.append(_h("user_annotation", "combine(F)", t + 100, 20))
        ev += _launch(t + 102, corr)
        ev.append(_k(gpu.DEEPEP_COMBINE, 2_500 + layer * 1_000, 100, 20, corr))
        corr += 1
    # backward: the host combine(B) annotation comes BEFORE the device dispatch kernel of the
    # same layer, and a combine kernel closes it
    ev.append(_h("user_annotation", "combine(B)", 1_000, 20))
    ev += _launch(1_002, corr)
    ev.append(_k(gpu.DEEPEP_DISPATCH, 4_000, 100, 20, corr))
    corr += 1
    ev.append(_h("user_annotation", "dispatch(B)", 1_100, 20))
    ev += _launch(1_102, corr)
    ev.append(_k(gpu.DEEPEP_COMBINE, 4_300, 100, 20, corr))
    db = _ingest(tmp_path, ev)
    layers = sql(db, "SELECT start_ns, end_ns, dur_ns FROM moe_layers ORDER BY start_ns")
    base = gpu.T0_US * 1000
    assert [(s - base, e - base) for s, e, _ in layers] == [
        (2_000_000, 2_600_000),
        (3_000_000, 3_600_000),
        (4_000_000, 4_400_000),
    ]
    facts = sql(db, "SELECT gmm_ns, dispatch_ns, combine_ns, other_ns FROM moe_layer_facts ORDER BY start_ns")
    assert facts[0] == (300_000, 100_000, 100_000, 100_000)


def test_overlapping_streams_are_counted_once(tmp_path):
    """A combine on the NCCL stream that runs beside the GEMM tail (and a nested GEMM range):
    the class times are unions, overlap is its own column, and the parts add up to the layer."""
    ev = [_h("user_annotation", "ProfilerStep#0", 0, 10_000)]
    ev += _launch(10, 1) + _launch(20, 2) + _launch(30, 3)
    ev.append(_h("python_function", "nn.Module: MoELayer_0", 5, 100))
    ev.append(_k(gpu.DEEPEP_DISPATCH, 1_000, 100, 20, 1))
    ev.append(_k(gpu.GEMM_KERNEL, 1_100, 400, 7, 2))  # 1100 .. 1500
    ev.append({**_k("mlp(F)", 1_100, 400, 7, 0), "cat": "gpu_user_annotation"})  # same span again
    ev.append(_k(gpu.DEEPEP_COMBINE, 1_400, 200, 20, 3))  # 1400 .. 1600: 100 overlap
    db = _ingest(tmp_path, ev)
    (row,) = sql(
        db,
        """SELECT layer_ns, gmm_ns, dispatch_ns, combine_ns, gmm_excl_ns, dispatch_excl_ns,
                               combine_excl_ns, gating_excl_ns, overlap_ns, other_ns FROM moe_layer_facts""",
    )
    layer, gmm, disp, comb, gx, dx, cx, tx, ov, other = row
    assert layer == 600_000
    assert (gmm, disp, comb) == (400_000, 100_000, 200_000)
    assert (gx, dx, cx, tx, ov, other) == (300_000, 100_000, 100_000, 0, 100_000, 0)
    assert gx + dx + cx + tx + ov + other == layer


def test_show_taxonomy_lists_what_matched(gpu_db, tmp_path):
    from typer.testing import CliRunner

    from slowcard.cli import app

    db = gpu_db("balanced")
    res = CliRunner().invoke(app, ["show-taxonomy", "--db", str(db), "-f", "json", "--unmatched", "5"])
    assert res.exit_code == 0, res.output
    import json

    out = json.loads(res.output)
    by_class = {}
    for r in out["matched"]:
        by_class.setdefault(r["op_class"], []).append(r)
    assert {"grouped_matmul", "dispatch", "combine", "gating", "collective"} <= set(by_class)
    assert any("deep_gemm" in r["examples"] for r in by_class["grouped_matmul"])
    assert any(r["origin"] == "derived" and "all_to_all" in r["pattern"] for r in by_class["collective"])
    names = {r["name"] for r in out["unmatched"]}
    assert any(n.startswith("void vllm::act_and_mul_kernel") for n in names)
    assert not names & {"dispatch(F)", "mlp(F)", "combine(F)"}
    # --name classifies names without a run; a user taxonomy file is applied on top
    f = tmp_path / "tax.csv"
    f.write_text("pattern,op_class,coll_kind,priority\nact_and_mul_kernel,gating,,5\n")
    res = CliRunner().invoke(
        app,
        [
            "show-taxonomy",
            "--name",
            "void vllm::act_and_mul_kernel<x>()",
            "--name",
            "fused_moe_kernel",
            "--taxonomy",
            str(f),
            "-f",
            "csv",
        ],
    )
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0] == "name,op_class,coll_kind,pattern,origin"
    assert lines[1].startswith("void vllm::act_and_mul_kernel<x>(),gating,,act_and_mul_kernel,user")
    assert lines[2].startswith("fused_moe_kernel,grouped_matmul,")


def test_generator_is_deterministic_and_checks_arguments(tmp_path):
    kw = dict(ranks=2, steps=1, layers=2, scenario="noisy")
    a = [p.read_bytes() for p in gpu.write_gpu_ep_run(tmp_path / "a", **kw)]
    b = [p.read_bytes() for p in gpu.write_gpu_ep_run(tmp_path / "b", **kw)]
    assert a == b
    c = [p.read_bytes() for p in gpu.write_gpu_ep_run(tmp_path / "c", seed=1, **kw)]
    assert c != a
    for bad, word in (
        ({"scenario": "nope"}, "scenario"),
        ({"comm": "mpi"}, "comm"),
        ({"layer_marks": "x"}, "layer_marks"),
        ({"ranges": "x"}, "ranges"),
        ({"slow_rank": 9}, "slow_rank"),
    ):
        with pytest.raises(ValueError, match=word):
            gpu.write_gpu_ep_run(tmp_path / "bad", **bad)
