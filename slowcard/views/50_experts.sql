-- Expert-parallel helper views shared by sql/expert-hotspots.sql, eplb-effect.sql, eplb-whatif.sql
-- (and the EP trace views). Inputs: expert_load, expert_map (slowcard/ingest/experts.sql).
--
-- Vocabulary:
--   slot     a local physical expert slot (ep_rank, local_slot) of the load tensor;
--   expert   a logical expert id; the map of the window's EPLB epoch says which expert sits in a
--            slot; without a map the id is ep_rank * slots_per_rank + local_slot (the numbering
--            msServiceProfiler/MindIE use: 16 ranks x 17 experts, id 42 = rank 2, slot 7);
--   window   one load tensor of one file, ordered across the run as wseq (1, 2, …);
--   par      peak-to-average ratio of per-rank load in a layer, max(rank tokens) / mean(rank
--            tokens): vLLM-Ascend's EPLB imbalance.

-- The map in force for each (run, epoch): when two files claim the same epoch the one ingested
-- last (highest source_id) wins, so a re-written map replaces the old one.
CREATE OR REPLACE VIEW _expert_map_current AS
SELECT *
FROM expert_map
QUALIFY source_id = max(source_id) OVER (PARTITION BY run, epoch);

CREATE OR REPLACE VIEW _expert_map_epochs AS
SELECT run, epoch, min(ts_ns) AS ts_ns, count(DISTINCT layer) AS layers, max(expert) + 1 AS n_experts
FROM _expert_map_current
GROUP BY run, epoch;

-- One row per load window with the EPLB epoch it ran under:
--   1. the epoch the load file states (window field, CSV column, `epoch<N>` in the file name);
--   2. else the latest map whose ts_ns is at or before the window's ts_ns;
--   3. else the run's only map, when it has exactly one;
--   4. else NULL (no map applies: default expert numbering, no EPLB update can be seen).
-- wseq orders windows across the run: by epoch, then time, then file and window index.
-- slots_per_rank (the tensor's last dimension) gives the default expert numbering.
-- Per-rank files of one series (MindIE hot-spot dumps: one file per rank) are one tensor: their
-- windows of the same index share a wseq, so the views below see every rank of the layer.
CREATE OR REPLACE VIEW _expert_windows AS
WITH w AS (
    SELECT run, source_id, window_idx, min(ts_ns) AS ts_ns, min(epoch) AS file_epoch,
           max(local_slot) + 1 AS slots_per_rank, any_value(series) AS series
    FROM expert_load
    GROUP BY run, source_id, window_idx
), one_map AS (       -- runs with exactly one map: it applies to every window
    SELECT run, min(epoch) AS epoch FROM _expert_map_epochs GROUP BY run HAVING count(*) = 1
), r AS (
    SELECT w.*, COALESCE(w.file_epoch, m.epoch, o.epoch) AS epoch
    FROM w
    ASOF LEFT JOIN (SELECT run, epoch, ts_ns FROM _expert_map_epochs WHERE ts_ns IS NOT NULL) m
      ON m.run = w.run AND w.ts_ns >= m.ts_ns
    LEFT JOIN one_map o ON o.run = w.run
)
SELECT run, source_id, window_idx, ts_ns, file_epoch, epoch, slots_per_rank,
       dense_rank() OVER (PARTITION BY run ORDER BY epoch NULLS FIRST, ts_ns NULLS FIRST, series NULLS FIRST,
                          CASE WHEN series IS NULL THEN source_id END, window_idx) AS wseq
FROM r;

-- Slot loads with the logical expert each slot held. A cell repeated inside one file (possible
-- in the CSV form) appears twice here and is summed by the views below.
CREATE OR REPLACE VIEW _expert_slot_load AS
SELECT l.run, w.wseq, w.epoch, l.source_id, l.window_idx, l.ts_ns, l.layer, l.ep_rank, l.local_slot,
       l.tokens, w.slots_per_rank,
       COALESCE(m.expert, l.ep_rank * w.slots_per_rank + l.local_slot) AS expert,
       m.expert IS NOT NULL AS mapped
FROM expert_load l
JOIN _expert_windows w USING (run, source_id, window_idx)
LEFT JOIN _expert_map_current m
  ON m.run = l.run AND m.epoch = w.epoch AND m.layer = l.layer
 AND m.ep_rank = l.ep_rank AND m.local_slot = l.local_slot;

-- Logical expert load per window and layer (replicas summed; replicas = ranks holding it,
-- main_rank = the one with most of its tokens); hotness = tokens / mean tokens of the layer's
-- logical experts in that window.
CREATE OR REPLACE VIEW _expert_logical_load AS
WITH e AS (
    SELECT run, wseq, any_value(epoch) AS epoch, layer, expert, sum(tokens) AS tokens,
           count(DISTINCT ep_rank) AS replicas, arg_max(ep_rank, tokens) AS main_rank
    FROM _expert_slot_load
    GROUP BY run, wseq, layer, expert
)
SELECT *, tokens / NULLIF(avg(tokens) OVER (PARTITION BY run, wseq, layer), 0) AS hotness,
       count(*) OVER (PARTITION BY run, wseq, layer) AS n_experts
FROM e;

-- Per-rank load per window and layer; rank_ratio = tokens / mean over the layer's ranks.
CREATE OR REPLACE VIEW _expert_rank_load AS
WITH r AS (
    SELECT run, wseq, any_value(epoch) AS epoch, layer, ep_rank, sum(tokens) AS tokens,
           count(DISTINCT local_slot) AS slots
    FROM _expert_slot_load
    GROUP BY run, wseq, layer, ep_rank
)
SELECT *, tokens / NULLIF(avg(tokens) OVER (PARTITION BY run, wseq, layer), 0) AS rank_ratio,
       count(*) OVER (PARTITION BY run, wseq, layer) AS n_ranks
FROM r;

-- Peak-to-average imbalance per window and layer, and the rank carrying the peak.
CREATE OR REPLACE VIEW _expert_layer_balance AS
SELECT run, wseq, any_value(epoch) AS epoch, layer, count(*) AS n_ranks,
       max(tokens) AS max_rank_tokens, avg(tokens) AS mean_rank_tokens,
       max(tokens) / NULLIF(avg(tokens), 0) AS par,
       arg_max(ep_rank, tokens) AS peak_rank
FROM _expert_rank_load
GROUP BY run, wseq, layer;
