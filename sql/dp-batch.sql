-- name: dp-batch
-- version: 2
-- description: Per DP domain, over the whole run (scope run) and per time window (scope window): batches, requests, batch sizes, scheduled tokens, execution time, KV-cache level, waiting requests, queue wait and first-token latency; and the instance's (all domains') P95/P99 first-token and end-to-end latency of the same window.
-- requires: _dp_batches
-- param: window_s DOUBLE = 5.0   -- window length in seconds for the scope=window rows
-- verdict: none
-- role: report
-- order: 40
-- shows: report.dp-windows
-- headline: scope | window_no | dp_rank | requests | total_scheduled_tokens | exec_p99_ms | kv_usage_mean | ttft_p99_ms
-- summary: DP {dp_rank} ({scope}): {requests} requests, {batches} batches, {total_scheduled_tokens} scheduled tokens, execution p50/p99 {exec_p50_ms}/{exec_p99_ms} ms, KV mean {kv_usage_mean}, queue wait p99 {queue_wait_p99_ms} ms

-- Every metric is grouped twice: by domain (the whole run, win NULL) and by (window, domain).
-- Requests count in the window of their arrival; batches and KV samples in the window they start.
WITH t0 AS (
    SELECT t0_ns FROM _dp_t0 WHERE run = $run
),
b AS (
    SELECT b.*, CAST(floor((b.start_ns - t0.t0_ns) / ($window_s * 1e9)) AS BIGINT) AS win
    FROM _dp_batches b, t0 WHERE b.run = $run AND b.phase = 'batching'
),
ex AS (
    SELECT e.dp_rank, e.during_ms, CAST(floor((e.start_ns - t0.t0_ns) / ($window_s * 1e9)) AS BIGINT) AS win
    FROM _dp_exec e, t0 WHERE e.run = $run
),
q AS (
    SELECT r.*, CAST(floor((r.arrival_ns - t0.t0_ns) / ($window_s * 1e9)) AS BIGINT) AS win
    FROM _dp_requests r, t0 WHERE r.run = $run
),
kv AS (
    SELECT k.*, CAST(floor((k.ts_ns - t0.t0_ns) / ($window_s * 1e9)) AS BIGINT) AS win
    FROM _dp_kv k, t0 WHERE k.run = $run
),
sched AS (
    SELECT win, dp_rank, count(*) AS batches,
           avg(prefill_batch_size) AS prefill_batch_size_mean,
           avg(decode_batch_size) AS decode_batch_size_mean,
           sum(prefill_scheduled_tokens) AS prefill_scheduled_tokens,
           sum(decode_scheduled_tokens) AS decode_scheduled_tokens,
           sum(total_scheduled_tokens) AS total_scheduled_tokens
    FROM b GROUP BY GROUPING SETS ((dp_rank), (win, dp_rank))
),
execs AS (
    SELECT win, dp_rank, count(*) AS exec_batches,
           quantile_cont(during_ms, 0.5) AS exec_p50_ms, quantile_cont(during_ms, 0.99) AS exec_p99_ms
    FROM ex GROUP BY GROUPING SETS ((dp_rank), (win, dp_rank))
),
reqs AS (
    SELECT win, dp_rank, count(*) AS requests,
           sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens,
           quantile_cont(queue_wait_ms, 0.5) AS queue_wait_p50_ms,
           quantile_cont(queue_wait_ms, 0.99) AS queue_wait_p99_ms,
           quantile_cont(first_token_latency_ms, 0.5) AS ttft_p50_ms,
           quantile_cont(first_token_latency_ms, 0.99) AS ttft_p99_ms
    FROM q GROUP BY GROUPING SETS ((dp_rank), (win, dp_rank))
),
-- the instance's latency tail (every domain's requests) per window and over the run: the DP guide's
-- step 3 asks whether it rises where a domain is hot (dp-imbalance compares it in its hot windows)
inst AS (
    SELECT win, quantile_cont(first_token_latency_ms, 0.95) AS instance_ttft_p95_ms,
           quantile_cont(first_token_latency_ms, 0.99) AS instance_ttft_p99_ms,
           quantile_cont(execution_ms, 0.95) AS instance_e2e_p95_ms,
           quantile_cont(execution_ms, 0.99) AS instance_e2e_p99_ms
    FROM q GROUP BY GROUPING SETS ((), (win))
),
kvs AS (
    SELECT win, dp_rank, avg(kv_usage) AS kv_usage_mean, max(kv_usage) AS kv_usage_max,
           min(free_blocks) AS min_free_blocks
    FROM kv GROUP BY GROUPING SETS ((dp_rank), (win, dp_rank))
),
wq AS (
    SELECT win, dp_rank, avg(waiting) AS waiting_mean, max(waiting) AS waiting_max
    FROM (SELECT x.*, CAST(floor((x.ts_ns - t0.t0_ns) / ($window_s * 1e9)) AS BIGINT) AS win
          FROM _dp_waiting x, t0 WHERE x.run = $run)
    GROUP BY GROUPING SETS ((dp_rank), (win, dp_rank))
),
keys AS (
    SELECT win, dp_rank FROM sched UNION SELECT win, dp_rank FROM execs
    UNION SELECT win, dp_rank FROM reqs UNION SELECT win, dp_rank FROM kvs
)
SELECT CASE WHEN k.win IS NULL THEN 'run' ELSE 'window' END AS scope,
       k.win AS window_no,
       round(k.win * $window_s, 3) AS window_start_s,
       k.dp_rank,
       coalesce(s.batches, 0) AS batches,
       coalesce(r.requests, 0) AS requests,
       r.input_tokens, r.output_tokens,
       round(s.prefill_batch_size_mean, 2) AS prefill_batch_size_mean,
       round(s.decode_batch_size_mean, 2) AS decode_batch_size_mean,
       s.prefill_scheduled_tokens, s.decode_scheduled_tokens, s.total_scheduled_tokens,
       coalesce(e.exec_batches, 0) AS exec_batches,
       round(e.exec_p50_ms, 3) AS exec_p50_ms, round(e.exec_p99_ms, 3) AS exec_p99_ms,
       round(v.kv_usage_mean, 4) AS kv_usage_mean, round(v.kv_usage_max, 4) AS kv_usage_max,
       v.min_free_blocks,
       round(x.waiting_mean, 2) AS waiting_mean, x.waiting_max,
       round(r.queue_wait_p50_ms, 3) AS queue_wait_p50_ms, round(r.queue_wait_p99_ms, 3) AS queue_wait_p99_ms,
       round(r.ttft_p50_ms, 3) AS ttft_p50_ms, round(r.ttft_p99_ms, 3) AS ttft_p99_ms,
       round(i.instance_ttft_p95_ms, 3) AS instance_ttft_p95_ms, round(i.instance_ttft_p99_ms, 3) AS instance_ttft_p99_ms,
       round(i.instance_e2e_p95_ms, 3) AS instance_e2e_p95_ms, round(i.instance_e2e_p99_ms, 3) AS instance_e2e_p99_ms
FROM keys k
LEFT JOIN sched s ON s.win IS NOT DISTINCT FROM k.win AND s.dp_rank = k.dp_rank
LEFT JOIN execs e ON e.win IS NOT DISTINCT FROM k.win AND e.dp_rank = k.dp_rank
LEFT JOIN reqs r ON r.win IS NOT DISTINCT FROM k.win AND r.dp_rank = k.dp_rank
LEFT JOIN kvs v ON v.win IS NOT DISTINCT FROM k.win AND v.dp_rank = k.dp_rank
LEFT JOIN wq x ON x.win IS NOT DISTINCT FROM k.win AND x.dp_rank = k.dp_rank
LEFT JOIN inst i ON i.win IS NOT DISTINCT FROM k.win
ORDER BY k.win IS NOT NULL, k.win, k.dp_rank
