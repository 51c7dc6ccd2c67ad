-- msprof-analyze cluster-analysis outputs (../shared/docs/formats.md section 3.6), written by
-- slowcard/ingest/cluster_analysis.py: cluster_step_trace_time.csv and cluster_communication.json,
-- and their per-rank sources, the Ascend PyTorch Profiler's step_trace_time.csv and
-- communication.json (formats.md 2.5, 2.6). The cluster files are cluster-wide summaries (one file
-- for all ranks), so `sources.rank` is NULL for them and the rank of a row is a column here; in a
-- per-rank file the row's rank column is NULL and the views take the file's rank from `sources`.
-- Times are the profiler's own units, as written: the step trace in microseconds, the
-- communication summary in milliseconds (start in epoch microseconds).

-- cluster_step_trace_time.csv: one row per CSV row. `type` = 'rank' rows are one rank's step
-- breakdown; `type` = 'stage' rows summarise a pipeline stage (index is its rank group, e.g.
-- "(0, 1, 2, 3)", and rank is NULL). Columns absent from the file's header are NULL
-- (Preparing and the DP/PP/TP Index columns come with newer msprof-analyze versions).
CREATE TABLE IF NOT EXISTS step_trace_rows (
    source_id                          INTEGER,
    line_no                            BIGINT,    -- 1-based line of the row in the file (the header is line 1)
    step                               VARCHAR,   -- `Step` as written; NULL when empty (no step marks: the whole profiled range)
    step_id                            INTEGER,   -- `Step` as an integer when it is one
    type                               VARCHAR,   -- `Type`, lower case: rank | stage
    index                              VARCHAR,   -- `Index` as written: a rank id, or a rank group "(0, 1, 2, 3)"
    rank                               INTEGER,   -- `Index` of a rank row; NULL for stage rows
    computing_us                       DOUBLE,    -- `Computing`: device compute time
    communication_not_overlapped_us    DOUBLE,    -- `Communication(Not Overlapped)`: communication not hidden by compute (includes waiting for other ranks)
    overlapped_us                      DOUBLE,    -- `Overlapped`: communication hidden by compute
    communication_us                   DOUBLE,    -- `Communication`: all communication time
    free_us                            DOUBLE,    -- `Free`: device idle (neither computing nor communicating)
    stage_us                           DOUBLE,    -- `Stage`
    bubble_us                          DOUBLE,    -- `Bubble`: pipeline bubble (receive time in PP)
    comm_not_overlapped_excl_receive_us DOUBLE,   -- `Communication(Not Overlapped and Exclude Receive)`
    preparing_us                       DOUBLE,    -- `Preparing` (newer versions)
    dp_index                           INTEGER,   -- `DP Index` (newer versions)
    pp_index                           INTEGER,   -- `PP Index`
    tp_index                           INTEGER,   -- `TP Index`
    device_id                          INTEGER    -- `Device_id` (per-rank files of newer versions)
);
-- databases written before device_id existed
ALTER TABLE step_trace_rows ADD COLUMN IF NOT EXISTS device_id INTEGER;

-- The top-level keys of the cluster files (cluster_communication.json,
-- cluster_communication_matrix.json): a rank set "(0, 1, …, 2047)" is as long as the job is wide,
-- so it is stored once per file and key, and each row names it by rank_set_id (stored on every
-- row it took 970 MB for a 2,048-rank matrix and grew with ranks squared, issue 46).
CREATE TABLE IF NOT EXISTS comm_rank_sets (
    source_id   INTEGER,
    rank_set_id INTEGER,   -- position of the key in its file
    rank_set    VARCHAR    -- the key as written: "(0, 1, ...)" or "p2p" / "collective"
);

-- cluster_communication.json: one row per (rank set, step, communication op, rank), i.e. per
-- leaf {"Communication Time Info", "Communication Bandwidth Info"} of the file. The op key
-- "<op>@<group>" is split at its last '@'; msprof-analyze's per-rank "Total Op Info" entry (the
-- sum over the step's ops) is kept as op_name 'Total Op Info', group_name NULL.
-- Bandwidth: one column group per link type (RDMA, HCCS, PCIE, SDMA); NULL when the file has no
-- block for that link. Link types other than these four are kept whole in `other_links`.
CREATE TABLE IF NOT EXISTS comm_summary_rows (
    source_id                INTEGER,
    rank_set                 VARCHAR,   -- NULL (databases written before comm_rank_sets: the key as written)
    step                     VARCHAR,   -- step key as written, e.g. "step" or "step12"
    step_id                  INTEGER,   -- the number in the step key, NULL when it has none
    op_name                  VARCHAR,   -- e.g. hcom_broadcast__501_0, or 'Total Op Info'
    group_name               VARCHAR,   -- after '@', e.g. 6297232067196334501 (the HCCL group)
    rank                     INTEGER,
    start_us                 DOUBLE,    -- `Start Timestamp(us)`, epoch microseconds (the file stores a float)
    elapse_ms                DOUBLE,    -- `Elapse Time(ms)`: the op's duration on this rank
    transit_ms               DOUBLE,    -- `Transit Time(ms)`: time moving data
    wait_ms                  DOUBLE,    -- `Wait Time(ms)`: time waiting (for the peer ranks, mostly)
    sync_ms                  DOUBLE,    -- `Synchronization Time(ms)`: waiting for the peers before the first transfer
    idle_ms                  DOUBLE,    -- `Idle Time(ms)`
    wait_ratio               DOUBLE,    -- `Wait Time Ratio`: wait / (wait + transit)
    sync_ratio               DOUBLE,    -- `Synchronization Time Ratio`: sync / (sync + transit)
    rdma_transit_mb          DOUBLE,    -- `Transit Size(MB)` over RDMA (between hosts)
    rdma_transit_ms          DOUBLE,
    rdma_bandwidth_gbps      DOUBLE,    -- `Bandwidth(GB/s)`
    rdma_large_packet_ratio  DOUBLE,
    hccs_transit_mb          DOUBLE,    -- HCCS (between NPUs of one host)
    hccs_transit_ms          DOUBLE,
    hccs_bandwidth_gbps      DOUBLE,
    hccs_large_packet_ratio  DOUBLE,
    pcie_transit_mb          DOUBLE,
    pcie_transit_ms          DOUBLE,
    pcie_bandwidth_gbps      DOUBLE,
    pcie_large_packet_ratio  DOUBLE,
    sdma_transit_mb          DOUBLE,
    sdma_transit_ms          DOUBLE,
    sdma_bandwidth_gbps      DOUBLE,
    sdma_large_packet_ratio  DOUBLE,
    size_distribution        JSON,      -- {link: {packet size MB: [count, time ms]}} for the four links; NULL when all are empty
    other_links              JSON,      -- {link: block as written} for any other link type; NULL when none
    comm_type                VARCHAR    -- collective | p2p: the group the file files the op under
);
ALTER TABLE comm_summary_rows ADD COLUMN IF NOT EXISTS comm_type VARCHAR;
-- the row's top-level key: comm_rank_sets (source_id, rank_set_id); NULL in a per-rank file
ALTER TABLE comm_summary_rows ADD COLUMN IF NOT EXISTS rank_set_id INTEGER;

-- The views users and queries read: run comes from `sources`, and the rank of a per-rank file's
-- rows. summary_id says which rows form one cluster-wide table: a cluster file's own source_id,
-- and 0 for the per-rank files of a run (together they are the run's summary). pp_rank is the
-- file's pipeline stage when its folder name says it (vLLM dp.._pp.._tp.. folders).
CREATE OR REPLACE VIEW step_trace AS
SELECT s.run, r.* REPLACE (coalesce(r.rank, s.rank) AS rank),
       CASE WHEN s.format = 'step_trace' THEN 0 ELSE r.source_id END AS summary_id,
       s.pp_rank
FROM step_trace_rows r JOIN scoped_sources s USING (source_id);

-- is_total: the "Total Op Info" row of a rank and step; leave it out when summing over ops.
-- rank_set: the row's top-level key as written, e.g. "(0, 1)" (comm_rank_sets).
CREATE OR REPLACE VIEW comm_summary AS
SELECT s.run, c.* REPLACE (coalesce(c.rank, s.rank) AS rank, coalesce(k.rank_set, c.rank_set) AS rank_set),
       c.op_name = 'Total Op Info' AS is_total,
       CASE WHEN s.format = 'communication' THEN 0 ELSE c.source_id END AS summary_id
FROM comm_summary_rows c JOIN scoped_sources s USING (source_id)
LEFT JOIN comm_rank_sets k ON k.source_id = c.source_id AND k.rank_set_id = c.rank_set_id;
