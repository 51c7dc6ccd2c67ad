"""msServiceProfiler service CSVs: batch.csv, request.csv, kvcache.csv (both shapes), forward.csv.

Files are recognised by their header line, never by name (``sniff`` returns ``service_batch``,
``service_request``, ``service_kvcache`` or ``service_forward``). Columns are mapped by header
name, never by position: batch.csv's KV-cache and speculative-decoding groups come and go.

DuckDB's CSV reader does the bulk work: every column is read as text and converted in SQL, rows
the CSV reader cannot split are kept aside by DuckDB (``store_rejects``) with their line number,
and the rest still loads. batch.csv's ``res_list`` is a Python literal (single quotes), not JSON.
A cell without double quotes or backslashes translates exactly into JSON by swapping ``'`` for
``"``, so DuckDB parses and unnests almost every cell itself; the few other cells (strings with
quotes, ``None``, malformed text) are parsed in Python with ``ast.literal_eval`` (never ``eval``),
in batches handed to DuckDB as Arrow tables. A cell that does not parse keeps its batch row
(``res_list_items`` NULL) and is reported with its line and reason.

Times: batch.csv's ``start_time(ms)`` holds microseconds in current profilers despite its
name; the unit of every numeric time column is decided per file by magnitude (epoch seconds,
ms, µs or ns) and reported in ``Outcome.metadata``. Datetime strings
(``YYYY-MM-DD HH:MM:SS:ffffff``, Asia/Shanghai) are used when no numeric time exists.

Owns the tables in ``service_csv.sql``; never touches another format's tables.
"""

from __future__ import annotations

import ast
import csv
import io
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
else:
    from .._lazy import LazyModule

    pa = LazyModule("pyarrow")  # imported on first use (issue 17)

from ..errors import InputError
from ..store import one_row, scalar
from .base import Context, Outcome, is_gzip, open_bytes, strip_bom

BATCHING_NAMES = ("batchFrameworkProcessing", "BatchSchedule")
SHANGHAI_OFFSET_NS = 8 * 3600 * 1_000_000_000  # UTC+8 all year (no DST since 1991)
SAMPLE_ROWS = 200  # rows read in Python to decide time units
FALLBACK_BATCH = 20_000  # res_list cells parsed in Python per Arrow batch
MAX_LINE_BYTES = 16 << 20  # longest CSV line (a res_list of a huge batch)
# DuckDB's CSV buffer defaults to 16 x max_line_size: one 256 MB block per file, even for a file of
# 88 KB, taken from the database's memory limit (512 MB while ingesting): two CSV files at once
# (--jobs 2) failed with "could not allocate block of size 256.0 MiB". Two lines' worth is enough.
CSV_BUFFER_BYTES = 2 * MAX_LINE_BYTES

_DATETIME_FORMATS = "['%Y-%m-%d %H:%M:%S:%f', '%Y-%m-%d %H:%M:%S.%f', '%Y-%m-%d %H:%M:%S']"
# epoch magnitude -> ns per unit: ~1.7e9 s, ~1.7e12 ms, ~1.7e15 µs, ~1.7e18 ns
_UNITS = ((1e17, "ns", 1), (1e14, "us", 1_000), (1e11, "ms", 1_000_000), (1e8, "s", 1_000_000_000))

_ITEM_SCHEMA = (
    '[{"rid": "VARCHAR", "iter": "BIGINT", "type": "INTEGER", '
    '"num_scheduled_tokens": "BIGINT", "num_prompt_tokens": "BIGINT", '
    '"num_computed_tokens": "BIGINT"}]'
)
_ITEM_FIELDS = ("iter", "type", "num_scheduled_tokens", "num_prompt_tokens", "num_computed_tokens")


def _header_of(head: bytes) -> list[str] | None:
    """The header cells of a CSV head, or None when the head does not look like a CSV."""
    text = strip_bom(head).decode("utf-8", errors="replace")
    line = text.split("\n", 1)[0].rstrip("\r")
    if not line or line.lstrip().startswith(("{", "[")) or "," not in line:
        return None
    try:
        return [c.strip() for c in next(csv.reader([line]))]
    except (csv.Error, StopIteration):
        return None


def classify_header(cols: list[str]) -> str | None:
    """Which service CSV a header belongs to (loose: a missing column is reported at ingest)."""
    s = set(cols)
    if "res_list" in s or {"batch_type", "prefill_scheduled_tokens"} <= s:
        return "service_batch"
    if "http_rid" in s:
        return "service_request"
    if "forward_iter" in s:
        return "service_forward"
    if "start_time" in s and ("kvcache_usage_rate" in s or "device_kvcache_left" in s):
        return "service_kvcache"
    return None


def epoch_unit(values: list[float]) -> tuple[str, int] | None:
    """(unit, ns per unit) of epoch timestamps by their magnitude; None for relative times."""
    vals = [abs(v) for v in values if v == v and v != 0]
    if not vals:
        return None
    m = statistics.median(vals)
    for floor, unit, factor in _UNITS:
        if m >= floor:
            return unit, factor
    return None


class ResListError(ValueError):
    """A res_list cell that is not a Python-literal list of request dicts."""


def parse_res_list(text: str) -> list[tuple]:
    """Parse one res_list cell safely into (rid, iter, type, scheduled, prompt, computed) tuples.

    Raises:
        ResListError: with the reason (syntax error, not a list, an item without 'rid', ...).
    """
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        reason = type(exc).__name__ if not str(exc) else str(exc).splitlines()[0]
        # "malformed node or string on line 1: <ast.BinOp object at 0x7f…>": no address in a message
        reason = re.sub(r"<ast\.(\w+) object at 0x[0-9a-fA-F]+>", r"a \1 expression", reason)
        raise ResListError(f"not a Python literal ({reason})") from None
    if not isinstance(value, (list, tuple)):
        raise ResListError(f"expected a list of request dicts, got {type(value).__name__}")
    out = []
    for k, item in enumerate(value, 1):
        if not isinstance(item, dict):
            raise ResListError(f"item {k} is a {type(item).__name__}, expected a dict")
        if item.get("rid") is None:
            raise ResListError(f"item {k} has no 'rid'")
        nums = []
        for key in _ITEM_FIELDS:
            v = item.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                v = None
            nums.append(int(v) if v is not None and abs(v) < 2**63 else None)
        out.append((str(item["rid"]), *nums))
    return out


class _Csv:
    """One CSV file read by DuckDB with every column as text (c0, c1, ... by header position)."""

    def __init__(self, ctx: Context, kind: str):
        self.ctx = ctx
        self.path = ctx.path
        self.kind = kind
        self.header = self._read_header()
        self.index = {name: i for i, name in reversed(list(enumerate(self.header)))}
        sid = ctx.source_id
        self.rej_table, self.rej_scan = f"_svc_rej_{sid}", f"_svc_rejscan_{sid}"
        self.rejected: list[tuple[int, str, str]] = []  # (line, error type, message)

    def _read_header(self) -> list[str]:
        with open_bytes(self.path) as f:
            head = f.read(1 << 20)
        cols = _header_of(head)
        if not cols:
            raise InputError(
                self.path, f"expected a {self.kind} header line (comma-separated column names)", position="line 1"
            )
        return cols

    def has(self, col: str) -> bool:
        return col in self.index

    def ref(self, col: str) -> str:
        """SQL for a column's text (NULL when the file lacks it)."""
        return f'"c{self.index[col]}"' if col in self.index else "CAST(NULL AS VARCHAR)"

    def require(self, *cols: str, any_of: tuple[str, ...] = ()) -> None:
        for col in cols:
            if col not in self.index:
                raise InputError(
                    self.path,
                    f"{self.kind} has no '{col}' column (header: {','.join(self.header)})",
                    position="line 1",
                    hint="this column is required; re-export with msserviceprofiler parse or fix the header",
                )
        if any_of and not any(c in self.index for c in any_of):
            raise InputError(
                self.path,
                f"{self.kind} needs one of the columns {', '.join(any_of)}",
                position="line 1",
                hint="re-export with msserviceprofiler parse",
            )

    def scan(self, store_rejects: bool) -> str:
        """A FROM-clause item reading the file. ``CREATE TABLE AS`` over it keeps the file order
        (preserve_insertion_order) while parsing in parallel, so the staged table's rowid + 1 is
        the data row number; a window such as row_number() OVER () would force one thread."""
        cols = ", ".join(f"'c{i}': 'VARCHAR'" for i in range(len(self.header)))
        comp = "gzip" if is_gzip(self.path) else "none"
        rej = (
            f"store_rejects = true, rejects_table = '{self.rej_table}', rejects_scan = '{self.rej_scan}'"
            if store_rejects
            else "ignore_errors = true"
        )
        path = self.ctx.db_path.replace("'", "''")
        return (
            f"read_csv('{path}', header = true, "
            f"auto_detect = false, columns = {{{cols}}}, delim = ',', quote = '\"', escape = '\"', "
            f"compression = '{comp}', max_line_size = {MAX_LINE_BYTES}, buffer_size = {CSV_BUFFER_BYTES}, {rej})"
        )

    def numbered(self, table: str) -> str:
        """A FROM-clause item over a staged table: its rows with ``line_no`` (file line)."""
        return f"(SELECT {self.line_expr()} AS line_no, * FROM (SELECT rowid + 1 AS rn, * FROM {table}))"

    def collect_rejects(self) -> None:
        con = self.ctx.con
        try:
            self.rejected = con.execute(
                f"SELECT line, min(error_type), min(error_message) FROM {self.rej_table} GROUP BY line ORDER BY line"
            ).fetchall()
        finally:
            self.drop_temp()
        if self.rejected:
            # line -> (kept rows before it) lets the line numbers of kept rows skip rejected lines
            con.execute(f"CREATE OR REPLACE TEMP TABLE {self.rej_table}_map (kb BIGINT, k BIGINT)")
            con.executemany(
                f"INSERT INTO {self.rej_table}_map VALUES (?, ?)",
                [(line - 1 - j, j) for j, (line, _, _) in enumerate(self.rejected, 1)],
            )

    def line_expr(self) -> str:
        """SQL for the 1-based file line of a kept row (header = line 1)."""
        if not self.rejected:
            return "(rn + 1)"
        return f"(rn + 1 + coalesce((SELECT max(m.k) FROM {self.rej_table}_map m WHERE m.kb < rn), 0))"

    def drop_temp(self) -> None:
        for t in (self.rej_table, self.rej_scan):
            self.ctx.con.execute(f"DROP TABLE IF EXISTS {t}")

    def cleanup(self, staged: str | None = None) -> None:
        """Drop the reader's temp tables, and the view ``staged`` over ``{staged}_t`` if given."""
        if staged:
            self.ctx.con.execute(f"DROP VIEW IF EXISTS {staged}")
            self.ctx.con.execute(f"DROP TABLE IF EXISTS {staged}_t")
        self.drop_temp()
        self.ctx.con.execute(f"DROP TABLE IF EXISTS {self.rej_table}_map")

    def reject_drops(self) -> list[tuple[str, str, int]]:
        by_type: dict[str, list] = {}
        for line, etype, msg in self.rejected:
            by_type.setdefault(etype, []).append((line, msg))
        return [
            (f"CSV row rejected ({etype}: {items[0][1]})", _positions([l for l, _ in items]), len(items))
            for etype, items in by_type.items()
        ]

    def sample(self, cols: list[str], n: int = SAMPLE_ROWS) -> dict[str, list[str]]:
        """The first n non-empty values of some columns, read in Python (cheap: n rows)."""
        idx = {c: self.index[c] for c in cols if c in self.index}
        out: dict[str, list[str]] = {c: [] for c in idx}
        if not idx:
            return out
        old_limit = csv.field_size_limit(MAX_LINE_BYTES)  # process-wide: restored below
        try:
            with open_bytes(self.path) as raw:
                text = io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace", newline="")
                reader = csv.reader(text)
                next(reader, None)
                for k, row in enumerate(reader):
                    if k >= n:
                        break
                    for c, i in idx.items():
                        if i < len(row) and row[i].strip():
                            out[c].append(row[i].strip())
        except csv.Error:
            pass  # a malformed early row: decide from what was read (DuckDB reports the row)
        finally:
            csv.field_size_limit(old_limit)
        return out


def _positions(lines: list[int], show: int = 5) -> str:
    head = ", ".join(str(x) for x in lines[:show])
    more = f", … ({len(lines)} lines)" if len(lines) > show else ""
    return f"line {head}{more}" if len(lines) == 1 else f"lines {head}{more}"


# DuckDB's casts to numbers accept surrounding spaces, TABs and CRs, so no trim() is needed
# (a trim allocates a new string per value and costs ~20x the cast).
def _num(ref: str) -> str:
    return f"TRY_CAST({ref} AS DOUBLE)"


def _int(ref: str) -> str:
    return f"TRY_CAST(round(TRY_CAST({ref} AS DOUBLE)) AS BIGINT)"  # '4.0' -> 4; NaN / inf -> NULL


def _text(ref: str) -> str:
    return f"nullif({ref}, '')"


def _dp(ref: str) -> str:
    """dp_rank: empty, <NA>, NaN or non-numeric -> NULL; '1.0' (a float column) -> 1."""
    return f"TRY_CAST(round(TRY_CAST({ref} AS DOUBLE)) AS INTEGER)"


def _epoch_ns(ref: str, factor: int) -> str:
    """Epoch ns from a number in a unit of ``factor`` ns, without the rounding of ``value * factor``
    in DOUBLE (at 1.7e18 a DOUBLE has 256 ns steps):
    - µs (what batch.csv holds): integer and fractional parts of the DOUBLE are scaled apart,
      which is exact for every value below 2**53 µs (the year 2255);
    - ms and s: rounded to the µs first (the writers compute them from integer µs);
    - ns: read as an integer."""
    d = f"TRY_CAST({ref} AS DOUBLE)"
    if factor == 1:
        return f"coalesce(TRY_CAST({ref} AS BIGINT), TRY_CAST(round({d}) AS BIGINT))"
    if factor == 1_000:
        return (
            f"CASE WHEN abs({d}) < 9007199254740992 THEN CAST(floor({d}) AS BIGINT) * 1000 "
            f"+ CAST(round(({d} - floor({d})) * 1000) AS BIGINT) END"
        )
    return f"TRY_CAST(round({d} * {factor // 1000}) AS BIGINT) * 1000"


def _datetime_ns(ref: str) -> str:
    # coalesce evaluates its second argument only for the rows the first left NULL
    return (
        f"(epoch_ns(coalesce(try_strptime({ref}, {_DATETIME_FORMATS}), "
        f"try_strptime(trim({ref}, ' \t\r'), {_DATETIME_FORMATS}))) "
        f"- CAST({SHANGHAI_OFFSET_NS} AS BIGINT))"
    )


class _Times:
    """Decides the unit of a file's numeric time columns and builds their SQL."""

    def __init__(self, f: _Csv, numeric: list[str], datetimes: list[str]):
        self.f = f
        self.units: dict[str, tuple[str, int] | None] = {}
        sample = f.sample(numeric + datetimes)
        for col in numeric:
            vals = []
            for v in sample.get(col, []):
                try:
                    vals.append(float(v))
                except ValueError:
                    pass
            self.units[col] = epoch_unit(vals)
        self.sample = sample

    def ns(self, numeric: str, datetime: str | None) -> str:
        parts = []
        unit = self.units.get(numeric)
        if unit and self.f.has(numeric):
            parts.append(_epoch_ns(self.f.ref(numeric), unit[1]))
        if datetime and self.f.has(datetime):
            parts.append(_datetime_ns(self.f.ref(datetime)))
        return f"coalesce({', '.join(parts)})" if len(parts) > 1 else (parts[0] if parts else "CAST(NULL AS BIGINT)")

    def metadata(self) -> dict:
        meta = {}
        for col, unit in self.units.items():
            if not self.f.has(col):
                continue
            meta[f"{col} unit"] = unit[0] if unit else "not epoch (relative or empty): datetime columns used instead"
        return meta

    def cross_check(self, numeric: str, datetime: str) -> str | None:
        """How far the numeric time of the first row is from its datetime string (sanity)."""
        unit = self.units.get(numeric)
        nums, dts = self.sample.get(numeric, []), self.sample.get(datetime, [])
        if not unit or not nums or not dts:
            return None
        row = self.f.ctx.con.execute(
            f"SELECT {_epoch_ns('$n', unit[1])} - {_datetime_ns('$d')}", {"n": nums[0], "d": dts[0]}
        ).fetchone()
        if row is None or row[0] is None:
            return None
        return f"{row[0] / 1e9:+.3f} s"


class ServiceCsvReader:
    """Reader for the msServiceProfiler CSV family."""

    name = "service_csv"

    def sniff(self, path: Path, head: bytes) -> str | None:
        cols = _header_of(head)
        return classify_header(cols) if cols else None

    def ingest(self, ctx: Context) -> Outcome:
        fn = {
            "service_batch": _ingest_batch,
            "service_request": _ingest_request,
            "service_kvcache": _ingest_kvcache,
            "service_forward": _ingest_forward,
        }.get(ctx.format)
        if fn is None:
            raise InputError(ctx.path, f"unknown service CSV kind {ctx.format!r}")
        return fn(ctx)


READER = ServiceCsvReader()


def _finish(
    f: _Csv,
    kept: int,
    row_drops: list[tuple[str, str, int]],
    meta: dict,
    cell_drops: Sequence[tuple[str, str, int]] = (),
    note: str = "",
) -> Outcome:
    """Outcome with rows_seen = kept + rows dropped (CSV rejects + row-level drops)."""
    drops = f.reject_drops() + list(row_drops)
    dropped = sum(n for _, _, n in drops)
    msgs = []
    if dropped:
        msgs.append(f"{dropped} row(s) dropped: " + "; ".join(f"{r} at {p}" for r, p, _ in drops[:3]))
    if cell_drops:
        n = sum(c for _, _, c in cell_drops)
        msgs.append(
            f"{n} res_list cell(s) did not parse (their batch rows are kept without "
            "per-request rows): " + "; ".join(f"{r} at {p}" for r, p, _ in cell_drops[:3])
        )
    if note:
        msgs.append(note)
    status = "salvaged" if (dropped or cell_drops) else "ok"
    return Outcome(
        rows_seen=kept + dropped,
        rows_kept=kept,
        rows_dropped=dropped,
        status=status,
        message="; ".join(msgs),
        drops=drops,
        cell_drops=list(cell_drops),
        metadata=meta,
    )


def _row_drops(con, sql: str) -> list[tuple[str, str, int]]:
    """(reason, positions, n) from a query returning (reason, list of lines, n)."""
    return [(reason, _positions(sorted(lines)), n) for reason, lines, n in con.execute(sql).fetchall()]


def _drop_reasons_sql(f: _Csv, checks: list[tuple[str, str]], src: str) -> str:
    """Rows failing a check, grouped by the first failing reason (with up to 5 example lines)."""
    case = " ".join(f"WHEN NOT coalesce({cond}, false) THEN '{reason}'" for cond, reason in checks)
    return (
        f"SELECT reason, list(line_no ORDER BY line_no)[1:5], count(*) FROM ("
        f"SELECT CASE {case} END AS reason, line_no FROM {src}) WHERE reason IS NOT NULL "
        "GROUP BY reason ORDER BY min(line_no)"
    )


# ----------------------------------------------------------------------------- batch.csv


def _ingest_batch(ctx: Context) -> Outcome:
    f = _Csv(ctx, "batch.csv")
    f.require("name", "res_list", "during_time(ms)", any_of=("start_time(ms)", "start_datetime"))
    times = _Times(f, ["start_time(ms)", "end_time(ms)"], ["start_datetime", "end_datetime"])
    con, sid = ctx.con, ctx.source_id
    stage = f"_svc_stage_{sid}"
    r = f.ref
    rl = r("res_list")
    # A Python-literal cell without '"' or '\' is exact JSON once ' becomes " (module docstring);
    # try() turns a cell that still is not a JSON list into NULL, which sends it to Python.
    items = (
        f"CASE WHEN NOT contains({rl}, '\"') AND NOT contains({rl}, '\\') "
        f"THEN try(from_json(replace({rl}, '''', '\"'), '{_ITEM_SCHEMA}')) END"
    )
    try:
        # one pass over the CSV: typed columns + the parsed res_list (the file is never re-read)
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE {stage} AS
            SELECT * EXCLUDE (rl), CASE WHEN rl_state = 'python' THEN rl END AS rl_raw FROM (
              SELECT *, CASE WHEN rl IS NULL OR (strlen(rl) < 16 AND trim(rl) = '') THEN 'empty'
                             -- the profiler's missing-value markers: the batch's requests are unknown
                             -- (res_list_items NULL), which is neither an empty batch nor a bad cell
                             WHEN strlen(rl) < 16 AND trim(rl) IN ('N/A', '<NA>') THEN 'missing'
                             WHEN items IS NOT NULL THEN 'json' ELSE 'python' END AS rl_state
              FROM (
                SELECT {_text(r("name"))} AS name,
                       {times.ns("start_time(ms)", "start_datetime")} AS start_ns,
                       {times.ns("end_time(ms)", "end_datetime")} AS end_ns,
                       {_num(r("during_time(ms)"))} AS during_ms, {_text(r("batch_type"))} AS batch_type,
                       {_text(r("prof_id"))} AS prof_id, {_num(r("batch_size"))} AS batch_size,
                       {_int(r("total_blocks"))} AS total_blocks, {_int(r("used_blocks"))} AS used_blocks,
                       {_int(r("free_blocks"))} AS free_blocks, {_int(r("blocks_allocated"))} AS blocks_allocated,
                       {_int(r("blocks_freed"))} AS blocks_freed,
                       {_num(r("kvcache_usage_rate"))} AS kvcache_usage_rate,
                       {_int(r("prefill_batch_size"))} AS prefill_batch_size,
                       {_int(r("decode_batch_size"))} AS decode_batch_size,
                       {_int(r("prefill_scheduled_tokens"))} AS prefill_scheduled_tokens,
                       {_int(r("decode_scheduled_tokens"))} AS decode_scheduled_tokens,
                       {_int(r("total_scheduled_tokens"))} AS total_scheduled_tokens,
                       {_dp(r("dp_rank"))} AS dp_rank, {_num(r("accepted_ratio"))} AS accepted_ratio,
                       {_text(r("accepted_ratio_per_pos"))} AS accepted_ratio_per_pos,
                       {rl} AS rl, {items} AS items
                FROM {f.scan(store_rejects=True)}))""")
        f.collect_rejects()
        con.execute(f"CREATE OR REPLACE TEMP VIEW {stage}_v AS SELECT * FROM {f.numbered(stage)}")
        ok = "name IS NOT NULL AND start_ns IS NOT NULL"
        con.execute(f"""
            INSERT INTO batch_rows
            SELECT {sid}, line_no, name,
                   CASE WHEN name IN {BATCHING_NAMES!r} THEN 'batching' ELSE 'execution' END,
                   start_ns, coalesce(end_ns, start_ns + CAST(round(during_ms * 1e6) AS BIGINT)),
                   during_ms, batch_type, prof_id, batch_size, total_blocks, used_blocks, free_blocks,
                   blocks_allocated, blocks_freed, kvcache_usage_rate, prefill_batch_size,
                   decode_batch_size, prefill_scheduled_tokens, decode_scheduled_tokens,
                   total_scheduled_tokens, dp_rank, accepted_ratio, accepted_ratio_per_pos,
                   CASE rl_state WHEN 'empty' THEN 0 WHEN 'json' THEN len(items) END
            FROM {stage}_v WHERE {ok}""")
        kept = scalar(con, f"SELECT count(*) FROM batch_rows WHERE source_id = {sid}")
        row_drops = _row_drops(
            con,
            _drop_reasons_sql(
                f,
                [
                    ("name IS NOT NULL", "empty name"),
                    (
                        "start_ns IS NOT NULL",
                        "no usable start time (start_time(ms) and start_datetime empty or unparseable)",
                    ),
                ],
                f"{stage}_v",
            ),
        )
        # one row per (batch row, request); items without a rid are re-checked in Python below
        con.execute(f"""
            INSERT INTO batch_request_rows
            SELECT {sid}, line_no, CAST(idx AS INTEGER), item.rid, item.iter, item.type,
                   item.num_scheduled_tokens, item.num_prompt_tokens, item.num_computed_tokens
            FROM (SELECT line_no, generate_subscripts(items, 1) AS idx, unnest(items) AS item
                  FROM {stage}_v WHERE {ok} AND rl_state = 'json')""")
        cell_drops = _python_res_lists(con, sid, stage)
        con.execute(f"""
            INSERT INTO request_schedule_rows
            SELECT {sid}, r.rid, b.prof_id, min(b.dp_rank), min(b.dp_rank) <> max(b.dp_rank),
                   min(b.start_ns), max(b.start_ns), count(*), max(r.num_prompt_tokens),
                   count(*) FILTER (WHERE coalesce(r.req_type = 1, r.iter > 0))
            FROM batch_request_rows r JOIN batch_rows b USING (source_id, line_no)
            WHERE r.source_id = {sid} AND b.phase = 'batching'
            GROUP BY r.rid, b.prof_id""")
    finally:
        con.execute(f"DROP VIEW IF EXISTS {stage}_v")
        con.execute(f"DROP TABLE IF EXISTS {stage}")
        f.cleanup()
    meta = times.metadata()
    check = times.cross_check("start_time(ms)", "start_datetime")
    if check:
        meta["start_time(ms) minus start_datetime (Asia/Shanghai), first row"] = check
    missing = [
        c
        for c in (
            "dp_rank",
            "total_scheduled_tokens",
            "prefill_scheduled_tokens",
            "decode_scheduled_tokens",
            "batch_type",
            "prof_id",
        )
        if not f.has(c)
    ]
    if missing:
        meta["missing columns"] = missing
    meta["kv columns"] = f.has("total_blocks")
    meta["speculative columns"] = f.has("accepted_ratio")
    n_dp = one_row(
        con,
        f"SELECT count(*) FILTER (WHERE dp_rank IS NULL), count(DISTINCT dp_rank), "
        f"list(line_no ORDER BY line_no) FILTER (WHERE dp_rank IS NULL)[1:5] "
        f"FROM batch_rows WHERE source_id = {sid}",
    )
    note = ""
    if kept and n_dp[0] == kept:
        note = (
            "no dp_rank in any row (empty or <NA>): the DP queries take a process's domain from "
            "chrome_tracing.json process_labels, and skip when there is none"
        )
    elif n_dp[0]:
        note = f"{n_dp[0]} row(s) without dp_rank at {_positions(n_dp[2])}" + (
            f" (first {len(n_dp[2])} of {n_dp[0]})" if n_dp[0] > len(n_dp[2]) else ""
        )
    meta["dp_ranks"] = n_dp[1]
    unit = times.units.get("start_time(ms)")
    unit_note = f"start_time(ms) holds {unit[0]}" if unit else "times from start_datetime"
    out = _finish(f, kept, row_drops, meta, cell_drops, note)
    out.message = "; ".join(m for m in (unit_note, out.message) if m)
    return out


def _python_res_lists(con, sid: int, stage: str) -> list[tuple[str, str, int]]:
    """Parse in Python the cells DuckDB could not, in Arrow batches of FALLBACK_BATCH cells, and
    reject JSON cells with an item that is not a request dict (no 'rid'). Returns the drops of
    cells that do not parse; their batch rows stay, with res_list_items NULL."""
    failures: dict[str, list[int]] = {}
    for line_no, k in con.execute(
        f"SELECT line_no, min(item_no) FROM batch_request_rows WHERE source_id = {sid} AND rid IS NULL "
        "GROUP BY line_no ORDER BY line_no"
    ).fetchall():
        failures.setdefault(f"item {k} is not a request dict with a 'rid'", []).append(line_no)
    if failures:
        bad = sorted(x for lines in failures.values() for x in lines)
        con.execute(
            f"DELETE FROM batch_request_rows WHERE source_id = {sid} AND line_no IN (SELECT UNNEST($1::BIGINT[]))",
            [bad],
        )
        con.execute(
            f"UPDATE batch_rows SET res_list_items = NULL WHERE source_id = {sid} AND line_no IN "
            "(SELECT UNNEST($1::BIGINT[]))",
            [bad],
        )
    last = -1
    while True:
        rows = con.execute(
            f"SELECT line_no, rl_raw FROM {stage}_v WHERE name IS NOT NULL AND start_ns IS NOT NULL "
            f"AND rl_state = 'python' AND line_no > ? ORDER BY line_no LIMIT {FALLBACK_BATCH}",
            [last],
        ).fetchall()
        if not rows:
            break
        last = rows[-1][0]
        cols: dict[str, list] = {
            k: []
            for k in (
                "line_no",
                "item_no",
                "rid",
                "iter",
                "req_type",
                "num_scheduled_tokens",
                "num_prompt_tokens",
                "num_computed_tokens",
            )
        }
        counts_line: list[int] = []
        counts_n: list[int | None] = []
        for line_no, text in rows:
            try:
                items = parse_res_list(text)
            except ResListError as exc:
                failures.setdefault(str(exc), []).append(line_no)
                counts_line.append(line_no)
                counts_n.append(None)
                continue
            counts_line.append(line_no)
            counts_n.append(len(items))
            for k, item in enumerate(items, 1):
                cols["line_no"].append(line_no)
                cols["item_no"].append(k)
                for key, v in zip(
                    ("rid", "iter", "req_type", "num_scheduled_tokens", "num_prompt_tokens", "num_computed_tokens"),
                    item,
                ):
                    cols[key].append(v)
        items_tbl = pa.table(
            {
                "line_no": pa.array(cols["line_no"], pa.int64()),
                "item_no": pa.array(cols["item_no"], pa.int32()),
                "rid": pa.array(cols["rid"], pa.string()),
                **{
                    k: pa.array(cols[k], pa.int64())
                    for k in ("iter", "num_scheduled_tokens", "num_prompt_tokens", "num_computed_tokens")
                },
                "req_type": pa.array(cols["req_type"], pa.int64()),
            }
        )
        counts_tbl = pa.table({"line_no": pa.array(counts_line, pa.int64()), "n": pa.array(counts_n, pa.int32())})
        con.register("_svc_items_arrow", items_tbl)
        con.register("_svc_counts_arrow", counts_tbl)
        try:
            con.execute(f"""INSERT INTO batch_request_rows
                SELECT {sid}, line_no, item_no, rid, iter, CAST(req_type AS INTEGER), num_scheduled_tokens,
                       num_prompt_tokens, num_computed_tokens FROM _svc_items_arrow""")
            con.execute(f"""UPDATE batch_rows SET res_list_items = c.n FROM _svc_counts_arrow c
                WHERE batch_rows.source_id = {sid} AND batch_rows.line_no = c.line_no""")
        finally:
            con.unregister("_svc_items_arrow")
            con.unregister("_svc_counts_arrow")
    return [
        (f"res_list cell does not parse: {reason}", _positions(lines), len(lines))
        for reason, lines in sorted(failures.items(), key=lambda kv: kv[1][0])
    ]


# ----------------------------------------------------------------------------- request.csv


def _ingest_request(ctx: Context) -> Outcome:
    f = _Csv(ctx, "request.csv")
    f.require("http_rid", "recv_token_size", "reply_token_size", any_of=("start_time(ms)", "start_datetime"))
    times = _Times(f, ["start_time(ms)"], ["start_datetime"])
    con, sid, r = ctx.con, ctx.source_id, f.ref
    src = f"_svc_req_{sid}"
    try:
        scan = f.scan(store_rejects=True)
        con.execute(f"""CREATE OR REPLACE TEMP TABLE {src}_t AS
            SELECT {_text(r("http_rid"))} AS rid, {times.ns("start_time(ms)", "start_datetime")} AS start_ns,
                   {_int(r("recv_token_size"))} AS input_tokens, {_int(r("reply_token_size"))} AS output_tokens,
                   {_num(r("execution_time(ms)"))} AS execution_ms, {_num(r("queue_wait_time(ms)"))} AS queue_wait_ms,
                   {_num(r("first_token_latency(ms)"))} AS first_token_latency_ms,
                   {_num(r("cache_hit_rate"))} AS cache_hit_rate
            FROM {scan}""")
        f.collect_rejects()
        con.execute(f"CREATE OR REPLACE TEMP VIEW {src} AS SELECT * FROM {f.numbered(src + '_t')}")
        ok = "rid IS NOT NULL AND start_ns IS NOT NULL"
        con.execute(f"""INSERT INTO request_rows SELECT {sid}, line_no, rid, start_ns, input_tokens,
                        output_tokens, execution_ms, queue_wait_ms, first_token_latency_ms, cache_hit_rate
                        FROM {src} WHERE {ok}""")
        kept = scalar(con, f"SELECT count(*) FROM request_rows WHERE source_id = {sid}")
        row_drops = _row_drops(
            con,
            _drop_reasons_sql(
                f,
                [
                    ("rid IS NOT NULL", "empty http_rid"),
                    (
                        "start_ns IS NOT NULL",
                        "no usable start time (start_time(ms) and start_datetime empty or unparseable)",
                    ),
                ],
                src,
            ),
        )
    finally:
        f.cleanup(src)
    return _finish(f, kept, row_drops, times.metadata())


# ----------------------------------------------------------------------------- kvcache.csv


def _ingest_kvcache(ctx: Context) -> Outcome:
    f = _Csv(ctx, "kvcache.csv")
    f.require("name", "start_time", "kvcache_usage_rate")
    if not (f.has("free_blocks") or f.has("device_kvcache_left") or f.has("used_blocks")):
        raise InputError(
            ctx.path,
            "kvcache.csv has neither free_blocks/used_blocks (vLLM shape) nor device_kvcache_left (MindIE shape)",
            position="line 1",
            hint="re-export with msserviceprofiler parse",
        )
    shape = "blocks" if f.has("total_blocks") or f.has("used_blocks") else "device"
    # start_time is a datetime string in this file, but accept epoch numbers as well
    times = _Times(f, ["start_time"], [])
    con, sid, r = ctx.con, ctx.source_id, f.ref
    num_ts = times.ns("start_time", None)
    ts = f"coalesce({num_ts}, {_datetime_ns(r('start_time'))})"
    free = r("free_blocks") if f.has("free_blocks") else r("device_kvcache_left")
    src = f"_svc_kv_{sid}"
    try:
        con.execute(f"""CREATE OR REPLACE TEMP TABLE {src}_t AS
            SELECT {_text(r("name"))} AS name, {_text(r("rid"))} AS rid, {ts} AS ts_ns,
                   {_int(r("total_blocks"))} AS total_blocks, {_int(r("used_blocks"))} AS used_blocks,
                   {_int(free)} AS free_blocks, {_int(r("blocks_allocated"))} AS blocks_allocated,
                   {_int(r("blocks_freed"))} AS blocks_freed, {_num(r("kvcache_usage_rate"))} AS kvcache_usage_rate
            FROM {f.scan(store_rejects=True)}""")
        f.collect_rejects()
        con.execute(f"CREATE OR REPLACE TEMP VIEW {src} AS SELECT * FROM {f.numbered(src + '_t')}")
        con.execute(f"""INSERT INTO kvcache_rows SELECT {sid}, line_no, '{shape}', name, rid, ts_ns, total_blocks,
                        used_blocks, free_blocks, blocks_allocated, blocks_freed, kvcache_usage_rate
                        FROM {src} WHERE ts_ns IS NOT NULL""")
        kept = scalar(con, f"SELECT count(*) FROM kvcache_rows WHERE source_id = {sid}")
        row_drops = _row_drops(
            con,
            _drop_reasons_sql(
                f,
                [
                    (
                        "ts_ns IS NOT NULL",
                        "no usable start_time (not a datetime YYYY-MM-DD HH:MM:SS:ffffff nor an epoch number)",
                    ),
                ],
                src,
            ),
        )
    finally:
        f.cleanup(src)
    meta = {"shape": shape, **times.metadata()}
    return _finish(f, kept, row_drops, meta, note=f"{shape} shape")


# ----------------------------------------------------------------------------- forward.csv


def _ingest_forward(ctx: Context) -> Outcome:
    f = _Csv(ctx, "forward.csv")
    f.require("name", "during_time(ms)", "prof_id", any_of=("start_time(ms)", "start_datetime"))
    times = _Times(f, ["start_time(ms)", "end_time(ms)"], ["start_datetime", "end_datetime"])
    con, sid, r = ctx.con, ctx.source_id, f.ref
    src = f"_svc_fw_{sid}"
    try:
        con.execute(f"""CREATE OR REPLACE TEMP TABLE {src}_t AS
            SELECT {_text(r("name"))} AS name, {times.ns("start_time(ms)", "start_datetime")} AS start_ns,
                   {times.ns("end_time(ms)", "end_datetime")} AS end_ns,
                   {_num(r("relative_start_time(ms)"))} AS relative_start_ms, {_num(r("during_time(ms)"))} AS during_ms,
                   {_num(r("bubble_time(ms)"))} AS bubble_ms, {_num(r("batch_size"))} AS batch_size,
                   {_text(r("batch_type"))} AS batch_type, {_int(r("forward_iter"))} AS forward_iter,
                   {_dp(r("dp_rank"))} AS dp_rank, {_text(r("prof_id"))} AS prof_id, {_text(r("hostname"))} AS hostname
            FROM {f.scan(store_rejects=True)}""")
        f.collect_rejects()
        con.execute(f"CREATE OR REPLACE TEMP VIEW {src} AS SELECT * FROM {f.numbered(src + '_t')}")
        con.execute(f"""INSERT INTO forward_rows SELECT {sid}, line_no, name, start_ns,
                        coalesce(end_ns, start_ns + CAST(round(during_ms * 1e6) AS BIGINT)), relative_start_ms,
                        during_ms, bubble_ms, batch_size, batch_type, forward_iter, dp_rank, prof_id, hostname
                        FROM {src} WHERE start_ns IS NOT NULL""")
        kept = scalar(con, f"SELECT count(*) FROM forward_rows WHERE source_id = {sid}")
        row_drops = _row_drops(
            con,
            _drop_reasons_sql(
                f,
                [
                    (
                        "start_ns IS NOT NULL",
                        "no usable start time (start_time(ms) and start_datetime empty or unparseable)",
                    ),
                ],
                src,
            ),
        )
    finally:
        f.cleanup(src)
    return _finish(f, kept, row_drops, times.metadata())
