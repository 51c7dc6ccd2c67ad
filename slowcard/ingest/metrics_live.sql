-- Live service metrics collected by `slowcard watch` (slowcard/watch.py, slowcard/metrics.py).
-- One `sources` row per watched source and run (format metrics_scrape: the /metrics endpoints;
-- format prometheus_api: a Prometheus server), path = the endpoint list or the server URL.
-- Rows are appended one window at a time, each window in one transaction (an interrupted watch
-- leaves whole windows only); windows older than the watch's retention are deleted, and so is
-- a window more than 10 minutes in the future (never written since issue 31; repaired if found).
-- Expert-load metrics go to expert_load_rows (window_idx = the window's sequence number), so
-- expert-hotspots / eplb-effect read them like a load tensor.

-- One row per window (two consecutive snapshots) and DP domain, plus one instance row (dp_rank NULL).
CREATE TABLE IF NOT EXISTS metric_window_rows (
    source_id               INTEGER,
    ts_ns                   BIGINT,    -- window end (scrape time, or the Prometheus step), epoch ns
    window_s                DOUBLE,    -- window length in seconds (rates are per second of it)
    dp_rank                 INTEGER,   -- DP domain (vLLM `engine` label, else the endpoint's DP); NULL = whole instance
    targets                 INTEGER,   -- endpoints that answered for this domain
    running                 DOUBLE,    -- requests running at the window end (gauge)
    waiting                 DOUBLE,    -- requests waiting at the window end (gauge)
    kv_usage                DOUBLE,    -- KV-cache usage 0-1 at the window end (gauge; mean over endpoints)
    requests_per_s          DOUBLE,    -- finished requests per second (counter rate)
    prompt_tokens_per_s     DOUBLE,    -- prompt tokens per second (counter rate)
    generation_tokens_per_s DOUBLE,    -- generated tokens per second (counter rate)
    ttft_p50_ms             DOUBLE,    -- time to first token quantiles of the window's requests (histogram)
    ttft_p95_ms             DOUBLE,
    ttft_p99_ms             DOUBLE,
    e2e_p50_ms              DOUBLE,    -- end-to-end request latency quantiles of the window's requests
    e2e_p95_ms              DOUBLE,
    e2e_p99_ms              DOUBLE,
    reset                   BOOLEAN    -- a counter went down in the window (exporter restart): rates count from the restart
);

-- One row per collection attempt and endpoint: what answered, what failed and why.
CREATE TABLE IF NOT EXISTS metric_scrape_rows (
    source_id  INTEGER,
    ts_ns      BIGINT,    -- attempt time, epoch ns
    target     VARCHAR,   -- endpoint URL (or Prometheus instance)
    ok         BOOLEAN,
    samples    INTEGER,   -- mapped samples kept
    dropped    INTEGER,   -- lines that did not parse, samples whose rank, time or value is not a usable number, series over the cap
    error      VARCHAR,   -- timeout | connection refused | HTTP 503 | garbage: … (NULL when ok)
    note       VARCHAR    -- why samples were dropped: the first reasons with their counts (NULL: none dropped)
);
-- databases from before `note` (issue 31)
ALTER TABLE metric_scrape_rows ADD COLUMN IF NOT EXISTS note VARCHAR;

-- The watched verdicts after each collection: the alert history (a status differing from the
-- previous row of the same query is an alert; --once compares with the row of the last cron run).
CREATE TABLE IF NOT EXISTS metric_verdict_rows (
    source_id INTEGER,
    ts_ns     BIGINT,    -- evaluation time, epoch ns
    query     VARCHAR,   -- e.g. dp-metrics-imbalance
    status    VARCHAR,   -- PASS | WARN | FAIL | INFO | SKIP | ERROR
    summary   VARCHAR
);

CREATE OR REPLACE VIEW metric_windows AS
SELECT m.source_id, s.run, m.ts_ns, m.window_s, m.dp_rank, m.targets, m.running, m.waiting, m.kv_usage,
       m.requests_per_s, m.prompt_tokens_per_s, m.generation_tokens_per_s,
       m.prompt_tokens_per_s + coalesce(m.generation_tokens_per_s, 0) AS tokens_per_s,
       m.ttft_p50_ms, m.ttft_p95_ms, m.ttft_p99_ms, m.e2e_p50_ms, m.e2e_p95_ms, m.e2e_p99_ms, m.reset
FROM metric_window_rows m JOIN scoped_sources s USING (source_id);

CREATE OR REPLACE VIEW metric_scrapes AS
SELECT m.source_id, s.run, m.ts_ns, m.target, m.ok, m.samples, m.dropped, m.error, m.note
FROM metric_scrape_rows m JOIN scoped_sources s USING (source_id);

CREATE OR REPLACE VIEW metric_verdicts AS
SELECT m.source_id, s.run, m.ts_ns, m.query, m.status, m.summary
FROM metric_verdict_rows m JOIN scoped_sources s USING (source_id);
