-- name: dp-imbalance
-- version: 1
-- description: Hot DP domains: a data-parallel domain that persistently gets more requests, heavier requests or runs slower than the others, why, and whether it hurts the service.
-- requires: _dp_batches
-- param: window_s DOUBLE = 5.0        -- window length in seconds; domains are compared within the same window
-- param: min_windows INTEGER = 3      -- consecutive hot windows before a domain counts as hot (shorter is traffic jitter)
-- param: skew_ratio DOUBLE = 1.3      -- requests or tokens vs the other domains' median that count as clearly more
-- param: exec_ratio DOUBLE = 1.3      -- execution time vs the other domains' median that counts as clearly longer
-- param: impact_ratio DOUBLE = 1.5    -- queue wait / first-token P99 vs the other domains that counts as hurting
-- param: min_wait_ms DOUBLE = 20.0    -- a queue-wait or latency excess below this many ms does not hurt
-- param: kv_high DOUBLE = 0.9         -- mean KV-cache usage (0-1) at or above which a domain is under KV pressure
-- verdict: fail if rows where impact > 0; warn if rows > 0
-- role: verdict
-- subject: dp_rank
-- priority: 30
-- order: 130
-- shows: report.dp
-- summary: DP {dp_rank}: {cause} over {hot_windows} windows ({requests_ratio}x requests, {tokens_ratio}x tokens, {exec_ratio}x execution time vs the other domains' median); impact: {impact_signals}; next: {next_step}
-- pass: No DP domain stays hot over {min_windows} consecutive windows of {window_s} s.

-- Requests by arrival window: what each domain was ASKED to do (request.csv arrival and tokens when
-- the run has it, else the first scheduling and the res_list tokens). Demand, unlike throughput,
-- does not flatten when a domain saturates.
WITH t0 AS (
    SELECT t0_ns FROM _dp_t0 WHERE run = $run
),
q AS (
    SELECT r.*, CAST(floor((r.arrival_ns - t0.t0_ns) / ($window_s * 1e9)) AS BIGINT) AS w
    FROM _dp_requests r, t0 WHERE r.run = $run
),
b AS (
    SELECT b.dp_rank, b.phase, b.total_scheduled_tokens,
           CAST(floor((b.start_ns - t0.t0_ns) / ($window_s * 1e9)) AS BIGINT) AS w
    FROM _dp_batches b, t0 WHERE b.run = $run
),
ex AS (
    SELECT e.dp_rank, e.during_ms, CAST(floor((e.start_ns - t0.t0_ns) / ($window_s * 1e9)) AS BIGINT) AS w
    FROM _dp_exec e, t0 WHERE e.run = $run
),
kv AS (
    SELECT k.dp_rank, k.kv_usage, k.free_blocks, CAST(floor((k.ts_ns - t0.t0_ns) / ($window_s * 1e9)) AS BIGINT) AS w
    FROM _dp_kv k, t0 WHERE k.run = $run
),
wq AS (
    SELECT x.dp_rank, x.waiting, CAST(floor((x.ts_ns - t0.t0_ns) / ($window_s * 1e9)) AS BIGINT) AS w
    FROM _dp_waiting x, t0 WHERE x.run = $run
),
-- every (window, domain) that has any data, so a domain with no arrivals in a window counts 0
grid AS (
    SELECT w, dp_rank FROM (SELECT DISTINCT w FROM b UNION SELECT DISTINCT w FROM q),
                           (SELECT DISTINCT dp_rank FROM b)
),
facts AS (
    SELECT g.w, g.dp_rank,
           coalesce(a.requests, 0) AS requests, coalesce(a.tokens, 0) AS tokens,
           s.sched_tokens, e.exec_ms, k.kv_usage
    FROM grid g
    LEFT JOIN (SELECT w, dp_rank, count(*) AS requests,
                      sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0)) AS tokens
               FROM q GROUP BY w, dp_rank) a USING (w, dp_rank)
    LEFT JOIN (SELECT w, dp_rank, sum(total_scheduled_tokens) AS sched_tokens
               FROM b WHERE phase = 'batching' GROUP BY w, dp_rank) s USING (w, dp_rank)
    LEFT JOIN (SELECT w, dp_rank, avg(during_ms) AS exec_ms FROM ex GROUP BY w, dp_rank) e USING (w, dp_rank)
    LEFT JOIN (SELECT w, dp_rank, avg(kv_usage) AS kv_usage FROM kv GROUP BY w, dp_rank) k USING (w, dp_rank)
),
-- each domain against the median of the OTHER domains in the same window (robust to the hot one)
vs AS (
    SELECT f.w, f.dp_rank, any_value(f.requests) AS requests, any_value(f.tokens) AS tokens,
           any_value(f.sched_tokens) AS sched_tokens, any_value(f.exec_ms) AS exec_ms,
           median(o.requests) AS o_requests, median(o.tokens) AS o_tokens,
           median(o.sched_tokens) AS o_sched_tokens, median(o.exec_ms) AS o_exec_ms
    FROM facts f JOIN facts o ON o.w = f.w AND o.dp_rank <> f.dp_rank
    GROUP BY f.w, f.dp_rank
),
ratios AS (
    SELECT *,
           CASE WHEN requests = 0 AND o_requests = 0 THEN 1.0 ELSE requests / nullif(o_requests, 0) END AS r_req,
           CASE WHEN tokens = 0 AND o_tokens = 0 THEN 1.0 ELSE tokens / nullif(o_tokens, 0) END AS r_tok,
           sched_tokens / nullif(o_sched_tokens, 0) AS r_sched,
           exec_ms / nullif(o_exec_ms, 0) AS r_exec
    FROM vs
),
-- the three causes of the guide, decided per window: more requests AND more tokens; about the same
-- requests but more tokens; about the same requests and tokens but longer execution
classified AS (
    SELECT *,
           CASE WHEN r_req >= $skew_ratio AND r_tok >= $skew_ratio THEN 'request-skew'
                WHEN r_req < $skew_ratio AND r_tok >= $skew_ratio THEN 'token-skew'
                WHEN r_req < $skew_ratio AND r_tok < $skew_ratio AND r_exec >= $exec_ratio THEN 'slow-execution'
           END AS wcause
    FROM ratios
),
-- runs of consecutive hot windows per domain (gaps and islands); only runs of min_windows count
hot AS (
    SELECT *, w - row_number() OVER (PARTITION BY dp_rank ORDER BY w) AS island
    FROM classified WHERE wcause IS NOT NULL
),
persistent AS (
    SELECT h.* FROM hot h
    JOIN (SELECT dp_rank, island FROM hot GROUP BY dp_rank, island HAVING count(*) >= $min_windows) USING (dp_rank, island)
),
per_domain AS (
    SELECT dp_rank,
           count(*) AS hot_windows,
           max(n) AS longest_run,
           min(w) AS first_w, max(w) AS last_w,
           -- the most frequent window cause; ties go to the cause listed first by the guide
           arg_min(wcause, (-n_cause) * 10 + CASE wcause WHEN 'request-skew' THEN 1 WHEN 'token-skew' THEN 2 ELSE 3 END) AS cause,
           median(r_req) AS requests_ratio, median(r_tok) AS tokens_ratio,
           median(r_sched) AS sched_tokens_ratio, median(r_exec) AS exec_ratio,
           avg(requests) AS requests_per_window, avg(o_requests) AS others_requests_per_window
    FROM (SELECT *, count(*) OVER (PARTITION BY dp_rank, island) AS n,
                 count(*) OVER (PARTITION BY dp_rank, wcause) AS n_cause
          FROM persistent)
    GROUP BY dp_rank
),
hot_w AS (SELECT dp_rank, w FROM persistent),
-- does it hurt? requests of the hot domain vs requests of the other domains of the SAME windows
lat AS (
    SELECT h.dp_rank,
           avg(q.queue_wait_ms) FILTER (WHERE q.dp_rank = h.dp_rank) AS queue_wait_ms,
           avg(q.queue_wait_ms) FILTER (WHERE q.dp_rank <> h.dp_rank) AS others_queue_wait_ms,
           quantile_cont(q.first_token_latency_ms, 0.99) FILTER (WHERE q.dp_rank = h.dp_rank) AS ttft_p99_ms,
           quantile_cont(q.first_token_latency_ms, 0.99) FILTER (WHERE q.dp_rank <> h.dp_rank) AS others_ttft_p99_ms
    FROM hot_w h JOIN q USING (w)
    GROUP BY h.dp_rank
),
kvh AS (
    SELECT h.dp_rank,
           avg(k.kv_usage) FILTER (WHERE k.dp_rank = h.dp_rank) AS kv_usage,
           avg(k.kv_usage) FILTER (WHERE k.dp_rank <> h.dp_rank) AS others_kv_usage,
           min(k.free_blocks) FILTER (WHERE k.dp_rank = h.dp_rank) AS min_free_blocks
    FROM hot_w h JOIN kv k USING (w)
    GROUP BY h.dp_rank
),
waits AS (
    SELECT h.dp_rank,
           avg(x.waiting) FILTER (WHERE x.dp_rank = h.dp_rank) AS waiting_mean,
           avg(x.waiting) FILTER (WHERE x.dp_rank <> h.dp_rank) AS others_waiting_mean
    FROM hot_w h JOIN wq x USING (w)
    GROUP BY h.dp_rank
),
signals AS (
    SELECT p.*, l.queue_wait_ms, l.others_queue_wait_ms, l.ttft_p99_ms, l.others_ttft_p99_ms,
           k.kv_usage, k.others_kv_usage, k.min_free_blocks, x.waiting_mean, x.others_waiting_mean,
           coalesce(x.waiting_mean - x.others_waiting_mean >= 1
                    AND x.waiting_mean >= $impact_ratio * x.others_waiting_mean, false) AS s_queue,
           coalesce(l.queue_wait_ms - l.others_queue_wait_ms >= $min_wait_ms
                    AND l.queue_wait_ms >= $impact_ratio * l.others_queue_wait_ms, false) AS s_wait,
           coalesce(l.ttft_p99_ms - l.others_ttft_p99_ms >= $min_wait_ms
                    AND l.ttft_p99_ms >= $impact_ratio * l.others_ttft_p99_ms, false) AS s_latency,
           coalesce(k.kv_usage >= $kv_high AND k.kv_usage > k.others_kv_usage, false) AS s_kv,
           coalesce(p.exec_ratio >= $exec_ratio, false) AS s_batch
    FROM per_domain p
    LEFT JOIN lat l USING (dp_rank)
    LEFT JOIN kvh k USING (dp_rank)
    LEFT JOIN waits x USING (dp_rank)
)
SELECT dp_rank,
       cause,
       -- hurting = more requests wait (queue counters), or its requests wait longer or see a worse
       -- first-token tail than requests of the other domains in the same windows; failing those
       -- measurements, KV pressure together with longer batches
       (s_wait OR s_queue OR s_latency OR (s_kv AND s_batch)) AS impact,
       hot_windows,
       longest_run AS longest_hot_run,
       round(first_w * $window_s, 3) AS first_hot_s,
       round((last_w + 1) * $window_s, 3) AS last_hot_s,
       round(requests_ratio, 2) AS requests_ratio,
       round(tokens_ratio, 2) AS tokens_ratio,
       round(sched_tokens_ratio, 2) AS sched_tokens_ratio,
       round(exec_ratio, 2) AS exec_ratio,
       round(requests_per_window, 1) AS requests_per_window,
       round(others_requests_per_window, 1) AS others_requests_per_window,
       round(queue_wait_ms, 1) AS queue_wait_ms,
       round(others_queue_wait_ms, 1) AS others_queue_wait_ms,
       round(ttft_p99_ms, 1) AS ttft_p99_ms,
       round(others_ttft_p99_ms, 1) AS others_ttft_p99_ms,
       round(waiting_mean, 2) AS waiting_mean,
       round(others_waiting_mean, 2) AS others_waiting_mean,
       round(kv_usage, 3) AS kv_usage,
       round(others_kv_usage, 3) AS others_kv_usage,
       min_free_blocks,
       coalesce(nullif(concat_ws(', ',
           CASE WHEN s_wait THEN 'longer queue wait' END,
           CASE WHEN s_queue THEN 'more waiting requests' END,
           CASE WHEN s_latency THEN 'higher first-token P99' END,
           CASE WHEN s_kv THEN 'KV-cache pressure' END,
           CASE WHEN s_batch THEN 'longer batches' END), ''), 'none') AS impact_signals,
       CASE cause
           WHEN 'request-skew' THEN 'rebalance the DP scheduler: requests pile onto this domain (fixed-order or sticky assignment); check the scheduling policy, the DP assignment and request stickiness'
           WHEN 'token-skew' THEN 'balance DP assignment by input/output tokens instead of request count, or schedule long requests separately; check request logs and length statistics for long inputs/outputs concentrated here'
           ELSE 'same load but slower: compare this domain''s device utilisation, error logs, process and communication with the others (profiler execution time), and check that its model, parallel and memory configuration match the other domains'
       END || CASE WHEN s_kv THEN '; KV pressure: admit fewer requests into this domain until its KV level matches the others' ELSE '' END AS next_step
FROM signals
ORDER BY impact DESC, hot_windows DESC, dp_rank
