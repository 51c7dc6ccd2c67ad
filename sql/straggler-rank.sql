-- name: straggler-rank
-- version: 1
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
-- headline: arrived last at {last_pct} % of {collectives} collectives | waited {total_wait_ms} ms itself (mean arrival lag {mean_arrival_lag_us} us)
-- summary: rank {rank} arrived last at {last_pct}% of {collectives} collectives, waited {total_wait_ms} ms
-- pass: No rank arrives last at >= {min_last_share} of the matched collectives.
--
-- Split from rank-waits v1 (whose WARN this was): arriving last only counts when the skew is
-- clear (> 5% of the median duration of that collective), and a rank needs min_collectives
-- matched collectives to be judged.

WITH c AS (
    SELECT *, arrived_last AND arrival_skew_ns > 0.05 * median_dur_ns AS last_clear
    FROM collective_waits WHERE run = $run
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
SELECT rank, collectives, total_wait_ms, mean_arrival_lag_us, last_pct, straggler,
       'straggler' AS cause,
       'the others wait for this rank at collectives: see ep-slow-rank and moe-breakdown for why' AS next_step
FROM per_rank
WHERE straggler
ORDER BY last_pct DESC, rank
