-- MoE structure shared by the EP queries: steps, MoE layer instances matched across ranks,
-- what each rank did inside each layer instance, and the tokens it processed.
-- Ops are assigned to steps/layers with ASOF joins (sort-based), never with range joins, so
-- the cost stays linear in events.

-- Sources that carry the EP analysis of a rank: when a rank has both a trace and an operator
-- CSV, the one with more MoE operations is used (never both: that would double count).
CREATE OR REPLACE VIEW _ep_sources AS
WITH per AS (
    SELECT run, rank, source_id, origin,
           count(*) FILTER (WHERE op_class IN ('grouped_matmul', 'dispatch', 'combine', 'moe_layer', 'moe_fused')) AS n_moe,
           bool_or(op_class = 'collective' AND on_device) AS device_collectives
    FROM op_classes GROUP BY ALL
),
pick AS (  -- a run with duplicate ranks (rank_conflicts) is left out: see 05_runs.sql
    SELECT run, rank, arg_max(source_id, n_moe) AS source_id FROM per
    WHERE n_moe > 0 AND run NOT IN (SELECT run FROM rank_conflicts)
    GROUP BY run, rank
)
SELECT per.* FROM per JOIN pick USING (run, rank, source_id);

-- Steps: ProfilerStep#N / decode_step_N annotations (host side); number from the name.
CREATE OR REPLACE VIEW _steps AS
SELECT run, rank, source_id, ts_ns AS step_start_ns, end_ns AS step_end_ns,
       coalesce(TRY_CAST(regexp_extract(name, '(\d+)\s*$', 1) AS BIGINT),
                row_number() OVER (PARTITION BY source_id ORDER BY ts_ns) - 1) AS step
FROM op_classes
WHERE op_class = 'step' AND NOT on_device;

-- The operations of the EP sources. Collectives: the device lane when the source has device
-- collectives (NCCL kernels), else the host lane (gloo threads, HCCL rows).
CREATE OR REPLACE VIEW _ep_ops AS
SELECT o.*
FROM op_classes o JOIN _ep_sources s USING (source_id)
WHERE o.op_class NOT IN ('step')
  AND (o.op_class <> 'collective' OR o.on_device = s.device_collectives);

-- Layer boundaries: a layer annotation (moe_layer_<i>) when the source has them, otherwise the
-- k-th dispatch … k-th combine of the source (the dispatch→GroupedMatmul→combine sequence).
CREATE OR REPLACE VIEW _layer_bounds AS
WITH marks AS (
    SELECT run, rank, source_id, ts_ns AS start_ns, end_ns,
           TRY_CAST(regexp_extract(name, '(\d+)\s*$', 1) AS INTEGER) AS layer_no
    FROM _ep_ops WHERE op_class = 'moe_layer' AND NOT on_device
),
unmarked AS (SELECT source_id FROM _ep_sources EXCEPT SELECT source_id FROM marks),
d AS (
    SELECT o.run, o.rank, o.source_id, o.ts_ns,
           row_number() OVER (PARTITION BY o.source_id ORDER BY o.ts_ns) AS k
    FROM _ep_ops o JOIN unmarked USING (source_id) WHERE o.op_class = 'dispatch'
),
c AS (
    SELECT o.source_id, o.end_ns,
           row_number() OVER (PARTITION BY o.source_id ORDER BY o.ts_ns) AS k
    FROM _ep_ops o JOIN unmarked USING (source_id) WHERE o.op_class = 'combine'
),
g AS (  -- neither annotations nor dispatch/combine: each GroupedMatmul is a layer
    SELECT o.run, o.rank, o.source_id, o.ts_ns AS start_ns, o.end_ns, NULL::INTEGER AS layer_no
    FROM _ep_ops o JOIN unmarked u USING (source_id)
    WHERE o.op_class IN ('grouped_matmul', 'moe_fused')
      AND o.source_id NOT IN (SELECT source_id FROM d)
)
SELECT * FROM marks
UNION ALL
SELECT d.run, d.rank, d.source_id, d.ts_ns, c.end_ns, NULL::INTEGER FROM d JOIN c USING (source_id, k)
UNION ALL
SELECT * FROM g;

-- MoE layer instances: (step, layer, occurrence) is the key matched across ranks.
-- A truncated source (profiler killed mid-write; the ingest kept its complete events, status
-- 'truncated') lost everything written after the cut. Kineto writes lane by lane, each in time
-- order, so on the thread that holds the layers the cut falls in the LAST step still there (or
-- that thread is whole and the cut is in a later lane). That step's layers may be half written
-- (annotation kept; GroupedMatmul, token split or combine gone) and would compare as bogus
-- layers, so the last step of a truncated source (cut_step) is left out; a source without step
-- marks is all step 0 and is left out whole. The EP queries compare only instances every rank
-- has, so this leaves the cut step and later out for every rank. Collectives of lanes the cut
-- dropped whole: see _collectives (30_collectives.sql).
CREATE OR REPLACE VIEW _moe_layers_all AS
WITH stepped AS (
    SELECT l.*, coalesce(s.step, 0) AS step
    FROM _layer_bounds l
    ASOF LEFT JOIN _steps s ON l.source_id = s.source_id AND l.start_ns >= s.step_start_ns
),
numbered AS (
    SELECT *, coalesce(layer_no, row_number() OVER (PARTITION BY source_id, step ORDER BY start_ns) - 1) AS layer
    FROM stepped
)
SELECT n.run, n.rank, n.source_id, n.step, n.layer,
       row_number() OVER (PARTITION BY n.source_id, n.step, n.layer ORDER BY n.start_ns) - 1 AS occurrence,
       n.start_ns, n.end_ns, n.end_ns - n.start_ns AS dur_ns, (n.end_ns - n.start_ns) / 1000.0 AS dur_us,
       CASE WHEN s.status = 'truncated' THEN max(n.step) OVER (PARTITION BY n.source_id) END AS cut_step
FROM numbered n JOIN sources s USING (source_id);

CREATE OR REPLACE VIEW moe_layers AS
SELECT run, rank, source_id, step, layer, occurrence, start_ns, end_ns, dur_ns, dur_us
FROM _moe_layers_all
WHERE cut_step IS NULL OR step < cut_step;

-- What the rule above left out: one row per truncated source with layer instances.
CREATE OR REPLACE VIEW _layer_cuts AS
SELECT run, rank, source_id, any_value(cut_step) AS cut_step,
       count(*) FILTER (WHERE step >= cut_step) AS n_left_out,
       count(*) FILTER (WHERE step < cut_step) AS n_kept
FROM _moe_layers_all
WHERE cut_step IS NOT NULL
GROUP BY run, rank, source_id;

-- Tokens a rank received in an all-to-all: the output split sizes of the call, from
-- Kineto's "Out split size" (NCCL record_param_comms / kernels) or the 4th "Concrete Inputs"
-- entry of c10d::alltoall_base_ (gloo). An empty list ("[]") means equal splits: unknown here.
-- Extracted once per file at commit (macro _a2a_splits_for in 10_classes.sql, table
-- a2a_split_rows): it looks into every kernel's args, the cost that grows with the trace.
CREATE OR REPLACE VIEW _a2a_splits AS
SELECT source_id, ts_ns, recv_tokens
FROM a2a_split_rows
WHERE source_id IN (SELECT source_id FROM _ep_sources);

-- Every EP operation placed in its layer instance.
CREATE OR REPLACE VIEW _layer_ops AS
SELECT o.*, l.step, l.layer, l.occurrence, l.start_ns AS layer_start_ns
FROM _ep_ops o
ASOF JOIN moe_layers l ON o.source_id = l.source_id AND o.ts_ns >= l.start_ns
WHERE o.ts_ns < l.end_ns AND o.op_class <> 'moe_layer';

-- What one rank did in one layer instance. tokens: received by the dispatch all-to-all (first
-- split in the dispatch window), else the GroupedMatmul input rows of operator CSVs.
CREATE OR REPLACE VIEW moe_layer_facts AS
WITH parts AS (
    SELECT source_id, step, layer, occurrence,
           CAST(sum(dur_ns) FILTER (WHERE op_class IN ('grouped_matmul', 'moe_fused')) AS BIGINT) AS gmm_ns,
           CAST(sum(dur_ns) FILTER (WHERE op_class = 'dispatch') AS BIGINT) AS dispatch_ns,
           CAST(sum(dur_ns) FILTER (WHERE op_class = 'combine') AS BIGINT) AS combine_ns,
           CAST(sum(dur_ns) FILTER (WHERE op_class = 'gating') AS BIGINT) AS gating_ns,
           CAST(sum(dur_ns) FILTER (WHERE op_class = 'collective') AS BIGINT) AS collective_ns,
           min(ts_ns) FILTER (WHERE op_class = 'dispatch') AS dispatch_start_ns,
           max(end_ns) FILTER (WHERE op_class = 'dispatch') AS dispatch_end_ns,
           CAST(sum(tokens) FILTER (WHERE op_class = 'grouped_matmul') AS BIGINT) AS gmm_tokens
    FROM _layer_ops GROUP BY ALL
),
splits AS (
    SELECT l.source_id, l.step, l.layer, l.occurrence,
           arg_min(s.recv_tokens, s.ts_ns) AS recv_tokens
    FROM _a2a_splits s
    ASOF JOIN moe_layers l ON s.source_id = l.source_id AND s.ts_ns >= l.start_ns
    JOIN parts p ON p.source_id = l.source_id AND p.step = l.step AND p.layer = l.layer
                AND p.occurrence = l.occurrence
    WHERE s.ts_ns < l.end_ns AND s.recv_tokens IS NOT NULL
      AND s.ts_ns >= coalesce(p.dispatch_start_ns, l.start_ns)
      AND s.ts_ns < coalesce(p.dispatch_end_ns, l.end_ns)
    GROUP BY ALL
)
SELECT l.run, l.rank, l.source_id, l.step, l.layer, l.occurrence, l.start_ns, l.end_ns,
       l.dur_ns AS layer_ns,
       coalesce(p.gmm_ns, 0) AS gmm_ns, coalesce(p.dispatch_ns, 0) AS dispatch_ns,
       coalesce(p.combine_ns, 0) AS combine_ns, coalesce(p.gating_ns, 0) AS gating_ns,
       coalesce(p.collective_ns, 0) AS collective_ns,
       coalesce(sp.recv_tokens, p.gmm_tokens) AS tokens
FROM moe_layers l
LEFT JOIN parts p USING (source_id, step, layer, occurrence)
LEFT JOIN splits sp USING (source_id, step, layer, occurrence);
