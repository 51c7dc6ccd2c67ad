"""Ascend operator CSVs: torch_npu ``kernel_details.csv`` and msprof ``op_summary_*.csv``.

Recognised by the header line (never the file name). Columns are mapped by header NAME, because
the header drifts between versions: ``Block Dim``/``Block Num``, optional ``Step Id`` and
``Device_id``, Level0 reduced headers, op_summary's ``Op Name``/``Task Start Time(us)`` names and
PMU columns that depend on ``aic_metrics``. Unmapped columns go to ``op_rows.extra``.

Python reads the header line and counts newlines; no row passes through it. DuckDB's CSV reader
parses the rows straight into ``op_rows`` with one ``INSERT … SELECT`` (every cell read as text,
cleaned and cast in SQL: the trailing TAB msprof appends to start times, ``N/A``, quoted shapes;
microseconds become exact integer ns by moving the decimal point, never through a DOUBLE).
Ragged or undecodable lines are set aside by DuckDB's rejects table (which gives their line);
rows without a usable name / start / duration are inserted marked and deleted afterwards. Both
kinds are counted and reported with their line numbers.

Line numbers. DuckDB numbers records, not physical lines, and skips blank lines without a trace,
so ``line_no`` is first written as "header + row ordinal" and corrected after the scan:
- rejected records are skipped in the numbering (their record numbers come from the rejects table);
- when a newline count shows that the file has blank lines or quoted fields spanning lines (rare),
  a pass over the raw lines finds both (a record spans lines while the count of ``"`` so far is
  odd) and the numbers are mapped to physical lines.
``metadata["line_no_exact"]`` says whether the line accounting reconciled exactly.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import duckdb

from ..errors import InputError
from ..store import one_row, scalar
from .base import Context, Outcome, is_gzip, open_bytes, strip_bom

HEADER_LIMIT = 1 << 20  # a first line longer than this is not an operator CSV header
READ_BYTES = 8 << 20
MAX_DROP_ENTRIES = 100  # drops listed one line each; the rest are summed per reason
# Temp tables of the ingest connection, dropped after each file (their names keep them apart
# from other readers' rejects tables on the same connection).
_REJ = "_op_csv_rejects"
_SCAN = "_op_csv_reject_scans"
_RAW = "_op_csv_raw"
_EXC = "_op_csv_exceptions"
_MULTI = "_op_csv_multiline"
_DROPS = "_op_csv_drops"
_TEMPS = (_REJ, _SCAN, _RAW, _EXC, _MULTI, _DROPS)


def _norm(header_name: str) -> str:
    """Key for matching header names: case, spaces and underscores do not matter
    (``Device_id`` = ``Device ID``, ``OP Type`` = ``Op Type``)."""
    return re.sub(r"[\s_]+", "", header_name.strip().lower())


# op_rows column -> (accepted header names, the first present wins; value kind).
_FIELDS: dict[str, tuple[tuple[str, ...], str]] = {
    "step_id": (("Step Id",), "int"),
    "device_id": (("Device_id",), "int"),
    "model_id": (("Model ID",), "bigint"),
    "task_id": (("Task ID",), "text"),
    "stream_id": (("Stream ID",), "text"),
    "name": (("Name", "Op Name"), "text"),
    "op_type": (("Type", "OP Type"), "text"),
    "op_state": (("OP State",), "text"),
    "accelerator_core": (("Accelerator Core", "Task Type"), "text"),
    "ts_ns": (("Start Time(us)", "Task Start Time(us)"), "ns"),
    "dur_ns": (("Duration(us)", "Task Duration(us)"), "ns"),
    "wait_ns": (("Wait Time(us)", "Task Wait Time(us)"), "ns"),
    "block_num": (("Block Num", "Block Dim"), "int"),
    "mix_block_num": (("Mix Block Num", "Mix Block Dim"), "int"),
    "input_shapes": (("Input Shapes",), "shape"),
    "input_dtypes": (("Input Data Types",), "text"),
    "input_formats": (("Input Formats",), "text"),
    "output_shapes": (("Output Shapes",), "shape"),
    "output_dtypes": (("Output Data Types",), "text"),
    "output_formats": (("Output Formats",), "text"),
}
_REQUIRED = ("name", "ts_ns", "dur_ns")
_KERNEL_DETAILS_KEYS = {_norm(k) for k in ("Name", "Start Time(us)", "Duration(us)")}
_OP_SUMMARY_KEYS = {_norm(k) for k in ("Task Start Time(us)", "Op Name")}


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _clean(col: str, light: bool = False) -> str:
    """SQL: a cell without msprof's trailing TAB (quoted or not) and spaces; empty / N/A -> NULL.

    The reader already turns bare empty and ``N/A`` cells into NULL (``nullstr``); trimming only
    the cells that end or start with a blank keeps the common case cheap (a trim on every cell of
    ~45 columns costs as much CPU as the parse). ``light``: for the `extra` columns only a
    trailing TAB is looked for (msprof appends it to the start time only; op_summary_assembler
    WriteToFile), which halves the cost of the check."""
    # Literal TAB / CR characters inside the SQL strings: chr(9) || ... costs planning time,
    # which matters with ~45 columns x several expressions.
    ws = "' \t\r'"
    test = (
        f"ends_with({col}, '\t')"
        if light
        else f"ends_with({col}, '\t') OR ends_with({col}, ' ') OR starts_with({col}, ' ') OR ends_with({col}, '\r')"
    )
    trimmed = f"trim({col}, {ws})"
    return f"CASE WHEN {test} THEN (CASE WHEN {trimmed} IN ('', 'N/A') THEN NULL ELSE {trimmed} END) ELSE {col} END"


def _value_sql(kind: str, col: str) -> str:
    v = _clean(col)
    if kind == "int":
        return f"TRY_CAST({v} AS INTEGER)"
    if kind == "bigint":
        return f"TRY_CAST({v} AS BIGINT)"
    if kind == "ns":
        # Exact ns of epoch-scale us (1736413971558972.912 -> 1736413971558972912; a DOUBLE has
        # 0.25 us steps there). The usual form, digits with up to 3 decimals, becomes ns by moving
        # the point as text: 20x faster than a VARCHAR -> DECIMAL(22+) cast in DuckDB 1.5 (18 s
        # vs 1 s for 0.5 M values). Other forms (exponent, more decimals) take the DECIMAL path.
        return (
            f"CASE WHEN regexp_full_match({v}, '-?[0-9]+(\\.[0-9]{{0,3}})?') "
            f"THEN TRY_CAST(split_part({v}, '.', 1) || rpad(split_part({v}, '.', 2), 3, '0') AS BIGINT) "
            f"WHEN abs(TRY_CAST({v} AS DOUBLE)) < 9e15 "  # else * 1000 overflows DECIMAL(38,9)
            f"THEN TRY_CAST(round(TRY_CAST({v} AS DECIMAL(38,9)) * 1000) AS BIGINT) END"
        )
    if kind == "shape":
        # Written """81920,4096;8192,512""": after CSV unquoting one pair of quotes is left.
        return f"nullif(trim({v}, '\"'), '')"
    return v


def _first_line(head: bytes) -> tuple[str, bool]:
    """The first line of the content (BOM and line end removed) and whether it ended."""
    head = strip_bom(head)
    m = re.search(rb"[\r\n]", head)
    line = head if m is None else head[: m.start()]
    return line.decode("utf-8", errors="replace"), m is not None


def _parse_names(line: str) -> list[str] | None:
    try:
        return [n.strip() for n in next(csv.reader([line]))]
    except (csv.Error, StopIteration):
        return None


def _header(path: Path) -> list[str]:
    """The header names (first line).

    Raises:
        InputError: the file is empty or its first line is not a CSV header.
    """
    with open_bytes(path) as f:
        head = f.read(HEADER_LIMIT + 1)
    text, ended = _first_line(head)
    if not ended and len(head) > HEADER_LIMIT:
        raise InputError(
            path,
            f"a CSV header line, found a first line longer than {HEADER_LIMIT} bytes",
            position="line 1",
            hint="this is not an Ascend kernel_details / op_summary CSV",
        )
    if not text.strip():
        raise InputError(
            path,
            "a CSV header line, found an empty file"
            if not strip_bom(head).strip()
            else "a CSV header line, found an empty first line",
            position="line 1",
            hint="the profiler wrote no operator table; re-run the export "
            "(torch_npu.profiler.profiler.analyse / msprof --export=on)",
        )
    names = _parse_names(text)
    if names is None:
        raise InputError(
            path,
            "a CSV header line, found a first line that does not parse as CSV",
            position="line 1",
            hint="this is not an Ascend kernel_details / op_summary CSV",
        )
    return names


def _variant(names: list[str]) -> str | None:
    keys = {_norm(n) for n in names}
    if _KERNEL_DETAILS_KEYS <= keys:
        return "kernel_details"
    if _OP_SUMMARY_KEYS <= keys:
        return "op_summary"
    if _mixed(names):
        return "op_summary"
    return None


def _mixed(names: list[str]) -> bool:
    """A header mixing the two variants' names (MindStudio Insight's test op_summary_1.csv: `Op Name`
    with kernel_details' `Start Time(us)`) that still names every required column and a task-level
    column (so that a CSV that merely has Name / Start / Duration columns is not taken)."""
    keys = {_norm(n) for n in names}
    mapped, _extra = _map_columns(names)
    return (
        all(f in mapped for f in _REQUIRED)
        and bool(keys & {_norm("Op Name"), _norm("Task Duration(us)")})
        and bool(keys & {_norm(k) for k in ("Task ID", "Stream ID", "Task Type", "Accelerator Core")})
    )


def _map_columns(names: list[str]) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """op_rows column -> index in the file, and (extra key, index) of every other column."""
    index: dict[str, int] = {}
    for i, n in enumerate(names):
        index.setdefault(_norm(n), i)
    mapped: dict[str, int] = {}
    for field, (aliases, _kind) in _FIELDS.items():
        for alias in aliases:
            j = index.get(_norm(alias))
            if j is not None and j not in mapped.values():
                mapped[field] = j
                break
    used = set(mapped.values())
    extra: list[tuple[str, int]] = []
    seen: dict[str, int] = {}
    for i, n in enumerate(names):
        if i in used:
            continue
        key = n or f"column_{i + 1}"
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:  # a repeated header name: keep every copy
            key = f"{key}_{seen[key]}"
        extra.append((key, i))
    return mapped, extra


def _count_lines(path: Path) -> int:
    """Physical lines up to the last one with content (trailing empty lines do not count)."""
    total = 0
    tail = 0  # newlines in the run of \r / \n at the end of what was read so far
    last_content = False
    with open_bytes(path) as f:
        while chunk := f.read(READ_BYTES):
            total += chunk.count(b"\n")
            body = chunk.rstrip(b"\r\n")
            if body:
                tail = chunk.count(b"\n", len(body))
                last_content = True
            else:
                tail += chunk.count(b"\n")
    if not last_content:
        return 0
    return total - tail + 1


class OpCsvReader:
    """Reader for kernel_details.csv and op_summary_*.csv."""

    name = "op_csv"

    def sniff(self, path: Path, head: bytes) -> str | None:
        line, _ended = _first_line(head)
        if "," not in line or line.lstrip().startswith(("{", "[")):
            return None
        names = _parse_names(line)
        return _variant(names) if names else None

    def guess_note(self, path: Path, head: bytes, fmt: str) -> str | None:
        names = _parse_names(_first_line(head)[0]) or []
        keys = {_norm(n) for n in names}
        if not (_KERNEL_DETAILS_KEYS <= keys or _OP_SUMMARY_KEYS <= keys):
            return "format guessed: the header mixes kernel_details and op_summary column names; columns read by name"
        return None

    def ingest(self, ctx: Context) -> Outcome:
        path, con, sid = ctx.path, ctx.con, ctx.source_id
        names = _header(path)
        mapped, extra = _map_columns(names)
        missing = [f for f in _REQUIRED if f not in mapped]
        if missing:
            wanted = ", ".join(" or ".join(f"`{a}`" for a in _FIELDS[f][0]) for f in missing)
            raise InputError(
                path,
                f"missing required column(s) {wanted}; the header found is: {','.join(names)}",
                position="line 1",
                hint="expected an Ascend kernel_details.csv or msprof op_summary_*.csv, which have "
                "Name, Start Time(us) and Duration(us) columns",
            )
        metadata = {
            "header_variant": _variant(names) or ctx.format,
            "columns": len(names),
            "block_column": names[mapped["block_num"]] if "block_num" in mapped else None,
            "has_step_id": "step_id" in mapped,
            "has_device_id": "device_id" in mapped,
            "level0": "task_id" not in mapped,  # Level0 has no Task ID / Stream ID / PMU columns
            "extra_columns": [k for k, _ in extra],
        }
        try:
            for t in _TEMPS:
                con.execute(f"DROP TABLE IF EXISTS {t}")
            n_parsed = self._insert(ctx, names, mapped, extra)
            n_rejected, exact = self._fix_line_numbers(ctx, n_parsed)
            outcome = self._outcome(ctx, n_parsed, n_rejected, metadata)
        finally:
            try:
                for t in _TEMPS:
                    con.execute(f"DROP TABLE IF EXISTS {t}")
            except duckdb.Error:
                pass  # the transaction failed: its rollback drops them, and the first error matters
        metadata["line_no_exact"] = exact
        if "device_id" in mapped:
            devs = [
                r[0]
                for r in con.execute(
                    "SELECT DISTINCT device_id FROM op_rows WHERE source_id = ? AND device_id IS NOT NULL "
                    "ORDER BY 1 LIMIT 65",
                    [sid],
                ).fetchall()
            ]
            metadata["device_ids"] = devs[:64]
            if len(devs) == 1:
                outcome.rank_hints["device_id"] = devs[0]
        return outcome

    # -- steps ---------------------------------------------------------------------------------

    def _insert(self, ctx: Context, names, mapped, extra) -> int:
        """One INSERT … SELECT of every row DuckDB parsed; returns their number.

        Rows without a usable name / start / duration are inserted too, with ``extra`` =
        ``{"_drop": reason}``, so that they get their final line number before being deleted.
        """
        cols = [f"c{i}" for i in range(len(names))]
        # Layers, so that each cell is cleaned once and each value cast once:
        # raw cells -> cleaned text (c0..cN) -> typed columns + extra -> drop reason.
        values = {
            f: (_value_sql(kind, cols[mapped[f]]) if f in mapped else "NULL") for f, (_aliases, kind) in _FIELDS.items()
        }
        extra_sql = (
            "json_object(" + ", ".join(f"{_sql_str(k)}, {cols[i]}" for k, i in extra) + ")" if extra else "'{}'::JSON"
        )
        checks = []
        for f in _REQUIRED:
            raw, label = cols[mapped[f]], _sql_str(names[mapped[f]])
            checks.append(f"WHEN {raw} IS NULL THEN 'missing ' || {label}")
            if f != "name":
                checks.append(f"WHEN {f} IS NULL THEN 'bad ' || {label} || ' value ' || left({raw}, 40)")
        required_raw = ", ".join(cols[mapped[f]] for f in _REQUIRED)
        used = set(mapped.values())
        columns = "{" + ", ".join(f"'{c}': 'VARCHAR'" for c in cols) + "}"
        sql = f"""
            INSERT INTO op_rows (source_id, line_no, {", ".join(_FIELDS)}, extra)
            SELECT $sid, k + 1, {", ".join(_FIELDS)},
                   CASE WHEN drop_reason IS NULL THEN extra ELSE json_object('_drop', drop_reason) END
            FROM (
                SELECT *, CASE {" ".join(checks)} END AS drop_reason
                FROM (
                    SELECT k, {", ".join(f"{values[f]} AS {f}" for f in _FIELDS)},
                           {extra_sql} AS extra, {required_raw}
                    FROM (
                        SELECT k, {", ".join(f"{_clean(c, i not in used)} AS {c}" for i, c in enumerate(cols))}
                        FROM (
                            SELECT row_number() OVER () AS k, *
                            FROM read_csv($path, columns = {columns}, header = true, auto_detect = false,
                                          delim = ',', quote = '"', escape = '"', nullstr = ['', 'N/A'],
                                          compression = '{"gzip" if is_gzip(ctx.path) else "none"}',
                                          store_rejects = true, rejects_table = '{_REJ}',
                                          rejects_scan = '{_SCAN}')
                        )
                    )
                )
            )"""
        try:
            return scalar(ctx.con, sql, {"sid": ctx.source_id, "path": ctx.db_path})
        except duckdb.Error as exc:
            raise InputError(
                ctx.path,
                f"a readable CSV file, DuckDB's CSV reader failed: {exc}",
                hint="check that the file is a complete, UTF-8 CSV export",
            ) from None

    def _fix_line_numbers(self, ctx: Context, n_parsed: int) -> tuple[int, bool]:
        """Turn the provisional ``line_no`` (row ordinal + 1) into physical line numbers and build
        the temp table of rejected lines. Returns (number of rejected lines, whether exact)."""
        con, sid = ctx.con, ctx.source_id
        # One reject row per (line, column) for some errors: one per line here.
        con.execute(f"""CREATE TEMP TABLE {_EXC} AS
            SELECT line AS rec,
                   arg_min(CASE error_type
                               WHEN 'MISSING COLUMNS' THEN 'ragged row, fewer columns than the header'
                               WHEN 'TOO MANY COLUMNS' THEN 'ragged row, more columns than the header'
                               WHEN 'UNQUOTED VALUE' THEN 'unterminated or stray quote'
                               WHEN 'INVALID ENCODING' THEN 'not UTF-8 text'
                               WHEN 'LINE SIZE OVER MAXIMUM' THEN 'line too long'
                               ELSE coalesce(lower(error_type), 'unreadable row') END
                           || coalesce(' (' || error_message || ')', ''),
                           -- a line-size reject has no column: arg_min would skip it, and the
                           -- dropped line then counted as kept (issue 16)
                           coalesce(column_idx, -1)) AS reason
            FROM {_REJ} GROUP BY line, line_byte_position""")
        n_rejected, unknown = one_row(con, f"SELECT count(*), count(*) FILTER (WHERE rec IS NULL) FROM {_EXC}")
        con.execute(f"CREATE TEMP TABLE {_MULTI} (rec_open BIGINT, cum BIGINT)")
        lines = _count_lines(ctx.path)
        exact = unknown == 0
        if lines != 1 + n_parsed + n_rejected:
            exact = exact and self._scan_raw_lines(ctx, lines, n_parsed + n_rejected)
        if n_rejected or lines != 1 + n_parsed + n_rejected:
            con.execute(
                f"""
                UPDATE op_rows SET line_no = m.new_line
                FROM (
                    SELECT d.old_line, d.rec + coalesce(mm.cum, 0) AS new_line
                    FROM (
                        SELECT o.line_no AS old_line, o.line_no + coalesce(g.j, 0) AS rec
                        FROM (SELECT line_no FROM op_rows WHERE source_id = $sid) o
                        ASOF LEFT JOIN (
                            -- g = data rows before the i-th skipped record; j = records skipped so far
                            SELECT rec - i - 1 AS g, max(i) AS j
                            FROM (SELECT rec, row_number() OVER (ORDER BY rec) AS i
                                  FROM {_EXC} WHERE rec IS NOT NULL)
                            GROUP BY 1
                        ) g ON o.line_no - 1 > g.g
                    ) d
                    ASOF LEFT JOIN {_MULTI} mm ON d.rec > mm.rec_open
                ) m
                WHERE op_rows.source_id = $sid AND op_rows.line_no = m.old_line""",
                {"sid": sid},
            )
        return n_rejected, exact

    def _scan_raw_lines(self, ctx: Context, lines: int, n_records: int) -> bool:
        """Find blank lines and records spanning several lines (rare: only when the newline
        count does not reconcile).

        Adds blank records to the exceptions table (DuckDB counts them in its record numbers but
        emits no row) and fills the multi-line table (record number where such a record starts,
        cumulative extra lines through it). Returns whether the accounting reconciles.

        The lines are read in Python, as bytes: a DuckDB pass would have to decode them, and a
        decoding error there would abort the caller's transaction. Only blank lines and lines
        with an odd number of ``"`` are kept.
        """
        con = ctx.con
        lns: list[int] = []
        blanks: list[bool] = []
        odds: list[bool] = []
        quoted: list[bool] = []  # inside a quoted field when the line starts
        inside = False
        with open_bytes(ctx.path) as f:
            for ln, line in enumerate(f, 1):
                blank = not line.strip(b"\r\n")
                odd = line.count(b'"') % 2 == 1
                if blank or odd:
                    lns.append(ln)
                    blanks.append(blank)
                    odds.append(odd)
                    quoted.append(inside)
                    inside ^= odd
        con.execute(
            f"""CREATE TEMP TABLE {_RAW} AS
            SELECT unnest($ln::BIGINT[]) AS ln, unnest($blank::BOOLEAN[]) AS blank,
                   unnest($odd::BOOLEAN[]) AS odd, unnest($quoted::BOOLEAN[]) AS in_quotes""",
            {"ln": lns, "blank": blanks, "odd": odds, "quoted": quoted},
        )
        # A record opens a quote on one line and closes it on the next odd line.
        con.execute(
            f"""
            INSERT INTO {_MULTI}
            SELECT open_ln - coalesce(sum(extra) OVER w_before, 0), sum(extra) OVER w_incl
            FROM (
                SELECT ln AS open_ln, in_quotes, coalesce(lead(ln) OVER (ORDER BY ln), $lines) - ln AS extra
                FROM {_RAW} WHERE odd
            ) WHERE NOT in_quotes
            WINDOW w_before AS (ORDER BY open_ln ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                   w_incl AS (ORDER BY open_ln ROWS UNBOUNDED PRECEDING)""",
            {"lines": lines},
        )
        con.execute(f"""
            INSERT INTO {_EXC}
            SELECT b.ln - coalesce(m.cum, 0), NULL
            FROM (SELECT ln FROM {_RAW} WHERE blank AND NOT in_quotes AND ln > 1) b
            ASOF LEFT JOIN (SELECT rec_open + cum AS line_after, cum FROM {_MULTI}) m
              ON b.ln > m.line_after""")
        # Rejected records are numbered by DuckDB; blank ones by us: map both with the same table.
        n_blank, extra_lines = one_row(
            con,
            f"SELECT (SELECT count(*) FROM {_EXC} WHERE reason IS NULL), (SELECT coalesce(max(cum), 0) FROM {_MULTI})",
        )
        trailing_blank = scalar(con, f"SELECT count(*) FROM {_RAW} WHERE blank AND ln > $lines", {"lines": lines})
        return lines + trailing_blank - extra_lines == 1 + n_records + n_blank

    def _outcome(self, ctx: Context, n_parsed: int, n_rejected: int, metadata: dict) -> Outcome:
        con, sid = ctx.con, ctx.source_id
        con.execute(
            f"""CREATE TEMP TABLE {_DROPS} AS
            SELECT e.rec + coalesce(m.cum, 0) AS line, e.reason
            FROM (SELECT * FROM {_EXC} WHERE reason IS NOT NULL) e
            ASOF LEFT JOIN {_MULTI} m ON e.rec > m.rec_open
            UNION ALL
            SELECT line_no, extra->>'_drop' FROM op_rows
            WHERE source_id = $sid AND (name IS NULL OR ts_ns IS NULL OR dur_ns IS NULL)""",
            {"sid": sid},
        )
        n_invalid = scalar(con, f"SELECT count(*) FROM {_DROPS}") - n_rejected
        if n_invalid:
            con.execute(
                "DELETE FROM op_rows WHERE source_id = ? AND (name IS NULL OR ts_ns IS NULL OR dur_ns IS NULL)", [sid]
            )
        drops: list[tuple[str, str, int]] = [
            (reason, f"line {line}" if line is not None else "line ?", 1)
            for reason, line in con.execute(
                f"SELECT reason, line FROM {_DROPS} ORDER BY line NULLS LAST LIMIT {MAX_DROP_ENTRIES}"
            ).fetchall()
        ]
        drops += [
            (reason, f"lines {lo}-{hi} ({n} rows)", n)
            for reason, lo, hi, n in con.execute(f"""
                SELECT reason, min(line), max(line), count(*) FROM (
                    SELECT reason, line FROM {_DROPS} ORDER BY line NULLS LAST OFFSET {MAX_DROP_ENTRIES})
                GROUP BY reason ORDER BY min(line)""").fetchall()
        ]
        kept = n_parsed - n_invalid
        n_dropped = n_rejected + n_invalid
        message = "header only: no operator rows" if n_parsed + n_rejected == 0 else ""
        if n_dropped:
            message = f"{n_dropped} of {kept + n_dropped} rows dropped (first: {drops[0][0]}, {drops[0][1]})"
        return Outcome(
            rows_seen=kept + n_dropped,
            rows_kept=kept,
            rows_dropped=n_dropped,
            status="salvaged" if n_dropped else "ok",
            message=message,
            drops=drops,
            metadata=metadata,
        )


READER = OpCsvReader()
