-- name: moe-layer-durations
-- version: 1
-- description: Per rank and MoE layer: how many instances and their mean, p50, p99 and max duration.
-- requires: moe_layers
-- verdict: none
-- role: report
-- order: 10
-- shows: compare
-- headline: rank | layer | instances | p50_us | p99_us | max_us
-- summary: rank {rank} layer {layer}: p50 {p50_us} us, p99 {p99_us} us over {instances} instances

SELECT rank, layer, count(*) AS instances,
       round(avg(dur_ns) / 1e3, 1) AS mean_us,
       round(quantile_cont(dur_ns, 0.5) / 1e3, 1) AS p50_us,
       round(quantile_cont(dur_ns, 0.99) / 1e3, 1) AS p99_us,
       round(max(dur_ns) / 1e3, 1) AS max_us
FROM moe_layers
WHERE run = $run
GROUP BY rank, layer
ORDER BY rank, layer
