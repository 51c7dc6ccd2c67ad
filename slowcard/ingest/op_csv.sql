-- Ascend operator tables: torch_npu kernel_details.csv and msprof op_summary_*.csv.
-- One row per device task (kernel, HCCL/communication task, AI CPU op ...).
-- Columns are mapped by header NAME (Block Dim vs Block Num, optional Step Id / Device_id,
-- Level0 reduced headers, op_summary's Op Name / Task Start Time(us) ...); every other column is
-- kept in `extra`, keyed by its header name, values as text. Times are exact integer ns: the
-- files hold epoch microseconds with 3 decimals (~1.7e15 us), parsed as DECIMAL, never DOUBLE.
CREATE TABLE IF NOT EXISTS op_rows (
    source_id        INTEGER,
    line_no          BIGINT,    -- 1-based line of the row in the file (the header is line 1)
    step_id          INTEGER,   -- `Step Id` (only when the profiler ran with a schedule)
    device_id        INTEGER,   -- `Device_id` (absent in older files)
    model_id         BIGINT,    -- `Model ID` (4294967295 = no model)
    task_id          VARCHAR,   -- N/A for communication tasks, so text
    stream_id        VARCHAR,
    name             VARCHAR,   -- `Name` / `Op Name`, e.g. aclnnGroupedMatmulV4_GroupedMatmul_GroupedMatmul
    op_type          VARCHAR,   -- `Type` / `OP Type`
    op_state         VARCHAR,   -- `OP State` (dynamic / static)
    accelerator_core VARCHAR,   -- `Accelerator Core` / `Task Type`: AI_CORE, AI_VECTOR_CORE, MIX_AIC, HCCL, COMMUNICATION ...
    ts_ns            BIGINT,    -- `Start Time(us)` * 1000, absolute epoch ns
    dur_ns           BIGINT,    -- `Duration(us)` * 1000
    wait_ns          BIGINT,    -- `Wait Time(us)` * 1000: gap since the previous task ended on the device
    block_num        INTEGER,   -- `Block Num` (older: `Block Dim`)
    mix_block_num    INTEGER,   -- `Mix Block Num` (older: `Mix Block Dim`)
    input_shapes     VARCHAR,   -- "81920,4096;8192,512": `;` between tensors, `,` between dims (outer quotes removed)
    input_dtypes     VARCHAR,
    input_formats    VARCHAR,
    output_shapes    VARCHAR,
    output_dtypes    VARCHAR,
    output_formats   VARCHAR,
    extra            JSON       -- every other column {header name: text}; PMU columns vary with aic_metrics
);
-- op_rows and the Parquet files of the Dask path (slowcard/lake.py); every reader reads this.
CREATE OR REPLACE VIEW op_rows_all AS SELECT * FROM op_rows;

-- The view users and queries read: run and rank come from `sources`.
-- gmm_tokens: tokens one GroupedMatmul call processed, by msprof-analyze's ep_load_balance rule
-- (recipes/ep_load_balance: strip the quotes, split Input Shapes on `;`, drop empty parts, keep
-- all but the last two, sum their FIRST dims; NULL when fewer than two parts or a dim is not an
-- integer). The rule counts the leading dim of every input but the last two, so it is exact for
-- the x-list layouts msprof-analyze targets and a consistent proxy otherwise: compare it across
-- ranks, do not read it as an absolute token count. Matched on the op type `GroupedMatmul` or a
-- name with a `GroupedMatmul` segment (aclnnGroupedMatmulV4_GroupedMatmul_GroupedMatmul); the
-- fused GroupedMatmulSwiglu* ops are NOT matched: their inputs (x, weight, scales, group_list)
-- would make the rule add expert counts to tokens.
CREATE OR REPLACE VIEW ops AS
SELECT s.run, s.rank, o.* EXCLUDE (gmm_parts),
       o.ts_ns / 1000.0 AS ts_us,
       o.dur_ns / 1000.0 AS dur_us,
       o.wait_ns / 1000.0 AS wait_us,
       (o.ts_ns + o.dur_ns) AS end_ns,
       CASE
           WHEN o.gmm_parts IS NULL OR len(o.gmm_parts) < 2 THEN NULL
           WHEN list_count(list_transform(list_slice(o.gmm_parts, 1, len(o.gmm_parts) - 2),
                                          lambda p: TRY_CAST(trim(split_part(p, ',', 1)) AS BIGINT)))
                <> len(o.gmm_parts) - 2 THEN NULL
           ELSE coalesce(list_sum(list_transform(list_slice(o.gmm_parts, 1, len(o.gmm_parts) - 2),
                                                 lambda p: TRY_CAST(trim(split_part(p, ',', 1)) AS BIGINT))), 0)
       END::BIGINT AS gmm_tokens
FROM (
    SELECT r.*,
           CASE WHEN lower(r.op_type) = 'groupedmatmul'
                     OR regexp_matches(r.name, '(^|_)groupedmatmul(_|$)', 'i')
                THEN list_filter(string_split(trim(r.input_shapes, '"'), ';'), lambda p: trim(p) <> '')
           END AS gmm_parts
    FROM op_rows_all r
) o
JOIN scoped_sources s USING (source_id);
