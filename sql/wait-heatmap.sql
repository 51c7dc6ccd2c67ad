-- name: wait-heatmap
-- version: 1
-- description: Per rank and MoE layer instance (step, layer): how long the rank waited for the last arrival at its collectives, its wait inside them, and how often it was the last to arrive.
-- requires: _layer_collectives
-- verdict: none
-- role: report
-- order: 160
-- shows: report.waits
-- headline: step | layer | rank | arrival_lag_ms | n_arrived_last | n_collectives
-- summary: rank {rank} step {step} layer {layer}: waited {arrival_lag_ms} ms for the last arrival, arrived last at {n_arrived_last} of {n_collectives} collectives

-- The grid behind the report's rank x step heat map. The slow card shows as the rank that
-- arrives last (n_arrived_last high) and waits least (arrival_lag_ms low) while the others wait.
-- Repeated instances of one (step, layer) (occurrence > 0) are summed into it.
SELECT step, layer, rank,
       sum(n_collectives) AS n_collectives,
       sum(n_arrived_last) AS n_arrived_last,
       round(sum(arrival_lag_ns) / 1e6, 3) AS arrival_lag_ms,
       round(sum(wait_ns) / 1e6, 3) AS wait_ms,
       round(max(max_arrival_skew_ns) / 1e6, 3) AS max_arrival_skew_ms
FROM _layer_collectives
WHERE run = $run
GROUP BY step, layer, rank
ORDER BY step, layer, rank
