-- name: straggler-rank
-- version: 3
-- description: The straggler: a rank that arrives last at a clear share of the matched collectives, so the others wait for it (the per-rank numbers of rank-waits, flagged ranks only).
-- requires: collective_waits
-- param: min_last_share DOUBLE = 0.5    -- a rank arriving last at this share of collectives is a straggler
-- param: min_collectives INTEGER = 3    -- need at least this many matched collectives to judge
-- verdict: warn if rows > 0
-- role: verdict
-- subject: rank
-- priority: 70
-- order: 65
-- shows: report.moe, annotate
-- headline: arrived last at {last_pct} % of {collectives} collectives with ranks {peers} in {groups} | waited {total_wait_ms} ms itself (mean arrival lag {mean_arrival_lag_us} us)
-- summary: rank {rank} arrived last at {last_pct}% of {collectives} collectives with ranks {peers} in {groups}, waited {total_wait_ms} ms
-- pass: No rank arrives last at >= {min_last_share} of the matched collectives.
--
-- Split from rank-waits v1 (whose WARN this was): arriving last only counts when the skew is
-- clear (> 5% of the median duration of that collective), and a rank needs min_collectives
-- matched collectives to be judged.
-- v2 (issue 30): a rank is compared with the ranks of each collective it took part in (the
-- collective's process group), never with the cluster as a whole; `peers` lists those ranks
-- (all its collectives together) and `groups` the process groups, with their parallel kind (tp,
-- dp, ep …) where the trace's distributedInfo.pg_config or a groups file names it
-- (parallel_groups). The verdict is v1's.
-- v3 (issue 42): next_step sends the user to why-straggler (what the rank does longer between
-- its collectives, e.g. attention kernels, host / launch, data loading, a co-located job), not only to
-- ep-slow-rank and moe-breakdown, which PASS when its lateness is outside its MoE work. The
-- verdict is v2's.

WITH c AS (
    SELECT *, arrived_last AND arrival_skew_ns > 0.05 * median_dur_ns AS last_clear
    FROM collective_waits WHERE run = $run
),
-- the ranks met in each process group, and the group's kind: a Kineto pg_config entry of the same
-- name, else a group of the same member set from any other source (a groups file)
pg_members AS (
    SELECT pg, list(DISTINCT rank ORDER BY rank) AS ranks FROM collective_waits WHERE run = $run GROUP BY pg
),
pg_kinds AS (
    SELECT m.pg, m.ranks,
           coalesce(first(k.kind ORDER BY k.kind) FILTER (WHERE k.source = 'kineto' AND k.group_name = m.pg),
                    first(k.kind ORDER BY k.kind) FILTER (WHERE k.group_ranks = m.ranks AND k.kind <> 'other'))
               AS kind
    FROM pg_members m LEFT JOIN (SELECT DISTINCT kind, group_name, group_ranks, source FROM parallel_groups
                                 WHERE run = $run) k
        ON (k.source = 'kineto' AND k.group_name = m.pg) OR k.group_ranks = m.ranks
    GROUP BY m.pg, m.ranks
),
rank_pgs AS (
    SELECT d.rank, _rank_ranges(list_sort(list_distinct(flatten(list(k.ranks))))) AS peers,
           string_agg('pg ' || d.pg || coalesce(' (' || k.kind || ')', ''), ', ' ORDER BY d.pg) AS groups
    FROM (SELECT DISTINCT rank, pg FROM c) d JOIN pg_kinds k USING (pg)
    GROUP BY d.rank
),
per_rank AS (
    SELECT rank, count(*) AS collectives,
           round(sum(wait_ns) / 1e6, 3) AS total_wait_ms,
           round(avg(arrival_lag_ns) / 1e3, 1) AS mean_arrival_lag_us,
           round(100.0 * count(*) FILTER (WHERE last_clear) / count(*), 1) AS last_pct,
           count(*) >= $min_collectives
               AND count(*) FILTER (WHERE last_clear) >= $min_last_share * count(*) AS straggler
    FROM c
    GROUP BY rank
)
SELECT rank, collectives, total_wait_ms, mean_arrival_lag_us, last_pct, straggler, g.peers, g.groups,
       'straggler' AS cause,
       'the others wait for this rank at collectives: read why-straggler''s item (what it does longer between collectives: attention kernels, host / launch, data loading, a co-located job); inside its MoE layers, ep-slow-rank' AS next_step
FROM per_rank LEFT JOIN rank_pgs g USING (rank)
WHERE straggler
ORDER BY last_pct DESC, rank
