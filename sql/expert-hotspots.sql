-- name: expert-hotspots
-- version: 2
-- description: Top hot experts by layer, rank and expert: persistent or a spike, concentrated on few ranks or spread.
-- requires: expert_load
-- param: hot_ratio DOUBLE = 2.0          -- an expert is hot in a window when its tokens >= hot_ratio x the layer's mean expert tokens
-- param: min_windows INTEGER = 3         -- persistent = hot in at least this many windows and in at least half of them
-- param: few_ranks_share DOUBLE = 0.25   -- hot experts are concentrated when they sit on <= max(1, floor(share x ranks)) ranks
-- param: rank_hot_ratio DOUBLE = 1.2     -- a rank is hot in a layer when its tokens >= this x the layer's mean rank tokens
-- param: top_n INTEGER = 20              -- keep the N worst hot experts
-- verdict: fail if rows where concentrated_hot_spot > 0; warn if rows where persistent > 0
-- role: verdict
-- subject: expert, layer
-- priority: 50
-- order: 80
-- shows: report.experts
-- headline: on rank {ep_rank} | {peak_hotness}x the layer's mean expert load at peak (mean {mean_hotness}x) | hot in {hot_windows} of {n_windows} windows | {layer_hot_ranks} rank(s) hold the layer's hot experts
-- summary: layer {layer} expert {expert} on rank {ep_rank}: {cause} ({peak_hotness}x layer mean, hot in {hot_windows}/{n_windows} windows; {layer_hot_ranks} rank(s) hold the layer's hot experts; rank {ep_rank} hot in {rank_hot_layers}/{n_layers} layers); {next_step}
-- pass: No expert is hot (>= {hot_ratio}x its layer's mean) in any window.
--
-- Method (EP guide steps 2-3): per window and layer, hotness = logical expert tokens / mean
-- expert tokens of the layer (replicas summed; logical ids from the expert map of the window's
-- EPLB epoch, else rank * slots + slot). A hot spot is PERSISTENT when hot in >= min_windows
-- windows and in at least half of the run's windows, else a spike (input fluctuation).
-- It is CONCENTRATED in a window when the layer's hot experts sit on few ranks and the rank
-- holding it is itself hot (rank_ratio >= rank_hot_ratio). FAIL: persistent, concentrated in
-- >= min_windows windows and still concentrated in its latest hot window (a working EPLB update
-- that spread it turns the finding into a WARN). WARN: persistent but spread.
-- An expert whose mean hot load is at least a rank's fair share (hotness >= experts / ranks of the
-- layer) outweighs any rank it sits on: moving it cannot balance the layer, only replicas can
-- (outweighs_rank; the next step says so, as eplb-whatif's replicate option does).
WITH lg AS MATERIALIZED (
    SELECT * FROM _expert_logical_load WHERE run = $run
), rk AS MATERIALIZED (
    SELECT * FROM _expert_rank_load WHERE run = $run
), n_win AS (
    SELECT count(DISTINCT wseq) AS n_windows, count(DISTINCT layer) AS n_layers FROM lg
), hot AS (
    SELECT * FROM (SELECT wseq, layer, expert, tokens, hotness,
                          count(*) OVER (PARTITION BY wseq, layer) AS n_experts FROM lg)
    WHERE hotness >= $hot_ratio
), holders AS (           -- every rank holding a hot expert (a replicated expert has several)
    SELECT h.wseq, h.layer, h.expert, s.ep_rank, r.rank_ratio, r.n_ranks
    FROM hot h
    JOIN _expert_slot_load s ON s.run = $run AND s.wseq = h.wseq AND s.layer = h.layer AND s.expert = h.expert
    JOIN rk r ON r.wseq = s.wseq AND r.layer = s.layer AND r.ep_rank = s.ep_rank
), layer_spread AS (      -- per window and layer: how many ranks hold its hot experts
    SELECT wseq, layer, count(DISTINCT ep_rank) AS hot_ranks, any_value(n_ranks) AS n_ranks
    FROM holders GROUP BY wseq, layer
), hot_w AS (
    SELECT h.wseq, h.layer, h.expert, h.hotness, h.tokens, h.n_experts, ls.hot_ranks, ls.n_ranks,
           arg_max(ho.ep_rank, ho.rank_ratio) AS ep_rank,
           max(ho.rank_ratio) AS rank_ratio,
           ls.hot_ranks <= greatest(1, floor($few_ranks_share * ls.n_ranks))
             AND max(ho.rank_ratio) >= $rank_hot_ratio AS concentrated
    FROM hot h
    JOIN holders ho USING (wseq, layer, expert)
    JOIN layer_spread ls USING (wseq, layer)
    GROUP BY h.wseq, h.layer, h.expert, h.hotness, h.tokens, h.n_experts, ls.hot_ranks, ls.n_ranks
), rank_layers AS (       -- ranks hot across many layers (hot in at least half the windows of a layer)
    SELECT ep_rank, count(*) FILTER (WHERE hot_share >= 0.5) AS rank_hot_layers
    FROM (SELECT ep_rank, layer, avg(CASE WHEN rank_ratio >= $rank_hot_ratio THEN 1 ELSE 0 END) AS hot_share
          FROM rk GROUP BY ep_rank, layer)
    GROUP BY ep_rank
), per_expert AS (
    SELECT layer, expert,
           count(*) AS hot_windows,
           max(hotness) AS peak_hotness,
           avg(hotness) AS mean_hotness,
           avg(hotness * n_ranks / n_experts) >= 1 AS outweighs_rank,
           avg(tokens) AS mean_hot_tokens,
           count(*) FILTER (WHERE concentrated) AS concentrated_windows,
           arg_max(concentrated, wseq) AS concentrated_now,
           arg_max(ep_rank, wseq) AS ep_rank,
           array_to_string(list(DISTINCT ep_rank ORDER BY ep_rank), ',') AS ep_ranks_seen,
           arg_max(hot_ranks, wseq) AS layer_hot_ranks,
           arg_max(n_ranks, wseq) AS n_ranks,
           max(rank_ratio) AS peak_rank_ratio,
           min(wseq) AS first_window, max(wseq) AS last_window
    FROM hot_w GROUP BY layer, expert
), judged AS (
    SELECT p.*, n.n_windows, n.n_layers, COALESCE(rl.rank_hot_layers, 0) AS rank_hot_layers,
           (p.hot_windows >= $min_windows AND p.hot_windows * 2 >= n.n_windows) AS persistent
    FROM per_expert p CROSS JOIN n_win n LEFT JOIN rank_layers rl USING (ep_rank)
), flagged AS (
    SELECT *, persistent AND concentrated_windows >= $min_windows AND concentrated_now AS concentrated_hot_spot
    FROM judged
)
SELECT layer, expert, ep_rank, ep_ranks_seen,
       round(peak_hotness, 3) AS peak_hotness, round(mean_hotness, 3) AS mean_hotness,
       round(mean_hot_tokens, 1) AS mean_hot_tokens,
       hot_windows, n_windows, first_window, last_window,
       layer_hot_ranks, n_ranks, round(peak_rank_ratio, 3) AS peak_rank_ratio,
       concentrated_windows, rank_hot_layers, n_layers,
       persistent, concentrated_hot_spot, outweighs_rank,
       CASE
           WHEN concentrated_hot_spot THEN 'persistent hot experts concentrated on few ranks (EP load imbalance)'
           WHEN persistent AND concentrated_windows > 0 THEN 'persistent hot expert, no longer concentrated (spread over ranks now)'
           WHEN persistent THEN 'persistent hot expert spread over many ranks'
           WHEN n_windows < $min_windows THEN 'hot, but too few windows to tell a persistent hot spot from a spike'
           ELSE 'short-lived spike (input fluctuation)'
       END AS cause,
       CASE
           WHEN persistent AND outweighs_rank THEN 'this expert alone carries more than a rank''s fair share, so moving it cannot balance the layer: replicate it (EPLB redundant experts, see the replicate option of eplb-whatif); confirm that rank '
                || ep_rank || ' is slow in GroupedMatmul / dispatch-combine (ep-hot-chain)'
           WHEN concentrated_hot_spot THEN 'spread the hot experts over more ranks: enable or tune EPLB (update interval, heat window, redundant experts) or change the expert map; confirm that rank '
                || ep_rank || ' is slow in GroupedMatmul / dispatch-combine (ep-hot-chain)'
           WHEN persistent THEN 'limited EP impact while the rank loads stay even; replicate the hottest experts (num_redundant_experts) if MoE time still rises'
           ELSE 'observe more windows before acting; act only if decode latency rises together with it'
       END AS next_step
FROM flagged
QUALIFY row_number() OVER (ORDER BY concentrated_hot_spot DESC, persistent DESC, peak_hotness DESC, layer, expert) <= $top_n
ORDER BY concentrated_hot_spot DESC, persistent DESC, peak_hotness DESC, layer, expert
