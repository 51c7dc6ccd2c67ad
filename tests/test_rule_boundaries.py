"""The verdict rule language exactly at its boundaries (issue 33): each comparison operator of a
rule (``>=``, ``<=``, ``=``, ``>``, ``<``) on a user's --sql-dir query that uses it, with one row
fewer than, exactly, and one row more than the rule's number.

No built-in query uses ``>=``, ``<=`` or ``=``, so only a user's own query can show that they
count the boundary row the way their symbol says (``>=`` read as ``>`` would pass every test of
the built-in queries).
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from slowcard import queries, store
from slowcard.cli import app
from slowcard.verdict import Status, row_levels

# n rows; rows 0 .. k-1 are flagged (the count a "rows where flagged" clause sees)
PROBE = """-- name: {name}
-- version: 1
-- description: n rows, the first k flagged: a probe of the verdict rule (issue 33).
-- requires:
-- param: n INTEGER = 1   -- rows returned
-- param: k INTEGER = 0   -- of which flagged
-- verdict: {rule}
-- role: verdict
-- subject: row_no as rank
SELECT i AS row_no, i < $k AS flagged FROM range($n) t(i) WHERE $run IS NOT NULL ORDER BY i
"""

# rule -> {rows: the status it gives}; each at the number minus one, the number, the number plus one
CASES = {
    "fail if rows >= 3": {2: "PASS", 3: "FAIL", 4: "FAIL"},
    "fail if rows > 3": {2: "PASS", 3: "PASS", 4: "FAIL"},
    "fail if rows = 3": {2: "PASS", 3: "FAIL", 4: "PASS"},
    "warn if rows <= 3": {2: "WARN", 3: "WARN", 4: "PASS"},
    "warn if rows < 3": {2: "WARN", 3: "PASS", 4: "PASS"},
}
# the same at the boundary of the flagged rows' count (5 rows, k of them flagged)
WHERE_CASES = {
    "fail if rows where flagged >= 2; warn if rows > 0": {1: "WARN", 2: "FAIL", 3: "FAIL"},
    "fail if rows where flagged > 2; warn if rows > 0": {1: "WARN", 2: "WARN", 3: "FAIL"},
    "fail if rows where flagged = 2; warn if rows > 0": {1: "WARN", 2: "FAIL", 3: "WARN"},
    "fail if rows where flagged <= 2; warn if rows > 0": {1: "FAIL", 2: "FAIL", 3: "WARN"},
    "fail if rows where flagged < 2; warn if rows > 0": {1: "FAIL", 2: "WARN", 3: "WARN"},
}


def _probe(folder, name: str, rule: str) -> None:
    (folder / f"{name}.sql").write_text(PROBE.format(name=name, rule=rule), encoding="utf-8")


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """Every rule as one query of a user folder, and a database with one run."""
    d = tmp_path_factory.mktemp("rules")
    sql = d / "sql"
    sql.mkdir()
    names = {}
    for i, rule in enumerate([*CASES, *WHERE_CASES]):
        names[rule] = f"rule-probe-{i}"
        _probe(sql, names[rule], rule)
    db = d / "r.duckdb"
    con = store.open_db(db)
    store.ensure_run(con, "r", str(d))
    con.close()
    return db, sql, names, queries.load_catalog([sql])


def _run(probes, rule, **params):
    db, _sql, names, catalog = probes
    con = queries.open_readonly(db)
    try:
        return queries.run_query(con, catalog[names[rule]], "r", params)
    finally:
        con.close()


@pytest.mark.parametrize("rule", list(CASES))
def test_row_count_rule_at_its_boundary(probes, rule):
    got = {n: str(_run(probes, rule, n=n).status) for n in CASES[rule]}
    assert got == CASES[rule]


@pytest.mark.parametrize("rule", list(WHERE_CASES))
def test_flagged_rows_rule_at_its_boundary(probes, rule):
    got = {}
    for k in WHERE_CASES[rule]:
        res = _run(probes, rule, n=5, k=k)
        got[k] = str(res.status)
        # each row's level agrees with the status: the flagged rows carry FAIL when the fail clause
        # holds, every other row the warn clause's WARN
        fail_holds = res.spec.rule[0].holds(res.rows)
        want = [Status.FAIL if fail_holds and r["flagged"] else Status.WARN for r in res.rows]
        assert row_levels(res.rows, res.spec.rule) == want
    assert got == WHERE_CASES[rule]


def test_the_command_line_exit_code_follows_the_boundary(probes):
    """`slowcard query NAME --sql-dir DIR`: exit 1 exactly when the rule fails (3 rows >= 3)."""
    db, sql, names, _ = probes
    name = names["fail if rows >= 3"]
    codes = {}
    for n in (2, 3):
        res = CliRunner().invoke(
            app, ["query", name, "--sql-dir", str(sql), "--db", str(db), "--run", "r", "-p", f"n={n}"]
        )
        codes[n] = res.exit_code
        assert res.output.startswith(f"{name}@v1 {'FAIL' if n == 3 else 'PASS'} "), res.output
    assert codes == {2: 0, 3: 1}
