-- MoE structure shared by the EP queries: steps, MoE layer instances matched across ranks,
-- what each rank did inside each layer instance, and the tokens it processed.
-- Ops are assigned to steps/layers with ASOF joins (sort-based), never with range joins, so
-- the cost stays linear in events.

-- Sources that carry the EP analysis of a rank: when a rank has both a trace and an operator
-- CSV, the one with more MoE operations is used (never both: that would double count).
-- device_moe: the source has MoE operations on the device (GPU kernels, device annotations,
-- operator-CSV tasks). Such a source is measured on the device timeline only: its host ranges of
-- the same classes (the launching cpu_op, a python frame) are launch times, not execution times,
-- and mixing the two lanes paired a device kernel with a host range of another layer.
CREATE OR REPLACE VIEW _ep_sources AS
WITH per AS (
    SELECT run, rank, source_id, origin,
           count(*) FILTER (WHERE op_class IN ('grouped_matmul', 'dispatch', 'combine', 'moe_layer', 'moe_fused')) AS n_moe,
           bool_or(op_class = 'collective' AND on_device) AS device_collectives,
           coalesce(bool_or(on_device) FILTER (WHERE op_class IN ('grouped_matmul', 'dispatch', 'combine', 'gating', 'moe_fused')), false) AS device_moe
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
-- collectives (NCCL kernels), else the host lane (gloo threads, HCCL rows). MoE classes: the
-- device lane when the source has one (device_moe above), else the host lane. Layer annotations
-- (moe_layer) stay host ranges; _layer_bounds maps them onto the device.
-- A MoE class that a device source names only on the host (Megatron / SGLang python frames
-- "token_dispatcher.py(611): token_dispatch" around generic NCCL kernels) is moved onto the
-- device: each outermost host range of that class becomes the span of the device operations
-- launched inside it (cat 'host_range_on_device'), like Kineto's gpu_user_annotation copy of a
-- record_function range.
CREATE OR REPLACE VIEW _ep_ops AS
WITH base AS MATERIALIZED (
    SELECT o.*, s.device_moe
    FROM op_classes o JOIN _ep_sources s USING (source_id)
    WHERE o.op_class NOT IN ('step')
      AND (o.op_class <> 'collective' OR o.on_device = s.device_collectives)
),
host_only AS (  -- (source, class) named on the host only, in a device source
    SELECT source_id, op_class FROM base
    WHERE device_moe AND op_class IN ('grouped_matmul', 'dispatch', 'combine', 'gating', 'moe_fused')
    GROUP BY ALL HAVING NOT bool_or(on_device)
),
host_ranges AS (
    SELECT b.* FROM base b JOIN host_only USING (source_id, op_class)
    QUALIFY coalesce(max(b.end_ns) OVER (PARTITION BY b.source_id, b.op_class ORDER BY b.ts_ns, b.end_ns DESC
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), b.ts_ns) <= b.ts_ns
),
launched AS (
    SELECT l.source_id, h.op_class, l.ts_ns, l.end_ns, l.launch_ns
    FROM base l JOIN host_only h USING (source_id)
    WHERE l.on_device AND l.launch_ns IS NOT NULL
),
moved AS (
    SELECT h.run, h.rank, h.host, h.source_id, h.origin, h.pid, h.tid,
           'host_range_on_device' AS cat, h.name, min(l.ts_ns) AS ts_ns,
           max(l.end_ns) - min(l.ts_ns) AS dur_ns, max(l.end_ns) AS end_ns, h.op_class, h.coll_kind,
           h.pattern || ' (host range, device span)' AS pattern, h.pg, h.seq, true AS on_device,
           h.tokens, min(l.launch_ns) AS launch_ns
    FROM launched l
    ASOF JOIN host_ranges h ON l.source_id = h.source_id AND l.op_class = h.op_class AND l.launch_ns >= h.ts_ns
    WHERE l.launch_ns < h.end_ns
    GROUP BY h.run, h.rank, h.host, h.source_id, h.origin, h.pid, h.tid, h.name, h.ts_ns, h.op_class,
             h.coll_kind, h.pattern, h.pg, h.seq, h.tokens
)
SELECT * EXCLUDE (device_moe) FROM base
WHERE op_class NOT IN ('grouped_matmul', 'dispatch', 'combine', 'gating', 'moe_fused')
   OR on_device = device_moe
UNION ALL
SELECT * FROM moved;

-- Layer boundaries, on the lane the source is measured on (start_ns, end_ns) plus anchor_ns,
-- the host time that places the layer in its step (host steps, device kernels run later):
--  1. layer annotations (moe_layer_<i>, vllm::moe_forward, nn.Module: FusedMoE_0, ...): an
--     annotation inside another one is the same layer (FusedMoE module around moe_forward). On a
--     device source the layer is the span of the device operations LAUNCHED inside the host
--     annotation (launch_ns, from the correlation ids), so host and device times never mix;
--  2. else dispatch → combine pairs: consecutive operations of one class form one block (notify
--     + dispatch kernels, a dispatch annotation around its collective), and a layer is a
--     dispatch block followed by a combine block. Backward annotations ("combine(B)", run before
--     "dispatch(B)") pair the other way round. Only the best lane of the source is used (kernels,
--     else device annotations, else host ranges): never a host range with a kernel;
--  3. else each block of outermost GroupedMatmul operations with no other MoE operation between
--     them is a layer (the expert GEMMs of one layer, between its routing and the next's); a
--     source with GroupedMatmul operations only: each of them.
-- end_ns >= start_ns by construction; the filter at the end keeps it so.
CREATE OR REPLACE VIEW _layer_bounds AS
WITH ops AS MATERIALIZED (  -- every CTE below reads these: computed once (views are inlined)
    SELECT o.*, s.device_moe FROM _ep_ops o JOIN _ep_sources s USING (source_id)
),
srcs AS MATERIALIZED (SELECT source_id, device_moe FROM _ep_sources),
raw_marks AS (
    SELECT o.run, o.rank, o.source_id, o.ts_ns AS start_ns, o.end_ns,
           TRY_CAST(regexp_extract(o.name, '^(?:decoder_)?moe[_ ]?layer[_ ]?(\d+)\s*$', 1) AS INTEGER) AS layer_no
    FROM ops o WHERE o.op_class = 'moe_layer' AND NOT o.on_device
),
outer_marks AS (
    SELECT * FROM raw_marks
    QUALIFY coalesce(max(end_ns) OVER (PARTITION BY source_id ORDER BY start_ns, end_ns DESC
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), start_ns) <= start_ns
),
dev_ops AS (
    SELECT o.source_id, o.ts_ns, o.end_ns, o.launch_ns
    FROM ops o
    WHERE o.device_moe AND o.on_device AND o.launch_ns IS NOT NULL AND o.op_class <> 'moe_layer'
),
mapped AS (
    SELECT m.run, m.rank, m.source_id, min(d.ts_ns) AS start_ns, max(d.end_ns) AS end_ns,
           m.layer_no, m.start_ns AS anchor_ns
    FROM dev_ops d
    ASOF JOIN outer_marks m ON d.source_id = m.source_id AND d.launch_ns >= m.start_ns
    WHERE d.launch_ns < m.end_ns
    GROUP BY m.run, m.rank, m.source_id, m.start_ns, m.layer_no
),
marks AS (
    SELECT m.run, m.rank, m.source_id, m.start_ns, m.end_ns, m.layer_no, m.start_ns AS anchor_ns
    FROM outer_marks m JOIN srcs s USING (source_id) WHERE NOT s.device_moe
    UNION ALL
    SELECT * FROM mapped
),
unmarked AS (SELECT source_id FROM srcs EXCEPT SELECT source_id FROM marks),
dc0 AS (
    SELECT o.run, o.rank, o.source_id, o.op_class, o.ts_ns, o.end_ns, o.on_device, o.launch_ns,
           regexp_matches(o.name, '\(\s*(B|bwd)\s*\)\s*$|backward', 'i') AS bwd,
           CASE WHEN o.cat = 'kernel' THEN 0 WHEN o.on_device THEN 1 ELSE 2 END AS lane
    FROM ops o JOIN unmarked USING (source_id)
    WHERE o.op_class IN ('dispatch', 'combine')
    QUALIFY lane = min(lane) OVER (PARTITION BY o.source_id)
),
dc AS (  -- anchor: the host launch time; a device annotation has none, but starts with its first
         -- kernel (the first launched device operation starting at or after it)
    SELECT d.* EXCLUDE (launch_ns, on_device),
           coalesce(d.launch_ns, CASE WHEN d.on_device THEN k.launch_ns END, d.ts_ns) AS anchor_ns
    FROM dc0 d
    ASOF LEFT JOIN (SELECT source_id, ts_ns, launch_ns FROM dev_ops) k
        ON d.source_id = k.source_id AND d.ts_ns <= k.ts_ns
),
blocks AS (
    SELECT run, rank, source_id, op_class, bwd, min(ts_ns) AS start_ns, max(end_ns) AS end_ns,
           min(anchor_ns) AS anchor_ns, block
    FROM (
        SELECT *, sum(CASE WHEN same THEN 0 ELSE 1 END)
                      OVER (PARTITION BY source_id ORDER BY ts_ns, end_ns ROWS UNBOUNDED PRECEDING) AS block
        FROM (SELECT *, coalesce(op_class = lag(op_class) OVER w AND bwd = lag(bwd) OVER w, false) AS same
              FROM dc WINDOW w AS (PARTITION BY source_id ORDER BY ts_ns, end_ns))
    )
    GROUP BY run, rank, source_id, op_class, bwd, block
),
pairs AS (
    SELECT *, lead(op_class) OVER w AS next_class, lead(bwd) OVER w AS next_bwd,
           lead(end_ns) OVER w AS next_end_ns
    FROM blocks WINDOW w AS (PARTITION BY source_id ORDER BY block)
),
paired AS (
    SELECT run, rank, source_id, start_ns, greatest(end_ns, next_end_ns) AS end_ns,
           NULL::INTEGER AS layer_no, anchor_ns
    FROM pairs
    WHERE next_class IS NOT NULL AND next_class <> op_class AND next_bwd = bwd
      AND op_class = CASE WHEN bwd THEN 'combine' ELSE 'dispatch' END
),
g_ops AS (  -- neither annotations nor dispatch/combine pairs: the outermost MoE operations
    SELECT o.run, o.rank, o.source_id, o.op_class IN ('grouped_matmul', 'moe_fused') AS is_gmm,
           o.ts_ns, o.end_ns, coalesce(o.launch_ns, o.ts_ns) AS anchor_ns
    FROM ops o JOIN unmarked u USING (source_id)
    WHERE o.op_class IN ('grouped_matmul', 'moe_fused', 'gating', 'dispatch', 'combine')
      AND o.source_id NOT IN (SELECT source_id FROM paired)
    QUALIFY coalesce(max(o.end_ns) OVER (PARTITION BY o.source_id ORDER BY o.ts_ns, o.end_ns DESC
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), o.ts_ns) <= o.ts_ns
),
g_blocks AS (  -- GroupedMatmul operations with no other MoE operation between them are one
               -- block (the two expert GEMMs of a layer); a source that has nothing but
               -- GroupedMatmul operations keeps one per layer, as nothing marks where a layer ends
    SELECT *, sum(CASE WHEN is_gmm AND prev_gmm AND has_other THEN 0 ELSE 1 END)
                  OVER (PARTITION BY source_id ORDER BY ts_ns, end_ns ROWS UNBOUNDED PRECEDING) AS block
    FROM (SELECT *, bool_or(NOT is_gmm) OVER (PARTITION BY source_id) AS has_other,
                 coalesce(lag(is_gmm) OVER (PARTITION BY source_id ORDER BY ts_ns, end_ns), false) AS prev_gmm
          FROM g_ops)
),
g AS (  -- each GroupedMatmul block is a layer
    SELECT run, rank, source_id, min(ts_ns) AS start_ns, max(end_ns) AS end_ns, NULL::INTEGER AS layer_no,
           min(anchor_ns) AS anchor_ns
    FROM g_blocks WHERE is_gmm
    GROUP BY run, rank, source_id, block
)
SELECT * FROM (
    SELECT * FROM marks
    UNION ALL
    SELECT * FROM paired
    UNION ALL
    SELECT * FROM g
)
WHERE end_ns >= start_ns;

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
    ASOF LEFT JOIN _steps s ON l.source_id = s.source_id AND l.anchor_ns >= s.step_start_ns
),
numbered AS (
    SELECT *, coalesce(layer_no, row_number() OVER (PARTITION BY source_id, step ORDER BY start_ns) - 1) AS layer
    FROM stepped
)
SELECT n.run, n.rank, n.source_id, n.step, n.layer,
       row_number() OVER (PARTITION BY n.source_id, n.step, n.layer ORDER BY n.start_ns) - 1 AS occurrence,
       n.start_ns, n.end_ns, n.end_ns - n.start_ns AS dur_ns, (n.end_ns - n.start_ns) / 1000.0 AS dur_us,
       CASE WHEN s.status = 'truncated' THEN max(n.step) OVER (PARTITION BY n.source_id) END AS cut_step
FROM numbered n JOIN scoped_sources s USING (source_id);

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
-- On a source measured on the device timeline (device_moe), a split read from a host op
-- (record_param_comms, c10d::alltoall_base_) is placed at the start of the device collective it
-- launched (the first one launched at or after the host op starts), so that it falls in the
-- device dispatch window of its layer; a split carried by the kernel itself is already there.
CREATE OR REPLACE VIEW _a2a_splits AS
WITH s AS (
    SELECT a.source_id, a.ts_ns, a.recv_tokens, e.device_moe
    FROM a2a_split_rows_all a JOIN _ep_sources e USING (source_id)
),
dev AS (
    SELECT source_id, ts_ns, launch_ns FROM op_classes
    WHERE op_class = 'collective' AND on_device AND launch_ns IS NOT NULL
      AND source_id IN (SELECT source_id FROM _ep_sources WHERE device_moe)
),
host_side AS (
    SELECT s.* FROM s WHERE s.device_moe
      AND NOT EXISTS (SELECT 1 FROM dev d WHERE d.source_id = s.source_id AND d.ts_ns = s.ts_ns)
),
moved AS (
    SELECT h.source_id, d.ts_ns, h.recv_tokens
    FROM host_side h ASOF JOIN (SELECT * FROM dev) d ON d.source_id = h.source_id AND d.launch_ns >= h.ts_ns
)
SELECT source_id, ts_ns, recv_tokens FROM s
WHERE NOT device_moe
   OR EXISTS (SELECT 1 FROM dev d WHERE d.source_id = s.source_id AND d.ts_ns = s.ts_ns)
UNION ALL
SELECT * FROM moved;

-- Every EP operation placed in its layer instance.
CREATE OR REPLACE VIEW _layer_ops AS
SELECT o.*, l.step, l.layer, l.occurrence, l.start_ns AS layer_start_ns, l.end_ns AS layer_end_ns
FROM _ep_ops o
ASOF JOIN moe_layers l ON o.source_id = l.source_id AND o.ts_ns >= l.start_ns
WHERE o.ts_ns < l.end_ns AND o.op_class <> 'moe_layer';

-- What one rank did in one layer instance. tokens: received by the dispatch all-to-all (first
-- split in the dispatch window), else the GroupedMatmul input rows of operator CSVs.
-- gmm_ns / dispatch_ns / combine_ns / gating_ns: union time of the class (_layer_class_time);
-- the *_excl_ns, overlap_ns and other_ns columns split layer_ns exactly (they add up to it).
-- Views are inlined where they are used: moe_layers and the layer ops are each read several
-- times below, so they are materialised once per query.
CREATE OR REPLACE VIEW moe_layer_facts AS
WITH layers AS MATERIALIZED (SELECT * FROM moe_layers),
lops AS MATERIALIZED (  -- = _layer_ops, on the layers above
    SELECT o.*, l.step, l.layer, l.occurrence, l.start_ns AS layer_start_ns, l.end_ns AS layer_end_ns
    FROM _ep_ops o
    ASOF JOIN layers l ON o.source_id = l.source_id AND o.ts_ns >= l.start_ns
    WHERE o.ts_ns < l.end_ns AND o.op_class <> 'moe_layer'
),
-- class_time: time of each MoE class inside each layer instance, overlap-aware (multi-stream traces run
-- a combine beside the next GroupedMatmul; nested host ranges repeat their parent's class):
--   <class>_ns       union of the class's intervals (a nested or concurrent op counts once)
--   <class>_excl_ns  time when ONLY that class runs
--   overlap_ns       time when two or more classes run at once
--   busy_ns          time when any class runs; layer_ns - busy_ns is the rest (other work, gaps)
-- so gmm_excl + dispatch_excl + combine_excl + gating_excl + overlap + (layer - busy) = layer.
-- Intervals are clipped to the layer. Computed by a sweep over interval boundaries (sorts only).
segs AS (
    SELECT source_id, step, layer, occurrence,
           CASE WHEN op_class = 'moe_fused' THEN 'grouped_matmul' ELSE op_class END AS cls,
           ts_ns, least(end_ns, layer_end_ns) AS end_ns
    FROM lops
    WHERE op_class IN ('grouped_matmul', 'moe_fused', 'dispatch', 'combine', 'gating')
),
flagged AS (  -- an op starts a new island of its class when it starts after all earlier ones ended
    SELECT *, CASE WHEN ts_ns < max(end_ns) OVER (PARTITION BY source_id, step, layer, occurrence, cls
                                               ORDER BY ts_ns, end_ns
                                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                   THEN 0 ELSE 1 END AS new_island
    FROM segs
),
merged AS (
    SELECT source_id, step, layer, occurrence, cls, min(ts_ns) AS s_ns, max(end_ns) AS e_ns
    FROM (SELECT *, sum(new_island) OVER (PARTITION BY source_id, step, layer, occurrence, cls
                                          ORDER BY ts_ns, end_ns ROWS UNBOUNDED PRECEDING) AS island
          FROM flagged)
    GROUP BY source_id, step, layer, occurrence, cls, island
),
points AS (
    SELECT source_id, step, layer, occurrence, p_ns,
           sum(d) FILTER (WHERE cls = 'grouped_matmul') AS d_gmm,
           sum(d) FILTER (WHERE cls = 'dispatch') AS d_dispatch,
           sum(d) FILTER (WHERE cls = 'combine') AS d_combine,
           sum(d) FILTER (WHERE cls = 'gating') AS d_gating
    FROM (SELECT source_id, step, layer, occurrence, cls, s_ns AS p_ns, 1 AS d FROM merged
          UNION ALL
          SELECT source_id, step, layer, occurrence, cls, e_ns, -1 FROM merged)
    GROUP BY ALL
),
running AS (
    SELECT source_id, step, layer, occurrence, p_ns,
           lead(p_ns) OVER w - p_ns AS len_ns,
           sum(coalesce(d_gmm, 0)) OVER w > 0 AS g,
           sum(coalesce(d_dispatch, 0)) OVER w > 0 AS d,
           sum(coalesce(d_combine, 0)) OVER w > 0 AS c,
           sum(coalesce(d_gating, 0)) OVER w > 0 AS t
    FROM points
    WINDOW w AS (PARTITION BY source_id, step, layer, occurrence ORDER BY p_ns ROWS UNBOUNDED PRECEDING)
),
excl AS (
    SELECT source_id, step, layer, occurrence,
           CAST(sum(len_ns) FILTER (WHERE g AND NOT d AND NOT c AND NOT t) AS BIGINT) AS gmm_excl_ns,
           CAST(sum(len_ns) FILTER (WHERE d AND NOT g AND NOT c AND NOT t) AS BIGINT) AS dispatch_excl_ns,
           CAST(sum(len_ns) FILTER (WHERE c AND NOT g AND NOT d AND NOT t) AS BIGINT) AS combine_excl_ns,
           CAST(sum(len_ns) FILTER (WHERE t AND NOT g AND NOT d AND NOT c) AS BIGINT) AS gating_excl_ns,
           CAST(sum(len_ns) FILTER (WHERE g::INT + d::INT + c::INT + t::INT >= 2) AS BIGINT) AS overlap_ns,
           CAST(sum(len_ns) FILTER (WHERE g OR d OR c OR t) AS BIGINT) AS busy_ns
    FROM running WHERE len_ns IS NOT NULL
    GROUP BY ALL
),
unions AS (
    SELECT source_id, step, layer, occurrence,
           CAST(sum(e_ns - s_ns) FILTER (WHERE cls = 'grouped_matmul') AS BIGINT) AS gmm_ns,
           CAST(sum(e_ns - s_ns) FILTER (WHERE cls = 'dispatch') AS BIGINT) AS dispatch_ns,
           CAST(sum(e_ns - s_ns) FILTER (WHERE cls = 'combine') AS BIGINT) AS combine_ns,
           CAST(sum(e_ns - s_ns) FILTER (WHERE cls = 'gating') AS BIGINT) AS gating_ns
    FROM merged GROUP BY ALL
),
class_time AS (SELECT * FROM unions FULL JOIN excl USING (source_id, step, layer, occurrence)),
parts AS (
    SELECT source_id, step, layer, occurrence,
           CAST(sum(dur_ns) FILTER (WHERE op_class = 'collective') AS BIGINT) AS collective_ns,
           min(ts_ns) FILTER (WHERE op_class = 'dispatch') AS dispatch_start_ns,
           max(end_ns) FILTER (WHERE op_class = 'dispatch') AS dispatch_end_ns,
           CAST(sum(tokens) FILTER (WHERE op_class = 'grouped_matmul') AS BIGINT) AS gmm_tokens
    FROM lops GROUP BY ALL
),
splits AS (
    SELECT l.source_id, l.step, l.layer, l.occurrence,
           arg_min(s.recv_tokens, s.ts_ns) AS recv_tokens
    FROM _a2a_splits s
    ASOF JOIN layers l ON s.source_id = l.source_id AND s.ts_ns >= l.start_ns
    JOIN parts p ON p.source_id = l.source_id AND p.step = l.step AND p.layer = l.layer
                AND p.occurrence = l.occurrence
    WHERE s.ts_ns < l.end_ns AND s.recv_tokens IS NOT NULL
      AND s.ts_ns >= coalesce(p.dispatch_start_ns, l.start_ns)
      AND s.ts_ns < coalesce(p.dispatch_end_ns, l.end_ns)
    GROUP BY ALL
)
SELECT l.run, l.rank, l.source_id, l.step, l.layer, l.occurrence, l.start_ns, l.end_ns,
       l.dur_ns AS layer_ns,
       coalesce(ct.gmm_ns, 0) AS gmm_ns, coalesce(ct.dispatch_ns, 0) AS dispatch_ns,
       coalesce(ct.combine_ns, 0) AS combine_ns, coalesce(ct.gating_ns, 0) AS gating_ns,
       coalesce(p.collective_ns, 0) AS collective_ns,
       coalesce(sp.recv_tokens, p.gmm_tokens) AS tokens,
       coalesce(ct.gmm_excl_ns, 0) AS gmm_excl_ns, coalesce(ct.dispatch_excl_ns, 0) AS dispatch_excl_ns,
       coalesce(ct.combine_excl_ns, 0) AS combine_excl_ns, coalesce(ct.gating_excl_ns, 0) AS gating_excl_ns,
       coalesce(ct.overlap_ns, 0) AS overlap_ns,
       greatest(l.dur_ns - coalesce(ct.busy_ns, 0), 0) AS other_ns
FROM layers l
LEFT JOIN parts p USING (source_id, step, layer, occurrence)
LEFT JOIN class_time ct USING (source_id, step, layer, occurrence)
LEFT JOIN splits sp USING (source_id, step, layer, occurrence);

-- Device operations (kernels, memcpy, memset) of the traces measured on the device timeline
-- (_ep_sources.device_moe), each with the host time it was launched at (the CUDA / HIP runtime
-- or driver call with the same correlation id; NULL when the trace has none).
CREATE OR REPLACE VIEW _device_activity AS
WITH src AS (SELECT source_id FROM _ep_sources WHERE device_moe),
dev AS (
    SELECT e.run, e.rank, e.source_id, e.pid, e.tid, e.ts_ns, e.end_ns,
           TRY_CAST(regexp_extract(e.args, '"correlation":\s*(\d+)', 1) AS BIGINT) AS correlation
    FROM events e
    WHERE e.source_id IN (SELECT source_id FROM src) AND e.ph = 'X' AND e.dur_ns IS NOT NULL
      AND e.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')
),
launches AS (
    SELECT e.source_id, TRY_CAST(regexp_extract(e.args, '"correlation":\s*(\d+)', 1) AS BIGINT) AS correlation,
           min(e.ts_ns) AS launch_ns
    FROM events e
    WHERE e.source_id IN (SELECT source_id FROM src) AND e.ph = 'X'
      AND e.cat IN ('cuda_runtime', 'cuda_driver') AND contains(e.args, 'correlation')
    GROUP BY ALL
)
SELECT d.*, l.launch_ns FROM dev d LEFT JOIN launches l USING (source_id, correlation);

-- How long the layer's stream sat idle waiting for its HOST, per layer instance: on the stream
-- that runs most of the layer's device time (the compute stream; a busy communication stream
-- beside it must not hide a starved compute stream), the gaps before a kernel launched only
-- after the previous kernel of that stream had ended: idle from that end (or the layer's start)
-- until the launch. A gap before a kernel launched in time is a dependency, not the host.
CREATE OR REPLACE VIEW _layer_host_wait AS
WITH k AS (
    SELECT a.*, lag(a.end_ns) OVER (PARTITION BY a.source_id, a.pid, a.tid ORDER BY a.ts_ns, a.end_ns) AS prev_end_ns
    FROM _device_activity a
),
placed AS (
    SELECT k.*, l.step, l.layer, l.occurrence, l.start_ns AS layer_start_ns
    FROM k ASOF JOIN moe_layers l ON k.source_id = l.source_id AND k.ts_ns >= l.start_ns
    WHERE k.ts_ns < l.end_ns
),
per_stream AS (
    SELECT run, rank, source_id, step, layer, occurrence, pid, tid,
           sum(end_ns - ts_ns) AS busy_ns,
           sum(CASE WHEN launch_ns > greatest(coalesce(prev_end_ns, layer_start_ns), layer_start_ns)
                    THEN least(launch_ns, ts_ns) - greatest(coalesce(prev_end_ns, layer_start_ns), layer_start_ns)
                    ELSE 0 END) AS host_wait_ns
    FROM placed GROUP BY ALL
)
SELECT run, rank, source_id, step, layer, occurrence,
       CAST(arg_max(host_wait_ns, busy_ns) AS BIGINT) AS host_wait_ns
FROM per_stream GROUP BY ALL;
