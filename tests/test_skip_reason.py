"""The generic ``skip_reason`` column: a verdict whose rows all say why its data is not enough SKIPs."""

from __future__ import annotations

import duckdb

from slowcard import findings, queries
from slowcard.verdict import Status, evaluate, parse_rule, row_levels, skip_reason, summarise

RULE = parse_rule("fail if rows where impact > 0; warn if rows > 0")

QUERY = """-- name: my-check
-- version: 1
-- description: A verdict that needs at least $min_n values.
-- requires: vals
-- param: min_n INTEGER = 3   -- values needed
-- verdict: fail if rows > 0
-- role: verdict
-- subject: x as rank
-- summary: x {x} is bad
-- pass: all good
WITH v AS (SELECT x FROM vals WHERE run = $run)
SELECT x, NULL AS skip_reason FROM v WHERE (SELECT count(*) FROM v) >= $min_n AND x = 0
UNION ALL
SELECT NULL, 'only ' || (SELECT count(*) FROM v) || ' values; ' || $min_n || ' needed'
WHERE (SELECT count(*) FROM v) < $min_n
"""


def test_every_row_with_a_reason_is_skip_with_that_reason():
    rows = [{"dp_rank": None, "impact": True, "skip_reason": "only 1 DP domain"}]
    assert skip_reason(rows) == "only 1 DP domain"
    assert evaluate(rows, RULE) == Status.SKIP
    assert evaluate(rows, None) == Status.SKIP
    assert summarise(Status.SKIP, rows, "DP {dp_rank}", "ok", {}) == "only 1 DP domain"
    # distinct reasons, in order, once each
    two = rows + [{"skip_reason": "too few requests"}, {"skip_reason": "only 1 DP domain"}]
    assert skip_reason(two) == "only 1 DP domain; too few requests"


def test_rows_without_a_reason_decide_as_usual():
    mixed = [{"impact": True, "skip_reason": None}, {"impact": False, "skip_reason": "x"}]
    assert skip_reason(mixed) is None and evaluate(mixed, RULE) == Status.FAIL
    assert evaluate([{"impact": False, "skip_reason": ""}], RULE) == Status.WARN
    assert skip_reason([]) is None and evaluate([], RULE) == Status.PASS
    assert row_levels(mixed, RULE) == [Status.FAIL, Status.WARN]


def test_a_query_says_skip_through_its_rows(tmp_path):
    p = tmp_path / "my-check.sql"
    p.write_text(QUERY)
    q = queries.parse_query(p)
    con = duckdb.connect()
    con.execute("CREATE TABLE vals AS SELECT 'run' || n AS run, x FROM range(1, 6) a(n), range(n) b(x)")
    few = queries.run_query(con, q, "run2")
    assert few.status == Status.SKIP and few.summary == "only 2 values; 3 needed"
    assert findings.findings(few) == []
    enough = queries.run_query(con, q, "run5")
    assert enough.status == Status.FAIL and enough.summary == "x 0 is bad"
    assert queries.run_query(con, q, "run2", {"min_n": 2}).status == Status.FAIL
