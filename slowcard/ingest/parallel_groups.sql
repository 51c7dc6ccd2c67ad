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

-- A sorted rank list without repeats as ranges: [0, 1, 2, 3, 8] -> '0-3,8' (group ids and the
-- queries' peers). Linear: each rank is compared with its two neighbours, zipped beside it outside
-- any lambda (a macro's argument referenced inside a lambda is evaluated again for every element:
-- quadratic, and a list_filter / list_contains per run start made it cubic, issue 46).
CREATE OR REPLACE MACRO _rank_ranges(l) AS CASE WHEN len(l) = 0 THEN '' ELSE ltrim(array_to_string(list_transform(
    list_zip(l, list_prepend(NULL, l), l[2:]),
    t -> CASE WHEN t[1] IS NULL THEN NULL
              WHEN t[2] IS NULL OR t[2] <> t[1] - 1 THEN ',' || t[1]::VARCHAR  -- a range starts
              WHEN t[3] IS NULL OR t[3] <> t[1] + 1 THEN '-' || t[1]::VARCHAR  -- a range ends
         END), ''), ',') END;

-- A long text cut to n characters, '…' saying so (group labels in messages: a strided group of
-- 512 ranks is 2,000 characters).
CREATE OR REPLACE MACRO _clip(t, n) AS CASE WHEN length(t) > n THEN left(t, n - 1) || '…' ELSE t END;

-- Every group of every input as written, before the checks of parallel_groups:
--   source 'parallel_groups'        a groups file (slowcard ingest --groups FILE): kinds as written
--   source 'ascend_parallel_groups' torch_npu profiler_metadata.json parallel_group_info: kind from group_name
--   source 'communication_group'    msprof-analyze communication_group.json: a record's pg_name names
--                                   the kind; a plain "p2p" rank list is one pipeline stage
--                                   ('stage'), a plain "collective" one is 'other' (unnamed)
--   source 'kineto'                 distributedInfo.pg_config of a Kineto trace: kind from pg_desc
--                                   (torch's group_desc; 'undefined' reads as 'other')
-- written_ranks: the members, sorted, without repeats; NULL when a member is not an integer rank
-- from 0 to 2^31-1 (Kineto's JSON: 0.5, true, 1e20, null; a cast would make them 0, 1, nothing,
-- nothing) and then `problem` says so. Groups files and communication_group.json are checked by
-- their readers (parallel_groups.py, comm_matrix.py).
CREATE OR REPLACE VIEW _parallel_groups_written AS
WITH kineto AS (
    SELECT s.run, s.source_id, pg, CAST(pg -> 'ranks' AS JSON[]) AS members
    FROM scoped_sources s, unnest(CAST(s.metadata -> '$.distributedInfo.pg_config' AS JSON[])) AS t(pg)
    WHERE json_type(s.metadata -> '$.distributedInfo.pg_config') = 'ARRAY' AND json_type(pg -> 'ranks') = 'ARRAY'
),
kineto_checked AS (
    SELECT *, list_bool_and(list_transform(members, x -> coalesce(
                  json_type(x) IN ('UBIGINT', 'BIGINT') AND TRY_CAST(x AS BIGINT) BETWEEN 0 AND 2147483647, false)))
              AS integer_ranks
    FROM kineto
)
SELECT s.run, coalesce(r.kind, _group_kind(r.group_name)) AS kind, r.group_name, r.ranks AS written_ranks,
       s.format AS source, r.source_id, NULL::VARCHAR AS problem
FROM parallel_group_rows r JOIN scoped_sources s USING (source_id)
UNION ALL
SELECT run,
       CASE WHEN pg_name IS NOT NULL THEN _group_kind(pg_name)
            WHEN group_type = 'p2p' THEN 'stage' ELSE 'other' END,
       coalesce(pg_name, group_name), list_sort(list_distinct(ranks)), 'communication_group', source_id, NULL
FROM comm_groups
UNION ALL
SELECT run, _group_kind(coalesce(pg ->> 'pg_desc', '')), pg ->> 'pg_name',
       CASE WHEN integer_ranks THEN list_sort(list_distinct(CAST(members AS INTEGER[]))) END, 'kineto', source_id,
       CASE WHEN NOT integer_ranks
            THEN 'a member is not an integer rank from 0 to 2147483647: ranks ' || left(CAST(pg -> 'ranks' AS VARCHAR), 60) END
FROM kineto_checked;

-- The largest rank of each run, from the inputs that name ranks (files' ranks and world sizes, the
-- step traces' and communication matrices' and summaries' rank columns), never from the groups
-- themselves: a group member past it is a rank the run does not have (a groups file's typo
-- 'tp,4-9999' in an 8-rank run). NULL (no input names a rank): members are not bounded.
CREATE OR REPLACE VIEW _run_max_rank AS
SELECT run, max(r) AS max_rank
FROM (
    SELECT run, greatest(rank, world_size - 1) AS r FROM scoped_sources
    WHERE format NOT IN ('parallel_groups', 'communication_group')
    UNION ALL
    SELECT s.run, t.rank FROM step_trace_rows t JOIN scoped_sources s USING (source_id)
    UNION ALL
    SELECT s.run, greatest(m.src_rank, m.dst_rank) FROM comm_matrix_rows m JOIN scoped_sources s USING (source_id)
    UNION ALL
    SELECT s.run, c.rank FROM comm_summary_rows c JOIN scoped_sources s USING (source_id)
)
WHERE r IS NOT NULL
GROUP BY run;

-- The checks, one row per written group: members past the run's largest rank are left out
-- (kept_ranks), and a group whose kept members overlap another group of the same kind (not
-- 'other': mixed groups overlap by design) is contradicted: which one is right cannot be told, so
-- neither is used. `problem` says why a group is dropped or changed (NULL: used as written).
CREATE OR REPLACE VIEW _parallel_groups_checked AS
WITH bounded AS (
    SELECT w.*, b.max_rank,
           CASE WHEN b.max_rank IS NULL THEN w.written_ranks
                ELSE list_filter(w.written_ranks, x -> x <= b.max_rank) END AS kept_ranks
    FROM _parallel_groups_written w LEFT JOIN _run_max_rank b USING (run)
    WHERE len(w.written_ranks) > 0 OR w.problem IS NOT NULL
),
distinct_groups AS (
    SELECT DISTINCT run, kind, kept_ranks FROM bounded WHERE len(kept_ranks) > 0 AND kind <> 'other'
),
shared AS (  -- ranks in more than one group of a kind
    SELECT run, kind, rank, list(kept_ranks ORDER BY kept_ranks) AS groups
    FROM (SELECT run, kind, kept_ranks, unnest(kept_ranks) AS rank FROM distinct_groups)
    GROUP BY run, kind, rank
    HAVING count(*) > 1
),
contradicted AS (
    SELECT run, kind, kept_ranks, min(rank) AS rank, any_value(groups) AS groups
    FROM (SELECT run, kind, rank, groups, unnest(groups) AS kept_ranks FROM shared)
    GROUP BY run, kind, kept_ranks
)
SELECT b.run, b.kind, b.group_name, b.written_ranks, b.kept_ranks, b.source, b.source_id,
       coalesce(b.problem,
                CASE WHEN c.rank IS NOT NULL
                     THEN format('rank {} is in {} {} groups ({}): contradictory, none of them is used', c.rank,
                                 len(c.groups), b.kind,
                                 _clip(array_to_string(list_transform(c.groups, x -> _rank_ranges(x)), '; '), 80))
                     WHEN len(b.kept_ranks) < len(b.written_ranks)
                     THEN format('ranks {} are not in the run (its largest rank is {}): left out{}',
                                 _clip(_rank_ranges(list_filter(b.written_ranks, x -> x > b.max_rank)), 40), b.max_rank,
                                 CASE WHEN len(b.kept_ranks) = 0 THEN ', no member left' ELSE '' END) END)
           AS problem,
       c.rank IS NULL AND b.problem IS NULL AND len(b.kept_ranks) > 0 AS used
FROM bounded b LEFT JOIN contradicted c USING (run, kind, kept_ranks);

-- The groups dropped or changed by the checks, for the ingest summary (parallel_groups.run_warnings)
-- and for the user: run, source file, the group as written, why.
CREATE OR REPLACE VIEW parallel_group_problems AS
SELECT c.run, s.path, c.source, c.kind,
       _clip(c.kind || ' ' || coalesce(_rank_ranges(c.written_ranks), '?'), 60) AS written_group, c.group_name,
       c.problem
FROM _parallel_groups_checked c JOIN scoped_sources s USING (source_id)
WHERE c.problem IS NOT NULL;

-- Every group of the run that passed the checks, one row per (group, member rank). The same group
-- written by several files (each rank's profiler_metadata / trace lists it) is one group; group_id
-- (kind and rank ranges, 'tp 0-3') is equal for the same member set of one kind whatever file or
-- name it came from. group_ranks / group_size: the members the run has.
CREATE OR REPLACE VIEW parallel_groups AS
WITH groups AS (
    SELECT run, kind, kept_ranks AS group_ranks, group_name, source, min(source_id) AS source_id
    FROM _parallel_groups_checked
    WHERE used
    GROUP BY run, kind, kept_ranks, group_name, source
),
labels AS (  -- the label once per member set, not once per member row
    SELECT run, kind, group_ranks, kind || ' ' || _rank_ranges(group_ranks) AS group_id
    FROM (SELECT DISTINCT run, kind, group_ranks FROM groups)
)
SELECT g.run, g.kind, l.group_id, g.group_name, CAST(unnest(g.group_ranks) AS INTEGER) AS rank, g.group_ranks,
       len(g.group_ranks) AS group_size, g.source, g.source_id
FROM groups g JOIN labels l USING (run, kind, group_ranks);
