"""dp-imbalance stays quiet when one of its guards is missed (issue 33).

Each test is named after the condition that keeps the verdict quiet. Its run (tests/dp_script.py:
every request, execution time and KV level written as given) satisfies every other condition of
the cause and misses this one: the verdict stays PASS (or WARN for the impact guards). The same
run with only that guard loosened (its parameter, or alpha so high that the critical z is 0) names
the domain, which shows that the guard is what kept it quiet. A few tests check a statistic
against its definition computed here (which windows the steady-excess tests leave out).
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import dp_script as ds  # noqa: E402

from slowcard import queries, store  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

QUERY = queries.parse_query(queries.builtin_sql_dir() / "dp-imbalance.sql")
N_DP, HOT = 4, 1
NO_BAR = 8.0  # alpha / (4 tests x 4 domains) >= 0.5: the critical z is 0, significance is no bar


def _tokens(w: int, dp: int, i: int) -> int:
    """Prompt lengths that vary (400-770) the same way on every domain: log-token variance > 0."""
    return 400 + 37 * ((w * 7 + dp * 3 + i * 5) % 11)


def _balanced(windows: int = 20, n: int = 3) -> dict:
    return {(w, d): n for w in range(windows) for d in range(N_DP)}


# dp1 gets 1.33x the others' requests over 12 windows, but per window as unevenly as chance gives
_CYCLE, _OTHERS = (1, 6, 2, 5, 3, 3), (2, 3, 3, 2)
NOISY = {(w, d): (_CYCLE[w % 6] if d == HOT else _OTHERS[(w + d) % 4]) for w in range(20) for d in range(N_DP)}
NOISY_12 = {k: v for k, v in NOISY.items() if k[0] < 12}
# a steady 1.5x: dp1 gets 3 requests in every window, the others 2
STEADY = {(w, d): (3 if d == HOT else 2) for w in range(20) for d in range(N_DP)}
# steady, plus two windows where dp1 gets 8: the steady-excess test must leave those out
STEADY_BURST = {(w, d): (8 if d == HOT and w in (4, 9) else n) for (w, d), n in STEADY.items()}
# a steady 1.17x (below skew_ratio): dp1 gets 7 requests in every window, the others 6
STEADY_117 = {(w, d): (7 if d == HOT else 6) for w in range(20) for d in range(N_DP)}
# two windows (a short run): dp1 gets 2x the others' requests in both
SHORT_2X = {(w, d): (24 if d == HOT else 12) for w in range(2) for d in range(N_DP)}
BURST_WINDOWS = (6, 13)


def _prompt(factor_of):
    return lambda w, d, i: {"prompt": int(_tokens(w, d, i) * factor_of(w, d, i))}


def _exec(slow):
    """Every domain ~100 ms per window (a little wobble), dp1 ``slow(window)`` times that."""
    return ds.per_window_execs(20, N_DP, lambda w, d: (slow(w) if d == HOT else 1.0) * (100 + 3 * ((w + d) % 4)))


def _kv(hot_usage, others=lambda w, d: 0.20 + 0.01 * ((w + d) % 3)):
    return ds.per_window_kv(20, N_DP, lambda w, d: hot_usage(w) if d == HOT else others(w, d))


def _fields(**kw):
    """Request fields: each value a constant, or (hot domain's, others') pair."""
    return lambda w, d, i: {k: (v[0] if d == HOT else v[1]) if isinstance(v, tuple) else v for k, v in kw.items()}


def _instance_case(cold_windows):
    """Steady 1.5x except in the cold windows (all domains equal there); every request of the hot
    windows has a 300 ms first token, every request of the cold windows 50 ms (all domains alike)."""
    counts = {(w, d): (2 if w in cold_windows else n) for (w, d), n in STEADY.items()}
    return ds.counts_run(counts, lambda w, d, i: {"ttft_ms": 50.0 if w in cold_windows else 300.0})


CASES = {
    "noisy_requests": (ds.counts_run(NOISY_12), (), ()),
    "steady_117": (ds.counts_run(STEADY_117), (), ()),
    "short_request_skew": (ds.counts_run(SHORT_2X), (), ()),
    "steady_burst": (ds.counts_run(STEADY_BURST), (), ()),
    "few_heavy_requests": (
        ds.counts_run(
            _balanced(), _prompt(lambda w, d, i: 25 if d == HOT and (w, i) in ((2, 0), (9, 1), (15, 2)) else 1)
        ),
        (),
        (),
    ),
    "tokens_14x": (ds.counts_run(_balanced(), _prompt(lambda w, d, i: 1.4 if d == HOT else 1)), (), ()),
    "short_token_skew": (
        ds.counts_run(_balanced(2, 6), _prompt(lambda w, d, i: 3 if d == HOT else 1)),
        (),
        (),
    ),
    # every domain gets 10 requests in the burst windows (3 elsewhere); only dp1's are 10x longer there
    "token_burst": (
        ds.counts_run(
            {(w, d): (10 if w in BURST_WINDOWS else 3) for w in range(20) for d in range(N_DP)},
            _prompt(lambda w, d, i: 10 if d == HOT and w in BURST_WINDOWS else 1),
        ),
        (),
        (),
    ),
    # 1.6x tokens in every window, plus 10x in the burst windows: a token-skew with a burst in it
    "token_skew_burst": (
        ds.counts_run(
            _balanced(),
            _prompt(lambda w, d, i: (10 if w in BURST_WINDOWS else 1.6) if d == HOT else 1),
        ),
        (),
        (),
    ),
    "exec_in_12_of_20": (ds.counts_run(_balanced()), _exec(lambda w: 1.5 if w % 5 < 3 else 0.9), ()),
    "exec_11x": (ds.counts_run(_balanced()), _exec(lambda w: 1.1), ()),
    "exec_on_more_load": (ds.counts_run(NOISY), _exec(lambda w: 1.5), ()),
    "kv_in_12_of_20": (ds.counts_run(_balanced()), (), _kv(lambda w: 0.6 if w % 5 < 3 else 0.15)),
    "kv_16x_on_117_load": (ds.counts_run(STEADY_117), (), _kv(lambda w: 0.48, lambda w, d: 0.30)),
    "kv_tiny": (ds.counts_run(_balanced()), (), _kv(lambda w: 0.04, lambda w, d: 0.02)),
    "kv_14x": (ds.counts_run(_balanced()), (), _kv(lambda w: 0.42, lambda w, d: 0.30)),
    "wait_10ms_more": (ds.counts_run(STEADY, _fields(wait_ms=(15.0, 5.0))), (), ()),
    "wait_13x": (ds.counts_run(STEADY, _fields(wait_ms=(130.0, 100.0))), (), ()),
    "instance_16_others": (_instance_case((0, 1)), (), ()),
    "instance_24_others": (_instance_case((0, 1, 2)), (), ()),
}


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    d = tmp_path_factory.mktemp("restraint_dp")
    db = d / "dp.duckdb"
    w = store.open_db(db)
    try:
        for name, (reqs, execs, kvs) in CASES.items():
            ds.write_run(d / name, reqs, execs, kvs, n_dp=N_DP)
            rep = ingest_paths(db, [d / name], run=name, con=w)
            assert all(f.status == "ok" for f in rep.files), [(f.path, f.message) for f in rep.files]
    finally:
        w.close()
    c = store.open_db(db, read_only=True)
    yield c
    c.close()


def verdict(con, case, **params):
    res = queries.run_query(con, QUERY, case, params)
    assert res.status != "ERROR", res.summary
    return res


def found(res) -> list[tuple]:
    return [(r["dp_rank"], r["cause"], r["level"]) for r in res.rows if r["level"] in ("FAIL", "WARN")]


def quiet(con, case, **params):
    res = verdict(con, case, **params)
    assert res.status == "PASS" and found(res) == [], res.summary
    return res


# ------------------------------------------------------------------------- request-skew


def test_request_skew_needs_significance_beyond_chance(con):
    # 1.33x the others' requests, above its share in 8 of 12 windows: as uneven as chance gives
    quiet(con, "noisy_requests")
    loose = verdict(con, "noisy_requests", alpha=NO_BAR)
    assert found(loose) == [(HOT, "request-skew", "WARN")]
    row = loose.rows[0]
    assert row["requests_ratio"] >= 1.2 and row["requests_z"] < 3.2 and row["requests_t"] < 3.2


def test_request_skew_needs_skew_ratio_more_requests(con):
    # a steady 1.17x is far beyond chance (steady-excess t), but less than skew_ratio more requests
    quiet(con, "steady_117")
    loose = verdict(con, "steady_117", skew_ratio=1.1)
    assert found(loose) == [(HOT, "request-skew", "WARN")]
    row = loose.rows[0]
    assert row["requests_ratio"] == pytest.approx(7 / 6, abs=0.005) and row["requests_t"] >= row["requests_t_crit"]


def test_request_skew_in_a_short_run_needs_min_windows_above_its_share(con):
    # 2 windows: 2x the requests, z beyond chance, but above its share in 2 < min_windows windows
    quiet(con, "short_request_skew")
    loose = verdict(con, "short_request_skew", min_windows=2)
    assert found(loose) == [(HOT, "request-skew", "WARN")]
    assert loose.rows[0]["requests_z"] >= loose.rows[0]["z_crit"]


def _steady_t(counts: dict, dp: int, drop: int) -> float:
    """dp-imbalance's steady-excess t: the per-window excess over the fair share, the ``drop``
    windows of largest excess (ties: the earlier window) left out, spread floored at 0.25."""
    windows = sorted({w for w, _ in counts})
    excess = {w: counts[(w, dp)] - sum(counts[(w, d)] for d in range(N_DP)) / N_DP for w in windows}
    hottest = sorted(windows, key=lambda w: (-excess[w], w))[:drop]
    kept = [excess[w] for w in windows if w not in hottest]
    return statistics.mean(kept) / (max(statistics.stdev(kept), 0.25) / math.sqrt(len(kept)))


def test_request_steady_excess_leaves_out_the_hottest_windows(con):
    """The steady-excess t-test leaves out the domain's min_windows - 1 HOTTEST windows (a burst
    cannot carry it), not its coldest ones: the t it reports is the one of the other windows."""
    res = verdict(con, "steady_burst")
    assert found(res) == [(HOT, "request-skew", "WARN")]
    row = res.rows[0]
    assert row["requests_t"] == pytest.approx(_steady_t(STEADY_BURST, HOT, drop=2), abs=0.006)
    assert row["requests_t"] != pytest.approx(_steady_t(STEADY_BURST, HOT, drop=0), abs=0.05)


# ------------------------------------------------------------------------- token-skew


def test_token_skew_needs_significance_beyond_chance(con):
    # 3 of dp1's 60 requests are 25x long: 2.2x its tokens, but its typical request is no longer
    quiet(con, "few_heavy_requests")
    loose = verdict(con, "few_heavy_requests", alpha=NO_BAR)
    assert found(loose) == [(HOT, "token-skew", "WARN")]
    assert loose.rows[0]["tokens_ratio"] >= 1.5 and loose.rows[0]["tokens_z"] < 3.2


def test_token_skew_needs_token_ratio_more_tokens(con):
    # every dp1 request is 1.4x longer: far beyond chance, but less than token_ratio more tokens
    quiet(con, "tokens_14x")
    loose = verdict(con, "tokens_14x", token_ratio=1.3)
    assert found(loose) == [(HOT, "token-skew", "WARN")]
    assert 1.3 <= loose.rows[0]["tokens_ratio"] < 1.5  # (the outputs are not longer)


def test_token_skew_in_a_short_run_needs_min_windows_above_its_share(con):
    quiet(con, "short_token_skew")
    loose = verdict(con, "short_token_skew", min_windows=2)
    assert found(loose) == [(HOT, "token-skew", "WARN")]
    assert loose.rows[0]["tokens_z"] >= loose.rows[0]["z_crit"]


def test_token_burst_in_the_two_hottest_windows_is_left_out(con):
    """10x longer requests on dp1 in 2 of 20 windows: the token test leaves out the domain's
    min_windows - 1 hottest token windows, so a burst is not token-skew; keeping every window
    (min_windows 1) it would be."""
    quiet(con, "token_burst")
    kept = verdict(con, "token_burst", min_windows=1)
    assert found(kept) == [(HOT, "token-skew", "WARN")]
    assert kept.rows[0]["requests_ratio"] == 1.0


def _welch_log_z(reqs, dp: int, drop: int) -> float:
    """dp-imbalance's token test: Welch's z of mean log(tokens) per request, the domain's against the
    other domains' requests, over the windows left once the domain's ``drop`` windows of largest
    token excess are left out (on both sides of the comparison)."""
    tok = {}
    for r in reqs:
        w = int(r.t_s // ds.WINDOW_S)
        tok.setdefault(w, {}).setdefault(r.dp, []).append(r.prompt + r.output)
    excess = {w: sum(by.get(dp, [])) - sum(sum(v) for v in by.values()) / N_DP for w, by in tok.items()}
    hottest = set(sorted(excess, key=lambda w: (-excess[w], w))[:drop])
    own = [math.log(t) for w, by in tok.items() if w not in hottest for t in by.get(dp, [])]
    rest = [math.log(t) for w, by in tok.items() if w not in hottest for d, v in by.items() if d != dp for t in v]
    se = math.sqrt(statistics.variance(own) / len(own) + statistics.variance(rest) / len(rest))
    return (statistics.mean(own) - statistics.mean(rest)) / se


def test_token_z_leaves_out_the_hottest_windows_on_both_sides(con):
    res = verdict(con, "token_skew_burst")
    assert found(res) == [(HOT, "token-skew", "WARN")]
    reqs = CASES["token_skew_burst"][0]
    assert res.rows[0]["tokens_z"] == pytest.approx(_welch_log_z(reqs, HOT, drop=2), abs=0.006)
    assert res.rows[0]["tokens_z"] != pytest.approx(_welch_log_z(reqs, HOT, drop=0), abs=0.05)


# ------------------------------------------------------------------------- slow-execution


def test_slow_execution_needs_the_sign_test_over_windows(con):
    # dp1 is 1.5x slower in 12 of 20 windows, 0.9x in the rest: a median of 1.42x, a coin's sign count
    quiet(con, "exec_in_12_of_20")
    loose = verdict(con, "exec_in_12_of_20", alpha=NO_BAR)
    assert found(loose) == [(HOT, "slow-execution", "WARN")]
    row = loose.rows[0]
    assert (row["exec_above"], row["exec_windows"]) == (12, 20) and row["exec_ratio"] >= 1.2


def test_slow_execution_needs_exec_ratio_slower(con):
    # slower in every window (far beyond chance), but only 1.1x
    quiet(con, "exec_11x")
    loose = verdict(con, "exec_11x", exec_ratio=1.05)
    assert found(loose) == [(HOT, "slow-execution", "WARN")]
    assert loose.rows[0]["exec_above"] == loose.rows[0]["exec_windows"] == 20


def test_slow_execution_only_on_similar_load(con):
    # 1.5x slower in every window, but with 1.34x the requests (not significant): busier, not slower
    quiet(con, "exec_on_more_load")
    loose = verdict(con, "exec_on_more_load", skew_ratio=1.4)
    assert found(loose) == [(HOT, "slow-execution", "WARN")]
    assert loose.rows[0]["requests_ratio"] >= 1.2


# ------------------------------------------------------------------------- kv-pressure


def test_kv_pressure_needs_the_sign_test_over_windows(con):
    # mean KV usage 2x the others', but above them in only 12 of 20 windows
    quiet(con, "kv_in_12_of_20")
    loose = verdict(con, "kv_in_12_of_20", alpha=NO_BAR)
    assert found(loose) == [(HOT, "kv-pressure", "WARN")]
    assert loose.rows[0]["kv_ratio"] == 2.0 and "in 12 of 20 windows" in loose.rows[0]["evidence"]


def test_kv_pressure_ratio_is_scaled_by_the_domain_load(con):
    """KV usage follows load: with 1.17x the requests (and tokens), 1.6x the others' KV usage is
    below kv_ratio x 1.17 = 1.75, so it is not KV pressure; without the load it would be (1.6 >= 1.5)."""
    quiet(con, "kv_16x_on_117_load")
    loose = verdict(con, "kv_16x_on_117_load", kv_ratio=1.3)  # 1.3 x 1.17 = 1.52 <= 1.6
    assert found(loose) == [(HOT, "kv-pressure", "WARN")]
    row = loose.rows[0]
    assert row["kv_ratio"] == pytest.approx(1.6) and row["kv_ratio"] >= 1.5
    assert row["requests_ratio"] == pytest.approx(7 / 6, abs=0.005) and row["kv_z"] >= row["z_crit"]


def test_kv_pressure_needs_kv_min_above_the_others(con):
    # 2x the others' KV usage in every window, but 0.04 against 0.02
    quiet(con, "kv_tiny")
    assert found(verdict(con, "kv_tiny", kv_min=0.01)) == [(HOT, "kv-pressure", "WARN")]


def test_kv_pressure_needs_kv_ratio_fuller(con):
    # fuller in every window (0.42 vs 0.30), but 1.4x < kv_ratio
    quiet(con, "kv_14x")
    assert found(verdict(con, "kv_14x", kv_ratio=1.3)) == [(HOT, "kv-pressure", "WARN")]


# ------------------------------------------------------------------------- impact: FAIL or WARN


def test_impact_needs_min_wait_ms_of_extra_queue_wait(con):
    # the hot domain's requests wait 3x as long as the others', but 15 ms against 5 ms
    res = verdict(con, "wait_10ms_more")
    assert res.status == "WARN" and found(res) == [(HOT, "request-skew", "WARN")]
    assert res.rows[0]["impact_signals"] == "none"
    assert found(verdict(con, "wait_10ms_more", min_wait_ms=5.0)) == [(HOT, "request-skew", "FAIL")]


def test_impact_needs_impact_ratio_longer_queue_wait(con):
    # 30 ms longer waits (above min_wait_ms), but 130 ms against 100 ms: 1.3x
    res = verdict(con, "wait_13x")
    assert res.status == "WARN" and found(res) == [(HOT, "request-skew", "WARN")]
    assert found(verdict(con, "wait_13x", impact_ratio=1.2)) == [(HOT, "request-skew", "FAIL")]


def test_instance_p99_impact_needs_20_requests_outside_the_hot_windows(con):
    """The instance's first-token P99 in the domain's hot windows (300 ms) against its other
    windows (50 ms) counts only with >= 20 requests in those other windows: 16 are too few to
    have a P99 (a run-long skew leaves few), 24 are enough."""
    few = verdict(con, "instance_16_others")
    assert few.status == "WARN" and found(few) == [(HOT, "request-skew", "WARN")]
    row = few.rows[0]
    assert (row["instance_ttft_p99_ms"], row["instance_ttft_p99_other_ms"]) == (300.0, 50.0)
    assert row["impact_signals"] == "none"
    enough = verdict(con, "instance_24_others")
    assert found(enough) == [(HOT, "request-skew", "FAIL")]
    assert enough.rows[0]["impact_signals"] == "instance first-token P99 rises in its hot windows"
