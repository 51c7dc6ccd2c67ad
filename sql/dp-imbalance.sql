-- name: dp-imbalance
-- version: 4
-- description: Hot DP domains: a data-parallel domain that gets more requests, heavier requests, runs slower or sits under KV-cache pressure beyond what chance gives, why (request-skew, token-skew, slow-execution, kv-pressure; config-mismatch as evidence), what it costs the service in first-token time, and whether the instance's P95/P99 rises with it.
-- requires: _dp_batches
-- param: window_s DOUBLE = 5.0        -- window length in seconds: execution time and KV usage are compared within the same window
-- param: min_windows INTEGER = 3      -- persistence: a request or token excess must survive leaving out its min_windows - 1 hottest windows (short runs: be above its share in min_windows windows)
-- param: alpha DOUBLE = 0.01          -- false-alarm rate per run: each of the 4 tests on each domain must reach a one-sided p < alpha / (4 x domains)
-- param: min_requests INTEGER = 40    -- fewer requests in the run cannot tell a hot domain from chance: SKIP
-- param: skew_ratio DOUBLE = 1.2      -- request-skew also needs this many requests vs the other domains' mean
-- param: token_ratio DOUBLE = 1.5     -- token-skew also needs this many tokens vs the other domains' mean
-- param: exec_ratio DOUBLE = 1.2      -- slow-execution also needs this median per-window execution time vs the other domains' median
-- param: kv_ratio DOUBLE = 1.5        -- kv-pressure also needs this mean KV usage vs the other domains' median
-- param: kv_min DOUBLE = 0.05         -- and a KV usage (0-1) this much above the others'
-- param: impact_ratio DOUBLE = 1.5    -- queue wait / first-token latency vs the other domains (or the instance's P99 vs its other windows) that counts as hurting
-- param: min_wait_ms DOUBLE = 20.0    -- a queue-wait or latency excess below this many ms does not hurt
-- verdict: fail if rows where impact > 0; warn if rows > 0
-- role: verdict
-- subject: dp_rank
-- priority: 30
-- order: 130
-- shows: report.dp
-- headline: {requests} requests ({requests_ratio}x the other domains' mean) | {tokens} tokens ({tokens_ratio}x the other domains' mean) | queue wait {queue_wait_ms} ms (other domains {others_queue_wait_ms} ms) | first-token P99 {ttft_p99_ms} ms (other domains {others_ttft_p99_ms} ms) | KV usage {kv_usage} (other domains {others_kv_usage}) of {total_blocks} blocks (other domains {others_total_blocks})
-- summary: DP {dp_rank}: {cause} [{level}] ({evidence}); cost {cost_ms} ms first-token time per request of this domain ({cost_pct} % of the instance's); impact: {impact_signals}; next: {next_step}
-- pass: No DP domain gets more requests, tokens, execution time or KV usage than chance gives (false-alarm rate {alpha} per run); {requests} requests over {domains} domains in {windows} windows of {window_s} s: a domain getting {detectable_request_ratio}x the others' requests would show in half of such runs (random dispatch; a balancing dispatcher shows less).

-- How it decides (the DP guide's steps, with statistics instead of fixed ratios on single windows;
-- with ~4 requests per domain in a 5 s window a 1.5x ratio is what chance gives):
--  * request-skew: the domain's requests against its fair share (1/n of each window's arrivals),
--    by two statistics, either of which may carry it:
--    - pooled over the run: z = (x - N/n) / sqrt(V), V the binomial N/n (1 - 1/n) (what a random
--      dispatcher gives: the most a count can tell there), or the measured sum of per-window excess
--      variances when the windows vary more than binomial (dispersion above its 95 % chi-square
--      bound: a burstier dispatcher);
--    - steady excess, with >= 10 windows once the domain's min_windows - 1 windows of largest excess
--      are left out (a burst cannot carry it): a one-sample t-test of the per-window excess
--      (n_w - N_w/n). A balancing dispatcher (round robin) keeps counts within one of the share, so
--      its steady excess stands out far beyond binomial chance.
--    Persistence: the domain is above its share in >= min_windows windows, and its requests reach
--    skew_ratio x the other domains' mean over the run (a 3 s burst does not).
--  * token-skew: prompt+output lengths are heavy-tailed (lognormal), so token SUMS are tested on the
--    log scale: Welch's z of the mean log(tokens) per request of the domain vs the other domains'
--    requests (same persistence rule), required together with a token-sum ratio >= token_ratio. Only when
--    requests are not significant (more requests AND more tokens is request-skew).
--  * slow-execution: per window, the domain's mean batch execution time vs the other domains'
--    median. Under no difference it is above in half of the windows (sign test over windows), and
--    the median ratio must reach exec_ratio. Only when requests and tokens are not significant and
--    similar (below skew_ratio and token_ratio).
--  * kv-pressure: the same sign test on the mean KV usage per window, with the run's mean usage
--    >= kv_ratio x the others' and kv_min above; only when requests, tokens and execution are not
--    significant and similar (KV usage follows load; a domain that fills its KV on equal load has
--    less of it): the KV ratio is asked per unit of load (divided by the larger of the request and
--    token ratios).
-- Each test is one-sided at alpha / (4 x domains) (Bonferroni over tests and domains), so a
-- balanced run gives any finding with probability <= alpha. The critical z comes from alpha with
-- Abramowitz & Stegun 26.2.23 (error < 5e-4).
--  * config-mismatch: a domain whose KV pool (batch.csv total_blocks) differs from the other
--    domains' most common one is its own WARN finding, and the likely root cause of that domain's
--    other finding (root_cause). Block size and max batch are not in the service files.
-- Impact, i.e. what the fix saves: the domain's requests against the other domains' requests over
-- the run (mean queue wait, mean and P99 first-token latency; the waiting-queue counters when the run
-- has no request.csv), and the instance's P95/P99 first-token and end-to-end latency in the domain's
-- hot windows against its other windows (the guide's step 3). cost_ms = the mean first-token excess
-- of the domain's requests, cost_pct = that excess over all its requests as a share of the
-- instance's total first-token time. A significant finding is FAIL with impact, WARN without.
WITH t0 AS (
    SELECT t0_ns FROM _dp_t0 WHERE run = $run
),
dom AS (
    SELECT DISTINCT dp_rank FROM _dp_batches WHERE run = $run
),
nd AS (
    SELECT count(*) AS k, string_agg('dp' || dp_rank, ', ' ORDER BY dp_rank) AS names FROM dom
),
-- one-sided critical z for alpha / (4 tests x domains)
crit AS (
    SELECT sqrt(-2 * ln(p)) - (2.515517 + 0.802853 * sqrt(-2 * ln(p)) + 0.010328 * (-2 * ln(p)))
           / (1 + 1.432788 * sqrt(-2 * ln(p)) + 0.189269 * (-2 * ln(p)) + 0.001308 * pow(sqrt(-2 * ln(p)), 3)) AS z_crit
    FROM (SELECT least(0.5, $alpha / (4.0 * greatest(k, 1))) AS p FROM nd)
),
-- Requests by arrival window: what each domain was ASKED to do (request.csv arrival and tokens when
-- the run has it, else the first scheduling and the res_list tokens).
q AS (
    SELECT r.*, CAST(floor((r.arrival_ns - t0.t0_ns) / ($window_s * 1e9)) AS BIGINT) AS w,
           coalesce(r.input_tokens, 0) + coalesce(r.output_tokens, 0) AS tok
    FROM _dp_requests r, t0 WHERE r.run = $run AND r.dp_rank IN (SELECT dp_rank FROM dom)
),
-- every (window, domain), so a domain with no arrivals in a window counts 0
cnt AS (
    SELECT g.w, g.dp_rank, count(q.rid) AS n, coalesce(sum(q.tok), 0) AS tok
    FROM (SELECT w, dp_rank FROM (SELECT DISTINCT w FROM q), dom) g
    LEFT JOIN q USING (w, dp_rank)
    GROUP BY g.w, g.dp_rank
),
shares AS (
    SELECT c.*, sum(n) OVER (PARTITION BY w) AS n_all, sum(tok) OVER (PARTITION BY w) AS tok_all
    FROM cnt c
),
-- long runs (>= 10 windows once min_windows - 1 are left out) leave out each domain's min_windows - 1
-- hottest windows; short runs keep every window (leaving out half of 4 windows would blind the test)
-- and ask the domain to be above its share in min_windows windows instead
regime AS (
    SELECT count(DISTINCT w) AS n_windows,
           CASE WHEN count(DISTINCT w) - ($min_windows - 1) >= 10 THEN $min_windows - 1 ELSE 0 END AS drop_n
    FROM q
),
ranked AS (
    SELECT s.*, nd.k, regime.drop_n,
           row_number() OVER (PARTITION BY dp_rank ORDER BY n - n_all / nd.k DESC, w) AS req_rank,
           row_number() OVER (PARTITION BY dp_rank ORDER BY tok - tok_all / nd.k DESC, w) AS tok_rank
    FROM shares s, nd, regime
),
req_test AS (
    SELECT dp_rank, any_value(k) AS k, any_value(drop_n) AS drop_n,
           sum(n) AS requests, sum(n_all) - sum(n) AS others_requests,
           sum(tok) AS tokens, sum(tok_all) - sum(tok) AS others_tokens,
           sum(n) FILTER (WHERE req_rank > drop_n) AS x_kept,
           sum(n_all) FILTER (WHERE req_rank > drop_n) AS n_kept,
           count(*) FILTER (WHERE req_rank > drop_n) AS w_kept,
           count(*) AS w_all,
           stddev_samp(n - n_all / k) AS excess_sd_all,
           avg(n - n_all / k) FILTER (WHERE req_rank > drop_n) AS excess_mean,
           stddev_samp(n - n_all / k) FILTER (WHERE req_rank > drop_n) AS excess_sd,
           count(*) FILTER (WHERE n > n_all / k) AS req_hot_windows,
           count(*) FILTER (WHERE tok > tok_all / k) AS tok_hot_windows
    FROM ranked GROUP BY dp_rank
),
-- log(tokens) per request, the domain's against the other domains' (the domain's hottest token
-- windows left out on both sides of the comparison)
tok_kept AS (
    SELECT q.dp_rank AS own, o.dp_rank, ln(greatest(q.tok, 1)) AS lt
    FROM q JOIN ranked o ON o.w = q.w
    WHERE o.tok_rank > o.drop_n
),
tok_test AS (
    SELECT dp_rank,
           avg(lt) FILTER (WHERE own = dp_rank) AS m1, var_samp(lt) FILTER (WHERE own = dp_rank) AS v1,
           count(*) FILTER (WHERE own = dp_rank) AS n1,
           avg(lt) FILTER (WHERE own <> dp_rank) AS m0, var_samp(lt) FILTER (WHERE own <> dp_rank) AS v0,
           count(*) FILTER (WHERE own <> dp_rank) AS n0
    FROM tok_kept GROUP BY dp_rank
),
-- per-window execution time and KV usage, each domain against the median of the others. These
-- windows are window_s long, or shorter when the arrivals span fewer than 20 of them (the domains
-- run side by side while requests arrive): a sign test needs about 13 windows all one way to
-- reach p < 0.01 / 16.
pw AS (
    SELECT least($window_s, greatest((max(q.arrival_ns) - any_value(t0.t0_ns)) / 1e9 / 20, 0.5)) AS pw_s
    FROM q, t0
),
ex AS (
    SELECT e.dp_rank, CAST(floor((e.start_ns - t0.t0_ns) / (pw.pw_s * 1e9)) AS BIGINT) AS w, avg(e.during_ms) AS v
    FROM _dp_exec e, t0, pw WHERE e.run = $run GROUP BY ALL
),
kvw AS (
    SELECT k.dp_rank, CAST(floor((k.ts_ns - t0.t0_ns) / (pw.pw_s * 1e9)) AS BIGINT) AS w,
           avg(k.kv_usage) AS v, min(k.free_blocks) AS min_free
    FROM _dp_kv k, t0, pw WHERE k.run = $run AND k.kv_usage IS NOT NULL GROUP BY ALL
),
paired AS (
    SELECT 'exec' AS metric, f.dp_rank, f.w, any_value(f.v) AS v, median(o.v) AS o_v
    FROM ex f JOIN ex o ON o.w = f.w AND o.dp_rank <> f.dp_rank GROUP BY f.dp_rank, f.w
    UNION ALL
    SELECT 'kv', f.dp_rank, f.w, any_value(f.v), median(o.v)
    FROM kvw f JOIN kvw o ON o.w = f.w AND o.dp_rank <> f.dp_rank GROUP BY f.dp_rank, f.w
),
sign_test AS (
    SELECT dp_rank, metric, count(*) AS nw, count(*) FILTER (WHERE v > o_v) AS above,
           median(v / nullif(o_v, 0)) AS median_ratio, avg(v) AS mean_v, avg(o_v) AS mean_o_v
    FROM paired GROUP BY dp_rank, metric
),
kv_cfg AS (
    SELECT dp_rank, max(total_blocks) AS total_blocks, min(free_blocks) AS min_free_blocks
    FROM _dp_kv WHERE run = $run GROUP BY dp_rank
),
-- the KV pool most domains have (ties: the larger); a domain with another one is a config mismatch
cfg_mode AS (
    SELECT total_blocks AS mode_blocks FROM kv_cfg WHERE total_blocks IS NOT NULL
    GROUP BY total_blocks ORDER BY count(*) DESC, total_blocks DESC LIMIT 1
),
tests AS (
    SELECT r.dp_rank, r.k, r.drop_n, r.w_all, r.w_kept, c.z_crit, r.requests, r.tokens, r.req_hot_windows, r.tok_hot_windows,
           r.requests / nullif(r.others_requests / (r.k - 1.0), 0) AS requests_ratio,
           r.tokens / nullif(r.others_tokens / (r.k - 1.0), 0) AS tokens_ratio,
           -- pooled over every window: the domain's requests against its share of all arrivals. The
           -- variance is the binomial one (a random dispatcher) unless the windows vary more than that
           -- (dispersion above its 95 % chi-square bound: a burstier dispatcher), then the measured one
           (r.requests - (r.requests + r.others_requests) / r.k)
               / nullif(sqrt(CASE WHEN r.w_all >= 3 AND r.w_all * pow(coalesce(r.excess_sd_all, 0), 2)
                                      > (r.requests + r.others_requests) * (1.0 / r.k) * (1 - 1.0 / r.k)
                                        * (1 + 1.645 * sqrt(2.0 / (r.w_all - 1)))
                                  THEN r.w_all * pow(r.excess_sd_all, 2)
                                  ELSE (r.requests + r.others_requests) * (1.0 / r.k) * (1 - 1.0 / r.k) END), 0) AS requests_z,
           -- with >= 10 windows after the hottest are left out: a t-test on the per-window excess
           -- (variance from the windows: a balancing dispatcher keeps counts within one of the share,
           -- so a steady excess stands out far beyond binomial chance); counts are integers, so a
           -- spread below a quarter request is rounding
           CASE WHEN r.drop_n > 0 OR r.w_kept >= 10
                THEN r.excess_mean / (greatest(r.excess_sd, 0.25) / sqrt(r.w_kept)) END AS requests_t,
           -- the t critical value for w_kept - 1 degrees of freedom (Cornish-Fisher from z_crit)
           CASE WHEN r.drop_n > 0 OR r.w_kept >= 10
                THEN c.z_crit + (pow(c.z_crit, 3) + c.z_crit) / (4.0 * (r.w_kept - 1))
                     + (5 * pow(c.z_crit, 5) + 16 * pow(c.z_crit, 3) + 3 * c.z_crit) / (96.0 * pow(r.w_kept - 1, 2))
           END AS requests_t_crit,
           (t.m1 - t.m0) / nullif(sqrt(t.v1 / t.n1 + t.v0 / t.n0), 0) AS tokens_z,
           e.median_ratio AS exec_ratio, e.above AS exec_above, e.nw AS exec_windows,
           (e.above - e.nw / 2.0 - 0.5) / nullif(sqrt(e.nw / 4.0), 0) AS exec_z,
           kv.mean_v AS kv_usage, kv.mean_o_v AS others_kv_usage, kv.mean_v / nullif(kv.mean_o_v, 0) AS kv_ratio,
           kv.above AS kv_above, kv.nw AS kv_windows,
           (kv.above - kv.nw / 2.0 - 0.5) / nullif(sqrt(kv.nw / 4.0), 0) AS kv_z,
           g.total_blocks, g.min_free_blocks, m.mode_blocks AS others_total_blocks
    FROM req_test r
    CROSS JOIN crit c
    LEFT JOIN tok_test t USING (dp_rank)
    LEFT JOIN sign_test e ON e.dp_rank = r.dp_rank AND e.metric = 'exec'
    LEFT JOIN sign_test kv ON kv.dp_rank = r.dp_rank AND kv.metric = 'kv'
    LEFT JOIN kv_cfg g ON g.dp_rank = r.dp_rank
    LEFT JOIN cfg_mode m ON true
),
judged AS (
    SELECT *,
           coalesce((requests_z >= z_crit OR requests_t >= requests_t_crit) AND requests_ratio >= $skew_ratio
                    AND req_hot_windows >= $min_windows, false) AS sig_req,
           coalesce(tokens_z >= z_crit AND tokens_ratio >= $token_ratio
                    AND (drop_n > 0 OR tok_hot_windows >= $min_windows), false) AS sig_tok,
           coalesce(exec_z >= z_crit AND exec_ratio >= $exec_ratio, false) AS sig_exec,
           -- KV usage follows load: the ratio is asked of the KV usage per unit of load (the larger of
           -- the request and token ratios), so a domain that is merely a little busier is not KV pressure
           coalesce(kv_z >= z_crit AND kv_ratio >= $kv_ratio * greatest(requests_ratio, tokens_ratio, 1.0)
                    AND kv_usage - others_kv_usage >= $kv_min, false) AS sig_kv,
           coalesce(total_blocks <> others_total_blocks, false) AS cfg_differs
    FROM tests
),
-- the guide's order: more requests AND more tokens, then heavier requests, then slower, then KV
causes AS (
    -- (slower or fuller on SIMILAR load: requests and tokens below the ratios that count as more)
    SELECT *, CASE WHEN sig_req THEN 'request-skew' WHEN sig_tok THEN 'token-skew'
                   WHEN requests_ratio >= $skew_ratio OR tokens_ratio >= $token_ratio THEN NULL
                   WHEN sig_exec THEN 'slow-execution' WHEN sig_kv THEN 'kv-pressure' END AS cause
    FROM judged
    UNION ALL
    -- the configuration difference is a finding of its own
    SELECT *, 'config-mismatch' FROM judged WHERE cfg_differs
),
found AS (
    SELECT * FROM causes WHERE cause IS NOT NULL
),
-- the domain's hot windows for its cause: where its own measure is above its share / the others
hot_w AS (
    SELECT f.dp_rank, f.cause, s.w FROM found f JOIN shares s ON s.dp_rank = f.dp_rank
    WHERE (f.cause = 'request-skew' AND s.n > s.n_all / f.k) OR (f.cause = 'token-skew' AND s.tok > s.tok_all / f.k)
    UNION ALL
    -- (paired windows may be shorter: a window_s window is hot when most of its paired ones are)
    SELECT f.dp_rank, f.cause, CAST(floor(p.w * pw.pw_s / $window_s) AS BIGINT) AS w
    FROM found f JOIN paired p ON p.dp_rank = f.dp_rank, pw
    WHERE (f.cause = 'slow-execution' AND p.metric = 'exec')
       OR (f.cause IN ('kv-pressure', 'config-mismatch') AND p.metric = 'kv')
    GROUP BY ALL HAVING avg(CASE WHEN p.v > p.o_v THEN 1.0 ELSE 0.0 END) >= 0.5
),
hot_span AS (
    SELECT dp_rank, cause, count(DISTINCT w) AS hot_windows, min(w) AS first_w, max(w) AS last_w
    FROM hot_w GROUP BY dp_rank, cause
),
-- does it hurt? the domain's requests against the other domains' requests over the run
lat AS (
    SELECT f.dp_rank,
           count(*) FILTER (WHERE q.dp_rank = f.dp_rank) AS n_own,
           avg(q.queue_wait_ms) FILTER (WHERE q.dp_rank = f.dp_rank) AS queue_wait_ms,
           avg(q.queue_wait_ms) FILTER (WHERE q.dp_rank <> f.dp_rank) AS others_queue_wait_ms,
           avg(q.first_token_latency_ms) FILTER (WHERE q.dp_rank = f.dp_rank) AS ttft_mean_ms,
           avg(q.first_token_latency_ms) FILTER (WHERE q.dp_rank <> f.dp_rank) AS others_ttft_mean_ms,
           quantile_cont(q.first_token_latency_ms, 0.99) FILTER (WHERE q.dp_rank = f.dp_rank) AS ttft_p99_ms,
           quantile_cont(q.first_token_latency_ms, 0.99) FILTER (WHERE q.dp_rank <> f.dp_rank) AS others_ttft_p99_ms,
           sum(q.first_token_latency_ms) AS instance_ttft_total_ms
    FROM (SELECT DISTINCT dp_rank FROM found) f CROSS JOIN q
    GROUP BY f.dp_rank
),
-- the instance's tail latency (all domains' requests) in the domain's hot windows vs its other windows
inst AS (
    SELECT f.dp_rank, f.cause,
           quantile_cont(q.first_token_latency_ms, 0.95) FILTER (WHERE h.w IS NOT NULL) AS instance_ttft_p95_ms,
           quantile_cont(q.first_token_latency_ms, 0.99) FILTER (WHERE h.w IS NOT NULL) AS instance_ttft_p99_ms,
           quantile_cont(q.first_token_latency_ms, 0.99) FILTER (WHERE h.w IS NULL) AS instance_ttft_p99_other_ms,
           quantile_cont(q.execution_ms, 0.95) FILTER (WHERE h.w IS NOT NULL) AS instance_e2e_p95_ms,
           quantile_cont(q.execution_ms, 0.99) FILTER (WHERE h.w IS NOT NULL) AS instance_e2e_p99_ms,
           quantile_cont(q.execution_ms, 0.99) FILTER (WHERE h.w IS NULL) AS instance_e2e_p99_other_ms,
           count(*) FILTER (WHERE h.w IS NULL) AS other_requests
    FROM found f CROSS JOIN q
    LEFT JOIN hot_w h ON h.dp_rank = f.dp_rank AND h.cause = f.cause AND h.w = q.w
    GROUP BY f.dp_rank, f.cause
),
waits AS (
    SELECT f.dp_rank,
           avg(x.waiting) FILTER (WHERE x.dp_rank = f.dp_rank) AS waiting_mean,
           avg(x.waiting) FILTER (WHERE x.dp_rank <> f.dp_rank) AS others_waiting_mean
    FROM (SELECT DISTINCT dp_rank FROM found) f CROSS JOIN _dp_waiting x
    WHERE x.run = $run
    GROUP BY f.dp_rank
),
signals AS (
    SELECT f.*, h.hot_windows, h.first_w, h.last_w,
           l.n_own, l.queue_wait_ms, l.others_queue_wait_ms, l.ttft_mean_ms, l.others_ttft_mean_ms,
           l.ttft_p99_ms, l.others_ttft_p99_ms, l.instance_ttft_total_ms,
           i.instance_ttft_p95_ms, i.instance_ttft_p99_ms, i.instance_ttft_p99_other_ms,
           i.instance_e2e_p95_ms, i.instance_e2e_p99_ms, i.instance_e2e_p99_other_ms,
           x.waiting_mean, x.others_waiting_mean,
           coalesce(x.waiting_mean - x.others_waiting_mean >= 1
                    AND x.waiting_mean >= $impact_ratio * x.others_waiting_mean, false) AS s_queue,
           coalesce(l.queue_wait_ms - l.others_queue_wait_ms >= $min_wait_ms
                    AND l.queue_wait_ms >= $impact_ratio * l.others_queue_wait_ms, false) AS s_wait,
           coalesce(l.ttft_p99_ms - l.others_ttft_p99_ms >= $min_wait_ms
                    AND l.ttft_p99_ms >= $impact_ratio * l.others_ttft_p99_ms, false) AS s_latency,
           -- only with enough other windows to compare with (a run-long skew has few)
           coalesce(i.other_requests >= 20 AND i.instance_ttft_p99_ms - i.instance_ttft_p99_other_ms >= $min_wait_ms
                    AND i.instance_ttft_p99_ms >= $impact_ratio * i.instance_ttft_p99_other_ms, false) AS s_instance
    FROM found f
    LEFT JOIN hot_span h USING (dp_rank, cause)
    LEFT JOIN lat l USING (dp_rank)
    LEFT JOIN inst i USING (dp_rank, cause)
    LEFT JOIN waits x USING (dp_rank)
),
rows_out AS (
    SELECT *,
           -- the configuration difference alone is WARN: it is the likely root cause of the domain's
           -- other finding, which carries the impact
           cause <> 'config-mismatch' AND (s_wait OR s_queue OR s_latency OR s_instance) AS impact_,
           greatest(ttft_mean_ms - others_ttft_mean_ms, 0) AS cost_ms_,
           CASE WHEN cfg_differs THEN 'dp' || dp_rank || ' has ' || total_blocks || ' KV blocks, the others '
                || others_total_blocks END AS cfg_note
    FROM signals
)
SELECT dp_rank,
       cause,
       CASE WHEN impact_ THEN 'FAIL' ELSE 'WARN' END AS level,
       impact_ AS impact,
       round(cost_ms_, 1) AS cost_ms,
       round(100.0 * cost_ms_ * n_own / nullif(instance_ttft_total_ms, 0), 1) AS cost_pct,
       CASE cause
           WHEN 'request-skew' THEN round(requests_ratio, 2) || 'x requests ('
                || CASE WHEN requests_z >= z_crit
                        THEN 'z ' || round(requests_z, 1) || ' >= ' || round(z_crit, 1) || ' over ' || w_all || ' windows'
                        ELSE 'steady excess: t ' || round(requests_t, 1) || ' >= ' || round(requests_t_crit, 1) || ' over ' || w_kept || ' windows' END || ')'
           WHEN 'token-skew' THEN round(tokens_ratio, 2) || 'x tokens, ' || round(requests_ratio, 2) || 'x requests (log-token z ' || round(tokens_z, 1) || ' >= ' || round(z_crit, 1) || ')'
           WHEN 'slow-execution' THEN round(exec_ratio, 2) || 'x execution time in ' || exec_above || ' of ' || exec_windows || ' windows, ' || round(requests_ratio, 2) || 'x requests, ' || round(tokens_ratio, 2) || 'x tokens'
           WHEN 'kv-pressure' THEN 'KV usage ' || round(kv_usage, 2) || ' vs ' || round(others_kv_usage, 2) || ' (' || round(kv_ratio, 1) || 'x) in ' || kv_above || ' of ' || kv_windows || ' windows, min free blocks ' || coalesce(CAST(min_free_blocks AS VARCHAR), '?') || ', ' || round(requests_ratio, 2) || 'x requests, ' || round(tokens_ratio, 2) || 'x tokens'
           ELSE cfg_note
       END || CASE WHEN cause <> 'config-mismatch' AND cfg_note IS NOT NULL THEN '; likely root cause: ' || cfg_note ELSE '' END AS evidence,
       cfg_note AS root_cause,
       hot_windows,
       round(first_w * $window_s, 3) AS first_hot_s,
       round((last_w + 1) * $window_s, 3) AS last_hot_s,
       requests, round(requests_ratio, 2) AS requests_ratio, round(requests_z, 2) AS requests_z,
       tokens, round(tokens_ratio, 2) AS tokens_ratio, round(tokens_z, 2) AS tokens_z,
       round(exec_ratio, 2) AS exec_ratio, exec_above, exec_windows, round(exec_z, 2) AS exec_z,
       round(kv_usage, 3) AS kv_usage, round(others_kv_usage, 3) AS others_kv_usage,
       round(kv_ratio, 2) AS kv_ratio, round(kv_z, 2) AS kv_z, min_free_blocks,
       total_blocks, others_total_blocks,
       round(requests_t, 2) AS requests_t, round(requests_t_crit, 2) AS requests_t_crit, round(z_crit, 2) AS z_crit,
       round(queue_wait_ms, 1) AS queue_wait_ms, round(others_queue_wait_ms, 1) AS others_queue_wait_ms,
       round(ttft_mean_ms, 1) AS ttft_mean_ms, round(others_ttft_mean_ms, 1) AS others_ttft_mean_ms,
       round(ttft_p99_ms, 1) AS ttft_p99_ms, round(others_ttft_p99_ms, 1) AS others_ttft_p99_ms,
       round(waiting_mean, 2) AS waiting_mean, round(others_waiting_mean, 2) AS others_waiting_mean,
       round(instance_ttft_p95_ms, 1) AS instance_ttft_p95_ms, round(instance_ttft_p99_ms, 1) AS instance_ttft_p99_ms,
       round(instance_ttft_p99_other_ms, 1) AS instance_ttft_p99_other_ms,
       round(instance_e2e_p95_ms, 1) AS instance_e2e_p95_ms, round(instance_e2e_p99_ms, 1) AS instance_e2e_p99_ms,
       round(instance_e2e_p99_other_ms, 1) AS instance_e2e_p99_other_ms,
       coalesce(nullif(concat_ws(', ',
           CASE WHEN s_wait THEN 'longer queue wait' END,
           CASE WHEN s_queue THEN 'more waiting requests' END,
           CASE WHEN s_latency THEN 'higher first-token P99' END,
           CASE WHEN s_instance THEN 'instance first-token P99 rises in its hot windows' END), ''), 'none') AS impact_signals,
       CASE cause
           WHEN 'request-skew' THEN 'rebalance the DP scheduler: requests pile onto this domain (fixed-order or sticky assignment); check the scheduling policy, the DP assignment and request stickiness'
           WHEN 'token-skew' THEN 'balance DP assignment by input/output tokens instead of request count, or schedule long requests separately; check request logs and length statistics for long inputs/outputs concentrated here'
           WHEN 'slow-execution' THEN 'same load but slower: compare this domain''s device utilisation, error logs, process and communication with the others (profiler execution time), and check that its model, parallel and memory configuration match the other domains'
           WHEN 'kv-pressure' THEN 'KV pressure: admit fewer requests into this domain (cap its admission) or balance KV levels across domains until its KV usage matches the others'
           ELSE 'align start-up and deployment configuration: model, parallel and memory settings (KV blocks, gpu memory utilisation, block size, max batch) must be the same on every DP domain'
       END || CASE WHEN cause NOT IN ('config-mismatch') AND cfg_note IS NOT NULL
                   THEN '; first align its configuration with the other domains (' || cfg_note || ')' ELSE '' END AS next_step,
       CAST(NULL AS VARCHAR) AS skip_reason
FROM rows_out
WHERE (SELECT k FROM nd) >= 2 AND (SELECT count(*) FROM q) >= $min_requests
UNION ALL BY NAME
-- not enough to compare: one SKIP row saying why (the other columns NULL)
SELECT
       CASE WHEN nd.k < 2 THEN 'only one DP domain (' || nd.names || ') in this run: nothing to compare it with'
            ELSE 'only ' || (SELECT count(*) FROM q) || ' requests over ' || nd.k || ' DP domains; at least '
                 || $min_requests || ' (min_requests) are needed to tell a hot domain from chance' END AS skip_reason
FROM nd
WHERE nd.k < 2 OR (SELECT count(*) FROM q) < $min_requests
UNION ALL BY NAME
-- PASS: one context row, not a finding (level PASS), saying what the PASS rests on: the requests
-- and windows, and the request skew this run could have shown, the domain count that reaches
-- z_crit against binomial chance (the pooled statistic finds it in half of such runs; under a
-- balancing dispatcher the steady-excess test finds less), at least skew_ratio
SELECT 'PASS' AS level, n_req AS requests, k AS domains, n_windows AS windows, round(z_crit, 2) AS z_crit,
       round(greatest($skew_ratio, x_min / ((n_req - x_min) / (k - 1))), 2) AS detectable_request_ratio
FROM (SELECT *, n_req / k + z_crit * sqrt(n_req / k * (1 - 1 / k)) AS x_min
      FROM (SELECT nd.k, (SELECT count(*) FROM q) AS n_req, regime.n_windows, crit.z_crit FROM nd, regime, crit))
WHERE k >= 2 AND n_req >= $min_requests AND NOT EXISTS (SELECT 1 FROM rows_out)
ORDER BY level, cost_pct DESC NULLS LAST, dp_rank, cause
