-- name: why-host-device
-- version: 2
-- description: Why is this card slow, host or device: per rank (and step), the device's time split into computing, communicating (collectives, with their waits), idle waiting for the host to launch work, and other idle; host-bound when the device idles waiting for its host, device-bound when it is busy computing.
-- requires: sources
-- param: min_host_wait_pct DOUBLE = 25.0   -- host-bound: its compute stream waits for launches at least this % of its step time
-- param: min_host_excess_pct DOUBLE = 5.0  -- host-bound too: its compute stream waits this many % points of its step time more than the median rank's
-- param: by_step BOOLEAN = false           -- one row per (rank, step) instead of per rank
-- verdict: none
-- role: report
-- subject: rank
-- order: 210
-- shows: why
-- headline: {bound} | its compute stream waits for the host {stream_host_wait_pct} % of {window_ms} ms (median rank {median_rank_stream_host_wait_pct} %) | {compute_pct} % computing, {collective_pct} % collectives | compute {compute_ratio}x the median rank's
-- summary: rank {rank} {bound}: computing {compute_pct}%, collectives {collective_pct}%, waiting for the host {host_wait_pct}% (its compute stream {stream_host_wait_pct}%, the median rank's {median_rank_stream_host_wait_pct}%), other idle {other_idle_pct}% of {window_ms} ms on the device (compute {compute_ratio}x the median rank's)
--
-- A device that is slow because its HOST is slow (Python, dispatch, data loading, CPU binding)
-- idles between kernels: the next kernel is launched only after the previous one ended. One that
-- is slow itself is busy: its kernels run longer and the host runs ahead. Per rank (each rank's
-- trace) and step, the device timeline of the kernels launched in the step (by the launch call's
-- correlation id, placed in the host's ProfilerStep / step range; a trace without step marks is
-- one step) is cut into:
--   compute_us      a non-communication kernel / memcpy / memset runs (on any stream);
--   collective_us   only communication runs (NCCL / HCCL collectives, DeepEP dispatch/combine:
--                   their time includes waiting at the collective for the slowest rank);
--   host_wait_us    the device is idle and the kernel that ends the gap was LAUNCHED after the
--                   device went idle: it waited for its host;
--   other_idle_us   the rest of the window (idle with the next kernel already launched: a
--                   dependency or synchronisation; or no launch time known, operator CSVs).
-- They add up to window_us (first kernel start to last kernel end of the step).
-- The split is the whole device's, so a busy communication stream beside it hides a starved
-- compute stream; stream_host_wait_us is the same wait measured on the compute stream alone (the stream with
-- the most non-communication time in the step: gaps before a kernel launched after the previous
-- kernel of that stream ended).
-- The reading (bound): 'host-bound' when stream_host_wait_pct >= min_host_wait_pct, or exceeds the
-- median rank's by min_host_excess_pct points (ep-slow-rank then names the card host-bound with its
-- cost, over its MoE layers); else the largest share:
-- 'device-bound' (computing), 'waiting at collectives' (the rank waits for the others), or
-- 'idle (not the host)'. The ratios compare the rank with the median rank (per-step medians;
-- NULL when the median rank has none).
-- CPU-only traces (no device activity) SKIP with the reason.

WITH dev AS MATERIALIZED (  -- device activity of the run's rank traces
    SELECT e.source_id, e.rank, e.pid, e.tid, e.name, e.ts_ns, e.end_ns, e.cat,
           TRY_CAST(regexp_extract(e.args, '"correlation":\s*(\d+)', 1) AS BIGINT) AS correlation
    FROM events e
    WHERE e.run = $run AND e.rank IS NOT NULL AND e.ph = 'X' AND e.dur_ns IS NOT NULL
      AND e.cat IN ('kernel', 'gpu_memcpy', 'gpu_memset')
),
launches AS (  -- the host call that launched each device operation (CUDA / HIP runtime or driver)
    SELECT e.source_id, TRY_CAST(regexp_extract(e.args, '"correlation":\s*(\d+)', 1) AS BIGINT) AS correlation,
           min(e.ts_ns) AS launch_ns
    FROM events e
    WHERE e.run = $run AND e.ph = 'X' AND e.cat IN ('cuda_runtime', 'cuda_driver')
      AND e.source_id IN (SELECT source_id FROM dev) AND contains(e.args, 'correlation')
    GROUP BY ALL
),
comm AS (  -- device operations the taxonomy calls communication
    SELECT DISTINCT source_id, ts_ns, name FROM op_classes
    WHERE run = $run AND on_device AND op_class IN ('collective', 'dispatch', 'combine')
),
steps AS (SELECT source_id, step, step_start_ns, step_end_ns FROM _steps WHERE run = $run),
k AS (
    SELECT d.source_id, d.rank, d.pid, d.tid, d.ts_ns, d.end_ns, l.launch_ns, c.name IS NOT NULL AS is_comm,
           coalesce(s.step, 0) AS step
    FROM dev d
    LEFT JOIN launches l USING (source_id, correlation)
    LEFT JOIN comm c ON c.source_id = d.source_id AND c.ts_ns = d.ts_ns AND c.name = d.name
    ASOF LEFT JOIN steps s ON d.source_id = s.source_id AND coalesce(l.launch_ns, d.ts_ns) >= s.step_start_ns
    UNION ALL  -- operator CSV rows (Ascend device tasks): no launch times, step from Step Id
    SELECT o.source_id, o.rank, CAST(o.device_id AS VARCHAR), o.stream_id, o.ts_ns, o.end_ns, NULL, c.op_class IS NOT NULL,
           coalesce(o.step_id, 0)
    FROM ops o
    LEFT JOIN (SELECT DISTINCT source_id, name, op_class FROM op_classes
               WHERE run = $run AND origin = 'ops' AND op_class IN ('collective', 'dispatch', 'combine')) c
           USING (source_id, name)
    WHERE o.run = $run AND o.rank IS NOT NULL AND o.ts_ns IS NOT NULL AND o.dur_ns IS NOT NULL
),
-- Islands of device activity per (rank, step): an operation starts a new island when it starts
-- after everything before it ended (the gap before it is idle time).
busy_flag AS (
    SELECT *, max(end_ns) OVER w AS prev_end_ns
    FROM k WINDOW w AS (PARTITION BY source_id, step ORDER BY ts_ns, end_ns DESC
                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
),
islands AS (
    SELECT source_id, step, island, min(ts_ns) AS s_ns, max(end_ns) AS e_ns,
           arg_min(launch_ns, ts_ns) AS first_launch_ns, arg_min(prev_end_ns, ts_ns) AS gap_start_ns
    FROM (SELECT *, sum(CASE WHEN prev_end_ns IS NULL OR ts_ns > prev_end_ns THEN 1 ELSE 0 END)
                        OVER (PARTITION BY source_id, step ORDER BY ts_ns, end_ns DESC ROWS UNBOUNDED PRECEDING) AS island
          FROM busy_flag)
    GROUP BY ALL
),
compute_islands AS (  -- the same over the non-communication operations only
    SELECT source_id, step, min(ts_ns) AS s_ns, max(end_ns) AS e_ns
    FROM (SELECT *, sum(CASE WHEN prev_end_ns IS NULL OR ts_ns > prev_end_ns THEN 1 ELSE 0 END)
                        OVER (PARTITION BY source_id, step ORDER BY ts_ns, end_ns DESC ROWS UNBOUNDED PRECEDING) AS island
          FROM (SELECT *, max(end_ns) OVER (PARTITION BY source_id, step ORDER BY ts_ns, end_ns DESC
                                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_ns
                FROM k WHERE NOT is_comm))
    GROUP BY source_id, step, island
),
stream_wait AS (  -- per step, the compute stream's wait for launches (see the header)
    SELECT source_id, step, arg_max(wait_ns, busy_ns) AS stream_host_wait_ns
    FROM (
        SELECT source_id, step, pid, tid, sum(end_ns - ts_ns) AS busy_ns,
               coalesce(sum(least(launch_ns, ts_ns) - prev_end_ns) FILTER (WHERE launch_ns > prev_end_ns), 0) AS wait_ns
        FROM (SELECT *, lag(end_ns) OVER (PARTITION BY source_id, step, pid, tid ORDER BY ts_ns, end_ns) AS prev_end_ns
              FROM k WHERE NOT is_comm)
        GROUP BY ALL
    )
    GROUP BY ALL
),
per_step AS (
    SELECT i.source_id, i.step, min(i.s_ns) AS win_start_ns, max(i.e_ns) AS win_end_ns,
           sum(i.e_ns - i.s_ns) AS busy_ns,
           coalesce(sum(i.s_ns - i.gap_start_ns) FILTER (WHERE i.gap_start_ns IS NOT NULL
                                                        AND i.first_launch_ns > i.gap_start_ns), 0) AS host_wait_ns
    FROM islands i GROUP BY ALL
),
facts AS (
    SELECT p.source_id, k1.rank, p.step, p.win_end_ns - p.win_start_ns AS window_ns, p.busy_ns,
           coalesce(c.compute_ns, 0) AS compute_ns, p.busy_ns - coalesce(c.compute_ns, 0) AS collective_ns,
           p.host_wait_ns, coalesce(sw.stream_host_wait_ns, 0) AS stream_host_wait_ns,
           greatest(p.win_end_ns - p.win_start_ns - p.busy_ns - p.host_wait_ns, 0) AS other_idle_ns
    FROM per_step p
    LEFT JOIN (SELECT source_id, step, sum(e_ns - s_ns) AS compute_ns FROM compute_islands GROUP BY ALL) c
           USING (source_id, step)
    LEFT JOIN stream_wait sw USING (source_id, step)
    JOIN (SELECT DISTINCT source_id, rank FROM k) k1 USING (source_id)
),
med AS (
    SELECT step, median(compute_ns) AS med_compute_ns, median(host_wait_ns) AS med_host_wait_ns,
           median(stream_host_wait_ns) AS med_stream_host_wait_ns, median(window_ns) AS med_window_ns
    FROM facts GROUP BY step
),
grouped AS (
    SELECT f.rank, CASE WHEN $by_step THEN f.step END AS step, count(*) AS steps,
           sum(f.window_ns) AS window_ns, sum(f.compute_ns) AS compute_ns, sum(f.collective_ns) AS collective_ns,
           sum(f.host_wait_ns) AS host_wait_ns, sum(f.other_idle_ns) AS other_idle_ns,
           sum(m.med_compute_ns) AS med_compute_ns, sum(m.med_host_wait_ns) AS med_host_wait_ns,
           sum(f.stream_host_wait_ns) AS stream_host_wait_ns,
           sum(m.med_stream_host_wait_ns) AS med_stream_host_wait_ns, sum(m.med_window_ns) AS med_window_ns
    FROM facts f JOIN med m USING (step)
    GROUP BY ALL
),
shares AS (
    SELECT *, 100.0 * compute_ns / greatest(window_ns, 1) AS compute_pct,
           100.0 * collective_ns / greatest(window_ns, 1) AS collective_pct,
           100.0 * host_wait_ns / greatest(window_ns, 1) AS host_wait_pct,
           100.0 * other_idle_ns / greatest(window_ns, 1) AS other_idle_pct,
           100.0 * stream_host_wait_ns / greatest(window_ns, 1) AS stream_host_wait_pct,
           100.0 * med_stream_host_wait_ns / greatest(med_window_ns, 1) AS median_rank_stream_host_wait_pct
    FROM grouped
),
enough AS (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM rank_conflicts WHERE run = $run)
                THEN 'the run has duplicate ranks (rank_conflicts): ranks cannot be compared in it; ingest each job as its own run'
                WHEN NOT EXISTS (SELECT 1 FROM k)
                THEN 'no device activity (GPU kernels, memcpy, Ascend device tasks) in this run''s rank traces: '
                     || 'a CPU-only trace cannot tell a host-bound card from a device-bound one'
           END AS skip_reason
)
SELECT rank, step, steps, round(window_ns / 1e6, 3) AS window_ms,
       round(compute_ns / 1e3, 1) AS compute_us, round(collective_ns / 1e3, 1) AS collective_us,
       round(host_wait_ns / 1e3, 1) AS host_wait_us, round(other_idle_ns / 1e3, 1) AS other_idle_us,
       round(compute_pct, 1) AS compute_pct, round(collective_pct, 1) AS collective_pct,
       round(host_wait_pct, 1) AS host_wait_pct, round(other_idle_pct, 1) AS other_idle_pct,
       round(stream_host_wait_ns / 1e3, 1) AS stream_host_wait_us, round(stream_host_wait_pct, 1) AS stream_host_wait_pct,
       round(median_rank_stream_host_wait_pct, 1) AS median_rank_stream_host_wait_pct,
       CASE WHEN med_compute_ns > 0 THEN round(compute_ns / med_compute_ns, 2) END AS compute_ratio,
       CASE WHEN med_host_wait_ns > 0 THEN round(host_wait_ns / med_host_wait_ns, 2) END AS host_wait_ratio,
       CASE WHEN stream_host_wait_pct >= $min_host_wait_pct OR stream_host_wait_pct - median_rank_stream_host_wait_pct >= $min_host_excess_pct THEN 'host-bound'
            WHEN compute_pct >= greatest(collective_pct, other_idle_pct) THEN 'device-bound'
            WHEN collective_pct >= other_idle_pct THEN 'waiting at collectives'
            ELSE 'idle (not the host)' END AS bound,
       CASE WHEN stream_host_wait_pct >= $min_host_wait_pct OR stream_host_wait_pct - median_rank_stream_host_wait_pct >= $min_host_excess_pct
                THEN 'the device idles waiting for its host to launch work: look at the host side (Python / dispatch overhead, CPU binding and contention, data loading, synchronisations); CUDA graphs or a larger batch hide launches'
            WHEN compute_pct >= greatest(collective_pct, other_idle_pct)
                THEN 'the device is busy computing: if its compute is above the median rank''s (compute_ratio), the device itself or its load is slower (why-op-diff: more tokens or same shapes)'
            WHEN collective_pct >= other_idle_pct
                THEN 'the device mostly waits at collectives: it waits for a slower rank, it is not the cause'
            ELSE 'the device idles with work already launched: dependencies or synchronisations (events, memcpy to host)' END AS reading,
       NULL::VARCHAR AS skip_reason
FROM shares, enough
WHERE enough.skip_reason IS NULL
UNION ALL BY NAME
SELECT skip_reason FROM enough WHERE skip_reason IS NOT NULL
ORDER BY rank NULLS FIRST, step NULLS FIRST
