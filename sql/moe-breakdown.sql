-- name: moe-breakdown
-- version: 2
-- description: Per rank (or rank and layer): GroupedMatmul, dispatch, combine, gating, overlap and other time inside MoE layers, shares adding up to 100 %, wait and tokens.
-- requires: moe_layer_facts
-- param: by_layer BOOLEAN = false   -- one row per (rank, layer) instead of per rank
-- verdict: none
-- role: report
-- order: 20
-- shows: report.moe, compare
-- headline: rank | layer | moe_ms | gmm_pct | dispatch_pct | combine_pct | wait_pct
-- summary: rank {rank}: GroupedMatmul {gmm_pct}%, dispatch {dispatch_pct}%, combine {combine_pct}%, gating {gating_pct}%, overlap {overlap_pct}%, other {other_pct}%, waiting {wait_pct}% of {moe_ms} ms

-- The class columns are the time when ONLY that class runs; overlap_ms is the time two or more
-- classes run at once (a combine on the communication stream beside the next GroupedMatmul);
-- other_ms the rest of the layer. So the six add up to moe_ms and the six shares to 100 %
-- (nested or concurrent operations of one class count once: moe_layer_facts).
-- dispatch/combine include the collectives inside them, and so the time spent waiting for the
-- slowest rank: wait_ms (time this rank waited for the last arrival) shows how much of it that
-- is; it is part of dispatch/combine, not a seventh share.
WITH f AS (
    SELECT f.*, coalesce(c.arrival_lag_ns, 0) AS lag_ns
    FROM moe_layer_facts f
    LEFT JOIN _layer_collectives c USING (run, rank, source_id, step, layer, occurrence)
    WHERE f.run = $run
),
g AS (
    SELECT rank, CASE WHEN $by_layer THEN layer END AS layer, count(*) AS layer_instances,
           sum(layer_ns) AS moe_ns, sum(gmm_excl_ns) AS gmm_ns, sum(dispatch_excl_ns) AS dispatch_ns,
           sum(combine_excl_ns) AS combine_ns, sum(gating_excl_ns) AS gating_ns,
           sum(overlap_ns) AS overlap_ns, sum(other_ns) AS other_ns, sum(lag_ns) AS wait_ns,
           sum(tokens) AS tokens
    FROM f GROUP BY ALL
)
SELECT rank, layer, layer_instances,
       round(moe_ns / 1e6, 3) AS moe_ms,
       round(gmm_ns / 1e6, 3) AS gmm_ms,
       round(dispatch_ns / 1e6, 3) AS dispatch_ms,
       round(combine_ns / 1e6, 3) AS combine_ms,
       round(gating_ns / 1e6, 3) AS gating_ms,
       round(overlap_ns / 1e6, 3) AS overlap_ms,
       round(other_ns / 1e6, 3) AS other_ms,
       round(wait_ns / 1e6, 3) AS wait_ms,
       round(100.0 * gmm_ns / nullif(moe_ns, 0), 1) AS gmm_pct,
       round(100.0 * dispatch_ns / nullif(moe_ns, 0), 1) AS dispatch_pct,
       round(100.0 * combine_ns / nullif(moe_ns, 0), 1) AS combine_pct,
       round(100.0 * gating_ns / nullif(moe_ns, 0), 1) AS gating_pct,
       round(100.0 * overlap_ns / nullif(moe_ns, 0), 1) AS overlap_pct,
       round(100.0 * other_ns / nullif(moe_ns, 0), 1) AS other_pct,
       round(100.0 * wait_ns / nullif(moe_ns, 0), 1) AS wait_pct,
       CAST(tokens AS BIGINT) AS tokens
FROM g
ORDER BY rank, layer
