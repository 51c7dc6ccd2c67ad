"""ep-hot-chain: hot expert -> rank -> operator time, FAIL only when all three coincide."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_experts  # noqa: E402
import synth_kineto  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.diagnosis import diagnose  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

CATALOG = queries.load_catalog()


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """One database, one run per (expert scenario, trace scenario) pair."""
    d = tmp_path_factory.mktemp("chain")
    path = d / "chain.duckdb"
    for exp, trace in PAIRS:
        run = f"{exp}+{trace}"
        synth_experts.write_scenario(exp, d / run / "experts")
        synth_kineto.write_ep_run(d / run / "trace", scenario=trace, steps=3, layers=3)
        ingest_paths(path, [d / run], run=run)
    return path


PAIRS = [
    ("concentrated", "token_skew"),
    ("spread", "balanced"),
    ("slow_device", "slow_compute"),
    ("concentrated", "balanced"),
    ("spike", "balanced"),
]


def chain(db, run):
    con = queries.open_readonly(db)
    try:
        return queries.run_query(con, CATALOG["ep-hot-chain"], run)
    finally:
        con.close()


def test_fail_only_when_hot_expert_hot_rank_and_slow_operator_coincide(db):
    res = chain(db, "concentrated+token_skew")
    assert res.status == "FAIL"
    assert [(r["rank"], r["finding"], r["coincide"]) for r in res.rows] == [(1, "ep-imbalance", True)]
    assert "/E4 " in res.rows[0]["hot_experts"] and "/E5 " in res.rows[0]["hot_experts"]
    assert res.rows[0]["gmm_ratio"] > 2


def test_spread_hot_experts_are_reported_as_spread_not_imbalance(db):
    res = chain(db, "spread+balanced")
    assert res.status == "WARN"
    assert [r["finding"] for r in res.rows] == ["hot-experts-spread"]
    assert "4 ranks" in res.rows[0]["subject"]


def test_slow_rank_without_hot_expert_is_a_device_anomaly(db):
    res = chain(db, "slow_device+slow_compute")
    assert res.status == "WARN"
    assert [(r["rank"], r["finding"]) for r in res.rows] == [(1, "device-anomaly")]
    assert "not routing" in res.rows[0]["next_step"]


def test_hot_rank_with_normal_operators_is_not_a_failure(db):
    res = chain(db, "concentrated+balanced")
    assert res.status == "WARN"
    assert [(r["rank"], r["finding"]) for r in res.rows] == [(1, "hot-rank-not-slow")]


def test_single_window_spike_passes(db):
    assert chain(db, "spike+balanced").status == "PASS"


def test_diagnose_names_rank_and_experts(db):
    con = queries.open_readonly(db)
    try:
        diag = diagnose(con, "concentrated+token_skew", CATALOG)
    finally:
        con.close()
    assert diag.conclusion["query"] == "ep-hot-chain@v1"
    assert diag.conclusion["slow_cards"] == ["EP rank 1"]
    assert diag.conclusion["cause"] == "ep-imbalance"
    assert "/E4 " in diag.conclusion["evidence"]


def test_trace_side_uses_the_ep_rank_of_a_vllm_folder_not_the_global_rank(tmp_path):
    """vLLM writes each worker's trace into dp{d}_pp{p}_tp{t}_dcp{c}_ep{e}_rank{g}_…; expert load
    is indexed by EP rank e, which need not equal the global rank g. Here EP rank = (g + 1) % 4:
    the hot experts live on EP rank 1, held by global rank 0, whose trace shows the token skew.
    Joined by global rank instead, EP rank 1's load would meet global rank 1's balanced trace."""
    synth_experts.write_scenario("concentrated", tmp_path / "run" / "experts")
    flat = tmp_path / "flat"
    paths = synth_kineto.write_ep_run(flat, scenario="token_skew", slow_rank=0, steps=3, layers=3)
    for g, p in enumerate(sorted(paths)):
        d = tmp_path / "run" / f"dp0_pp0_tp0_dcp0_ep{(g + 1) % 4}_rank{g}_worker"
        d.mkdir(parents=True)
        p.rename(d / p.name)
    db = tmp_path / "chain.duckdb"
    rep = ingest_paths(db, [tmp_path / "run"], run="v")
    assert all(f.status == "ok" for f in rep.files), [(f.path, f.message) for f in rep.files]
    res = chain(db, "v")
    assert res.status == "FAIL", res.summary
    # the finding's rank is the EP rank (the index of the expert map and load)
    assert [(r["rank"], r["finding"], r["coincide"]) for r in res.rows] == [(1, "ep-imbalance", True)]
    assert "/E4 " in res.rows[0]["hot_experts"] and res.rows[0]["gmm_ratio"] > 2
