-- slowcard table contract, core part. Format modules add their own tables in
-- slowcard/ingest/<format>.sql; shared helper views live in slowcard/views/*.sql.
-- Units: *_ns integer nanoseconds (exact), *_us / *_ms convenience doubles, *_bytes, *_tokens.
-- Every physical row table is keyed by source_id; views add run and rank from `sources`,
-- so that fixing a rank (e.g. with --rank-map) never rewrites millions of event rows.

CREATE TABLE IF NOT EXISTS meta (
    key   VARCHAR PRIMARY KEY,
    value VARCHAR
);

-- One row per run (a set of files analysed together: one job, one configuration).
CREATE TABLE IF NOT EXISTS runs (
    run        VARCHAR PRIMARY KEY,
    root_path  VARCHAR,              -- what the user pointed `ingest` at
    created_at TIMESTAMP,
    world_size INTEGER               -- from distributedInfo when any file of the run has it
);

CREATE SEQUENCE IF NOT EXISTS source_id_seq START 1;

-- One row per ingested file. A file ingested again into the same run keeps its source_id and
-- has its rows replaced (never duplicated).
CREATE TABLE IF NOT EXISTS sources (
    source_id    INTEGER PRIMARY KEY,
    run          VARCHAR NOT NULL,
    path         VARCHAR NOT NULL,   -- absolute path at ingest time
    size_bytes   BIGINT,
    fingerprint  VARCHAR,            -- sha256 over size + first and last MiB (see README)
    format       VARCHAR,            -- kineto | ascend_trace | service_trace | kernel_details | op_summary | …
    rank         INTEGER,            -- global rank; NULL when no source names it (never guessed as 0)
    rank_source  VARCHAR,            -- distributedInfo | profiler_info | vllm_dirname | rank_pattern | rank_map | …
    dp_rank      INTEGER,
    tp_rank      INTEGER,
    pp_rank      INTEGER,
    ep_rank      INTEGER,
    world_size   INTEGER,
    host         VARCHAR,            -- the machine the file was written on (NULL: no input says)
    base_time_ns BIGINT,             -- offset added to every ts (Kineto baseTimeNanoseconds), 0 if none
    rows_seen    BIGINT,             -- events / rows the reader saw
    rows_kept    BIGINT,             -- rows stored
    rows_dropped BIGINT,             -- rows_seen = rows_kept + rows_dropped
    status       VARCHAR,            -- ok | salvaged | truncated | failed
    message      VARCHAR,
    metadata     JSON,               -- header keys of the file (distributedInfo, deviceProperties, …)
    ingested_at  TIMESTAMP,       -- (run, path) is unique: commit_source replaces the old row
    device_id     INTEGER,           -- the accelerator index on `host` (NULL: no input says; never guessed)
    host_source   VARCHAR,           -- where host came from: trace_header | file_name | profiler_info | ascend_pt_dir | prof_id | device_map
    device_source VARCHAR            -- where device_id came from: kernel_pid | device_properties | kernel_details | prof_device_dir | device_map
);
-- databases made before the physical device identity (issue 45): host was there, not the rest
ALTER TABLE sources ADD COLUMN IF NOT EXISTS device_id INTEGER;
ALTER TABLE sources ADD COLUMN IF NOT EXISTS host_source VARCHAR;
ALTER TABLE sources ADD COLUMN IF NOT EXISTS device_source VARCHAR;

-- The sources the views read: every run, or only the run the variable slowcard_scope names
-- (slowcard sets it on each query's own connection; unset in the duckdb shell: every run). The run
-- filter then sits under every join, aggregate and window of the views rather than at the top of a
-- query, so a query's cost follows its own run's size, not the database's (issue 16: diagnose of
-- a 4-rank run took over twice as long in a database that also held a 4 M-event run).
CREATE OR REPLACE VIEW scoped_sources AS
SELECT * FROM sources
WHERE getvariable('slowcard_scope') IS NULL OR run = getvariable('slowcard_scope');

-- Why rows were dropped, per file (the reconciliation companion of sources.rows_dropped:
-- sum(n_rows) FILTER (WHERE scope = 'row') = rows_dropped).
CREATE TABLE IF NOT EXISTS source_drops (
    source_id INTEGER,
    reason    VARCHAR,               -- e.g. "truncated tail", "event is not an object", "bad ts"
    position  VARCHAR,               -- first event index / line where it happened
    n_rows    BIGINT,
    scope     VARCHAR DEFAULT 'row'  -- 'row': the rows are gone (counted in rows_dropped);
                                     -- 'cell': the rows are kept, one cell's content was not read
                                     -- (a batch.csv res_list: the row stays, its per-request rows do not)
);
-- databases made before the scope column: their drops were all whole rows but for res_list cells
ALTER TABLE source_drops ADD COLUMN IF NOT EXISTS scope VARCHAR DEFAULT 'row';

-- Operator taxonomy: name patterns (case-insensitive regular expressions) -> op class.
-- origin 'builtin' rows are rewritten from slowcard/taxonomy.csv on every write-open;
-- 'user' rows (slowcard ingest --taxonomy FILE, or plain INSERTs) win over built-ins.
CREATE TABLE IF NOT EXISTS op_taxonomy (
    pattern   VARCHAR NOT NULL,
    op_class  VARCHAR NOT NULL,      -- grouped_matmul | dispatch | combine | gating | collective | moe_layer | step | compute
    coll_kind VARCHAR,               -- for collectives: all_to_all | all_reduce | all_gather | reduce_scatter | send_recv | broadcast
    priority  INTEGER NOT NULL,      -- lower wins
    origin    VARCHAR NOT NULL       -- builtin | user
);

-- Source ids whose rows are being written; a row left here means the ingest died before its
-- commit point, and the next write-open deletes that id's rows.
CREATE TABLE IF NOT EXISTS pending_sources (
    source_id  INTEGER,
    started_at TIMESTAMP
);

-- The taxonomy's answer for every operation name seen (op_class NULL: no pattern matches it),
-- so that committing a file classifies only the names no file had before (planning the
-- classification is ~25 ms of every commit; ranks of one job share their names). Written with
-- the file's rows; rebuilt with op_class_rows when the taxonomy or the views change. No key:
-- two files committed at once (--jobs) may both add a new name (a key would fail the second
-- file); the rows are equal and readers take DISTINCT.
CREATE TABLE IF NOT EXISTS _name_classes (
    name      VARCHAR,
    op_class  VARCHAR,
    coll_kind VARCHAR,
    pattern   VARCHAR
);

-- Classified operations of each file (a copy of the view _op_classes_live, written when the file
-- is committed and rebuilt when the taxonomy changes). Read through the view `op_classes`.
CREATE TABLE IF NOT EXISTS op_class_rows (
    source_id INTEGER,
    origin    VARCHAR,     -- trace | ops
    pid       VARCHAR,
    tid       VARCHAR,
    cat       VARCHAR,
    name      VARCHAR,
    ts_ns     BIGINT,
    dur_ns    BIGINT,
    end_ns    BIGINT,
    op_class  VARCHAR,
    coll_kind VARCHAR,
    pattern   VARCHAR,     -- the taxonomy pattern that classified it
    pg        VARCHAR,     -- process group (Kineto "Process Group Name"), else 'default'
    seq       BIGINT,      -- NCCL Seq when the trace has it
    on_device BOOLEAN,
    tokens    BIGINT,      -- GroupedMatmul tokens from operator CSV input shapes
    launch_ns BIGINT       -- device kernel: ts of the host call that launched it (correlation id)
);
-- databases written before launch_ns existed (derived rows are rebuilt on the schema change)
ALTER TABLE op_class_rows ADD COLUMN IF NOT EXISTS launch_ns BIGINT;

-- All-to-all split sizes of each file (the rows of the macro _a2a_splits_for, written when the
-- file is committed): finding them means looking into the args of every kernel, which is most
-- of the cost of the MoE queries on a large trace if done at query time.
CREATE TABLE IF NOT EXISTS a2a_split_rows (
    source_id   INTEGER,
    ts_ns       BIGINT,
    recv_tokens BIGINT     -- sum of "Out split size" (or Concrete Inputs[3]) of one all-to-all; NULL: unknown
);

-- Parquet files of the Dask path read in place (slowcard/lake.py): a worker writes a file's
-- event rows and the rows derived from them as Parquet beside the database; the coordinator
-- registers them here in the file's commit instead of copying the rows in. Each table of
-- lake.LAKE_TABLES is read through the view <table>_all: the table's own rows UNION ALL its
-- registered files (the view is rewritten with the file list at each registration).
CREATE TABLE IF NOT EXISTS lake_files (
    source_id  INTEGER,
    table_name VARCHAR,     -- which table's rows the file holds
    path       VARCHAR,     -- absolute path of the Parquet file
    n_rows     BIGINT
);
CREATE OR REPLACE VIEW op_class_rows_all AS SELECT * FROM op_class_rows;
CREATE OR REPLACE VIEW a2a_split_rows_all AS SELECT * FROM a2a_split_rows;

-- Captures on alert (slowcard/capture.py, `slowcard watch --capture`, `slowcard capture`): one
-- row per profile capture, written when it starts (status 'running') and updated when it ends;
-- the capture's files are ingested as run `capture-<capture_id>`.
CREATE SEQUENCE IF NOT EXISTS capture_id_seq START 1;
CREATE TABLE IF NOT EXISTS captures (
    capture_id     INTEGER PRIMARY KEY,
    watch_run      VARCHAR,   -- the watched run whose alert caused it (NULL: on demand)
    alert_ts_ns    BIGINT,    -- when the alert fired, epoch ns (metric_verdicts.ts_ns)
    query          VARCHAR,   -- the alerting query (dp-metrics-imbalance, ...) or 'on-demand'
    subject        VARCHAR,   -- what the alert named: 'DP domain 2', 'expert 5, layer 0'
    alert_cause    VARCHAR,
    alert_summary  VARCHAR,
    backend        VARCHAR,   -- vllm | msserviceprofiler | exec
    status         VARCHAR,   -- running | ok | failed | timeout | too-large | interrupted
    reason         VARCHAR,   -- why it is not ok (NULL when ok)
    started_ns     BIGINT,    -- profiler started / stopped, epoch ns
    stopped_ns     BIGINT,
    window_s       DOUBLE,    -- seconds the profiler ran
    folder         VARCHAR,   -- where the capture's files are
    files          INTEGER,
    size_bytes     BIGINT,
    run            VARCHAR,   -- the run the files were ingested as (capture-<capture_id>)
    verdict_status VARCHAR,   -- the capture's diagnosis: status of its conclusion
    slow_card      VARCHAR,   -- 'rank 2', 'DP domain 2', NULL when none
    cause          VARCHAR,
    verdict_query  VARCHAR,   -- the verdict that named it, e.g. ep-slow-rank@v5
    headline       VARCHAR,
    next_step      VARCHAR,
    matches_alert  BOOLEAN,   -- the slow card is the alerted DP domain (NULL: cannot tell)
    notes          VARCHAR,   -- e.g. msserviceprofiler parse not run (not on PATH)
    created_at     TIMESTAMP
);

-- The slow cards each run's diagnosis named (slowcard/fleet.py judges a run once, when `slowcard
-- fleet` first meets it or its files changed): what the fleet queries (sql/fleet-*.sql) count
-- across runs, since a run's verdicts are otherwise computed on demand and never kept.
CREATE TABLE IF NOT EXISTS run_verdicts (
    run         VARCHAR PRIMARY KEY,
    status      VARCHAR,     -- the diagnosis conclusion: FAIL | WARN | PASS | SKIP
    query       VARCHAR,     -- the verdict that named the slow cards, e.g. ep-slow-rank@v8 (NULL: none)
    files_stamp VARCHAR,     -- count and newest ingested_at of the run's files when judged
    judged_at   TIMESTAMP
);
-- one row per slow card of a run (a card named by several rows of its verdict: the costliest)
CREATE TABLE IF NOT EXISTS run_slow_cards (
    run       VARCHAR,
    rank      INTEGER,       -- the slow card's rank (NULL: the finding names a DP domain, an expert …)
    label     VARCHAR,       -- as diagnose prints it: 'rank 3', 'DP domain 1'
    level     VARCHAR,       -- FAIL | WARN
    cause     VARCHAR,
    cost_ms   DOUBLE,
    cost_pct  DOUBLE,
    query     VARCHAR        -- e.g. ep-slow-rank@v8
);

-- Each run's ranks on their physical devices: one row per (run, rank) with the host and device
-- id its files name (first non-NULL in source_id order), and the device key 'host/device_id'
-- only when both are known (a device id alone is not unique across machines).
CREATE OR REPLACE VIEW rank_devices AS
SELECT run, rank,
       first(host ORDER BY source_id) FILTER (WHERE host IS NOT NULL) AS host,
       first(device_id ORDER BY source_id) FILTER (WHERE device_id IS NOT NULL) AS device_id,
       first(host_source ORDER BY source_id) FILTER (WHERE host IS NOT NULL) AS host_source,
       first(device_source ORDER BY source_id) FILTER (WHERE device_id IS NOT NULL) AS device_source
FROM sources WHERE rank IS NOT NULL
GROUP BY run, rank;

-- The fleet's base rows (sql/fleet-*.sql read it): one row per judged run x rank, with the
-- rank's physical device, whether the run's diagnosis named it a slow card (level, cause, cost),
-- and the run's N (ranks) and number of slow ranks: under "no card is special", a rank of the
-- run is named with chance n_slow / n_ranks.
CREATE OR REPLACE VIEW fleet_rank_runs AS
WITH judged AS (
    SELECT v.run, coalesce(r.created_at, v.judged_at) AS run_at, v.status
    FROM run_verdicts v LEFT JOIN runs r USING (run)
),
per_run AS (
    SELECT run, count(*) AS n_ranks FROM rank_devices GROUP BY run
),
slow AS (
    SELECT run, count(DISTINCT rank) AS n_slow FROM run_slow_cards WHERE rank IS NOT NULL GROUP BY run
)
SELECT j.run, j.run_at, j.status AS run_status, p.n_ranks, coalesce(s.n_slow, 0) AS n_slow,
       d.rank, d.host, d.device_id,
       CASE WHEN d.host IS NOT NULL AND d.device_id IS NOT NULL THEN d.host || '/' || d.device_id END AS device,
       c.rank IS NOT NULL AS slow, c.level, c.cause, c.cost_ms, c.cost_pct
FROM judged j
JOIN rank_devices d USING (run)
JOIN per_run p USING (run)
LEFT JOIN slow s USING (run)
LEFT JOIN run_slow_cards c ON c.run = d.run AND c.rank = d.rank;
