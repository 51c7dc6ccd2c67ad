-- name: ep-slow-rank
-- version: 10
-- description: The slow card of an expert-parallel run: every rank whose own MoE work is persistently above its peers' (more tokens, slower compute, slower transfer, a slow host), decided on how much and where, and the step time its fix saves.
-- requires: moe_layer_facts
-- param: alpha DOUBLE = 0.01              -- false-alarm budget per quantity tested (GroupedMatmul, transfer, host wait): the chance that any rank is named by chance (Holm over the ranks tested)
-- param: trim_pct DOUBLE = 5              -- excess: the per-instance excess is averaged with this % of the instances cut off at each end, at least one (a trimmed mean)
-- param: min_cost_pct DOUBLE = 5.0        -- FAIL when the fix saves at least this % of the profiled step time (alone or after the pace-setter's), else WARN
-- param: min_warn_pct DOUBLE = 1.0        -- a significant excess whose fix saves less than this % is not reported (persistent but negligible)
-- param: min_share_pct DOUBLE = 25        -- a second cause is named beside the first when it carries at least this % of the excess
-- param: min_ranks INTEGER = 3            -- fewer ranks have no median rank to compare with: SKIP
-- verdict: fail if rows > 0
-- role: verdict
-- subject: rank
-- priority: 20
-- order: 110
-- shows: report.moe, annotate
-- headline: {tokens_per_layer} tokens per layer (median rank {median_rank_tokens}) | GroupedMatmul {gmm_us_per_layer} us per layer (median rank {median_rank_gmm_us} us; {time_per_token_ratio}x its time per token) | dispatch+combine {transfer_us_per_layer} us per layer ({transfer_ratio}x the median rank's) | waits for its host {host_wait_us_per_layer} us per layer (median rank {median_rank_host_wait_us} us) | above the others' median in {above_pct} % of {decided_in} (p {p_value}; median of ranks {peers}) | {onset} | {pace} | the others waited {others_wait_ms} ms at collectives; it arrived last at {last_arrival_pct} % of them
-- summary: rank {rank} {causes} [{level}]: its fix saves {cost_ms} ms = {cost_pct}% of the profiled time ({work}; above the others' median in {above_pct}% of {decided_in}, p={p_value}; arrived last at {last_arrival_pct}% of collectives{caveat}{left_out}); next: {next_step}
-- pass: No rank stands out: no rank's own MoE work (GroupedMatmul, transfer, waiting for its host) is significantly above its peers' (how often and how much, over layer instances and within each kind of instance, at alpha {alpha} with Holm over the ranks).
--
-- v8 (issue 41): decided on time, where, from when, and what the fix saves.
-- 1. Is it slow? Per rank and quantity (GroupedMatmul, transfer beyond its peers' transfer
--    excess, host wait), two tests of the per-instance excess over the median of the OTHER
--    ranks, each valid when the ranks are exchangeable however skewed the noise: how often (the
--    sign test, v7's) and how much (a permutation test of the summed excess against what a rank
--    drawn at random shows in each instance); p = twice the smaller. v7 counted signs only, so a
--    rank above by a lot in some of the instances was chance. Transfer: how often only (its
--    yardstick is not exchangeable under host noise, see `tests_both`).
-- 2. Where? Instances are grouped into kinds by the work their median rank did (GroupedMatmul /
--    dispatch / combine present): a DualPipe chunk's lone combine is not an expert-GEMM layer.
--    Each quantity is tested over all instances and within each kind; the best p times the
--    number of scopes tried (Bonferroni within the rank). `decided_in` says where.
-- 3. Across ranks: Holm's step-down per quantity over the ranks tested (alpha is the chance that
--    any rank is named by chance), instead of alpha / ranks for every rank.
-- 4. From when: the split of the compared steps that best separates a quiet start from a hot
--    end of the decided quantity's excess (`onset`), said only when the start is quiet; with
--    expert load in the run, the rank's experts that turned hot from then (`onset_hot_experts`, v9).
-- 5. What the fix saves (cost_ms, cost_pct of the profiled step time): see the replay below;
--    the run's excess in % of MoE time stays as `excess_moe_pct`.
-- The v7 method below still holds for the yardstick (median of the others), the trimmed excess,
-- the cause split and the parallel groups.
--
-- Method (v7's; v8 replaces the test of 1., the cost of 2. and the level, as above). Each (rank, layer instance) is paired with the median of the OTHER ranks in the same
-- instance (instances every rank has: "the same layer"); v7: v6's median of all ranks counted
-- the rank itself, so with a second anomalous rank among few (two of five) the median was the
-- slowest normal rank, a slow card 1.75x per row was above it in only 19 of 24 instances (not
-- significant), and a rank's own excess pulled its yardstick up (costs ran ~6 % low). The
-- evidence is the rank's OWN work, which host noise cannot fake persistently: GroupedMatmul
-- time, dispatch/combine transfer time, on device traces the time its compute stream waits for
-- the host to launch work (_layer_host_wait), and the tokens it received (exact).
-- 1. Is it slow? Per rank and quantity (GroupedMatmul, transfer, host wait), a one-sided sign test over
--    the instances, with k = instances where the rank is strictly above the median rank, p =
--    P(Binomial(n, 1/2) >= k) (a rank that is not different is above the median at most half
--    the time; ties count against the rank). Significant at alpha / ranks. A rank is a finding
--    when either quantity is significant; only significant quantities enter its cost. No ratio
--    gates; a small but persistent excess is a finding, and its cost says how much it matters.
-- 2. What does it cost? The what-if "this rank at the median rank": n x the trimmed mean of the
--    per-instance excess (rank - median rank), trim_pct of the instances cut at each end (at
--    least one when trim_pct > 0, v7). One descheduled or warm-up instance does not make a cost,
--    and unlike the median the mean keeps the long tail of a routing skew (the excess varies per
--    batch). In % of the run's MoE time (sum over instances of the median rank's layer time).
-- 3. Why? One decision over the whole (token ratio, time-per-token ratio) plane, no gaps. Over
--    the instances the cost keeps, the rank's tokens and time against the median rank's give
--    Rt = tokens ratio and Rs = time-per-token ratio (time ratio = Rt x Rs). The excess
--    (Rt Rs - 1) x median time splits exactly into the part its extra tokens explain,
--    (Rt - 1)(1 + Rs)/2, and the part they do not, (Rs - 1)(1 + Rt)/2 (the Shapley split: neither
--    factor goes first). GroupedMatmul's token part and transfer's token part are token-skew, its
--    per-token part slow-compute, transfer's per-token part slow-comm, the host wait host-bound
--    (a device idle while its host has not launched the next kernel); a negative part (fewer
--    tokens, or faster per token) counts as 0. cause = the part with the largest share; causes
--    also names every other part carrying >= min_share_pct ("token-skew 58 %, slow-compute 42 %").
--    When the trace has no token counts, Rt = 1: the caveat says token-skew and slow-compute
--    cannot be told apart.
-- Level: FAIL when significant and cost_pct >= min_cost_pct, WARN when significant and cost_pct
-- >= min_warn_pct; cheaper is negligible and not reported (with several ranks, one anomalous rank
-- shifts the median rank, and a normal rank can then sit persistently, and cheaply, above it).
-- Arrival order (last_arrival_pct) and the others' wait for it where it arrived last
-- (others_wait_ms) are evidence columns, never gates: under host noise the slow rank does not
-- reliably arrive last.
-- SKIP (one row with skip_reason) when fewer than min_ranks ranks, or so few instances n that
-- even a rank above the median in all of them would not be significant (0.5^n > alpha / ranks).
-- Parallel groups (v6, issue 30): when the run has EP groups (parallel_groups kind 'ep': from a
-- groups file, torch_npu's profiler_metadata.json, Kineto's pg_config), a rank is compared with
-- the median rank of its own EP group only (the ranks that exchange its tokens; with pipeline
-- stages, each stage's EP group has its own layers), over the instances every rank of the group
-- has; `peer_group` and `peers` (also in the headline) say whom. Each group is judged on its own
-- (min_ranks and the instance count per group; groups too small to judge are left out, SKIP when
-- none can be judged); the cost is in % of the group's MoE time; the Bonferroni divisor stays
-- the number of ranks tested. Without EP groups, every rank is one group (peer_group 'all
-- ranks', peers NULL) and the rows are v5's.

-- A rank's EP group, when it is in exactly one.
WITH ep_groups AS (
    SELECT rank, any_value(group_id) AS peer_group
    FROM (SELECT DISTINCT group_id, rank FROM parallel_groups WHERE run = $run AND kind = 'ep' AND group_size > 1)
    GROUP BY rank
    HAVING count(*) = 1
),
-- Per (rank, layer instance): what it computed and how it met the others at the collectives.
f AS (
    SELECT f.*, coalesce(g.peer_group, 'all ranks') AS peer_group, coalesce(c.n_collectives, 0) AS n_coll, coalesce(c.n_arrived_last, 0) AS n_last,
           coalesce(c.arrival_lag_ns, 0) AS lag_ns,
           -- the rank's transfer and what it would be with a normal link: its peers' median, plus
           -- where it arrived last what last arrivers need more (see _transfer_expected)
           c.transfer_ns, c.expected_transfer_ns,
           -- device traces: how long the layer's compute stream waited for its host to launch
           h.host_wait_ns
    FROM moe_layer_facts f
    LEFT JOIN _layer_collectives c USING (run, rank, source_id, step, layer, occurrence)
    LEFT JOIN _layer_host_wait h USING (run, rank, source_id, step, layer, occurrence)
    LEFT JOIN ep_groups g ON g.rank = f.rank
    WHERE f.run = $run AND f.rank IS NOT NULL
),
group_ranks AS (
    SELECT peer_group, count(DISTINCT rank) AS n, _rank_ranges(list(DISTINCT rank ORDER BY rank)) AS peers
    FROM f GROUP BY peer_group
),
n_ranks AS (SELECT sum(n) AS n, max(n) AS max_n, count(*) AS n_groups FROM group_ranks),
-- Only layer instances that every rank of the group (the run) has: they are what "the same
-- layer" means.
inst AS (
    SELECT f.peer_group, step, layer, occurrence FROM f JOIN group_ranks r USING (peer_group)
    GROUP BY f.peer_group, step, layer, occurrence, r.n
    HAVING count(DISTINCT rank) = r.n AND count(DISTINCT rank) > 1
),
-- The groups with enough ranks and instances to judge (the conditions of the SKIP below).
judged AS (
    SELECT r.peer_group, r.peers FROM group_ranks r
    WHERE r.n >= $min_ranks
      AND (SELECT count(*) FROM inst i WHERE i.peer_group = r.peer_group)
          >= ceil(log2((SELECT n FROM n_ranks) / $alpha))
),
-- Per instance: the median rank's layer time (the run's MoE time, the cost's denominator) and the
-- others' wait. The yardstick of a rank is the median of the OTHER ranks (loo, below); for
-- transfer, the expected transfer of the rank in the same collectives (f.expected_transfer_ns).
-- The others' wait only over the ranks with matched collectives in the instance: a truncated
-- rank whose calls could not be matched (see _collectives) has none, and its zeros say nothing.
med AS (
    SELECT peer_group, step, layer, occurrence, coalesce(sum(lag_ns) FILTER (WHERE n_coll > 0), 0) AS all_lag_ns,
           median(layer_ns) AS med_layer_ns,
           -- v8: the instance's kind, the work its median rank did in it (instances that do the same
           -- work are compared together: a DualPipe chunk's lone combine is not an expert-GEMM layer)
           coalesce(nullif(concat_ws('+', CASE WHEN median(gmm_ns) > 0 THEN 'GroupedMatmul' END,
                                          CASE WHEN median(dispatch_ns) > 0 THEN 'dispatch' END,
                                          CASE WHEN median(combine_ns) > 0 THEN 'combine' END), ''), 'other') AS kind
    FROM f JOIN inst USING (peer_group, step, layer, occurrence) GROUP BY ALL
),
-- The median of the other ranks of the group, per rank and instance (the rank's yardstick), from
-- positions (as dp-metrics-imbalance does): each quantity sorted once per instance, and a rank's
-- two middle values of the others looked up past its own position; a self-join of every rank
-- with every other one grew with ranks squared (0.13 -> 0.33 s at 256 ranks). NULLs (no tokens,
-- no host wait) are left out, as median() leaves them out.
vals AS (
    SELECT peer_group, rank, step, layer, occurrence, q, v
    FROM (SELECT f.peer_group, f.rank, step, layer, occurrence, f.tokens, f.gmm_ns, f.host_wait_ns,
                 CASE WHEN f.n_coll > 0 THEN f.transfer_ns - f.expected_transfer_ns END AS tr_x_ns
          FROM f JOIN inst USING (peer_group, step, layer, occurrence))
    UNPIVOT INCLUDE NULLS (v FOR q IN (tokens, gmm_ns, host_wait_ns, tr_x_ns))
),
ordered AS (
    SELECT *,
           CASE WHEN v IS NOT NULL THEN row_number() OVER (PARTITION BY peer_group, step, layer, occurrence, q ORDER BY v NULLS LAST) END AS pos,
           count(v) OVER (PARTITION BY peer_group, step, layer, occurrence, q) - (v IS NOT NULL)::INTEGER AS n_others
    FROM vals
),
-- the others' middle positions (k1 = k2 for an odd count), one further on past the rank's own
middle AS (
    SELECT *, k1 + (k1 >= coalesce(pos, n_others + 2))::INTEGER AS at1, k2 + (k2 >= coalesce(pos, n_others + 2))::INTEGER AS at2
    FROM (SELECT *, (n_others + 1) // 2 AS k1, n_others // 2 + 1 AS k2 FROM ordered)
),
loo AS (
    SELECT m.peer_group, m.rank, m.step, m.layer, m.occurrence,
           any_value((a.v + b.v) / 2) FILTER (WHERE m.q = 'tokens') AS med_tokens,
           any_value((a.v + b.v) / 2) FILTER (WHERE m.q = 'gmm_ns') AS med_gmm_ns,
           any_value((a.v + b.v) / 2) FILTER (WHERE m.q = 'host_wait_ns') AS med_host_wait_ns,
           any_value((a.v + b.v) / 2) FILTER (WHERE m.q = 'tr_x_ns') AS med_tr_x_ns
    FROM middle m
    LEFT JOIN ordered a ON a.peer_group = m.peer_group AND a.step = m.step AND a.layer = m.layer
         AND a.occurrence = m.occurrence AND a.q = m.q AND a.pos = m.at1
    LEFT JOIN ordered b ON b.peer_group = m.peer_group AND b.step = m.step AND b.layer = m.layer
         AND b.occurrence = m.occurrence AND b.q = m.q AND b.pos = m.at2
    GROUP BY ALL
),
paired AS (   -- each quantity against the others' median (loo); the run's MoE time and the kind from med
    SELECT f.rank, f.peer_group, step, layer, occurrence, m.kind, f.n_coll, f.n_last, f.tokens, f.gmm_ns, f.transfer_ns,
           o.med_tokens, o.med_gmm_ns, f.expected_transfer_ns AS med_transfer_ns, m.med_layer_ns,
           m.all_lag_ns - f.lag_ns AS others_lag_ns,
           f.gmm_ns - o.med_gmm_ns AS gmm_excess_ns,
           -- v8: the rank's transfer excess beyond the excess its peers show in the same instance:
           -- host scheduling makes every rank's transfer exceed its yardstick now and then, and a
           -- link is slow only when this rank's excess stands out from theirs
           CASE WHEN f.n_coll > 0 THEN (f.transfer_ns - f.expected_transfer_ns) - coalesce(o.med_tr_x_ns, 0) END AS transfer_excess_ns,
           f.host_wait_ns, o.med_host_wait_ns, f.host_wait_ns - o.med_host_wait_ns AS host_excess_ns
    FROM f JOIN med m USING (peer_group, step, layer, occurrence)
    JOIN loo o USING (peer_group, rank, step, layer, occurrence)
),
-- v8: the excess of each quantity per (rank, instance), one row each (NULL: not measured there).
diffs AS (
    SELECT rank, peer_group, step, layer, occurrence, kind, q, d
    FROM (SELECT rank, peer_group, step, layer, occurrence, kind, gmm_excess_ns AS gmm, transfer_excess_ns AS transfer,
                 host_excess_ns AS host FROM paired)
    UNPIVOT (d FOR q IN (gmm, transfer, host))
),
-- Where an effect is judged: over all instances, and within each kind of instance when the group
-- has more than one kind for the quantity (an effect present in one kind is decided there).
n_kinds AS (SELECT peer_group, q, count(DISTINCT kind) AS k FROM diffs GROUP BY ALL),
scoped AS (
    SELECT d.*, 'all' AS scope FROM diffs d
    UNION ALL
    SELECT d.*, d.kind FROM diffs d JOIN n_kinds USING (peer_group, q) WHERE n_kinds.k > 1
),
-- Per instance, what a rank drawn at random would show: the mean and variance of the excess over
-- the group's ranks. With no slow card the ranks are exchangeable in each instance, so a rank's
-- summed excess has that mean and variance, however skewed the noise (descheduling only ever
-- adds time: the excess over the others' median is then skewed, and a signed-rank test, which
-- assumes symmetry, named a balanced rank of the shared noise set).
inst_d AS (SELECT peer_group, step, layer, occurrence, q, avg(d) AS mean_d, var_pop(d) AS var_d FROM diffs GROUP BY ALL),
-- The exact tail of that sum under the null (a rank drawn at random in every instance) by the
-- saddlepoint (v9): the cumulant generating function K(t) = sum over instances of
-- ln(mean over ranks of exp(t d)) and its first two derivatives, on a grid of tilts t shared by
-- the ranks of a group (K does not depend on the rank tested); a rank's summed excess s then reads
-- its tail at the tilt where K'(t) = s (the grid point below it, plus one Newton step). v8 used
-- the normal tail of the same sum: where a few instances carry a descheduling spike it was 20-60
-- times too small (p 1e-6 where the exact permutation tail is 7e-5), and balanced ranks of the
-- lock-step set were named (bench/README.md, issue 41). Transfer is tested by how often only.
tilt AS (SELECT k, 0.05 * pow(800.0, k / 63.0) AS z FROM range(64) r(k)),   -- t = z / sd: about 0.05 to 40 sd
sd_all AS (SELECT peer_group, q, sqrt(sum(var_d)) AS sd FROM inst_d GROUP BY ALL HAVING sum(var_d) > 0),
d_inst AS (
    SELECT d.peer_group, d.step, d.layer, d.occurrence, d.q, d.d - i.mean_d AS dc, i.mean_d,
           max(d.d - i.mean_d) OVER (PARTITION BY d.peer_group, d.step, d.layer, d.occurrence, d.q) AS dc_max
    FROM diffs d JOIN inst_d i USING (peer_group, step, layer, occurrence, q)
    WHERE d.d IS NOT NULL AND d.q <> 'transfer'
),
cgf_inst AS (   -- per instance and tilt, on the centred excess (shifted by its max: no overflow)
    SELECT peer_group, step, layer, occurrence, q, k, t,
           t * any_value(mean_d) + t * any_value(dc_max) + ln(avg(exp(t * (dc - dc_max)))) AS k0,
           any_value(mean_d) + sum(dc * exp(t * (dc - dc_max))) / sum(exp(t * (dc - dc_max))) AS k1,
           -- (a variance: never below 0, which rounding can reach where one value dominates)
           greatest(0.0, sum(dc * dc * exp(t * (dc - dc_max))) / sum(exp(t * (dc - dc_max)))
                         - pow(sum(dc * exp(t * (dc - dc_max))) / sum(exp(t * (dc - dc_max))), 2)) AS k2
    FROM (SELECT d.*, g.k, g.z / s.sd AS t FROM d_inst d JOIN sd_all s USING (peer_group, q) CROSS JOIN tilt g)
    GROUP BY peer_group, step, layer, occurrence, q, k, t
),
scope_inst AS (SELECT DISTINCT peer_group, q, scope, step, layer, occurrence FROM scoped WHERE q <> 'transfer'),
cgf AS (
    SELECT peer_group, q, scope, k, t, sum(k0) AS cg, sum(k1) AS cg1, sum(k2) AS cg2, k = 63 AS grid_end
    FROM cgf_inst JOIN scope_inst USING (peer_group, q, step, layer, occurrence)
    GROUP BY ALL
),
-- Two tests per (rank, quantity, scope), each valid under exchangeable ranks:
--   how often: v7's sign test, P(Binomial(n, 1/2) >= k), ties counting against the rank (robust
--              to a heavy tail, blind to magnitude);
--   how much:  the permutation test of the summed excess against the exchangeable null, its tail
--              by the saddlepoint above (the normal tail where the sum is below the grid's
--              first point: within 0.05 sd of the mean, where the tail is not small).
-- p = twice the smaller (Bonferroni over the two).
tested_n AS (
    SELECT s.rank, any_value(s.peer_group) AS peer_group, s.q, s.scope, count(*) AS n_scope,
           count(*) FILTER (WHERE s.d > 0) AS k_above, sum(s.d) AS sum_d,
           list_sum(list_transform(range(count(*) FILTER (WHERE s.d > 0), count(*) + 1),
                                   lambda j: exp(lgamma(count(*) + 1) - lgamma(j + 1) - lgamma(count(*) - j + 1) - count(*) * ln(2)))) AS p_sign,
           CASE WHEN sum(i.var_d) > 0 THEN _normal_upper_p((sum(s.d) - sum(i.mean_d)) / sqrt(sum(i.var_d))) ELSE 1.0 END AS p_normal
    FROM scoped s JOIN inst_d i USING (peer_group, step, layer, occurrence, q)
    GROUP BY s.rank, s.q, s.scope
),
tilted AS (   -- the grid point below the sum (K' grows with t), and the sum's tilt from it
    SELECT *, t + CASE WHEN grid_end OR cg2 <= 0 THEN 0 ELSE (s_at - cg1) / cg2 END AS th
    FROM (SELECT n.*, c.k AS tilt_k, c.t, c.cg, c.cg1, c.cg2, c.grid_end,
                 -- past the grid's end, that end's own tail: larger than the sum's, never too small
                 CASE WHEN c.grid_end THEN c.cg1 ELSE n.sum_d END AS s_at
          FROM tested_n n
          ASOF LEFT JOIN cgf c ON c.peer_group = n.peer_group AND c.q = n.q AND c.scope = n.scope AND n.sum_d >= c.cg1)
),
tested AS (
    SELECT rank, peer_group, q, scope, n_scope, k_above, sum_d, p_sign,
           CASE WHEN tilt_k IS NULL THEN p_normal
                -- no spread left at that tilt (the edge of the support): the Chernoff bound alone
                WHEN cg2 <= 0 THEN least(1.0, exp(-greatest(0.0, th * s_at - cg)))
                ELSE _saddlepoint_upper_p(sqrt(greatest(0.0, 2 * (th * s_at - (cg + cg1 * (th - t) + cg2 * pow(th - t, 2) / 2)))),
                                          th * sqrt(cg2))
           END AS p_perm
    FROM tilted
),
-- Per (rank, quantity): the best scope, its p times the number of scopes tried (Bonferroni within
-- the rank); then Holm's step-down over the ranks tested, per quantity (alpha controls the chance
-- that ANY rank is named by chance).
-- Transfer: how often only. Its yardstick is not exchangeable under host noise: a descheduled
-- rank arrives last more often, and the last arriver's transfer is long by construction (see
-- _transfer_expected), so its magnitude reads host scheduling as a slow link.
tests_both AS (
    SELECT *, CASE WHEN q = 'transfer' THEN p_sign ELSE least(1.0, 2 * least(p_sign, p_perm)) END AS p_raw FROM tested
),
best AS (
    SELECT rank, peer_group, q, p, n_all,
           -- where the effect is said to live: among the significant scopes the one with the most
           -- excess per instance ('all' unless a kind has 10 % more), else the smallest p
           arg_max([scope, n_scope::VARCHAR, k_above::VARCHAR, (least(1.0, p_raw * n_sc))::VARCHAR],
                   CASE WHEN p_raw * n_sc <= $alpha / (SELECT n FROM n_ranks)
                        THEN [1, sum_d / n_scope * CASE WHEN scope = 'all' THEN 1.1 ELSE 1.0 END]
                        ELSE [0, -p_raw] END) AS shown
    FROM (SELECT *, count(*) OVER (PARTITION BY rank, q) AS n_sc,
                 least(1.0, min(p_raw) OVER (PARTITION BY rank, q) * count(*) OVER (PARTITION BY rank, q)) AS p,
                 max(n_scope) FILTER (WHERE scope = 'all') OVER (PARTITION BY rank, q) AS n_all
          FROM tests_both) t
    GROUP BY rank, peer_group, q, p, n_all
),
holm AS (
    SELECT *, bool_and(p <= $alpha / (m - pos + 1)) OVER (PARTITION BY q ORDER BY pos ROWS UNBOUNDED PRECEDING) AS sig
    FROM (SELECT *, shown[1] AS scope, shown[2]::BIGINT AS n_scope, shown[3]::BIGINT AS k_above, shown[4]::DOUBLE AS p_shown,
                 row_number() OVER (PARTITION BY q ORDER BY p, rank) AS pos, count(*) OVER (PARTITION BY q) AS m
          FROM best WHERE peer_group IN (SELECT peer_group FROM judged))
),
-- The instances each cost keeps: the rank's per-instance excess in order, trim_pct of them cut
-- at each end (transfer over the instances with matched collectives only).
ranked AS (
    SELECT *,
           row_number() OVER (PARTITION BY rank ORDER BY gmm_excess_ns) AS g_pos,
           count(*) OVER (PARTITION BY rank) AS g_n,
           row_number() OVER (PARTITION BY rank ORDER BY transfer_excess_ns NULLS LAST) AS t_pos,
           count(transfer_excess_ns) OVER (PARTITION BY rank) AS t_n,
           row_number() OVER (PARTITION BY rank ORDER BY host_excess_ns NULLS LAST) AS h_pos,
           count(host_excess_ns) OVER (PARTITION BY rank) AS h_n
    FROM paired
),
kept AS (
    SELECT *,
           g_pos > g_cut AND g_pos <= g_n - g_cut AS g_kept,
           transfer_excess_ns IS NOT NULL AND t_pos > t_cut AND t_pos <= t_n - t_cut AS t_kept,
           host_excess_ns IS NOT NULL AND h_pos > h_cut AND h_pos <= h_n - h_cut AS h_kept
    FROM (
        -- at least one instance at each end (v7): under 100 / trim_pct instances floor() cut none,
        -- and one warm-up instance alone made a cost
        SELECT *,
               CASE WHEN $trim_pct > 0 AND g_n >= 3 THEN greatest(1, floor(g_n * $trim_pct / 100)) ELSE 0 END AS g_cut,
               CASE WHEN $trim_pct > 0 AND t_n >= 3 THEN greatest(1, floor(t_n * $trim_pct / 100)) ELSE 0 END AS t_cut,
               CASE WHEN $trim_pct > 0 AND h_n >= 3 THEN greatest(1, floor(h_n * $trim_pct / 100)) ELSE 0 END AS h_cut
        FROM ranked
    )
),
per_rank AS (
    SELECT rank, any_value(peer_group) AS peer_group, count(*) AS n,
           count(transfer_excess_ns) AS n_tr, count(host_excess_ns) AS n_h,
           avg(host_excess_ns) FILTER (WHERE h_kept) AS host_excess_mean_ns,
           avg(host_wait_ns) AS host_wait_ns_per_layer, avg(med_host_wait_ns) AS median_rank_host_wait_ns,
           bool_and(tokens IS NOT NULL AND med_tokens IS NOT NULL) AS tokens_known,
           avg(gmm_excess_ns) FILTER (WHERE g_kept) AS gmm_excess_mean_ns,
           avg(transfer_excess_ns) FILTER (WHERE t_kept) AS transfer_excess_mean_ns,
           -- the rank against the median rank over the kept instances (the decomposition's ratios)
           -- (NULL when the median rank received no tokens: the rank's tokens are then all excess)
           sum(tokens) FILTER (WHERE g_kept) / nullif(sum(med_tokens) FILTER (WHERE g_kept), 0) AS rt_gmm,
           sum(gmm_ns) FILTER (WHERE g_kept) / greatest(sum(med_gmm_ns) FILTER (WHERE g_kept), 1) AS time_ratio_gmm,
           sum(tokens) FILTER (WHERE t_kept) / nullif(sum(med_tokens) FILTER (WHERE t_kept), 0) AS rt_tr,
           sum(transfer_ns) FILTER (WHERE t_kept) / greatest(sum(med_transfer_ns) FILTER (WHERE t_kept), 1) AS time_ratio_tr,
           avg(tokens) AS tokens_per_layer, avg(med_tokens) AS median_rank_tokens,
           avg(gmm_ns) AS gmm_ns_per_layer, avg(med_gmm_ns) AS median_rank_gmm_ns,
           avg(transfer_ns) FILTER (WHERE n_coll > 0) AS transfer_ns_per_layer,
           100.0 * sum(n_last) / greatest(sum(n_coll), 1) AS last_arrival_pct,
           sum(others_lag_ns) FILTER (WHERE n_last > 0) AS others_lag_ns
    FROM kept GROUP BY rank
),
tests AS (
    SELECT r.*,
           g.p_shown AS p_gmm, t.p_shown AS p_tr, h.p_shown AS p_h,
           coalesce(g.sig, FALSE) AS gmm_sig, coalesce(t.sig, FALSE) AS tr_sig, coalesce(h.sig, FALSE) AS host_sig,
           g.scope AS g_scope, g.n_scope AS g_n_scope, g.k_above AS g_k, g.n_all AS g_n_all,
           t.scope AS t_scope, t.n_scope AS t_n_scope, t.k_above AS t_k, t.n_all AS t_n_all,
           h.scope AS h_scope, h.n_scope AS h_n_scope, h.k_above AS h_k, h.n_all AS h_n_all,
           CASE WHEN tokens_known THEN rt_gmm ELSE 1.0 END AS rt_g,
           CASE WHEN tokens_known THEN rt_tr ELSE 1.0 END AS rt_t
    FROM per_rank r
    LEFT JOIN holm g ON g.rank = r.rank AND g.q = 'gmm'
    LEFT JOIN holm t ON t.rank = r.rank AND t.q = 'transfer'
    LEFT JOIN holm h ON h.rank = r.rank AND h.q = 'host'
),
-- Significant quantities and their excess (n x trimmed mean excess, never below 0).
sig AS (
    SELECT *,
           CASE WHEN host_sig THEN greatest(n_h * host_excess_mean_ns, 0) ELSE 0 END AS host_cost_ns,
           CASE WHEN gmm_sig THEN greatest(n * gmm_excess_mean_ns, 0) ELSE 0 END AS gmm_cost_ns,
           CASE WHEN tr_sig THEN greatest(n_tr * transfer_excess_mean_ns, 0) ELSE 0 END AS tr_cost_ns,
           time_ratio_gmm / nullif(rt_g, 0) AS rs_g,
           time_ratio_tr / nullif(rt_t, 0) AS rs_t
    FROM tests
),
-- What the fix saves (v8). Replay of the run's synchronisation: a collective of the whole group
-- ends when its last rank has arrived, so every rank leaves it together and the time to the next
-- collective is each rank's own segment. Replaying the run with one rank's segments replaced by
-- its peers' median shortens each collective it arrived last at by its lead over the next-latest
-- rank (the others' median is never later than that rank), and nothing else: the saving is the
-- sum of those leads. With two slow ranks the later one sets the pace: fixing the other alone
-- saves only where it was last; after the pace-setter is fixed (its arrival at its peers'
-- median), the other's saving is its lead in that replay. Collectives of the whole EP group
-- (or run) only; a run without them keeps the excess as its cost (saving_basis 'excess').
coll AS (
    SELECT w.pg, w.coll_kind, w.instance, w.rank, w.start_adj_ns AS a_ns, r.peer_group
    FROM collective_waits w JOIN (SELECT DISTINCT rank, peer_group FROM f) r USING (rank)
    WHERE w.run = $run
    QUALIFY count(*) OVER (PARTITION BY w.pg, w.coll_kind, w.instance)
            = (SELECT n FROM group_ranks g WHERE g.peer_group = r.peer_group)
        AND count(DISTINCT r.peer_group) OVER (PARTITION BY w.pg, w.coll_kind, w.instance) = 1
),
-- Each collective's arrivals in order (pos 1 the earliest, n_o + 1 the last), read by the saving
-- alone (solo) and after the others (after_others).
coll_pos AS (
    SELECT *, row_number() OVER (PARTITION BY pg, coll_kind, instance ORDER BY a_ns, rank) AS pos,
           count(*) OVER (PARTITION BY pg, coll_kind, instance) - 1 AS n_o,
           arg_max(rank, a_ns) OVER (PARTITION BY pg, coll_kind, instance) AS last_rank
    FROM coll
),
solo AS (   -- the last arriver's lead over the next-latest rank (pos n_o), per collective; read
            -- with lag(): a LEFT JOIN on (pos = n_o) planned as a nested loop, quadratic in the
            -- collectives (2.9 s of 6 at 512 ranks)
    SELECT peer_group, rank, sum(CASE WHEN pos = n_o + 1 THEN a_ns - coalesce(prev_a_ns, a_ns) ELSE 0 END) AS solo_ns
    FROM (SELECT *, lag(a_ns) OVER (PARTITION BY pg, coll_kind, instance ORDER BY pos) AS prev_a_ns FROM coll_pos)
    GROUP BY ALL
),
replay_ok AS (SELECT DISTINCT peer_group FROM coll),
flagged AS (SELECT *, gmm_cost_ns + host_cost_ns AS own_ns FROM sig WHERE gmm_sig OR tr_sig OR host_sig),
-- A rank that arrives last persistently (a straggler, whatever makes it late): last at more of
-- the group's collectives than chance (1 / ranks) allows at alpha / ranks. With the slow cards,
-- the only ranks whose pace can hide another's saving (v9): in a balanced noisy run every rank
-- is sometimes last, and a saving "after" such a rank's fix is a saving after removing noise.
last_counts AS (
    SELECT f.peer_group, f.rank, any_value(g.n) AS n, sum(f.n_last)::BIGINT AS k, sum(f.n_coll)::BIGINT AS m
    FROM f JOIN inst USING (peer_group, step, layer, occurrence) JOIN group_ranks g USING (peer_group)
    GROUP BY f.peer_group, f.rank
),
stragglers AS (
    SELECT peer_group, rank FROM last_counts
    WHERE m > 0 AND k > m / n
      AND _binomial_upper_p(k, m, 1.0 / n) <= $alpha / (SELECT n FROM n_ranks)
),
-- The pace-setter of a group with two or more slow ranks: the one with the most excess of its own.
pace AS (
    SELECT peer_group, arg_max(rank, own_ns) AS pace_rank
    FROM flagged GROUP BY peer_group HAVING count(*) >= 2
),
-- A slow rank's excess can hide another's: a host that launches late catches up while its device
-- waits for a slower rank at the collectives, so fixing that slower rank alone exposes it. Per
-- instance, the excess (GroupedMatmul, host wait) of each slow rank; what one rank's fix can save
-- there is its excess beyond the largest excess of the other slow ranks.
demand AS (
    SELECT p.peer_group, p.rank, p.step, p.layer, p.occurrence,
           greatest(p.gmm_excess_ns, 0) * fl.gmm_sig::INT + greatest(coalesce(p.host_excess_ns, 0), 0) * fl.host_sig::INT AS e_ns
    FROM paired p JOIN flagged fl USING (rank)
),
demand_solo AS (
    SELECT rank, sum(greatest(e_ns - coalesce(others_max_ns, 0), 0)) AS beyond_ns
    FROM (SELECT *, max(e_ns) OVER (PARTITION BY peer_group, step, layer, occurrence
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING EXCLUDE CURRENT ROW) AS others_max_ns
          FROM demand)
    GROUP BY rank
),
costed AS (
    SELECT s.*, so.solo_ns, ro.peer_group IS NOT NULL AS replayed, pc.pace_rank,
           CASE WHEN ro.peer_group IS NOT NULL
                THEN least(coalesce(so.solo_ns, 0),
                           CASE WHEN pc.pace_rank IS NULL OR pc.pace_rank = s.rank THEN s.own_ns ELSE ds.beyond_ns END)
                     + tr_cost_ns
                ELSE own_ns + tr_cost_ns END AS cost_ns
    FROM flagged s
    LEFT JOIN solo so USING (peer_group, rank)
    LEFT JOIN replay_ok ro USING (peer_group)
    LEFT JOIN pace pc USING (peer_group)
    LEFT JOIN demand_solo ds USING (rank)
),
-- What the rank's fix would save once the others arrive as their median does (a pace-setter,
-- slow card or straggler, hides it today): its lead over the median of the OTHER ranks at each
-- collective; the pace-setter named is the rank most often last where this one was late.
-- The others' median from positions (coll_pos), as loo above (no self-join of every rank with every other).
coll_mid AS (
    SELECT *, k1 + (k1 >= pos)::INTEGER AS at1, k2 + (k2 >= pos)::INTEGER AS at2
    FROM (SELECT *, (n_o + 1) // 2 AS k1, n_o // 2 + 1 AS k2 FROM coll_pos WHERE rank IN (SELECT rank FROM flagged))
),
after_others AS (
    SELECT m.peer_group, m.rank, sum(greatest(m.a_ns - (x.a_ns + y.a_ns) / 2, 0)) AS after_ns,
           mode(m.last_rank) FILTER (WHERE m.a_ns > (x.a_ns + y.a_ns) / 2 AND m.last_rank <> m.rank) AS pace_of
    FROM coll_mid m
    JOIN coll_pos x ON x.pg IS NOT DISTINCT FROM m.pg AND x.coll_kind IS NOT DISTINCT FROM m.coll_kind
                   AND x.instance = m.instance AND x.pos = m.at1
    JOIN coll_pos y ON y.pg IS NOT DISTINCT FROM m.pg AND y.coll_kind IS NOT DISTINCT FROM m.coll_kind
                   AND y.instance = m.instance AND y.pos = m.at2
    GROUP BY ALL
),
-- The run's profiled time per group (the cost's denominator): the median rank's total step time
-- over the steps compared, else the span of its compared MoE layers.
span AS (
    SELECT peer_group, median(t_ns) AS span_ns FROM (
        SELECT f.peer_group, f.rank,
               coalesce((SELECT sum(st.step_end_ns - st.step_start_ns) FROM _steps st
                         WHERE st.source_id = any_value(f.source_id)
                           AND st.step IN (SELECT DISTINCT i.step FROM inst i WHERE i.peer_group = f.peer_group)),
                        max(f.end_ns) - min(f.start_ns)) AS t_ns
        FROM f JOIN inst USING (peer_group, step, layer, occurrence)
        GROUP BY f.peer_group, f.rank)
    GROUP BY peer_group
),
-- The Shapley split of each excess: the token part's share, negative parts counted as 0. The
-- median rank without tokens: all of it is the rank's tokens; the rank without tokens: none.
split AS (
    SELECT *,
           CASE WHEN rt_g IS NULL THEN 1.0 WHEN rs_g IS NULL THEN 0.0
                ELSE greatest((rt_g - 1) * (1 + rs_g) / 2, 0)
                     / nullif(greatest((rt_g - 1) * (1 + rs_g) / 2, 0) + greatest((rs_g - 1) * (1 + rt_g) / 2, 0), 0)
           END AS tok_share_g,
           CASE WHEN rt_t IS NULL THEN 1.0 WHEN rs_t IS NULL THEN 0.0
                ELSE greatest((rt_t - 1) * (1 + rs_t) / 2, 0)
                     / nullif(greatest((rt_t - 1) * (1 + rs_t) / 2, 0) + greatest((rs_t - 1) * (1 + rt_t) / 2, 0), 0)
           END AS tok_share_t,
           -- weights of the quantities: their excesses; a significant quantity with no excess still
           -- names its cause
           CASE WHEN gmm_cost_ns + tr_cost_ns + host_cost_ns > 0 THEN gmm_cost_ns ELSE gmm_sig::INT END AS w_g,
           CASE WHEN gmm_cost_ns + tr_cost_ns + host_cost_ns > 0 THEN tr_cost_ns ELSE tr_sig::INT END AS w_t,
           CASE WHEN gmm_cost_ns + tr_cost_ns + host_cost_ns > 0 THEN host_cost_ns ELSE host_sig::INT END AS w_h
    FROM costed
),
shares AS (
    SELECT *,
           100.0 * (w_g * coalesce(tok_share_g, 0) + w_t * coalesce(tok_share_t, 0)) / (w_g + w_t + w_h) AS token_share_pct,
           100.0 * w_g * (1 - coalesce(tok_share_g, 0)) / (w_g + w_t + w_h) AS compute_share_pct,
           100.0 * w_t * (1 - coalesce(tok_share_t, 0)) / (w_g + w_t + w_h) AS comm_share_pct,
           100.0 * w_h / (w_g + w_t + w_h) AS host_share_pct
    FROM split
),
named0 AS (
    SELECT s.*, c.cause, c.pct AS cause_pct,
           list(c) OVER (PARTITION BY s.rank ORDER BY c.pct DESC, c.ord ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS ranked_causes,
           CASE c.cause WHEN 'slow-comm' THEN t_scope WHEN 'host-bound' THEN h_scope
                        ELSE CASE WHEN gmm_sig THEN g_scope ELSE coalesce(t_scope, h_scope) END END AS decided_scope
    FROM shares s,
         LATERAL (VALUES ('token-skew', s.token_share_pct, 1), ('slow-compute', s.compute_share_pct, 2),
                         ('slow-comm', s.comm_share_pct, 3), ('host-bound', s.host_share_pct, 4)) c(cause, pct, ord)
    QUALIFY row_number() OVER (PARTITION BY s.rank ORDER BY c.pct DESC, c.ord) = 1
),
-- From when (v8): the step after which the cause's excess appears. Per rank, the per-step excess
-- of its decided quantity (in its decided scope); the split of the compared steps that best
-- separates a quiet start from a hot end; said only when the start is quiet (its mean excess at
-- most a fifth of the end's).
steps_x AS (
    SELECT d.rank, d.step, dense_rank() OVER (PARTITION BY d.rank ORDER BY d.step) AS s_pos, sum(d.d) AS x_ns
    FROM diffs d JOIN (SELECT rank, CASE cause WHEN 'slow-comm' THEN 'transfer' WHEN 'host-bound' THEN 'host' ELSE 'gmm' END AS q,
                              decided_scope FROM named0) n
         ON d.rank = n.rank AND d.q = n.q AND (n.decided_scope = 'all' OR d.kind = n.decided_scope)
    GROUP BY d.rank, d.step
),
splits AS (
    SELECT a.rank, b.s_pos AS k, max(a.s_pos) AS n_steps,
           avg(a.x_ns) FILTER (WHERE a.s_pos < b.s_pos) AS before_ns,
           avg(a.x_ns) FILTER (WHERE a.s_pos >= b.s_pos) AS after_ns,
           count(*) FILTER (WHERE a.s_pos < b.s_pos) AS nb, count(*) FILTER (WHERE a.s_pos >= b.s_pos) AS na,
           any_value(b.step) AS onset_step
    FROM steps_x a JOIN steps_x b ON a.rank = b.rank AND b.s_pos > 1
    GROUP BY a.rank, b.s_pos
),
onset AS (
    SELECT rank, onset_step, n_steps, before_ns, after_ns FROM splits
    WHERE n_steps >= 3 AND after_ns > 0 AND greatest(before_ns, 0) <= 0.2 * after_ns
    QUALIFY row_number() OVER (PARTITION BY rank ORDER BY (after_ns - before_ns) * sqrt(nb * na / (nb + na)) DESC) = 1
),
-- With expert load in the same run (item 3 of issue 41), the hot experts of the onset: the
-- experts whose tokens this rank took most of (main_rank), in the load windows stamped between
-- the onset step's start on this rank and its last layer, against the windows before it. Only
-- windows inside the rank's profiled span count: load dumped on another clock (or another run)
-- names nothing rather than the wrong window.
onset_windows AS (
    SELECT o.rank, w.wseq, w.ts_ns >= o.on_ns AS after
    FROM (SELECT o.rank, min(f.start_ns) FILTER (WHERE f.step >= o.onset_step) AS on_ns,
                 min(f.start_ns) AS span_start_ns, max(f.end_ns) AS span_end_ns
          FROM onset o JOIN f USING (rank) GROUP BY o.rank) o
    JOIN _expert_windows w ON w.run = $run AND w.ts_ns BETWEEN o.span_start_ns AND o.span_end_ns
),
onset_experts AS (
    SELECT rank,
           string_agg(format('layer {} expert {} {:.1f}x{}', layer, expert, hot_after,
                             CASE WHEN hot_before IS NOT NULL THEN format(' (was {:.1f}x)', hot_before) ELSE '' END),
                      ', ' ORDER BY hot_after - coalesce(hot_before, 1) DESC, layer, expert) AS onset_hot_experts
    FROM (SELECT w.rank, e.layer, e.expert,
                 avg(e.hotness) FILTER (WHERE w.after) AS hot_after, avg(e.hotness) FILTER (WHERE NOT w.after) AS hot_before
          FROM onset_windows w JOIN _expert_logical_load e ON e.run = $run AND e.wseq = w.wseq AND e.main_rank = w.rank
          GROUP BY w.rank, e.layer, e.expert
          -- hot from then on: above its layer's mean expert after the onset, and hotter than before
          HAVING avg(e.hotness) FILTER (WHERE w.after) > 1
             AND avg(e.hotness) FILTER (WHERE w.after) > coalesce(avg(e.hotness) FILTER (WHERE NOT w.after), 1)
          QUALIFY row_number() OVER (PARTITION BY w.rank ORDER BY hot_after - coalesce(hot_before, 1) DESC, e.layer, e.expert) <= 3)
    GROUP BY rank
),
named AS (
    SELECT n.*, o.onset_step, o.n_steps, o.before_ns AS onset_before_ns, o.after_ns AS onset_after_ns,
           x.onset_hot_experts, a.after_ns, a.pace_of
    FROM named0 n LEFT JOIN onset o USING (rank) LEFT JOIN onset_experts x USING (rank)
    LEFT JOIN after_others a USING (peer_group, rank)
),
moe AS (SELECT peer_group, sum(med_layer_ns) AS moe_ns FROM med GROUP BY peer_group),
findings AS (
    SELECT n.*,
           -- the causes carrying >= min_share_pct, largest first; one cause alone is just its name
           CASE WHEN len(list_filter(ranked_causes, lambda c: c.pct >= $min_share_pct)) > 1
                THEN array_to_string(list_transform(list_filter(ranked_causes, lambda c: c.pct >= $min_share_pct),
                                                    lambda c: c.cause || ' ' || round(c.pct)::INTEGER || ' %'), ', ')
                ELSE cause END AS causes,
           list_transform(list_filter(ranked_causes, lambda c: c.pct >= $min_share_pct AND c.cause <> n.cause),
                          lambda c: c.cause) AS other_causes,
           -- the evidence of the cause that carries the most, in the scope it was decided in
           CASE n.cause WHEN 'slow-comm' THEN p_tr WHEN 'host-bound' THEN p_h
                        ELSE CASE WHEN gmm_sig THEN p_gmm ELSE coalesce(p_tr, p_h) END END AS p_value,
           CASE n.cause WHEN 'slow-comm' THEN [t_k, t_n_scope, t_n_all] WHEN 'host-bound' THEN [h_k, h_n_scope, h_n_all]
                        ELSE CASE WHEN gmm_sig THEN [g_k, g_n_scope, g_n_all]
                                  ELSE coalesce([t_k, t_n_scope, t_n_all], [h_k, h_n_scope, h_n_all]) END END AS kn,
           -- the fix's saving after the pace-setter's, where another rank sets the pace
           -- the fix's saving after the pace-setters', where it is meaningfully more than alone
           -- (not for the group's costliest card when its fix alone saves something: it sets the pace;
           -- slow ranks that tie, as four ranks doing more work, each save nothing alone)
           -- (when a pace-setter hides at least half of it: the others' noise alone never does)
           -- (and only behind a slow card or a straggler: behind a rank last by chance, the saving
           -- "after" it is the saving after removing the run's noise, which no fix does)
           CASE WHEN replayed AND least(coalesce(after_ns, 0), own_ns) + tr_cost_ns - cost_ns
                                  >= greatest($min_warn_pct / 100 * sp.span_ns, cost_ns)
                     -- the rank said to set the pace is a slow card or a straggler (v9)
                     AND (pace_of IN (SELECT rank FROM flagged) OR pace_of IN (SELECT rank FROM stragglers))
                     AND NOT (cost_ns = max(cost_ns) OVER (PARTITION BY n.peer_group) AND count(*) OVER (PARTITION BY n.peer_group) > 1
                              AND cost_ns >= $min_warn_pct / 100 * sp.span_ns)
                THEN least(coalesce(after_ns, 0), own_ns) + tr_cost_ns END AS after_pace_ns,
           -- what decides the level: the saving alone, after the pace-setter's, and in a group with
           -- two or more slow cards also the pace-setter's own saving once the others are fixed
           -- (fixing either first leaves the other setting the pace); slow cards whose excess is
           -- under min_warn_pct (not reported) do not count
           greatest(cost_ns,
                    CASE WHEN replayed AND count(*) FILTER (WHERE own_ns + tr_cost_ns >= $min_warn_pct / 100 * sp.span_ns)
                                               OVER (PARTITION BY n.peer_group) >= 2
                              AND own_ns + tr_cost_ns >= $min_warn_pct / 100 * sp.span_ns
                         THEN least(coalesce(after_ns, 0), own_ns) + tr_cost_ns ELSE 0 END) AS level_ns,
           sp.span_ns, moe.moe_ns
    FROM named n JOIN moe USING (peer_group) JOIN span sp USING (peer_group)
),
advice(cause, text) AS (
    VALUES ('token-skew', 'routing / expert placement imbalance: find the hot experts on this rank (expert-hotspots, ep-hot-chain), check the EPLB config and expert map, and the input distribution; rebalance or add redundant experts (eplb-whatif)'),
           ('slow-compute', 'slower GroupedMatmul per token: a device or process anomaly on this card (health, clocks/thermals, CPU binding, co-located jobs); not a routing problem, do not rebalance experts'),
           ('slow-comm', 'dispatch/combine transfer is slow on this rank for its tokens: check its links and NIC (HCCS/RoCE/NVLink), communication config (buffers, algorithm) and the network path'),
           ('host-bound', 'the device idles waiting for its host to launch the MoE kernels: look at the host side of this rank (Python / dispatch overhead, CPU binding and contention, co-located processes, synchronisations); CUDA graphs hide launches')
),
-- Truncated ranks (file cut mid-write): moe_layers leaves out the step the cut fell in (see
-- views/20_moe.sql), and with it that step and later for every rank; a rank with nothing before
-- its cut is left out whole. Said in each finding, so fewer layer instances are explained.
cuts AS (
    SELECT coalesce(string_agg(
               CASE WHEN n_kept > 0 THEN format('; rank {}''s trace is truncated: steps >= {} left out', rank, cut_step)
                    ELSE format('; rank {}''s trace is truncated in its first step: left out', rank) END
               || CASE WHEN n_kept > 0 AND NOT EXISTS (SELECT 1 FROM f WHERE f.rank = c.rank AND f.n_coll > 0)
                       THEN ', its collectives with the cut (whether the others waited for it not measured)'
                       ELSE '' END,
               '' ORDER BY rank), '') AS left_out
    FROM _layer_cuts c WHERE run = $run AND rank IS NOT NULL
),
-- Enough data to compare, or the reason there is not.
enough AS (
    SELECT CASE
               WHEN (SELECT n_groups FROM n_ranks) > 1 AND (SELECT max_n FROM n_ranks) < $min_ranks
                   THEN format('EP groups of at most {} rank(s) with MoE layers in this run; comparing a rank with the median rank of its EP group needs >= {}',
                               (SELECT max_n FROM n_ranks), $min_ranks)
               WHEN (SELECT n_groups FROM n_ranks) > 1 AND NOT EXISTS (SELECT 1 FROM judged)
                   THEN format('no EP group has MoE layer instances that all its ranks have: the sign test at alpha {} over {} ranks needs >= {} (profile more steps)',
                               $alpha, (SELECT n FROM n_ranks), ceil(log2((SELECT n FROM n_ranks) / $alpha))::INTEGER)
               WHEN (SELECT n FROM n_ranks) < $min_ranks
                   THEN format('{} rank(s) with MoE layers in this run; comparing a rank with the median rank needs >= {}',
                               (SELECT n FROM n_ranks), $min_ranks)
               WHEN (SELECT count(*) FROM inst) < ceil(log2((SELECT n FROM n_ranks) / $alpha))
                   THEN format('{} MoE layer instance(s) that all {} ranks have; the sign test at alpha {} needs >= {} (profile more steps)',
                               (SELECT count(*) FROM inst), (SELECT n FROM n_ranks), $alpha,
                               ceil(log2((SELECT n FROM n_ranks) / $alpha))::INTEGER)
           END AS skip_reason
)
SELECT CASE WHEN round(100.0 * greatest(level_ns, coalesce(after_pace_ns, 0)) / greatest(span_ns, 1), 1) >= $min_cost_pct
            THEN 'FAIL' ELSE 'WARN' END AS level,
       rank, cause, causes,
       round(cost_ns / 1e6, 3) AS cost_ms, round(100.0 * cost_ns / greatest(span_ns, 1), 1) AS cost_pct,
       CASE WHEN replayed THEN 'replay' ELSE 'excess' END AS saving_basis,
       round(100.0 * after_pace_ns / greatest(span_ns, 1), 1) AS after_pace_pct,
       CASE WHEN after_pace_ns IS NOT NULL THEN pace_of END AS pace_rank,
       round(100.0 * (gmm_cost_ns + host_cost_ns + tr_cost_ns) / greatest(moe_ns, 1), 1) AS excess_moe_pct,
       round(token_share_pct, 1) AS token_share_pct, round(compute_share_pct, 1) AS compute_share_pct,
       round(comm_share_pct, 1) AS comm_share_pct, round(host_share_pct, 1) AS host_share_pct,
       n AS layer_instances, decided_scope AS decided_kind,
       kn[2] AS decided_instances, round(100.0 * kn[1] / greatest(kn[2], 1), 1) AS above_pct, round(p_value, 6) AS p_value,
       CASE WHEN decided_scope = 'all' THEN format('{} layer instances', kn[2])
            ELSE format('the {} {} instances of {}', kn[2], decided_scope, kn[3]) END AS decided_in,
       onset_step,
       CASE WHEN onset_step IS NOT NULL
            THEN format('from step {} on (steps {}-{} compared): {:,.0f} us excess per step before it, {:,.0f} us from then on',
                        onset_step, (SELECT min(step) FROM steps_x s WHERE s.rank = findings.rank),
                        (SELECT max(step) FROM steps_x s WHERE s.rank = findings.rank),
                        greatest(onset_before_ns, 0) / 1e3, onset_after_ns / 1e3)
                 || coalesce('; hot experts on it from then: ' || onset_hot_experts, '') END AS onset,
       onset_hot_experts,
       CASE WHEN after_pace_ns IS NOT NULL
            THEN format('fixing rank {} alone saves {:.1f} %: {} the pace; after {}, rank {} saves {:.1f} %',
                        rank, 100.0 * cost_ns / greatest(span_ns, 1),
                        coalesce('rank ' || pace_of || ' sets', 'other ranks set'), coalesce('rank ' || pace_of, 'them'), rank,
                        100.0 * after_pace_ns / greatest(span_ns, 1))
            -- the pace-setter whose level its saving after the other slow cards decides
            WHEN level_ns > cost_ns
            THEN format('fixing rank {} alone saves {:.1f} %; with the other slow cards fixed too, {:.1f} %',
                        rank, 100.0 * cost_ns / greatest(span_ns, 1), 100.0 * level_ns / greatest(span_ns, 1)) END AS pace,
       round(tokens_per_layer, 1) AS tokens_per_layer, round(median_rank_tokens, 1) AS median_rank_tokens,
       CASE WHEN tokens_known THEN round(rt_gmm, 2) END AS token_ratio,
       round(rs_g, 2) AS time_per_token_ratio,
       round(gmm_ns_per_layer / 1e3, 1) AS gmm_us_per_layer, round(median_rank_gmm_ns / 1e3, 1) AS median_rank_gmm_us,
       round(time_ratio_gmm, 2) AS gmm_ratio,
       round(transfer_ns_per_layer / 1e3, 1) AS transfer_us_per_layer, round(time_ratio_tr, 2) AS transfer_ratio,
       round(host_wait_ns_per_layer / 1e3, 1) AS host_wait_us_per_layer,
       round(median_rank_host_wait_ns / 1e3, 1) AS median_rank_host_wait_us,
       round(last_arrival_pct, 1) AS last_arrival_pct, round(coalesce(others_lag_ns, 0) / 1e6, 3) AS others_wait_ms,
       round(span_ns / 1e6, 3) AS profiled_ms,
       -- whom the rank was compared with: its EP group's ranks (NULL without EP groups: every rank)
       findings.peer_group, CASE WHEN findings.peer_group <> 'all ranks' THEN judged.peers END AS peers,
       -- the numbers of the summary in words (parts the trace does not have are left out)
       concat_ws(', ',
           CASE WHEN tokens_known THEN format('tokens {:,.0f} per layer vs {:,.0f} for the median rank', tokens_per_layer, median_rank_tokens) END,
           format('GroupedMatmul {:.3g}x', time_ratio_gmm),
           CASE WHEN rs_g IS NOT NULL AND tokens_known THEN format('{:.3g}x per token', rs_g) END,
           CASE WHEN time_ratio_tr IS NOT NULL THEN format('transfer {:.3g}x', time_ratio_tr) END,
           CASE WHEN host_wait_ns_per_layer IS NOT NULL
                THEN format('waits for its host {:,.0f} us per layer vs {:,.0f} for the median rank',
                            host_wait_ns_per_layer / 1e3, median_rank_host_wait_ns / 1e3) END) AS work,
       CASE WHEN NOT tokens_known
            THEN '; no token counts in this trace: token-skew and slow-compute cannot be told apart (record all-to-all split sizes or shapes)'
            ELSE '' END AS caveat,
       cuts.left_out,
       (SELECT text FROM advice a WHERE a.cause = findings.cause)
           || coalesce((SELECT string_agg('; also ' || a.cause || ': ' || a.text, '' ORDER BY a.cause)
                        FROM advice a WHERE list_contains(findings.other_causes, a.cause)), '') AS next_step,
       NULL::VARCHAR AS skip_reason
FROM findings JOIN judged USING (peer_group), cuts, enough
WHERE enough.skip_reason IS NULL
  AND round(100.0 * greatest(level_ns, coalesce(after_pace_ns, 0)) / greatest(span_ns, 1), 1) >= $min_warn_pct
UNION ALL BY NAME
SELECT 'SKIP' AS level, skip_reason FROM enough WHERE skip_reason IS NOT NULL
ORDER BY level, cost_ms DESC NULLS LAST, rank   -- FAIL before WARN (a SKIP row is alone); the pace-setter first
