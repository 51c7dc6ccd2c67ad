"""How findings become the conclusion (issue 33): the finding a rank is shown with is its first
(the query orders its rows worst first), and a query that errored did not run, so it neither
makes a run "diagnosed" nor counts as a verdict that passed.
"""

from __future__ import annotations

from slowcard import findings, queries
from slowcard.diagnosis import conclude
from slowcard.verdict import Status, evaluate

CATALOG = queries.load_catalog()


def _result(query: str, rows: list[dict], status=None, summary: str = "") -> queries.Result:
    q = CATALOG[query]
    return queries.Result(
        query=q.name,
        version=q.version,
        run="r",
        status=status or evaluate(rows, q.rule),
        summary=summary,
        columns=list(rows[0]) if rows else [],
        rows=rows,
        spec=q,
    )


def test_a_rank_is_shown_with_its_first_finding():
    """cluster-step-skew flags rank 1 twice, its costliest gap first: the report and annotate show
    that one (and rank 2's only finding)."""
    rows = [
        {"suspect_rank": 1, "cause": "comm-skew", "gap_share": 0.36, "next_step": "look at rank 1's compute"},
        {"suspect_rank": 2, "cause": "compute-skew", "gap_share": 0.20, "next_step": "look at rank 2"},
        {"suspect_rank": 1, "cause": "free-skew", "gap_share": 0.10, "next_step": "look at rank 1's host"},
    ]
    results = {"cluster-step-skew": _result("cluster-step-skew", rows)}
    ranks = findings.slow_ranks(results)
    assert {r: (f.cause, f.row["gap_share"]) for r, f in ranks.items()} == {
        1: ("comm-skew", 0.36),
        2: ("compute-skew", 0.2),
    }
    assert list(findings.slow_ranks(results, "annotate")) == [1, 2]


def test_a_run_whose_queries_only_errored_or_skipped_is_not_diagnosed():
    results = {
        "dp-imbalance": _result("dp-imbalance", [], status=Status.ERROR, summary="dp-imbalance.sql: Out of Memory"),
        "straggler-rank": _result("straggler-rank", [], status=Status.SKIP, summary="requires collective_waits"),
    }
    got = conclude(results)
    assert got["status"] == "SKIP" and got["headline"].startswith("Nothing to diagnose")
    assert got["evidence"] == "dp-imbalance: dp-imbalance.sql: Out of Memory"


def test_an_errored_verdict_is_not_a_verdict_that_passed():
    """One verdict passed and one errored: no slow card, and the evidence lists the verdict that
    ran (an errored query never vouches for a PASS)."""
    results = {
        "dp-imbalance": _result("dp-imbalance", [], status=Status.ERROR, summary="dp-imbalance.sql: boom"),
        "straggler-rank": _result("straggler-rank", []),
    }
    got = conclude(results)
    assert got["status"] == "PASS" and got["slow_cards"] == []
    assert got["evidence"] == f"straggler-rank@v{CATALOG['straggler-rank'].version} PASS"
