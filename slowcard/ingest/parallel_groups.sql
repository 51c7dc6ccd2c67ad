-- Parallel groups (TP / PP / DP / EP / CP, pipeline stages), written by
-- slowcard/ingest/parallel_groups.py (groups files, Ascend profiler_metadata.json) and read from
-- where the other inputs keep them (communication_group.json, Kineto distributedInfo).

-- One row per group of a groups file or of profiler_metadata.json's parallel_group_info.
CREATE TABLE IF NOT EXISTS parallel_group_rows (
    source_id  INTEGER,
    group_idx  INTEGER,    -- position in its file
    kind       VARCHAR,    -- as a groups file says it; NULL: named from group_name by _group_kind
    group_name VARCHAR,    -- the name as written (profiler_metadata: tp, dp, pp, exp, tp_dp …)
    ranks      INTEGER[]   -- global ranks, sorted, no duplicates
);

-- The parallel dimension a group's name stands for. Names of one dimension only: Megatron's
-- (TENSOR_MODEL_PARALLEL_GROUP …), torch_npu's (tp, dp, pp, exp, cp), vLLM's and the short
-- forms. A name of mixed dimensions (tp_dp, mp, dp_cp, dp_modulo_exp, embd) is 'other': its
-- members do different work. default_pg / default_group / world: 'world'.
CREATE OR REPLACE MACRO _group_kind(name) AS CASE
    WHEN regexp_full_match(lower(trim(name)), '(tp|tensor(_model)?(_parallel)?)(_group)?') THEN 'tp'
    WHEN regexp_full_match(lower(trim(name)), '(pp|pipeline(_model)?(_parallel)?)(_group|_new_stream)?') THEN 'pp'
    WHEN regexp_full_match(lower(trim(name)), '(dp|data(_parallel)?)(_group)?') THEN 'dp'
    WHEN regexp_full_match(lower(trim(name)), '(ep|exp|expert(_model)?(_parallel)?)(_group)?') THEN 'ep'
    WHEN regexp_full_match(lower(trim(name)), '(cp|context(_parallel)?)(_group)?') THEN 'cp'
    WHEN regexp_full_match(lower(trim(name)), 'default_pg|default_group|world|global') THEN 'world'
    ELSE 'other' END;

-- A sorted rank list as ranges: [0, 1, 2, 3, 8] -> '0-3,8' (group ids and the queries' peers).
CREATE OR REPLACE MACRO _rank_ranges(l) AS array_to_string(list_transform(
    list_filter(l, x -> NOT list_contains(l, x - 1)),
    s -> s::VARCHAR || coalesce('-' || nullif(list_min(list_filter(l, e -> e >= s AND NOT list_contains(l, e + 1))), s)::VARCHAR, '')), ',');

-- Every group of the run, one row per (group, member rank), from every input that carries them:
--   source 'parallel_groups'        a groups file (slowcard ingest --groups FILE): kinds as written
--   source 'ascend_parallel_groups' torch_npu profiler_metadata.json parallel_group_info: kind from group_name
--   source 'communication_group'    msprof-analyze communication_group.json: a record's pg_name names
--                                   the kind; a plain "p2p" rank list is one pipeline stage
--                                   ('stage'), a plain "collective" one is 'other' (unnamed)
--   source 'kineto'                 distributedInfo.pg_config of a Kineto trace: kind from pg_desc
--                                   (torch's group_desc; 'undefined' reads as 'other')
-- The same group written by several files (each rank's profiler_metadata / trace lists it) is one
-- group; group_id (kind and rank ranges, 'tp 0-3') is equal for the same member set of one kind whatever
-- file or name it came from.
CREATE OR REPLACE VIEW parallel_groups AS
WITH kineto AS (
    SELECT s.run, s.source_id, pg
    FROM scoped_sources s, unnest(CAST(s.metadata -> '$.distributedInfo.pg_config' AS JSON[])) AS t(pg)
    WHERE json_type(s.metadata -> '$.distributedInfo.pg_config') = 'ARRAY'
),
g AS (
    SELECT s.run, coalesce(r.kind, _group_kind(r.group_name)) AS kind, r.group_name, r.ranks AS group_ranks,
           s.format AS source, r.source_id
    FROM parallel_group_rows r JOIN scoped_sources s USING (source_id)
    UNION ALL
    SELECT run,
           CASE WHEN pg_name IS NOT NULL THEN _group_kind(pg_name)
                WHEN group_type = 'p2p' THEN 'stage' ELSE 'other' END,
           coalesce(pg_name, group_name), list_sort(list_distinct(ranks)), 'communication_group', source_id
    FROM comm_groups
    UNION ALL
    SELECT run, _group_kind(coalesce(pg ->> 'pg_desc', '')), pg ->> 'pg_name',
           list_sort(list_distinct(TRY_CAST(pg -> 'ranks' AS INTEGER[]))), 'kineto', source_id
    FROM kineto
    WHERE json_type(pg -> 'ranks') = 'ARRAY'
),
groups AS (
    SELECT run, kind, group_ranks, group_name, source, min(source_id) AS source_id
    FROM g
    WHERE len(group_ranks) > 0 AND list_min(group_ranks) >= 0
    GROUP BY run, kind, group_ranks, group_name, source
)
SELECT run, kind, kind || ' ' || _rank_ranges(group_ranks) AS group_id, group_name,
       CAST(unnest(group_ranks) AS INTEGER) AS rank, group_ranks, len(group_ranks) AS group_size, source, source_id
FROM groups;
