-- name: ep-slow-rank
-- version: 3
-- description: The slow card of an expert-parallel run: the rank the others wait for in MoE layers, and why.
-- requires: moe_layer_facts
-- param: min_token_ratio DOUBLE = 1.3     -- tokens vs the median rank of the same layer instance that count as clearly more
-- param: same_token_ratio DOUBLE = 1.15   -- tokens within this ratio of the median count as about the same
-- param: min_compute_ratio DOUBLE = 1.3   -- GroupedMatmul time vs the median rank that counts as clearly longer
-- param: min_comm_ratio DOUBLE = 1.5      -- dispatch/combine transfer time vs the median rank that counts as slow
-- param: min_wait_share DOUBLE = 0.05     -- the others wait for the rank when the median rank's wait for the last arrival is >= this share of the layer time and the rank itself waits under half of that
-- param: min_persist_share DOUBLE = 0.5   -- share of matched layer instances in which the pattern must hold (a spike is not a slow card)
-- verdict: fail if rows > 0
-- role: verdict
-- subject: rank
-- priority: 20
-- order: 110
-- shows: report.moe, annotate
-- summary: rank {rank} {cause} in {persist_pct}% of {layer_instances} layer instances (tokens {token_ratio}x median, GroupedMatmul {gmm_ratio}x, transfer {transfer_ratio}x, arrived last at {last_arrival_pct}% of collectives{left_out}); next: {next_step}
-- pass: No rank stands out persistently (token ratio >= {min_token_ratio}, GroupedMatmul >= {min_compute_ratio}x or transfer >= {min_comm_ratio}x in >= {min_persist_share} of layer instances).

-- Per (rank, layer instance): what it computed and how it met the others at the collectives.
WITH f AS (
    SELECT f.*, coalesce(c.n_collectives, 0) AS n_coll, coalesce(c.n_arrived_last, 0) AS n_last,
           coalesce(c.transfer_ns, 0) AS transfer_ns, coalesce(c.arrival_lag_ns, 0) AS lag_ns,
           f.source_id IN (SELECT source_id FROM _layer_cuts WHERE run = $run) AS truncated
    FROM moe_layer_facts f
    LEFT JOIN _layer_collectives c USING (run, rank, source_id, step, layer, occurrence)
    WHERE f.run = $run AND f.rank IS NOT NULL
),
-- Only layer instances that every rank of the run has: they are what "the same layer" means.
inst AS (
    SELECT step, layer, occurrence FROM f GROUP BY ALL
    HAVING count(DISTINCT rank) = (SELECT count(DISTINCT rank) FROM f) AND count(DISTINCT rank) > 1
),
-- The median rank of each instance is the yardstick (robust to the one slow card itself).
-- Transfer and wait only over the ranks with matched collectives in the instance: a truncated
-- rank whose calls could not be matched (see _collectives) has none, and its zeros say nothing.
med AS (
    SELECT step, layer, occurrence, median(tokens) AS med_tokens, median(gmm_ns) AS med_gmm_ns,
           coalesce(median(transfer_ns) FILTER (WHERE n_coll > 0), 0) AS med_transfer_ns,
           coalesce(sum(lag_ns) FILTER (WHERE n_coll > 0), 0) AS all_lag_ns,
           coalesce(median(lag_ns) FILTER (WHERE n_coll > 0), 0) AS med_lag_ns,
           median(layer_ns) AS med_layer_ns,
           count(*) FILTER (WHERE n_coll > 0) AS n_ranks_with_coll
    FROM f JOIN inst USING (step, layer, occurrence) GROUP BY ALL
),
flags AS (
    SELECT f.*, m.med_tokens, m.med_gmm_ns,
           f.tokens / greatest(m.med_tokens, 1) AS token_ratio,
           f.gmm_ns / greatest(m.med_gmm_ns, 1) AS gmm_ratio,
           f.transfer_ns / greatest(m.med_transfer_ns, 1) AS transfer_ratio,
           m.all_lag_ns - f.lag_ns AS others_lag_ns,
           -- "the others wait for it": they wait for the last arrival a real share of the
           -- layer, and this rank hardly waits at all
           (f.n_coll > 0 AND m.med_lag_ns >= $min_wait_share * m.med_layer_ns
               AND f.lag_ns <= 0.5 * m.med_lag_ns)
           -- A truncated rank whose collectives went with the cut (Kineto writes lane by lane: the
           -- comm thread or device stream after the main thread) cannot show whether the others
           -- waited: it is judged on tokens and GroupedMatmul alone, and the finding says so.
           -- Otherwise the slow card itself, cut mid-write, would pass as balanced.
           OR (f.n_coll = 0 AND f.truncated AND m.n_ranks_with_coll > 0) AS others_wait
    FROM f JOIN med m USING (step, layer, occurrence)
),
classified AS (
    SELECT *,
           tokens IS NOT NULL AND token_ratio >= $min_token_ratio
               AND gmm_ratio >= $min_compute_ratio AND others_wait AS is_token_skew,
           (tokens IS NULL OR token_ratio <= $same_token_ratio)
               AND gmm_ratio >= $min_compute_ratio AND others_wait AS is_slow_compute,
           (tokens IS NULL OR token_ratio <= $same_token_ratio)
               AND gmm_ratio < $min_compute_ratio AND transfer_ratio >= $min_comm_ratio AS is_slow_comm
    FROM flags
),
per_rank AS (
    SELECT rank, count(*) AS layer_instances,
           count(*) FILTER (WHERE is_token_skew) AS n_token_skew,
           count(*) FILTER (WHERE is_slow_compute) AS n_slow_compute,
           count(*) FILTER (WHERE is_slow_comm) AS n_slow_comm,
           round(avg(tokens), 1) AS tokens_per_layer,
           round(avg(med_tokens), 1) AS median_rank_tokens,
           round(median(token_ratio), 2) AS token_ratio,
           round(avg(gmm_ns) / 1e3, 1) AS gmm_us_per_layer,
           round(avg(med_gmm_ns) / 1e3, 1) AS median_rank_gmm_us,
           round(median(gmm_ratio), 2) AS gmm_ratio,
           round(avg(transfer_ns) / 1e3, 1) AS transfer_us_per_layer,
           round(median(transfer_ratio), 2) AS transfer_ratio,
           round(100.0 * sum(n_last) / greatest(sum(n_coll), 1), 1) AS last_arrival_pct,
           round(sum(others_lag_ns) FILTER (WHERE others_wait) / 1e6, 3) AS others_wait_ms
    FROM classified GROUP BY rank
),
-- Truncated ranks (file cut mid-write): moe_layers leaves out the step the cut fell in (see
-- views/20_moe.sql), and with it that step and later for every rank; a rank with nothing before
-- its cut is left out whole. Said in each finding, so fewer layer instances are explained.
cuts AS (
    SELECT coalesce(string_agg(
               CASE WHEN n_kept > 0 THEN format('; rank {}''s trace is truncated: steps >= {} left out', rank, cut_step)
                    ELSE format('; rank {}''s trace is truncated in its first step: left out', rank) END
               || CASE WHEN n_kept > 0 AND NOT EXISTS (SELECT 1 FROM f WHERE f.rank = c.rank AND f.n_coll > 0)
                       THEN ', its collectives with the cut (whether the others waited for it not measured)'
                       ELSE '' END,
               '' ORDER BY rank), '') AS left_out
    FROM _layer_cuts c WHERE run = $run AND rank IS NOT NULL
),
verdicts AS (
    SELECT *,
           CASE greatest(n_token_skew, n_slow_compute, n_slow_comm)
               WHEN 0 THEN NULL
               WHEN n_token_skew THEN 'token-skew'
               WHEN n_slow_compute THEN 'slow-compute'
               ELSE 'slow-comm'
           END AS cause,
           greatest(n_token_skew, n_slow_compute, n_slow_comm) AS n_flagged
    FROM per_rank
)
SELECT rank, cause,
       round(100.0 * n_flagged / layer_instances, 1) AS persist_pct,
       layer_instances, tokens_per_layer, median_rank_tokens, token_ratio,
       gmm_us_per_layer, median_rank_gmm_us, gmm_ratio, transfer_us_per_layer, transfer_ratio,
       last_arrival_pct, others_wait_ms, cuts.left_out,
       CASE cause
           WHEN 'token-skew' THEN 'routing / expert placement imbalance: find the hot experts on this rank (expert-hotspots, ep-hot-chain), check the EPLB config and expert map, and the input distribution; rebalance or add redundant experts'
           WHEN 'slow-compute' THEN 'same tokens but slower GroupedMatmul: a device or process anomaly on this card (health, clocks/thermals, CPU binding, co-located jobs); not a routing problem, do not rebalance experts'
           ELSE 'dispatch/combine transfer is slow on this rank while it does not hold the others up with compute: check its links and NIC (HCCS/RoCE/NVLink), communication config (buffers, algorithm) and the network path'
       END AS next_step
FROM verdicts, cuts
WHERE cause IS NOT NULL AND n_flagged >= $min_persist_share * layer_instances
ORDER BY n_flagged DESC, rank
