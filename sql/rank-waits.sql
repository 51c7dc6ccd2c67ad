-- name: rank-waits
-- version: 2
-- description: Per rank over all matched collectives: total wait, mean arrival lag, and how often it arrived last (the straggler waits least; straggler-rank is the verdict).
-- requires: collective_waits
-- param: min_last_share DOUBLE = 0.5    -- a rank arriving last at this share of collectives is a straggler
-- param: min_collectives INTEGER = 3    -- need at least this many matched collectives to judge
-- verdict: none
-- role: report
-- subject: rank
-- order: 60
-- shows: compare
-- headline: rank | collectives | total_wait_ms | last_pct | straggler
-- summary: rank {rank} arrived last at {last_pct}% of {collectives} collectives, waited {total_wait_ms} ms

WITH c AS (
    SELECT *, arrived_last AND arrival_skew_ns > 0.05 * median_dur_ns AS last_clear
    FROM collective_waits WHERE run = $run
)
SELECT rank, count(*) AS collectives,
       round(sum(wait_ns) / 1e6, 3) AS total_wait_ms,
       round(avg(arrival_lag_ns) / 1e3, 1) AS mean_arrival_lag_us,
       round(100.0 * count(*) FILTER (WHERE last_clear) / count(*), 1) AS last_pct,
       count(*) >= $min_collectives
           AND count(*) FILTER (WHERE last_clear) >= $min_last_share * count(*) AS straggler
FROM c
GROUP BY rank
ORDER BY straggler DESC, last_pct DESC, rank
