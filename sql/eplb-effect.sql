-- name: eplb-effect
-- version: 1
-- description: Per EPLB update (expert-map epoch change): peak-to-average imbalance before and after, per layer and overall, and what stays hot.
-- requires: expert_load
-- param: min_gain DOUBLE = 0.05          -- an update must lower the mean peak-to-average ratio by this fraction; a layer that rises by more is flagged
-- param: hot_ratio DOUBLE = 2.0          -- hot expert: tokens >= hot_ratio x the layer's mean expert tokens (over the epoch)
-- param: rank_hot_ratio DOUBLE = 1.2     -- hot rank: tokens >= this x the layer's mean rank tokens (over the epoch)
-- verdict: fail if rows where not_reduced > 0; warn if rows where layer_worse > 0
-- role: verdict
-- priority: 60
-- order: 90
-- headline: {par_after} peak/avg after {update} (before {par_before}), {scope}{layer_txt} | still hot experts {still_hot_experts}; ranks {still_hot_ranks} | {update_cost_ms} ms update cost
-- summary: {update} {scope}{layer_txt}: peak/avg {par_before} -> {par_after} ({cause}); still hot experts: {still_hot_experts}; still hot ranks: {still_hot_ranks}; {update_cost_txt}; {next_step}
-- pass: No EPLB update in the run: the load windows span a single expert-map epoch (give per-epoch maps with ts_ns, or an epoch per window).
--
-- Method (EP guide step 4): windows are grouped by the EPLB epoch they ran under (see
-- _expert_windows). Each pair of consecutive epochs is one update. Per layer, the ranks' tokens
-- summed over the epoch's windows give par = max / mean (vLLM-Ascend's imbalance); overall =
-- mean of the layers' par (vLLM-Ascend's current_mean; max_par_* is its current_max).
-- Rows: one 'overall' row per update (FAIL when it did not lower the mean par by min_gain),
-- then one row per layer (WARN when a layer got more imbalanced by more than min_gain).
-- update_cost_ms: mean expert-weight update time from the `eplb:expert_weight_update:duration`
-- histogram (_sum / _count, latest scrape, worst DP), NULL without metrics.
WITH epochs AS (
    SELECT epoch, min(wseq) AS first_w, count(DISTINCT wseq) AS n_windows
    FROM _expert_windows WHERE run = $run AND epoch IS NOT NULL
    GROUP BY epoch
), updates AS (
    SELECT * FROM (
        SELECT lag(epoch) OVER (ORDER BY first_w) AS epoch_before, epoch AS epoch_after,
               lag(n_windows) OVER (ORDER BY first_w) AS windows_before, n_windows AS windows_after
        FROM epochs)
    WHERE epoch_before IS NOT NULL
), rank_ep AS (
    SELECT epoch, layer, ep_rank, sum(tokens) AS tokens
    FROM _expert_slot_load
    WHERE run = $run AND epoch IN (SELECT epoch_before FROM updates UNION SELECT epoch_after FROM updates)
    GROUP BY epoch, layer, ep_rank
), rank_ep_r AS (
    SELECT *, tokens / NULLIF(avg(tokens) OVER (PARTITION BY epoch, layer), 0) AS rank_ratio FROM rank_ep
), par_ep AS (
    SELECT epoch, layer, max(rank_ratio) AS par FROM rank_ep_r GROUP BY epoch, layer
), exp_ep AS (
    SELECT epoch, layer, expert, sum(tokens) AS tokens
    FROM _expert_slot_load
    WHERE run = $run AND epoch IN (SELECT epoch_before FROM updates UNION SELECT epoch_after FROM updates)
    GROUP BY epoch, layer, expert
), hot_exp AS (
    SELECT epoch, layer, expert FROM (
        SELECT *, tokens / NULLIF(avg(tokens) OVER (PARTITION BY epoch, layer), 0) AS hotness FROM exp_ep)
    WHERE hotness >= $hot_ratio
), hot_rank AS (
    SELECT epoch, layer, ep_rank FROM rank_ep_r WHERE rank_ratio >= $rank_hot_ratio
), cost AS (
    SELECT max(s / NULLIF(c, 0)) * 1000.0 AS update_cost_ms FROM (
        SELECT dp,
               arg_max(value, COALESCE(ts_ns, scrape)) FILTER (WHERE metric = 'eplb:expert_weight_update:duration_sum') AS s,
               arg_max(value, COALESCE(ts_ns, scrape)) FILTER (WHERE metric = 'eplb:expert_weight_update:duration_count') AS c
        FROM metric_samples
        WHERE run = $run AND metric IN ('eplb:expert_weight_update:duration_sum', 'eplb:expert_weight_update:duration_count')
        GROUP BY dp)
), per_layer AS (
    SELECT u.epoch_before, u.epoch_after, u.windows_before, u.windows_after, pb.layer,
           pb.par AS par_before, pa.par AS par_after,
           (SELECT string_agg(b.expert::VARCHAR, ',' ORDER BY b.expert) FROM hot_exp b
             WHERE b.epoch = u.epoch_before AND b.layer = pb.layer) AS hot_experts_before,
           (SELECT string_agg(a.expert::VARCHAR, ',' ORDER BY a.expert) FROM hot_exp a
             WHERE a.epoch = u.epoch_after AND a.layer = pb.layer) AS hot_experts_after,
           (SELECT string_agg(b.expert::VARCHAR, ',' ORDER BY b.expert) FROM hot_exp b JOIN hot_exp a
               ON a.epoch = u.epoch_after AND a.layer = b.layer AND a.expert = b.expert
             WHERE b.epoch = u.epoch_before AND b.layer = pb.layer) AS still_hot_experts,
           (SELECT string_agg(b.ep_rank::VARCHAR, ',' ORDER BY b.ep_rank) FROM hot_rank b JOIN hot_rank a
               ON a.epoch = u.epoch_after AND a.layer = b.layer AND a.ep_rank = b.ep_rank
             WHERE b.epoch = u.epoch_before AND b.layer = pb.layer) AS still_hot_ranks
    FROM updates u
    JOIN par_ep pb ON pb.epoch = u.epoch_before
    JOIN par_ep pa ON pa.epoch = u.epoch_after AND pa.layer = pb.layer
), overall AS (
    SELECT epoch_before, epoch_after, any_value(windows_before) AS windows_before,
           any_value(windows_after) AS windows_after, NULL::INTEGER AS layer,
           avg(par_before) AS par_before, avg(par_after) AS par_after,
           max(par_before) AS max_par_before, max(par_after) AS max_par_after,
           string_agg(layer || ':' || hot_experts_before, ' ' ORDER BY layer) AS hot_experts_before,
           string_agg(layer || ':' || hot_experts_after, ' ' ORDER BY layer) AS hot_experts_after,
           string_agg(layer || ':' || still_hot_experts, ' ' ORDER BY layer) AS still_hot_experts,
           (SELECT array_to_string(list(DISTINCT r ORDER BY r), ',')
              FROM (SELECT unnest(string_split(x.still_hot_ranks, ','))::INTEGER AS r FROM per_layer x
                    WHERE x.epoch_before = p.epoch_before AND x.epoch_after = p.epoch_after)) AS still_hot_ranks
    FROM per_layer p
    GROUP BY epoch_before, epoch_after
), rows_ AS (
    SELECT 'overall' AS scope, epoch_before, epoch_after, windows_before, windows_after, layer,
           par_before, par_after, max_par_before, max_par_after,
           hot_experts_before, hot_experts_after, still_hot_experts, still_hot_ranks,
           par_after > par_before * (1 - $min_gain) AS not_reduced, false AS layer_worse
    FROM overall
    UNION ALL
    SELECT 'layer', epoch_before, epoch_after, windows_before, windows_after, layer,
           par_before, par_after, par_before, par_after,
           hot_experts_before, hot_experts_after, still_hot_experts, still_hot_ranks,
           false, par_after > par_before * (1 + $min_gain)
    FROM per_layer
)
SELECT 'epoch ' || epoch_before || ' -> ' || epoch_after AS update, scope, layer,
       CASE WHEN layer IS NULL THEN '' ELSE ' ' || layer END AS layer_txt,
       epoch_before, epoch_after, windows_before, windows_after,
       round(par_before, 3) AS par_before, round(par_after, 3) AS par_after,
       round(max_par_before, 3) AS max_par_before, round(max_par_after, 3) AS max_par_after,
       round(100.0 * (par_after - par_before) / NULLIF(par_before, 0), 1) AS change_pct,
       COALESCE(hot_experts_before, '-') AS hot_experts_before,
       COALESCE(hot_experts_after, '-') AS hot_experts_after,
       COALESCE(still_hot_experts, '-') AS still_hot_experts,
       COALESCE(still_hot_ranks, '-') AS still_hot_ranks,
       round((SELECT update_cost_ms FROM cost), 1) AS update_cost_ms,
       COALESCE('update cost ' || round((SELECT update_cost_ms FROM cost), 1) || ' ms',
                'update cost unknown (no eplb:expert_weight_update:duration metric)') AS update_cost_txt,
       not_reduced, layer_worse,
       CASE
           WHEN not_reduced AND still_hot_ranks IS NOT NULL THEN 'update did not reduce imbalance; the same ranks stay hot'
           WHEN not_reduced THEN 'update did not reduce imbalance; the hot spot moved to other ranks'
           WHEN layer_worse THEN 'layer more imbalanced after the update'
           WHEN par_after < par_before * (1 - $min_gain) AND still_hot_experts IS NOT NULL
               THEN 'imbalance reduced; the same experts stay hot but on better-spread ranks'
           WHEN par_after < par_before * (1 - $min_gain) THEN 'imbalance reduced'
           ELSE 'no significant change'
       END AS cause,
       CASE
           WHEN not_reduced OR layer_worse THEN 'check the EPLB config (eplb_policy_type, algorithm_execution_interval, expert_heat_collection_interval, num_redundant_experts), that the expert map in use is the planned one, and whether the request input distribution changed'
           WHEN par_after >= par_before * (1 - $min_gain) THEN 'nothing to do when the layer was already balanced (par near 1); otherwise read it with the overall row of this update'
           ELSE 'EPLB works here; weigh update_cost_ms against the MoE time it saves (eplb-whatif) when tuning the update interval'
       END AS next_step
FROM rows_
ORDER BY epoch_before, epoch_after, scope = 'layer', not_reduced DESC, layer_worse DESC, layer
