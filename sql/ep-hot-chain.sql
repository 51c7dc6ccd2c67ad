-- name: ep-hot-chain
-- version: 1
-- description: Hot expert -> the rank that holds it -> that rank's GroupedMatmul and dispatch/combine time; EP imbalance only when all three coincide.
-- requires: expert_load, moe_layer_facts
-- param: min_hotness DOUBLE = 2.0      -- an expert is hot at this load / mean expert load of its layer
-- param: min_rank_ratio DOUBLE = 1.3   -- a rank is hot when its experts' summed load is this x the layer's mean rank
-- param: min_op_ratio DOUBLE = 1.3     -- a rank's operator time is slow at this x the median rank (GroupedMatmul or dispatch+combine)
-- param: min_share DOUBLE = 0.5        -- share of windows (load side) / layer instances (trace side) a condition must hold in
-- verdict: fail if rows where coincide > 0; warn if rows > 0
-- role: verdict
-- subject: rank as ep_rank
-- priority: 10
-- order: 120
-- shows: report.moe, annotate
-- headline: {n_hot_experts} hot experts: {hot_experts} | rank load {rank_load_ratio}x the mean rank's | GroupedMatmul {gmm_ratio}x, dispatch+combine {comm_ratio}x the median rank's
-- summary: {subject}: {finding} (hot experts {hot_experts}; rank load {rank_load_ratio}x mean rank; GroupedMatmul {gmm_ratio}x, dispatch+combine {comm_ratio}x median rank); next: {next_step}
-- pass: No hot expert, hot rank or slow MoE operator persists (hotness >= {min_hotness}, rank load >= {min_rank_ratio}x, operator >= {min_op_ratio}x in >= {min_share} of the time).

-- Load side: how often each EP rank is hot, and which experts make it hot.
WITH rank_load AS (
    SELECT ep_rank, avg(rank_ratio) AS rank_load_ratio,
           avg(CASE WHEN rank_ratio >= $min_rank_ratio THEN 1 ELSE 0 END) AS hot_share
    FROM _expert_rank_load WHERE run = $run GROUP BY ep_rank
),
hot_experts AS (
    SELECT main_rank AS ep_rank, layer, expert, avg(hotness) AS hotness,
           count(*) / (SELECT count(DISTINCT wseq) FROM _expert_logical_load WHERE run = $run) AS share
    FROM _expert_logical_load
    WHERE run = $run AND hotness >= $min_hotness
    GROUP BY ALL
),
persistent_hot AS (SELECT * FROM hot_experts WHERE share >= $min_share),
experts_by_rank AS (
    SELECT ep_rank, count(*) AS n_hot_experts,
           -- the five hottest, then how many more
           array_to_string(list_slice(list('L' || layer || '/E' || expert || ' ' || round(hotness, 1) || 'x'
                                           ORDER BY hotness DESC, layer, expert), 1, 5), ', ')
               || CASE WHEN count(*) > 5 THEN ' (+' || (count(*) - 5) || ' more)' ELSE '' END AS hot_experts
    FROM persistent_hot GROUP BY ep_rank
),
-- Trace side: each rank's operator time against the median rank of the same layer instance.
-- The EP rank of a trace is sources.ep_rank when known (vLLM folder names), else its rank.
facts AS (
    SELECT f.*, coalesce(s.ep_rank, f.rank) AS ep_rank, f.dispatch_ns + f.combine_ns AS comm_ns
    FROM moe_layer_facts f JOIN sources s USING (source_id)
    WHERE f.run = $run AND f.rank IS NOT NULL
),
med AS (
    SELECT step, layer, occurrence, median(gmm_ns) AS med_gmm, median(comm_ns) AS med_comm
    FROM facts GROUP BY ALL HAVING count(DISTINCT rank) > 1
),
ops AS (
    SELECT f.ep_rank,
           median(f.gmm_ns / greatest(m.med_gmm, 1)) AS gmm_ratio,
           median(f.comm_ns / greatest(m.med_comm, 1)) AS comm_ratio,
           avg(CASE WHEN f.gmm_ns >= $min_op_ratio * m.med_gmm THEN 1 ELSE 0 END) AS slow_share
    FROM facts f JOIN med m USING (step, layer, occurrence)
    GROUP BY f.ep_rank
),
joined AS (
    SELECT coalesce(r.ep_rank, o.ep_rank) AS rank, r.rank_load_ratio, r.hot_share,
           coalesce(e.n_hot_experts, 0) AS n_hot_experts, e.hot_experts,
           o.gmm_ratio, o.comm_ratio, o.slow_share,
           coalesce(r.hot_share >= $min_share, FALSE) AS hot_rank,
           coalesce(o.slow_share >= $min_share, FALSE) AS slow_ops
    FROM rank_load r FULL JOIN ops o ON r.ep_rank = o.ep_rank
    LEFT JOIN experts_by_rank e ON e.ep_rank = coalesce(r.ep_rank, o.ep_rank)
),
findings AS (
    SELECT 'rank ' || rank AS subject, rank,
           CASE WHEN hot_rank AND slow_ops THEN 'ep-imbalance'
                WHEN slow_ops THEN 'device-anomaly'
                ELSE 'hot-rank-not-slow' END AS finding,
           hot_rank AND slow_ops AS coincide,
           n_hot_experts, hot_experts, round(rank_load_ratio, 2) AS rank_load_ratio,
           round(hot_share, 2) AS hot_share, round(gmm_ratio, 2) AS gmm_ratio,
           round(comm_ratio, 2) AS comm_ratio, round(slow_share, 2) AS slow_share
    FROM joined WHERE hot_rank OR slow_ops
    UNION ALL
    -- Hot experts that do not make any rank hot: spread out, they cost little.
    SELECT 'experts spread over ' || count(DISTINCT ep_rank) || ' ranks', NULL, 'hot-experts-spread', FALSE,
           count(*),
           array_to_string(list_slice(list('L' || layer || '/E' || expert || ' on rank ' || ep_rank
                                           ORDER BY hotness DESC, layer, expert), 1, 5), ', ')
               || CASE WHEN count(*) > 5 THEN ' (+' || (count(*) - 5) || ' more)' ELSE '' END,
           NULL, NULL, NULL, NULL, NULL
    FROM persistent_hot
    WHERE ep_rank NOT IN (SELECT rank FROM joined WHERE hot_rank AND rank IS NOT NULL)
    HAVING count(*) > 0
)
SELECT subject, rank, finding, coincide, n_hot_experts, hot_experts, rank_load_ratio, hot_share,
       gmm_ratio, comm_ratio, slow_share,
       CASE finding
           WHEN 'ep-imbalance' THEN 'EP load imbalance confirmed: hot experts, hot rank and slow MoE operator coincide; rebalance (EPLB / expert map / redundant replicas of these experts), then re-check with eplb-effect'
           WHEN 'device-anomaly' THEN 'this rank is slow with NO hot expert: a device or process problem (health, clocks, binding, co-located load), not routing; do not rebalance experts'
           WHEN 'hot-rank-not-slow' THEN 'hot experts on this rank do not (yet) slow its operators: watch it; rebalance only if its MoE time grows'
           ELSE 'hot experts are spread over many ranks: little imbalance; no re-placement needed for them'
       END AS next_step
FROM findings
ORDER BY coincide DESC, finding, rank NULLS LAST
