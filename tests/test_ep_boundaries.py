"""ep-slow-rank's boundaries that decide an answer, each put exactly where a one-line mistake
would flip it (issue 48: three whole-suite survivors of an independent mutation audit):

- a group of exactly ``min_ranks`` ranks is judged (a ``>`` for ``>=`` read 3 ranks as too few);
- the significance level divides alpha by the ranks TESTED, not by the size of the largest EP
  group (v8: Holm's first level; a p between alpha / 4 and alpha / 8 must stay quiet with two EP
  groups of 4);
- the transfer cost's trimmed mean cuts the TOP instance too: one stalled all-to-all must not
  double a slow link's cost.

Runs come from the lock-step simulator (exact timings), so every number is known."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import ep_lockstep as ls  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

CATALOG = queries.load_catalog()


def _judge(tmp_path: Path, cells, files=(), alpha=None, **kw):
    paths = ls.write_run(tmp_path / "trace", cells, **kw)
    db = tmp_path / "run.duckdb"
    rep = ingest_paths(db, [*map(str, paths), *map(str, files)], run="r")
    assert all(f.status == "ok" for f in rep.files), [(f.path, f.message) for f in rep.files]
    con = queries.open_readonly(db)
    try:
        return queries.run_query(con, CATALOG["ep-slow-rank"], "r", {} if alpha is None else {"alpha": alpha})
    finally:
        con.close()


def _binom_tail(k: int, n: int) -> float:
    return sum(math.comb(n, j) for j in range(k, n + 1)) / 2**n


def test_a_slow_rank_among_exactly_min_ranks_ranks_is_named(tmp_path):
    """3 ranks (min_ranks = 3), rank 1 at 2x GroupedMatmul with the same tokens in every one of 16
    instances: p = 0.5^16, far below alpha / 3. Judged and named slow-compute, not PASS."""
    res = _judge(tmp_path, lambda r, s, layer: ls.Cell(gmm_us=2 * ls.GMM_US if r == 1 else ls.GMM_US), ranks=3)
    assert res.params["min_ranks"] == 3
    assert [(r["rank"], r["cause"], r["level"]) for r in res.rows] == [(1, "slow-compute", "FAIL")], res.summary
    # the near miss: 2 ranks are too few to have a median rank to compare with
    res2 = _judge(tmp_path / "two", lambda r, s, layer: ls.Cell(gmm_us=2 * ls.GMM_US if r == 1 else ls.GMM_US), ranks=2)
    assert res2.status == "SKIP" and "2 rank(s)" in res2.summary


def _two_groups_of_four(tmp_path: Path, above: int, **params):
    """8 ranks in EP groups 0-3 and 4-7 (a groups file); rank 1 at 1.15x GroupedMatmul in the first
    ``above`` of 16 instances (step-major), equal elsewhere."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    groups = tmp_path / "groups.json"
    groups.write_text(
        json.dumps({"parallel_groups": [{"kind": "ep", "ranks": [0, 1, 2, 3]}, {"kind": "ep", "ranks": [4, 5, 6, 7]}]})
    )

    def cells(rank, step, layer):
        slow = rank == 1 and step * 4 + layer < above
        return ls.Cell(gmm_us=1150.0 if slow else ls.GMM_US)

    return _judge(tmp_path, cells, files=[groups], ranks=8, **params)


def test_the_level_divides_alpha_by_the_ranks_tested_not_by_the_largest_group(tmp_path):
    """Above in 5 of 16 instances of its group of 4 (the others equal): how much gives the exact
    permutation tail p = 2 x 4^-5 = 0.00195 (test_ep_rules), between Holm's first level over the 8
    ranks tested, alpha / 8, and the size of one EP group, alpha / 4, at alpha = 0.012: quiet (it
    would be named at alpha / 4). 6 of 16 (p = 0.00049) is named."""
    p = 2 * 4.0**-5
    assert 0.012 / 8 < p < 0.012 / 4
    quiet = _two_groups_of_four(tmp_path / "a", above=5, alpha=0.012)
    assert (quiet.status, quiet.rows) == ("PASS", []), quiet.summary
    named = _two_groups_of_four(tmp_path / "b", above=6, alpha=0.012)
    assert [(r["rank"], r["peer_group"], r["cause"]) for r in named.rows] == [(1, "ep 0-3", "slow-compute")]


def test_one_stalled_all_to_all_does_not_make_a_slow_link_cost(tmp_path):
    """Rank 2's link is slow in every instance (+300 us in each all-to-all); in one instance one
    all-to-all of rank 2 stalls 40 ms more. The trimmed mean cuts the top instance: the cost is
    within 5 % of the run without the stall (it would more than double if the top were kept)."""

    def link(stall_at):
        def cells(rank, step, layer):
            extra = 300.0 if rank == 2 else 0.0
            if rank == 2 and (step, layer) == stall_at:
                extra += 40_000.0
            return ls.Cell(transfer_us=extra)

        return cells

    plain = _judge(tmp_path / "plain", link(None))
    stalled = _judge(tmp_path / "stalled", link((2, 1)))
    (a,), (b,) = plain.rows, stalled.rows
    assert (a["rank"], a["cause"], b["rank"], b["cause"]) == (2, "slow-comm", 2, "slow-comm")
    assert a["cost_ms"] > 0
    assert abs(b["cost_ms"] - a["cost_ms"]) <= 0.05 * a["cost_ms"], (a["cost_ms"], b["cost_ms"])
