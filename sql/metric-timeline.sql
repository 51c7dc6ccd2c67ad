-- name: metric-timeline
-- version: 2
-- description: Live metrics over time (slowcard watch): per window, each DP domain's and the whole instance's requests/s, tokens/s, waiting requests, KV usage and TTFT / e2e P99, and the watched verdicts that were FAIL right after the window (the alerts); a long watch is merged into at most about max_points points, the alert windows kept whole.
-- requires: metric_windows
-- param: max_points INTEGER = 1500   -- windows drawn at most (about): beyond it, consecutive quiet windows are merged; a window with an alert is never merged
-- verdict: none
-- role: report
-- order: 137
-- shows: report.metrics
-- headline: since_start_s | scope | windows | requests_per_s | waiting | kv_usage | ttft_p99_ms | failing
-- summary: {since_start_s} s {scope}: {requests_per_s} requests/s, {waiting} waiting, KV {kv_usage}, TTFT P99 {ttft_p99_ms} ms
--
-- The data behind the report's live-metrics section. One row per (point, domain) and one per
-- point for the instance (dp_rank NULL, scope 'instance'); since_start_s counts from the
-- first window's end to the point's last window end. failing: the watched verdicts whose
-- status was FAIL at the first evaluation at or after the window's end (slowcard watch judges
-- after each collection), NULL when none or when the run has no recorded verdicts (metrics
-- ingested another way).
--
-- A point is one window while the run has at most max_points windows (every value as stored).
-- A day of one-second windows (86,400) cannot be drawn window by window: the windows are cut
-- into max_points slices of time, and the quiet windows of one slice (no alert, and no alert
-- between them) become one point: window_s their summed length, windows their count, rates the
-- time-weighted mean over them (the rate over the merged span), gauges (running, waiting, KV
-- usage) their peak, and the P99s their largest (never below the merged span's own P99: a value
-- above every part's P99 is above 99 % of the union). A window with an alert stays a point of its own, so the
-- alert periods are drawn exactly where they were.
WITH w AS (
    SELECT * FROM metric_windows WHERE run = $run
), t0 AS (
    SELECT min(ts_ns) AS t0 FROM w
), evaluations AS (   -- one row per evaluation time: the verdicts FAIL then
    SELECT ts_ns, string_agg(query, ', ' ORDER BY query) FILTER (WHERE status = 'FAIL') AS failing
    FROM metric_verdicts WHERE run = $run GROUP BY ts_ns
), ends AS (          -- the windows in time order
    SELECT ts_ns, row_number() OVER (ORDER BY ts_ns) - 1 AS seq, count(*) OVER () AS n
    FROM (SELECT DISTINCT ts_ns FROM w)
), alerts AS (
    SELECT e.ts_ns, e.seq, e.n, v.failing FROM ends e ASOF LEFT JOIN evaluations v ON v.ts_ns >= e.ts_ns
), points AS (        -- the point each window is drawn in: its own when it has an alert
    SELECT ts_ns, failing,
           CASE WHEN failing IS NOT NULL THEN 'alert ' || seq
                ELSE 'slice ' || (seq * greatest($max_points, 1) // n) || ' after '
                     || count(failing) OVER (ORDER BY seq ROWS UNBOUNDED PRECEDING) || ' alerts'
           END AS point
    FROM alerts
)
SELECT round((max(w.ts_ns) - any_value(t0.t0)) / 1e9, 3) AS since_start_s,
       max(w.ts_ns) AS ts_ns,
       round(sum(w.window_s), 3) AS window_s,
       count(*) AS windows,
       w.dp_rank,
       CASE WHEN w.dp_rank IS NULL THEN 'instance' ELSE 'DP ' || w.dp_rank END AS scope,
       round(sum(w.requests_per_s * w.window_s) / nullif(sum(w.window_s) FILTER (WHERE w.requests_per_s IS NOT NULL), 0), 3) AS requests_per_s,
       round(sum(w.tokens_per_s * w.window_s) / nullif(sum(w.window_s) FILTER (WHERE w.tokens_per_s IS NOT NULL), 0), 1) AS tokens_per_s,
       max(w.running) AS running,
       max(w.waiting) AS waiting,
       round(max(w.kv_usage), 4) AS kv_usage,
       round(max(w.ttft_p99_ms), 1) AS ttft_p99_ms,
       round(max(w.e2e_p99_ms), 1) AS e2e_p99_ms,
       bool_or(w.reset) AS reset,
       any_value(p.failing) AS failing
FROM w CROSS JOIN t0 JOIN points p ON p.ts_ns = w.ts_ns
GROUP BY p.point, w.dp_rank
ORDER BY max(w.ts_ns), w.dp_rank NULLS FIRST
