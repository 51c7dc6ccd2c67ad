"""A truncated trace is not a slow card.

One rank's Kineto file is cut mid-write (the profiler was killed); the ingest salvages its
complete events and marks the source 'truncated'. Kineto writes lane by lane, so the cut leaves a
half-written last step on the main thread and drops every lane written after it whole (a gloo
runloop thread, the device stream). Before the fix, the cut step and the order-numbered
collectives that lost their partners made ep-slow-rank blame the truncated rank as slow-comm
(transfer 160,000x the median on a balanced gloo run) and rank-waits call it a straggler.
"""

from __future__ import annotations

import gzip
import shutil
import sys
import zlib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_kineto  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

REALDATA = Path(__file__).resolve().parents[1].parent / "shared" / "realdata"


def _after_event(text: bytes, at: int) -> int:
    """Byte offset just past the event that contains offset ``at`` (its closing brace)."""
    return text.index(b"\n  }", at) + len(b"\n  }")


def _nth(text: bytes, marker: str, n: int) -> int:
    hits, start = [], 0
    needle = marker.encode()
    while (i := text.find(needle, start)) >= 0:
        hits.append(i)
        start = i + 1
    return hits[n]


# Layers per step: enough layer instances before a cut for ep-slow-rank's sign test (>= 9 at 4
# ranks: a cut in the second step still leaves one whole step).
LAYERS = 12

# Where to cut, as a function of the JSON text: bytes kept. Steps 0..3, layers 0..LAYERS-1.
CUTS = {
    # half the file: for gloo inside the main thread (the later gloo runloop lane is lost whole)
    "mid_file": lambda t: len(t) // 2,
    # the last step has just begun: its decode_step_3 annotation is complete, nothing after it
    "last_step_begins": lambda t: _after_event(t, _nth(t, '"name": "decode_step_3"', 0)),
    # mid-layer: inside the GroupedMatmul annotation of step 3, layer 1
    "mid_late_layer": lambda t: t.index(b'"name": "GroupedMatmul"', _nth(t, '"name": "moe_layer_1"', -1)) + 30,
    # right after the last dispatch's token all-to-all started (its launch written, nothing after)
    "after_dispatch_a2a": lambda t: _after_event(t, _nth(t, '"name": "c10d::alltoall_base_"', -2)),
    # inside the combine of the last layer of the last step
    "in_last_combine": lambda t: _nth(t, '"name": "MoeDistributeCombine"', -1) + 30,
    # near the end, in the last lane written (gloo runloop thread A / the device stream)
    "last_lane": lambda t: len(t) - 3000,
}


@pytest.fixture(scope="module")
def make_run(tmp_path_factory):
    """Write a 4-rank run, cut one rank's file, ingest it; cached per arguments."""
    bases: dict = {}
    cache: dict = {}

    def make(scenario: str, style: str, cut: str | None, rank: int):
        key = (scenario, style, cut, rank)
        if key in cache:
            return cache[key]
        if (scenario, style) not in bases:
            d = tmp_path_factory.mktemp(f"base_{scenario}_{style}")
            synth_kineto.write_ep_run(d, scenario=scenario, style=style, ranks=4, slow_rank=1, steps=4, layers=LAYERS)
            bases[(scenario, style)] = d
        d = tmp_path_factory.mktemp(f"{scenario}_{style}_{cut}_{rank}")
        shutil.copytree(bases[(scenario, style)], d / "trace")
        if cut is not None:
            p = d / "trace" / f"rank{rank}.pt.trace.json.gz"
            synth_kineto.cut_trace(p, CUTS[cut](synth_kineto.trace_text(p)))
        db = d / "run.duckdb"
        report = ingest_paths(db, [d / "trace"], run="r")
        status = {f.rank: f.status for f in report.files}
        assert status == {r: ("truncated" if cut is not None and r == rank else "ok") for r in range(4)}, report.files
        cache[key] = db
        return db

    return make


from test_ep_queries import verdict as run  # noqa: E402  (one way to run a query on a test db)


def sql(db, text, *args):
    con = queries.open_readonly(db)
    try:
        return con.execute(text, list(args)).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("style", ["gloo", "nccl"])
@pytest.mark.parametrize("cut", list(CUTS))
def test_balanced_run_with_a_truncated_rank_passes(make_run, cut, style):
    db = make_run("balanced", style, cut, rank=2)
    res = run(db)
    assert res.status == "PASS", res.summary
    assert res.rows == []
    # not vacuous: layer instances every rank has are still compared (step 0 at least)
    (n_common,) = sql(
        db,
        """SELECT count(*) FROM (SELECT step, layer, occurrence FROM moe_layer_facts
                             WHERE run = 'r' GROUP BY ALL HAVING count(DISTINCT rank) = 4)""",
    )[0]
    assert n_common >= 4
    # the truncated rank keeps no layer instance of the step its cut fell in, or later
    (cut_step, kept_max) = sql(
        db,
        """SELECT c.cut_step, (SELECT max(step) FROM moe_layers WHERE rank = 2)
                                     FROM _layer_cuts c WHERE c.rank = 2""",
    )[0]
    assert kept_max < cut_step
    # and no collective view calls it a straggler
    waits = run(db, "rank-waits")
    assert run(db, "straggler-rank").status == "PASS", waits.summary
    assert all(r["last_pct"] < 50 for r in waits.rows)


def test_the_cuts_hit_the_bug_path(make_run):
    """The gloo cuts in the main lane lose a whole gloo runloop lane: rank 2 has fewer collective
    calls than the others, the case whose order-numbered matching blamed it before."""
    for cut in ("mid_file", "in_last_combine", "after_dispatch_a2a", "last_lane"):
        db = make_run("balanced", "gloo", cut, rank=2)
        calls = dict(
            sql(
                db,
                """SELECT rank, count(*) FROM op_classes
                               WHERE run = 'r' AND op_class = 'collective' GROUP BY rank""",
            )
        )
        assert calls[2] < calls[0] == calls[1] == calls[3], (cut, calls)
        # rank 2's calls are left out of the matching, the other ranks are matched among themselves
        matched = dict(sql(db, "SELECT rank, count(*) FROM collective_waits WHERE run = 'r' GROUP BY rank"))
        assert 2 not in matched and matched[0] == matched[1] == matched[3] == calls[0], (cut, matched)


def test_nccl_seq_numbered_calls_of_a_truncated_rank_still_match(make_run):
    """NCCL kernels carry Seq: a cut in the device stream only unmatches the lost calls."""
    db = make_run("balanced", "nccl", "last_lane", rank=2)
    matched = dict(sql(db, "SELECT rank, count(*) FROM collective_waits WHERE run = 'r' GROUP BY rank"))
    total = sql(
        db,
        """SELECT count(*) FROM op_classes WHERE run = 'r' AND rank = 0
                       AND op_class = 'collective' AND on_device""",
    )[0][0]
    assert set(matched) == {0, 1, 2, 3}
    assert 0 < matched[2] == matched[0] < total


@pytest.mark.parametrize("style", ["gloo", "nccl"])
@pytest.mark.parametrize("cut", ["mid_file", "in_last_combine", "last_lane"])
def test_token_skew_is_still_named_when_another_rank_is_truncated(make_run, cut, style):
    db = make_run("token_skew", style, cut, rank=3)
    res = run(db)
    assert res.status == "FAIL", res.summary
    assert [(r["rank"], r["cause"]) for r in res.rows] == [(1, "token-skew")]
    # the finding says why fewer layer instances were compared
    (cut_step,) = sql(db, "SELECT cut_step FROM _layer_cuts WHERE rank = 3")[0]
    note = f"; rank 3's trace is truncated: steps >= {cut_step} left out"
    if sql(db, "SELECT count(*) FROM _layer_collectives WHERE rank = 3")[0][0] == 0:
        note += ", its collectives with the cut (whether the others waited for it not measured)"
    assert res.rows[0]["left_out"] == note
    assert note + "); next:" in res.summary
    assert res.rows[0]["layer_instances"] == LAYERS * cut_step


@pytest.mark.parametrize("style", ["gloo", "nccl"])
@pytest.mark.parametrize("cut", list(CUTS))
def test_the_slow_card_itself_truncated_is_still_named(make_run, cut, style):
    """The skewed rank's own file is cut: its comm lane (gloo runloop thread, device stream) is
    written after the main thread and usually lost whole, so whether the others waited for it
    cannot be seen. It is judged on tokens and GroupedMatmul over its complete steps, and the
    finding says the wait was not measured (ep-slow-rank v2 returned PASS here)."""
    db = make_run("token_skew", style, cut, rank=1)
    res = run(db)
    assert res.status == "FAIL", res.summary
    assert [(r["rank"], r["cause"]) for r in res.rows] == [(1, "token-skew")]
    row = res.rows[0]
    assert row["token_ratio"] > 10 and row["gmm_ratio"] > 5
    (cut_step,) = sql(db, "SELECT cut_step FROM _layer_cuts WHERE rank = 1")[0]
    assert row["layer_instances"] == LAYERS * cut_step
    lost_comm = sql(db, "SELECT count(*) FROM _layer_collectives WHERE rank = 1")[0][0] == 0
    assert row["left_out"].startswith(f"; rank 1's trace is truncated: steps >= {cut_step} left out")
    assert ("whether the others waited for it not measured" in row["left_out"]) is lost_comm


@pytest.mark.parametrize("style", ["gloo", "nccl"])
def test_a_truncated_slow_device_is_slow_compute_not_routing(make_run, style):
    db = make_run("slow_compute", style, "mid_late_layer", rank=1)
    res = run(db)
    assert [(r["rank"], r["cause"]) for r in res.rows] == [(1, "slow-compute")], res.summary


def test_untruncated_run_says_nothing_left_out(make_run):
    db = make_run("token_skew", "gloo", None, rank=3)
    res = run(db)
    assert [(r["rank"], r["cause"]) for r in res.rows] == [(1, "token-skew")]
    assert res.rows[0]["left_out"] == "" and "truncated" not in res.summary
    assert res.rows[0]["layer_instances"] == 4 * LAYERS


def test_cut_trace_leaves_a_gzip_stream_without_its_end(tmp_path):
    p = synth_kineto.write_ep_run(tmp_path, ranks=2, steps=1, layers=1)[0]
    text = synth_kineto.trace_text(p)
    assert synth_kineto.cut_trace(p, 1000) == 1000
    with pytest.raises(EOFError):  # the stream stops before its end marker
        gzip.decompress(p.read_bytes())
    assert zlib.decompressobj(31).decompress(p.read_bytes()) == text[:1000]
    with pytest.raises(ValueError, match="nothing would be cut"):
        synth_kineto.cut_trace(p, 5000)


@pytest.fixture(scope="module")
def real_truncated(tmp_path_factory):
    """The real 4-rank run (rank 1 hot) with rank 2's file cut at four fifths (written to tmp, not kept):
    3 of its 4 steps stay, 12 layer instances, enough for ep-slow-rank's sign test (a cut in half
    leaves 4, too few: SKIP)."""
    src = REALDATA / "kineto_cpu_ep4_hot1"
    if not src.is_dir():
        pytest.skip(f"{src} is absent (../shared/realdata not beside the checkout)")
    d = tmp_path_factory.mktemp("real_cut")
    (d / "trace").mkdir()
    for p in sorted(src.iterdir()):
        if p.name.startswith("rank2."):  # plain JSON, cut at 4/5
            text = gzip.decompress(p.read_bytes())
            (d / "trace" / p.name.removesuffix(".gz")).write_bytes(text[: len(text) * 4 // 5])
        else:
            shutil.copyfile(p, d / "trace" / p.name)
    db = d / "ep.duckdb"
    report = ingest_paths(db, [d / "trace"], run="real")
    assert {f.rank: f.status for f in report.files} == {0: "ok", 1: "ok", 2: "truncated", 3: "ok"}
    return db


def test_real_run_with_a_truncated_rank_still_names_rank_1(real_truncated):
    res = run(real_truncated, run="real")
    assert res.status == "FAIL", res.summary
    assert [(r["rank"], r["cause"]) for r in res.rows] == [(1, "token-skew")]
    assert "rank 2's trace is truncated" in res.rows[0]["left_out"]
    waits = run(real_truncated, "rank-waits", run="real")
    assert {r["rank"] for r in waits.rows} == {0, 1, 3}
