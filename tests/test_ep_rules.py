"""ep-slow-rank's rules put exactly on their edges, with the lock-step simulator (exact timings):
the sign test's significance edge, waits as evidence rather than a gate, the cost (what-if) and
the level it decides, SKIP on too little data, collectives outside a MoE layer, and the advice
per cause."""

from __future__ import annotations

import math
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


def _skewed_in_first(k: int, layers: int = 4):
    """Rank 1 receives 2x the tokens (and takes 2x GroupedMatmul) in the first k layer instances
    (in step-major order) only."""

    def cells(rank, step, layer):
        if rank == 1 and step * layers + layer < k:
            return ls.Cell(tokens=2 * ls.TOKENS, gmm_us=2 * ls.GMM_US)
        return ls.Cell()

    return cells


def _binom_tail(k: int, n: int) -> float:
    return sum(math.comb(n, j) for j in range(k, n + 1)) / 2**n


def test_how_much_names_a_pattern_in_exactly_the_instances_it_needs(tmp_path):
    """4 ranks, 16 layer instances, Holm's first level alpha / 4 = 0.0025. Rank 1 is above the
    others by the same amount in k instances and equal elsewhere. How often (the sign test) sees
    chance: P(Bin(16, 1/2) >= 5) = 0.96. How much: under the permutation null the excess of each
    such instance lands on rank 1 with chance 1/4, so the exact tail of its summed excess is
    4^-k whatever the amount; at k = 5, p = 2 x 4^-5 = 0.00195: a slow card that v7 could not see.
    (v8's normal tail of the same sum said 2 P(Z >= sqrt(3k)): 0.00053 at k = 4, where the exact
    p is 0.0078.)"""
    db = _db(tmp_path, _skewed_in_first(5))
    res = _query(db)
    assert res.status == "FAIL", res.summary
    assert _binom_tail(5, 16) > 0.9
    assert [(r["rank"], r["cause"], r["level"], r["layer_instances"], r["above_pct"]) for r in res.rows] == [
        (1, "token-skew", "FAIL", 16, 31.3)
    ]
    assert res.rows[0]["p_value"] == round(2 * 4.0**-5, 6)
    # a budget just under the p-value it observes, and the same run passes
    assert _query(db, alpha=4 * 2 * 4.0**-5 * 0.99).status == "PASS"


def test_one_instance_fewer_is_chance(tmp_path):
    """4 of 16: p = 2 x 4^-4 = 0.0078 > 0.0025, what chance gives often enough over 4 ranks (v8's
    normal tail named it at 0.00053)."""
    db = _db(tmp_path, _skewed_in_first(4))
    res = _query(db)
    assert res.status == "PASS", res.rows
    assert 2 * 4.0**-4 > 0.01 / 4


def test_how_often_still_names_a_rank_above_in_every_instance(tmp_path):
    """A rank above in every one of 16 instances: the sign test gives 0.5^16, the permutation
    test 4^-16 (the rank on top in every instance: the edge of the null's support, where the
    saddlepoint is capped by the Chernoff bound); the reported p is the smaller one, doubled."""
    db = _db(tmp_path, _skewed_in_first(16))
    (row,) = _query(db).rows
    assert (row["rank"], row["above_pct"]) == (1, 100.0)
    assert row["p_value"] == round(2 * min(0.5**16, 4.0**-16), 6)


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


def test_a_heavy_rank_is_named_even_when_it_waits_like_the_others(tmp_path):
    """Waits are evidence, not a gate (issue 13: under host noise the hot rank does not arrive
    last). Rank 1 has 1.6x the tokens and GroupedMatmul, but waits for rank 2's host delay at
    every collective and never arrives last: still the token-skew card, and the row shows it
    never arrived last. Rank 2, late but with the same work, is not a slow card."""
    db = _db(tmp_path, _heavy_rank_behind_a_slower_one(2000.0))
    waits = {r["rank"]: r for r in _query(db, "rank-waits").rows}
    assert waits[1]["mean_arrival_lag_us"] > 0  # rank 1 does wait
    res = _query(db)
    assert [(r["rank"], r["cause"]) for r in res.rows] == [(1, "token-skew")], res.rows
    assert res.rows[0]["last_arrival_pct"] == 0.0 and res.rows[0]["others_wait_ms"] == 0.0


def test_cost_is_what_the_fix_saves_and_decides_the_level(tmp_path):
    """Lock-step: every layer takes 5 + GATE + TRANSFER + 5 + 1.6 GMM + TRANSFER + 5 us and the
    steps 4 x (layer + 20 us); rank 1's GroupedMatmul is 0.6 GMM above the others' in each of 16
    instances, so it arrives 600 us after everyone else at each combine, and the replay of the
    synchronisation with rank 1 at its peers' median saves 16 x 600 us of the profiled time.
    FAIL at the default 5 %; WARN when the bar is set just above its cost."""
    db = _db(tmp_path, _heavy_rank_behind_a_slower_one(0.0))
    res = _query(db)
    row = res.rows[0]
    layer_us = 5 + ls.GATE_US + ls.TRANSFER_US + 5 + 1.6 * ls.GMM_US + ls.TRANSFER_US + 5
    profiled_us = 16 * (layer_us + 20)
    cost_pct = round(100 * 16 * 0.6 * ls.GMM_US / profiled_us, 1)
    assert (row["rank"], row["cause"], row["level"], row["saving_basis"]) == (1, "token-skew", "FAIL", "replay")
    assert row["cost_ms"] == pytest.approx(16 * 0.6 * ls.GMM_US / 1e3, abs=1e-3)
    assert row["profiled_ms"] == pytest.approx(profiled_us / 1e3, abs=1e-3)
    assert row["cost_pct"] == cost_pct
    assert f"its fix saves {row['cost_ms']:.3g} ms = {cost_pct:.3g}% of the profiled time" in res.summary
    assert _query(db, min_cost_pct=cost_pct).status == "FAIL"
    cheap = _query(db, min_cost_pct=cost_pct + 0.1)
    assert cheap.status == "WARN" and [r["level"] for r in cheap.rows] == ["WARN"]


@pytest.mark.parametrize(
    "ranks,steps,layers,why",
    [
        (1, 4, 4, "1 rank(s) with MoE layers in this run"),
        (2, 4, 4, "2 rank(s) with MoE layers in this run"),
        (4, 1, 8, "8 MoE layer instance(s) that all 4 ranks have; the sign test at alpha 0.01 needs >= 9"),
    ],
)
def test_too_little_data_is_a_skip_with_the_reason(tmp_path, ranks, steps, layers, why):
    """One rank can neither pass nor fail; two have no median rank; 8 instances at 4 ranks cannot
    reach p <= 0.01 / 4 even if rank 1 is above the median in all of them (0.5^8 = 0.0039)."""
    db = _db(tmp_path, _skewed_in_first(64, layers=layers), ranks=ranks, steps=steps, layers=layers)
    res = _query(db)
    assert res.status == "SKIP" and why in res.summary, res.summary
    assert [r["level"] for r in res.rows] == ["SKIP"]


def test_just_enough_instances_are_judged(tmp_path):
    """9 instances at 4 ranks: 0.5^9 = 0.00195 <= 0.0025, so the run is judged (rank 1 named)."""
    db = _db(tmp_path, _skewed_in_first(64, layers=9), steps=1, layers=9)
    res = _query(db)
    assert [(r["rank"], r["cause"]) for r in res.rows] == [(1, "token-skew")], res.summary


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
    assert (
        [(r["rank"], r["cause"]) for r in a.rows] == [(r["rank"], r["cause"]) for r in b.rows] == [(1, "slow-compute")]
    )
    assert a.rows[0]["last_arrival_pct"] == b.rows[0]["last_arrival_pct"]


# The advice of each cause, and words that must not appear in it (a slow device is never sent
# to rebalance experts; a routing skew is never sent to check links).
ADVICE = {
    "token-skew": ("expert placement", ("device or process anomaly", "links")),
    "slow-compute": ("device or process anomaly", ("rebalance or add", "links and NIC")),
    "slow-comm": ("links and NIC", ("rebalance or add", "device or process anomaly")),
}


@pytest.mark.parametrize(
    "cause,cells",
    [
        ("token-skew", lambda r, s, l: ls.Cell(tokens=3 * ls.TOKENS, gmm_us=3 * ls.GMM_US) if r == 1 else ls.Cell()),
        ("slow-compute", lambda r, s, l: ls.Cell(gmm_us=3 * ls.GMM_US) if r == 1 else ls.Cell()),
    ],
)
def test_next_step_advice_follows_the_cause(tmp_path, cause, cells):
    res = _query(_db(tmp_path, cells))
    assert [(r["rank"], r["cause"]) for r in res.rows] == [(1, cause)]
    want, never = ADVICE[cause]
    advice = res.rows[0]["next_step"]
    assert want in advice and not any(w in advice for w in never), advice
    assert want in res.summary
