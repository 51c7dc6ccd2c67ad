-- Data-parallel (DP) helper views shared by sql/dp-batch.sql, dp-imbalance.sql and dp-report.sql.
-- Inputs: batches, batch_requests, requests (slowcard/ingest/service_csv.sql) and the
-- msServiceProfiler chrome_tracing.json events (`events`: process_labels metadata, KV counters).
--
-- A DP domain is only ever taken from the data: batch.csv's dp_rank, or the "<host>,dp<N>" label
-- of the process that wrote a row. Rows whose domain is unknown stay out of every _dp_ view, so a
-- run without any DP id has an empty _dp_batches and the DP queries SKIP instead of inventing
-- domains.

-- pid -> DP domain, from chrome_tracing.json `process_labels` metadata ("<hostname>,dp<N>").
-- Keyed by the trace file (source_id) and pid; a pid labelled with two domains is left out.
CREATE OR REPLACE VIEW _dp_pid_map AS
SELECT run, source_id, pid, any_value(host) AS host, min(dp_rank) AS dp_rank
FROM (
    SELECT run, source_id, pid,
           nullif(trim(split_part(args ->> 'labels', ',', 1)), '') AS host,
           TRY_CAST(regexp_extract(args ->> 'labels', '(^|,)\s*dp(\d+)\s*(,|$)', 2) AS INTEGER) AS dp_rank
    FROM events
    WHERE ph = 'M' AND name = 'process_labels'
)
WHERE dp_rank IS NOT NULL
GROUP BY run, source_id, pid
HAVING count(DISTINCT dp_rank) = 1;

-- The DP domain of each process (prof_id = ms_service_<hostname>-<pid>) that wrote batch rows
-- without a dp_rank, from the process_labels of the same pid (and host, when the label has one).
-- Only the few distinct prof_ids are matched, never the batch rows themselves.
CREATE OR REPLACE VIEW _dp_prof_labels AS
WITH p AS (
    SELECT DISTINCT run, prof_id,
           regexp_extract(prof_id, '-(\d+)$', 1) AS pid,
           regexp_extract(prof_id, '^ms_service_(.*)-\d+$', 1) AS host
    FROM batches WHERE dp_rank IS NULL AND prof_id IS NOT NULL
)
SELECT p.run, p.prof_id, min(m.dp_rank) AS dp_rank
FROM p JOIN _dp_pid_map m ON m.run = p.run AND m.pid = p.pid
WHERE m.host IS NULL OR m.host = p.host
GROUP BY p.run, p.prof_id
HAVING count(DISTINCT m.dp_rank) = 1;

-- Batch rows (batching and execution) whose DP domain is known: batch.csv's dp_rank, else the
-- process_labels of the process in prof_id. dp_source says which.
CREATE OR REPLACE VIEW _dp_batches AS
SELECT b.*, 'batch.csv' AS dp_source
FROM batches b WHERE b.dp_rank IS NOT NULL
UNION ALL
SELECT b.* REPLACE (l.dp_rank AS dp_rank), 'process_labels' AS dp_source
FROM batches b JOIN _dp_prof_labels l ON l.run = b.run AND l.prof_id = b.prof_id
WHERE b.dp_rank IS NULL;

-- What the batching rows say about each request (request_schedule_rows, one row per file, rid and
-- process): its DP domain (several_dp flags a rid seen under more than one), when it was first
-- scheduled, its prompt length and how many tokens it generated (one at the end of prefill plus
-- one per decode item).
CREATE OR REPLACE VIEW _dp_request_facts AS
WITH s AS (
    SELECT src.run, r.*, coalesce(r.dp_rank, l.dp_rank) AS dp
    FROM request_schedule_rows r
    JOIN scoped_sources src USING (source_id)
    LEFT JOIN _dp_prof_labels l ON l.run = src.run AND l.prof_id = r.prof_id
)
SELECT run, rid,
       min(dp) AS dp_rank,
       min(dp) <> max(dp) OR bool_or(several_dp) AS several_dp,
       min(first_sched_ns) AS first_sched_ns,
       max(prompt_tokens) AS prompt_tokens,
       sum(decode_items) + 1 AS generated_tokens
FROM s
WHERE dp IS NOT NULL
GROUP BY run, rid;

-- One row per request with a known DP domain: request.csv's arrival, token counts and latencies
-- when the run has it, else what the batches say (arrival = first scheduling; no queue wait or
-- latency). request.csv's http_rid is matched to the res_list rid, or failing that to the rid
-- without a trailing "-<n>" (vLLM appends the sample index to the request id: cmpl-<id>-0).
CREATE OR REPLACE VIEW _dp_requests AS
WITH q AS (
    SELECT * FROM requests
    QUALIFY row_number() OVER (PARTITION BY run, rid ORDER BY source_id DESC, line_no) = 1
),
f AS (
    SELECT *, regexp_replace(rid, '-[0-9]+$', '') AS base_rid FROM _dp_request_facts
),
m AS (
    SELECT f.*, coalesce(q1.start_ns, q2.start_ns) AS req_start_ns,
           coalesce(q1.input_tokens, q2.input_tokens) AS req_input_tokens,
           coalesce(q1.output_tokens, q2.output_tokens) AS req_output_tokens,
           coalesce(q1.queue_wait_ms, q2.queue_wait_ms) AS queue_wait_ms,
           coalesce(q1.first_token_latency_ms, q2.first_token_latency_ms) AS first_token_latency_ms,
           coalesce(q1.execution_ms, q2.execution_ms) AS execution_ms
    FROM f
    LEFT JOIN q q1 ON q1.run = f.run AND q1.rid = f.rid
    -- (no "base_rid <> rid" here: a non-equality in a LEFT JOIN condition costs DuckDB a nested
    -- loop, minutes on 1e5 requests; when they are equal q2 is q1 and coalesce picks q1 anyway)
    LEFT JOIN q q2 ON q2.run = f.run AND q2.rid = f.base_rid
)
SELECT run, rid, dp_rank, several_dp,
       coalesce(req_start_ns, first_sched_ns) AS arrival_ns,
       req_start_ns IS NOT NULL AS from_request_csv,
       first_sched_ns,
       coalesce(req_input_tokens, prompt_tokens) AS input_tokens,
       coalesce(req_output_tokens, generated_tokens) AS output_tokens,
       queue_wait_ms, first_token_latency_ms, execution_ms
FROM m;

-- chrome_tracing.json KV counters per DP domain: `<domain>.KVCache-dp<N>` / `KVCache-dp<N>`
-- ("Device Block" = free blocks); a KVCache counter without the suffix takes its process's label.
CREATE OR REPLACE VIEW _dp_kv_counters AS
SELECT * FROM (
    SELECT e.run,
           coalesce(TRY_CAST(regexp_extract(e.name, 'KVCache-dp(\d+)$', 1) AS INTEGER), m.dp_rank) AS dp_rank,
           e.ts_ns,
           TRY_CAST(e.args ->> 'Device Block' AS DOUBLE) AS free_blocks
    FROM events e
    LEFT JOIN _dp_pid_map m ON m.source_id = e.source_id AND m.pid = e.pid
    WHERE e.ph = 'C' AND e.name LIKE '%KVCache%'
)
WHERE dp_rank IS NOT NULL AND free_blocks IS NOT NULL;

-- KV-cache level per DP domain over time. batch.csv's KV columns (batching rows; execution rows
-- carry zeros) are used when the domain has them; otherwise the trace counters, with usage
-- computed against the domain's total from batch.csv when known.
CREATE OR REPLACE VIEW _dp_kv AS
WITH from_batches AS (
    SELECT run, dp_rank, start_ns AS ts_ns, total_blocks, used_blocks, free_blocks,
           coalesce(kvcache_usage_rate, used_blocks / nullif(total_blocks, 0)) AS kv_usage,
           'batch.csv' AS kv_source
    FROM _dp_batches
    WHERE phase = 'batching' AND total_blocks > 0
),
have AS (SELECT run, dp_rank, max(total_blocks) AS total_blocks FROM from_batches GROUP BY ALL)
SELECT * FROM from_batches
UNION ALL
SELECT c.run, c.dp_rank, c.ts_ns, NULL, NULL, CAST(c.free_blocks AS BIGINT), NULL, 'chrome_tracing'
FROM _dp_kv_counters c
WHERE NOT EXISTS (SELECT 1 FROM have h WHERE h.run = c.run AND h.dp_rank = c.dp_rank);

-- Waiting-queue length per DP domain from the trace's `WaitingQueue` counters ("Queue Size").
CREATE OR REPLACE VIEW _dp_waiting AS
SELECT e.run, m.dp_rank, e.ts_ns, TRY_CAST(e.args ->> 'Queue Size' AS DOUBLE) AS waiting
FROM events e
JOIN _dp_pid_map m ON m.source_id = e.source_id AND m.pid = e.pid
WHERE e.ph = 'C' AND e.name = 'WaitingQueue';

-- The execution rows that measure a batch's execution time: the run's most frequent execution
-- row name (modelExec, modelRunnerExec, Execute, ...), so nested or auxiliary rows
-- (specDecoding) are not mixed into one distribution.
CREATE OR REPLACE VIEW _dp_exec AS
WITH names AS (
    SELECT run, name, count(*) AS n FROM _dp_batches
    WHERE phase = 'execution' AND name <> 'specDecoding'
    GROUP BY run, name
    QUALIFY row_number() OVER (PARTITION BY run ORDER BY count(*) DESC, name) = 1
)
SELECT b.* FROM _dp_batches b JOIN names USING (run, name);

-- The start of each run's service data: windows are counted from here.
CREATE OR REPLACE VIEW _dp_t0 AS
SELECT run, min(t) AS t0_ns FROM (
    SELECT run, min(start_ns) AS t FROM _dp_batches GROUP BY run
    UNION ALL
    SELECT run, min(start_ns) FROM requests GROUP BY run
) GROUP BY run;
