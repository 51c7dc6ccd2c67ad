"""ep-slow-rank's rules put exactly on their edges, with the lock-step simulator (exact timings):
the persistence gate, the "the rank itself hardly waits" condition, collectives outside a MoE
layer, and the advice per cause."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import ep_lockstep as ls  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

CATALOG = queries.load_catalog()


def _db(tmp_path, cells, **kw):
    paths = ls.write_run(tmp_path / "trace", cells, **kw)
    db = tmp_path / "run.duckdb"
    rep = ingest_paths(db, [str(p) for p in paths], run="r")
    assert all(f.status == "ok" for f in rep.files), [(f.path, f.message) for f in rep.files]
    return db


def _query(db, name="ep-slow-rank", **params):
    con = queries.open_readonly(db)
    try:
        return queries.run_query(con, CATALOG[name], "r", params)
    finally:
        con.close()


def _skewed_in_first_steps(n_steps: int):
    """Rank 1 receives 2x the tokens (and takes 2x GroupedMatmul) in steps < n_steps only."""
    def cells(rank, step, layer):
        if rank == 1 and step < n_steps:
            return ls.Cell(tokens=2 * ls.TOKENS, gmm_us=2 * ls.GMM_US)
        return ls.Cell()
    return cells


def test_persistence_gate_counts_a_pattern_in_exactly_the_minimum_share(tmp_path):
    """2 of 4 steps = 8 of 16 layer instances = exactly min_persist_share (0.5): a slow card."""
    db = _db(tmp_path, _skewed_in_first_steps(2))
    res = _query(db)
    assert res.status == "FAIL", res.summary
    assert [(r["rank"], r["cause"], r["persist_pct"], r["layer_instances"]) for r in res.rows] == [
        (1, "token-skew", 50.0, 16)]
    # just above the share it observes, the same run passes
    assert _query(db, min_persist_share=0.51).status == "PASS"


def test_below_the_persistence_share_is_not_a_slow_card(tmp_path):
    db = _db(tmp_path, _skewed_in_first_steps(1))      # 4 of 16 instances
    res = _query(db)
    assert res.status == "PASS", res.rows


def _heavy_rank_behind_a_slower_one(delay_us: float):
    """Rank 1: 1.6x tokens and GroupedMatmul in every instance. Rank 2: same work, but arrives
    delay_us late at both all-to-alls (host delay), so with a large delay everyone, rank 1
    included, waits for rank 2."""
    def cells(rank, step, layer):
        if rank == 1:
            return ls.Cell(tokens=int(1.6 * ls.TOKENS), gmm_us=1.6 * ls.GMM_US)
        if rank == 2:
            return ls.Cell(pre_dispatch_us=delay_us, pre_combine_us=delay_us)
        return ls.Cell()
    return cells


def test_a_rank_that_waits_like_the_others_is_not_the_one_they_wait_for(tmp_path):
    """The rule's 'the others wait for it' needs the rank itself to wait under half the median
    rank's wait. Rank 1 has more tokens, but it waits for rank 2 about as long as the median
    rank does (0.9x): the others are not waiting for rank 1, so it is not named."""
    db = _db(tmp_path, _heavy_rank_behind_a_slower_one(2000.0))
    waits = {r["rank"]: r for r in _query(db, "rank-waits").rows}
    lag = {r: w["mean_arrival_lag_us"] for r, w in waits.items()}
    med = sorted(lag.values())[len(lag) // 2 - 1: len(lag) // 2 + 1]
    assert 0.6 * (sum(med) / 2) < lag[1] < 1.0 * (sum(med) / 2)      # the scenario is on the edge
    res = _query(db)
    assert 1 not in [r["rank"] for r in res.rows], res.rows
    assert res.status == "PASS", res.rows


def test_the_same_heavy_rank_is_named_when_the_others_wait_for_it(tmp_path):
    """Control for the test above: without rank 2's delay, rank 1 is the token-skew card."""
    db = _db(tmp_path, _heavy_rank_behind_a_slower_one(0.0))
    res = _query(db)
    assert [(r["rank"], r["cause"]) for r in res.rows] == [(1, "token-skew")]


def test_a_collective_after_a_layer_is_not_counted_in_it(tmp_path):
    """One all-to-all runs between two layers (arriving in reverse rank order): the per-layer
    collective facts hold the dispatch and combine only, and the verdict is unchanged."""
    def cells(rank, step, layer):
        return ls.Cell(gmm_us=2 * ls.GMM_US) if rank == 1 else ls.Cell()

    with_extra = _db(tmp_path / "a", cells, after_layer_collective=True)
    without = _db(tmp_path / "b", cells)
    heat = _query(with_extra, "wait-heatmap").rows
    assert heat and {r["n_collectives"] for r in heat} == {2}
    # rank 0 arrives last at every between-layer call: counted in the layer it would look late
    assert {r["n_arrived_last"] for r in heat if r["rank"] == 0} == {0}
    a, b = _query(with_extra), _query(without)
    assert [(r["rank"], r["cause"]) for r in a.rows] == [(r["rank"], r["cause"]) for r in b.rows] == [
        (1, "slow-compute")]
    assert a.rows[0]["last_arrival_pct"] == b.rows[0]["last_arrival_pct"]


# The advice of each cause, and words that must not appear in it (a slow device is never sent
# to rebalance experts; a routing skew is never sent to check links).
ADVICE = {
    "token-skew": ("expert placement", ("device or process anomaly", "links")),
    "slow-compute": ("device or process anomaly", ("rebalance or add", "links and NIC")),
    "slow-comm": ("links and NIC", ("rebalance or add", "device or process anomaly")),
}


@pytest.mark.parametrize("cause,cells", [
    ("token-skew", lambda r, s, l: ls.Cell(tokens=3 * ls.TOKENS, gmm_us=3 * ls.GMM_US) if r == 1 else ls.Cell()),
    ("slow-compute", lambda r, s, l: ls.Cell(gmm_us=3 * ls.GMM_US) if r == 1 else ls.Cell()),
])
def test_next_step_advice_follows_the_cause(tmp_path, cause, cells):
    res = _query(_db(tmp_path, cells))
    assert [(r["rank"], r["cause"]) for r in res.rows] == [(1, cause)]
    want, never = ADVICE[cause]
    advice = res.rows[0]["next_step"]
    assert want in advice and not any(w in advice for w in never), advice
    assert want in res.summary
