-- Collectives matched across ranks, per-host clock offsets, and per-rank wait / arrival.
-- In a synchronous collective every rank leaves together: a rank that arrives early waits
-- inside the op, so the slow card is the one that arrives LAST and has the SHORTEST op.

-- One row per collective call of a ranked source. The device lane (NCCL kernels) is used when
-- the source has one, else the host lane (gloo threads, HCCL rows). instance = NCCL Seq when the
-- trace has it, else the call's order within (source, process group, kind).
-- A dispatch / combine kernel that the taxonomy gives a coll_kind IS an all-to-all across ranks
-- (DeepEP normal / low-latency, pplx: each rank's kernel starts when its stream reaches it and
-- ends when the data of every rank has arrived, so its end is where the ranks meet): it is
-- matched like a collective, in a group of its own per class ('ep:dispatch', 'ep:combine').
-- A truncated source (status 'truncated': the file was cut mid-write) can miss calls ANYWHERE in
-- time, not only at the end: Kineto writes lane by lane, so a cut drops every lane written after
-- it whole (a gloo runloop thread, the device stream). Numbered by order, its k-th call would
-- then be paired with another rank's different call, and look like a huge transfer or wait. So
-- its order-numbered calls of a (process group, kind) are kept only when it has as many as the
-- rank with the most (nothing was lost); else they are left out and the other ranks are matched
-- among themselves. Calls numbered by Seq name themselves and are kept (a lost one only unmatches
-- its instance). A truncated source that fell back to its host lane while other ranks of the run
-- have a device lane has lost that lane to the cut: its host calls are left out too (host op
-- times are not kernel times). A run with duplicate ranks (rank_conflicts) is left out whole.
-- One source per rank: torch_npu writes a rank's operators twice, in kernel_details.csv (its HCCL
-- rows) and in trace_view.json (its hcom_* ops), side by side in ASCEND_PROFILER_OUTPUT. Read from
-- both, every call of the rank counted twice (a straggler's cost doubled, sync-gaps failed on
-- duplicate keys). A rank with collectives in several sources (of different formats: the same
-- format twice is a rank conflict) reads them from the source its EP analysis uses
-- (_ep_sources), else the one with a device lane, else the one with the most calls, else the
-- first ingested.
CREATE OR REPLACE VIEW _collectives AS
WITH ex AS MATERIALIZED (
    SELECT * REPLACE (CASE WHEN op_class = 'collective' THEN pg ELSE 'ep:' || op_class END AS pg)
    FROM op_classes
    WHERE op_class = 'collective'
       OR (op_class IN ('dispatch', 'combine') AND coll_kind IS NOT NULL AND on_device)
),
lanes AS (
    SELECT source_id, bool_or(on_device) AS device FROM ex GROUP BY source_id
),
picked AS (
    SELECT x.run, x.rank,
           arg_max(x.source_id, (e.source_id IS NOT NULL, l.device, x.n_calls, -x.source_id)) AS source_id
    FROM (SELECT run, rank, source_id, count(*) AS n_calls FROM ex WHERE rank IS NOT NULL GROUP BY ALL) x
    JOIN lanes l USING (source_id)
    LEFT JOIN (SELECT DISTINCT source_id FROM _ep_sources) e USING (source_id)
    GROUP BY x.run, x.rank
),
calls AS (
    SELECT o.run, o.rank, coalesce(o.host, '') AS host, o.source_id, o.name, o.pg, o.coll_kind,
           o.ts_ns, o.end_ns, o.dur_ns,
           coalesce(o.seq, row_number() OVER (PARTITION BY o.source_id, o.pg, o.coll_kind ORDER BY o.ts_ns)) AS instance,
           o.seq IS NULL AS by_order, l.device
    FROM ex o JOIN lanes l USING (source_id) SEMI JOIN picked p USING (source_id)
    WHERE o.on_device = l.device AND o.rank IS NOT NULL
      AND o.run NOT IN (SELECT run FROM rank_conflicts)
),
per_source AS (
    SELECT c.run, c.source_id, c.pg, c.coll_kind, s.status = 'truncated' AS truncated,
           bool_or(c.by_order) AS by_order, any_value(c.device) AS device, count(*) AS n_calls
    FROM calls c JOIN scoped_sources s USING (source_id)
    GROUP BY c.run, c.source_id, c.pg, c.coll_kind, s.status
),
untrusted AS (
    SELECT source_id, pg, coll_kind FROM per_source
    QUALIFY truncated
        AND ((by_order AND n_calls < max(n_calls) OVER (PARTITION BY run, pg, coll_kind))
             OR (NOT device AND bool_or(device) OVER (PARTITION BY run)))
)
SELECT c.run, c.rank, c.host, c.source_id, c.name, c.pg, c.coll_kind, c.ts_ns, c.end_ns, c.dur_ns, c.instance
FROM calls c ANTI JOIN untrusted u USING (source_id, pg, coll_kind);

-- Only instances seen on every rank of their (process group, kind): a rank that misses calls
-- would shift the order-based matching, so such instances are left out rather than mismatched.
CREATE OR REPLACE VIEW _coll_matched AS
WITH group_ranks AS (
    SELECT run, pg, coll_kind, count(DISTINCT rank) AS n_ranks FROM _collectives GROUP BY ALL
),
inst AS (
    SELECT run, pg, coll_kind, instance, count(DISTINCT rank) AS n FROM _collectives GROUP BY ALL
)
SELECT c.*, g.n_ranks
FROM _collectives c
JOIN inst i USING (run, pg, coll_kind, instance)
JOIN group_ranks g USING (run, pg, coll_kind)
WHERE i.n = g.n_ranks AND g.n_ranks > 1;

-- Clock offset of each host against the host of the lowest rank, estimated from the END times
-- of matched collectives: ranks leave a synchronous collective together, except a rank whose own
-- transfer is slow, which leaves later. So each host is represented by its EARLIEST end in each
-- instance, and the offset is the median over instances of (host's earliest end - reference
-- host's earliest end). Ranks of one host share its clock; ranks with no host name are taken to
-- share one clock.
CREATE OR REPLACE VIEW clock_offsets AS
WITH ref AS (
    SELECT run, arg_min(host, rank) AS ref_host FROM _coll_matched GROUP BY run
),
host_end AS (
    SELECT run, host, pg, coll_kind, instance, min(end_ns) AS end_ns
    FROM _coll_matched GROUP BY ALL
),
d AS (
    SELECT h.run, h.host, h.end_ns - r.end_ns AS d_ns
    FROM host_end h
    JOIN ref USING (run)
    JOIN host_end r ON r.run = h.run AND r.host = ref.ref_host AND r.pg = h.pg
                   AND r.coll_kind = h.coll_kind AND r.instance = h.instance
)
SELECT d.run, d.host,
       CASE WHEN d.host = r.ref_host THEN 0 ELSE CAST(median(d.d_ns) AS BIGINT) END AS offset_ns,
       CASE WHEN d.host = r.ref_host THEN 0.0 ELSE median(d.d_ns) / 1e6 END AS offset_ms,
       count(*) AS n_samples
FROM d JOIN ref r USING (run)
GROUP BY d.run, d.host, r.ref_host;

-- Per matched collective and rank: clock-corrected arrival, wait and transfer.
--   arrival_skew_ns  last corrected start - first corrected start (same for every rank of it)
--   wait_ns          own duration - the shortest duration over ranks (the msprof-analyze rule)
--   arrival_lag_ns   how long this rank waited for the last one to arrive
--   transfer_ns      corrected end - last arrival: the exchange itself, once everyone is there
--   peer_transfer_ns the median transfer_ns of the ranks that did NOT arrive last: the yardstick
--                    of a rank's own transfer (see _transfer_expected for the last arriver's)
CREATE OR REPLACE VIEW collective_waits AS
WITH m AS (
    SELECT m.*, m.ts_ns - coalesce(o.offset_ns, 0) AS start_adj_ns,
           m.end_ns - coalesce(o.offset_ns, 0) AS end_adj_ns
    FROM _coll_matched m LEFT JOIN clock_offsets o USING (run, host)
),
w AS (
    SELECT *,
           max(start_adj_ns) OVER inst AS last_start_ns,
           min(start_adj_ns) OVER inst AS first_start_ns,
           min(dur_ns) OVER inst AS min_dur_ns,
           median(dur_ns) OVER inst AS median_dur_ns,
           arg_max(rank, start_adj_ns) OVER inst AS last_rank
    FROM m
    WINDOW inst AS (PARTITION BY run, pg, coll_kind, instance)
),
p AS (
    SELECT *, median(greatest(end_adj_ns - last_start_ns, 0)) FILTER (WHERE rank <> last_rank) OVER inst AS peer_transfer_ns
    FROM w
    WINDOW inst AS (PARTITION BY run, pg, coll_kind, instance)
)
SELECT run, pg, coll_kind, instance, rank, host, source_id, name, ts_ns, dur_ns, end_ns,
       start_adj_ns, end_adj_ns, n_ranks,
       last_start_ns - first_start_ns AS arrival_skew_ns,
       dur_ns - min_dur_ns AS wait_ns,
       last_start_ns - start_adj_ns AS arrival_lag_ns,
       greatest(end_adj_ns - last_start_ns, 0) AS transfer_ns,
       median_dur_ns,
       rank = last_rank AS arrived_last,
       last_rank,
       peer_transfer_ns
FROM p;

-- The transfer a rank's link is judged against. Where it waited for a later rank: its peers'
-- median (peer_transfer_ns). Where it arrived LAST, its transfer is long by construction (it
-- still has every send and receive to do when it arrives; the others did theirs while waiting
-- and have one left), so a rank that is late for host reasons must not read as a slow link:
-- the last arriver is expected to exceed its peers by what last arrivers of the same (process
-- group, kind) exceed theirs by when they are OTHER ranks (median; 0 when only this rank is ever
-- last). last_excess_ns per (run, pg, kind, rank).
CREATE OR REPLACE VIEW _transfer_expected AS
WITH last AS (
    SELECT run, pg, coll_kind, last_rank, transfer_ns - peer_transfer_ns AS excess_ns
    FROM collective_waits WHERE arrived_last AND peer_transfer_ns IS NOT NULL
),
ranks AS (SELECT DISTINCT run, pg, coll_kind, rank FROM collective_waits)
SELECT r.run, r.pg, r.coll_kind, r.rank, median(l.excess_ns) AS last_excess_ns
FROM ranks r
LEFT JOIN last l ON l.run = r.run AND l.pg IS NOT DISTINCT FROM r.pg AND l.coll_kind IS NOT DISTINCT FROM r.coll_kind
                AND l.last_rank <> r.rank
GROUP BY ALL;

-- Collective facts per MoE layer instance and rank (joins the EP views).
CREATE OR REPLACE VIEW _layer_collectives AS
SELECT l.run, l.rank, l.source_id, l.step, l.layer, l.occurrence,
       count(*) AS n_collectives,
       count(*) FILTER (WHERE c.arrived_last AND c.arrival_skew_ns > 0.05 * c.median_dur_ns) AS n_arrived_last,
       CAST(sum(c.wait_ns) AS BIGINT) AS wait_ns,
       CAST(sum(c.arrival_lag_ns) AS BIGINT) AS arrival_lag_ns,
       CAST(sum(c.transfer_ns) AS BIGINT) AS transfer_ns,
       CAST(max(c.arrival_skew_ns) AS BIGINT) AS max_arrival_skew_ns,
       -- what this rank's transfer would be with a normal link (see _transfer_expected)
       CAST(sum(c.peer_transfer_ns + CASE WHEN c.arrived_last THEN coalesce(x.last_excess_ns, 0) ELSE 0 END)
            AS BIGINT) AS expected_transfer_ns
FROM collective_waits c
LEFT JOIN _transfer_expected x USING (run, pg, coll_kind, rank)
ASOF JOIN moe_layers l ON c.source_id = l.source_id AND c.ts_ns >= l.start_ns
WHERE c.ts_ns < l.end_ns
GROUP BY ALL;
