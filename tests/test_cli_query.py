"""`slowcard query`: the JSON result contract, formats, exit codes, and stdout holding only results."""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import synth_kineto  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.cli import app  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    """One database with a token-skew run and a balanced run."""
    d = tmp_path_factory.mktemp("cli")
    db = d / "two.duckdb"
    for scenario in ("token_skew", "balanced"):
        synth_kineto.write_ep_run(d / scenario, scenario=scenario, steps=3, layers=3)
        res = runner.invoke(app, ["ingest", str(d / scenario), "--db", str(db), "--run", scenario])
        assert res.exit_code == 0, res.output
    return db


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_json_contract_and_fail_exit_code(dbs):
    res = invoke("query", "ep-slow-rank", "--db", dbs, "--run", "token_skew", "--format", "json")
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert isinstance(doc, list) and len(doc) == 1
    r = doc[0]
    assert {"query", "version", "run", "status", "summary", "columns", "rows"} <= set(r)
    version = queries.load_catalog()["ep-slow-rank"].version
    assert (r["query"], r["version"], r["run"], r["status"]) == ("ep-slow-rank", version, "token_skew", "FAIL")
    assert r["rows"][0]["rank"] == 1 and r["rows"][0]["cause"] == "token-skew"
    assert set(r["rows"][0]) == set(r["columns"])
    assert r["params"]["alpha"] == queries.load_catalog()["ep-slow-rank"].params[0].default


def test_all_runs_gives_one_result_per_run_and_pass_exits_zero(dbs):
    res = invoke("query", "ep-slow-rank", "--db", dbs, "--all-runs", "-f", "json")
    doc = json.loads(res.stdout)
    assert {(r["run"], r["status"]) for r in doc} == {("token_skew", "FAIL"), ("balanced", "PASS")}
    ok = invoke("query", "ep-slow-rank", "--db", dbs, "--run", "balanced")
    assert ok.exit_code == 0
    assert ok.stdout.startswith(f"ep-slow-rank@v{queries.load_catalog()['ep-slow-rank'].version} PASS [run balanced]")


def test_strict_turns_warn_into_exit_1(dbs):
    res = invoke("query", "straggler-rank", "--db", dbs, "--run", "token_skew", "-f", "json")
    assert json.loads(res.stdout)[0]["status"] == "WARN" and res.exit_code == 0
    strict = invoke("query", "straggler-rank", "--db", dbs, "--run", "token_skew", "--strict")
    assert strict.exit_code == 1


def test_csv_and_markdown_formats(dbs):
    res = invoke("query", "moe-breakdown", "--db", dbs, "--run", "token_skew", "-f", "csv")
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert [r["rank"] for r in rows] == ["0", "1", "2", "3"] and rows[0]["query"] == "moe-breakdown"
    md = invoke("query", "moe-breakdown", "--db", dbs, "--run", "token_skew", "-f", "markdown")
    assert md.stdout.startswith("### moe-breakdown@v2 INFO")
    assert re.search(r"^\|\s+rank \| layer", md.stdout, re.M)


def test_skip_when_required_table_is_empty(dbs):
    res = invoke("query", "expert-hotspots", "--db", dbs, "--run", "token_skew", "-f", "json")
    assert res.exit_code == 0
    assert json.loads(res.stdout)[0]["status"] == "SKIP"


@pytest.mark.parametrize(
    "args, words",
    [
        (["query", "no-such-query"], "unknown query"),
        (["query", "ep-slow-rank", "-p", "nonsense=1"], "no parameter 'nonsense'"),
        (["query", "ep-slow-rank", "-p", "min_cost_pct=abc"], "not a valid DOUBLE"),
        (["query", "ep-slow-rank", "-p", "novalue"], "expected key=value"),
        (["query", "ep-slow-rank", "--run", "nope"], "no run named 'nope'"),
        (["query", "ep-slow-rank", "--format", "xml"], "--format"),
    ],
)
def test_usage_errors_exit_2_with_message_on_stderr(dbs, args, words):
    res = invoke(*args, "--db", dbs)
    assert res.exit_code == 2
    assert words in res.stderr
    assert res.stdout == ""


def test_missing_database_is_a_clear_usage_error(tmp_path):
    res = invoke("query", "ep-slow-rank", "--db", tmp_path / "none.duckdb")
    assert res.exit_code == 2 and "no such database" in res.stderr


def test_list_and_show(dbs):
    res = invoke("list")
    assert res.exit_code == 0 and "ep-slow-rank" in res.stdout and "v1" in res.stdout
    shown = invoke("show", "ep-slow-rank")
    assert shown.stdout.startswith("-- name: ep-slow-rank")


def test_no_progress_bar_can_reach_stdout(tmp_path):
    """DuckDB draws a progress bar on stdout for statements over ~2 s (seen on a 64-rank run: it
    broke `--format json`). Every connection slowcard opens, read-only or not, has it off."""
    from slowcard import queries, store

    db = tmp_path / "p.duckdb"
    store.open_db(db).close()
    for opener in (store.connect, queries.open_readonly):
        con = opener(db)
        try:
            assert con.execute("SELECT current_setting('enable_progress_bar')").fetchone()[0] is False
        finally:
            con.close()


def _query_rows(db, name, run, *extra):
    res = invoke("query", name, "--db", db, "--run", run, "--format", "json", *extra)
    assert res.exit_code in (0, 1), res.output
    return json.loads(res.stdout)[0]


def test_show_prints_a_script_the_duckdb_shell_runs_as_printed(dbs):
    """`slowcard show NAME | duckdb DB`: parameters become SET VARIABLE lines, so every built-in
    query runs as printed and gives the rows `slowcard query` gives (first run by default;
    --run / -p bind others)."""
    import duckdb

    from slowcard import queries

    for name in queries.load_catalog():
        shown = invoke("show", name)
        assert shown.exit_code == 0, shown.output
        assert "$" not in "\n".join(line for line in shown.stdout.splitlines() if not line.startswith("--"))
        with duckdb.connect(str(dbs), read_only=True) as con:
            rows = con.execute(shown.stdout).fetchall()  # the script's last statement: the query
        want = _query_rows(dbs, name, "token_skew")
        if want["status"] != "SKIP":  # (a SKIP never ran the body: its tables are empty)
            assert len(rows) == len(want["rows"]), name
    bound = invoke("show", "ep-slow-rank", "--run", "balanced", "-p", "min_cost_pct=2.5")
    assert "SET VARIABLE run = 'balanced';" in bound.stdout
    assert "SET VARIABLE min_cost_pct = CAST(2.5 AS DOUBLE);" in bound.stdout
    assert invoke("show", "ep-slow-rank", "-p", "nope=1").exit_code == 2
    assert invoke("show", "ep-slow-rank", "--raw").stdout.count("$run") >= 1


def test_show_piped_into_the_duckdb_cli_prints_the_rows(dbs):
    import subprocess

    from conftest import duckdb_cli

    exe = duckdb_cli()
    if exe is None:
        pytest.skip("the duckdb CLI (PyPI duckdb-cli, in the dev extra) is not installed")
    script = invoke("show", "ep-slow-rank").stdout
    out = subprocess.run(
        [exe, "-readonly", "-csv", str(dbs)], input=script, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and not out.stderr, out.stderr
    got = list(csv.DictReader(io.StringIO(out.stdout)))
    want = _query_rows(dbs, "ep-slow-rank", "token_skew")["rows"]
    assert [(int(r["rank"]), r["cause"]) for r in got] == [(r["rank"], r["cause"]) for r in want] == [(1, "token-skew")]
