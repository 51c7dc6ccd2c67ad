-- name: why-slow-link
-- version: 2
-- description: Slow links: per collective kind and process group (traces) or link type (Ascend communication summaries), each rank's effective bandwidth (bytes moved / its transfer time) vs the median rank's; a slow-link finding names the rank and the link.
-- requires: sources
-- param: max_bw_ratio DOUBLE = 0.67      -- slow-link: the rank's median bandwidth / the median rank's, at most this
-- param: min_below_pct DOUBLE = 75.0     -- and below the median rank in at least this % of the collectives (persistent, not one hiccup)
-- param: min_samples INTEGER = 3         -- collectives (or ops) per rank needed to judge
-- param: min_ranks INTEGER = 3           -- fewer ranks have no median rank to compare with
-- verdict: warn if rows > 0
-- role: verdict
-- subject: rank
-- priority: none
-- order: 220
-- shows: why
-- headline: slow link {link} ({source}) | {bw_gbps} GB/s vs {median_bw_gbps} GB/s on the median rank ({bw_ratio}x) | below the median in {below_pct} % of {samples} transfers
-- summary: rank {rank} slow-link on {link} ({source}): {bw_gbps} GB/s vs the median rank's {median_bw_gbps} GB/s ({bw_ratio}x) over {samples} transfers, below the median in {below_pct}% of them
-- pass: No rank's links are slower than {max_bw_ratio}x the median rank's effective bandwidth in >= {min_below_pct}% of its transfers.
--
-- Evidence for slow-comm (ep-slow-rank) and for a straggler: is it the link? Bandwidth is judged
-- on the TRANSFER, never on the duration (a fast rank's collective lasts long because it waits):
--   in traces, per matched collective (collective_waits), transfer_ns = the rank's end - the last
--     arrival; bytes from the NCCL kernel args ("In msg nelems" / "Out msg nelems", the larger,
--     x the size of "dtype"), else the collective event's first "Input Dims" x "Input type";
--     effective bandwidth = bytes / transfer (algorithm bandwidth, GB/s = bytes per ns);
--   Ascend communication summaries (comm_summary, cluster_communication.json or the ranks'
--     communication.json): per (op, rank) and link type (RDMA / HCCS / PCIE / SDMA), the
--     file's transit size / transit time.
-- Each transfer is compared with the median rank of the SAME collective instance (or op), so a
-- large message and a small one are never mixed. A rank is slow-link on a link when its median
-- per-transfer ratio is <= max_bw_ratio AND it is below the median in >= min_below_pct% of
-- >= min_samples transfers. WARN: a link is evidence, the verdicts name the slow card.
-- SKIP (one row with skip_reason) when no collective carries bytes and no summary has links.

WITH tr AS (  -- trace collectives with their bytes
    SELECT w.rank, w.pg, w.coll_kind, w.instance, w.transfer_ns, e.args
    FROM collective_waits w
    JOIN events e ON e.source_id = w.source_id AND e.ts_ns = w.ts_ns AND e.name = w.name AND e.ph = 'X'
    WHERE w.run = $run AND e.run = $run
),
tr_bytes AS (
    -- JSON pointer paths ('/key/0'), not dollar paths: `slowcard show` prints no dollar sign but parameters
    SELECT *,
           CASE WHEN lower(dt) SIMILAR TO '.*(double|long|int64|float64).*' THEN 8
                WHEN lower(dt) SIMILAR TO '.*(bfloat16|half|float16|short|int16).*' THEN 2
                WHEN lower(dt) SIMILAR TO '.*(float8|fp8|byte|char|bool|uint8|int8).*' THEN 1
                WHEN lower(dt) SIMILAR TO '.*(float|int).*' THEN 4
           END AS elem_bytes
    FROM (
        SELECT rank, pg, coll_kind, instance, transfer_ns,
               coalesce(greatest(TRY_CAST(json_extract_string(args, '/In msg nelems') AS BIGINT),
                                 TRY_CAST(json_extract_string(args, '/Out msg nelems') AS BIGINT)),
                        list_aggregate(TRY_CAST(json_extract(args, '/Input Dims/0') AS BIGINT[]), 'product')) AS nelems,
               coalesce(json_extract_string(args, '/dtype'), json_extract_string(args, '/Input type/0')) AS dt
        FROM tr
    )
),
samples AS (
    SELECT rank, NULL::INTEGER AS peer_rank, format('{} in process group {}', coll_kind, pg) AS link,
           'trace' AS source, pg || '/' || coll_kind || '/' || instance AS sample_key,
           nelems * elem_bytes AS bytes, transfer_ns / 1e9 AS seconds
    FROM tr_bytes
    WHERE nelems > 0 AND elem_bytes IS NOT NULL AND transfer_ns > 0
    UNION ALL
    SELECT s.rank, NULL, upper(l.link), 'comm_summary', coalesce(s.rank_set, '') || '/' || s.step || '/' || s.op_name,
           l.mb * 1e6, l.ms / 1e3
    FROM comm_summary s,
         LATERAL (VALUES ('rdma', s.rdma_transit_mb, s.rdma_transit_ms), ('hccs', s.hccs_transit_mb, s.hccs_transit_ms),
                         ('pcie', s.pcie_transit_mb, s.pcie_transit_ms), ('sdma', s.sdma_transit_mb, s.sdma_transit_ms))
             AS l(link, mb, ms)
    WHERE s.run = $run AND NOT s.is_total AND s.rank IS NOT NULL AND l.mb > 0 AND l.ms > 0
),
bw AS (
    SELECT *, bytes / seconds / 1e9 AS bw_gbps,
           median(bytes / seconds / 1e9) OVER (PARTITION BY source, link, sample_key) AS med_gbps,
           count(*) OVER (PARTITION BY source, link, sample_key) AS n_in_sample
    FROM samples
),
per_rank AS (
    SELECT rank, link, source, count(*) AS samples, sum(bytes) AS bytes, sum(seconds) AS seconds,
           median(bw_gbps) AS bw_gbps, median(med_gbps) AS median_bw_gbps,
           median(bw_gbps / med_gbps) AS bw_ratio,
           100.0 * count(*) FILTER (WHERE bw_gbps < med_gbps) / count(*) AS below_pct
    FROM bw
    WHERE n_in_sample >= $min_ranks AND med_gbps > 0
    GROUP BY ALL
),
enough AS (
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM samples)
                THEN 'no transfer with a known size: no matched collective carries its message size (NCCL "In msg nelems" / dtype, or Input Dims) and no Ascend communication summary has link sizes'
                WHEN NOT EXISTS (SELECT 1 FROM per_rank)
                THEN format('fewer than {} ranks in every collective / op with a known size: no median rank to compare with', $min_ranks)
           END AS skip_reason
)
SELECT 'WARN' AS level, rank, link, source, samples, round(bytes / 1e6, 3) AS mbytes,
       round(bw_gbps, 3) AS bw_gbps, round(median_bw_gbps, 3) AS median_bw_gbps, round(bw_ratio, 2) AS bw_ratio,
       round(below_pct, 1) AS below_pct, 'slow-link' AS cause,
       'this rank moves the same bytes slower than its peers: check its NIC / link (HCCS, RoCE, NVLink, PCIe) health and errors, its network path and switch port, and the communication config (algorithm, buffers, channels)' AS next_step,
       NULL::VARCHAR AS skip_reason
FROM per_rank, enough
WHERE enough.skip_reason IS NULL AND samples >= $min_samples
  AND bw_ratio <= $max_bw_ratio AND below_pct >= $min_below_pct
UNION ALL
SELECT 'SKIP', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, skip_reason
FROM enough WHERE skip_reason IS NOT NULL
ORDER BY rank NULLS FIRST, bw_ratio
