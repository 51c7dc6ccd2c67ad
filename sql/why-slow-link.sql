-- name: why-slow-link
-- version: 4
-- description: Slow links: per collective kind and process group (traces) or link type (Ascend communication summaries), each rank's effective bandwidth vs the median rank's; and per src -> dst pair of the communication matrices, each pair's bandwidth vs the median of comparable pairs (same link type, same size class). A finding names the rank or the pair, the link type, the bytes and the ratio, and says whose problem it is: the rank's (slow on every pair) or the link's (one pair slow both ways).
-- requires: sources
-- param: max_bw_ratio DOUBLE = 0.67      -- slow-link: the rank's (pair's) median bandwidth / the median rank's (pair's), at most this
-- param: min_below_pct DOUBLE = 75.0     -- and below the median in at least this % of its transfers (persistent, not one hiccup)
-- param: min_samples INTEGER = 3         -- transfers per rank (pair) needed to judge
-- param: min_ranks INTEGER = 3           -- fewer ranks (pairs of a link type and size class) have no median to compare with
-- verdict: warn if rows > 0
-- role: verdict
-- subject: rank
-- priority: none
-- order: 220
-- shows: why
-- headline: slow link {link} ({source}) | {mbytes} MB at {bw_gbps} GB/s vs {median_bw_gbps} GB/s on the median {compared_with} ({bw_ratio}x) | below the median in {below_pct} % of {samples} transfers | {verdict}
-- summary: rank {rank} slow-link on {link} ({source}): {mbytes} MB at {bw_gbps} GB/s vs the median {compared_with}'s {median_bw_gbps} GB/s ({bw_ratio}x) over {samples} transfers, below the median in {below_pct}% of them: {verdict}
-- pass: No rank's (nor src -> dst pair's) links are slower than {max_bw_ratio}x the median rank's (comparable pairs') effective bandwidth in >= {min_below_pct}% of its transfers.
--
-- Evidence for slow-comm (ep-slow-rank) and for a straggler: is it the link, and whose? Bandwidth
-- is judged on the TRANSFER, never on the duration (a fast rank's collective lasts long because it waits):
--   in traces, per matched collective (collective_waits), transfer_ns = the rank's end - the last
--     arrival; bytes from the NCCL kernel args ("In msg nelems" / "Out msg nelems", the larger,
--     x the size of "dtype"), else the collective event's first "Input Dims" x "Input type";
--     effective bandwidth = bytes / transfer (algorithm bandwidth, GB/s = bytes per ns);
--   Ascend communication summaries (comm_summary, cluster_communication.json or the ranks'
--     communication.json): per (op, rank) and link type (RDMA / HCCS / PCIE / SDMA), the
--     file's transit size / transit time.
-- Rank rows (source trace / comm_summary, src_rank and dst_rank NULL): each transfer is compared
-- with the median rank of the SAME collective instance (or op), so a large message and a small one
-- are never mixed. A rank is slow-link on a link when its median per-transfer ratio is <=
-- max_bw_ratio AND it is below the median in >= min_below_pct% of >= min_samples transfers.
-- Trace transfers carry no peer (NCCL kernel args name the group, not the peer), so a trace row
-- blames the rank's side of the link ('rank'), never a pair.
-- Pair rows (source comm_matrix: cluster_communication_matrix.json or the ranks'
-- communication_matrix.json): every (op instance, src -> dst) link other than LOCAL (a rank's file
-- and the cluster file holding the same link count once; "Total Op Info" and the "-top1" /
-- "-middle" / "-bottom1" summary entries are left out), bandwidth = transit size / transit time.
-- Comparable pairs: the same link type and size class (the transfer's bytes within a factor of 2:
-- floor(log2(bytes))), over the whole run; the median of comparable pairs is the median of the
-- pairs' own median bandwidths in the class (>= min_ranks pairs, else the class is not judged).
-- Each transfer's ratio = its bandwidth / that median; a pair is slow when its median ratio is <=
-- max_bw_ratio AND it is below the median in >= min_below_pct% of >= min_samples transfers (the
-- same decision as the rank rows). Whose problem (blame, and the verdict text):
--   'rank': the rank's transfers on all its judged pairs of a link type, in and out, taken
--     together, are slow by the same rule (median ratio <= max_bw_ratio, below the median in >=
--     min_below_pct%), with >= min_ranks different peers (fewer cannot tell the rank from its
--     links). In effect it is slow with most of its peers: one slow link of several is not
--     enough, and one pair that noise kept just above max_bw_ratio does not split a slow rank
--     into links (a rule "every pair slow" would, ever more often the more peers it has). One
--     row for the rank; the rank (its NIC / port) is the suspect, and its pairs are not repeated;
--   'link': src -> dst and dst -> src are both slow (and neither end is a 'rank' finding): the
--     link between the two, one row per direction;
--   'one direction': src -> dst slow, dst -> src judged and not slow, or not in the data.
-- The median of comparable pairs stays the healthy pairs' only while a slow rank's pairs are
-- fewer than half of its class (a full mesh of >= 5 ranks). WARN: a link is evidence, the
-- verdicts name the slow card.
-- SKIP (one row with skip_reason) when no collective carries bytes and no summary or matrix has links;
-- when the matrices have links whose `Transport Type` is missing, the reason says so (v4: it said
-- no transfer had a size).
-- v4 (issue 46): a value past what a double holds in bytes or seconds (a link of 1e305 MB is
-- inf bytes; ingest drops such links since, older databases kept them) is left out instead of
-- failing the run's answer (inf cast to INTEGER in the size class), and trace bytes are counted
-- as DOUBLE (an "In msg nelems" near 2^63 overflowed BIGINT).

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
           nelems::DOUBLE * elem_bytes AS bytes, transfer_ns / 1e9 AS seconds
    FROM tr_bytes
    WHERE nelems > 0 AND elem_bytes IS NOT NULL AND transfer_ns > 0 AND isfinite(nelems::DOUBLE * elem_bytes)
    UNION ALL
    SELECT s.rank, NULL, upper(l.link), 'comm_summary', coalesce(s.rank_set, '') || '/' || s.step || '/' || s.op_name,
           l.mb * 1e6, l.ms / 1e3
    FROM comm_summary s,
         LATERAL (VALUES ('rdma', s.rdma_transit_mb, s.rdma_transit_ms), ('hccs', s.hccs_transit_mb, s.hccs_transit_ms),
                         ('pcie', s.pcie_transit_mb, s.pcie_transit_ms), ('sdma', s.sdma_transit_mb, s.sdma_transit_ms))
             AS l(link, mb, ms)
    WHERE s.run = $run AND NOT s.is_total AND s.rank IS NOT NULL AND l.mb > 0 AND l.ms > 0
      AND isfinite(l.mb * 1e6 / (l.ms / 1e3))
),
mx AS (  -- matrix links, once per (op instance, src -> dst) whichever file holds them
    SELECT upper(transport_type) AS link_type, src_rank, dst_rank, step, op_name, group_name,
           max(transit_size_mb) * 1e6 AS bytes, max(transit_ms) / 1e3 AS seconds
    FROM comm_matrix
    WHERE run = $run AND NOT is_total AND src_rank <> dst_rank AND upper(transport_type) <> 'LOCAL'
      AND transit_size_mb > 0 AND transit_ms > 0 AND isfinite(transit_size_mb * 1e6 / (transit_ms / 1e3))
      AND NOT regexp_full_match(op_name, '.*-(top|middle|bottom)[0-9]*')
    GROUP BY ALL
),
untyped AS (  -- matrix links that would be judged but for their missing link type
    SELECT count(*) AS n
    FROM comm_matrix
    WHERE run = $run AND NOT is_total AND src_rank <> dst_rank AND nullif(trim(transport_type), '') IS NULL
      AND transit_size_mb > 0 AND transit_ms > 0
),
mx_bw AS (
    SELECT *, floor(log2(bytes))::INTEGER AS size_class, bytes / seconds / 1e9 AS bw_gbps FROM mx
),
pair_class AS (  -- each pair's own median bandwidth in a (link type, size class)
    SELECT link_type, size_class, src_rank, dst_rank, median(bw_gbps) AS pair_gbps
    FROM mx_bw GROUP BY ALL
),
class_med AS (
    SELECT link_type, size_class, median(pair_gbps) AS med_gbps, count(*) AS n_pairs
    FROM pair_class GROUP BY ALL
),
mx_ratio AS (  -- each transfer against the median of its comparable pairs
    SELECT m.*, c.med_gbps, m.bw_gbps / c.med_gbps AS ratio,
           count(*) OVER (PARTITION BY m.link_type, m.src_rank, m.dst_rank) AS pair_samples
    FROM mx_bw m JOIN class_med c USING (link_type, size_class)
    WHERE c.n_pairs >= $min_ranks AND c.med_gbps > 0
),
per_pair AS (
    SELECT link_type, src_rank, dst_rank, count(*) AS samples, sum(bytes) AS bytes,
           median(bw_gbps) AS bw_gbps, median(med_gbps) AS median_bw_gbps, median(ratio) AS bw_ratio,
           100.0 * count(*) FILTER (WHERE ratio < 1) / count(*) AS below_pct
    FROM mx_ratio GROUP BY ALL
),
judged AS (
    SELECT *, bw_ratio <= $max_bw_ratio AND below_pct >= $min_below_pct AS slow
    FROM per_pair WHERE samples >= $min_samples
),
ends AS (  -- the judged pairs' transfers at both ends of the pair
    SELECT x.link_type, x.src_rank AS rank, x.dst_rank AS peer, x.src_rank, x.dst_rank, x.bytes, x.bw_gbps, x.med_gbps, x.ratio
    FROM mx_ratio x WHERE x.pair_samples >= $min_samples
    UNION ALL
    SELECT x.link_type, x.dst_rank, x.src_rank, x.src_rank, x.dst_rank, x.bytes, x.bw_gbps, x.med_gbps, x.ratio
    FROM mx_ratio x WHERE x.pair_samples >= $min_samples
),
rank_blame AS (  -- ranks whose transfers, in and out, to >= min_ranks peers are slow by the same rule
    SELECT e.link_type, e.rank, count(DISTINCT (e.src_rank, e.dst_rank)) AS pairs, count(DISTINCT e.peer) AS peers,
           count(*) AS samples, sum(e.bytes) AS bytes, median(e.bw_gbps) AS bw_gbps,
           median(e.med_gbps) AS median_bw_gbps, median(e.ratio) AS bw_ratio,
           100.0 * count(*) FILTER (WHERE e.ratio < 1) / count(*) AS below_pct,
           (SELECT count(*) FROM judged j WHERE j.slow AND j.link_type = e.link_type AND e.rank IN (j.src_rank, j.dst_rank)) AS slow_pairs
    FROM ends e GROUP BY e.link_type, e.rank
    HAVING count(DISTINCT e.peer) >= $min_ranks AND median(e.ratio) <= $max_bw_ratio
       AND 100.0 * count(*) FILTER (WHERE e.ratio < 1) / count(*) >= $min_below_pct
),
pair_rows AS (
    SELECT j.*, r.slow AS reverse_slow
    FROM judged j
    LEFT JOIN judged r ON r.link_type = j.link_type AND r.src_rank = j.dst_rank AND r.dst_rank = j.src_rank
    WHERE j.slow
      AND NOT EXISTS (SELECT 1 FROM rank_blame b WHERE b.link_type = j.link_type AND b.rank IN (j.src_rank, j.dst_rank))
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
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM samples) AND NOT EXISTS (SELECT 1 FROM mx)
                     AND (SELECT n FROM untyped) > 0
                THEN format('the communication matrices have {} links between two ranks with a size and a time, but none says its link type (`Transport Type` missing or empty): a link is compared only with links of the same type, so none can be judged; no collective or communication summary has a known size either', (SELECT n FROM untyped))
                WHEN NOT EXISTS (SELECT 1 FROM samples) AND NOT EXISTS (SELECT 1 FROM mx)
                THEN 'no transfer with a known size: no matched collective carries its message size (NCCL "In msg nelems" / dtype, or Input Dims), no Ascend communication summary has link sizes and no communication matrix has a link between two ranks'
                WHEN NOT EXISTS (SELECT 1 FROM per_rank) AND NOT EXISTS (SELECT 1 FROM per_pair)
                THEN format('fewer than {} ranks in every collective / op with a known size, and fewer than {} pairs of every link type and size class of the communication matrices: no median rank or pair to compare with', $min_ranks, $min_ranks)
           END AS skip_reason
),
findings AS (
    SELECT rank, NULL::INTEGER AS src_rank, NULL::INTEGER AS dst_rank, link, source, 'rank' AS compared_with,
           samples, bytes, bw_gbps, median_bw_gbps, bw_ratio, below_pct, 'rank' AS blame,
           'the rank moves the same bytes slower than the median rank (the transfers name no peer: its side of the link)' AS verdict
    FROM per_rank
    WHERE samples >= $min_samples AND bw_ratio <= $max_bw_ratio AND below_pct >= $min_below_pct
    UNION ALL
    SELECT rank, NULL, NULL, format('{} (rank {}: {} pairs, in and out)', link_type, rank, pairs), 'comm_matrix', 'pair',
           samples, bytes, bw_gbps, median_bw_gbps, bw_ratio, below_pct, 'rank',
           format('the rank''s problem: its transfers with {} peers, in and out, are slow as a whole ({} of its {} judged {} pairs slow on their own)',
                  peers, slow_pairs, pairs, link_type)
    FROM rank_blame
    UNION ALL
    SELECT src_rank, src_rank, dst_rank, format('{} {} -> {}', link_type, src_rank, dst_rank), 'comm_matrix', 'pair',
           samples, bytes, bw_gbps, median_bw_gbps, bw_ratio, below_pct,
           CASE WHEN reverse_slow THEN 'link' ELSE 'one direction' END,
           CASE WHEN reverse_slow
                THEN format('the link''s problem: {} -> {} is slow both ways, while both ranks'' other pairs are not', dst_rank, src_rank)
                WHEN reverse_slow IS NULL
                THEN format('one direction: {} -> {} has no judged transfers, and the ranks'' other pairs are not all slow', dst_rank, src_rank)
                ELSE format('one direction: {} -> {} is not slow, and the ranks'' other pairs are not all slow', dst_rank, src_rank) END
    FROM pair_rows
)
SELECT 'WARN' AS level, rank, src_rank, dst_rank, link, source, compared_with, samples, round(bytes / 1e6, 3) AS mbytes,
       round(bw_gbps, 3) AS bw_gbps, round(median_bw_gbps, 3) AS median_bw_gbps, round(bw_ratio, 2) AS bw_ratio,
       round(below_pct, 1) AS below_pct, blame, verdict, 'slow-link' AS cause,
       CASE WHEN blame = 'link'
            THEN 'this link moves the same bytes slower than comparable pairs in both directions: check the cable / port / switch path between the two ranks and its error counters'
            ELSE 'this rank moves the same bytes slower than its peers: check its NIC / link (HCCS, RoCE, NVLink, PCIe) health and errors, its network path and switch port, and the communication config (algorithm, buffers, channels)' END AS next_step,
       NULL::VARCHAR AS skip_reason
FROM findings, enough
WHERE enough.skip_reason IS NULL
UNION ALL
SELECT 'SKIP', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, skip_reason
FROM enough WHERE skip_reason IS NOT NULL
ORDER BY rank NULLS FIRST, bw_ratio, src_rank, dst_rank
