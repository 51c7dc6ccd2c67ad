-- name: why-straggler
-- version: 4
-- description: Why is the straggler late: each rank's own time between two collectives (its segment) against its peers' in the same collectives, split by module, annotation, op / kernel (Ascend: the operator CSV's op types), host gaps and device gaps (the device's and each stream's); names the item that carries the rank's lateness (its ratio to the peers' median and its share) and what a fix saves.
-- requires: collective_waits
-- param: top_n INTEGER = 3                -- items shown per late rank (the named one first)
-- param: min_late_pct DOUBLE = 5.0        -- a rank is late when its segments exceed its peers' medians by at least this % of them in all
-- param: min_late_share DOUBLE = 0.5      -- ... and its segment is above its peers' median in at least this share of its collectives
-- param: min_cause_pct DOUBLE = 80.0      -- name an item as the cause only when it carries at least this % of the lateness (TraceML's rule)
-- param: min_ratio DOUBLE = 1.1           -- ... and takes at least this many times its peers' median time (a gap: any, when the peers have none)
-- param: near_pct DOUBLE = 90.0           -- items within this % of the largest excess compete on their ratio (the most specific one is named)
-- param: min_last_share DOUBLE = 0.5      -- ... and it arrived last at at least this share of its collectives (straggler-rank's bar, without its 5 % skew floor)
-- verdict: none
-- role: report
-- subject: rank
-- order: 205
-- shows: why
-- headline: {item} ({item_kind}) {ratio}x the peers' median, {share_pct} % of rank {rank}'s lateness | cause: {cause} (top items: {coverage}) | late by {lateness_ms} ms over {segments} segments (above the peers' median in {late_pct} %) | a fix saves {cost_ms} ms (its lead at the {last_collectives} collectives it arrived last at)
-- summary: rank {rank} is late by {lateness_ms} ms over {segments} segments: {item} ({item_kind}) {ratio}x the peers' median = {share_pct}% of its lateness; cause {cause} (top items: {coverage}); a fix saves {cost_ms} ms; check: {reading} ({items_from})
--
-- A rank the others wait for at collectives (straggler-rank) is late because of something it
-- does between collectives, in its MoE layers or not (attention, a host sleep, a tokenizer, a
-- data loader). For each matched collective a rank arrives at (collective_waits), its SEGMENT is
-- the time from the end of its previous collective of the same process group (any call, matched
-- or not) to its arrival, on the lane its collectives are measured on (the device's when it has
-- collective kernels, else the host's). Ranks leave a collective together, so a segment longer
-- than its peers' is the lateness at the next one. The rank's lateness: the sum over its
-- collectives of (its segment - the median of the OTHER ranks' segments of the same collective
-- instance); a rank is reported when that is >= min_late_pct % of the peers' medians, its
-- segment is above the peers' median in >= min_late_share of its collectives (one descheduled
-- segment is not a straggler) and it arrived last at >= min_last_share of them (the ranks the
-- straggler card can name; a rank often late but rarely last is not what the others wait for).
-- What ran in a segment, clipped to it, as items: 'module' (nn.Module: X_N ranges, X without the
-- _N suffix), 'call' (the host call that issues a collective: c10d::*, record_param_comms; on a
-- gloo trace its time before the collective starts on the communication thread is the queue of
-- the process group's thread), 'annotation' (record_function / user annotations, a trailing _N / #N removed),
-- 'python' (python frames), 'op' (CPU ops, runtime calls; on an Ascend rank the operator CSV
-- rows, kernel_details / op_summary, by op type: MatMulV2, not aclnnMatmul_MatMulCommon_MatMulV2),
-- 'kernel' (device kernels, memcpy, memset), and 'gap': segment time with no event on the lane
-- (host: no op on any thread of the process, a sleep or a lock; device: no kernel on any stream)
-- and, on a device lane, 'stream N idle': time with no kernel on that stream (its kernels,
-- copies, operator rows; a stream no kernel of the rank ran on idles all along), so a compute
-- stream starved by a late launch while the communication stream is busy (the device is not
-- idle) is told apart from a device that idles. A collective of another group or kind in the
-- segment keeps its lane / stream busy (no gap) but is not an item; step ranges and ranges
-- enclosing the whole segment are not items. An item's excess: the sum over the rank's
-- collectives of (its time in the segment - the median of the other ranks' time for it in theirs;
-- a rank without it counts 0); share_pct: excess / lateness; ratio: its time / the peers' median
-- time over the same segments. Items nest (a module holds its ops, the device gap is inside each
-- stream's), so shares overlap and can pass 100 % (the rank may gain time elsewhere).
-- Items are read over the segments of the collectives (process group, kind) the rank is late at
-- (>= min_late_pct % of its peers' medians there; all of them when none is alone), and share_pct
-- is of that lateness: segments of different groups overlap (an all-gather overlapped with compute
-- and the all-reduce after it), and in a group it is not late at, work it does later lands in the
-- next segment while its wait in the other group's collective shrinks: shifts, not excess.
-- The named item: of the items whose excess is within near_pct % of the largest, the one with the
-- highest ratio (the most specific: SelfAttention, not the model's top module around it; a stream
-- idle exactly when the whole device is: the device's gap); `cause`
-- is its name only when it carries >= min_cause_pct % of the lateness at >= min_ratio, else
-- 'straggler' with the coverage of the top items (TraceML's rule). Rows: the named item first,
-- then the next items by excess (pos).
-- cost_ms: what a fix saves: the sum, over the collectives where the rank arrived last, of its
-- lead over the next-latest rank (the others would have started that much earlier; each of them
-- waited it: others_wait_ms = the same x (ranks - 1)), the replay idea of ep-slow-rank.
-- An Ascend rank reads its device lane from what it has: its operator CSV rows (their HCCL rows
-- are its collectives; ops by op type, a stream per Stream ID) or its timeline (trace_view.json:
-- its hcom_* ops on the HCCL / Communication process are its collectives, on the device clock,
-- and its Ascend Hardware tasks the 'kernel' items, a stream per thread; its host processes and
-- Overlap Analysis' summary ranges are not read). `items_from` says which.

WITH calls AS MATERIALIZED (  -- every collective call, to find each one's predecessor on its rank
    SELECT source_id, pg, coll_kind, instance, ts_ns, end_ns,
           lag(end_ns) OVER (PARTITION BY source_id, pg ORDER BY ts_ns, end_ns) AS prev_end_ns
    FROM _collectives WHERE run = $run
),
-- An Ascend timeline (trace_view.json) names its processes: device tasks on 'Ascend Hardware' (a
-- thread per stream), the hcom_* collectives on 'HCCL' / 'Communication', a summary of both on
-- 'Overlap Analysis'; the host's on 'Python' / 'CANN'.
ascend_procs AS (
    SELECT DISTINCT source_id, pid, json_extract_string(args, '/name') AS proc FROM events
    WHERE run = $run AND ph = 'M' AND name = 'process_name'
      AND json_extract_string(args, '/name') IN ('Ascend Hardware', 'HCCL', 'Communication', 'Overlap Analysis')
),
-- The lane a source's collectives are measured on (as _collectives picks it). An Ascend timeline's
-- collectives have no kernel category (host lane there) but device times: its lane is the device's
-- (timeline), read from its Ascend Hardware tasks.
lanes AS (
    SELECT l.source_id, l.device OR a.source_id IS NOT NULL AS device, NOT l.device AND a.source_id IS NOT NULL AS timeline
    FROM (SELECT source_id, bool_or(on_device) AS device FROM op_classes
          WHERE run = $run AND (op_class = 'collective' OR (op_class IN ('dispatch', 'combine') AND coll_kind IS NOT NULL AND on_device))
          GROUP BY source_id) l
    LEFT JOIN (SELECT DISTINCT source_id FROM ascend_procs WHERE proc = 'Ascend Hardware') a USING (source_id)
),
cw AS MATERIALIZED (
    SELECT w.pg, w.coll_kind, w.instance, w.rank, w.source_id, w.n_ranks, w.arrived_last,
           w.start_adj_ns, c.prev_end_ns AS seg_start_ns, w.ts_ns AS seg_end_ns,
           greatest(w.ts_ns - c.prev_end_ns, 0) AS seg_ns,
           -- the last arriver's lead over the next-latest rank
           CASE WHEN w.arrived_last
                THEN w.start_adj_ns - max(w.start_adj_ns) FILTER (WHERE NOT w.arrived_last)
                                          OVER (PARTITION BY w.pg, w.coll_kind, w.instance) END AS lead_ns
    FROM collective_waits w
    JOIN calls c USING (source_id, pg, coll_kind, instance)
    WHERE w.run = $run
),
cost AS (
    SELECT rank, count(*) FILTER (WHERE arrived_last) AS last_collectives,
           coalesce(sum(greatest(lead_ns, 0)), 0) AS cost_ns,
           coalesce(sum(greatest(lead_ns, 0) * (n_ranks - 1)), 0) AS others_wait_ns
    FROM cw GROUP BY rank
),
-- Segments of the instances every rank of the collective has one for (its first call has none).
segs AS MATERIALIZED (
    SELECT * FROM cw
    WHERE seg_start_ns IS NOT NULL
    QUALIFY count(*) OVER (PARTITION BY pg, coll_kind, instance) = n_ranks
),
peer_seg AS (  -- the median of the OTHER ranks' segments of the instance: a window that leaves the
              -- rank's own row out (a self-join of every rank with every other grew with ranks
              -- squared: 4 GB and 36 s at 512 ranks)
    SELECT * FROM (
        SELECT pg, coll_kind, instance, rank, seg_ns,
               median(seg_ns) OVER (PARTITION BY pg, coll_kind, instance ORDER BY rank
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING EXCLUDE CURRENT ROW) AS peer_seg_ns
        FROM segs)
    WHERE peer_seg_ns IS NOT NULL
),
per_rank AS (
    SELECT rank, count(*) AS segments, sum(seg_ns - peer_seg_ns) AS lateness_ns, sum(peer_seg_ns) AS peer_total_ns,
           count(*) FILTER (WHERE seg_ns > peer_seg_ns) / count(*) AS late_share
    FROM peer_seg GROUP BY rank
),
last_share AS (SELECT rank, count(*) FILTER (WHERE arrived_last) / count(*) AS last_share FROM cw GROUP BY rank),
late_ranks0 AS (
    SELECT p.* FROM per_rank p JOIN last_share l USING (rank)
    WHERE p.lateness_ns > 0 AND 100.0 * p.lateness_ns >= $min_late_pct * p.peer_total_ns AND p.late_share >= $min_late_share
      AND l.last_share >= $min_last_share
),
-- The collectives (process group, kind) a late rank is late at: its segments there exceed its
-- peers' medians by min_late_pct % of them (all of its groups when none does alone). Segments of
-- different groups overlap (an all-gather overlapped with compute, the all-reduce that follows):
-- in a group it is not late at, what it does later lands in the next segment while its wait in
-- the other group's collective shrinks, and those shifts would read as excess.
group_late AS (
    SELECT *, lateness_ns > 0 AND 100.0 * lateness_ns >= $min_late_pct * peer_total_ns AS is_late
    FROM (SELECT rank, pg, coll_kind, sum(seg_ns - peer_seg_ns) AS lateness_ns, sum(peer_seg_ns) AS peer_total_ns
          FROM peer_seg WHERE rank IN (SELECT rank FROM late_ranks0) GROUP BY ALL)
),
late_groups AS (
    SELECT rank, pg, coll_kind, lateness_ns FROM group_late
    QUALIFY is_late OR NOT bool_or(is_late) OVER (PARTITION BY rank)
),
-- the lateness the items are measured against: that of the late groups' segments
late_ranks AS (
    SELECT r.*, g.item_lateness_ns
    FROM late_ranks0 r JOIN (SELECT rank, sum(lateness_ns) AS item_lateness_ns FROM late_groups GROUP BY rank) g USING (rank)
),
-- The events of each source on its collectives' lane, without step ranges. Collectives (of other
-- groups or kinds: a segment ends where its own collective starts) are time the lane is busy,
-- not items (busy_only). An Ascend rank's operator CSV rows (kernel_details / op_summary) are its
-- device lane: their ops are 'op' items named by op type, their stream is the Stream ID.
classes AS (
    SELECT source_id, name,
           bool_or(op_class = 'collective' OR (op_class IN ('dispatch', 'combine') AND coll_kind IS NOT NULL AND on_device)) AS coll,
           bool_or(op_class = 'step') AS step
    FROM op_classes WHERE run = $run GROUP BY ALL
),
evs AS MATERIALIZED (
    SELECT e.source_id, CASE WHEN l.timeline THEN 'timeline' ELSE 'trace' END AS origin, e.tid AS stream, e.ts_ns, e.end_ns,
           coalesce(c.coll, FALSE) OR coalesce(p.proc IN ('HCCL', 'Communication'), FALSE) AS busy_only,
           coalesce(e.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset') OR p.proc = 'Ascend Hardware', FALSE) AS on_stream,
           CASE WHEN p.proc = 'Ascend Hardware' THEN 'kernel'
                WHEN starts_with(e.name, 'nn.Module: ') THEN 'module'
                WHEN regexp_matches(e.name, '^(_?c10d(_functional)?::|record_param_comms)') THEN 'call'
                WHEN e.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset') THEN 'kernel'
                WHEN e.cat IN ('user_annotation', 'gpu_user_annotation') THEN 'annotation'
                WHEN e.cat = 'python_function' THEN 'python'
                ELSE 'op' END AS item_kind,
           -- (\z, not a dollar sign: `slowcard show` turns parameters into the duckdb shell's variables)
           CASE WHEN starts_with(e.name, 'nn.Module: ') THEN regexp_replace(e.name[12:], '_\d+\z', '')
                WHEN e.cat IN ('user_annotation', 'gpu_user_annotation') THEN regexp_replace(e.name, '[_#]\d+\z', '')
                ELSE e.name END AS item
    FROM events e JOIN lanes l USING (source_id)
    LEFT JOIN classes c ON c.source_id = e.source_id AND c.name = e.name
    LEFT JOIN ascend_procs p ON p.source_id = e.source_id AND p.pid = e.pid
    WHERE e.run = $run AND e.ph = 'X' AND e.dur_ns IS NOT NULL AND e.dur_ns > 0
      AND e.source_id IN (SELECT source_id FROM segs)
      AND CASE WHEN l.timeline THEN coalesce(p.proc IN ('Ascend Hardware', 'HCCL', 'Communication'), FALSE)
               ELSE coalesce(e.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset', 'gpu_user_annotation'), FALSE) = l.device
                    AND coalesce(p.proc, '') <> 'Overlap Analysis' END
      AND NOT coalesce(c.step, FALSE)
    UNION ALL
    SELECT o.source_id, 'ops', o.stream_id, o.ts_ns, o.end_ns, coalesce(c.coll, FALSE), o.stream_id IS NOT NULL,
           'op', coalesce(nullif(o.op_type, ''), o.name)
    FROM ops o JOIN lanes l USING (source_id)
    LEFT JOIN classes c ON c.source_id = o.source_id AND c.name = o.name
    WHERE o.run = $run AND l.device AND o.dur_ns > 0 AND o.ts_ns IS NOT NULL
      AND o.source_id IN (SELECT source_id FROM segs)
      AND NOT coalesce(c.step, FALSE)
),
-- The instances of the late ranks' late groups: every rank of them is read (its peers' medians).
inst_late AS (
    SELECT DISTINCT s.pg, s.coll_kind, s.instance FROM segs s
    JOIN late_groups g ON g.rank = s.rank AND g.pg = s.pg AND g.coll_kind = s.coll_kind
),
-- Each event clipped to the segments it overlaps (ranges enclosing a whole segment left out,
-- as items; a collective that spans it keeps the lane busy).
clipped AS MATERIALIZED (
    SELECT s.pg, s.coll_kind, s.instance, s.rank, e.item_kind, e.item, e.stream, e.busy_only, e.on_stream,
           greatest(e.ts_ns, s.seg_start_ns) AS c_start_ns, least(e.end_ns, s.seg_end_ns) AS c_end_ns
    FROM segs s SEMI JOIN inst_late USING (pg, coll_kind, instance)
    JOIN evs e ON e.source_id = s.source_id AND e.ts_ns < s.seg_end_ns AND e.end_ns > s.seg_start_ns
    WHERE e.busy_only OR NOT (e.ts_ns <= s.seg_start_ns AND e.end_ns >= s.seg_end_ns)
),
-- Time covered (islands of the clipped intervals) on the whole lane (lane_key '') and, on a device
-- lane, on each stream (its kernels, copies, ops and collectives): the rest of a segment is a gap.
cov_rows AS (
    SELECT pg, coll_kind, instance, rank, '' AS lane_key, c_start_ns, c_end_ns FROM clipped
    UNION ALL
    SELECT pg, coll_kind, instance, rank, stream, c_start_ns, c_end_ns FROM clipped WHERE on_stream AND stream IS NOT NULL
),
covered AS (
    SELECT pg, coll_kind, instance, rank, lane_key, sum(i_end - i_start) AS covered_ns
    FROM (SELECT pg, coll_kind, instance, rank, lane_key, island, min(c_start_ns) AS i_start, max(c_end_ns) AS i_end
          FROM (SELECT *, sum(CASE WHEN prev_end IS NULL OR c_start_ns > prev_end THEN 1 ELSE 0 END)
                              OVER (PARTITION BY pg, coll_kind, instance, rank, lane_key ORDER BY c_start_ns, c_end_ns DESC
                                    ROWS UNBOUNDED PRECEDING) AS island
                FROM (SELECT *, max(c_end_ns) OVER (PARTITION BY pg, coll_kind, instance, rank, lane_key ORDER BY c_start_ns, c_end_ns DESC
                                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
                      FROM cov_rows))
          GROUP BY ALL)
    GROUP BY ALL
),
-- The streams of the device lanes (any kernel, copy, op or collective on them, on any rank): each
-- has a gap item of its own on every device lane (a rank without that stream: idle all along), so
-- a compute stream starved while the communication stream is busy (the device as a whole is not
-- idle) is told apart from a device that idles.
streams AS (
    SELECT l.source_id, st.stream
    FROM (SELECT DISTINCT stream FROM evs WHERE on_stream AND stream IS NOT NULL) st
    CROSS JOIN (SELECT source_id FROM lanes WHERE device AND source_id IN (SELECT source_id FROM segs)) l
),
items AS (  -- per (instance, rank, item): its time in the segment; gaps: the segment not covered
    SELECT pg, coll_kind, instance, rank, item_kind, item, sum(c_end_ns - c_start_ns) AS t_ns
    FROM clipped WHERE NOT busy_only GROUP BY ALL
    UNION ALL
    SELECT s.pg, s.coll_kind, s.instance, s.rank, 'gap',
           CASE WHEN l.device THEN 'device idle (no kernel on any stream)' ELSE 'host gaps (no op on the thread)' END,
           s.seg_ns - coalesce(v.covered_ns, 0)
    FROM segs s SEMI JOIN inst_late USING (pg, coll_kind, instance)
    JOIN lanes l USING (source_id)
    LEFT JOIN covered v ON v.pg = s.pg AND v.coll_kind = s.coll_kind AND v.instance = s.instance AND v.rank = s.rank AND v.lane_key = ''
    UNION ALL
    SELECT s.pg, s.coll_kind, s.instance, s.rank, 'gap', 'stream ' || st.stream || ' idle', s.seg_ns - coalesce(v.covered_ns, 0)
    FROM segs s SEMI JOIN inst_late USING (pg, coll_kind, instance)
    JOIN streams st USING (source_id)
    LEFT JOIN covered v ON v.pg = s.pg AND v.coll_kind = s.coll_kind AND v.instance = s.instance AND v.rank = s.rank
                       AND v.lane_key = st.stream
),
grid AS (  -- every rank of the instance x every item seen in it (a rank without it: 0)
    SELECT k.pg, k.coll_kind, k.instance, s.rank, k.item_kind, k.item, coalesce(i.t_ns, 0) AS t_ns
    FROM (SELECT DISTINCT pg, coll_kind, instance, item_kind, item FROM items) k
    JOIN segs s USING (pg, coll_kind, instance)
    LEFT JOIN items i USING (pg, coll_kind, instance, rank, item_kind, item)
),
peer_item AS (  -- the others' median time for the item, as peer_seg (the rank's own row left out)
    SELECT a.* FROM (
        SELECT pg, coll_kind, instance, rank, item_kind, item, t_ns,
               median(t_ns) OVER (PARTITION BY pg, coll_kind, instance, item_kind, item ORDER BY rank
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING EXCLUDE CURRENT ROW) AS peer_t_ns
        FROM grid) a
    SEMI JOIN late_groups g ON g.rank = a.rank AND g.pg = a.pg AND g.coll_kind = a.coll_kind
    WHERE a.peer_t_ns IS NOT NULL
),
per_item AS (
    SELECT rank, item_kind, item, count(*) AS instances, sum(t_ns) AS t_ns, sum(peer_t_ns) AS peer_t_ns,
           sum(t_ns - peer_t_ns) AS excess_ns
    FROM peer_item GROUP BY ALL
    HAVING sum(t_ns - peer_t_ns) > 0
),
scored AS (
    SELECT p.*, r.lateness_ns, r.segments, r.late_share,
           t_ns / nullif(peer_t_ns, 0) AS ratio_x,
           100.0 * excess_ns / r.item_lateness_ns AS share,
           excess_ns >= $near_pct / 100.0 * max(excess_ns) OVER (PARTITION BY rank) AS near_top
    FROM per_item p JOIN late_ranks r USING (rank)
),
ordered AS (
    SELECT *,
           row_number() OVER (PARTITION BY rank
                              ORDER BY near_top DESC,
                                       CASE WHEN near_top THEN coalesce(ratio_x, 1e9) END DESC NULLS LAST,
                                       CASE WHEN near_top THEN list_position(['module', 'annotation', 'python', 'op', 'kernel', 'call', 'gap'], item_kind) END,
                                       -- a stream idle exactly when the whole device is: the device's gap says more
                                       CASE WHEN near_top THEN starts_with(item, 'stream ') END,
                                       excess_ns DESC, item) AS pos
    FROM scored
),
top AS (
    SELECT rank,
           string_agg(format('{} {} %', item, round(share, 0)::INTEGER), ', ' ORDER BY pos) FILTER (WHERE pos <= 3) AS coverage,
           any_value(CASE WHEN share >= $min_cause_pct AND (ratio_x IS NULL OR ratio_x >= $min_ratio) THEN item END)
               FILTER (WHERE pos = 1) AS named
    FROM ordered GROUP BY rank
),
device_ranks AS (SELECT DISTINCT s.rank FROM segs s JOIN lanes l USING (source_id) WHERE l.device),  -- (operator CSV ops are device ops)
rows AS (
    SELECT o.rank, o.pos, o.item_kind, o.item, o.instances,
           round(o.ratio_x, 2) AS ratio,
           round(o.share, 1) AS share_pct,
           round(o.excess_ns / 1e3, 1) AS excess_us,
           round(o.t_ns / 1e3, 1) AS own_us,
           round(o.peer_t_ns / 1e3, 1) AS peers_median_us,
           round(o.lateness_ns / 1e6, 3) AS lateness_ms,
           o.segments,
           round(100.0 * o.late_share, 1) AS late_pct,
           coalesce(t.named, 'straggler') AS cause,
           t.coverage,
           c.last_collectives,
           round(c.cost_ns / 1e6, 3) AS cost_ms,
           round(c.others_wait_ns / 1e6, 3) AS others_wait_ms,
           CASE WHEN o.item_kind = 'gap' AND o.item LIKE 'host%'
                    THEN 'the host runs nothing here: a sleep, a lock, a slow data loader or a co-located job taking its CPU (CPU binding, other processes on the host)'
                WHEN o.item_kind = 'call'
                    THEN 'the rank called the collective in time, but its communication thread / stream started it later than its peers'' did: the process group''s queue (a previous collective still running there, a descheduled or CPU-starved communication thread: CPU binding, a co-located job)'
                WHEN o.item_kind = 'gap' AND o.item LIKE 'stream %'
                    THEN 'this stream idles here while the device runs other streams: its host launched its kernels late (host / launch: see why-host-device), or it waits for another stream (an event, a copy, a collective)'
                WHEN o.item_kind = 'gap'
                    THEN 'the device idles here: it waits for its host to launch work (host / launch: see why-host-device)'
                WHEN regexp_matches(o.item, 'attn|attention|sdpa|flash', 'i')
                    THEN 'attention takes longer on this rank: its attention kernels (sequence lengths / KV cache of its batch, a slower device)'
                WHEN regexp_matches(o.item, 'dataloader|data_loader|__next__|collate|sampler|tokeni[sz]', 'i')
                    THEN 'data loading / input preparation on the host: workers, the sampler, the tokenizer'
                WHEN regexp_matches(o.item, 'cuda(Launch|StreamSynchronize|DeviceSynchronize|EventSynchronize|Memcpy)|aclrt|synchron', 'i')
                    THEN 'host / launch: the host waits for or launches device work (see why-host-device)'
                WHEN o.item_kind = 'kernel'
                    THEN 'the same kernels run longer on this device: a slower or throttled device, or a co-located job on it'
                WHEN o.item_kind = 'op' AND o.rank IN (SELECT rank FROM device_ranks)
                    THEN 'the same ops run longer on this device: a slower or throttled device, a co-located job on it, or other shapes (why-op-diff compares its ops)'
                ELSE 'this code takes longer on this rank than on its peers: its ops (why-op-diff), the host (a co-located job, CPU binding) or its inputs'
           END AS reading
    FROM ordered o
    JOIN top t USING (rank)
    LEFT JOIN cost c USING (rank)
    WHERE o.pos <= $top_n
),
-- What the items could be read from (issue 42 item 4): a trace without nn.Module ranges (no
-- with_modules / with_stack in torch.profiler, an Ascend trace) falls back to annotations, ops and
-- gaps, and says so: a named op may then sit inside a module the trace does not show.
basis AS (
    SELECT CASE WHEN list_contains(kinds, 'module') THEN 'items: ' || array_to_string(kinds, ', ')
                ELSE 'no nn.Module ranges in this trace: items are ' || array_to_string(kinds, ', ')
                     || ' (profile with with_modules=True, or with_stack=True, to see modules)' END
           || CASE WHEN EXISTS (SELECT 1 FROM evs WHERE origin = 'ops')
                   THEN '; ops: the operator CSV rows (kernel_details / op_summary), by op type, on the device lane' ELSE '' END
           || CASE WHEN EXISTS (SELECT 1 FROM evs WHERE origin = 'timeline')
                   THEN '; kernels: the Ascend timeline''s device tasks (trace_view.json, Ascend Hardware), its collectives on HCCL' ELSE '' END
           AS items_from
    FROM (SELECT list(DISTINCT item_kind ORDER BY list_position(['module', 'annotation', 'python', 'op', 'kernel', 'call', 'gap'], item_kind)) AS kinds
          FROM items)
),
enough AS (
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM segs)
                THEN 'no collective that every rank of its group reaches after an earlier one: a segment runs from a rank''s previous collective to its arrival at the next'
           END AS skip_reason
)
SELECT rank, item, item_kind, ratio, share_pct, cause, coverage, excess_us, own_us, peers_median_us, instances,
       lateness_ms, segments, late_pct, last_collectives, cost_ms, others_wait_ms, reading, pos, basis.items_from,
       NULL::VARCHAR AS skip_reason
FROM rows, enough, basis
WHERE enough.skip_reason IS NULL
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, skip_reason
FROM enough WHERE skip_reason IS NOT NULL
ORDER BY rank NULLS FIRST, pos
