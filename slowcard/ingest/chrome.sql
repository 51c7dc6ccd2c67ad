-- Chrome-trace events (Kineto object form, Ascend trace_view.json, msServiceProfiler
-- chrome_tracing.json). One row per event, every phase kept (X, B/E, i/I, C, s/t/f, M).
-- ts_ns is exact: absolute nanoseconds = baseTimeNanoseconds (when the file has it) + ts µs * 1000,
-- parsed as DECIMAL so that epoch-scale microseconds (~1.7e15) keep their nanoseconds.
-- args is kept whole as JSON: real traces have both args.bytes and args.Bytes.
CREATE TABLE IF NOT EXISTS event_rows (
    source_id INTEGER,
    ph        VARCHAR,
    cat       VARCHAR,
    name      VARCHAR,
    pid       VARCHAR,   -- int or string in the wild ("Spans", "Schedule(1234)")
    tid       VARCHAR,
    ts_ns     BIGINT,    -- NULL for events without ts (most M metadata)
    dur_ns    BIGINT,    -- NULL unless the event has dur (X events)
    id        VARCHAR,   -- flow / async id
    args      JSON
);
-- event_rows and the Parquet files of the Dask path (slowcard/lake.py); every reader reads this.
CREATE OR REPLACE VIEW event_rows_all AS SELECT * FROM event_rows;

-- The view users and queries read: run and rank come from `sources`.
CREATE OR REPLACE VIEW events AS
SELECT s.run, s.rank, e.source_id, e.ph, e.cat, e.name, e.pid, e.tid,
       e.ts_ns, e.dur_ns, e.ts_ns + coalesce(e.dur_ns, 0) AS end_ns,
       e.ts_ns / 1000.0 AS ts_us, e.dur_ns / 1000.0 AS dur_us,
       e.id, e.args
FROM event_rows_all e JOIN scoped_sources s USING (source_id);
