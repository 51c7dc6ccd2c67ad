-- name: ep-slow-rank
-- version: 4
-- description: The slow card of an expert-parallel run: the rank whose own MoE work is persistently above the median rank's, why, and the MoE time it costs.
-- requires: moe_layer_facts
-- param: min_token_ratio DOUBLE = 1.2     -- token-skew: the rank's median tokens / the median rank's, per layer instance, at least this
-- param: same_token_ratio DOUBLE = 1.1    -- tokens within this ratio of the median rank count as about the same (slow-compute, slow-comm)
-- param: min_compute_ratio DOUBLE = 1.2   -- slow-compute: the rank's median GroupedMatmul / the median rank's, per layer instance, at least this
-- param: min_comm_ratio DOUBLE = 1.5      -- slow-comm: the rank's median dispatch/combine transfer / the median rank's, at least this
-- param: alpha DOUBLE = 0.01              -- false-alarm budget of the run's sign tests: each rank is tested at alpha / ranks (Bonferroni)
-- param: min_cost_pct DOUBLE = 5.0        -- FAIL when the finding costs at least this % of the run's MoE time, else WARN
-- param: min_ranks INTEGER = 3            -- fewer ranks have no median rank to compare with: SKIP
-- verdict: fail if rows > 0
-- role: verdict
-- subject: rank
-- priority: 20
-- order: 110
-- shows: report.moe, annotate
-- summary: rank {rank} {cause} [{level}]: costs {cost_ms} ms = {cost_pct}% of MoE time (tokens {token_ratio}x median, GroupedMatmul {gmm_ratio}x, transfer {transfer_ratio}x, above the median in {above_pct}% of {layer_instances} layer instances, p={p_value}; arrived last at {last_arrival_pct}% of collectives{left_out}); next: {next_step}
-- pass: No rank stands out: no rank's own MoE work is significantly above the median rank's (sign tests over layer instances at alpha {alpha}; tokens >= {min_token_ratio}x, GroupedMatmul >= {min_compute_ratio}x or transfer >= {min_comm_ratio}x).
--
-- Method. Each (rank, layer instance) is paired with the median rank of the same instance
-- (instances every rank has: "the same layer"). The evidence is the rank's OWN work, which host
-- noise cannot fake persistently: tokens (exact) and GroupedMatmul time; transfer for slow-comm.
-- Per rank and quantity, a one-sided sign test over the instances: k = instances where the rank
-- is strictly above the median rank, p = P(Binomial(n, 1/2) >= k) (a rank that is not different
-- is above the median at most half the time; ties count against the rank). A cause holds when
-- its sign tests are significant at alpha / ranks AND the median of the per-instance ratios
-- reaches the effect threshold:
--   token-skew:   tokens above (test) with median token ratio >= min_token_ratio, AND
--                 GroupedMatmul above (test): more work and it takes longer;
--   slow-compute: median token ratio <= same_token_ratio (or tokens unknown), GroupedMatmul
--                 above (test) with median ratio >= min_compute_ratio;
--   slow-comm:    same tokens, not slow-compute, transfer above (test) with median ratio
--                 >= min_comm_ratio.
-- Arrival order (last_arrival_pct) and the others' wait for it where it arrived last
-- (others_wait_ms) are evidence columns,
-- never gates: under host noise the slow rank does not reliably arrive last.
-- Cost (what-if: this rank at the median rank): n x the median per-instance excess of the
-- cause's own time over the median rank (GroupedMatmul for token-skew and slow-compute, transfer
-- for slow-comm). The median excess, not the sum, so one descheduled instance does not make a
-- cost; in % of the run's MoE time (sum over instances of the median rank's layer time).
-- Level: FAIL when significant and cost_pct >= min_cost_pct, WARN when significant but cheaper.
-- SKIP (one row with skip_reason) when fewer than min_ranks ranks, or so few instances n that
-- even a rank above the median in all of them would not be significant (0.5^n > alpha / ranks).

-- Per (rank, layer instance): what it computed and how it met the others at the collectives.
WITH f AS (
    SELECT f.*, coalesce(c.n_collectives, 0) AS n_coll, coalesce(c.n_arrived_last, 0) AS n_last,
           coalesce(c.transfer_ns, 0) AS transfer_ns, coalesce(c.arrival_lag_ns, 0) AS lag_ns
    FROM moe_layer_facts f
    LEFT JOIN _layer_collectives c USING (run, rank, source_id, step, layer, occurrence)
    WHERE f.run = $run AND f.rank IS NOT NULL
),
n_ranks AS (SELECT count(DISTINCT rank) AS n FROM f),
-- Only layer instances that every rank of the run has: they are what "the same layer" means.
inst AS (
    SELECT step, layer, occurrence FROM f GROUP BY ALL
    HAVING count(DISTINCT rank) = (SELECT n FROM n_ranks) AND count(DISTINCT rank) > 1
),
-- The median rank of each instance is the yardstick (robust to the one slow card itself).
-- Transfer and wait only over the ranks with matched collectives in the instance: a truncated
-- rank whose calls could not be matched (see _collectives) has none, and its zeros say nothing.
med AS (
    SELECT step, layer, occurrence, median(tokens) AS med_tokens, median(gmm_ns) AS med_gmm_ns,
           median(transfer_ns) FILTER (WHERE n_coll > 0) AS med_transfer_ns,
           coalesce(sum(lag_ns) FILTER (WHERE n_coll > 0), 0) AS all_lag_ns,
           median(layer_ns) AS med_layer_ns
    FROM f JOIN inst USING (step, layer, occurrence) GROUP BY ALL
),
paired AS (
    SELECT f.rank, f.n_coll, f.n_last, f.tokens, f.gmm_ns, f.transfer_ns, m.med_tokens, m.med_gmm_ns, m.med_transfer_ns,
           m.med_layer_ns, m.all_lag_ns - f.lag_ns AS others_lag_ns,
           f.tokens / greatest(m.med_tokens, 1) AS token_ratio,
           f.gmm_ns / greatest(m.med_gmm_ns, 1) AS gmm_ratio,
           CASE WHEN f.n_coll > 0 THEN f.transfer_ns / greatest(m.med_transfer_ns, 1) END AS transfer_ratio,
           f.gmm_ns - m.med_gmm_ns AS gmm_excess_ns,
           CASE WHEN f.n_coll > 0 THEN f.transfer_ns - m.med_transfer_ns END AS transfer_excess_ns
    FROM f JOIN med m USING (step, layer, occurrence)
),
per_rank AS (
    SELECT rank, count(*) AS n,
           count(*) FILTER (WHERE tokens > med_tokens) AS k_tokens,
           count(*) FILTER (WHERE gmm_ns > med_gmm_ns) AS k_gmm,
           count(transfer_ratio) AS n_tr,
           count(*) FILTER (WHERE transfer_ratio IS NOT NULL AND transfer_ns > med_transfer_ns) AS k_tr,
           bool_and(tokens IS NOT NULL) AS tokens_known,
           median(token_ratio) AS token_ratio, median(gmm_ratio) AS gmm_ratio,
           median(transfer_ratio) AS transfer_ratio,
           median(gmm_excess_ns) AS med_gmm_excess_ns, median(transfer_excess_ns) AS med_transfer_excess_ns,
           avg(tokens) AS tokens_per_layer, avg(med_tokens) AS median_rank_tokens,
           avg(gmm_ns) AS gmm_ns_per_layer, avg(med_gmm_ns) AS median_rank_gmm_ns,
           avg(transfer_ns) FILTER (WHERE n_coll > 0) AS transfer_ns_per_layer,
           100.0 * sum(n_last) / greatest(sum(n_coll), 1) AS last_arrival_pct,
           sum(others_lag_ns) FILTER (WHERE n_last > 0) AS others_lag_ns
    FROM paired GROUP BY rank
),
-- One-sided sign test: p = P(Binomial(n, 1/2) >= k), summed in log space (exact for any n).
tests AS (
    SELECT *,
           list_sum(list_transform(range(k_tokens, n + 1), lambda j: exp(lgamma(n + 1) - lgamma(j + 1) - lgamma(n - j + 1) - n * ln(2)))) AS p_tokens,
           list_sum(list_transform(range(k_gmm, n + 1), lambda j: exp(lgamma(n + 1) - lgamma(j + 1) - lgamma(n - j + 1) - n * ln(2)))) AS p_gmm,
           CASE WHEN n_tr > 0 THEN list_sum(list_transform(range(k_tr, n_tr + 1), lambda j: exp(lgamma(n_tr + 1) - lgamma(j + 1) - lgamma(n_tr - j + 1) - n_tr * ln(2)))) END AS p_tr,
           $alpha / (SELECT n FROM n_ranks) AS alpha_rank
    FROM per_rank
),
classified AS (
    SELECT *,
           tokens_known AND p_tokens <= alpha_rank AND token_ratio >= $min_token_ratio
               AND p_gmm <= alpha_rank AS is_token_skew,
           (NOT tokens_known OR token_ratio <= $same_token_ratio)
               AND p_gmm <= alpha_rank AND gmm_ratio >= $min_compute_ratio AS is_slow_compute,
           (NOT tokens_known OR token_ratio <= $same_token_ratio)
               AND NOT (p_gmm <= alpha_rank AND gmm_ratio >= $min_compute_ratio)
               AND coalesce(p_tr <= alpha_rank AND transfer_ratio >= $min_comm_ratio, FALSE) AS is_slow_comm
    FROM tests
),
moe AS (SELECT sum(med_layer_ns) AS moe_ns FROM med),
findings AS (
    SELECT c.*,
           CASE WHEN is_token_skew THEN 'token-skew' WHEN is_slow_compute THEN 'slow-compute'
                ELSE 'slow-comm' END AS cause,
           CASE WHEN is_token_skew THEN greatest(p_tokens, p_gmm) WHEN is_slow_compute THEN p_gmm
                ELSE p_tr END AS p_value,
           CASE WHEN is_slow_comm THEN 100.0 * k_tr / n_tr ELSE 100.0 * k_gmm / n END AS above_pct,
           greatest(0, n * CASE WHEN is_slow_comm THEN med_transfer_excess_ns ELSE med_gmm_excess_ns END) AS cost_ns,
           moe.moe_ns
    FROM classified c, moe
    WHERE is_token_skew OR is_slow_compute OR is_slow_comm
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
-- Enough data to compare, or the reason there is not.
enough AS (
    SELECT CASE
               WHEN (SELECT n FROM n_ranks) < $min_ranks
                   THEN format('{} rank(s) with MoE layers in this run; comparing a rank with the median rank needs >= {}',
                               (SELECT n FROM n_ranks), $min_ranks)
               WHEN (SELECT count(*) FROM inst) < ceil(log2((SELECT n FROM n_ranks) / $alpha))
                   THEN format('{} MoE layer instance(s) that all {} ranks have; the sign test at alpha {} needs >= {} (profile more steps)',
                               (SELECT count(*) FROM inst), (SELECT n FROM n_ranks), $alpha,
                               ceil(log2((SELECT n FROM n_ranks) / $alpha))::INTEGER)
           END AS skip_reason
)
SELECT CASE WHEN round(100.0 * cost_ns / greatest(moe_ns, 1), 1) >= $min_cost_pct THEN 'FAIL' ELSE 'WARN' END AS level,
       rank, cause,
       round(cost_ns / 1e6, 3) AS cost_ms, round(100.0 * cost_ns / greatest(moe_ns, 1), 1) AS cost_pct,
       n AS layer_instances, round(above_pct, 1) AS above_pct, round(p_value, 6) AS p_value,
       round(tokens_per_layer, 1) AS tokens_per_layer, round(median_rank_tokens, 1) AS median_rank_tokens,
       round(token_ratio, 2) AS token_ratio,
       round(gmm_ns_per_layer / 1e3, 1) AS gmm_us_per_layer, round(median_rank_gmm_ns / 1e3, 1) AS median_rank_gmm_us,
       round(gmm_ratio, 2) AS gmm_ratio,
       round(transfer_ns_per_layer / 1e3, 1) AS transfer_us_per_layer, round(transfer_ratio, 2) AS transfer_ratio,
       round(last_arrival_pct, 1) AS last_arrival_pct, round(coalesce(others_lag_ns, 0) / 1e6, 3) AS others_wait_ms,
       cuts.left_out,
       CASE cause
           WHEN 'token-skew' THEN 'routing / expert placement imbalance: find the hot experts on this rank (expert-hotspots, ep-hot-chain), check the EPLB config and expert map, and the input distribution; rebalance or add redundant experts (eplb-whatif)'
           WHEN 'slow-compute' THEN 'same tokens but slower GroupedMatmul: a device or process anomaly on this card (health, clocks/thermals, CPU binding, co-located jobs); not a routing problem, do not rebalance experts'
           ELSE 'dispatch/combine transfer is slow on this rank while its tokens and compute are normal: check its links and NIC (HCCS/RoCE/NVLink), communication config (buffers, algorithm) and the network path'
       END AS next_step,
       NULL::VARCHAR AS skip_reason
FROM findings, cuts, enough
WHERE enough.skip_reason IS NULL
UNION ALL
SELECT 'SKIP', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, skip_reason
FROM enough WHERE skip_reason IS NOT NULL
ORDER BY level, cost_ms DESC NULLS LAST, rank   -- FAIL before WARN (a SKIP row is alone)
