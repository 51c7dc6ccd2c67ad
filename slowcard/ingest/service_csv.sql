-- msServiceProfiler service CSVs (../shared/docs/formats.md section 1): batch.csv, request.csv,
-- kvcache.csv (both shapes) and forward.csv. One physical table per file kind, keyed by
-- source_id + line_no (the 1-based line of the row in its CSV; the header is line 1), and one
-- base view per table that adds `run` from `sources`.
-- Times: *_ns are exact epoch nanoseconds (from the numeric start_time(ms)/end_time(ms) columns,
-- whose unit is decided per file by magnitude, or from the Asia/Shanghai datetime strings);
-- *_ms are the durations exactly as the profiler wrote them.

-- batch.csv: one row per CSV row, batching rows (batchFrameworkProcessing / BatchSchedule) and
-- execution rows (modelExec, modelRunnerExec, Execute, specDecoding, ...).
CREATE TABLE IF NOT EXISTS batch_rows (
    source_id                INTEGER,
    line_no                  BIGINT,
    name                     VARCHAR,
    phase                    VARCHAR,   -- batching | execution
    start_ns                 BIGINT,
    end_ns                   BIGINT,    -- end_time(ms), else end_datetime, else start + during
    during_ms                DOUBLE,
    batch_type               VARCHAR,   -- Prefill | Decode | Prefill,Decode
    prof_id                  VARCHAR,   -- ms_service_<hostname>-<pid>: one per process
    batch_size               DOUBLE,    -- requests on batching rows; vLLM modelExec: scheduled tokens
    total_blocks             BIGINT,    -- KV-cache group: NULL when the file has no KV columns
    used_blocks              BIGINT,
    free_blocks              BIGINT,
    blocks_allocated         BIGINT,
    blocks_freed             BIGINT,
    kvcache_usage_rate       DOUBLE,    -- used / total, 0-1
    prefill_batch_size       INTEGER,
    decode_batch_size        INTEGER,
    prefill_scheduled_tokens BIGINT,
    decode_scheduled_tokens  BIGINT,
    total_scheduled_tokens   BIGINT,
    dp_rank                  INTEGER,   -- NULL when empty or <NA> (no DP, or not recorded)
    accepted_ratio           DOUBLE,    -- speculative decoding (specDecoding rows)
    accepted_ratio_per_pos   VARCHAR,   -- e.g. {"0": 0.95, "1": 0.88}
    res_list_items           INTEGER    -- requests in res_list; NULL when the cell did not parse
);

-- batch.csv res_list, one row per (batch row, request): ties a request to the DP domain and the
-- batches that served it.
CREATE TABLE IF NOT EXISTS batch_request_rows (
    source_id            INTEGER,
    line_no              BIGINT,        -- the batch row (batch_rows.line_no)
    item_no              INTEGER,       -- 1-based position in res_list
    rid                  VARCHAR,
    iter                 BIGINT,        -- 0 = the request's first (prefill) iteration
    req_type             INTEGER,       -- 0 prefill, 1 decode; NULL when the item has no type
    num_scheduled_tokens BIGINT,
    num_prompt_tokens    BIGINT,
    num_computed_tokens  BIGINT
);

-- Per file, request and process: what batch.csv's batching rows say about a request (derived
-- from batch_rows + batch_request_rows at ingest, so that the DP queries do not re-join millions
-- of res_list items each time): where it ran, when it was first scheduled, its prompt length and
-- how many decode iterations it had.
CREATE TABLE IF NOT EXISTS request_schedule_rows (
    source_id      INTEGER,
    rid            VARCHAR,
    prof_id        VARCHAR,
    dp_rank        INTEGER,               -- NULL when the batch rows have none
    several_dp     BOOLEAN,               -- the rid appears under more than one dp_rank
    first_sched_ns BIGINT,
    last_sched_ns  BIGINT,
    batching_rows  BIGINT,
    prompt_tokens  BIGINT,                -- max num_prompt_tokens of its items
    decode_items   BIGINT                 -- items with type 1 (or, without type, iter > 0)
);

-- request.csv: one row per request (no DP column: its domain comes from batch_requests).
CREATE TABLE IF NOT EXISTS request_rows (
    source_id              INTEGER,
    line_no                BIGINT,
    rid                    VARCHAR,     -- http_rid
    start_ns               BIGINT,      -- arrival
    input_tokens           BIGINT,      -- recv_token_size
    output_tokens          BIGINT,      -- reply_token_size
    execution_ms           DOUBLE,      -- end to end
    queue_wait_ms          DOUBLE,
    first_token_latency_ms DOUBLE,
    cache_hit_rate         DOUBLE       -- NULL for N/A
);

-- kvcache.csv in either shape: "blocks" (vLLM KVCacheStatus: total/used/free/allocated/freed)
-- or "device" (MindIE Allocate/AppendSlot/Free with device_kvcache_left, stored as free_blocks).
-- No process or DP column exists in this file: per-DP KV levels come from batch.csv's KV
-- columns and from chrome_tracing.json's KVCache-dp<N> counters.
CREATE TABLE IF NOT EXISTS kvcache_rows (
    source_id          INTEGER,
    line_no            BIGINT,
    shape              VARCHAR,          -- blocks | device
    name               VARCHAR,
    rid                VARCHAR,
    ts_ns              BIGINT,
    total_blocks       BIGINT,
    used_blocks        BIGINT,
    free_blocks        BIGINT,
    blocks_allocated   BIGINT,
    blocks_freed       BIGINT,
    kvcache_usage_rate DOUBLE
);

-- forward.csv: one row per model forward of one process.
CREATE TABLE IF NOT EXISTS forward_rows (
    source_id         INTEGER,
    line_no           BIGINT,
    name              VARCHAR,
    start_ns          BIGINT,
    end_ns            BIGINT,
    relative_start_ms DOUBLE,
    during_ms         DOUBLE,
    bubble_ms         DOUBLE,            -- gap to the next forward of the same prof_id
    batch_size        DOUBLE,
    batch_type        VARCHAR,
    forward_iter      BIGINT,            -- 1-based per prof_id
    dp_rank           INTEGER,           -- the profiler writes 0 when there is no DP domain
    prof_id           VARCHAR,
    hostname          VARCHAR
);

CREATE OR REPLACE VIEW batches AS
SELECT s.run, b.*, b.start_ns / 1000.0 AS start_us, b.end_ns / 1000.0 AS end_us
FROM batch_rows b JOIN scoped_sources s USING (source_id);

CREATE OR REPLACE VIEW batch_requests AS
SELECT s.run, r.*
FROM batch_request_rows r JOIN scoped_sources s USING (source_id);

CREATE OR REPLACE VIEW requests AS
SELECT s.run, r.*, r.start_ns / 1000.0 AS start_us
FROM request_rows r JOIN scoped_sources s USING (source_id);

CREATE OR REPLACE VIEW kvcache AS
SELECT s.run, k.*, k.ts_ns / 1000.0 AS ts_us
FROM kvcache_rows k JOIN scoped_sources s USING (source_id);

CREATE OR REPLACE VIEW forwards AS
SELECT s.run, f.*, f.start_ns / 1000.0 AS start_us, f.end_ns / 1000.0 AS end_us
FROM forward_rows f JOIN scoped_sources s USING (source_id);
