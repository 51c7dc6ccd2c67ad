-- name: why-kernel-efficiency
-- version: 2
-- description: GPU GEMM and attention efficiency from the shapes (Kineto traces recorded with record_shapes=True): per rank, the FLOPs of its matmul-family and attention ops (from the CPU op's Input Dims) over the time of the GPU kernels they launched (linked by correlation id), in TFLOP/s, vs the median rank's and vs the device's peak.
-- requires: sources
-- param: same_work_ratio DOUBLE = 1.1   -- ranks whose FLOPs are within this ratio of the median rank's did the same work (their rates compare)
-- param: min_ranks INTEGER = 3          -- fewer ranks with the kind and data type have no median rank to compare with (the peak still applies)
-- verdict: none
-- role: report
-- subject: rank
-- order: 235
-- shows: why
-- headline: {kind} {dtype} | {tflops} TFLOP/s over {kernel_ms} ms of kernels ({ops} ops, {gflop} GFLOP, largest {largest_shape}) | {vs_peak} | {reading}
-- summary: rank {rank} {kind} ({dtype}): {tflops} TFLOP/s over {kernel_ms} ms of GPU kernels ({ops} ops, {gflop} GFLOP, largest {largest_shape}); {vs_peak}; {reading}
--
-- "Is the card's GPU slow, or does it get more work?" needs the rate of its kernels, not their
-- time. TraceLens computes it; this is the same reading for the why-block of a GPU trace.
-- FLOPs, from the CPU op's "Input Dims" (recorded only with record_shapes=True), the innermost
-- matmul-family or attention op around the launch (aten::linear calls aten::addmm: addmm counts):
--   the matmuls aten::mm / _scaled_mm [M,K] x [K,N], aten::addmm / _addmm_activation (bias, [M,K], [K,N]),
--   and aten::bmm [B,M,K] x [B,K,N], aten::baddbmm (bias, [B,M,K], [B,K,N]), aten::matmul (a x [K,N]
--   or batched a x [...,K,N]), aten::_grouped_mm ([M,K] x [G,K,N], every row times one group's
--   weight): 2 x (elements of a) x N;  aten::linear ([...,K] x weight [N,K]): 2 x (elements of
--   the input) x N;  the inner dimensions must agree, else the op is left out;
--   attention, forward, 4-D inputs: the scaled_dot_product family (query [B,H,Lq,D], key
--   [B,Hk,Lk,D], value [B,Hk,Lk,Dv]) and aten::_flash_attention_forward ([B,L,H,D]):
--   2 x B x H x Lq x Lk x (D + Dv) (Q.K^T and P.V), halved when "Concrete Inputs" says
--   is_causal (the masked half is skipped); variable-length (3-D, packed) inputs are left out.
--   Custom GEMM ops whose inputs are tuples (DeepGEMM's fp8 (tensor, scale) pairs) record no
--   usable dims: not covered.
-- Time is the time of the GPU kernels the op launched, linked by correlation id: a kernel's
-- correlation names its CUDA / HIP runtime launch call, and the op is the last one of those kinds
-- started before that call on its thread, when it still encloses the call (so the innermost; a
-- call made after a nested op ended, say a copy inside aten::matmul after its aten::mm, is left
-- out); every kernel the op launched counts (a bias copy too, as TraceLens does). Ops that
-- launched no kernel (an outer aten::linear or aten::matmul) carry no FLOPs, so nothing is counted
-- twice. A CUDA-graph replay launches its kernels from the graph, not from an op: only the ops
-- run outside the graph count (in a vLLM decode trace, the LM head's aten::mm).
-- TFLOP/s = FLOPs / kernel time. Rows per (rank, kind gemm / attention, data type): dtype from the
-- first matrix input's "Input type" (fp32, 16-bit for bf16 / fp16, fp8, fp64), fp32 read as
-- tf32 when a kernel's name says TF32 tensor cores (tf32, xf32, s1688, tensorop_s).
-- Peak (dense, no sparsity, TFLOP/s) of the first deviceProperties entry of the trace, from a
-- small table below: NVIDIA by name, per variant (a PCIe card has lower clocks and power than the
-- SXM module of the same chip, so the SXM peak would read a healthy PCIe card as slow): A100 and
-- A800, PCIe and SXM4 alike (the datasheet's peaks are the same): fp32 19.5, tf32 156, 16-bit 312;
-- H100 SXM / H200 / H800 / GH200: 67, 494.7, 989.4, fp8 1978.9; H100 PCIe / H800 PCIe: 51, 378,
-- 756, fp8 1513; H100 NVL / H200 NVL: 60, 417.5, 835.5, fp8 1670.5; V100 SXM2 (and DGXS): fp32
-- 15.7, 16-bit 125; V100 PCIe: 14, 112; V100S PCIe: 16.4, 130 (another V100 form: no peak);
-- AMD (whose name is often empty) by architecture and compute units: MI300X
-- (gfx 9.4, 304 CUs; fp32 163.4, 16-bit 1307.4, fp8 2614.9), MI250X and MI250 per GCD, the
-- device a process sees (gfx 9.0, 110 / 104 CUs; fp32 47.9 / 45.3, 16-bit 191.5 / 181.0). fp32
-- peaks are what the default GEMM runs on: the CUDA cores on NVIDIA, the matrix cores on AMD.
-- Unknown devices (and traces without deviceProperties): peak NULL, device says why.
-- Median rank: per (kind, dtype) over the ranks that ran it (>= min_ranks, else NULL).
-- work_ratio is the rank's FLOPs / the median rank's; within same_work_ratio the rates compare
-- ('the same work runs slower' when TFLOP/s is below the median rank's / same_work_ratio), else
-- the shapes differ and so do the rates. A trace without a rank is reported with rank NULL and
-- not compared. SKIP with the reason: no such op; ops without shapes ("no shapes: record with
-- record_shapes=True"); shapes but no GPU kernel launched inside them (CPU-only traces, or
-- CUDA-graph capture, whose captured kernels run later, outside the trace).

WITH ops AS MATERIALIZED (  -- matmul-family and attention CPU ops of the run's traces
    SELECT e.source_id, e.rank, e.pid, e.tid, e.name, e.ts_ns, e.end_ns,
           TRY_CAST(json_extract(e.args, '/Input Dims') AS BIGINT[][]) AS d,
           TRY_CAST(json_extract(e.args, '/Input type') AS VARCHAR[]) AS types,
           CASE e.name WHEN 'aten::scaled_dot_product_attention' THEN 5
                       WHEN 'aten::_scaled_dot_product_flash_attention' THEN 4
                       WHEN 'aten::_scaled_dot_product_efficient_attention' THEN 6
                       WHEN 'aten::_scaled_dot_product_cudnn_attention' THEN 6
                       WHEN 'aten::_flash_attention_forward' THEN 8 END AS causal_at,
           args
    FROM events e
    WHERE e.run = $run AND e.ph = 'X' AND e.cat = 'cpu_op'
      AND e.name IN ('aten::mm', 'aten::_scaled_mm', 'aten::addmm', 'aten::_addmm_activation', 'aten::bmm',
                     'aten::baddbmm', 'aten::matmul', 'aten::linear', 'aten::_grouped_mm',
                     'aten::scaled_dot_product_attention', 'aten::_scaled_dot_product_flash_attention',
                     'aten::_scaled_dot_product_efficient_attention', 'aten::_scaled_dot_product_cudnn_attention',
                     'aten::_flash_attention_forward')
),
operands AS (  -- a: the first matrix, b: the second (for linear: the weight [N, K])
    SELECT * EXCLUDE (args),
           CASE WHEN name IN ('aten::addmm', 'aten::_addmm_activation', 'aten::baddbmm') THEN 2 ELSE 1 END AS ai,
           coalesce(json_extract_string(args, '/Concrete Inputs/' || causal_at) = 'True', false) AS causal
    FROM ops
),
shaped AS (
    SELECT *, d[ai] AS a, d[ai + 1] AS b, d[ai + 2] AS v, lower(types[ai]) AS t,
           CASE WHEN causal_at IS NOT NULL THEN 'attention' ELSE 'gemm' END AS kind
    FROM operands
),
flops AS (
    SELECT *,
           CASE WHEN kind = 'attention' AND len(a) = 4 AND len(b) = 4 AND len(v) = 4 THEN
                    CASE WHEN name = 'aten::_flash_attention_forward'
                         THEN 2.0 * a[1] * a[3] * a[2] * b[2] * (a[4] + v[4])
                         ELSE 2.0 * a[1] * a[2] * a[3] * b[3] * (a[4] + v[4]) END
                    / CASE WHEN causal THEN 2 ELSE 1 END
                WHEN name = 'aten::linear' AND len(a) >= 1 AND len(b) = 2 AND a[-1] = b[2]
                    THEN 2.0 * list_aggregate(a, 'product') * b[1]
                WHEN name = 'aten::_grouped_mm' AND len(a) = 2 AND len(b) = 3 AND a[2] = b[2]
                    THEN 2.0 * a[1] * a[2] * b[3]
                WHEN kind = 'gemm' AND name <> 'aten::_grouped_mm' AND len(a) >= 2 AND len(b) >= 2 AND a[-1] = b[-2]
                     AND (len(b) = 2 OR len(a) = len(b))
                    THEN 2.0 * list_aggregate(a, 'product') * b[-1]
           END AS op_flops,
           array_to_string(a, 'x') || ' @ ' || array_to_string(b, 'x') AS shape,
           CASE WHEN t SIMILAR TO '.*(float8|fp8|e4m3|e5m2).*' THEN 'fp8'
                WHEN t SIMILAR TO '.*(bfloat16|half|float16).*' THEN '16-bit'
                WHEN t SIMILAR TO '.*double.*' THEN 'fp64'
                WHEN t SIMILAR TO '.*float.*' THEN 'fp32' END AS dtype0
    FROM shaped
),
kernels AS (  -- GPU kernels with the correlation id of their launch
    SELECT source_id, name AS kernel, dur_ns,
           TRY_CAST(regexp_extract(args, '"correlation":\s*(\d+)', 1) AS BIGINT) AS correlation
    FROM events
    WHERE run = $run AND ph = 'X' AND cat = 'kernel' AND dur_ns IS NOT NULL
      AND source_id IN (SELECT source_id FROM ops)
),
launches AS (  -- the CUDA / HIP runtime (or driver) call of each kernel: where, on which thread
    SELECT e.source_id, e.pid, e.tid, e.ts_ns AS launch_ns, k.kernel, k.dur_ns
    FROM events e
    JOIN kernels k ON k.source_id = e.source_id
                  AND k.correlation = TRY_CAST(regexp_extract(e.args, '"correlation":\s*(\d+)', 1) AS BIGINT)
    WHERE e.run = $run AND e.ph = 'X' AND e.cat IN ('cuda_runtime', 'cuda_driver')
      AND e.source_id IN (SELECT source_id FROM kernels) AND contains(e.args, 'correlation')
),
linked AS (  -- each launch in the innermost op of these kinds enclosing it on its thread
    SELECT f.source_id, f.ts_ns, f.pid, f.tid, f.name, l.kernel, l.dur_ns
    FROM launches l
    ASOF JOIN (SELECT source_id, pid, tid, ts_ns, end_ns, name FROM ops) f
        ON l.source_id = f.source_id AND l.pid IS NOT DISTINCT FROM f.pid AND l.tid IS NOT DISTINCT FROM f.tid
       AND l.launch_ns >= f.ts_ns
    WHERE l.launch_ns < f.end_ns
),
per_op AS (
    SELECT f.rank, f.kind, f.shape, f.op_flops,
           CASE WHEN f.dtype0 = 'fp32' AND bool_or(regexp_matches(lower(k.kernel), 'tf32|xf32|s1688|tensorop_s'))
                THEN 'tf32' ELSE f.dtype0 END AS dtype,
           count(*) AS kernels, sum(k.dur_ns) AS kernel_ns, f.source_id
    FROM flops f
    JOIN linked k USING (source_id, ts_ns, pid, tid, name)
    WHERE f.op_flops > 0
    GROUP BY f.source_id, f.ts_ns, f.pid, f.tid, f.name, f.rank, f.kind, f.shape, f.op_flops, f.dtype0
),
device AS (  -- the trace's first device, as the peak table knows it
    SELECT source_id, name AS device_name,
           CASE WHEN name ILIKE '%A100%' OR name ILIKE '%A800%' THEN 'A100'
                WHEN name ILIKE '%H100%PCIe%' OR name ILIKE '%H800%PCIe%' THEN 'H100 PCIe'
                WHEN (name ILIKE '%H100%' OR name ILIKE '%H200%') AND name ILIKE '%NVL%' THEN 'H100 NVL'
                WHEN name ILIKE '%H100%' OR name ILIKE '%H200%' OR name ILIKE '%H800%' THEN 'H100 SXM'
                WHEN name ILIKE '%V100S%PCIe%' THEN 'V100S PCIe'
                WHEN name ILIKE '%V100%PCIe%' THEN 'V100 PCIe'
                WHEN name ILIKE '%V100%SXM2%' OR name ILIKE '%V100%DGXS%' THEN 'V100 SXM2'
                WHEN major = 9 AND minor = 4 AND sms = 304 THEN 'MI300X'
                WHEN major = 9 AND minor = 0 AND sms = 110 THEN 'MI250X GCD'
                WHEN major = 9 AND minor = 0 AND sms = 104 THEN 'MI250 GCD'
           END AS model,
           major, minor, sms
    FROM (
        SELECT source_id, json_extract_string(metadata, '/deviceProperties/0/name') AS name,
               TRY_CAST(json_extract(metadata, '/deviceProperties/0/computeMajor') AS INTEGER) AS major,
               TRY_CAST(json_extract(metadata, '/deviceProperties/0/computeMinor') AS INTEGER) AS minor,
               TRY_CAST(json_extract(metadata, '/deviceProperties/0/numSms') AS INTEGER) AS sms
        FROM sources WHERE run = $run AND source_id IN (SELECT source_id FROM per_op)
    )
),
peaks(model, dtype, peak_tflops) AS (VALUES
    ('A100', 'fp32', 19.5), ('A100', 'tf32', 156.0), ('A100', '16-bit', 312.0),
    ('H100 SXM', 'fp32', 67.0), ('H100 SXM', 'tf32', 494.7), ('H100 SXM', '16-bit', 989.4), ('H100 SXM', 'fp8', 1978.9),
    ('H100 PCIe', 'fp32', 51.0), ('H100 PCIe', 'tf32', 378.0), ('H100 PCIe', '16-bit', 756.0), ('H100 PCIe', 'fp8', 1513.0),
    ('H100 NVL', 'fp32', 60.0), ('H100 NVL', 'tf32', 417.5), ('H100 NVL', '16-bit', 835.5), ('H100 NVL', 'fp8', 1670.5),
    ('V100 SXM2', 'fp32', 15.7), ('V100 SXM2', '16-bit', 125.0),
    ('V100 PCIe', 'fp32', 14.0), ('V100 PCIe', '16-bit', 112.0),
    ('V100S PCIe', 'fp32', 16.4), ('V100S PCIe', '16-bit', 130.0),
    ('MI300X', 'fp32', 163.4), ('MI300X', '16-bit', 1307.4), ('MI300X', 'fp8', 2614.9),
    ('MI250X GCD', 'fp32', 47.9), ('MI250X GCD', '16-bit', 191.5),
    ('MI250 GCD', 'fp32', 45.3), ('MI250 GCD', '16-bit', 181.0)
),
per AS (
    SELECT p.rank, p.kind, p.dtype, count(*) AS ops, sum(p.kernels) AS kernels, sum(p.op_flops) AS flops,
           sum(p.kernel_ns) AS kernel_ns, sum(p.op_flops) / greatest(sum(p.kernel_ns), 1) / 1e3 AS tflops,
           first(p.shape ORDER BY p.op_flops DESC, p.shape) AS largest_shape,
           CASE WHEN count(DISTINCT d.model) = 1 THEN any_value(d.model) END AS model,
           CASE WHEN count(DISTINCT d.model) = 1 THEN any_value(d.model)
                WHEN count(DISTINCT d.model) > 1 THEN 'mixed devices'
                WHEN any_value(d.device_name) IS NULL THEN 'device unknown (no deviceProperties)'
                ELSE format('device unknown: "{}" (gfx {}.{}, {} SMs / CUs) is not in the peak table',
                            any_value(d.device_name), any_value(d.major), any_value(d.minor), any_value(d.sms)) END AS device
    FROM per_op p LEFT JOIN device d USING (source_id)
    GROUP BY p.rank, p.kind, p.dtype
),
med AS (
    SELECT kind, dtype, median(tflops) AS med_tflops, median(flops) AS med_flops, count(*) AS n_ranks
    FROM per WHERE rank IS NOT NULL GROUP BY ALL
),
enough AS (
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM ops)
                THEN 'no matmul-family or attention op (aten::mm, addmm, bmm, baddbmm, matmul, linear, _grouped_mm, scaled_dot_product_attention …) in the traces'
                WHEN NOT EXISTS (SELECT 1 FROM ops WHERE d IS NOT NULL AND len(d) > 0)
                THEN 'no shapes: record with record_shapes=True (the matmul / attention ops have no Input Dims)'
                WHEN NOT EXISTS (SELECT 1 FROM per_op)
                THEN 'the matmul / attention ops have shapes but no GPU kernel was launched inside them (a CPU-only trace, or CUDA-graph capture: the captured kernels run later, outside the trace)'
           END AS skip_reason
)
SELECT p.rank, p.kind, p.dtype, p.ops, p.kernels, round(p.flops / 1e9, 6) AS gflop, round(p.kernel_ns / 1e6, 4) AS kernel_ms,
       round(p.tflops, 6) AS tflops, p.device, k.peak_tflops, round(100.0 * p.tflops / k.peak_tflops, 2) AS peak_pct,
       round(CASE WHEN m.n_ranks >= $min_ranks THEN m.med_tflops END, 4) AS median_rank_tflops,
       round(CASE WHEN m.n_ranks >= $min_ranks THEN 100.0 * p.tflops / m.med_tflops END, 1) AS vs_median_pct,
       round(CASE WHEN m.n_ranks >= $min_ranks THEN p.flops / m.med_flops END, 2) AS work_ratio,
       p.largest_shape,
       CASE WHEN k.peak_tflops IS NULL THEN format('no peak: {}', p.device)
            ELSE format('{}% of the {} {} peak ({} TFLOP/s)', round(100.0 * p.tflops / k.peak_tflops, 2), p.device, p.dtype, k.peak_tflops)
       END AS vs_peak,
       CASE WHEN p.rank IS NULL THEN 'a trace without a rank: compared with the peak only'
            WHEN m.n_ranks IS NULL OR m.n_ranks < $min_ranks
                THEN format('fewer than {} ranks ran it: compared with the peak only', $min_ranks)
            WHEN p.flops > $same_work_ratio * m.med_flops OR p.flops * $same_work_ratio < m.med_flops
                THEN format('{}x the median rank''s FLOPs (other shapes): its rate ({}% of the median rank''s {} TFLOP/s) does not compare',
                            round(p.flops / m.med_flops, 2), round(100.0 * p.tflops / m.med_tflops, 1), printf('%.4g', m.med_tflops))
            WHEN p.tflops * $same_work_ratio < m.med_tflops
                THEN format('the same work runs slower: {}% of the median rank''s {} TFLOP/s (a slower device or process)',
                            round(100.0 * p.tflops / m.med_tflops, 1), printf('%.4g', m.med_tflops))
            ELSE format('as efficient as the median rank ({}% of its {} TFLOP/s)',
                        round(100.0 * p.tflops / m.med_tflops, 1), printf('%.4g', m.med_tflops)) END AS reading,
       NULL::VARCHAR AS skip_reason
FROM per p LEFT JOIN med m USING (kind, dtype) LEFT JOIN peaks k ON k.model = p.model AND k.dtype = p.dtype, enough
WHERE enough.skip_reason IS NULL
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, skip_reason
FROM enough WHERE skip_reason IS NOT NULL
ORDER BY rank NULLS FIRST, kind, gflop DESC, dtype
