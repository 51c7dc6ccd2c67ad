"""why-straggler v4 on device lanes (issue 42 item 4): a stream's own gaps beside the device's,
and Ascend operator CSV rows as op items.

Runs from tests/synth_device_straggler.py (exact timings plus a 2 % seeded jitter):
- GPU, two streams: rank 2's host launches its first compute kernel after each all-reduce late
  (it starts 147 us after its peers') while an all-gather of another group runs on the
  communication stream (the compute stream starves, the device is busy); the same without the
  all-gather (the whole device idles);
  no delay; a 10 us delay (its first kernel 7 us late, ~2 % of a segment: below the 5 % lateness
  bar).
- Ascend kernel_details.csv per rank: rank 1's MatMulV2 1.6x; alike; 1.05x; the same slow and
  alike runs as Ascend timelines (trace_view.json, no operator CSV).
Plus the real 2-rank MindStudio Insight output (what it can and cannot show).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_device_straggler as sd  # noqa: E402
from conftest import ingest_ok, run_builtin  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

CATALOG = queries.load_catalog()

GPU_RUNS = {
    "starved": {},
    "no_overlap": {"overlap": False},
    "even": {"delay_us": 0.0},
    "delay_10us": {"delay_us": 10.0},
}
ASCEND_RUNS = {
    "asc_slow": {},
    "asc_even": {"factor": 1.0},
    "asc_105": {"factor": 1.05},
    "tl_slow": {"timeline": True},
    "tl_even": {"timeline": True, "factor": 1.0},
}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    d = tmp_path_factory.mktemp("device_straggler")
    path = d / "d.duckdb"
    for run, kw in GPU_RUNS.items():
        sd.write_gpu_run(d / run, **kw)
    for run, kw in ASCEND_RUNS.items():
        sd.write_ascend_run(d / run, **kw)
    for run in (*GPU_RUNS, *ASCEND_RUNS):
        ingest_ok(path, [d / run], run, skipped_ok=True)
    return path


def rows(db, run, **params):
    return run_builtin(db, "why-straggler", run, params).rows


def test_a_starved_compute_stream_is_named_as_its_own_gap(db):
    rs = rows(db, "starved", top_n=10)
    assert {r["rank"] for r in rs} == {2}, rs
    top = rs[0]
    assert (top["item_kind"], top["item"]) == ("gap", "stream 7 idle")
    assert top["cause"] == "stream 7 idle" and top["share_pct"] >= 80 and top["ratio"] > 5
    assert "this stream idles" in top["reading"] and "why-host-device" in top["reading"]
    # 11 segments, its first kernel 147 us later than its peers' in each
    assert top["excess_us"] == pytest.approx(11 * 147, rel=0.03)
    # the device as a whole is busy (the all-gather on stream 20): its gap carries little
    union = next(r for r in rs if r["item"] == "device idle (no kernel on any stream)")
    assert union["share_pct"] < 10
    # stream 20 idles as long (the segment is longer) but at a far lower ratio: not named
    comm = next(r for r in rs if r["item"] == "stream 20 idle")
    assert comm["ratio"] < top["ratio"] / 2
    # the kernels run at the peers' pace
    assert all(0.9 < r["ratio"] < 1.1 for r in rs if r["item_kind"] == "kernel")


def test_the_whole_device_idle_is_the_device_gap_not_a_stream(db):
    """Near miss of the stream's name: without the overlapped all-gather, the same late launch
    leaves the whole device idle; the stream's gap is then the device's, and the device's is named."""
    rs = rows(db, "no_overlap", top_n=10)
    top = rs[0]
    assert (top["rank"], top["item"], top["cause"]) == (2, "device idle (no kernel on any stream)", top["item"])
    assert top["ratio"] > 5 and top["share_pct"] >= 80
    s7 = next(r for r in rs if r["item"] == "stream 7 idle")
    assert s7["ratio"] == top["ratio"]  # idle exactly when the device is


@pytest.mark.parametrize("run", ["even", "delay_10us"])
def test_gpu_balanced_and_near_miss_name_nothing(db, run):
    assert rows(db, run) == []


def test_gpu_near_miss_is_held_by_the_lateness_bar(db):
    # with the bar at 1 % the 10 us delay is reported, its lateness in the streams' gaps (at
    # 10 us the 2 % jitter of the kernels, ~7 us a segment, blurs which stream is named)
    rs = rows(db, "delay_10us", min_late_pct=1.0, top_n=10)
    assert rs and {r["rank"] for r in rs} == {2}
    s7 = next(r for r in rs if r["item"] == "stream 7 idle")
    assert s7["share_pct"] >= 80 and s7["ratio"] >= 1.3


def test_ascend_slow_op_type_is_named_with_ratio_and_share(db):
    rs = rows(db, "asc_slow", top_n=10)
    assert {r["rank"] for r in rs} == {1}, rs
    top = rs[0]
    assert (top["item_kind"], top["item"]) == ("op", "MatMulV2")  # the op type, not the aclnn name
    assert 1.5 <= top["ratio"] <= 1.7 and top["share_pct"] >= 80 and top["cause"] == "MatMulV2"
    assert "operator CSV rows" in top["items_from"], top["items_from"]
    assert top["reading"].startswith("the same ops run longer on this device"), top["reading"]
    assert not any(r["item"] == "FlashAttentionScore" for r in rs)  # normal on the slow rank
    # the device never idles longer than its peers: the op is slow, not its launch
    assert all(r["share_pct"] < 5 for r in rs if r["item_kind"] == "gap")


@pytest.mark.parametrize("run", ["asc_even", "asc_105"])
def test_ascend_balanced_and_near_miss_name_nothing(db, run):
    assert rows(db, run) == []


def test_ascend_near_miss_below_the_ratio_names_no_cause(db):
    # the 1.05x MatMulV2 reported with the bar at 0.5 %: it carries the lateness but at 1.05x
    # (< min_ratio 1.1) is not named the cause
    rs = rows(db, "asc_105", min_late_pct=0.5)
    assert rs and rs[0]["item"] == "MatMulV2" and 1.02 <= rs[0]["ratio"] <= 1.08
    assert rs[0]["cause"] == "straggler"


def test_real_ascend_ranks_form_one_segment_with_no_op_in_it(realdata, tmp_path):
    """MindStudio Insight's 2 real Ascend ranks (kernel_details with HCCL rows): their
    collectives match (broadcasts, an all-reduce, an all-gather) but only one segment has every
    rank after an earlier collective of its kind, and no op runs in it: the rows are gaps only."""
    root = realdata / "thirdparty" / "msinsight" / "test_data"
    path = tmp_path / "m.duckdb"
    ingest_paths(path, [root / "test_rank_0", root / "test_rank_1"], run="ms")
    rs = rows(path, "ms")
    assert rs and {r["segments"] for r in rs} == {1}
    assert {r["item_kind"] for r in rs} == {"gap"}


def test_ascend_timeline_slow_task_is_named_from_its_device_tasks(db):
    """A rank whose collectives come from its trace_view.json (hcom_* on HCCL): the segments are
    device times and the items its Ascend Hardware tasks, not its host's Python ops (which run
    40 us earlier) nor Overlap Analysis' Computing / Free ranges."""
    rs = rows(db, "tl_slow", top_n=10)
    assert {r["rank"] for r in rs} == {1}, rs
    top = rs[0]
    assert (top["item_kind"], top["item"]) == ("kernel", "aclnnMatmul_MatMulCommon_MatMulV2")
    assert 1.5 <= top["ratio"] <= 1.7 and top["share_pct"] >= 80 and top["cause"] == top["item"]
    assert "Ascend timeline" in top["items_from"], top["items_from"]
    # every item read (any rank) is a device task or a gap: no host op, no Overlap Analysis range
    assert top["items_from"].startswith("no nn.Module ranges in this trace: items are kernel, gap ("), top["items_from"]


def test_ascend_timeline_collectives_are_matched(db):
    """The hcom_* ops of a timeline have no category: op_classes keeps them as collectives (a NULL
    category once made them vanish, and their on_device NULL), so every rank's 12 all-reduces match."""
    con = queries.open_readonly(db)
    try:
        got = con.execute(
            "SELECT count(DISTINCT w.rank), count(DISTINCT w.instance), bool_and(NOT c.on_device) "
            "FROM collective_waits w JOIN op_classes c USING (run, source_id, name) WHERE run = 'tl_slow'"
        ).fetchone()
    finally:
        con.close()
    assert got == (4, 12, True)


def test_ascend_timeline_balanced_names_nothing(db):
    assert rows(db, "tl_even") == []
