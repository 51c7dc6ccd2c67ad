-- name: sync-gaps
-- version: 1
-- description: Per matched collective: arrival skew, the rank that arrived last, and each rank's wait (clock offsets between hosts corrected).
-- requires: collective_waits
-- param: min_skew_us DOUBLE = 0.0   -- hide collectives whose arrival skew is below this
-- verdict: none
-- role: report
-- order: 70
-- shows: report.collectives
-- headline: pg | coll_kind | instance | last_rank | arrival_skew_us | max_dur_us
-- summary: {coll_kind} #{instance} ({pg}): rank {last_rank} arrived last, skew {arrival_skew_us} us

SELECT pg, coll_kind, instance, any_value(name) AS name, count(*) AS ranks,
       any_value(last_rank) AS last_rank,
       round(any_value(arrival_skew_ns) / 1e3, 1) AS arrival_skew_us,
       round(min(dur_ns) / 1e3, 1) AS min_dur_us,
       round(max(dur_ns) / 1e3, 1) AS max_dur_us,
       map(list(rank ORDER BY rank), list(round(wait_ns / 1e3, 1) ORDER BY rank)) AS wait_us_by_rank,
       min(ts_ns) AS first_ts_ns
FROM collective_waits
WHERE run = $run
GROUP BY pg, coll_kind, instance
HAVING any_value(arrival_skew_ns) >= $min_skew_us * 1000
ORDER BY arrival_skew_us DESC, pg, coll_kind, instance
