-- name: cluster-step-skew
-- version: 1
-- description: msprof-analyze Advisor's slow-rank rule on cluster_step_trace_time.csv: per step, the gap between the ranks' largest and smallest Computing, Communication(Not Overlapped) and Free time, as a share of the mean step time, and the rank that is likely slow.
-- requires: step_trace
-- param: min_gap_share DOUBLE = 0.05   -- (max - min) / mean step time above which a dimension is flagged (Advisor's RATIO_THRESHOLD)
-- verdict: fail if rows > 0
-- role: verdict
-- subject: suspect_rank as rank
-- priority: 40
-- order: 140
-- shows: report.moe, annotate
-- summary: step {step}: {dimension} gap {gap_pct}% of the mean step ({max_us} us on rank {max_rank} vs {min_us} us on rank {min_rank}); likely slow: rank {suspect_rank} ({cause}); next: {next_step}
-- pass: No step has a Computing, Communication(Not Overlapped) or Free gap across ranks above {min_gap_share} of the mean step time.

-- Rank rows only: a stage row summarises a rank group and would count its ranks twice. An empty
-- Step (no step marks: the whole profiled range) reads 'all'. Grouped per file (source_id) so that
-- two cluster summaries ingested into one run are never mixed.
WITH r AS (
    SELECT source_id, coalesce(step, 'all') AS step, rank,
           computing_us, communication_not_overlapped_us, free_us,
           computing_us + communication_not_overlapped_us + free_us AS step_us
    FROM step_trace
    WHERE run = $run AND type = 'rank' AND rank IS NOT NULL
),
-- Advisor divides the gap by the mean over ranks of Computing + Communication(Not Overlapped) +
-- Free (not by the dimension's own mean), so a gap reads as a share of the step and a small
-- dimension (little Free) cannot look huge from a few microseconds.
steps AS (
    SELECT source_id, step, avg(step_us) AS mean_step_us, count(*) AS n_ranks
    FROM r
    GROUP BY source_id, step
    HAVING count(*) >= 2
),
dims AS (
    SELECT source_id, step, rank, 'computing' AS dimension, computing_us AS value_us FROM r
    UNION ALL
    SELECT source_id, step, rank, 'communication_not_overlapped', communication_not_overlapped_us FROM r
    UNION ALL
    SELECT source_id, step, rank, 'free', free_us FROM r
),
gaps AS (
    SELECT d.source_id, d.step, d.dimension, any_value(s.n_ranks) AS n_ranks,
           any_value(s.mean_step_us) AS mean_step_us,
           max(d.value_us) AS max_us, min(d.value_us) AS min_us, avg(d.value_us) AS mean_us,
           first(d.rank ORDER BY d.value_us DESC, d.rank) AS max_rank,
           first(d.rank ORDER BY d.value_us, d.rank) AS min_rank
    FROM dims d JOIN steps s USING (source_id, step)
    GROUP BY d.source_id, d.step, d.dimension
),
flagged AS (
    SELECT *, CASE WHEN mean_step_us > 0 THEN (max_us - min_us) / mean_step_us ELSE 0 END AS gap_share
    FROM gaps
)
-- Who is likely slow (methodology, "What wait means"): ranks that finish their work early wait
-- for the late one inside the next synchronous collective, so waiting shows up as MORE
-- Communication(Not Overlapped) on the fast ranks. The late rank is the one with the most
-- Computing, or the most Free (device idle while its host is late), and the least communication.
SELECT step, dimension,
       CASE dimension WHEN 'computing' THEN 'compute-skew'
                      WHEN 'communication_not_overlapped' THEN 'comm-skew'
                      ELSE 'free-skew' END AS cause,
       CASE dimension WHEN 'communication_not_overlapped' THEN min_rank ELSE max_rank END AS suspect_rank,
       max_rank, round(max_us, 1) AS max_us, min_rank, round(min_us, 1) AS min_us,
       round(mean_us, 1) AS mean_us, round(mean_step_us, 1) AS mean_step_us,
       round(max_us - min_us, 1) AS gap_us, round(gap_share, 4) AS gap_share,
       round(100 * gap_share, 1) AS gap_pct, n_ranks,
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
           ELSE
               'rank ' || max_rank || ' sits idle on the device longest: the device waits for its host '
               || '(operator dispatch, data loading, Python, host-side sync), so it likely reaches the '
               || 'collectives late and the others wait in communication; look at its host timeline '
               || '(trace_view) around the idle gaps and compare with rank ' || min_rank
       END AS next_step,
       source_id
FROM flagged
WHERE gap_share > $min_gap_share
ORDER BY gap_share DESC, step, dimension
