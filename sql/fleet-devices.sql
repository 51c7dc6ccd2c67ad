-- name: fleet-devices
-- version: 1
-- description: The card that keeps coming up slow: per physical device (host/device_id) over the judged runs, how often a run's diagnosis named it a slow card, with cause, cost and first/last seen; FAIL / WARN when that is beyond chance given how often it was present.
-- scope: fleet
-- order: 900
-- requires: fleet_rank_runs
-- param: since VARCHAR = ''             -- only runs ingested at or after this time (ISO date or time); '' every run
-- param: min_slow_runs INTEGER = 3      -- a device is named only when slow in at least this many runs
-- param: alpha DOUBLE = 0.01            -- WARN when chance alone names it this often with probability below this (Bonferroni over the devices tested)
-- param: fail_alpha DOUBLE = 0.001      -- FAIL below this one
-- verdict: fail if rows > 0
-- role: verdict
-- subject: device
-- priority: none
-- headline: slow_runs | runs_judged | expected_slow_runs | p_adjusted | mean_cost_pct | last_slow_run | reading
-- summary: device {device} [{level}] slow in {slow_runs} of {runs_judged} runs where a slow card was named (expected by chance {expected_slow_runs}, p={p_adjusted}), {cause}, mean cost {mean_cost_pct}%, {reading}; next: {next_step}
-- pass: No device is a slow card in >= {min_slow_runs} runs beyond chance (p < {alpha}).
--
-- Why a test and not a count: a device that is in more runs is named more often by chance alone.
-- In a run whose diagnosis named n_slow of its n_ranks ranks, a device present there is named
-- with chance n_slow / n_ranks if no card is special. Over the runs where it was present and
-- some (not every) rank was named, its count is then binomial (n = those runs, p = the mean of
-- their chances: the Poisson-binomial of unequal runs, approximated); the upper tail P(X >= k)
-- is summed from lgamma terms. The p-value is multiplied by the number of devices tested
-- (Bonferroni): a fleet of 12 healthy devices would otherwise name one in ~12 % of looks at
-- alpha 0.01. min_slow_runs keeps two unlucky runs (p = (1/8)^2 = 0.016 for a device in only
-- those two) from naming a card.
-- A device slow under one rank only (fixed placement) cannot be told from that rank: `reading`
-- says so, and fleet-ranks then names the rank too.
-- Runs without a device for a rank (host or device id unknown: sources.device_id NULL) are left
-- out of this query; fleet-ranks still counts them.

WITH base AS (
    SELECT *, n_slow > 0 AND n_slow < n_ranks AS judged
    FROM fleet_rank_runs
    WHERE device IS NOT NULL
      AND run_at >= coalesce(TRY_CAST($since AS TIMESTAMP), TIMESTAMP '-infinity')
),
per_device AS (
    SELECT device, min(host) AS host, min(device_id) AS device_id,
           count(DISTINCT run) AS runs_present,
           count(DISTINCT run) FILTER (WHERE judged) AS runs_judged,
           count(DISTINCT run) FILTER (WHERE slow) AS slow_runs,
           count(DISTINCT run) FILTER (WHERE slow AND judged) AS slow_judged,
           count(DISTINCT run) FILTER (WHERE level = 'FAIL') AS fail_runs,
           avg(n_slow / n_ranks) FILTER (WHERE judged) AS chance,
           count(DISTINCT rank) FILTER (WHERE slow) AS ranks_when_slow,
           list(DISTINCT rank ORDER BY rank) FILTER (WHERE slow) AS slow_as_ranks,
           mode(cause) FILTER (WHERE slow) AS cause,
           round(avg(cost_pct) FILTER (WHERE slow), 1) AS mean_cost_pct,
           round(sum(cost_ms) FILTER (WHERE slow), 3) AS total_cost_ms,
           min(run_at) AS first_seen, max(run_at) AS last_seen,
           arg_min(run, run_at) FILTER (WHERE slow) AS first_slow_run,
           arg_max(run, run_at) FILTER (WHERE slow) AS last_slow_run
    FROM base GROUP BY device
),
-- upper binomial tail P(X >= slow_judged) for X ~ Bin(runs_judged, chance)
tail AS (
    SELECT device, _binomial_upper_p(slow_judged, runs_judged, chance) AS p_value
    FROM per_device
    WHERE runs_judged > 0 AND slow_judged > 0
),
tested AS (
    SELECT count(*) AS n_devices FROM per_device WHERE runs_judged > 0
),
judged AS (
    SELECT d.*, t.p_value,
           least(1.0, t.p_value * (SELECT n_devices FROM tested)) AS p_adj,
           round(d.runs_judged * d.chance, 1) AS expected_slow_runs
    FROM per_device d LEFT JOIN tail t USING (device)
),
levelled AS (
    SELECT *,
           CASE WHEN slow_judged >= $min_slow_runs AND p_adj < $fail_alpha THEN 'FAIL'
                WHEN slow_judged >= $min_slow_runs AND p_adj < $alpha THEN 'WARN' ELSE 'PASS' END AS level
    FROM judged
)
SELECT device, level, slow_runs, runs_judged, expected_slow_runs, p_adj AS p_adjusted,
       cause, mean_cost_pct, first_slow_run, last_slow_run,
       host, device_id, runs_present, fail_runs, p_value, slow_as_ranks, total_cost_ms, first_seen, last_seen,
       CASE WHEN slow_runs = 0 THEN 'never slow'
            WHEN NOT (slow_judged >= $min_slow_runs AND p_adj < $alpha) THEN 'within chance'
            WHEN ranks_when_slow >= 2 THEN 'the device: slow as ' || ranks_when_slow || ' different ranks'
            ELSE 'device or rank: slow only as rank ' || slow_as_ranks[1] || ' (cannot tell them apart; see fleet-ranks)'
       END AS reading,
       CASE WHEN level <> 'PASS' AND ranks_when_slow >= 2
                THEN 'hardware check of ' || device || ' (whatever rank it serves it is slow): ' ||
                     'slowcard fleet --trend ' || device || ' for its cost over time, then drain it or swap the card'
            WHEN level <> 'PASS'
                THEN 'move rank ' || slow_as_ranks[1] || ' to another device in the next run: the slow card follows the device or the rank'
       END AS next_step
FROM levelled
ORDER BY CASE level WHEN 'FAIL' THEN 0 WHEN 'WARN' THEN 1 ELSE 2 END, p_adj NULLS LAST, slow_runs DESC, device
