"""dp-metrics-imbalance stays quiet when one of its guards is missed, and the window arithmetic
of slowcard/metrics.py on the cases the watch tests do not reach (issue 33).

The verdict tests write metric windows as `slowcard watch` stores them (metric_window_rows: one
row per window and DP domain plus the instance row) with every number chosen: a domain is hot on
one signal over a streak, the instance's latency rises with it, and exactly one condition is
missed. Each test is named after that condition; loosening only its parameter makes the domain
count again (the other conditions hold).
"""

from __future__ import annotations

import math

import pytest

from slowcard import metrics as mx
from slowcard import queries, store
from slowcard.watch import parse_scrape

QUERY = queries.parse_query(queries.builtin_sql_dir() / "dp-metrics-imbalance.sql")
T0_NS = 1_773_992_798_000_000_000
WINDOW_S = 5.0
BASE = {"requests_per_s": 10.0, "prompt_tokens_per_s": 3000.0, "generation_tokens_per_s": 600.0, "waiting": 1.0}
BASE_KV = 0.3
LAT_MS = 100.0  # the instance's first-token P95/P99 and e2e P95/P99 before the streak


def windows(n, hot=lambda w: {}, domains=4, latency=lambda w: 1.0, base=None):
    """Window rows of ``n`` windows: every domain at ``base`` (else BASE, KV 0.3) and dp1 with
    ``hot(window)``'s values instead; the instance's latencies are LAT_MS x ``latency(window)``."""
    rows = []
    for w in range(n):
        ts = T0_NS + int((w + 1) * WINDOW_S * 1e9)
        for dp in range(domains):
            vals = {**(base or BASE), "kv_usage": BASE_KV} | (hot(w) if dp == 1 else {})
            rows.append({"ts_ns": ts, "dp_rank": dp, **vals})
        lat = LAT_MS * latency(w)
        rows.append({"ts_ns": ts, "dp_rank": None, "ttft_p95_ms": lat, "ttft_p99_ms": lat, "e2e_p95_ms": 10 * lat})
    return rows


def scripted(tmp_db, rows):
    """Store the rows as one watched run; returns ``judge(**params)``, dp-metrics-imbalance on it."""
    con = store.open_db(tmp_db)
    try:
        store.ensure_run(con, "live", "scripted")
        con.execute(
            "INSERT INTO sources (source_id, run, path, size_bytes, fingerprint, format, rows_seen, rows_kept, "
            "rows_dropped, status, message, metadata, ingested_at) "
            "VALUES (1, 'live', 'scripted', 0, '', 'metrics_scrape', 0, 0, 0, 'ok', '', '{}', now())"
        )
        cols = ", ".join(mx.WINDOW_COLUMNS)
        con.executemany(
            f"INSERT INTO metric_window_rows (source_id, {cols}) VALUES (1, {', '.join('?' * len(mx.WINDOW_COLUMNS))})",
            [
                [{"window_s": WINDOW_S, "targets": 1, "reset": False}.get(c, r.get(c)) for c in mx.WINDOW_COLUMNS]
                for r in rows
            ],
        )
    finally:
        con.close()

    def judge(**params):
        con = store.open_db(tmp_db, read_only=True)
        try:
            res = queries.run_query(con, QUERY, "live", params)
        finally:
            con.close()
        assert res.status != "ERROR", res.summary
        return res

    return judge


def found(res) -> list[tuple]:
    return [(r["dp_rank"], r["cause"], r["latency_rising"]) for r in res.rows]


def rising_from(start):
    return lambda w: 2.0 if w >= start else 1.0


HOT_REQUESTS = {"requests_per_s": 20.0, "prompt_tokens_per_s": 6000.0, "generation_tokens_per_s": 1200.0}


def test_a_hot_domain_with_rising_latency_fails(tmp_db):
    """The case every near miss below starts from: dp1 2x requests over the last 4 windows, the
    instance's P99 doubling with it."""
    res = scripted(tmp_db, windows(8, lambda w: HOT_REQUESTS if w >= 4 else {}, latency=rising_from(4)))()
    assert res.status == "FAIL" and found(res) == [(1, "request-skew", True)]
    assert res.rows[0]["hot_windows"] == 4 and res.rows[0]["ratio"] == 2.0


def test_the_streak_must_reach_the_latest_window(tmp_db):
    """Hot over windows 3-6, back to normal in the latest one: the alert clears (an alert that
    never reaches the latest window would never clear)."""
    rows = windows(8, lambda w: HOT_REQUESTS if 3 <= w <= 6 else {}, latency=rising_from(3))
    judge = scripted(tmp_db, rows)
    res = judge()
    assert res.status == "PASS" and res.rows == [], res.summary


def test_the_streak_needs_min_windows(tmp_db):
    rows = windows(8, lambda w: HOT_REQUESTS if w >= 6 else {}, latency=rising_from(6))
    judge = scripted(tmp_db, rows)
    assert judge().status == "PASS"
    assert found(judge(min_windows=2)) == [(1, "request-skew", True)]


def test_a_converging_domain_is_not_flagged(tmp_db):
    """Hot over the last 5 windows but closing in on the others (2x -> 1.45x): its share gap over
    the last two windows is less than (1 - converge_tolerance) x the gap over the first two."""
    ratio = {3: 2.0, 4: 1.9, 5: 1.7, 6: 1.5, 7: 1.45}

    def hot(w):
        return {"requests_per_s": 10.0 * ratio[w]} if w in ratio else {}

    rows = windows(8, hot, latency=rising_from(3))
    judge = scripted(tmp_db, rows)
    assert judge().status == "PASS"
    loose = judge(converge_tolerance=0.6)
    assert found(loose) == [(1, "request-skew", True)]
    row = loose.rows[0]
    assert 0 < row["share_gap_last"] < 0.75 * row["share_gap_first"]


def test_the_others_median_leaves_the_domain_out(tmp_db):
    """Two domains: dp1 at 1.6x dp0 is hot against the OTHER domain (median 10 -> 1.6x); a median
    that counted dp1 itself (13) would see only 1.23x."""
    res = scripted(tmp_db, windows(6, lambda w: {"requests_per_s": 16.0} if w >= 2 else {}, domains=2))()
    assert found(res) == [(1, "request-skew", False)]
    assert res.rows[0]["ratio"] == 1.6 and res.rows[0]["others_median_now"] == 10.0


def test_requests_need_more_than_the_counting_noise(tmp_db):
    """At 1.4 requests/s a domain (7 requests a window) 1.8x the others is within z = 3 Poisson
    sigmas of their count (it needs 1 + 3 / sqrt(7) = 2.13x)."""
    low = {"requests_per_s": 1.4, "prompt_tokens_per_s": 420.0, "generation_tokens_per_s": 84.0, "waiting": 1.0}
    hot = {"requests_per_s": 2.52, "prompt_tokens_per_s": 756.0, "generation_tokens_per_s": 151.2}
    rows = windows(8, lambda w: hot if w >= 4 else {}, base=low, latency=rising_from(4))
    judge = scripted(tmp_db, rows)
    assert judge().status == "PASS"
    loose = judge(z=1.0)
    assert found(loose) == [(1, "request-skew", True)]


def test_requests_need_skew_ratio(tmp_db):
    """At 100 requests/s the counting noise allows 1.13x; 1.25x is still below skew_ratio."""
    high = {"requests_per_s": 100.0, "prompt_tokens_per_s": 30000.0, "generation_tokens_per_s": 6000.0, "waiting": 1.0}
    hot = {"requests_per_s": 125.0, "prompt_tokens_per_s": 37500.0, "generation_tokens_per_s": 7500.0}
    rows = windows(8, lambda w: hot if w >= 4 else {}, base=high, latency=rising_from(4))
    judge = scripted(tmp_db, rows)
    assert judge().status == "PASS"
    assert found(judge(skew_ratio=1.2)) == [(1, "request-skew", True)]


def test_a_queue_needs_min_waiting_more_requests(tmp_db):
    rows = windows(8, lambda w: {"waiting": 3.0} if w >= 4 else {}, latency=rising_from(4))
    judge = scripted(tmp_db, rows)
    assert judge().status == "PASS"  # 3x the others' queue, but 2 more requests
    assert found(judge(min_waiting=1.0)) == [(1, "queue-skew", True)]


def test_kv_usage_needs_min_kv(tmp_db):
    base = {**BASE}
    rows = windows(8, lambda w: {"kv_usage": 0.25} if w >= 4 else {"kv_usage": 0.1}, base=base)
    for r in rows:  # the other domains at 0.1
        if r["dp_rank"] not in (None, 1):
            r["kv_usage"] = 0.1
    judge = scripted(tmp_db, rows)
    assert judge().status == "PASS"  # 2.5x the others' KV usage, but 0.25
    assert found(judge(min_kv=0.2)) == [(1, "kv-pressure", False)]


def test_fail_needs_the_latency_to_rise_by_latency_rise(tmp_db):
    rows = windows(8, lambda w: HOT_REQUESTS if w >= 4 else {}, latency=lambda w: 1.1 if w >= 4 else 1.0)
    judge = scripted(tmp_db, rows)
    res = judge()
    assert res.status == "WARN" and found(res) == [(1, "request-skew", False)]
    assert res.rows[0]["latency_ratio"] == pytest.approx(1.1)
    assert judge(latency_rise=1.05).status == "FAIL"


def test_a_streak_is_on_one_signal(tmp_db):
    """Requests hot in windows 4 and 6, tokens (heavier requests, same count) in 5 and 7: hot in
    each of the last 4 windows, but never 3 in a row on one signal."""
    heavy = {"prompt_tokens_per_s": 9000.0, "generation_tokens_per_s": 1800.0}
    more = {"requests_per_s": 20.0, "prompt_tokens_per_s": 3000.0, "generation_tokens_per_s": 600.0}

    def hot(w):
        return {4: more, 6: more, 5: heavy, 7: heavy}.get(w, {})

    rows = windows(8, hot, latency=rising_from(4))
    judge = scripted(tmp_db, rows)
    assert judge().status == "PASS"
    assert found(judge(min_windows=1)) == [(1, "token-skew", True)]


# ------------------------------------------------------------------------- window arithmetic


def test_histogram_quantile_at_a_flat_bucket_is_promqls():
    """The rank falls exactly on a bucket's count and the next bucket adds nothing: PromQL takes
    the first bucket that reaches the rank (0.1), not the next one that passes it (0.2)."""
    flat = [(0.1, 50.0), (0.2, 50.0), (0.5, 100.0), (math.inf, 100.0)]
    assert mx.histogram_quantile(0.5, flat) == pytest.approx(0.1)
    assert mx.histogram_quantile(0.75, flat) == pytest.approx(0.2 + 0.3 * 25 / 50)
    # all of it in the first bucket: interpolated from 0
    assert mx.histogram_quantile(1.0, [(0.1, 50.0), (0.2, 50.0), (math.inf, 50.0)]) == pytest.approx(0.1)


def _kv_scrape(value: float) -> str:
    return f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc {value}\n"


def test_kv_usage_of_a_domain_and_of_the_instance_is_the_mean_of_its_endpoints():
    """Two endpoints serving DP domain 0 report 0.2 and 0.6, the one of domain 1 0.1: domain 0's
    KV usage is 0.4 (the mean, a usage fraction does not add up), the instance's 0.3."""
    m = mx.Mapping()
    wanted = m.wanted()
    snaps = []
    for ts in (0, 1_000_000_000):
        snap = mx.Snapshot(ts_ns=ts)
        for target, value, dp in (("a", 0.2, 0), ("b", 0.6, 0), ("c", 0.1, 1)):
            assert parse_scrape(_kv_scrape(value), snap, m, wanted, target, 0, dp).ok
        snaps.append(snap)
    rows = {r["dp_rank"]: r for r in mx.window_rows(*snaps, m)}
    assert rows[0]["kv_usage"] == pytest.approx(0.4) and rows[0]["targets"] == 2
    assert rows[1]["kv_usage"] == pytest.approx(0.1)
    assert rows[None]["kv_usage"] == pytest.approx(0.3)
