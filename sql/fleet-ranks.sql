-- name: fleet-ranks
-- version: 1
-- description: The rank that is slow wherever it lands: per rank over the judged runs, how often a run's diagnosis named it a slow card, on how many devices, with cause, cost and first/last seen; FAIL / WARN when that is beyond chance and not one device's doing.
-- scope: fleet
-- order: 910
-- requires: fleet_rank_runs
-- param: since VARCHAR = ''             -- only runs ingested at or after this time (ISO date or time); '' every run
-- param: min_slow_runs INTEGER = 3      -- a rank is named only when slow in at least this many runs
-- param: alpha DOUBLE = 0.01            -- WARN when chance alone names it this often with probability below this (Bonferroni over the ranks tested)
-- param: fail_alpha DOUBLE = 0.001      -- FAIL below this one
-- verdict: fail if rows > 0
-- role: verdict
-- subject: rank
-- priority: none
-- headline: slow_runs | runs_judged | expected_slow_runs | p_adjusted | devices_when_slow | mean_cost_pct | last_slow_run | reading
-- summary: rank {rank} [{level}] slow in {slow_runs} of {runs_judged} runs where a slow card was named (expected by chance {expected_slow_runs}, p={p_adjusted}), {cause}, mean cost {mean_cost_pct}%, {reading}; next: {next_step}
-- pass: No rank is a slow card in >= {min_slow_runs} runs beyond chance (p < {alpha}) on more than one device.
--
-- The test is fleet-devices' (see there), per rank instead of per device. A rank is slow
-- "wherever it lands" when its slow runs put it on at least two devices: a routing or placement
-- problem (hot experts or a heavy DP domain on that rank, the guides' routing imbalance), not a
-- card. A rank slow on one device only is that device's doing or cannot be told from it: it is
-- not named here (fleet-devices names the device, with the same caveat). Runs where the rank's
-- device is unknown count for the test; a rank slow only there is named, reading says so.

WITH base AS (
    SELECT *, n_slow > 0 AND n_slow < n_ranks AS judged
    FROM fleet_rank_runs
    WHERE run_at >= coalesce(TRY_CAST($since AS TIMESTAMP), TIMESTAMP '-infinity')
),
per_rank AS (
    SELECT rank,
           count(DISTINCT run) AS runs_present,
           count(DISTINCT run) FILTER (WHERE judged) AS runs_judged,
           count(DISTINCT run) FILTER (WHERE slow) AS slow_runs,
           count(DISTINCT run) FILTER (WHERE slow AND judged) AS slow_judged,
           count(DISTINCT run) FILTER (WHERE level = 'FAIL') AS fail_runs,
           avg(n_slow / n_ranks) FILTER (WHERE judged) AS chance,
           count(DISTINCT device) FILTER (WHERE slow) AS devices_when_slow,
           count(*) FILTER (WHERE slow AND device IS NULL) AS slow_device_unknown,
           list(DISTINCT device ORDER BY device) FILTER (WHERE slow AND device IS NOT NULL) AS slow_on_devices,
           mode(cause) FILTER (WHERE slow) AS cause,
           round(avg(cost_pct) FILTER (WHERE slow), 1) AS mean_cost_pct,
           round(sum(cost_ms) FILTER (WHERE slow), 3) AS total_cost_ms,
           min(run_at) AS first_seen, max(run_at) AS last_seen,
           arg_min(run, run_at) FILTER (WHERE slow) AS first_slow_run,
           arg_max(run, run_at) FILTER (WHERE slow) AS last_slow_run
    FROM base GROUP BY rank
),
-- upper binomial tail P(X >= slow_judged) for X ~ Bin(runs_judged, chance)
tail AS (
    SELECT rank, _binomial_upper_p(slow_judged, runs_judged, chance) AS p_value
    FROM per_rank
    WHERE runs_judged > 0 AND slow_judged > 0
),
tested AS (
    SELECT count(*) AS n_ranks FROM per_rank WHERE runs_judged > 0
),
judged AS (
    SELECT r.*, t.p_value,
           least(1.0, t.p_value * (SELECT n_ranks FROM tested)) AS p_adj,
           round(r.runs_judged * r.chance, 1) AS expected_slow_runs,
           r.devices_when_slow >= 2 OR (r.devices_when_slow = 0 AND r.slow_device_unknown > 0) AS moves
    FROM per_rank r LEFT JOIN tail t USING (rank)
),
levelled AS (
    SELECT *,
           CASE WHEN moves AND slow_judged >= $min_slow_runs AND p_adj < $fail_alpha THEN 'FAIL'
                WHEN moves AND slow_judged >= $min_slow_runs AND p_adj < $alpha THEN 'WARN' ELSE 'PASS' END AS level
    FROM judged
)
SELECT rank, level, slow_runs, runs_judged, expected_slow_runs, p_adj AS p_adjusted,
       devices_when_slow, cause, mean_cost_pct, first_slow_run, last_slow_run,
       runs_present, fail_runs, p_value, slow_on_devices, total_cost_ms, first_seen, last_seen,
       CASE WHEN slow_runs = 0 THEN 'never slow'
            WHEN NOT (slow_judged >= $min_slow_runs AND p_adj < $alpha) THEN 'within chance'
            WHEN devices_when_slow >= 2 THEN 'the rank, wherever it lands: slow on ' || devices_when_slow || ' devices'
            WHEN devices_when_slow = 1 THEN 'slow on one device only (' || slow_on_devices[1] || '): see fleet-devices'
            ELSE 'the rank (its devices are unknown: ingest --device-map)'
       END AS reading,
       CASE WHEN level <> 'PASS'
                THEN 'not the card: look at what rank ' || rank || ' is given (expert placement, routing, DP domain load; ' ||
                     'slowcard diagnose --run ' || last_slow_run || ')'
       END AS next_step
FROM levelled
ORDER BY CASE level WHEN 'FAIL' THEN 0 WHEN 'WARN' THEN 1 ELSE 2 END, p_adj NULLS LAST, slow_runs DESC, rank
