"""EP slow-card verdicts on generated multi-rank runs and on the real 4-rank run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_kineto  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

REALDATA = Path(__file__).resolve().parents[1].parent / "shared" / "realdata"
CATALOG = queries.load_catalog()
EXPECTED = {
    "balanced": None,
    "token_skew": "token-skew",
    "slow_compute": "slow-compute",
    "slow_link": "slow-comm",
    "noisy": None,
    "spike": None,
}
TWO_HOSTS = {2: 40_000, 3: 40_000}  # ranks 2 and 3 on a second host, clock 40 ms ahead


@pytest.fixture(scope="module")
def run_db(tmp_path_factory):
    """Build (and cache) a database for one generated scenario."""
    cache: dict = {}

    def make(scenario, style="gloo", offsets=None, ranks=4, slow_rank=1):
        key = (scenario, style, tuple(sorted((offsets or {}).items())), ranks, slow_rank)
        if key not in cache:
            d = tmp_path_factory.mktemp(f"{scenario}_{style}")
            synth_kineto.write_ep_run(
                d / "trace",
                scenario=scenario,
                style=style,
                ranks=ranks,
                slow_rank=slow_rank,
                clock_offsets_us=offsets,
                steps=4,
                layers=4,
            )
            db = d / "run.duckdb"
            report = ingest_paths(db, [d / "trace"], run="r")
            assert all(f.status == "ok" for f in report.files), report.files
            cache[key] = db
        return cache[key]

    return make


def verdict(db, name="ep-slow-rank", run="r", **params):
    con = queries.open_readonly(db)
    try:
        return queries.run_query(con, CATALOG[name], run, params)
    finally:
        con.close()


@pytest.mark.parametrize("style", ["gloo", "nccl"])
@pytest.mark.parametrize("scenario", list(EXPECTED))
def test_ep_slow_rank_scenarios(run_db, scenario, style):
    res = verdict(run_db(scenario, style))
    cause = EXPECTED[scenario]
    if cause is None:
        assert res.status == "PASS", res.rows
        assert res.rows == []
        assert "No rank stands out" in res.summary
    else:
        assert res.status == "FAIL"
        assert [(r["rank"], r["cause"]) for r in res.rows] == [(1, cause)]
        assert "rank 1" in res.summary and cause in res.summary
        # the advice belongs to the cause (a slow device is never told to rebalance experts)
        want = {
            "token-skew": "expert placement",
            "slow-compute": "device or process anomaly",
            "slow-comm": "links and NIC",
        }[cause]
        others = {"expert placement", "device or process anomaly", "links and NIC"} - {want}
        assert want in res.rows[0]["next_step"] and not any(o in res.rows[0]["next_step"] for o in others)


@pytest.mark.parametrize("scenario", ["token_skew", "slow_compute", "slow_link", "balanced"])
def test_clock_offset_between_hosts_changes_nothing(run_db, scenario):
    base = verdict(run_db(scenario))
    shifted = verdict(run_db(scenario, offsets=TWO_HOSTS))
    assert shifted.status == base.status
    assert [(r["rank"], r["cause"]) for r in shifted.rows] == [(r["rank"], r["cause"]) for r in base.rows]
    offsets = {r["host"]: r["offset_ms"] for r in verdict(run_db(scenario, offsets=TWO_HOSTS), "clock-offsets").rows}
    assert len(offsets) == 2
    assert sorted(offsets.values())[0] == 0.0
    assert sorted(offsets.values())[1] == pytest.approx(40.0, abs=0.05)


def test_slow_rank_other_than_one(run_db):
    res = verdict(run_db("token_skew", ranks=8, slow_rank=5))
    assert [(r["rank"], r["cause"]) for r in res.rows] == [(5, "token-skew")]


def test_thresholds_are_parameters(run_db):
    db = run_db("slow_compute")
    assert verdict(db).status == "FAIL"
    cheap = verdict(db, min_cost_pct=1000.0)  # the cost bar decides the level, not whether it is named
    assert cheap.status == "WARN" and cheap.params["min_cost_pct"] == 1000.0
    tiny = verdict(db, alpha=1e-12)  # a budget the run's instances cannot reach: not judged
    assert tiny.status == "SKIP" and "the sign test at alpha 1e-12 needs" in tiny.summary


def test_sync_gaps_and_rank_waits_name_the_last_arriver(run_db):
    db = run_db("slow_compute")
    waits = verdict(db, "rank-waits")
    by_rank = {r["rank"]: r for r in waits.rows}
    # the slow card waits least; the others wait for it
    assert min(by_rank, key=lambda k: by_rank[k]["mean_arrival_lag_us"]) == 1
    gaps = verdict(db, "sync-gaps", min_skew_us=500.0)
    assert gaps.rows and all(r["last_rank"] == 1 for r in gaps.rows)
    assert all(r["wait_us_by_rank"][1] == 0 for r in gaps.rows)


def test_moe_breakdown_and_durations(run_db):
    db = run_db("token_skew")
    rows = {r["rank"]: r for r in verdict(db, "moe-breakdown").rows}
    assert set(rows) == {0, 1, 2, 3}
    assert rows[1]["gmm_ms"] > 3 * rows[0]["gmm_ms"]
    assert rows[1]["tokens"] > 3 * rows[0]["tokens"]
    assert rows[0]["wait_ms"] > rows[1]["wait_ms"]
    per_layer = verdict(db, "moe-breakdown", by_layer=True).rows
    assert len(per_layer) == 16 and {r["layer"] for r in per_layer} == {0, 1, 2, 3}
    durs = verdict(db, "moe-layer-durations")
    assert durs.status == "INFO" and len(durs.rows) == 16
    assert all(r["instances"] == 4 and r["p50_us"] <= r["p99_us"] <= r["max_us"] for r in durs.rows)


@pytest.fixture(scope="module")
def real_ep_db(tmp_path_factory):
    src = REALDATA / "kineto_cpu_ep4_hot1"
    if not src.is_dir():
        pytest.skip(f"{src} is absent (../shared/realdata not beside the checkout)")
    db = tmp_path_factory.mktemp("real") / "ep.duckdb"
    ingest_paths(db, [src])
    return db


def test_real_ep_run_names_rank_1_token_skew(real_ep_db):
    res = verdict(real_ep_db, run="kineto_cpu_ep4_hot1")
    assert res.status == "FAIL"
    assert [(r["rank"], r["cause"]) for r in res.rows] == [(1, "token-skew")]
    assert res.rows[0]["tokens_per_layer"] > res.rows[0]["median_rank_tokens"]


def test_every_query_runs_on_every_real_file(tmp_path):
    if not REALDATA.is_dir():
        pytest.skip(f"{REALDATA} is absent")
    db = tmp_path / "all.duckdb"
    report = ingest_paths(db, [REALDATA], run="real")
    assert not report.failed, [f.message for f in report.failed]
    con = queries.open_readonly(db)
    try:
        for q in CATALOG.values():
            res = queries.run_query(con, q, "real")
            assert res.status != "ERROR", (q.name, res.summary)
    finally:
        con.close()


def test_a_run_with_duplicate_ranks_skips_cross_rank_queries_with_the_reason(tmp_path):
    """Two jobs ingested as one run (every rank twice): matching across ranks would pair calls
    of different jobs. Every query gives a status, never ERROR; the cross-rank ones SKIP and
    say why and what to do."""
    import shutil

    src = Path(__file__).resolve().parents[1] / "testdata" / "ep4_token_skew"
    for job in ("job_a", "job_b"):
        shutil.copytree(src, tmp_path / job)
    db = tmp_path / "dup.duckdb"
    ingest_paths(db, [tmp_path / "job_a", tmp_path / "job_b"], run="mixed")
    con = queries.open_readonly(db)
    try:
        conflicts = con.execute(
            "SELECT rank, format, n_files FROM rank_conflicts WHERE run = 'mixed' ORDER BY rank"
        ).fetchall()
        results = {q.name: queries.run_query(con, q, "mixed") for q in CATALOG.values()}
    finally:
        con.close()
    assert conflicts == [(r, "kineto", 2) for r in range(4)]
    assert not [(n, r.summary) for n, r in results.items() if r.status == "ERROR"]
    for name in ("sync-gaps", "rank-waits", "ep-slow-rank", "moe-breakdown"):
        assert results[name].status == "SKIP", (name, results[name].summary)
        assert "duplicate ranks" in results[name].summary and "--run-per-folder" in results[name].summary
    # ingested as one run per job, as the message advises, the same files give their verdict
    for job in ("job_a", "job_b"):
        ingest_paths(db, [tmp_path / job], run=job)
    con = queries.open_readonly(db)
    try:
        for job in ("job_a", "job_b"):
            res = queries.run_query(con, CATALOG["ep-slow-rank"], job)
            assert [(r["rank"], r["cause"]) for r in res.rows] == [(1, "token-skew")], res.summary
    finally:
        con.close()
