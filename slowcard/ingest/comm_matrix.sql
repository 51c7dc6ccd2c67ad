-- Communication matrices and groups (../shared/docs/formats.md sections 2.6 and 3.6), written by
-- slowcard/ingest/comm_matrix.py: one rank's communication_matrix.json, msprof-analyze's
-- cluster_communication_matrix.json and communication_group.json. Units as the profiler writes
-- them: MB (10^6 bytes), ms, GB/s.

-- One row per (op, src-dst link) of a matrix. In a per-rank file rank_set is NULL and the view
-- adds the file's rank; the src / dst ranks are as written in the "<src>-<dst>" key.
CREATE TABLE IF NOT EXISTS comm_matrix_rows (
    source_id       INTEGER,
    rank_set        VARCHAR,   -- NULL (databases written before comm_rank_sets: the key as written)
    comm_type       VARCHAR,   -- collective | p2p
    step            VARCHAR,   -- step key as written ("step2")
    step_id         INTEGER,   -- the number in the step key
    op_name         VARCHAR,   -- the op key before its last '@' (an op instance, or "<op type>-top1" summaries, or "Total Op Info")
    group_name      VARCHAR,   -- after the '@': the HCCL group
    src_rank        INTEGER,
    dst_rank        INTEGER,
    transport_type  VARCHAR,   -- LOCAL | HCCS | PCIE | RDMA | SDMA | SIO as written
    transit_size_mb DOUBLE,
    transit_ms      DOUBLE,
    bandwidth_gbps  DOUBLE,
    link_op_name    VARCHAR    -- the link's own "Op Name" when the file has one (summary keys name the op they stand for)
);
-- cluster file: the top-level key, comm_rank_sets (source_id, rank_set_id) (cluster_analysis.sql);
-- NULL per rank
ALTER TABLE comm_matrix_rows ADD COLUMN IF NOT EXISTS rank_set_id INTEGER;

-- One row per group of communication_group.json.
CREATE TABLE IF NOT EXISTS comm_group_rows (
    source_id  INTEGER,
    group_type VARCHAR,    -- collective | p2p (or a parallel-info record's own type)
    group_idx  INTEGER,    -- position in its list
    ranks      INTEGER[],  -- the global ranks of the group; a p2p group is one pipeline stage's ranks
    group_name VARCHAR,    -- comm_group_parallel_info records: the HCCL group
    pg_name    VARCHAR,    -- comm_group_parallel_info records: the framework's name (e.g. dp, tp, pp)
    info       JSON        -- the whole record as written (NULL for plain rank lists)
);

-- is_total: the "Total Op Info" entry; leave it out when summing over ops. rank_set: the cluster
-- file's top-level key as written, "(0, 1, ...)" or "p2p" (comm_rank_sets); NULL per rank.
CREATE OR REPLACE VIEW comm_matrix AS
SELECT s.run, m.* REPLACE (coalesce(k.rank_set, m.rank_set) AS rank_set), s.rank AS file_rank,
       m.op_name = 'Total Op Info' AS is_total,
       CASE WHEN s.format = 'comm_matrix' THEN 0 ELSE m.source_id END AS summary_id
FROM comm_matrix_rows m JOIN scoped_sources s USING (source_id)
LEFT JOIN comm_rank_sets k ON k.source_id = m.source_id AND k.rank_set_id = m.rank_set_id;

CREATE OR REPLACE VIEW comm_groups AS
SELECT s.run, g.*
FROM comm_group_rows g JOIN scoped_sources s USING (source_id);
