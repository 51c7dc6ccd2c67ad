"""DP load-imbalance queries (dp-imbalance, dp-batch, dp-report) on generated msServiceProfiler runs."""

from __future__ import annotations

import filecmp
import math
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_service as ss  # noqa: E402

from slowcard import queries, store, verdict  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "testdata" / "service_dp4_request_skew"
# only the DP queries: a broken file elsewhere in sql/ must not hide what these tests say
CATALOG = {
    n: queries.parse_query(queries.builtin_sql_dir() / f"{n}.sql") for n in ("dp-imbalance", "dp-batch", "dp-report")
}

# scenario -> the only (dp_rank, cause, impact) rows dp-imbalance may return, and its status
EXPECTED = {
    "balanced": ("PASS", set()),
    "request_skew": ("FAIL", {(1, "request-skew", True)}),
    "token_skew": ("FAIL", {(1, "token-skew", True)}),
    "slow_execution": ("FAIL", {(1, "slow-execution", True)}),
    "burst": ("PASS", set()),
    "hot_no_impact": ("WARN", {(1, "request-skew", False)}),
    # a quarter of the KV pool: the pressure FAILs, the pool difference is a WARN finding of its own
    "kv_pressure": ("FAIL", {(1, "kv-pressure", True), (1, "config-mismatch", False)}),
    "no_dp_rank": ("SKIP", set()),
}
# scenario runs last 40 s (8 windows of 5 s): 20 s were too few requests to tell 1.6x from chance
DURATION_S = 40.0
SEEDS = (11, 12, 13)
# variants: (scenario, config overrides, files to leave out)
VARIANTS = (
    {
        # batch.csv without dp_rank and without KV columns: domains from process_labels, KV from counters
        "labels_only": ("slow_execution", {"batch_dp": False, "hot_dp": 2, "kv_columns": False}, ()),
        "no_request_csv": ("request_skew", {}, ("request.csv",)),
        "empty_dp": ("no_dp_rank", {"na_dp": "", "duration_s": 6.0}, ()),
        # request.csv names requests without vLLM's "-<n>" sample suffix (http id vs engine id)
        "http_rid": ("request_skew", {"duration_s": 6.0}, ()),
        # not enough to compare: one domain, or a handful of requests
        "single_domain": ("request_skew", {"n_dp": 1, "hot_dp": 0, "duration_s": 10.0}, ()),
        "few_requests": ("request_skew", {"duration_s": 3.0}, ()),
    }
    | {
        # equal pools and a smaller pool, over more seeds
        f"balanced_{s}": ("balanced", {"seed": s}, ())
        for s in SEEDS
    }
    | {f"kv_pressure_{s}": ("kv_pressure", {"seed": s}, ()) for s in SEEDS}
)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """Every scenario and variant as its own run in one database."""
    d = tmp_path_factory.mktemp("dp")
    path = d / "dp.duckdb"
    runs = {s: (s, {}, ()) for s in ss.SCENARIOS} | VARIANTS
    for run, (scenario, overrides, leave_out) in runs.items():
        folder = d / run
        ss.write_run(folder, ss.config_for(scenario, **({"duration_s": DURATION_S} | overrides)))
        # the DP queries read batch.csv, request.csv and the trace; forward.csv and kvcache.csv
        # are tested in test_service_csv.py (and ingesting them here would only cost time)
        for name in (*leave_out, "forward.csv", "kvcache.csv"):
            (folder / name).unlink()
        if run == "http_rid":
            req = folder / "request.csv"
            req.write_text(req.read_text().replace("-0,", ","))
        rep = ingest_paths(path, [folder], run=run)
        assert all(f.status == "ok" for f in rep.files), [(f.path, f.message) for f in rep.files]
    return path


@pytest.fixture(scope="module")
def con(db):
    c = store.open_db(db, read_only=True)
    yield c
    c.close()


def run(con, name, run_name, **params):
    return queries.run_query(con, CATALOG[name], run_name, params)


@pytest.mark.parametrize("scenario", list(EXPECTED))
def test_each_cause_is_found_on_its_scenario_and_on_no_other(con, scenario):
    status, rows = EXPECTED[scenario]
    res = run(con, "dp-imbalance", scenario)
    assert res.status == status, res.summary
    found = [r for r in res.rows if r["level"] != "PASS"]
    assert {(r["dp_rank"], r["cause"], r["impact"]) for r in found} == rows, res.rows
    if status == "PASS":  # a PASS says what it rests on, in one context row that is not a finding
        assert_pass_context(res)
    if rows:
        assert res.summary.startswith("DP 1: ")
        assert all(r["hot_windows"] >= 3 and r["next_step"] for r in res.rows)
        # one result, one level: each row says its own, FAIL exactly where it hurts
        assert all(r["level"] == ("FAIL" if r["impact"] else "WARN") for r in res.rows)
        assert [r["level"] for r in res.rows] == sorted(r["level"] for r in res.rows)
        assert all(r["skip_reason"] is None for r in res.rows)


@pytest.mark.parametrize("seed", SEEDS)
def test_kv_pressure_on_the_small_pool_names_the_configuration(con, seed):
    res = run(con, "dp-imbalance", f"kv_pressure_{seed}")
    assert res.status == "FAIL", res.summary
    assert [(r["dp_rank"], r["cause"], r["level"]) for r in res.rows] == [
        (1, "kv-pressure", "FAIL"),
        (1, "config-mismatch", "WARN"),
    ]
    kv, cfg = res.rows
    # the same load, a fuller KV cache, and the pool difference named as the likely root cause
    assert kv["requests_ratio"] < 1.2 and kv["tokens_ratio"] < 1.5
    assert kv["kv_usage"] > 1.5 * kv["others_kv_usage"] and kv["kv_z"] >= kv["z_crit"]
    assert (kv["total_blocks"], kv["others_total_blocks"]) == (24, 96)
    assert kv["root_cause"] == cfg["root_cause"] == "dp1 has 24 KV blocks, the others 96"
    assert "likely root cause: dp1 has 24 KV blocks, the others 96" in res.summary
    assert "admit fewer requests" in kv["next_step"] and "align its configuration" in kv["next_step"]
    assert "align start-up and deployment configuration" in cfg["next_step"]
    assert kv["queue_wait_ms"] > 2 * kv["others_queue_wait_ms"] and kv["cost_ms"] > 0 and kv["cost_pct"] > 0


def assert_pass_context(res):
    (ctx,) = res.rows
    assert ctx["level"] == "PASS" and ctx["dp_rank"] is None and ctx["cause"] is None, ctx
    assert verdict.row_levels(res.rows, res.spec.rule) == [None]  # not a finding, at no level
    # the smallest request skew this run could show: the domain count at z_crit against binomial
    # chance, as the others' mean; computed here from the row's own counts
    n, k, z = ctx["requests"], ctx["domains"], ctx["z_crit"]
    x = n / k + z * math.sqrt(n / k * (1 - 1 / k))
    assert ctx["detectable_request_ratio"] == pytest.approx(max(1.2, x / ((n - x) / (k - 1))), abs=0.011)
    assert f"{n} requests over {k} domains" in res.summary, res.summary
    assert f"{ctx['detectable_request_ratio']:.3g}x the others' requests" in res.summary, res.summary


@pytest.mark.parametrize("seed", SEEDS)
def test_equal_pools_pass(con, seed):
    res = run(con, "dp-imbalance", f"balanced_{seed}")
    assert res.status == "PASS", res.summary
    assert_pass_context(res)


def test_the_pass_line_follows_the_false_alarm_rate(con):
    """A looser false-alarm rate lowers the bar: the skew the same run could have shown shrinks
    (until skew_ratio, the persistence floor, holds it)."""
    strict, loose = (run(con, "dp-imbalance", "balanced", alpha=a, skew_ratio=1.0).rows[0] for a in (0.001, 0.2))
    assert strict["level"] == loose["level"] == "PASS"
    assert strict["z_crit"] > loose["z_crit"]
    assert strict["detectable_request_ratio"] > loose["detectable_request_ratio"] > 1.0


def test_too_little_to_compare_skips_with_the_reason(con):
    one = run(con, "dp-imbalance", "single_domain")
    assert one.status == "SKIP" and one.summary == "only one DP domain (dp0) in this run: nothing to compare it with"
    few = run(con, "dp-imbalance", "few_requests")
    n = con.execute("SELECT count(*) FROM requests WHERE run = 'few_requests'").fetchone()[0]
    assert few.status == "SKIP" and n < 40
    assert few.summary == (
        f"only {n} requests over 4 DP domains; at least 40 (min_requests) are needed to tell a hot domain from chance"
    )
    assert run(con, "dp-imbalance", "few_requests", min_requests=n).status != "SKIP"


def test_hot_domain_evidence_numbers(con):
    rows = {
        r: run(con, "dp-imbalance", r).rows[0]
        for r in ("request_skew", "token_skew", "slow_execution", "hot_no_impact")
    }
    rq, tk, sl, ok = rows["request_skew"], rows["token_skew"], rows["slow_execution"], rows["hot_no_impact"]
    assert (
        rq["requests_ratio"] >= 1.8
        and rq["tokens_ratio"] >= 1.8
        and (rq["requests_z"] >= rq["z_crit"] or rq["requests_t"] >= rq["requests_t_crit"])
    )
    assert tk["requests_ratio"] < 1.3 <= tk["tokens_ratio"] and tk["tokens_z"] >= tk["z_crit"]
    assert sl["requests_ratio"] < 1.3 and sl["tokens_ratio"] < 1.3 and sl["exec_ratio"] >= 1.8
    assert sl["exec_above"] == sl["exec_windows"] >= 13 and sl["exec_z"] >= sl["z_crit"]
    for r in (rq, tk, sl):
        assert r["queue_wait_ms"] > 10 * r["others_queue_wait_ms"] and "longer queue wait" in r["impact_signals"]
        # the cost: the first-token excess of its requests, and its share of the instance's first-token time
        assert r["cost_ms"] == pytest.approx(r["ttft_mean_ms"] - r["others_ttft_mean_ms"], abs=0.2)
        assert 0 < r["cost_pct"] < 100 and r["level"] == "FAIL"
        assert r["instance_ttft_p99_ms"] >= r["instance_ttft_p95_ms"] > 0
        assert r["instance_e2e_p99_ms"] >= r["instance_e2e_p95_ms"] > 0
    assert ok["impact_signals"] == "none" and ok["queue_wait_ms"] < 2 * ok["others_queue_wait_ms"] + 20
    assert ok["level"] == "WARN" and ok["cost_ms"] < 20
    assert "rebalance the DP scheduler" in rq["next_step"]
    assert "input/output tokens" in tk["next_step"]
    assert "device" in sl["next_step"] and "configuration" in sl["next_step"]


def test_a_burst_is_chance_not_a_hot_domain(con):
    # 4 s of 3x requests on dp1 in 40 s: visible in its windows, not beyond chance over the run
    assert run(con, "dp-imbalance", "burst").status == "PASS"
    wins = [r for r in run(con, "dp-batch", "burst").rows if r["scope"] == "window"]
    by_win = {}
    for r in wins:
        by_win.setdefault(r["window_no"], {})[r["dp_rank"]] = r["requests"]
    assert any(w[1] > 1.5 * max(v for d, v in w.items() if d != 1) for w in by_win.values() if len(w) == 4)
    # a lasting (2x) skew over the whole run is a hot domain
    assert run(con, "dp-imbalance", "request_skew").status == "FAIL"


def test_thresholds_are_parameters(con):
    # demanding a 2.5x skew makes the 2x request skew pass
    assert run(con, "dp-imbalance", "request_skew", skew_ratio=2.5).status == "PASS"
    # a low impact bar turns the harmless hot domain into a failing one only through its own numbers
    res = run(con, "dp-imbalance", "hot_no_impact", impact_ratio=1.0, min_wait_ms=0.0)
    assert res.rows and res.rows[0]["dp_rank"] == 1
    # a stricter false-alarm rate turns the 1.6x skew of 240 requests into chance
    assert run(con, "dp-imbalance", "hot_no_impact", alpha=1e-6).status == "PASS"


def test_no_dp_rank_skips_and_never_invents_domains(con):
    for name in ("dp-imbalance", "dp-batch", "dp-report"):
        res = run(con, name, "no_dp_rank")
        assert res.status == "SKIP" and "_dp_batches" in res.summary and not res.rows
    assert con.execute("SELECT count(*) FROM _dp_batches WHERE run IN ('no_dp_rank', 'empty_dp')").fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM batches WHERE run = 'empty_dp' AND dp_rank IS NULL").fetchone()[0] > 0
    assert run(con, "dp-imbalance", "empty_dp").status == "SKIP"
    msg = con.execute("SELECT message FROM sources WHERE run = 'no_dp_rank' AND format = 'service_batch'").fetchone()[0]
    assert "no dp_rank" in msg


def test_dp_domain_and_kv_from_the_trace_when_batch_csv_has_neither(con):
    res = run(con, "dp-imbalance", "labels_only")
    assert res.status == "FAIL"
    assert [(r["dp_rank"], r["cause"]) for r in res.rows] == [(2, "slow-execution")]
    report = {r["dp_rank"]: r for r in run(con, "dp-report", "labels_only").rows}
    assert sorted(report) == [0, 1, 2, 3]
    assert {r["dp_source"] for r in report.values()} == {"process_labels"}
    assert {r["kv_source"] for r in report.values()} == {"chrome_tracing"}
    assert all(r["kv_usage_mean"] is None for r in report.values())
    assert report[2]["min_free_blocks"] < min(report[d]["min_free_blocks"] for d in (0, 1, 3))


def test_without_request_csv_the_cause_still_comes_from_the_batches(con):
    res = run(con, "dp-imbalance", "no_request_csv")
    assert [(r["dp_rank"], r["cause"]) for r in res.rows] == [(1, "request-skew")]
    row = res.rows[0]
    assert row["queue_wait_ms"] is None and row["ttft_p99_ms"] is None
    # the waiting-queue counters of the trace still show the damage
    assert row["impact"] and "more waiting requests" in row["impact_signals"]
    assert row["waiting_mean"] >= 1 > row["others_waiting_mean"]
    assert row["requests_ratio"] >= 1.3  # first scheduling, not arrival: capped once the domain saturates


def test_request_csv_joins_on_the_rid_without_its_sample_suffix(con):
    rows = run(con, "dp-report", "http_rid").rows
    n_csv = con.execute("SELECT count(*) FROM requests WHERE run = 'http_rid' AND rid NOT LIKE '%-0'").fetchone()[0]
    assert n_csv > 0 and sum(r["requests"] for r in rows) == n_csv
    assert all(r["queue_wait_p99_ms"] is not None and r["ttft_p99_ms"] is not None for r in rows)
    assert con.execute("SELECT bool_and(from_request_csv) FROM _dp_requests WHERE run = 'http_rid'").fetchone()[0]


def test_dp_report_side_by_side(con, db):
    rows = run(con, "dp-report", "request_skew").rows
    assert [r["dp_rank"] for r in rows] == [0, 1, 2, 3]
    n_req = con.execute("SELECT count(*) FROM requests WHERE run = 'request_skew'").fetchone()[0]
    assert sum(r["requests"] for r in rows) == n_req
    assert sum(r["requests_pct"] for r in rows) == pytest.approx(100, abs=0.2)
    hot, cold = rows[1], rows[0]
    assert hot["requests_vs_median"] >= 1.8 and cold["requests_vs_median"] == pytest.approx(1, abs=0.05)
    assert hot["total_scheduled_tokens"] > 1.8 * cold["total_scheduled_tokens"]
    assert hot["kv_usage_mean"] > cold["kv_usage_mean"] and hot["queue_wait_p99_ms"] > cold["queue_wait_p99_ms"]
    for r in rows:
        assert r["exec_row_name"] == "modelExec" and r["requests_in_several_domains"] == 0
        assert r["dp_source"] == "batch.csv" and r["kv_source"] == "batch.csv"
    assert run(con, "dp-report", "request_skew").status == "INFO"
    # the KV pool of each domain: the configuration difference is visible side by side
    pools = {r["dp_rank"]: r["total_blocks"] for r in run(con, "dp-report", "kv_pressure").rows}
    assert pools == {0: 96, 1: 24, 2: 96, 3: 96}


def test_dp_batch_windows_add_up_to_the_run(con):
    res = run(con, "dp-batch", "slow_execution", window_s=10.0)
    assert res.status == "INFO"
    whole = {r["dp_rank"]: r for r in res.rows if r["scope"] == "run"}
    windows = [r for r in res.rows if r["scope"] == "window"]
    assert sorted(whole) == [0, 1, 2, 3] and res.rows[:4] == list(whole.values())
    for dp, w in whole.items():
        mine = [r for r in windows if r["dp_rank"] == dp]
        assert sum(r["batches"] for r in mine) == w["batches"]
        assert sum(r["requests"] for r in mine) == w["requests"]
        assert sum(r["total_scheduled_tokens"] or 0 for r in mine) == w["total_scheduled_tokens"]
        assert all(r["window_start_s"] == r["window_no"] * 10.0 for r in mine)
    assert whole[1]["exec_p50_ms"] > 1.8 * whole[0]["exec_p50_ms"]
    assert whole[1]["queue_wait_p99_ms"] > whole[0]["queue_wait_p99_ms"]
    # the instance's tail (all domains' requests), the same on every domain's row of a window
    p99 = con.execute(
        "SELECT quantile_cont(first_token_latency_ms, 0.99) FROM requests WHERE run = 'slow_execution'"
    ).fetchone()[0]
    assert all(w["instance_ttft_p99_ms"] == pytest.approx(p99, abs=0.01) for w in whole.values())
    for win in {r["window_no"] for r in windows}:
        same = {
            (r["instance_ttft_p95_ms"], r["instance_ttft_p99_ms"], r["instance_e2e_p99_ms"])
            for r in windows
            if r["window_no"] == win
        }
        assert len(same) == 1
        p95, p99, e2e = same.pop()
        assert p99 is None or (p99 >= p95 and e2e >= p99)


def test_committed_example_matches_the_generator_and_fails_on_dp1(tmp_path):
    fresh = tmp_path / "example"
    ss.write_run(fresh, ss.small_config("request_skew"))
    names = sorted(p.name for p in EXAMPLE.iterdir())
    assert names == sorted(p.name for p in fresh.iterdir())
    match, mismatch, errors = filecmp.cmpfiles(EXAMPLE, fresh, names, shallow=False)
    assert not mismatch and not errors, (
        f"regenerate with: python -m tests.synth_service --write {EXAMPLE.relative_to(REPO)}"
    )
    assert sum(p.stat().st_size for p in EXAMPLE.iterdir()) < 200_000
    assert all(p.stat().st_size < 100_000 for p in EXAMPLE.iterdir())
    db = tmp_path / "ex.duckdb"
    rep = ingest_paths(db, [EXAMPLE])
    assert all(f.status == "ok" for f in rep.files)
    c = store.open_db(db, read_only=True)
    res = run(c, "dp-imbalance", rep.run)
    assert res.status == "FAIL" and [(r["dp_rank"], r["cause"]) for r in res.rows] == [(1, "request-skew")]
    assert res.rows[0]["level"] == "FAIL" and res.rows[0]["cost_ms"] > 0
    c.close()
    shutil.rmtree(fresh)


def test_the_table_of_a_pass_shows_the_columns_it_rests_on(con):
    """A PASS's context row fills a few of the finding columns: the table shows those; a FAIL's
    table shows its headline columns, and --wide every column."""
    from slowcard.renderers import tables

    passed = run(con, "dp-imbalance", "balanced")
    assert tables.default_columns(passed) == [
        "level",
        "requests",
        "z_crit",
        "domains",
        "windows",
        "detectable_request_ratio",
    ]
    assert "NULL" not in tables.result_table(passed)
    failed = run(con, "dp-imbalance", "request_skew")
    shown = tables.default_columns(failed)
    assert shown[:4] == ["dp_rank", "level", "cause", "cost_ms"] and "tokens" in shown
    assert "next_step" not in shown and "next_step" in tables.default_columns(failed, wide=True)
