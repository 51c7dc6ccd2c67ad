-- Operator classes: which taxonomy row classifies each name, and one table of classified,
-- timed operations from every source (trace events and operator CSV rows alike).

-- Per distinct name, the winning taxonomy row: user rows beat built-ins, then lower priority.
-- Matching runs on DISTINCT names only, so it costs nothing per event.
-- A table macro so that committing files classifies those files' names only (sids), not every
-- name in the database; sids NULL means all files.
-- A join of names with patterns compiles each pattern once per (name, pattern) pair (the pattern
-- is not a constant), which made matching cost grow with names x rows (0.1 s per 100 names with
-- the GPU families). So the built-in rows are matched by two macros with constant regexes,
-- written by taxonomy.load_builtin: _builtin_taxonomy_any (one alternation of all built-in
-- patterns: which names can match at all) and _builtin_taxonomy_hit (the winning built-in
-- pattern of such a name). Only user rows, usually none, go through the pair join.
CREATE OR REPLACE MACRO _builtin_taxonomy_any(name) AS true;
CREATE OR REPLACE MACRO _builtin_taxonomy_hit(name) AS NULL::VARCHAR;

-- Is a row's source one of the files ``sids`` (a list of source ids; NULL: every file)? Callers
-- write the list into the statement (store._sids_literal), so the planner folds it to a range
-- filter on source_id that skips other files' row groups, plus the exact test.
CREATE OR REPLACE MACRO _in_files(source_id, sids) AS
    (sids IS NULL OR (source_id BETWEEN list_min(sids) AND list_max(sids) AND list_contains(sids, source_id)));

-- The operation names of files (every file: sids NULL).
CREATE OR REPLACE MACRO _names_of(sids) AS TABLE
SELECT DISTINCT name FROM event_rows_all
WHERE ph = 'X' AND name IS NOT NULL AND _in_files(source_id, sids)
UNION
SELECT DISTINCT name FROM op_rows_all WHERE name IS NOT NULL AND _in_files(source_id, sids);

-- The rule, for a list of names (the matched ones, with the row that won): a commit passes only
-- the names no earlier file had (store.classify_new_names), so it pays the matching for those only
-- (planning the constant regexes, ~25 ms, stays per commit); `slowcard taxonomy` passes the
-- names it is asked about (_classify_names).
CREATE OR REPLACE MACRO _name_class_in(name_list) AS TABLE
WITH names AS (SELECT DISTINCT unnest(name_list) AS name),
builtin_hits AS (
    SELECT b.name, {'op_class': t.op_class, 'coll_kind': t.coll_kind, 'pattern': t.pattern, 'origin': t.origin} AS hit
    FROM (SELECT name, _builtin_taxonomy_hit(name) AS pattern FROM names WHERE _builtin_taxonomy_any(name)) b
    JOIN (SELECT * FROM op_taxonomy WHERE origin = 'builtin'
          QUALIFY row_number() OVER (PARTITION BY pattern ORDER BY priority) = 1) t USING (pattern)
),
user_hits AS (
    SELECT n.name,
           arg_min({'op_class': t.op_class, 'coll_kind': t.coll_kind, 'pattern': t.pattern, 'origin': t.origin},
                   t.priority) AS hit
    FROM names n JOIN op_taxonomy t ON t.origin = 'user' AND regexp_matches(n.name, t.pattern, 'i')
    GROUP BY n.name
),
hits AS (  -- user rows win over built-in rows
    SELECT * FROM user_hits
    UNION ALL
    SELECT * FROM builtin_hits WHERE name NOT IN (SELECT name FROM user_hits)
)
SELECT name, hit.op_class AS op_class, hit.coll_kind AS coll_kind, hit.pattern AS pattern, hit.origin AS origin
FROM hits;

-- The rule over the names of files (every file: sids NULL).
CREATE OR REPLACE MACRO _name_class_for(sids) AS TABLE
SELECT name, op_class, coll_kind, pattern FROM _name_class_in((SELECT list(name) FROM _names_of(sids)));

CREATE OR REPLACE VIEW _name_class AS SELECT * FROM _name_class_for(NULL);

-- The same rule for a list of names (no trace needed): what would these names be classified as?
-- (unmatched names with NULLs)
CREATE OR REPLACE MACRO _classify_names(name_list) AS TABLE
WITH names AS (SELECT DISTINCT unnest(name_list) AS name)
SELECT n.name, c.op_class, c.coll_kind, c.pattern, c.origin
FROM names n LEFT JOIN _name_class_in(name_list) c USING (name);

-- Normalised collective kind from a Kineto "Collective name" arg (NCCL has no all-to-all
-- kernel: all_to_all lowers to SendRecv kernels, so the arg is the only way to tell).
CREATE OR REPLACE MACRO _coll_kind_of(collective_name) AS
    CASE
        WHEN collective_name IS NULL THEN NULL
        WHEN regexp_matches(lower(collective_name), 'all_?to_?all') THEN 'all_to_all'
        WHEN regexp_matches(lower(collective_name), 'all_?reduce') THEN 'all_reduce'
        WHEN regexp_matches(lower(collective_name), 'all_?gather') THEN 'all_gather'
        WHEN regexp_matches(lower(collective_name), 'reduce_?scatter') THEN 'reduce_scatter'
        WHEN regexp_matches(lower(collective_name), 'broadcast') THEN 'broadcast'
        WHEN regexp_matches(lower(collective_name), 'send|recv') THEN 'send_recv'
        ELSE 'other'
    END;

-- Every classified, timed operation, computed live. origin 'trace' = Chrome-trace X events,
-- 'ops' = operator CSV rows (kernel_details / op_summary). A GPU kernel with a "Collective name"
-- arg is a collective whatever its kernel name. `pattern` shows which taxonomy row classified it.
-- launch_ns: for a device kernel of a trace, the time of the host call that launched it (CUDA /
-- HIP runtime launch, linked by Kineto's correlation id: the ac2g flow whose id it is, else the
-- runtime event carrying the same "correlation" arg). It puts host ranges (a layer annotation,
-- nccl:all_to_all) and device kernels on one timeline without guessing from overlapping times.
-- An NCCL kernel without a "Collective name" arg launched inside a host all-to-all op
-- (nccl:all_to_all: torch all_to_all_single on NCCL runs as SendRecv kernels) is an all_to_all.
-- The store copies this into the table op_class_rows when a file is committed (and rebuilds it
-- when the taxonomy changes), because every EP query reads it several times.
CREATE OR REPLACE MACRO _op_classes_for(sids) AS TABLE
-- Name classes from the table _name_classes (schema.sql), which the store keeps holding every
-- name's _name_class_for answer (store.classify_new_names): planning the classification itself,
-- ~100 constant regexes, took most of a small file's commit.
WITH nc AS (SELECT DISTINCT name, op_class, coll_kind, pattern FROM _name_classes WHERE op_class IS NOT NULL),
e AS (
    -- parse args only where it can hold a collective name: a JSON parse of every kernel's args
    -- is most of the cost of classifying a large trace
    SELECT *, CASE WHEN cat = 'kernel' AND contains(args, 'Collective name')
                   THEN json_extract_string(args, '$."Collective name"') END AS coll_name
    FROM event_rows_all
    WHERE ph = 'X' AND dur_ns IS NOT NULL AND ts_ns IS NOT NULL AND _in_files(source_id, sids)
),
classified AS (
    SELECT e.source_id, e.pid, e.tid, e.cat, e.name, e.ts_ns, e.dur_ns, e.args, e.coll_name,
           c.op_class, c.coll_kind, c.pattern,
           coalesce(e.cat IN ('kernel', 'gpu_user_annotation'), FALSE) AS on_device  -- (no category: not a device kernel)
    FROM e LEFT JOIN nc c USING (name)
    WHERE (c.op_class IS NOT NULL OR e.coll_name IS NOT NULL)
      -- the device copy of a host collective range (gpu_user_annotation "nccl:all_to_all") spans
      -- the collective's kernels: it is not a second call
      -- (coalesce: an event without a category, every task of an Ascend timeline, made the test
      -- NULL and the event unclassified)
      AND NOT (coalesce(e.cat, '') = 'gpu_user_annotation' AND c.op_class = 'collective')
),
corr AS (  -- correlation ids of the classified kernels only (a handful of JSON reads)
    SELECT source_id, pid, tid, ts_ns, name,
           TRY_CAST(regexp_extract(args, '"correlation":\s*(\d+)', 1) AS BIGINT) AS correlation
    FROM classified WHERE cat = 'kernel'
),
flows AS (
    SELECT source_id, TRY_CAST(id AS BIGINT) AS correlation, min(ts_ns) AS launch_ns
    FROM event_rows_all
    WHERE ph = 's' AND cat = 'ac2g' AND _in_files(source_id, sids)
      AND source_id IN (SELECT source_id FROM corr)
      -- the flows of the classified kernels only (a 300 MB trace: 2,350 of its 171,550 flows
      -- to group)
      AND TRY_CAST(id AS BIGINT) IN (SELECT correlation FROM corr)
    GROUP BY ALL
),
flow_sources AS (  -- files with any flow event (those never need the runtime fallback)
    SELECT DISTINCT source_id FROM event_rows_all
    WHERE ph = 's' AND cat = 'ac2g' AND _in_files(source_id, sids)
      AND source_id IN (SELECT source_id FROM corr)
),
runtime AS (  -- traces without flow events: the launch call names the same correlation
    SELECT source_id, TRY_CAST(regexp_extract(args, '"correlation":\s*(\d+)', 1) AS BIGINT) AS correlation,
           min(ts_ns) AS launch_ns
    FROM event_rows_all
    WHERE ph = 'X' AND cat IN ('cuda_runtime', 'cuda_driver') AND _in_files(source_id, sids)
      -- one semi join, empty when the file has flows: DuckDB then skips this scan (with NOT IN
      -- it read the args of every runtime event: 0.15 s on a 300 MB trace, for no row)
      AND source_id IN (SELECT source_id FROM corr EXCEPT SELECT source_id FROM flow_sources)
      AND contains(args, 'correlation')
    GROUP BY ALL
),
launched AS (
    SELECT k.source_id, k.pid, k.tid, k.ts_ns, k.name, 'kernel' AS cat, coalesce(f.launch_ns, r.launch_ns) AS launch_ns
    FROM corr k
    LEFT JOIN flows f USING (source_id, correlation)
    LEFT JOIN runtime r USING (source_id, correlation)
),
rows AS (
    SELECT c.*, l.launch_ns
    FROM classified c
    -- equalities only (c.cat = 'kernel' as a condition made it a nested-loop join)
    LEFT JOIN launched l ON l.cat = c.cat AND l.source_id = c.source_id AND l.pid = c.pid
                        AND l.tid = c.tid AND l.ts_ns = c.ts_ns AND l.name = c.name
),
host_a2a AS (  -- host all-to-all ops, to name the NCCL kernels they launch
    SELECT source_id, ts_ns, ts_ns + dur_ns AS end_ns
    FROM rows WHERE NOT on_device AND op_class = 'collective' AND coll_kind = 'all_to_all'
),
a2a_kernels AS (
    SELECT k.source_id, k.pid, k.tid, k.ts_ns, k.name
    FROM (SELECT * FROM rows WHERE on_device AND launch_ns IS NOT NULL AND op_class = 'collective'
                                AND coll_name IS NULL AND coll_kind IN ('send_recv', 'other')) k
    ASOF JOIN host_a2a h ON k.source_id = h.source_id AND k.launch_ns >= h.ts_ns
    WHERE k.launch_ns < h.end_ns
)
SELECT r.source_id, 'trace' AS origin, r.pid, r.tid, r.cat, r.name,
       r.ts_ns, r.dur_ns, r.ts_ns + r.dur_ns AS end_ns,
       CASE WHEN r.coll_name IS NOT NULL THEN 'collective' ELSE r.op_class END AS op_class,
       CASE WHEN r.coll_name IS NOT NULL THEN _coll_kind_of(r.coll_name)
            WHEN a.source_id IS NOT NULL THEN 'all_to_all' ELSE r.coll_kind END AS coll_kind,
       CASE WHEN r.coll_name IS NOT NULL THEN 'args."Collective name"'
            WHEN a.source_id IS NOT NULL THEN r.pattern || ' (launched in a host all_to_all)'
            ELSE r.pattern END AS pattern,
       coalesce(json_extract_string(r.args, '$."Process Group Name"'), json_extract_string(r.args, '$."Process Group Ranks"'), 'default') AS pg,
       TRY_CAST(json_extract_string(r.args, '$.Seq') AS BIGINT) AS seq,
       r.on_device,
       NULL::BIGINT AS tokens,
       r.launch_ns
FROM rows r
LEFT JOIN a2a_kernels a ON a.source_id = r.source_id AND a.pid = r.pid AND a.tid = r.tid
                       AND a.ts_ns = r.ts_ns AND a.name = r.name
UNION ALL
SELECT o.source_id, 'ops' AS origin, CAST(o.device_id AS VARCHAR) AS pid,
       o.stream_id AS tid, o.accelerator_core AS cat, o.name, o.ts_ns, o.dur_ns,
       o.ts_ns + o.dur_ns AS end_ns, c.op_class, c.coll_kind, c.pattern,
       coalesce(o.extra->>'$."Group Name"', 'default') AS pg, NULL::BIGINT AS seq,
       TRUE AS on_device, o.gmm_tokens AS tokens, NULL::BIGINT AS launch_ns
FROM ops o
JOIN nc c USING (name)
WHERE o.ts_ns IS NOT NULL AND o.dur_ns IS NOT NULL AND _in_files(o.source_id, sids);

CREATE OR REPLACE VIEW _op_classes_live AS SELECT * FROM _op_classes_for(NULL);

-- What queries read: the materialised classification, with run / rank / host from `sources`.
CREATE OR REPLACE VIEW op_classes AS
SELECT s.run, s.rank, s.host, c.*
FROM op_class_rows_all c JOIN scoped_sources s USING (source_id);

-- Tokens each all-to-all delivers to this rank (sum of its output split sizes), from the
-- c10d::alltoall_base_ / record_param_comms CPU ops or a kernel carrying the split sizes.
-- Materialised per file into a2a_split_rows at commit (see schema.sql); sids NULL means all files.
CREATE OR REPLACE MACRO _a2a_splits_for(sids) AS TABLE
-- No filter on recv_tokens here: DuckDB pushes it below the name test and parses the args of
-- every event as JSON (0.5 s per 300 MB rank file); consumers skip the NULLs.
-- One scan for both kinds of rows (a second one read the args of every kernel again): the
-- c10d::alltoall_base_ / record_param_comms CPU ops (their "Out split size", else
-- "Concrete Inputs"[3]) and, after a plain substring test before any JSON parse, the kernels
-- carrying "Out split size".
SELECT e.source_id, e.ts_ns,
       CAST(list_sum(coalesce(
           TRY_CAST(json_extract_string(e.args, '$."Out split size"') AS BIGINT[]),
           CASE WHEN e.name IN ('c10d::alltoall_base_', 'record_param_comms')
                THEN TRY_CAST(json_extract_string(e.args, '$."Concrete Inputs"[3]') AS BIGINT[]) END)) AS BIGINT)
           AS recv_tokens
FROM event_rows_all e
WHERE e.ph = 'X' AND _in_files(e.source_id, sids) AND e.name IS NOT NULL
  AND (e.name IN ('c10d::alltoall_base_', 'record_param_comms')
       OR (e.cat = 'kernel' AND contains(e.args, 'Out split size')));
