-- Expert-parallel (EP) load data, written by slowcard/ingest/experts.py.
-- Three inputs: the expert-load tensor vLLM-Ascend collects for EPLB
-- ([moe_layers, ep_ranks, local_experts] token counts per window), the expert maps
-- (which logical expert sits in which local slot of which EP rank, one map per EPLB epoch),
-- and Prometheus scrapes (ms-service-metric `eplb:expert_hotness:*`, per-DP gauges).
-- The EP coordinate is called ep_rank everywhere: it is the rank index INSIDE the tensor / map,
-- not sources.rank (the global rank of the file, which these files do not have).

-- One row per (window, MoE layer, EP rank, local physical slot) of a load tensor.
CREATE TABLE IF NOT EXISTS expert_load_rows (
    source_id  INTEGER,
    window_idx INTEGER,   -- window index as the file gives it (4-D tensor index, "window" field, CSV column, file name)
    ts_ns      BIGINT,    -- window time (epoch ns) when the file gives it, else NULL
    epoch      INTEGER,   -- EPLB epoch the window ran under, when the file says so (else resolved from the maps' ts_ns)
    layer      INTEGER,   -- MoE layer index (first tensor dimension)
    ep_rank    INTEGER,   -- EP rank holding the slot
    local_slot INTEGER,   -- local physical expert slot on that rank
    tokens     DOUBLE,    -- tokens routed to the slot in the window; DOUBLE because some dumps are float (hotness / replica count)
    series     VARCHAR    -- files whose rows form ONE tensor: per-rank dumps (MindIE hot-spot CSVs) of one stage in one
                          -- folder share it ("prefill@/path"); NULL: the file is a whole tensor on its own
);
-- databases written before `series` existed
ALTER TABLE expert_load_rows ADD COLUMN IF NOT EXISTS series VARCHAR;

-- One row per (layer, EP rank, local slot) of one expert map (one map file per EPLB epoch).
CREATE TABLE IF NOT EXISTS expert_map_rows (
    source_id  INTEGER,
    epoch      INTEGER,   -- top-level "epoch", else `epoch<N>` in the file name, else 0
    ts_ns      BIGINT,    -- top-level "ts_ns" when present: the time the map took effect
    layer      INTEGER,   -- layer_id
    ep_rank    INTEGER,   -- device_id
    local_slot INTEGER,   -- index in device_expert
    expert     INTEGER    -- logical expert id in that slot (the same id may sit in several slots: redundant experts)
);

-- One row per Prometheus sample of one scrape (generic long form: any metric family).
CREATE TABLE IF NOT EXISTS metric_sample_rows (
    source_id INTEGER,
    scrape    INTEGER,    -- 0-based index of the scrape in the file (blocks separated by `# scrape_ts=` lines)
    ts_ns     BIGINT,     -- the sample's own timestamp, else the scrape's `# scrape_ts=`, else NULL
    family    VARCHAR,    -- metric family (histogram samples share it)
    type      VARCHAR,    -- gauge | counter | histogram | summary | unknown (untyped), as prometheus_client names them
    name      VARCHAR,    -- sample name as exposed (with _bucket/_sum/_count/_total suffixes)
    labels    JSON,       -- all labels, e.g. {"dp":"0","layer":"3","phase":"current","rank":"0"}
    value     DOUBLE
);

CREATE OR REPLACE VIEW expert_load AS
SELECT l.source_id, s.run, l.window_idx, l.ts_ns, l.epoch, l.layer, l.ep_rank, l.local_slot, l.tokens, l.series
FROM expert_load_rows l JOIN scoped_sources s USING (source_id);

CREATE OR REPLACE VIEW expert_map AS
SELECT m.source_id, s.run, m.epoch, m.ts_ns, m.layer, m.ep_rank, m.local_slot, m.expert
FROM expert_map_rows m JOIN scoped_sources s USING (source_id);

-- metric: the name without ms-service-metric's `vllm_profiling_` prefix, so queries can say
-- 'eplb:expert_hotness:imbalance' whatever the deployment prefixes. Label columns are the
-- ones the EP guide uses; everything else stays in `labels`.
CREATE OR REPLACE VIEW metric_samples AS
SELECT m.source_id, s.run, m.scrape, m.ts_ns, m.family, m.type, m.name,
       regexp_replace(m.name, '^vllm_profiling_', '') AS metric,
       m.labels, m.value,
       TRY_CAST(m.labels ->> 'dp' AS INTEGER)    AS dp,
       TRY_CAST(m.labels ->> 'rank' AS INTEGER)  AS label_rank,
       TRY_CAST(m.labels ->> 'layer' AS INTEGER) AS layer,
       m.labels ->> 'phase'                      AS phase
FROM metric_sample_rows m JOIN scoped_sources s USING (source_id);
