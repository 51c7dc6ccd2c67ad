-- Operator classes: which taxonomy row classifies each name, and one table of classified,
-- timed operations from every source (trace events and operator CSV rows alike).

-- Per distinct name, the winning taxonomy row: user rows beat built-ins, then lower priority.
-- Matching runs on DISTINCT names only, so it costs nothing per event.
-- A table macro so that committing one file classifies that file's names only (sid), not every
-- name in the database; sid NULL means all files.
CREATE OR REPLACE MACRO _name_class_for(sid) AS TABLE
WITH names AS (
    SELECT DISTINCT name FROM event_rows
    WHERE ph = 'X' AND name IS NOT NULL AND (sid IS NULL OR source_id = sid)
    UNION
    SELECT DISTINCT name FROM op_rows WHERE name IS NOT NULL AND (sid IS NULL OR source_id = sid)
),
hits AS (
    SELECT n.name,
           arg_min({'op_class': t.op_class, 'coll_kind': t.coll_kind, 'pattern': t.pattern},
                   (t.origin <> 'user')::INTEGER * 1000000 + t.priority) AS hit
    FROM names n JOIN op_taxonomy t ON regexp_matches(n.name, t.pattern, 'i')
    GROUP BY n.name
)
SELECT name, hit.op_class AS op_class, hit.coll_kind AS coll_kind, hit.pattern AS pattern
FROM hits;

CREATE OR REPLACE VIEW _name_class AS SELECT * FROM _name_class_for(NULL);

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
-- The store copies this into the table op_class_rows when a file is committed (and rebuilds it
-- when the taxonomy changes), because every EP query reads it several times.
CREATE OR REPLACE MACRO _op_classes_for(sid) AS TABLE
SELECT e.source_id, 'trace' AS origin, e.pid, e.tid, e.cat, e.name,
       e.ts_ns, e.dur_ns, e.ts_ns + e.dur_ns AS end_ns,
       CASE WHEN e.coll_name IS NOT NULL THEN 'collective' ELSE c.op_class END AS op_class,
       CASE WHEN e.coll_name IS NOT NULL THEN _coll_kind_of(e.coll_name) ELSE c.coll_kind END AS coll_kind,
       CASE WHEN e.coll_name IS NOT NULL THEN 'args."Collective name"' ELSE c.pattern END AS pattern,
       coalesce(json_extract_string(e.args, '$."Process Group Name"'), json_extract_string(e.args, '$."Process Group Ranks"'), 'default') AS pg,
       TRY_CAST(json_extract_string(e.args, '$.Seq') AS BIGINT) AS seq,
       e.cat IN ('kernel', 'gpu_user_annotation') AS on_device,
       NULL::BIGINT AS tokens
FROM (
    -- parse args only where it can hold a collective name: a JSON parse of every kernel's args
    -- is most of the cost of classifying a large trace
    SELECT *, CASE WHEN cat = 'kernel' AND contains(args, 'Collective name')
                   THEN json_extract_string(args, '$."Collective name"') END AS coll_name
    FROM event_rows
    WHERE ph = 'X' AND dur_ns IS NOT NULL AND ts_ns IS NOT NULL AND (sid IS NULL OR source_id = sid)
) e
LEFT JOIN _name_class_for(sid) c USING (name)
WHERE c.op_class IS NOT NULL OR e.coll_name IS NOT NULL
UNION ALL
SELECT o.source_id, 'ops' AS origin, CAST(o.device_id AS VARCHAR) AS pid,
       o.stream_id AS tid, o.accelerator_core AS cat, o.name, o.ts_ns, o.dur_ns,
       o.ts_ns + o.dur_ns AS end_ns, c.op_class, c.coll_kind, c.pattern,
       coalesce(o.extra->>'$."Group Name"', 'default') AS pg, NULL::BIGINT AS seq,
       TRUE AS on_device, o.gmm_tokens AS tokens
FROM ops o
JOIN _name_class_for(sid) c USING (name)
WHERE o.ts_ns IS NOT NULL AND o.dur_ns IS NOT NULL AND (sid IS NULL OR o.source_id = sid);

CREATE OR REPLACE VIEW _op_classes_live AS SELECT * FROM _op_classes_for(NULL);

-- What queries read: the materialised classification, with run / rank / host from `sources`.
CREATE OR REPLACE VIEW op_classes AS
SELECT s.run, s.rank, s.host, c.*
FROM op_class_rows c JOIN sources s USING (source_id);

-- Tokens each all-to-all delivers to this rank (sum of its output split sizes), from the
-- c10d::alltoall_base_ / record_param_comms CPU ops or a kernel carrying the split sizes.
-- Materialised per file into a2a_split_rows at commit (see schema.sql); sid NULL means all files.
CREATE OR REPLACE MACRO _a2a_splits_for(sid) AS TABLE
-- No filter on recv_tokens here: DuckDB pushes it below the name test and parses the args of
-- every event as JSON (0.5 s per 300 MB rank file); consumers skip the NULLs.
SELECT e.source_id, e.ts_ns,
       CAST(list_sum(coalesce(
           TRY_CAST(json_extract_string(e.args, '$."Out split size"') AS BIGINT[]),
           TRY_CAST(json_extract_string(e.args, '$."Concrete Inputs"[3]') AS BIGINT[]))) AS BIGINT) AS recv_tokens
FROM event_rows e
WHERE e.ph = 'X' AND (sid IS NULL OR e.source_id = sid)
  AND e.name IN ('c10d::alltoall_base_', 'record_param_comms')
UNION ALL
-- a plain substring test before any JSON parse of a kernel's args
SELECT e.source_id, e.ts_ns,
       CAST(list_sum(TRY_CAST(json_extract_string(e.args, '$."Out split size"') AS BIGINT[])) AS BIGINT)
FROM event_rows e
WHERE e.ph = 'X' AND (sid IS NULL OR e.source_id = sid)
  AND e.cat = 'kernel' AND e.name NOT IN ('c10d::alltoall_base_', 'record_param_comms')
  AND contains(e.args, 'Out split size');
