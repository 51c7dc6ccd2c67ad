"""Query knowledge lives in the query files: no Python module names a query, the header metadata
is validated, and adding a verdict query is one SQL file (seen by diagnose, report, annotate).
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import synth_kineto  # noqa: E402

from slowcard import findings, queries  # noqa: E402
from slowcard.cli import app  # noqa: E402
from slowcard.errors import QueryDefinitionError  # noqa: E402
from slowcard.verdict import Status, evaluate, parse_rule, row_levels, summarise  # noqa: E402

PACKAGE = Path(queries.__file__).resolve().parent
CATALOG = queries.load_catalog(scope=None)  # the per-run queries and the fleet ones


def _string_literals(path: Path):
    """(line, text) of every string constant in a module except docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_query_name_is_a_literal_in_the_package():
    """A new analysis is one SQL file: no module may special-case a query by its name."""
    names = sorted(CATALOG, key=len, reverse=True)
    pattern = re.compile(r"(?<![a-z0-9-])(" + "|".join(map(re.escape, names)) + r")(?![a-z0-9-])")
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in _string_literals(path):
            for m in pattern.finditer(text):
                hits.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {m.group(1)!r} in {text[:60]!r}")
    assert not hits, "query names as literals (put the knowledge in the query header):\n" + "\n".join(hits)


def test_the_literal_check_sees_a_literal(tmp_path):
    """The check itself: a module that names a query is caught, its docstring is not."""
    mod = tmp_path / "m.py"
    mod.write_text('"""About ep-slow-rank."""\nX = ("ep-slow-rank", f"{1} rank-waits")\n')
    texts = [t for _, t in _string_literals(mod)]
    assert "ep-slow-rank" in texts and any("rank-waits" in t for t in texts)
    assert "About ep-slow-rank." not in texts


def test_every_builtin_query_declares_role_order_and_verdict_metadata():
    for q in CATALOG.values():
        assert q.order < queries.DEFAULT_ORDER, f"{q.name}: no `-- order:`"
        assert q.role == ("report" if q.rule is None else "verdict")
    verdicts = [q for q in CATALOG.values() if q.is_verdict and q.priority is not None]
    assert len({q.priority for q in verdicts}) == len(verdicts), "two verdicts share a priority"
    assert len({q.order for q in CATALOG.values()}) == len(CATALOG), "two queries share an order"
    # every report section has a query that feeds it
    places = {s for q in CATALOG.values() if not q.is_verdict for s in q.shows}
    assert {s for s in queries.SHOWS if s.startswith("report.")} <= places


META_BASE = """-- name: my-check
-- version: 1
-- description: Ranks with many events.
-- requires: events
-- verdict: {verdict}
{meta}
SELECT rank, count(*) AS n FROM events WHERE run = $run GROUP BY rank
"""


@pytest.mark.parametrize(
    "verdict, meta, words",
    [
        ("none", "-- role: verdict", ["role verdict does not match"]),
        ("warn if rows > 0", "-- role: checker", ["role must be one of"]),
        ("warn if rows > 0", "-- subject: rank as gpu", ["bad subject", "KIND one of"]),
        ("warn if rows > 0", "-- subject: rank;", ["bad subject"]),
        ("none", "-- priority: 3", ["priority is for verdict queries"]),
        ("warn if rows > 0", "-- priority: first", ["priority must be an integer"]),
        ("warn if rows > 0", "-- order: -1", ["order must be an integer"]),
        ("warn if rows > 0", "-- shows: report.nowhere", ["shows 'report.nowhere' is not one of"]),
        ("warn if rows > 0", "-- subject: dp_rank\n-- shows: annotate", ["needs a verdict whose subject is a rank"]),
        ("warn if rows > 0", "-- shows: compare", ["'shows: compare' is for report queries"]),
    ],
)
def test_bad_metadata_is_refused_with_file_and_line(tmp_path, verdict, meta, words):
    p = tmp_path / "my-check.sql"
    p.write_text(META_BASE.format(verdict=verdict, meta=meta))
    with pytest.raises(QueryDefinitionError) as exc:
        queries.parse_query(p)
    msg = str(exc.value)
    assert re.match(rf"{re.escape(str(p))}:\d+: ", msg), msg
    for w in words:
        assert w in msg, msg


def test_metadata_defaults_and_values(tmp_path):
    p = tmp_path / "my-check.sql"
    p.write_text(META_BASE.format(verdict="warn if rows > 0", meta="-- subject: rank as ep_rank, layer"))
    q = queries.parse_query(p)
    assert (q.role, q.subject, q.priority, q.order, q.shows) == (
        "verdict",
        (("rank", "ep_rank"), ("layer", "layer")),
        queries.DEFAULT_PRIORITY,
        queries.DEFAULT_ORDER,
        (),
    )
    p.write_text(META_BASE.format(verdict="none", meta=""))
    q = queries.parse_query(p)
    assert (q.role, q.priority) == ("report", None)


# ---------------------------------------------------------------- statuses and findings


def test_one_severity_order():
    assert [s.value for s in sorted(Status, key=lambda s: s.severity)] == [
        "FAIL",
        "ERROR",
        "WARN",
        "PASS",
        "INFO",
        "SKIP",
    ]
    assert Status.worst(["PASS", "INFO", "WARN"]) == Status.WARN
    assert Status.worst(["ERROR", "FAIL"]) == Status.FAIL
    assert Status.worst([]) == Status.SKIP
    assert Status.FAIL == "FAIL" and json.dumps({"s": Status.WARN}) == '{"s": "WARN"}' and f"{Status.PASS}" == "PASS"


def test_row_levels_follow_the_rule_and_a_level_column():
    rule = parse_rule("fail if rows where impact > 0; warn if rows where persistent > 0")
    rows = [
        {"impact": True, "persistent": True},
        {"impact": False, "persistent": True},
        {"impact": False, "persistent": False},
    ]
    assert evaluate(rows, rule) == Status.FAIL
    assert row_levels(rows, rule) == [Status.FAIL, Status.WARN, None]
    # a count threshold that does not hold: its rows are no findings
    assert row_levels(rows, parse_rule("fail if rows > 5")) == [None, None, None]
    # a calibrated verdict's own level column decides by itself
    rows = [{"level": "WARN"}, {"level": "FAIL"}, {"level": None}]
    assert row_levels(rows, parse_rule("warn if rows > 0")) == [Status.WARN, Status.FAIL, None]


def test_a_level_column_decides_the_status_and_a_skip_reason_makes_it_skip():
    rule = parse_rule("fail if rows > 0")
    # the status is the worst row level, whatever the clauses would say: status and findings agree
    assert evaluate([{"level": "WARN"}, {"level": "WARN"}], rule) == Status.WARN
    assert evaluate([{"level": "WARN"}, {"level": "FAIL"}], rule) == Status.FAIL
    assert evaluate([{"level": None}], rule) == Status.PASS
    assert evaluate([], rule) == Status.PASS
    # a row with a skip_reason: too little data to judge -> SKIP, its reason is the summary
    rows = [{"level": "SKIP", "skip_reason": "1 rank(s) with MoE layers in this run"}]
    assert evaluate(rows, rule) == Status.SKIP and row_levels(rows, rule) == [None]
    assert summarise(Status.SKIP, rows, "{level} rank {rank}", "nothing", {}) == rows[0]["skip_reason"]
    # an empty reason is no reason; a report whose rows all give a reason SKIPs too
    assert evaluate([{"skip_reason": "", "level": "WARN"}], rule) == Status.WARN
    assert evaluate(rows, None) == Status.SKIP
    assert evaluate([{"x": 1}], None) == Status.INFO


def _result(query, rows, status=None):
    q = CATALOG[query]
    return queries.Result(
        query=q.name,
        version=q.version,
        run="r",
        status=status or evaluate(rows, q.rule),
        summary="",
        columns=list(rows[0]) if rows else [],
        rows=rows,
        spec=q,
    )


def test_slow_cards_come_from_the_most_severe_then_the_highest_priority_verdict():
    dp = [{"dp_rank": 2, "cause": "request-skew", "impact": True, "next_step": "rebalance", "cost_ms": 12.5}]
    straggler = [{"rank": 3, "cause": "straggler", "next_step": "look"}]
    step = [{"suspect_rank": 1, "cause": "comm-skew"}]
    results = {
        "dp-imbalance": _result("dp-imbalance", dp),
        "straggler-rank": _result("straggler-rank", straggler),
        "cluster-step-skew": _result("cluster-step-skew", step),
    }
    cards = findings.slow_cards(results)
    assert [(f.label, f.cause, f.level, f.cost_ms) for f in cards] == [("DP domain 2", "request-skew", "FAIL", 12.5)]
    assert findings.slow_ranks(results) == {}
    # without the DP verdict, the step-trace verdict (priority before the straggler) names rank 1
    del results["dp-imbalance"]
    assert [f.label for f in findings.slow_cards(results)] == ["rank 1"]
    assert list(findings.slow_ranks(results, "annotate")) == [1]
    # a verdict that passes says nothing: the next one that flags speaks
    results["cluster-step-skew"] = _result("cluster-step-skew", [])
    assert [f.short() for f in findings.slow_cards(results)] == ["rank 3 straggler"]


def test_a_warn_never_speaks_before_a_fail_whatever_the_priority():
    """dp-imbalance (priority 30) only WARNs (no impact), cluster-step-skew (priority 40) FAILs:
    the FAIL names the slow card although its priority comes later."""
    warn = _result("dp-imbalance", [{"dp_rank": 2, "cause": "request-skew", "impact": False, "next_step": "rebalance"}])
    fail = _result("cluster-step-skew", [{"suspect_rank": 1, "cause": "comm-skew"}])
    assert (warn.status, fail.status) == ("WARN", "FAIL")
    assert warn.spec.priority < fail.spec.priority
    results = {"dp-imbalance": warn, "cluster-step-skew": fail}
    assert [(f.label, f.cause, f.level) for f in findings.slow_cards(results)] == [("rank 1", "comm-skew", "FAIL")]
    assert [r.query for r in findings.speaking_order(results.values())] == ["cluster-step-skew", "dp-imbalance"]
    # among equally severe verdicts the priority decides: both WARN, the DP verdict speaks
    results["cluster-step-skew"] = _result("cluster-step-skew", fail.rows, status="WARN")
    assert [f.label for f in findings.slow_cards(results)] == ["DP domain 2"]


# ---------------------------------------------------------------- one SQL file is a new analysis

USER_VERDICT = """-- name: busy-rank
-- version: 1
-- description: A user's own verdict: the rank with the most MoE layer instances time (for the test).
-- requires: moe_layer_facts
-- param: min_share DOUBLE = 0.0   -- flag ranks above this share of the MoE time
-- verdict: fail if rows > 0
-- role: verdict
-- subject: rank
-- priority: 1
-- order: 5
-- shows: report.moe, annotate
-- summary: rank {rank}: {cause}
WITH t AS (SELECT rank, sum(layer_ns) AS ns FROM (SELECT DISTINCT rank, step, layer, layer_ns FROM moe_layer_facts
           WHERE run = $run) GROUP BY rank)
SELECT rank, 'user-flagged' AS cause, 'ask the user' AS next_step, round(ns / 1e6, 3) AS moe_ms
FROM t WHERE rank = 3 AND ns >= $min_share
"""


@pytest.fixture(scope="module")
def ep_db(tmp_path_factory):
    d = tmp_path_factory.mktemp("onefile")
    synth_kineto.write_ep_run(d / "run", scenario="balanced", steps=2, layers=2)
    db = d / "ep.duckdb"
    res = CliRunner().invoke(app, ["ingest", str(d / "run"), "--db", str(db), "--run", "bal", "-q"])
    assert res.exit_code == 0, res.output
    sql = d / "sql"
    sql.mkdir()
    (sql / "busy-rank.sql").write_text(USER_VERDICT)
    return db, sql


def test_a_new_verdict_query_is_one_sql_file(ep_db, tmp_path):
    db, sql = ep_db
    con = queries.open_readonly(db)
    try:
        facts = {c[0] for c in con.execute("DESCRIBE moe_layer_facts").fetchall()}
    finally:
        con.close()
    assert "layer_ns" in facts, facts
    runner = CliRunner()
    diag = runner.invoke(app, ["diagnose", "--db", str(db), "--sql-dir", str(sql), "--format", "json"])
    doc = json.loads(diag.stdout)
    assert diag.exit_code == 1
    assert doc["results"][0]["query"] == "busy-rank" and doc["results"][0]["status"] == "FAIL"
    assert [(f["level"], f["subject"], f["cause"]) for f in doc["results"][0]["findings"]] == [
        ("FAIL", {"rank": 3}, "user-flagged")
    ]
    assert all("findings" not in r for r in doc["results"] if r["rule"] == "none")
    assert doc["conclusion"]["query"] == "busy-rank@v1" and doc["conclusion"]["slow_cards"] == ["rank 3"]
    assert doc["conclusion"]["cause"] == "user-flagged" and doc["conclusion"]["next_step"] == "ask the user"

    pytest.importorskip("plotly")
    page = tmp_path / "r.html"
    rep = runner.invoke(app, ["report", "--db", str(db), "--sql-dir", str(sql), "--out", str(page)])
    assert rep.exit_code == 0, rep.output
    html = page.read_text(encoding="utf-8")
    assert "<code>busy-rank@v1</code>" in html
    assert "slow card: user-flagged" in html  # marked on rank 3's MoE bar

    out = tmp_path / "t.json"
    ann = runner.invoke(app, ["annotate", "--db", str(db), "--sql-dir", str(sql), "--out", str(out)])
    assert ann.exit_code == 0, ann.output
    assert "slow card(s): rank 3" in ann.stdout
    trace = json.loads(out.read_text(encoding="utf-8"))
    assert trace["otherData"]["slowcard"]["slow_ranks"] == {"3": "busy-rank@v1: user-flagged"}
    assert any(e.get("name") == "busy-rank@v1 FAIL" for e in trace["traceEvents"])

    cmp = runner.invoke(app, ["compare", "bal", "bal", "--db", str(db), "--sql-dir", str(sql), "-f", "json"])
    doc = json.loads(cmp.stdout)
    assert doc["slow_cards_a"] == doc["slow_cards_b"] == ["rank 3 user-flagged"]
    assert doc["verdicts"][0]["query"] == "busy-rank@v1" and doc["verdicts"][0]["flagged_b"] == ["rank 3 user-flagged"]


# ---------------------------------------------------------------- docs/queries.md from the headers


def test_docs_queries_md_is_generated_from_the_headers():
    from slowcard.catalog_doc import catalog_markdown

    doc = PACKAGE.parent / "docs" / "queries.md"
    want = catalog_markdown(CATALOG)
    assert doc.read_text(encoding="utf-8") == want, (
        "docs/queries.md differs from the query headers; rewrite it with "
        "`python -m slowcard list --format markdown > docs/queries.md`"
    )
    res = CliRunner().invoke(app, ["list", "--format", "markdown"])
    assert res.exit_code == 0 and res.stdout == want
    for q in CATALOG.values():  # every query has its section, with its version and rule
        assert f"## {q.name} (v{q.version}, {q.role})" in want and q.rule_text in want


def test_changelog_lists_every_query_version():
    """Each query's current version above 1 is explained under "Query versions" in CHANGELOG.md."""
    text = (PACKAGE.parent / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "### Query versions" in text
    missing = [
        f"`{q.name}` v{q.version}" for q in CATALOG.values() if q.version > 1 and f"`{q.name}` v{q.version}" not in text
    ]
    assert not missing, "CHANGELOG.md: add these under 'Query versions': " + ", ".join(missing)
