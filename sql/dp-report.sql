-- name: dp-report
-- version: 2
-- description: The DP domains side by side (one row each): requests, input/output tokens, scheduled batch tokens, execution time, KV-cache level and KV pool (total_blocks: a domain started with another pool is a configuration mismatch), queue wait and first-token latency, with each domain's share and its ratio to the median domain.
-- requires: _dp_batches
-- verdict: none
-- role: report
-- order: 30
-- shows: report.dp, compare
-- headline: dp_rank | requests | tokens_pct | exec_p99_ms | kv_usage_mean | queue_wait_p99_ms | ttft_p99_ms
-- summary: DP {dp_rank}: {requests} requests ({requests_vs_median}x median), {input_tokens}+{output_tokens} tokens ({tokens_vs_median}x), {total_scheduled_tokens} scheduled, execution p99 {exec_p99_ms} ms ({exec_vs_median}x), KV mean {kv_usage_mean} of {total_blocks} blocks, queue wait p99 {queue_wait_p99_ms} ms

-- The side-by-side report the DP guide asks the profiler for; dp-imbalance decides whether a
-- difference persists and hurts, this only lays the numbers next to each other.
WITH sched AS (
    SELECT dp_rank, count(*) AS batches,
           avg(prefill_batch_size) AS prefill_batch_size_mean,
           avg(decode_batch_size) AS decode_batch_size_mean,
           sum(prefill_scheduled_tokens) AS prefill_scheduled_tokens,
           sum(decode_scheduled_tokens) AS decode_scheduled_tokens,
           sum(total_scheduled_tokens) AS total_scheduled_tokens,
           any_value(dp_source) AS dp_source
    FROM _dp_batches WHERE run = $run AND phase = 'batching'
    GROUP BY dp_rank
),
execs AS (
    SELECT dp_rank, any_value(name) AS exec_row_name, count(*) AS exec_batches, sum(during_ms) AS exec_total_ms,
           avg(during_ms) AS exec_mean_ms,
           quantile_cont(during_ms, 0.5) AS exec_p50_ms, quantile_cont(during_ms, 0.99) AS exec_p99_ms
    FROM _dp_exec WHERE run = $run
    GROUP BY dp_rank
),
reqs AS (
    SELECT dp_rank, count(*) AS requests,
           sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens,
           avg(input_tokens) AS input_tokens_mean, avg(output_tokens) AS output_tokens_mean,
           quantile_cont(queue_wait_ms, 0.5) AS queue_wait_p50_ms,
           quantile_cont(queue_wait_ms, 0.99) AS queue_wait_p99_ms,
           quantile_cont(first_token_latency_ms, 0.5) AS ttft_p50_ms,
           quantile_cont(first_token_latency_ms, 0.99) AS ttft_p99_ms,
           count(*) FILTER (WHERE several_dp) AS requests_in_several_domains
    FROM _dp_requests WHERE run = $run
    GROUP BY dp_rank
),
kvs AS (
    SELECT dp_rank, avg(kv_usage) AS kv_usage_mean, max(kv_usage) AS kv_usage_max,
           min(free_blocks) AS min_free_blocks, max(total_blocks) AS total_blocks,
           any_value(kv_source) AS kv_source
    FROM _dp_kv WHERE run = $run
    GROUP BY dp_rank
),
joined AS (
    SELECT s.*, e.* EXCLUDE (dp_rank), r.* EXCLUDE (dp_rank), k.* EXCLUDE (dp_rank)
    FROM sched s
    LEFT JOIN execs e USING (dp_rank)
    LEFT JOIN reqs r USING (dp_rank)
    LEFT JOIN kvs k USING (dp_rank)
),
med AS (
    SELECT median(requests) AS m_requests, median(input_tokens + output_tokens) AS m_tokens,
           median(exec_p99_ms) AS m_exec_p99, sum(requests) AS all_requests,
           sum(input_tokens + output_tokens) AS all_tokens
    FROM joined
)
SELECT dp_rank,
       coalesce(requests, 0) AS requests,
       round(100.0 * requests / nullif(all_requests, 0), 1) AS requests_pct,
       input_tokens, output_tokens,
       round(100.0 * (input_tokens + output_tokens) / nullif(all_tokens, 0), 1) AS tokens_pct,
       round(input_tokens_mean, 1) AS input_tokens_mean, round(output_tokens_mean, 1) AS output_tokens_mean,
       batches,
       round(prefill_batch_size_mean, 2) AS prefill_batch_size_mean,
       round(decode_batch_size_mean, 2) AS decode_batch_size_mean,
       prefill_scheduled_tokens, decode_scheduled_tokens, total_scheduled_tokens,
       exec_row_name, exec_batches, round(exec_total_ms, 1) AS exec_total_ms,
       round(exec_p50_ms, 3) AS exec_p50_ms, round(exec_p99_ms, 3) AS exec_p99_ms,
       round(kv_usage_mean, 4) AS kv_usage_mean, round(kv_usage_max, 4) AS kv_usage_max, min_free_blocks, total_blocks,
       round(queue_wait_p50_ms, 3) AS queue_wait_p50_ms, round(queue_wait_p99_ms, 3) AS queue_wait_p99_ms,
       round(ttft_p50_ms, 3) AS ttft_p50_ms, round(ttft_p99_ms, 3) AS ttft_p99_ms,
       round(requests / nullif(m_requests, 0), 2) AS requests_vs_median,
       round((input_tokens + output_tokens) / nullif(m_tokens, 0), 2) AS tokens_vs_median,
       round(exec_p99_ms / nullif(m_exec_p99, 0), 2) AS exec_vs_median,
       coalesce(requests_in_several_domains, 0) AS requests_in_several_domains,
       dp_source, kv_source
FROM joined, med
ORDER BY dp_rank
