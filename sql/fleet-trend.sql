-- name: fleet-trend
-- version: 1
-- description: One card's cost across runs: per judged run where the device was present, the rank it served, whether it was a slow card, with level, cause and cost (the device slow most often when none is given; every device with '*').
-- scope: fleet
-- order: 920
-- requires: fleet_rank_runs
-- param: device VARCHAR = ''            -- host/device_id (as fleet-devices names it); '' the device slow in the most runs; '*' every device (the fleet page's heat map)
-- param: since VARCHAR = ''             -- only runs ingested at or after this time (ISO date or time); '' every run
-- verdict: none
-- subject: device
--
-- One row per run, oldest first: a cost that grows from run to run is a card wearing out (or a
-- thermal / power cap that tightened); one that comes and goes follows the rank it served.

WITH base AS (
    SELECT * FROM fleet_rank_runs
    WHERE device IS NOT NULL
      AND run_at >= coalesce(TRY_CAST($since AS TIMESTAMP), TIMESTAMP '-infinity')
),
chosen AS (
    SELECT coalesce(nullif($device, ''),
                    (SELECT device FROM base GROUP BY device
                     ORDER BY count(DISTINCT run) FILTER (WHERE slow) DESC, device LIMIT 1)) AS device
)
SELECT b.device, b.run, b.run_at, b.rank, b.n_ranks, b.slow, b.level, b.cause,
       round(b.cost_pct, 1) AS cost_pct, round(b.cost_ms, 3) AS cost_ms,
       count(*) FILTER (WHERE b.slow) OVER (PARTITION BY b.device ORDER BY b.run_at, b.run) AS slow_runs_so_far
FROM base b JOIN chosen c ON c.device = b.device OR $device = '*'
ORDER BY b.device, b.run_at, b.run
