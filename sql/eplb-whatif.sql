-- name: eplb-whatif
-- version: 2
-- description: What EPLB could reach from the measured loads: a greedy re-placement of the experts, and redundant replicas of the hot experts; the peak/avg each reaches and the share of MoE time it would save.
-- requires: expert_load
-- param: min_saving DOUBLE = 0.10        -- warn when re-placing or replicating would save at least this share of MoE time
-- param: redundant_per_rank INTEGER = 1  -- redundant expert slots per EP rank for replicas (EPLB's num_redundant_experts = this x EP ranks; DeepSeek and vLLM deployments use about one per rank); 0 turns replication off
-- verdict: warn if rows where worth_rebalancing > 0
-- role: verdict
-- priority: none
-- order: 100
-- headline: scope | layer | option | {saved_pct} % of MoE time saved {how} | {after_par} peak/avg after (now {current_par}), peak rank {peak_rank}
-- summary: {scope}{layer_txt} {option}: peak/avg {current_par} now -> {after_par} {how}, {saved_pct}% of MoE time saved ({windows} windows of epoch {epoch_txt}); {next_step}
-- pass: No expert-load windows for this run.
--
-- Method: the loads of the placement in force now (all windows of the EPLB epoch of the run's
-- latest window) are summed per logical expert (replicas merged) and per rank. Two options:
-- Re-place: per layer, experts sorted by load (descending, ties by id), each put on the
--   currently least-loaded rank that still has a free slot (slots per rank as measured; ties to
--   the lowest rank). Each logical expert is placed once, so an expert heavier than a rank's
--   fair share keeps the peak where it is: moving cannot split it.
-- Replicate: the current placement stays; n_ranks x redundant_per_rank redundant slots are
--   handed out one by one (DeepSeek EPLB's replicate step): each to the expert with the largest
--   load per replica that can still get one, the new replica put on the least-loaded rank that
--   has a free redundant slot and does not hold that expert yet (ties to the lowest rank), and
--   the expert's load split evenly among its replicas (an expert replicated already is taken as
--   evenly split too).
-- MoE time of a layer is taken as proportional to its busiest rank's tokens, so
-- saved = 1 - sum(new max) / sum(current max) over layers, where a layer an option cannot
-- improve keeps its current placement (new max = least(option max, current max)).
-- Hierarchical (node, group) placement is not modelled.
-- Rows: one 'overall' row per option (WARN when saved >= min_saving), then one row per layer and option.
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
)
-- replicate: per layer and expert, its load and how many ranks hold it now
, rdata AS MATERIALIZED (
    SELECT layer, expert, sum(tokens)::DOUBLE AS w, count(DISTINCT ep_rank)::INTEGER AS c
    FROM _expert_slot_load WHERE run = $run AND wseq IN (SELECT wseq FROM win)
    GROUP BY layer, expert
), rshape AS MATERIALIZED (
    SELECT d.layer, any_value(sh.n_ranks) AS n_ranks, greatest($redundant_per_rank, 0)::INTEGER AS per_rank,
           greatest($redundant_per_rank, 0) * any_value(sh.n_ranks) AS budget,
           list(d.w ORDER BY d.w DESC, d.expert) AS ws, list(d.c ORDER BY d.w DESC, d.expert) AS cs,
           list(d.expert ORDER BY d.w DESC, d.expert) AS es
    FROM rdata d JOIN shape sh USING (layer)
    GROUP BY d.layer
), rranks AS (                -- rank index (1-based list position) of every EP rank of a layer
    SELECT layer, ep_rank, row_number() OVER (PARTITION BY layer ORDER BY ep_rank)::INTEGER AS ri FROM rk
), rstart AS MATERIALIZED (
    SELECT s.layer, s.n_ranks, s.per_rank, s.budget, s.ws, s.es, s.cs,
           (SELECT list(r.tokens::DOUBLE ORDER BY r.ep_rank) FROM rk r WHERE r.layer = s.layer) AS loads,
           (SELECT list(h.ris ORDER BY h.pos)
            FROM (SELECT list_position(s.es, x.expert) AS pos, list(DISTINCT q.ri) AS ris
                  FROM _expert_slot_load x JOIN rranks q ON q.layer = x.layer AND q.ep_rank = x.ep_rank
                  WHERE x.run = $run AND x.wseq IN (SELECT wseq FROM win) AND x.layer = s.layer
                  GROUP BY x.expert) h) AS holders
    FROM rshape s
), rplace(layer, k, slots, reps, loads, used, holders, done) AS (
    -- k counts steps, slots the redundant slots handed out; a step either places one replica
    -- of the expert with the largest load per replica or, when no rank can take that expert (a
    -- free redundant slot on a rank not holding it: that only gets rarer), marks it done
    SELECT layer, 0::BIGINT, 0::BIGINT, cs, loads, list_transform(loads, lambda v: 0::INTEGER), holders,
           list_transform(cs, lambda v: FALSE)
    FROM rstart
    UNION ALL
    SELECT layer, k, slots + CASE WHEN rpick > 0 THEN 1 ELSE 0 END,
           list_transform(range(len(reps)), lambda i: reps[i + 1] + CASE WHEN i + 1 = pick AND rpick > 0 THEN 1 ELSE 0 END),
           list_transform(range(len(loads)), lambda r: loads[r + 1]
               + CASE WHEN rpick = 0 THEN 0.0
                      WHEN r + 1 = rpick THEN w / (n + 1)
                      WHEN list_contains(holders[pick], r + 1) THEN w / (n + 1) - w / n
                      ELSE 0.0 END),
           list_transform(range(len(used)), lambda r: used[r + 1] + CASE WHEN r + 1 = rpick THEN 1 ELSE 0 END),
           CASE WHEN rpick > 0
                THEN list_transform(range(len(holders)), lambda i: CASE WHEN i + 1 = pick THEN list_append(holders[i + 1], rpick) ELSE holders[i + 1] END)
                ELSE holders END,
           CASE WHEN rpick > 0 THEN done
                ELSE list_transform(range(len(done)), lambda i: done[i + 1] OR i + 1 = pick) END
    FROM (
        SELECT *, ws[pick] AS w, reps[pick] AS n,
               -- the least-loaded rank with a free redundant slot that does not hold the expert
               -- (0 when there is none)
               CASE WHEN list_min(cand) < 1e59 THEN list_position(cand, list_min(cand)) ELSE 0 END AS rpick
        FROM (
            SELECT *, list_transform(range(len(loads)), lambda r: loads[r + 1]
                          + CASE WHEN used[r + 1] >= per_rank OR list_contains(holders[pick], r + 1) THEN 1e60 ELSE 0.0 END) AS cand
            FROM (
                SELECT *, list_position(per, list_max(per)) AS pick, list_max(per) AS best
                FROM (
                    SELECT p.layer, p.k + 1 AS k, p.slots, p.reps, p.loads, p.used, p.holders, p.done, s.ws, s.per_rank,
                           list_transform(range(len(p.reps)), lambda i: CASE
                               WHEN p.reps[i + 1] < s.n_ranks AND NOT p.done[i + 1]
                               THEN s.ws[i + 1] / p.reps[i + 1] ELSE -1.0 END) AS per
                    FROM rplace p JOIN rstart s ON s.layer = p.layer
                    WHERE p.slots < s.budget AND p.k < s.budget + len(s.ws)
                )
            )
            WHERE best > 0
        )
    )
), rfinal AS (
    SELECT layer, list_max(loads) AS rep_max, reps FROM rplace QUALIFY k = max(k) OVER (PARTITION BY layer)
), rexp AS (                    -- per layer and expert: replicas after (n) and now (c)
    SELECT layer, es[i] AS expert, ws[i] AS w, cs[i] AS c, reps[i] AS n
    FROM (SELECT s.layer, s.es, s.ws, s.cs, f.reps, unnest(range(1, len(s.es) + 1)) AS i
          FROM rstart s JOIN rfinal f USING (layer))
), rtext AS (
    SELECT layer, sum(n - c) AS redundant_used,
           list('L' || layer || '/E' || expert || ' x' || n ORDER BY w DESC, expert) AS replicated
    FROM rexp WHERE n > c GROUP BY layer
), peak AS (
    SELECT layer, arg_max(ep_rank, tokens) AS peak_rank FROM rk GROUP BY layer
), per_layer AS (
    SELECT o.option, sh.layer, sh.n_ranks, sh.cap, sh.current_max, sh.mean_rank_tokens, p.peak_rank,
           least(CASE o.option WHEN 're-place' THEN f.greedy_max ELSE coalesce(rf.rep_max, sh.current_max) END,
                 sh.current_max) AS new_max,
           CASE WHEN o.option = 'replicate' THEN coalesce(t.redundant_used, 0) END AS redundant_slots,
           CASE WHEN o.option = 'replicate' THEN t.replicated END AS replicated
    FROM shape sh JOIN final f USING (layer) JOIN peak p USING (layer)
    LEFT JOIN rfinal rf USING (layer) LEFT JOIN rtext t USING (layer)
    CROSS JOIN (VALUES ('re-place'), ('replicate')) o(option)
), result AS (
    SELECT 'overall' AS scope, option, NULL::INTEGER AS layer,
           avg(current_max / NULLIF(mean_rank_tokens, 0)) AS current_par,
           avg(new_max / NULLIF(mean_rank_tokens, 0)) AS after_par,
           1 - sum(new_max) / NULLIF(sum(current_max), 0) AS saved_share,
           sum(current_max) AS current_max_tokens, sum(new_max) AS new_max_tokens,
           max(n_ranks) AS n_ranks, max(cap) AS slots_per_rank,
           mode(peak_rank ORDER BY peak_rank) AS peak_rank,   -- the rank busiest in most layers
           max(redundant_slots) AS redundant_slots,   -- per layer, as num_redundant_experts counts them
           flatten(list(replicated ORDER BY layer)) AS replicated
    FROM per_layer GROUP BY option
    UNION ALL
    SELECT 'layer', option, layer, current_max / NULLIF(mean_rank_tokens, 0), new_max / NULLIF(mean_rank_tokens, 0),
           1 - new_max / NULLIF(current_max, 0), current_max, new_max, n_ranks, cap, peak_rank,
           redundant_slots, replicated
    FROM per_layer
), judged AS (
    SELECT r.*, saved_share >= $min_saving AS pays,
           max(CASE WHEN option = 'replicate' THEN saved_share END) OVER (PARTITION BY scope, layer) AS rep_saved
    FROM result r
)
SELECT scope, option, layer, CASE WHEN layer IS NULL THEN '' ELSE ' ' || layer END AS layer_txt,
       (SELECT any_value(epoch) FROM last_w) AS epoch,
       COALESCE((SELECT any_value(epoch) FROM last_w)::VARCHAR, 'unknown') AS epoch_txt,
       (SELECT count(*) FROM win) AS windows,
       n_ranks, slots_per_rank, peak_rank, redundant_slots,
       CASE WHEN option = 'replicate' THEN
           coalesce(array_to_string(list_slice(replicated, 1, 5), ', ')
                    || CASE WHEN len(replicated) > 5 THEN ' (+' || (len(replicated) - 5) || ' more)' ELSE '' END, '')
       END AS replicas,
       CASE WHEN option = 're-place' THEN 'after a greedy re-placement'
            ELSE 'with ' || coalesce(redundant_slots, 0) || ' redundant slot(s) for replicas'
                 || CASE WHEN len(replicated) > 0 THEN ' (' || array_to_string(list_slice(replicated, 1, 3), ', ')
                             || CASE WHEN len(replicated) > 3 THEN ', …' ELSE '' END || ')' ELSE '' END
       END AS how,
       round(current_par, 3) AS current_par, round(after_par, 3) AS after_par,
       round(saved_share, 4) AS saved_share, round(100 * saved_share, 1) AS saved_pct,
       round(current_max_tokens, 1) AS current_max_tokens, round(new_max_tokens, 1) AS new_max_tokens,
       scope = 'overall' AND pays AS worth_rebalancing,
       CASE
           WHEN scope = 'layer' THEN 'per-layer detail'
           WHEN option = 're-place' AND pays THEN 're-balancing pays: a balanced placement would cut the busiest rank''s load'
           WHEN option = 're-place' AND rep_saved >= $min_saving THEN 'moving experts cannot cut the peak: a hot expert outweighs a rank''s fair share, only replicas can split its load'
           WHEN option = 're-place' THEN 'the current placement is close to what a re-placement can reach'
           WHEN pays THEN 'replicating the hot experts pays: their load split over redundant slots cuts the busiest rank''s load'
           ELSE 'replicas would not cut the busiest rank''s load much'
       END AS cause,
       CASE
           WHEN scope = 'layer' THEN 'layers with the largest saving gain most from this option'
           WHEN option = 're-place' AND pays THEN 'enable EPLB or shorten its update interval, or load a re-balanced expert map; check eplb-effect after the next update'
           WHEN option = 're-place' AND rep_saved >= $min_saving THEN 'no re-placement can fix it; replicate the hot experts (see the replicate row)'
           WHEN option = 're-place' THEN 'no re-placement needed; if MoE time is still high, look at the slow rank''s device (ep-hot-chain) rather than the routing'
           WHEN pays THEN 'enable EPLB redundant experts (num_redundant_experts >= ' || coalesce(redundant_slots, 0)
                          || ') so the hot experts get replicas; check eplb-effect after the next update'
           ELSE 'no replicas needed'
       END AS next_step
FROM judged
ORDER BY scope = 'layer', option, saved_share DESC, layer
