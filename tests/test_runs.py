"""Many runs in one database: --run-per-folder, --all-runs, compare, and Parquet export."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import synth_kineto  # noqa: E402

from slowcard.cli import app  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    synth_kineto.write_ep_run(root / "a_slow", scenario="token_skew", steps=3, layers=3)
    synth_kineto.write_ep_run(root / "b_fixed", scenario="balanced", steps=3, layers=3)
    synth_kineto.write_ep_run(root / "c_device", scenario="slow_compute", steps=3, layers=3)
    db = root / "runs.duckdb"
    res = runner.invoke(app, ["ingest", str(root), "--run-per-folder", "--db", str(db), "-q"])
    assert res.exit_code == 0, res.output
    return root, db


def test_run_per_folder_and_all_runs(three_runs):
    _, db = three_runs
    res = runner.invoke(app, ["query", "ep-slow-rank", "--all-runs", "--db", str(db), "-f", "json"])
    assert res.exit_code == 1
    got = {r["run"]: (r["status"], [(x["rank"], x["cause"]) for x in r["rows"]]) for r in json.loads(res.stdout)}
    assert got == {
        "a_slow": ("FAIL", [(1, "token-skew")]),
        "b_fixed": ("PASS", []),
        "c_device": ("FAIL", [(1, "slow-compute")]),
    }


def test_compare_reports_the_slow_card_gone(three_runs):
    _, db = three_runs
    res = runner.invoke(app, ["compare", "a_slow", "b_fixed", "--db", str(db), "-f", "json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    ep = next(v for v in doc["verdicts"] if v["query"].startswith("ep-slow-rank"))
    assert (ep["status_a"], ep["status_b"]) == ("FAIL", "PASS")
    assert ep["flagged_a"] == ["rank 1 token-skew"] and ep["flagged_b"] == []
    assert "gone in B: rank 1 token-skew" in ep["note"]
    gmm = {r["rank"]: r for r in doc["metrics"]["moe-breakdown@v2"]["rows"]}
    assert gmm[1]["gmm_ms_ratio"] < 0.5 < gmm[0]["gmm_ms_ratio"]
    text = runner.invoke(app, ["compare", "a_slow", "b_fixed", "--db", str(db)])
    assert "gone in B: rank 1 token-skew" in text.stdout
    worse = runner.invoke(app, ["compare", "b_fixed", "c_device", "--db", str(db), "-f", "json"])
    assert worse.exit_code == 1
    ep = next(v for v in json.loads(worse.stdout)["verdicts"] if v["query"].startswith("ep-slow-rank"))
    assert "new in B: rank 1 slow-compute" in ep["note"]


def test_parquet_export_round_trips(three_runs, tmp_path):
    _, db = three_runs
    out = tmp_path / "pq"
    res = runner.invoke(app, ["export", "--parquet", str(out), "--db", str(db)])
    assert res.exit_code == 0, res.stderr
    assert (out / "events" / "run=a_slow" / "rank=1").is_dir()
    con = duckdb.connect(str(db), read_only=True)
    try:
        for table in ("events", "sources", "moe_layer_facts"):
            cols = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
            # Compare as text multisets: hive partition values (run, rank) come back as strings
            # or integers depending on the reader, the rest keeps its type.
            as_text = ", ".join(f'CAST("{c}" AS VARCHAR)' for c in cols)
            pq = f"read_parquet('{out}/{table}/**/*.parquet', hive_partitioning = true)"
            n_orig = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            n_back = con.execute(f"SELECT count(*) FROM {pq}").fetchone()[0]
            assert n_orig == n_back > 0, table
            diff = con.execute(f"""SELECT count(*) FROM (
                (SELECT {as_text} FROM {table} EXCEPT ALL SELECT {as_text} FROM {pq})
                UNION ALL
                (SELECT {as_text} FROM {pq} EXCEPT ALL SELECT {as_text} FROM {table}))""").fetchone()[0]
            assert diff == 0, table
    finally:
        con.close()
    import pyarrow.dataset as ds

    events = ds.dataset(str(out / "events"), format="parquet", partitioning="hive").to_table()
    assert events.num_rows == n_events(db) and "rank" in events.column_names


def n_events(db):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        con.close()


def test_run_per_folder_rejects_run_and_files(three_runs, tmp_path):
    root, db = three_runs
    res = runner.invoke(
        app, ["ingest", str(root), "--run-per-folder", "--run", "x", "--db", str(tmp_path / "x.duckdb")]
    )
    assert res.exit_code == 2 and "exclude each other" in res.stderr
    f = next(root.glob("a_slow/*.gz"))
    res = runner.invoke(app, ["ingest", str(f), "--run-per-folder", "--db", str(tmp_path / "x.duckdb")])
    assert res.exit_code == 2 and "needs folders" in res.stderr
