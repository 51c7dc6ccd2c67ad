-- name: expert-heatmap
-- version: 1
-- description: Per MoE layer and expert slot (rank, local slot) under the latest EPLB epoch: the expert it holds and its mean and peak hotness over the load windows.
-- requires: expert_load
-- verdict: none
-- role: report
-- order: 150
-- shows: report.experts
-- headline: layer | ep_rank | local_slot | expert | mean_hotness | peak_hotness
-- summary: layer {layer} rank {ep_rank} slot {local_slot} (expert {expert}): hotness mean {mean_hotness}, peak {peak_hotness} over {windows} windows

-- The grid behind the report's expert heat map: layer x expert, grouped by the rank that holds
-- each expert. Slots are physical, so the grid is the same for every layer even when each layer
-- places its experts differently; `expert` says which logical expert sits in the slot.
-- Only windows of the latest epoch count (one expert map, so a slot holds one expert).
-- hotness = the slot's tokens / the layer's mean tokens per logical expert in that window (a
-- replicated expert's slots each show their own share).
WITH w AS (
    SELECT wseq, epoch FROM _expert_windows WHERE run = $run
),
latest AS (
    SELECT epoch FROM w ORDER BY wseq DESC LIMIT 1
),
slots AS (
    SELECT s.wseq, s.layer, s.ep_rank, s.local_slot, any_value(s.expert) AS expert, sum(s.tokens) AS tokens
    FROM _expert_slot_load s
    WHERE s.run = $run AND s.epoch IS NOT DISTINCT FROM (SELECT epoch FROM latest)
    GROUP BY s.wseq, s.layer, s.ep_rank, s.local_slot
),
layer_mean AS (
    SELECT wseq, layer, sum(tokens) / count(DISTINCT expert) AS mean_expert_tokens
    FROM slots GROUP BY wseq, layer
),
replicas AS (
    SELECT layer, expert, count(DISTINCT (ep_rank, local_slot)) AS replicas FROM slots GROUP BY layer, expert
)
SELECT s.layer, s.ep_rank, s.local_slot, any_value(s.expert) AS expert,
       any_value(r.replicas) AS replicas,
       count(*) AS windows,
       round(avg(s.tokens / nullif(m.mean_expert_tokens, 0)), 3) AS mean_hotness,
       round(max(s.tokens / nullif(m.mean_expert_tokens, 0)), 3) AS peak_hotness,
       round(avg(s.tokens), 1) AS mean_slot_tokens,
       (SELECT epoch FROM latest) AS epoch
FROM slots s
JOIN layer_mean m USING (wseq, layer)
JOIN replicas r ON r.layer = s.layer AND r.expert = s.expert
GROUP BY s.layer, s.ep_rank, s.local_slot
ORDER BY s.layer, s.ep_rank, s.local_slot
