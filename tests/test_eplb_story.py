"""One run, one story: ep-slow-rank, ep-hot-chain, expert-hotspots and eplb-whatif agree (issue 13).

The slow rank ep-slow-rank names for token skew is the rank ep-hot-chain and expert-hotspots tie
the hot expert to, and eplb-whatif proposes an option that cuts that rank's load: a re-placement
when the hot experts fit in a rank's fair share, replicas when one expert outweighs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_experts  # noqa: E402
import synth_kineto  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

CATALOG = queries.load_catalog()
STORY = ("ep-slow-rank", "ep-hot-chain", "expert-hotspots", "eplb-whatif")
TESTDATA = Path(__file__).resolve().parent.parent / "testdata"


def results(db: Path, run: str) -> dict:
    con = queries.open_readonly(db)
    try:
        return {q: queries.run_query(con, CATALOG[q], run) for q in STORY}
    finally:
        con.close()


def slow_token_rank(res: dict) -> int:
    slow = res["ep-slow-rank"]
    assert slow.status == "FAIL", slow.summary
    (row,) = [r for r in slow.rows if r["level"] == "FAIL"]
    assert row["cause"] == "token-skew"
    return row["rank"]


def check_story(res: dict) -> tuple[int, dict]:
    """The four verdicts agree on the rank; returns it and eplb-whatif's overall rows by option."""
    rank = slow_token_rank(res)
    chain = res["ep-hot-chain"]
    assert chain.status == "FAIL", chain.summary
    assert [r["rank"] for r in chain.rows if r["coincide"]] == [rank]
    hot = res["expert-hotspots"]
    assert hot.status == "FAIL", hot.summary
    flagged = [r for r in hot.rows if r["concentrated_hot_spot"]]
    assert flagged and {r["ep_rank"] for r in flagged} == {rank}
    # the experts ep-hot-chain lists are the ones expert-hotspots flags
    for r in flagged:
        assert (
            f"L{r['layer']}/E{r['expert']} " in chain.rows[0]["hot_experts"] or "more)" in chain.rows[0]["hot_experts"]
        )
    whatif = res["eplb-whatif"]
    assert whatif.status == "WARN", whatif.summary
    overall = {r["option"]: r for r in whatif.rows if r["scope"] == "overall"}
    assert all(r["peak_rank"] == rank for r in overall.values())
    assert any(r["worth_rebalancing"] and r["saved_share"] > 0 for r in overall.values())
    return rank, overall


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    d = tmp_path_factory.mktemp("story")
    path = d / "story.duckdb"
    for run, experts, rank in (("one_hot", "one_hot", 3), ("concentrated", "concentrated", 1)):
        synth_experts.write_scenario(experts, d / run / "experts")
        synth_kineto.write_ep_run(d / run / "trace", scenario="token_skew", slow_rank=rank, steps=4, layers=4)
        rep = ingest_paths(path, [d / run], run=run)
        assert all(f.status == "ok" for f in rep.files), [(f.path, f.message) for f in rep.files]
    return path


def test_one_hot_expert_story_ends_in_replicas(db):
    """Expert 13 at 5.6x the mean on rank 3: all four name rank 3; moving cannot help, replicas can."""
    res = results(db, "one_hot")
    rank, overall = check_story(res)
    assert rank == 3
    assert "/E13 " in res["ep-hot-chain"].rows[0]["hot_experts"]
    top = res["expert-hotspots"].rows[0]
    assert top["expert"] == 13 and top["outweighs_rank"] and "replicate it" in top["next_step"]
    assert not overall["re-place"]["worth_rebalancing"] and "cannot" in overall["re-place"]["cause"]
    assert overall["replicate"]["worth_rebalancing"] and "/E13 x" in overall["replicate"]["replicas"]


def test_fitting_hot_experts_story_ends_in_a_re_placement(db):
    """Experts 4 and 5 at 2.9x on rank 1: each fits in a rank's share, a re-placement pays."""
    res = results(db, "concentrated")
    rank, overall = check_story(res)
    assert rank == 1
    assert not any(r["outweighs_rank"] for r in res["expert-hotspots"].rows)
    assert "spread the hot experts" in res["expert-hotspots"].rows[0]["next_step"]
    assert overall["re-place"]["worth_rebalancing"] and "re-balancing pays" in overall["re-place"]["cause"]


def check_trace_only_run(folder: Path, tmp_path: Path) -> None:
    """A traced run: ep-slow-rank names a token-skew rank; with expert-load data the other three
    agree on it, without it they SKIP saying what is missing (never a contradicting PASS)."""
    db = tmp_path / "run.duckdb"
    rep = ingest_paths(db, [folder], run="r")
    assert all(f.status == "ok" for f in rep.files), [(f.path, f.message) for f in rep.files]
    res = results(db, "r")
    con = queries.open_readonly(db)
    try:
        has_load = con.execute("SELECT count(*) FROM expert_load WHERE run = 'r'").fetchone()[0] > 0
    finally:
        con.close()
    if has_load:
        check_story(res)
        return
    slow_token_rank(res)
    for q in ("ep-hot-chain", "expert-hotspots", "eplb-whatif"):
        assert res[q].status == "SKIP" and "expert_load" in res[q].summary, (q, res[q].summary)


def test_committed_example_tells_one_story(tmp_path):
    check_trace_only_run(TESTDATA / "ep4_token_skew", tmp_path)


def test_real_hot1_run_tells_one_story(realdata, tmp_path):
    folder = realdata / "kineto_cpu_ep4_hot1"
    if not folder.is_dir():
        pytest.skip(f"{folder} not found")
    check_trace_only_run(folder, tmp_path)
