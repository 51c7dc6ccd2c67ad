-- name: eplb-converged
-- version: 1
-- description: Did the new expert placement converge? Per layer, before (the previous EPLB epoch, or the run before_run) vs after (the run's latest epoch): peak/avg, tokens on the busiest ranks, the hot rank's GroupedMatmul and dispatch/combine time; converged or not, with the layers that did not.
-- requires: expert_load
-- param: before_run VARCHAR = ''        -- the run before the change (`compare RUN_A RUN_B` sets it to RUN_A); empty: the previous EPLB epoch of this run
-- param: min_gain DOUBLE = 0.05         -- a layer converged when its peak/avg fell by at least this share...
-- param: balanced_par DOUBLE = 1.2      -- ...or is at most this after (balanced: nothing left to fall)
-- param: few_ranks_share DOUBLE = 0.125 -- concentration: share of a layer's tokens on its busiest max(1, floor(this x ranks)) ranks
-- verdict: fail if rows where not_converged > 0
-- role: verdict
-- priority: none
-- order: 95
-- headline: scope | layer | {verdict} | {par_after} peak/avg after (before {par_before}) | {top_share_after_pct} % of tokens on the busiest ranks (before {top_share_before_pct}) | peak rank {peak_rank_after} (hot rank before {hot_rank}) | GroupedMatmul {gmm_change_pct} % on the hot rank | dispatch+combine {comm_change_pct} %
-- summary: {scope}{layer_txt} {verdict} ({before} -> {after}): peak/avg {par_before} -> {par_after}; {cause}{layers_txt}; {next_step}
-- pass: Every layer converged, or nothing to compare: the run has one EPLB epoch and no before_run was given (`slowcard compare BEFORE AFTER` gives it).
--
-- The question after a new expert map (the EP guide: "watch whether the hot-spot distribution
-- converges and MoE operator / communication time falls"). After = the windows of the run's
-- latest EPLB epoch (see _expert_windows); before = the windows of the epoch before it in the
-- same run (a `watch` across an EPLB update), or, with before_run, the latest epoch of that run
-- (two runs: `compare` passes it; the query then reads both runs).
-- Per layer and side, the ranks' tokens summed over the side's windows give par = max / mean
-- (vLLM-Ascend's imbalance, as eplb-effect) and top_share = the tokens on the busiest
-- k = max(1, floor(few_ranks_share x ranks)) ranks over all tokens (concentration on few ranks:
-- 1 / 8 of the ranks; an even layer has top_share near few_ranks_share).
-- A layer CONVERGED when par_after <= max(par_before x (1 - min_gain), balanced_par): the
-- imbalance fell, or nothing is left to fall. NOT CONVERGED otherwise: the cause says whether the
-- same rank stays the peak or the hot spot moved to another rank (a hot expert moved whole onto
-- another single rank moves the peak without lowering it).
-- The hot rank = the busiest rank before; its GroupedMatmul and dispatch+combine time (median
-- over the layer's instances in moe_layer_facts of each run, by EP rank) before and after are
-- evidence columns, filled only with before_run (one trace cannot be split by epoch here) and
-- traces in both runs; they do not decide the verdict. The overall row also gives the change in
-- end-to-end request latency (median of the p50 of the metric windows `slowcard watch` stored:
-- the whole run with before_run, else the windows within each epoch's load windows; the
-- metrics have no per-token decode latency), NULL without metric windows; evidence too.
-- Rows: one 'overall' row (FAIL when any layer did not converge, listing them), then one row per layer.
WITH wins AS MATERIALIZED (
    SELECT run, wseq, epoch FROM _expert_windows WHERE run = $run OR (run = $before_run AND $before_run <> '')
), after_e AS (
    SELECT epoch FROM wins WHERE run = $run ORDER BY wseq DESC LIMIT 1
), sides AS MATERIALIZED (           -- (side, run, wseq) of the windows on each side
    SELECT 'after' AS side, run, wseq FROM wins
    WHERE run = $run AND epoch IS NOT DISTINCT FROM (SELECT epoch FROM after_e)
    UNION ALL
    SELECT 'before', run, wseq FROM wins
    WHERE CASE WHEN $before_run <> ''
               THEN run = $before_run
                    AND epoch IS NOT DISTINCT FROM (SELECT epoch FROM wins WHERE run = $before_run ORDER BY wseq DESC LIMIT 1)
               ELSE run = $run
                    AND epoch = (SELECT epoch FROM wins WHERE run = $run AND epoch IS DISTINCT FROM (SELECT epoch FROM after_e)
                                 ORDER BY wseq DESC LIMIT 1)
          END
), spans AS (                       -- per side: its run and the time its load windows cover (window ends)
    SELECT s.side, any_value(s.run) AS run, min(w.ts_ns) AS t0, max(w.ts_ns) AS t1
    FROM sides s JOIN _expert_windows w USING (run, wseq)
    GROUP BY s.side
), latency AS (                     -- median end-to-end request latency p50 of the side's metric windows
    SELECT p.side, median(m.e2e_p50_ms) AS e2e_p50_ms
    FROM spans p JOIN metric_windows m ON m.run = p.run
    WHERE m.e2e_p50_ms IS NOT NULL
      AND ($before_run <> '' OR m.ts_ns BETWEEN p.t0 AND p.t1)
    GROUP BY p.side
), names AS (
    SELECT CASE WHEN $before_run <> '' THEN 'run ' || $before_run
                ELSE 'epoch ' || coalesce((SELECT any_value(w.epoch) FROM wins w JOIN sides s USING (run, wseq) WHERE s.side = 'before')::VARCHAR, '?') END AS before,
           CASE WHEN $before_run <> '' THEN 'run ' || $run ELSE 'epoch ' || coalesce((SELECT epoch FROM after_e)::VARCHAR, '?') END AS after
), rank_tok AS (
    SELECT s.side, l.layer, l.ep_rank, sum(l.tokens) AS tokens
    FROM _expert_slot_load l JOIN sides s USING (run, wseq)
    WHERE l.run = $run OR (l.run = $before_run AND $before_run <> '')
    GROUP BY ALL
), ranked AS (
    SELECT *, row_number() OVER (PARTITION BY side, layer ORDER BY tokens DESC, ep_rank) AS pos,
           count(*) OVER (PARTITION BY side, layer) AS n_ranks
    FROM rank_tok
), per_side AS (
    SELECT side, layer, max(tokens) / NULLIF(avg(tokens), 0) AS par,
           sum(tokens) FILTER (WHERE pos <= greatest(1, floor($few_ranks_share * n_ranks))) / NULLIF(sum(tokens), 0) AS top_share,
           arg_max(ep_rank, tokens) AS peak_rank
    FROM ranked GROUP BY side, layer
), ops AS (                          -- per run, EP rank and layer: median GroupedMatmul and dispatch+combine time
    SELECT f.run, coalesce(s.ep_rank, f.rank) AS ep_rank, f.layer,
           median(f.gmm_ns) / 1e3 AS gmm_us, median(f.dispatch_ns + f.combine_ns) / 1e3 AS comm_us
    FROM moe_layer_facts f JOIN sources s USING (source_id)
    WHERE $before_run <> '' AND f.run IN ($run, $before_run) AND f.rank IS NOT NULL
    GROUP BY ALL
), per_layer AS (
    SELECT b.layer, b.par AS par_before, a.par AS par_after, b.top_share AS top_share_before, a.top_share AS top_share_after,
           b.peak_rank AS hot_rank, a.peak_rank AS peak_rank_after,
           ob.gmm_us AS gmm_us_before, oa.gmm_us AS gmm_us_after, ob.comm_us AS comm_us_before, oa.comm_us AS comm_us_after,
           a.par > greatest(b.par * (1 - $min_gain), $balanced_par) AS not_converged
    FROM per_side b
    JOIN per_side a ON a.side = 'after' AND a.layer = b.layer
    LEFT JOIN ops ob ON ob.run = $before_run AND ob.ep_rank = b.peak_rank AND ob.layer = b.layer
    LEFT JOIN ops oa ON oa.run = $run AND oa.ep_rank = b.peak_rank AND oa.layer = b.layer
    WHERE b.side = 'before'
), rows_ AS (
    SELECT 'overall' AS scope, NULL::INTEGER AS layer,
           avg(par_before) AS par_before, avg(par_after) AS par_after,
           avg(top_share_before) AS top_share_before, avg(top_share_after) AS top_share_after,
           mode(hot_rank ORDER BY hot_rank) AS hot_rank, mode(peak_rank_after ORDER BY peak_rank_after) AS peak_rank_after,
           sum(gmm_us_before) AS gmm_us_before, sum(gmm_us_after) AS gmm_us_after,
           sum(comm_us_before) AS comm_us_before, sum(comm_us_after) AS comm_us_after,
           bool_or(not_converged) AS not_converged, count(*) AS layers,
           count(*) FILTER (WHERE not_converged) AS layers_not_converged,
           list(layer ORDER BY par_after / NULLIF(par_before, 0) DESC, layer) FILTER (WHERE not_converged) AS not_converged_layers,
           bool_or(not_converged AND peak_rank_after = hot_rank) AS same_rank,
           (SELECT e2e_p50_ms FROM latency WHERE side = 'before') AS e2e_p50_ms_before,
           (SELECT e2e_p50_ms FROM latency WHERE side = 'after') AS e2e_p50_ms_after
    FROM per_layer
    HAVING count(*) > 0
    UNION ALL
    SELECT 'layer', layer, par_before, par_after, top_share_before, top_share_after, hot_rank, peak_rank_after,
           gmm_us_before, gmm_us_after, comm_us_before, comm_us_after, not_converged, 1,
           CASE WHEN not_converged THEN 1 ELSE 0 END, CASE WHEN not_converged THEN [layer] END,
           not_converged AND peak_rank_after = hot_rank, NULL, NULL
    FROM per_layer
)
SELECT scope, layer, CASE WHEN layer IS NULL THEN '' ELSE ' ' || layer END AS layer_txt,
       (SELECT before FROM names) AS before, (SELECT after FROM names) AS after,
       CASE WHEN not_converged THEN 'not converged' ELSE 'converged' END AS verdict,
       round(par_before, 3) AS par_before, round(par_after, 3) AS par_after,
       round(100.0 * (par_after - par_before) / NULLIF(par_before, 0), 1) AS par_change_pct,
       round(100.0 * top_share_before, 1) AS top_share_before_pct, round(100.0 * top_share_after, 1) AS top_share_after_pct,
       hot_rank, peak_rank_after,
       round(gmm_us_before, 1) AS gmm_us_before, round(gmm_us_after, 1) AS gmm_us_after,
       round(100.0 * (gmm_us_after - gmm_us_before) / NULLIF(gmm_us_before, 0), 1) AS gmm_change_pct,
       round(comm_us_before, 1) AS comm_us_before, round(comm_us_after, 1) AS comm_us_after,
       round(100.0 * (comm_us_after - comm_us_before) / NULLIF(comm_us_before, 0), 1) AS comm_change_pct,
       round(e2e_p50_ms_before, 1) AS e2e_p50_ms_before, round(e2e_p50_ms_after, 1) AS e2e_p50_ms_after,
       round(100.0 * (e2e_p50_ms_after - e2e_p50_ms_before) / NULLIF(e2e_p50_ms_before, 0), 1) AS e2e_change_pct,
       layers, layers_not_converged,
       coalesce(array_to_string(list_slice(not_converged_layers, 1, 10), ', ')
                || CASE WHEN len(not_converged_layers) > 10 THEN ' (+' || (len(not_converged_layers) - 10) || ' more)' ELSE '' END,
                '') AS layers_not_converged_list,
       CASE WHEN scope = 'overall' AND not_converged
            THEN '; layers not converged: ' || array_to_string(list_slice(not_converged_layers, 1, 10), ', ')
                 || CASE WHEN len(not_converged_layers) > 10 THEN ' (+' || (len(not_converged_layers) - 10) || ' more)' ELSE '' END
            ELSE '' END AS layers_txt,
       not_converged,
       CASE
           WHEN scope = 'overall' AND not_converged THEN layers_not_converged || ' of ' || layers || ' layers did not converge'
           WHEN scope = 'overall' THEN 'every layer''s imbalance fell or is at most ' || $balanced_par
           WHEN not_converged AND peak_rank_after = hot_rank THEN 'the same rank ' || hot_rank || ' stays the peak'
           WHEN not_converged THEN 'the hot spot moved from rank ' || hot_rank || ' to rank ' || peak_rank_after || ' without falling'
           WHEN par_after <= $balanced_par AND par_after > par_before * (1 - $min_gain) THEN 'balanced before and after'
           ELSE 'imbalance fell'
       END AS cause,
       CASE
           WHEN not_converged AND same_rank THEN 'check that the service loaded the new map (ingest it: expert_map) and that its hot experts got copies on other ranks; re-plan from these loads (slowcard plan eplb)'
           WHEN not_converged THEN 'a hot expert moved whole to another rank: give it copies (slowcard plan eplb --mode replicate, or --redundant-per-rank) instead of moving it'
           ELSE 'keep the map; watch the next epochs (eplb-effect)'
       END AS next_step
FROM rows_
ORDER BY scope = 'layer', not_converged DESC, par_after / NULLIF(par_before, 0) DESC, layer
