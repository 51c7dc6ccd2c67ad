-- name: metric-timeline
-- version: 1
-- description: Live metrics over time (slowcard watch): per window, each DP domain's and the whole instance's requests/s, tokens/s, waiting requests, KV usage and TTFT / e2e P99, and the watched verdicts that were FAIL right after the window (the alerts).
-- requires: metric_windows
-- verdict: none
-- role: report
-- order: 137
-- shows: report.metrics
-- headline: since_start_s | scope | requests_per_s | waiting | kv_usage | ttft_p99_ms | failing
-- summary: {since_start_s} s {scope}: {requests_per_s} requests/s, {waiting} waiting, KV {kv_usage}, TTFT P99 {ttft_p99_ms} ms
--
-- The data behind the report's live-metrics section. One row per (window, domain) and one per
-- window for the instance (dp_rank NULL, scope 'instance'); since_start_s counts from the
-- first window's end. failing: the watched verdicts whose status was FAIL at the first
-- evaluation at or after the window's end (slowcard watch judges after each collection), NULL
-- when none or when the run has no recorded verdicts (metrics ingested another way).
WITH w AS (
    SELECT * FROM metric_windows WHERE run = $run
), t0 AS (
    SELECT min(ts_ns) AS t0 FROM w
), evaluations AS (   -- one row per evaluation time: the verdicts FAIL then
    SELECT ts_ns, string_agg(query, ', ' ORDER BY query) FILTER (WHERE status = 'FAIL') AS failing
    FROM metric_verdicts WHERE run = $run GROUP BY ts_ns
), ends AS (
    SELECT DISTINCT ts_ns FROM w
), alerts AS (
    SELECT e.ts_ns, v.failing FROM ends e ASOF LEFT JOIN evaluations v ON v.ts_ns >= e.ts_ns
)
SELECT round((w.ts_ns - t0.t0) / 1e9, 3) AS since_start_s,
       w.ts_ns,
       round(w.window_s, 3) AS window_s,
       w.dp_rank,
       CASE WHEN w.dp_rank IS NULL THEN 'instance' ELSE 'DP ' || w.dp_rank END AS scope,
       round(w.requests_per_s, 3) AS requests_per_s,
       round(w.tokens_per_s, 1) AS tokens_per_s,
       w.running,
       w.waiting,
       round(w.kv_usage, 4) AS kv_usage,
       round(w.ttft_p99_ms, 1) AS ttft_p99_ms,
       round(w.e2e_p99_ms, 1) AS e2e_p99_ms,
       w.reset,
       a.failing
FROM w CROSS JOIN t0 LEFT JOIN alerts a ON a.ts_ns = w.ts_ns
ORDER BY w.ts_ns, w.dp_rank NULLS FIRST
