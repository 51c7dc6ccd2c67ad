-- name: cluster-step-skew
-- version: 3
-- description: msprof-analyze Advisor's slow-rank rule on cluster_step_trace_time.csv (or the ranks' step_trace_time.csv): per step and pipeline stage (and per TP / DP / EP group inside the stage when the run has parallel groups), the gap between the ranks' largest and smallest Computing, Communication(Not Overlapped, receive excluded) and Free time, as a share of the stage's mean step time, and the rank that is likely slow.
-- requires: step_trace
-- param: min_gap_share DOUBLE = 0.05   -- (max - min) / mean step time above which a dimension is flagged (Advisor's RATIO_THRESHOLD)
-- verdict: fail if rows > 0
-- role: verdict
-- subject: suspect_rank as rank
-- priority: 40
-- order: 140
-- shows: report.moe, annotate
-- headline: {gap_pct} % of the mean step: the {dimension} gap of step {step} ({stage}; {peer_group}: ranks {peers}) | {max_us} us on rank {max_rank} vs {min_us} us on rank {min_rank} (mean {mean_us} us) | {max_rank_wait_ms} ms waited by rank {max_rank} (transit {max_rank_transit_ms} ms, slowest link {max_rank_min_link_gbps} GB/s)
-- summary: step {step} ({stage}; {peer_group}: ranks {peers}): {dimension} gap {gap_pct}% of the mean step ({max_us} us on rank {max_rank} vs {min_us} us on rank {min_rank}); likely slow: rank {suspect_rank} ({cause}); next: {next_step}
-- pass: No step has a Computing, Communication(Not Overlapped) or Free gap across the ranks of a pipeline stage above {min_gap_share} of the mean step time.

-- Rank rows only: a stage row summarises a rank group and would count its ranks twice. An empty
-- Step (no step marks: the whole profiled range) reads 'all'. Grouped per summary (summary_id: one
-- cluster file, or the run's per-rank step_trace_time.csv files together) so that two summaries
-- ingested into one run are never mixed.
-- Pipeline parallelism: a later stage waits for its activations in hcom_receive (the Bubble
-- column, 180-195 ms per step on stage 2 of a real 2-stage run), so ranks of different stages
-- differ by the pipeline's shape, not by a slow card. Ranks are compared within their stage only,
-- and communication excludes receives (`Communication(Not Overlapped and Exclude Receive)`) when
-- the file has it. The stage of a rank, first that answers: the `PP Index` column; the stage row
-- whose rank group holds it; the pp coordinate of its folder (vLLM dp.._pp.._tp..); the p2p group
-- of communication_group.json that holds it (msprof-analyze builds its stage rows from these); a
-- 'stage' group of parallel_groups (a groups file); its position in its PP group (parallel_groups
-- kind 'pp': the n-th rank of every PP group is stage n); else, when some ranks of the step
-- receive (Bubble > 0) and others do not, those two sets (they cannot be one stage); else all
-- ranks together. Members of one stage in different DP / TP groups do the same work, so they are
-- compared together (peer_group 'stage'): a whole TP group on a slow node stands out there.
-- Parallel groups (v3): when the run has TP / DP / EP / CP groups (parallel_groups), each such
-- group is also compared within itself, inside the stage (its members in other stages are left
-- out), when it is smaller than the stage: a rank that is slow among its own TP group is found
-- even where the stage's spread is set by another group (DP domains with different batches). Such
-- a row names its group in peer_group and is left out when the stage comparison already names the
-- same suspect for the same step and dimension. `peers` lists the ranks each row compared.
WITH r AS (
    SELECT summary_id, coalesce(step, 'all') AS step, step_id, rank, pp_index, pp_rank, bubble_us,
           computing_us,
           coalesce(comm_not_overlapped_excl_receive_us, communication_not_overlapped_us)
               AS communication_not_overlapped_us,
           comm_not_overlapped_excl_receive_us IS NOT NULL AS receive_excluded,
           free_us
    FROM step_trace
    WHERE run = $run AND type = 'rank' AND rank IS NOT NULL
),
stage_members AS (
    SELECT summary_id, step, any_value(stage) AS stage_row, rank
    FROM (SELECT summary_id, coalesce(step, 'all') AS step, index AS stage,
                 CAST(unnest(regexp_extract_all(index, '[0-9]+')) AS INTEGER) AS rank
          FROM step_trace
          WHERE run = $run AND type = 'stage')
    GROUP BY ALL
),
p2p AS (      -- a rank in exactly one p2p group of the run's latest communication_group.json
    SELECT rank, any_value(ranks) AS ranks
    FROM (SELECT ranks, CAST(unnest(ranks) AS INTEGER) AS rank
          FROM comm_groups
          WHERE run = $run AND group_type = 'p2p'
          QUALIFY source_id = max(source_id) OVER ())
    GROUP BY rank
    HAVING count(*) = 1
),
stage_group AS (   -- a rank in exactly one 'stage' group of a groups file (parallel_groups)
    SELECT rank, any_value(group_id) AS group_id
    FROM (SELECT DISTINCT group_id, rank FROM parallel_groups
          WHERE run = $run AND kind = 'stage' AND source <> 'communication_group')
    GROUP BY rank
    HAVING count(*) = 1
),
pp_position AS (   -- a rank in exactly one PP group: its place in the pipeline (0 = first stage)
    SELECT rank, any_value(list_position(group_ranks, rank) - 1) AS pp_stage
    FROM (SELECT DISTINCT group_id, group_ranks, rank FROM parallel_groups WHERE run = $run AND kind = 'pp')
    GROUP BY rank
    HAVING count(*) = 1
),
peer_groups AS (   -- groups whose members do the same work as each other
    SELECT DISTINCT group_id, rank FROM parallel_groups WHERE run = $run AND kind IN ('tp', 'dp', 'ep', 'cp')
),
staged AS (
    SELECT r.*,
           CASE WHEN r.pp_index IS NOT NULL THEN 'pp ' || r.pp_index
                WHEN m.stage_row IS NOT NULL THEN 'stage ' || m.stage_row
                WHEN r.pp_rank IS NOT NULL THEN 'pp ' || r.pp_rank
                WHEN g.ranks IS NOT NULL THEN 'p2p group ' || CAST(g.ranks AS VARCHAR)
                WHEN sg.group_id IS NOT NULL THEN sg.group_id
                WHEN pp.pp_stage IS NOT NULL THEN 'pp stage ' || pp.pp_stage
                WHEN max(coalesce(r.bubble_us, 0)) OVER w > 0 AND min(coalesce(r.bubble_us, 0)) OVER w = 0
                    THEN CASE WHEN coalesce(r.bubble_us, 0) > 0 THEN 'receiving ranks' ELSE 'non-receiving ranks' END
                ELSE 'all ranks' END AS stage,
           CASE WHEN r.pp_index IS NOT NULL THEN 'PP Index'
                WHEN m.stage_row IS NOT NULL THEN 'stage row'
                WHEN r.pp_rank IS NOT NULL THEN 'folder name'
                WHEN g.ranks IS NOT NULL THEN 'p2p group'
                WHEN sg.group_id IS NOT NULL THEN 'stage group'
                WHEN pp.pp_stage IS NOT NULL THEN 'pp group'
                WHEN max(coalesce(r.bubble_us, 0)) OVER w > 0 AND min(coalesce(r.bubble_us, 0)) OVER w = 0
                    THEN 'Bubble'
                ELSE 'none' END AS stage_source,
           computing_us + communication_not_overlapped_us + free_us AS step_us
    FROM r LEFT JOIN stage_members m USING (summary_id, step, rank) LEFT JOIN p2p g USING (rank)
           LEFT JOIN stage_group sg USING (rank) LEFT JOIN pp_position pp USING (rank)
    WINDOW w AS (PARTITION BY r.summary_id, r.step)
),
-- The comparisons: each stage whole, and each TP / DP / EP / CP group within a stage.
scoped AS (
    SELECT *, 'stage' AS peer_group FROM staged
    UNION ALL
    SELECT s.*, pg.group_id FROM staged s JOIN peer_groups pg USING (rank)
),
-- Advisor divides the gap by the mean over ranks of Computing + Communication(Not Overlapped) +
-- Free (not by the dimension's own mean), so a gap reads as a share of the step and a small
-- dimension (little Free) cannot look huge from a few microseconds.
scopes AS (
    SELECT summary_id, step, stage, peer_group, avg(step_us) AS mean_step_us, count(*) AS n_ranks,
           list(rank ORDER BY rank) AS peer_ranks
    FROM scoped
    GROUP BY summary_id, step, stage, peer_group
    HAVING count(*) >= 2
),
-- A group comparison only where it is narrower than its stage, and once per member set (a TP
-- group that is also the EP group).
steps AS (
    SELECT g.*
    FROM scopes g JOIN scopes st ON st.summary_id = g.summary_id AND st.step = g.step AND st.stage = g.stage
                                AND st.peer_group = 'stage'
    WHERE g.peer_group = 'stage' OR g.n_ranks < st.n_ranks
    QUALIFY row_number() OVER (PARTITION BY g.summary_id, g.step, g.stage, g.peer_ranks
                               ORDER BY g.peer_group <> 'stage', g.peer_group) = 1
),
dims AS (
    SELECT summary_id, step, step_id, stage, peer_group, stage_source, receive_excluded, rank,
           'computing' AS dimension, computing_us AS value_us FROM scoped
    UNION ALL
    SELECT summary_id, step, step_id, stage, peer_group, stage_source, receive_excluded, rank,
           'communication_not_overlapped', communication_not_overlapped_us FROM scoped
    UNION ALL
    SELECT summary_id, step, step_id, stage, peer_group, stage_source, receive_excluded, rank,
           'free', free_us FROM scoped
),
gaps AS (
    SELECT d.summary_id, d.step, d.stage, d.peer_group, d.dimension, any_value(d.step_id) AS step_id,
           any_value(d.stage_source) AS stage_source, bool_and(d.receive_excluded) AS receive_excluded,
           any_value(s.n_ranks) AS n_ranks, any_value(s.mean_step_us) AS mean_step_us,
           any_value(s.peer_ranks) AS peer_ranks,
           max(d.value_us) AS max_us, min(d.value_us) AS min_us, avg(d.value_us) AS mean_us,
           first(d.rank ORDER BY d.value_us DESC, d.rank) AS max_rank,
           first(d.rank ORDER BY d.value_us, d.rank) AS min_rank
    FROM dims d JOIN steps s USING (summary_id, step, stage, peer_group)
    GROUP BY d.summary_id, d.step, d.stage, d.peer_group, d.dimension
),
-- Evidence for the communication dimension from the communication summary (cluster or per-rank
-- communication.json), when the run has one: each rank's wait and transit over all its ops of
-- the step ("Total Op Info" rows), and its slowest busy link.
comm AS (
    SELECT rank, step_id, sum(wait_ms) AS wait_ms, sum(transit_ms) AS transit_ms,
           min(least(CASE WHEN rdma_transit_mb > 0 THEN rdma_bandwidth_gbps END,
                     CASE WHEN hccs_transit_mb > 0 THEN hccs_bandwidth_gbps END)) AS min_link_gbps
    FROM (SELECT * FROM comm_summary WHERE run = $run AND is_total
          QUALIFY summary_id = max(summary_id) OVER (PARTITION BY rank, step_id))
    GROUP BY rank, step_id
),
flagged AS (
    SELECT g.*, CASE WHEN mean_step_us > 0 THEN (max_us - min_us) / mean_step_us ELSE 0 END AS gap_share,
           cmax.wait_ms AS max_rank_wait_ms, cmax.transit_ms AS max_rank_transit_ms,
           cmax.min_link_gbps AS max_rank_min_link_gbps, cmin.wait_ms AS min_rank_wait_ms
    FROM gaps g
    LEFT JOIN comm cmax ON cmax.rank = g.max_rank AND cmax.step_id IS NOT DISTINCT FROM g.step_id
    LEFT JOIN comm cmin ON cmin.rank = g.min_rank AND cmin.step_id IS NOT DISTINCT FROM g.step_id
),
over AS (
    SELECT *, CASE dimension WHEN 'communication_not_overlapped' THEN min_rank ELSE max_rank END AS suspect_rank
    FROM flagged
    WHERE gap_share > $min_gap_share
),
-- a group row that only repeats its stage's finding (same step, dimension and suspect) is left out
kept AS (
    SELECT o.* FROM over o
    WHERE o.peer_group = 'stage'
       OR NOT EXISTS (SELECT 1 FROM over s
                      WHERE s.peer_group = 'stage' AND s.summary_id = o.summary_id AND s.step = o.step
                        AND s.stage = o.stage AND s.dimension = o.dimension AND s.suspect_rank = o.suspect_rank)
)
-- Who is likely slow (methodology, "What wait means"): ranks that finish their work early wait
-- for the late one inside the next synchronous collective, so waiting shows up as MORE
-- Communication(Not Overlapped) on the fast ranks. The late rank is the one with the most
-- Computing, or the most Free (device idle while its host is late), and the least communication.
SELECT step, stage, dimension,
       CASE dimension WHEN 'computing' THEN 'compute-skew'
                      WHEN 'communication_not_overlapped' THEN 'comm-skew'
                      ELSE 'free-skew' END AS cause,
       suspect_rank, peer_group, _rank_ranges(peer_ranks) AS peers,
       max_rank, round(max_us, 1) AS max_us, min_rank, round(min_us, 1) AS min_us,
       round(mean_us, 1) AS mean_us, round(mean_step_us, 1) AS mean_step_us,
       round(max_us - min_us, 1) AS gap_us, round(gap_share, 4) AS gap_share,
       round(100 * gap_share, 1) AS gap_pct, n_ranks, stage_source, receive_excluded,
       round(max_rank_wait_ms, 3) AS max_rank_wait_ms, round(min_rank_wait_ms, 3) AS min_rank_wait_ms,
       round(max_rank_transit_ms, 3) AS max_rank_transit_ms, round(max_rank_min_link_gbps, 2) AS max_rank_min_link_gbps,
       CASE dimension
           WHEN 'computing' THEN
               'rank ' || max_rank || ' computes longest; the others likely wait for it at the next collective '
               || '(their Communication(Not Overlapped) grows). Compare its operators with rank ' || min_rank
               || ' (ops per rank): the same operators running slower point to a device or process anomaly, '
               || 'more or larger operators to uneven work (token / expert skew: ep-slow-rank, ep-hot-chain)'
           WHEN 'communication_not_overlapped' THEN
               'a rank with much more Communication(Not Overlapped) and less Free is usually waiting for the '
               || 'others, not transferring slowly: the rank they wait for is likely rank ' || min_rank
               || ' (least non-overlapped communication; check its Computing and Free in step_trace). Confirm in '
               || 'comm_summary: high wait_ms / wait_ratio on rank ' || max_rank || ' means it waits; long '
               || 'transit_ms or low rdma/hccs bandwidth on rank ' || max_rank || ' means a slow link instead '
               || '(then rank ' || max_rank || ' is the slow one)'
               || CASE WHEN max_rank_wait_ms IS NOT NULL THEN
                      ' [comm_summary: rank ' || max_rank || ' waited ' || round(max_rank_wait_ms, 1) || ' ms and transferred '
                      || round(max_rank_transit_ms, 1) || ' ms'
                      || CASE WHEN min_rank_wait_ms IS NOT NULL THEN ', rank ' || min_rank || ' waited '
                              || round(min_rank_wait_ms, 1) || ' ms' ELSE '' END || ']'
                  ELSE '' END
           ELSE
               'rank ' || max_rank || ' sits idle on the device longest: the device waits for its host '
               || '(operator dispatch, data loading, Python, host-side sync), so it likely reaches the '
               || 'collectives late and the others wait in communication; look at its host timeline '
               || '(trace_view) around the idle gaps and compare with rank ' || min_rank
       END AS next_step,
       summary_id AS source_id
FROM kept
ORDER BY gap_share DESC, step, stage, dimension, peer_group
