"""`slowcard diagnose`: one command, one conclusion at the top, on EP and DP data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from slowcard import queries
from slowcard.cli import app

ROOT = Path(__file__).resolve().parents[1]
REALDATA = ROOT.parent / "shared" / "realdata"
runner = CliRunner()


def test_readme_main_job_on_shipped_testdata(tmp_path):
    res = runner.invoke(
        app, ["diagnose", str(ROOT / "testdata" / "ep4_token_skew"), "--db", str(tmp_path / "d.duckdb")]
    )
    assert res.exit_code == 1  # it found a slow card
    lines = res.stdout.splitlines()
    assert lines[0].startswith("slowcard diagnose · run 'ep4_token_skew' · 4 ranks") and lines[0].endswith("FAIL")
    assert lines[1].startswith("Slow card: rank 1 — token-skew (")  # the card, its cause, its cost
    ep = queries.load_catalog()["ep-slow-rank"]
    assert any(line.split()[:2] == ["FAIL", f"ep-slow-rank@v{ep.version}"] for line in lines)  # the findings list
    assert not any(line.startswith("dp-imbalance@v") for line in lines)  # a SKIP is folded, not listed
    verbose = runner.invoke(app, ["diagnose", "--db", str(tmp_path / "d.duckdb"), "-v"])
    assert verbose.exit_code == 1
    assert any(line.startswith("dp-imbalance@v4 SKIP") for line in verbose.stdout.splitlines())


def test_real_ep_run_names_rank_1(tmp_path):
    src = REALDATA / "kineto_cpu_ep4_hot1"
    if not src.is_dir():
        pytest.skip(f"{src} is absent (../shared/realdata not beside the checkout)")
    res = runner.invoke(app, ["diagnose", str(src), "--db", str(tmp_path / "r.duckdb"), "--format", "json"])
    doc = json.loads(res.stdout)
    assert doc["conclusion"]["slow_cards"] == ["rank 1"] and doc["conclusion"]["cause"] == "token-skew"
    assert doc["conclusion"]["query"] == f"ep-slow-rank@v{queries.load_catalog()['ep-slow-rank'].version}"
    assert {r["query"] for r in doc["results"]} >= {"ep-slow-rank", "moe-breakdown", "sync-gaps"}


def test_dp_scenario_names_the_hot_domain(tmp_path):
    res = runner.invoke(
        app,
        [
            "diagnose",
            str(ROOT / "testdata" / "service_dp4_request_skew"),
            "--db",
            str(tmp_path / "s.duckdb"),
            "--format",
            "json",
        ],
    )
    doc = json.loads(res.stdout)
    assert doc["conclusion"]["query"].startswith("dp-imbalance@v")
    assert doc["conclusion"]["slow_cards"] == ["DP domain 1"]
    assert doc["conclusion"]["cause"] == "request-skew"
    assert res.exit_code == 1


def test_empty_database_is_a_usage_error(tmp_path):
    res = runner.invoke(app, ["diagnose", "--db", str(tmp_path / "none.duckdb")])
    assert res.exit_code == 2 and "no such database" in res.stderr


def test_real_cluster_step_trace_names_the_rank_others_wait_for(tmp_path):
    """msprof-analyze's cluster_step_trace_time.csv alone: rank 1 waits least at communication
    and idles most (Free) while the others wait for it; one card, even though two rows flag it."""
    src = REALDATA / "ascend"
    if not src.is_dir():
        pytest.skip(f"{src} is absent (../shared/realdata not beside the checkout)")
    res = runner.invoke(app, ["diagnose", str(src), "--db", str(tmp_path / "a.duckdb"), "--format", "json"])
    doc = json.loads(res.stdout)
    assert doc["conclusion"]["query"].startswith("cluster-step-skew@v")
    assert doc["conclusion"]["slow_cards"] == ["rank 1"]
    assert res.exit_code == 1
