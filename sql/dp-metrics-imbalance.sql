-- name: dp-metrics-imbalance
-- version: 3
-- description: Hot DP domain from live metrics (slowcard watch): a domain whose share of requests, tokens, waiting requests or KV cache stays above the others over the latest consecutive windows without converging, while the instance's P95/P99 TTFT or e2e latency rises.
-- requires: metric_windows
-- param: skew_ratio DOUBLE = 1.3        -- hot in a window: requests/s, tokens/s, waiting or KV usage >= this x the other domains' median
-- param: z DOUBLE = 3.0                -- requests/tokens must also exceed the others' median by z Poisson sigmas of the window's request count (low traffic is noisy)
-- param: min_waiting DOUBLE = 4.0       -- waiting requests must exceed the others' median by at least this many (a queue of 1-2 is noise)
-- param: min_kv DOUBLE = 0.3            -- KV usage (0-1) below this never makes a domain hot
-- param: min_windows INTEGER = 3        -- consecutive hot windows, up to the latest one, before a domain counts (shorter is traffic jitter)
-- param: latency_rise DOUBLE = 1.2      -- instance P95/P99 (TTFT or e2e) at the streak's end vs before it that counts as rising
-- param: converge_tolerance DOUBLE = 0.25 -- the share gap may close by this fraction over the streak and still count as not converging
-- verdict: fail if rows where latency_rising > 0; warn if rows > 0
-- role: verdict
-- subject: dp_rank
-- priority: 35
-- order: 135
-- shows: report.dp
-- headline: {share_pct} % share of the {signal} ({ratio}x the other domains' median) over the last {hot_windows} windows | {value_now} now vs the other domains' median {others_median_now} | instance {latency_metric} {latency_now_ms} ms (before the streak {latency_before_ms} ms)
-- summary: DP {dp_rank}: {cause} over the last {hot_windows} windows ({signal}: {share_pct}% share, {ratio}x the other domains' median); instance {latency_metric} {latency_before_ms} -> {latency_now_ms} ms; next: {next_step}
-- pass: No DP domain stays hot over the last {min_windows} consecutive metric windows.
--
-- Method (DP guide, online first): per window, each domain's requests/s, tokens/s, waiting
-- requests and KV usage are compared with the median of the OTHER domains in the same window;
-- requests and tokens only count above the counting noise (z sigmas of a Poisson count of the
-- others' requests in the window: at 7 requests a window that is 2.1x, at 150 it is skew_ratio).
-- The streak is the run of consecutive windows hot on the same signal reaching the latest window, so the
-- verdict turns back to PASS when the domain cools down. A streak shorter than min_windows is
-- traffic jitter. Diverging: the share gap (share - 1/domains) of the cause's signal over the
-- last two windows is not smaller than (1 - converge_tolerance) x its gap over the first two.
-- FAIL when the instance latency also rose: the mean of the last two streak windows' P95 or P99
-- (TTFT or e2e) >= latency_rise x its median over the windows before the streak (else the
-- streak's first window). Counter resets are already absorbed in the windows (reset column).
-- Fewer than 2 DP domains in the metrics (a single-engine instance): SKIP with the reason, never
-- a PASS that could not have been anything else.
WITH w AS MATERIALIZED (
    SELECT *, dense_rank() OVER (ORDER BY ts_ns) AS wseq FROM metric_windows WHERE run = $run
), last_w AS (
    SELECT max(wseq) AS lw FROM w
), n_dom AS (
    SELECT wseq, count(*) AS n_domains FROM w WHERE dp_rank IS NOT NULL GROUP BY wseq
), sig AS (         -- one row per (window, domain, signal)
    SELECT wseq, dp_rank, window_s, 'requests/s' AS signal, requests_per_s AS value FROM w WHERE dp_rank IS NOT NULL
    UNION ALL SELECT wseq, dp_rank, window_s, 'tokens/s', tokens_per_s FROM w WHERE dp_rank IS NOT NULL
    UNION ALL SELECT wseq, dp_rank, window_s, 'waiting requests', waiting FROM w WHERE dp_rank IS NOT NULL
    UNION ALL SELECT wseq, dp_rank, window_s, 'KV usage', kv_usage FROM w WHERE dp_rank IS NOT NULL
), ranked AS (     -- the values of a window and signal in order (ties by domain): positions, for the median of the others
    SELECT wseq, dp_rank, window_s, signal, value,
           row_number() OVER (PARTITION BY wseq, signal ORDER BY value, dp_rank) AS pos,
           count(*) OVER (PARTITION BY wseq, signal) - 1 AS n_others,
           count(*) OVER (PARTITION BY wseq, signal, dp_rank) AS n_same
    FROM sig WHERE value IS NOT NULL
), middle AS (      -- the median of the OTHERS is the mean of their k1-th and k2-th values (k1 = k2 for an odd
                    -- count); the k-th other sits at position k, or k + 1 past the domain's own. Linear in the
                    -- domains: a median subquery per row was quadratic (3,000 domains took GBs per collection)
    SELECT r.*, k1 + (k1 >= pos)::INTEGER AS at1, k2 + (k2 >= pos)::INTEGER AS at2
    FROM (SELECT *, (n_others + 1) // 2 AS k1, n_others // 2 + 1 AS k2 FROM ranked) r
), dup_median AS (  -- the same domain twice in one window (two watch sources in one run): all its rows left out
    SELECT d.wseq, d.signal, d.dp_rank, median(o.value) AS others_median
    FROM (SELECT DISTINCT wseq, signal, dp_rank FROM ranked WHERE n_same > 1) d
    JOIN ranked o ON o.wseq = d.wseq AND o.signal = d.signal AND o.dp_rank <> d.dp_rank
    GROUP BY ALL
), judged_sig AS (
    SELECT m.wseq, m.dp_rank, m.window_s, m.signal, m.value,
           m.value / NULLIF(sum(m.value) OVER (PARTITION BY m.wseq, m.signal), 0) AS share,
           CASE WHEN m.n_same > 1 THEN dm.others_median
                WHEN m.n_others > 0 THEN (v1.value + v2.value) / 2 END AS others_median
    FROM middle m
    LEFT JOIN ranked v1 ON v1.wseq = m.wseq AND v1.signal = m.signal AND v1.pos = m.at1
    LEFT JOIN ranked v2 ON v2.wseq = m.wseq AND v2.signal = m.signal AND v2.pos = m.at2
    LEFT JOIN dup_median dm ON dm.wseq = m.wseq AND dm.signal = m.signal AND dm.dp_rank = m.dp_rank
), req_n AS (       -- requests the other domains finished in the window (median): the counting noise
    SELECT wseq, dp_rank, others_median * window_s AS others_requests
    FROM judged_sig WHERE signal = 'requests/s'
), hot_sig AS (
    SELECT j.*, j.value / NULLIF(j.others_median, 0) AS ratio,
           j.others_median IS NOT NULL AND j.value > 0 AND CASE
               -- counts: more than skew_ratio AND more than z Poisson sigmas of the others' count
               WHEN j.signal IN ('requests/s', 'tokens/s') THEN
                   j.value >= j.others_median * greatest($skew_ratio,
                                                         1 + $z / sqrt(greatest(coalesce(r.others_requests, 0), 1)))
               WHEN j.signal = 'waiting requests' THEN
                   j.value >= $skew_ratio * j.others_median AND j.value - j.others_median >= $min_waiting
               ELSE j.value >= $skew_ratio * j.others_median AND j.value >= $min_kv
           END AS hot
    FROM judged_sig j LEFT JOIN req_n r USING (wseq, dp_rank)
), islands AS (     -- consecutive hot windows of one domain on ONE signal
    SELECT *, wseq - row_number() OVER (PARTITION BY dp_rank, signal ORDER BY wseq) AS grp
    FROM hot_sig WHERE hot
), streak AS (      -- per domain: the streak reaching the latest window, the cause in the dp-imbalance
                    -- order (more requests, else heavier ones, else a queue, else KV)
    SELECT i.dp_rank, i.signal, min(i.wseq) AS first_w, max(i.wseq) AS last_w, count(*) AS hot_windows
    FROM islands i, last_w
    GROUP BY i.dp_rank, i.signal, i.grp, last_w.lw
    HAVING max(i.wseq) = last_w.lw AND count(*) >= $min_windows
    QUALIFY row_number() OVER (PARTITION BY i.dp_rank ORDER BY CASE i.signal WHEN 'requests/s' THEN 1
                               WHEN 'tokens/s' THEN 2 WHEN 'waiting requests' THEN 3 ELSE 4 END) = 1
), gaps AS (
    SELECT s.dp_rank, s.signal, s.first_w, s.last_w, s.hot_windows,
           avg(h.share - 1.0 / n.n_domains) FILTER (WHERE h.wseq <= s.first_w + 1) AS gap_first,
           avg(h.share - 1.0 / n.n_domains) FILTER (WHERE h.wseq >= s.last_w - 1) AS gap_last,
           arg_max(h.share, h.wseq) AS share_now, arg_max(h.ratio, h.wseq) AS ratio_now,
           arg_max(h.value, h.wseq) AS value_now, arg_max(h.others_median, h.wseq) AS others_now,
           any_value(n.n_domains) AS n_domains
    FROM streak s
    JOIN hot_sig h ON h.dp_rank = s.dp_rank AND h.signal = s.signal AND h.wseq BETWEEN s.first_w AND s.last_w
    JOIN n_dom n ON n.wseq = h.wseq
    GROUP BY ALL
), inst AS (
    SELECT wseq, unnest([
        {'metric': 'TTFT P99', 'ms': ttft_p99_ms}, {'metric': 'TTFT P95', 'ms': ttft_p95_ms},
        {'metric': 'e2e P99', 'ms': e2e_p99_ms}, {'metric': 'e2e P95', 'ms': e2e_p95_ms}]) AS l
    FROM w WHERE dp_rank IS NULL
), lat AS (         -- per domain streak and latency metric: before vs now
    SELECT g.dp_rank, i.l.metric AS metric,
           coalesce(median(i.l.ms) FILTER (WHERE i.wseq < g.first_w),
                    any_value(i.l.ms) FILTER (WHERE i.wseq = g.first_w)) AS before_ms,
           avg(i.l.ms) FILTER (WHERE i.wseq >= g.last_w - 1) AS now_ms
    FROM gaps g JOIN inst i ON i.wseq <= g.last_w
    GROUP BY g.dp_rank, i.l.metric
), lat_best AS (
    SELECT dp_rank, arg_max(metric, now_ms / NULLIF(before_ms, 0)) AS latency_metric,
           max(now_ms / NULLIF(before_ms, 0)) AS latency_ratio,
           arg_max(before_ms, now_ms / NULLIF(before_ms, 0)) AS latency_before_ms,
           arg_max(now_ms, now_ms / NULLIF(before_ms, 0)) AS latency_now_ms
    FROM lat WHERE before_ms > 0 AND now_ms IS NOT NULL GROUP BY dp_rank
), enough AS (     -- a hot domain is hot against the others: one domain has none to compare with
    SELECT coalesce(max(n_domains), 0) AS domains FROM n_dom
), found AS (
SELECT g.dp_rank,
       CASE g.signal
           WHEN 'requests/s' THEN 'request-skew'
           WHEN 'tokens/s' THEN 'token-skew'
           WHEN 'waiting requests' THEN 'queue-skew'
           ELSE 'kv-pressure'
       END AS cause,
       coalesce(l.latency_ratio >= $latency_rise, false) AS latency_rising,
       g.hot_windows, g.n_domains, g.signal,
       round(100 * g.share_now, 1) AS share_pct,
       round(g.ratio_now, 2) AS ratio,
       round(g.value_now, 3) AS value_now,
       round(g.others_now, 3) AS others_median_now,
       round(g.gap_first, 4) AS share_gap_first,
       round(g.gap_last, 4) AS share_gap_last,
       coalesce(l.latency_metric, 'latency') AS latency_metric,
       round(l.latency_before_ms, 1) AS latency_before_ms,
       round(l.latency_now_ms, 1) AS latency_now_ms,
       round(l.latency_ratio, 2) AS latency_ratio,
       CASE g.signal
           WHEN 'requests/s' THEN 'rebalance the DP scheduler: requests pile onto this domain (sticky or fixed-order assignment); then profile DP '
           WHEN 'tokens/s' THEN 'balance DP assignment by tokens, not request count (long prompts/outputs land here); then profile DP '
           WHEN 'waiting requests' THEN 'requests queue on this domain: check its batch size and scheduling against the others; then profile DP '
           ELSE 'KV cache fills on this domain first: admit fewer requests into it until its KV level matches the others; then profile DP '
       END || g.dp_rank || ' with msServiceProfiler and run dp-imbalance on the trace' AS next_step
FROM gaps g LEFT JOIN lat_best l USING (dp_rank)
WHERE g.gap_last >= (1 - $converge_tolerance) * g.gap_first
)
SELECT f.*, NULL::VARCHAR AS skip_reason FROM found f, enough WHERE enough.domains >= 2
UNION ALL BY NAME
SELECT format('{} DP domain(s) in the metrics: a hot domain needs other domains to compare with '
              || '(scrape every DP engine: vLLM''s engine label, or --scrape URL=DP per endpoint)', domains) AS skip_reason
FROM enough WHERE domains < 2
ORDER BY latency_rising DESC, hot_windows DESC, dp_rank
