-- name: why-gmm-efficiency
-- version: 2
-- description: GroupedMatmul efficiency where shapes are known: per rank and weight shape, the achieved TFLOP/s of its GroupedMatmul (FLOPs of the matmuls it runs / its time) and the ratio to the median rank's for the same shapes.
-- requires: op_classes
-- param: same_rows_ratio DOUBLE = 1.1   -- rows per call within this ratio of the median rank's count as the same shapes
-- param: min_ranks INTEGER = 3          -- fewer ranks with the shape have no median rank to compare with
-- verdict: none
-- role: report
-- subject: rank
-- order: 230
-- shows: why
-- headline: GroupedMatmul {shape} | {rows_ratio}x the median rank's rows per call ({shapes}) | {tflops} TFLOP/s vs {median_rank_tflops} on the median rank ({efficiency_pct} %): {reading}
-- summary: rank {rank} GroupedMatmul {shape}: {rows_ratio}x the median rank's rows per call ({shapes}), {tflops} TFLOP/s vs the median rank's {median_rank_tflops} ({efficiency_pct}%): {reading}
--
-- "slow-compute" says the card's GroupedMatmul takes longer; this says how fast it computes:
-- FLOPs per second for the same shapes, the number a device's health is read from. FLOPs:
--   Kineto traces (record_shapes): each aten::mm inside the GroupedMatmul range (same thread),
--     Input Dims [[M, K], [K, N]]: 2 x M x K x N; time = the GroupedMatmul range (the operator
--     as the model sees it: its gathers and copies are part of its cost);
--   operator CSVs (Ascend kernel_details / op_summary): a GroupedMatmul task with Input Shapes
--     "M,K;E,K,N;…" (x, then the experts' weights): 2 x M x (the weight elements / E), every
--     row multiplied by one expert's K x N; time = the task's duration.
-- Sources measured on the device timeline by GPU kernels have no shapes on the kernels: not
-- covered. shape: the weight shapes (K x N, sorted) of the operator; ranks are compared within
-- one shape only, the median rank being the median of the ranks that ran it (rows and time
-- summed over the run). rows_ratio: rows (M) per call vs the median rank's; 'same shapes' within
-- same_rows_ratio, else 'more rows' / 'fewer rows' (larger M usually runs more efficiently).
-- The reading column: what the efficiency says, which depends on the shapes: on the same shapes a lower
-- TFLOP/s is a slower device or process; on more rows per call a higher TFLOP/s is the larger
-- matmul running more efficiently, not a fast card (its time still grows with its rows).
-- Rows are per (rank, shape), largest FLOPs first. SKIP when no GroupedMatmul has known shapes.

WITH g AS MATERIALIZED (  -- the outermost GroupedMatmul operations of the run's ranks
    SELECT run, rank, source_id, origin, pid, tid, name, ts_ns, end_ns FROM op_classes
    WHERE run = $run AND rank IS NOT NULL AND op_class = 'grouped_matmul'
      AND (origin = 'ops' OR NOT on_device)
    QUALIFY coalesce(max(end_ns) OVER (PARTITION BY source_id, pid, tid ORDER BY ts_ns, end_ns DESC
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), ts_ns) <= ts_ns
),
mm AS (  -- matmuls with their dims, in the traces that have GroupedMatmul ranges
    -- JSON pointer paths ('/key/0'), not dollar paths: `slowcard show` prints no dollar sign but parameters
    SELECT e.source_id, e.pid, e.tid, e.ts_ns,
           TRY_CAST(json_extract(e.args, '/Input Dims/0') AS BIGINT[]) AS x,
           TRY_CAST(json_extract(e.args, '/Input Dims/1') AS BIGINT[]) AS w
    FROM events e
    WHERE e.run = $run AND e.ph = 'X' AND e.name = 'aten::mm'
      AND e.source_id IN (SELECT source_id FROM g WHERE origin = 'trace')
),
trace_calls AS (
    SELECT g.rank, g.source_id, g.ts_ns, any_value(g.end_ns - g.ts_ns) AS dur_ns,
           sum(2.0 * m.x[1] * m.x[2] * m.w[2]) AS flops, sum(m.x[1]) AS rows,
           string_agg(DISTINCT m.x[2] || 'x' || m.w[2], ', ' ORDER BY m.x[2] || 'x' || m.w[2]) AS shape
    FROM mm m
    ASOF JOIN g ON m.source_id = g.source_id AND m.pid IS NOT DISTINCT FROM g.pid
               AND m.tid IS NOT DISTINCT FROM g.tid AND m.ts_ns >= g.ts_ns
    WHERE m.ts_ns < g.end_ns AND len(m.x) = 2 AND len(m.w) = 2 AND m.x[2] = m.w[1]
    GROUP BY g.rank, g.source_id, g.ts_ns
),
op_calls AS (  -- operator CSV rows: Input Shapes "M,K;E,K,N;…"
    SELECT rank, source_id, ts_ns, dur_ns, x, w,
           CASE WHEN len(w) = 3 THEN w[2] * w[3] ELSE w[1] * w[2] END AS kn
    FROM (
        SELECT o.rank, o.source_id, o.ts_ns, o.dur_ns,
               TRY_CAST(string_split(split_part(o.input_shapes, ';', 1), ',') AS BIGINT[]) AS x,
               TRY_CAST(string_split(split_part(o.input_shapes, ';', 2), ',') AS BIGINT[]) AS w
        FROM ops o JOIN (SELECT DISTINCT source_id, ts_ns, name FROM g WHERE origin = 'ops') USING (source_id, ts_ns, name)
        WHERE o.run = $run
    )
    WHERE len(x) = 2 AND len(w) IN (2, 3)
),
calls AS (
    SELECT rank, shape, dur_ns, flops, rows FROM trace_calls WHERE flops > 0
    UNION ALL
    SELECT rank, format('{}x{}', x[2], kn // x[2]), dur_ns, 2.0 * x[1] * kn, x[1]
    FROM op_calls WHERE x[1] > 0 AND kn > 0 AND x[2] > 0
),
per AS (
    SELECT rank, shape, count(*) AS calls, sum(flops) AS flops, sum(dur_ns) AS dur_ns, sum(rows) AS rows,
           sum(flops) / greatest(sum(dur_ns), 1) / 1e3 AS tflops, sum(rows) / count(*) AS rows_per_call
    FROM calls GROUP BY ALL
),
med AS (
    SELECT shape, median(tflops) AS med_tflops, median(rows_per_call) AS med_rows, count(*) AS n_ranks
    FROM per GROUP BY shape
),
enough AS (
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM calls)
                THEN 'no GroupedMatmul with known shapes (Kineto traces need record_shapes=True and aten::mm inside the GroupedMatmul range; operator CSVs need Input Shapes)'
                WHEN NOT EXISTS (SELECT 1 FROM med WHERE n_ranks >= $min_ranks)
                THEN format('no GroupedMatmul shape run by >= {} ranks: no median rank to compare with', $min_ranks)
           END AS skip_reason
)
SELECT p.rank, p.shape, p.calls, round(p.flops / 1e9, 3) AS gflop, round(p.dur_ns / 1e6, 3) AS time_ms,
       round(p.tflops, 4) AS tflops, round(m.med_tflops, 4) AS median_rank_tflops,
       round(100.0 * p.tflops / m.med_tflops, 1) AS efficiency_pct,
       round(p.rows_per_call, 1) AS rows_per_call, round(p.rows_per_call / m.med_rows, 2) AS rows_ratio,
       CASE WHEN p.rows_per_call > $same_rows_ratio * m.med_rows THEN 'more rows'
            WHEN p.rows_per_call * $same_rows_ratio < m.med_rows THEN 'fewer rows'
            ELSE 'same shapes' END AS shapes,
       CASE WHEN p.rows_per_call > $same_rows_ratio * m.med_rows
                THEN 'larger matmuls run more efficiently: more work, not a faster card'
            WHEN p.rows_per_call * $same_rows_ratio < m.med_rows
                THEN 'smaller matmuls run less efficiently: a lower rate is expected'
            WHEN p.tflops * $same_rows_ratio < m.med_tflops
                THEN 'the same work runs slower: a slower device or process'
            ELSE 'as efficient as the median rank' END AS reading,
       NULL::VARCHAR AS skip_reason
FROM per p JOIN med m USING (shape), enough
WHERE enough.skip_reason IS NULL AND m.n_ranks >= $min_ranks AND m.med_tflops > 0 AND m.med_rows > 0
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, skip_reason
FROM enough WHERE skip_reason IS NOT NULL
ORDER BY rank NULLS FIRST, gflop DESC, shape
