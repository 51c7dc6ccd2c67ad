-- name: why-op-diff
-- version: 5
-- description: Why is this card slow, operator by operator: each rank's operators vs the median rank's, in the same MoE layer instances and, outside them, in the same steps (attention, norms, a sampler): which take longer (excess time, share of the rank's excess), and whether their shapes are larger (more tokens) or the same (slower device).
-- requires: sources
-- param: top_n INTEGER = 5                -- operators shown per rank and scope (largest excess first)
-- param: min_share_pct DOUBLE = 1.0       -- operators below this % of the rank's excess are left out (noise)
-- param: same_shape_ratio DOUBLE = 1.1    -- input sizes within this ratio of the median rank's count as the same shapes
-- param: min_step_ratio DOUBLE = 1.1      -- operators compared per step (outside MoE layers, or without them) are shown from this ratio to the median rank's time
-- param: min_ranks INTEGER = 3            -- fewer ranks have no median rank to compare with: SKIP
-- verdict: none
-- role: report
-- subject: rank
-- order: 200
-- shows: why
-- headline: {name} ({op_class}) | {scope} | +{excess_us} us over {instances} {unit}s = {excess_share_pct} % of its excess | {ratio}x the median rank's ({shapes}; median of ranks {peers})
-- summary: rank {rank}: {name} ({op_class}) +{excess_us} us over {instances} {unit}s [{scope}] = {excess_share_pct}% of its excess ({ratio}x the median rank, {shapes}: {reading})
--
-- The question after a verdict names a card: what exactly on it takes longer? Within each MoE
-- layer instance that every rank has (moe_layers: "the same layer"), each rank's operators are
-- grouped by (taxonomy class, name) and their time compared with the median rank's time for the
-- same operator in the same instance (a rank without the operator counts 0). The operators are
-- the outermost ones inside the layer on each thread (a GroupedMatmul annotation, not also
-- the matmul inside it), so the excesses of one rank do not count the same time twice; on a
-- source measured on the device timeline (GPU kernels, operator CSVs), the device operations.
-- excess_us: instances x the median over the instances of (this rank's time - the median
-- rank's time), as ep-slow-rank's cost: the median, not the sum, so that one instance where the
-- OS descheduled the process does not make an excess (sum_excess_us is the plain sum). Only
-- operators with both excesses positive are shown (one above and one below: no clear excess).
-- Communication (collectives, dispatch, combine) is read as such: its time holds
-- the wait for the slowest rank. A rank's collectives are usually SHORTER on the slow card (the others wait for it
-- inside theirs), so they do not show here; see rank-waits for them.
-- Shapes: the input size of an operator is the element count of the first input of every
-- operation in its subtree (Kineto "Input Dims", with record_shapes) or of the operator CSV's
-- "Input Shapes"; shape_ratio = this rank's total / the median rank's total over the instances.
-- Above same_shape_ratio: 'more tokens' (more work: routing / load, not the device); below its
-- inverse, 'fewer tokens'; within it, 'same shapes' (the same work takes longer: a slower device
-- or process); no shapes recorded: 'shapes unknown'.
-- Outside the MoE layers (issue 42: a card slow in its attention, a norm, a sampler, with normal
-- MoE work): the rest of each step (ProfilerStep# / decode_step_ ranges) that every rank has is
-- compared the same way, scope 'outside MoE layers'. An operation belongs there when it
-- starts in the step and not inside a MoE layer instance. An operation that encloses a MoE layer
-- (the model, a decoder layer around attention + MoE) is a container, like the step itself: its
-- time minus the layer's would name the model, not what in it takes longer, and its children
-- outside the layer carry that time, so it is left out; one that runs into a layer (starts before
-- it, ends inside) counts up to the layer's start. So no time of a MoE layer is read twice, and
-- the outermost rule (per thread; the device operations on a device lane) holds in each scope.
-- Without MoE layers the units are the steps alone (scope 'whole step'; layer -1): a rank's host
-- operations in the step, or on a GPU trace its kernels. Device operations are placed in a step
-- by the launch call they came from (correlation id of the CUDA / HIP runtime call), as steps are
-- host ranges (kernels carry no shapes: 'shapes unknown').
-- Scopes share one ranking and one total. excess_share_pct: the operator's excess over the
-- rank's total excess of the operators that may be shown, in both scopes: the time inside MoE
-- layers and the rest of the step do not overlap (containers left out) and both excesses are
-- microseconds over the run against the same median rank, so they add up; one total lets a row
-- say that attention carries 85 % of what the rank spends more and GroupedMatmul 3 % (a total
-- per scope would give both 100 %). Rows are ordered by excess across scopes, so a rank's first
-- row (what diagnose's why-section shows first) is its largest excess wherever it is; top_n holds per scope, so
-- the MoE readings stay beside a large outside excess. min_step_ratio: a step holds every
-- operation of the model (hundreds on a real trace) and a few % of jitter leaves half of them
-- a little above the median rank; an operation compared per step is shown (and counted in the
-- total) only from this ratio, so a jittered run adds no rows and the MoE rows' shares stay what
-- they are without them. Inside MoE layers (a handful of operations, each a known MoE class) every
-- positive excess is shown, as before.
-- SKIP (one row with skip_reason) when fewer than min_ranks ranks have MoE layer instances (or steps).
-- Parallel groups (issue 30): when the run has EP groups (parallel_groups kind 'ep'), a rank's
-- operators are compared with the median rank of its own EP group (as ep-slow-rank does), over the
-- units every rank of the group has; `peer_group` and `peers` say whom (NULL peers: every rank).


WITH ep_groups AS (  -- a rank's EP group, when it is in exactly one
    SELECT rank, any_value(group_id) AS peer_group
    FROM (SELECT DISTINCT group_id, rank FROM parallel_groups WHERE run = $run AND kind = 'ep' AND group_size > 1)
    GROUP BY rank
    HAVING count(*) = 1
),
has_layers AS (SELECT EXISTS (SELECT 1 FROM moe_layers WHERE run = $run AND rank IS NOT NULL) AS yes),
-- The sources compared and their lane: the EP sources (device lane when their MoE work is on
-- the device); without MoE layers, every ranked trace with step marks (device lane when it has
-- kernels).
src AS MATERIALIZED (
    SELECT source_id, device_moe AS device FROM _ep_sources
    WHERE run = $run AND rank IS NOT NULL AND (SELECT yes FROM has_layers)
    UNION ALL
    SELECT s.source_id, EXISTS (SELECT 1 FROM events k WHERE k.run = $run AND k.source_id = s.source_id AND k.cat = 'kernel')
    FROM (SELECT DISTINCT source_id FROM _steps WHERE run = $run AND rank IS NOT NULL) s
    WHERE NOT (SELECT yes FROM has_layers)
),
-- The MoE layer instances of those sources (none without MoE layers).
moe_units AS MATERIALIZED (
    SELECT l.run, l.rank, l.source_id, l.step, l.layer, l.occurrence, l.start_ns, l.end_ns
    FROM moe_layers l JOIN src USING (source_id) WHERE l.run = $run AND (SELECT yes FROM has_layers)
),
-- Their steps (layer -1): the rest of the step outside the MoE layers, or the whole step.
step_units AS MATERIALIZED (
    SELECT st.run, st.rank, st.source_id, st.step, -1 AS layer, 0 AS occurrence, st.step_start_ns AS start_ns,
           st.step_end_ns AS end_ns
    FROM _steps st JOIN src USING (source_id) WHERE st.run = $run
),
-- The ranks compared are those with MoE layer instances (else with steps): a MoE run's steps
-- are read on the same ranks.
group_ranks AS (  -- the ranks compared with each other: an EP group, else every rank
    SELECT coalesce(g.peer_group, 'all ranks') AS peer_group, l.rank
    FROM (SELECT DISTINCT rank FROM moe_units UNION SELECT DISTINCT rank FROM step_units WHERE NOT (SELECT yes FROM has_layers)) l
    LEFT JOIN ep_groups g USING (rank)
),
n_ranks AS (SELECT count(DISTINCT rank) AS n, max(n_group) AS max_group
            FROM (SELECT rank, count(*) OVER (PARTITION BY peer_group) AS n_group FROM group_ranks)),
group_sizes AS (SELECT peer_group, count(*) AS n FROM group_ranks GROUP BY peer_group),
inst AS (  -- units every rank of the group has (groups of min_ranks or more)
    SELECT r.peer_group, l.step, l.layer, l.occurrence
    FROM (SELECT * FROM moe_units UNION ALL SELECT * FROM step_units) l
    JOIN group_ranks r USING (rank) JOIN group_sizes z USING (peer_group)
    GROUP BY r.peer_group, l.step, l.layer, l.occurrence, z.n
    HAVING count(DISTINCT l.rank) = z.n AND z.n >= $min_ranks
),
-- Steps are host ranges: a device operation belongs to the step its launch call ran in
-- (correlation id of the CUDA / HIP runtime call). MoE layers are on the lane already.
launches AS (
    SELECT e.source_id, TRY_CAST(regexp_extract(e.args, '"correlation":\s*(\d+)', 1) AS BIGINT) AS correlation,
           min(e.ts_ns) AS launch_ns
    FROM events e JOIN src USING (source_id)
    WHERE e.run = $run AND src.device AND e.ph = 'X'
      AND e.cat IN ('cuda_runtime', 'cuda_driver') AND contains(e.args, 'correlation')
      AND (SELECT n FROM n_ranks) >= $min_ranks
    GROUP BY ALL
),
-- Trace events of those sources, on the lane each is measured on, and operator CSV rows
-- (always the device). elems: the element count of the first input. place_ns: where the event
-- falls in the steps (its launch for a device operation).
evs AS MATERIALIZED (
    -- JSON pointer paths ('/key/0'), not dollar paths: `slowcard show` prints no dollar sign but parameters
    SELECT e.source_id, e.pid, e.tid, e.name, e.ts_ns, e.end_ns,
           list_aggregate(TRY_CAST(json_extract(e.args, '/Input Dims/0') AS BIGINT[]), 'product') AS elems,
           coalesce(l.launch_ns, e.ts_ns) AS place_ns, e.cat = 'gpu_user_annotation' AS device_annotation,
           coalesce(e.cat, '') NOT IN ('kernel', 'gpu_memcpy', 'gpu_memset') AS nests
    FROM events e JOIN src USING (source_id)
    LEFT JOIN launches l ON l.source_id = e.source_id
                        AND l.correlation = TRY_CAST(regexp_extract(e.args, '"correlation":\s*(\d+)', 1) AS BIGINT)
                        AND e.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')
    -- too few ranks: the answer is the skip row alone, so read no event (a single 216k-event
    -- trace took 1.8 s here to SKIP)
    WHERE e.run = $run AND e.ph = 'X' AND e.dur_ns IS NOT NULL AND (SELECT n FROM n_ranks) >= $min_ranks
      AND (e.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset', 'gpu_user_annotation')) = src.device
    UNION ALL
    SELECT o.source_id, CAST(o.device_id AS VARCHAR), o.stream_id, o.name, o.ts_ns, o.end_ns,
           list_aggregate(TRY_CAST(string_split(split_part(o.input_shapes, ';', 1), ',') AS BIGINT[]), 'product'),
           o.ts_ns, false, false
    FROM ops o JOIN src USING (source_id)
    WHERE o.run = $run AND o.ts_ns IS NOT NULL AND o.dur_ns IS NOT NULL AND (SELECT n FROM n_ranks) >= $min_ranks
),
-- Each event in its unit; events that enclose the whole unit (the layer annotation itself, the
-- step, the profiler span) are not operators of it. In a MoE layer instance: by its start.
in_layers AS (
    SELECT e.* EXCLUDE (place_ns, device_annotation), l.rank, l.step, l.layer, l.occurrence
    FROM evs e
    ASOF JOIN moe_units l ON e.source_id = l.source_id AND e.ts_ns >= l.start_ns
    WHERE e.ts_ns < l.end_ns AND NOT (e.ts_ns <= l.start_ns AND e.end_ns >= l.end_ns)
),
-- Outside them: not starting in a layer (prev), not enclosing the next one (a container), cut
-- at the next layer's start; a device annotation is a host range's copy, not an operator
-- (kernels are placed by their launch; an annotation has none). Then in its step by place_ns.
outside AS (
    SELECT e.source_id, e.pid, e.tid, e.name, e.ts_ns,
           CASE WHEN nxt.start_ns IS NOT NULL THEN least(e.end_ns, nxt.start_ns) ELSE e.end_ns END AS end_ns,
           e.elems, e.nests, e.place_ns
    FROM evs e
    ASOF LEFT JOIN moe_units prv ON e.source_id = prv.source_id AND e.ts_ns >= prv.start_ns
    ASOF LEFT JOIN moe_units nxt ON e.source_id = nxt.source_id AND e.ts_ns <= nxt.start_ns
    WHERE NOT e.device_annotation
      AND NOT coalesce(e.ts_ns < prv.end_ns, false)
      AND NOT coalesce(e.end_ns >= nxt.end_ns, false)
),
in_steps AS (
    SELECT e.* EXCLUDE (place_ns), l.rank, l.step, l.layer, l.occurrence
    FROM outside e
    ASOF JOIN step_units l ON e.source_id = l.source_id AND e.place_ns >= l.start_ns
    WHERE e.place_ns < l.end_ns AND NOT (e.ts_ns <= l.start_ns AND e.end_ns >= l.end_ns)
),
placed AS (SELECT * FROM in_layers UNION ALL SELECT * FROM in_steps),
-- Outermost operators per thread: nothing that started earlier on the thread is still running.
-- Only host ranges and device annotations hold other events: kernels, copies and operator CSV
-- rows run one after another on their stream, and one that starts a nanosecond before the
-- previous one ends (timestamps in us, rounded) is the next operator, not its child (on the GPU runs
-- of tests/real_gpu_ep.py, a real vLLM step's kernels, a GEMM kernel was lost that way in one
-- step on three ranks of four: 1.97x the median rank on the fourth, with no effect on it).
-- The units of one scope do not overlap on a thread, so the thread and the scope are the
-- partition (an operation that overruns its MoE layer does not swallow the step's operations
-- after it). Every event then belongs to the outermost operator before it (op_no: a running
-- count of them), so one sort gives both the operators and their subtrees; elems: the input size of the subtree.
flagged AS (
    SELECT *, coalesce(max(CASE WHEN nests THEN end_ns END) OVER w, ts_ns) <= ts_ns AS is_outer
    FROM placed
    WINDOW w AS (PARTITION BY source_id, pid, tid, layer = -1 ORDER BY ts_ns, end_ns DESC
                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
),
numbered AS (
    SELECT *, sum(is_outer::INTEGER) OVER (PARTITION BY source_id, pid, tid, layer = -1 ORDER BY ts_ns, end_ns DESC
                                           ROWS UNBOUNDED PRECEDING) AS op_no
    FROM flagged
),
outer_ops AS (
    SELECT source_id, any_value(rank) FILTER (WHERE is_outer) AS rank,
           any_value(step) FILTER (WHERE is_outer) AS step, any_value(layer) FILTER (WHERE is_outer) AS layer,
           any_value(occurrence) FILTER (WHERE is_outer) AS occurrence, any_value(name) FILTER (WHERE is_outer) AS name,
           any_value(end_ns - ts_ns) FILTER (WHERE is_outer) AS dur_ns, sum(elems) AS elems
    FROM numbered GROUP BY source_id, pid, tid, layer = -1, op_no
),
classed AS (
    SELECT r.peer_group, o.rank, o.step, o.layer, o.occurrence, o.name, coalesce(c.op_class, 'other') AS op_class,
           o.dur_ns, o.elems
    FROM outer_ops o JOIN group_ranks r USING (rank)
    LEFT JOIN (SELECT DISTINCT source_id, name, op_class FROM op_classes WHERE run = $run) c
           ON c.source_id = o.source_id AND c.name = o.name
    SEMI JOIN inst USING (peer_group, step, layer, occurrence)
),
per AS (  -- per (rank, instance, operator)
    SELECT peer_group, rank, step, layer, occurrence, op_class, name, count(*) AS calls, sum(dur_ns) AS dur_ns,
           sum(elems) AS elems, count(elems) > 0 AS shaped
    FROM classed GROUP BY ALL
),
-- Every rank of the group x every operator seen in the instance: a rank without it counts 0.
grid AS (
    SELECT k.peer_group, r.rank, k.step, k.layer, k.occurrence, k.op_class, k.name,
           coalesce(p.calls, 0) AS calls, coalesce(p.dur_ns, 0) AS dur_ns, coalesce(p.elems, 0) AS elems,
           coalesce(p.shaped, false) AS shaped
    FROM (SELECT DISTINCT peer_group, step, layer, occurrence, op_class, name FROM per) k
    JOIN group_ranks r USING (peer_group)
    LEFT JOIN per p USING (peer_group, rank, step, layer, occurrence, op_class, name)
),
med AS (
    SELECT peer_group, step, layer, occurrence, op_class, name, median(dur_ns) AS med_dur_ns, median(elems) AS med_elems,
           bool_or(shaped) AS any_shaped
    FROM grid GROUP BY ALL
),
per_op AS (  -- per (rank, scope, operator): an operation inside MoE layers and outside them is two rows
    SELECT g.peer_group, g.rank, g.layer = -1 AS in_step, g.op_class, g.name, count(*) AS instances, sum(g.calls) AS calls,
           sum(g.dur_ns) AS dur_ns, sum(m.med_dur_ns) AS med_dur_ns,
           count(*) * median(g.dur_ns - m.med_dur_ns) AS excess_ns, sum(g.dur_ns - m.med_dur_ns) AS sum_excess_ns,
           count(*) FILTER (WHERE g.dur_ns > m.med_dur_ns) AS n_above,
           sum(g.elems) AS elems, sum(m.med_elems) AS med_elems, bool_or(m.any_shaped) AS shaped
    FROM grid g JOIN med m USING (peer_group, step, layer, occurrence, op_class, name)
    GROUP BY ALL
),
-- The operators that may be shown: a clear excess, and per step from min_step_ratio (see above);
-- the rank's total excess over both scopes, top_n per scope.
ranked AS (
    SELECT *, sum(excess_ns) OVER (PARTITION BY rank) AS rank_excess_ns,
           row_number() OVER (PARTITION BY rank, in_step ORDER BY excess_ns DESC, name) AS pos
    FROM per_op
    WHERE excess_ns > 0 AND sum_excess_ns > 0 AND (NOT in_step OR dur_ns >= $min_step_ratio * med_dur_ns)
),
rows AS (
    SELECT peer_group, rank, in_step, op_class, name, instances, round(calls / instances, 2) AS calls_per_instance,
           round(dur_ns / instances / 1e3, 1) AS us_per_instance,
           round(med_dur_ns / instances / 1e3, 1) AS median_rank_us_per_instance,
           round(dur_ns / greatest(med_dur_ns, 1), 2) AS ratio,
           round(excess_ns / 1e3, 1) AS excess_us, round(sum_excess_ns / 1e3, 1) AS sum_excess_us,
           round(100.0 * excess_ns / greatest(rank_excess_ns, 1), 1) AS excess_share_pct,
           round(100.0 * n_above / instances, 1) AS above_pct,
           CASE WHEN shaped AND med_elems > 0 THEN round(elems / med_elems, 2) END AS shape_ratio,
           CASE WHEN NOT shaped THEN 'shapes unknown'
                WHEN elems > $same_shape_ratio * med_elems THEN 'more tokens'
                WHEN elems * $same_shape_ratio < med_elems THEN 'fewer tokens'
                ELSE 'same shapes' END AS shapes,
           pos
    FROM ranked
    WHERE pos <= $top_n AND 100.0 * excess_ns / greatest(rank_excess_ns, 1) >= $min_share_pct
),
enough AS (
    SELECT CASE WHEN (SELECT n FROM n_ranks) < $min_ranks
                THEN format('{} rank(s) with MoE layers (or, without MoE layers, step marks) in this run; comparing a rank with the median rank needs >= {}',
                            (SELECT n FROM n_ranks), $min_ranks)
                WHEN (SELECT count(*) FROM group_ranks WHERE peer_group <> 'all ranks') > 0
                     AND (SELECT max_group FROM n_ranks) < $min_ranks
                THEN format('EP groups of at most {} rank(s) with MoE layers in this run; comparing a rank with the median rank of its EP group needs >= {}',
                            (SELECT max_group FROM n_ranks), $min_ranks)
                WHEN (SELECT count(*) FROM inst) = 0
                THEN 'no MoE layer instance (or step) that every rank has: steps or layers do not match across ranks'
           END AS skip_reason
)
SELECT rank,
       CASE WHEN NOT in_step THEN 'MoE layers' WHEN (SELECT yes FROM has_layers) THEN 'outside MoE layers' ELSE 'whole step' END AS scope,
       op_class, name, instances,
       CASE WHEN in_step THEN 'step' ELSE 'MoE layer instance' END AS unit, calls_per_instance, us_per_instance, median_rank_us_per_instance,
       ratio, excess_us, sum_excess_us, excess_share_pct, above_pct, shape_ratio, shapes,
       CASE WHEN op_class IN ('collective', 'dispatch', 'combine')
                THEN 'communication: its time includes waiting for the slowest rank (rank-waits), so a longer one is not by itself a slow card'
           WHEN shapes = 'more tokens' THEN 'more work than the median rank: its inputs are larger (routing / load, see ep-slow-rank token-skew)'
           WHEN shapes = 'same shapes' THEN 'the same work takes longer: a slower device or process on this card'
           WHEN shapes = 'fewer tokens' THEN 'less work yet longer: a slower device or process on this card'
           ELSE 'no input shapes recorded (profile with record_shapes=True to tell more work from a slower device)'
       END AS reading,
       peer_group,
       CASE WHEN peer_group <> 'all ranks'
            THEN (SELECT _rank_ranges(list(rank ORDER BY rank)) FROM group_ranks x WHERE x.peer_group = rows.peer_group) END AS peers,
       NULL::VARCHAR AS skip_reason
FROM rows, enough
WHERE enough.skip_reason IS NULL
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, skip_reason
FROM enough WHERE skip_reason IS NOT NULL
ORDER BY rank NULLS FIRST, excess_us DESC, name
