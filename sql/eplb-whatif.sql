-- name: eplb-whatif
-- version: 1
-- description: The imbalance a greedy balanced expert re-placement would reach from the measured loads, and the share of MoE time it would save.
-- requires: expert_load
-- param: min_saving DOUBLE = 0.10        -- warn when re-placing the experts would save at least this share of MoE time
-- verdict: warn if rows where worth_rebalancing > 0
-- role: verdict
-- priority: none
-- order: 100
-- summary: {scope}{layer_txt}: peak/avg {current_par} now -> {greedy_par} after a greedy re-placement, {saved_pct}% of MoE time saved ({windows} windows of epoch {epoch_txt}); {next_step}
-- pass: No expert-load windows for this run.
--
-- Method: the loads of the placement in force now (all windows of the EPLB epoch of the run's
-- latest window) are summed per logical expert (replicas merged) and per rank. The greedy
-- re-placement, per layer: experts sorted by load (descending, ties by id), each put on the
-- currently least-loaded rank that still has a free slot (slots per rank as measured; ties to
-- the lowest rank). It places each logical expert once: redundant replicas and DeepSeek EPLB's
-- hierarchical (node, group) policy are not modelled, so a real EPLB with replicas can do better.
-- MoE time of a layer is taken as proportional to its busiest rank's tokens, so
-- saved = 1 - sum(new max) / sum(current max) over layers, where a layer the greedy cannot
-- improve keeps its current placement (new max = least(greedy max, current max)).
-- Rows: one 'overall' row (WARN when saved >= min_saving), then one row per layer.
WITH RECURSIVE wins AS MATERIALIZED (
    SELECT wseq, epoch FROM _expert_windows WHERE run = $run
), last_w AS (
    SELECT epoch FROM wins WHERE wseq = (SELECT max(wseq) FROM wins)
), win AS (
    SELECT wseq FROM wins WHERE epoch IS NOT DISTINCT FROM (SELECT any_value(epoch) FROM last_w)
), lg AS (            -- straight from the slots: one aggregation, no per-window hotness needed
    SELECT layer, expert, sum(tokens) AS tokens
    FROM _expert_slot_load WHERE run = $run AND wseq IN (SELECT wseq FROM win)
    GROUP BY layer, expert
), rk AS (
    SELECT layer, ep_rank, sum(tokens) AS tokens, count(DISTINCT local_slot) AS slots
    FROM _expert_slot_load WHERE run = $run AND wseq IN (SELECT wseq FROM win)
    GROUP BY layer, ep_rank
), shape AS MATERIALIZED (  -- per layer: ranks, slots per rank, current peak, and the expert loads heaviest first
    SELECT r.layer, count(*)::INTEGER AS n_ranks, max(r.slots)::INTEGER AS cap,
           max(r.tokens) AS current_max, avg(r.tokens) AS mean_rank_tokens, any_value(e.ws) AS ws
    FROM rk r
    JOIN (SELECT layer, list(tokens::DOUBLE ORDER BY tokens DESC, expert) AS ws FROM lg GROUP BY layer) e USING (layer)
    GROUP BY r.layer
), greedy(layer, k, loads, counts) AS (
    SELECT layer, 0::BIGINT, list_transform(range(n_ranks), lambda i: 0.0::DOUBLE),
           list_transform(range(n_ranks), lambda i: 0::INTEGER)
    FROM shape
    UNION ALL
    SELECT layer, k,
           list_transform(range(len(loads)), lambda i: loads[i + 1] + CASE WHEN i + 1 = pick THEN w ELSE 0.0 END),
           list_transform(range(len(counts)), lambda i: counts[i + 1] + CASE WHEN i + 1 = pick THEN 1 ELSE 0 END)
    FROM (
        SELECT g.layer, g.k + 1 AS k, sh.ws[g.k + 1] AS w, g.loads, g.counts,
               list_position(
                   list_transform(range(len(g.loads)), lambda i: CASE WHEN g.counts[i + 1] < sh.cap THEN g.loads[i + 1] ELSE 'inf'::DOUBLE END),
                   list_min(list_transform(range(len(g.loads)), lambda i: CASE WHEN g.counts[i + 1] < sh.cap THEN g.loads[i + 1] ELSE 'inf'::DOUBLE END))
               ) AS pick
        FROM greedy g
        JOIN shape sh ON sh.layer = g.layer
        WHERE g.k < len(sh.ws)
    )
), final AS (
    SELECT layer, list_max(loads) AS greedy_max
    FROM greedy
    QUALIFY k = max(k) OVER (PARTITION BY layer)
), per_layer AS (
    SELECT sh.layer, sh.n_ranks, sh.cap, sh.current_max, sh.mean_rank_tokens, f.greedy_max,
           least(f.greedy_max, sh.current_max) AS new_max
    FROM shape sh JOIN final f USING (layer)
), result AS (
    SELECT 'overall' AS scope, NULL::INTEGER AS layer,
           avg(current_max / NULLIF(mean_rank_tokens, 0)) AS current_par,
           avg(new_max / NULLIF(mean_rank_tokens, 0)) AS greedy_par,
           1 - sum(new_max) / NULLIF(sum(current_max), 0) AS saved_share,
           sum(current_max) AS current_max_tokens, sum(new_max) AS new_max_tokens,
           max(n_ranks) AS n_ranks, max(cap) AS slots_per_rank
    FROM per_layer
    UNION ALL
    SELECT 'layer', layer, current_max / NULLIF(mean_rank_tokens, 0), new_max / NULLIF(mean_rank_tokens, 0),
           1 - new_max / NULLIF(current_max, 0), current_max, new_max, n_ranks, cap
    FROM per_layer
)
SELECT scope, layer, CASE WHEN layer IS NULL THEN '' ELSE ' ' || layer END AS layer_txt,
       (SELECT any_value(epoch) FROM last_w) AS epoch,
       COALESCE((SELECT any_value(epoch) FROM last_w)::VARCHAR, 'unknown') AS epoch_txt,
       (SELECT count(*) FROM win) AS windows,
       n_ranks, slots_per_rank,
       round(current_par, 3) AS current_par, round(greedy_par, 3) AS greedy_par,
       round(saved_share, 4) AS saved_share, round(100 * saved_share, 1) AS saved_pct,
       round(current_max_tokens, 1) AS current_max_tokens, round(new_max_tokens, 1) AS new_max_tokens,
       scope = 'overall' AND saved_share >= $min_saving AS worth_rebalancing,
       CASE
           WHEN scope = 'overall' AND saved_share >= $min_saving THEN 're-balancing pays: a balanced placement would cut the busiest rank''s load'
           WHEN scope = 'overall' THEN 'the current placement is close to what a re-placement can reach'
           ELSE 'per-layer detail'
       END AS cause,
       CASE
           WHEN scope = 'overall' AND saved_share >= $min_saving THEN 'enable EPLB or shorten its update interval, or load a re-balanced expert map; check eplb-effect after the next update'
           WHEN scope = 'overall' THEN 'no re-placement needed; if MoE time is still high, look at the slow rank''s device (ep-hot-chain) rather than the routing'
           ELSE 'layers with the largest saving gain most from re-placement'
       END AS next_step
FROM result
ORDER BY scope = 'layer', saved_share DESC, layer
