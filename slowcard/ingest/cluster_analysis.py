"""msprof-analyze cluster-analysis outputs and their per-rank sources: step trace and communication summary.

All recognised by content, never by file name:

- ``cluster_step`` (``cluster_step_trace_time.csv``): a CSV whose header has ``Type``, ``Index``,
  ``Computing`` and at least one other step-trace column (``Communication(Not Overlapped)``,
  ``Free``, ``Overlapped``, ``Stage``, ``Bubble``). Columns are mapped by header name (``Preparing``
  and the ``DP/PP/TP Index`` columns come and go between versions); a missing required column
  fails the file, a row with a non-number in a time column is dropped with its line and reason.
- ``step_trace`` (one rank's ``ASCEND_PROFILER_OUTPUT/step_trace_time.csv``): the same columns
  without ``Type`` / ``Index`` (``Device_id`` and ``Preparing`` in newer versions); every row is
  a rank row of the file's rank (``sources.rank``, from ``profiler_info_N.json``).
- ``cluster_communication`` (``cluster_communication.json``): a JSON object whose first key is a
  rank set like ``"(0, 1)"`` or msprof-analyze's ``"p2p"`` group, and whose head holds
  ``"Communication Time Info"`` (this keeps ``cluster_communication_matrix.json``, keyed the same
  way, out). Shape: ``{rank set: {step: {"<op>@<group>" | "Total Op Info": {rank:
  {"Communication Time Info": {…}, "Communication Bandwidth Info": {link: {…}}}}}}}``.
- ``communication`` (one rank's ``communication.json``): ``{step: {"collective" | "p2p": {op:
  leaf}}}``, the leaves as above, the rank the file's.

A level that is not an object fails the file (the message names the key path); a leaf with a
non-number or a rank key that is not an integer is dropped with its key path.

The files are small (one row per rank and step, or per rank and communication op), so Python
parses them and hands the rows to DuckDB as one Arrow table. The cluster files are cluster-wide:
the rank of a row is a column, never ``sources.rank``; in a per-rank file the column is NULL and
the views take ``sources.rank``. Owns the tables in ``cluster_analysis.sql``.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    import pyarrow as pa
else:
    from .._lazy import LazyModule

    pa = LazyModule("pyarrow")  # imported on first use (issue 17)

from ..errors import InputError
from .base import Context, Outcome, arrow_view, open_bytes, strip_bom

MAX_DROP_ENTRIES = 100  # drops listed one each; the rest are summed per reason


def _norm(name: str) -> str:
    """Key for matching header / JSON names: case, spaces and underscores do not matter."""
    return re.sub(r"[\s_]+", "", name.strip().lower())


# ---------------------------------------------------------------------------------------------
# cluster_step_trace_time.csv

# step_trace_rows column -> (header name, kind); kind: text | int | us (float microseconds)
_STEP_FIELDS: dict[str, tuple[str, str]] = {
    "step": ("Step", "text"),
    "type": ("Type", "text"),
    "index": ("Index", "text"),
    "computing_us": ("Computing", "us"),
    "communication_not_overlapped_us": ("Communication(Not Overlapped)", "us"),
    "overlapped_us": ("Overlapped", "us"),
    "communication_us": ("Communication", "us"),
    "free_us": ("Free", "us"),
    "stage_us": ("Stage", "us"),
    "bubble_us": ("Bubble", "us"),
    "comm_not_overlapped_excl_receive_us": ("Communication(Not Overlapped and Exclude Receive)", "us"),
    "preparing_us": ("Preparing", "us"),
    "dp_index": ("DP Index", "int"),
    "pp_index": ("PP Index", "int"),
    "tp_index": ("TP Index", "int"),
    "device_id": ("Device_id", "int"),
}
# Without these a row cannot be placed (type, index) or compared across ranks (the three
# dimensions of msprof-analyze Advisor's slow-rank rule).
_STEP_REQUIRED = ("type", "index", "computing_us", "communication_not_overlapped_us", "free_us")
_STEP_SIGNATURE = {_norm(n) for n in ("Type", "Index", "Computing")}
_STEP_ONE_OF = {_norm(n) for n in ("Communication(Not Overlapped)", "Free", "Overlapped", "Stage", "Bubble")}
# The per-rank step_trace_time.csv of the Ascend PyTorch Profiler: one rank's rows, no Type/Index.
_RANK_STEP_REQUIRED = ("computing_us", "communication_not_overlapped_us", "free_us")
_RANK_STEP_SIGNATURE = {_norm(_STEP_FIELDS[c][0]) for c in _RANK_STEP_REQUIRED}
_RANK_STEP_ONE_OF = {_norm(n) for n in ("Overlapped", "Stage", "Bubble", "Communication")}

_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NULLS = ("", "N/A", "NA", "None", "null")


@functools.cache
def _step_schema():
    return pa.schema(
        [
            ("source_id", pa.int32()),
            ("line_no", pa.int64()),
            ("step", pa.string()),
            ("step_id", pa.int32()),
            ("type", pa.string()),
            ("index", pa.string()),
            ("rank", pa.int32()),
        ]
        + [(c, pa.float64()) for c, (_, kind) in _STEP_FIELDS.items() if kind == "us"]
        + [(c, pa.int32()) for c, (_, kind) in _STEP_FIELDS.items() if kind == "int"]
    )


def _first_line(head: bytes) -> str:
    head = strip_bom(head)
    m = re.search(rb"[\r\n]", head)
    return (head if m is None else head[: m.start()]).decode("utf-8", errors="replace")


def _parse_header(line: str) -> list[str] | None:
    if "," not in line or line.lstrip().startswith(("{", "[")):
        return None
    try:
        return [n.strip() for n in next(csv.reader([line]))]
    except (csv.Error, StopIteration):
        return None


def _is_step_header(names: list[str]) -> bool:
    keys = {_norm(n) for n in names}
    return _STEP_SIGNATURE <= keys and bool(keys & _STEP_ONE_OF)


def _is_rank_step_header(names: list[str]) -> bool:
    keys = {_norm(n) for n in names}
    return (
        _RANK_STEP_SIGNATURE <= keys and bool(keys & _RANK_STEP_ONE_OF) and not keys & {_norm("Type"), _norm("Index")}
    )


def _cell(text: str) -> str | None:
    """A cell without blanks, a stray TAB or quotes; None when empty or N/A."""
    v = text.strip().strip('"').strip()
    return None if v in _NULLS else v


class _BadValue(ValueError):
    pass


def _us(text: str | None, header: str) -> float | None:
    if text is None:
        return None
    if not _NUMBER.fullmatch(text):
        raise _BadValue(f"{header} value {text[:40]!r} is not a number")
    v = float(text)
    if not math.isfinite(v):
        raise _BadValue(f"{header} value {text[:40]!r} is not a finite number")
    return v


def _int(text: str | None, header: str) -> int | None:
    if text is None:
        return None
    if _INTEGER.fullmatch(text):
        v = int(text)
    elif _NUMBER.fullmatch(text) and float(text).is_integer():  # "3.0"
        v = int(float(text))
    else:
        raise _BadValue(f"{header} value {text[:40]!r} is not an integer")
    if not -(2**31) <= v < 2**31:
        raise _BadValue(f"{header} value {text[:40]!r} is out of range")
    return v


def _step_id(step: str | None) -> int | None:
    """The number of a step label: "12" or "step12" -> 12; None otherwise."""
    if step is None:
        return None
    m = re.fullmatch(r"(?:step)?\s*([0-9]{1,9})", step.strip(), re.IGNORECASE)
    return int(m[1]) if m else None


def _drop_list(drops: Sequence[tuple[str, int | str]], unit: str) -> list[tuple[str, str, int]]:
    """(reason, position, n): the first MAX_DROP_ENTRIES one each, the rest summed per reason
    (positions are line numbers for the CSV, key paths for the JSON)."""
    out = [(reason, f"{unit} {pos}", 1) for reason, pos in drops[:MAX_DROP_ENTRIES]]
    rest: dict[str, list] = {}
    for reason, pos in drops[MAX_DROP_ENTRIES:]:
        rest.setdefault(reason, []).append(pos)
    for reason, positions in rest.items():
        if unit == "line":
            where = f"lines {min(positions)}-{max(positions)} ({len(positions)} rows)"
        else:
            where = f"{len(positions)} entries, the first at {unit} {positions[0]}"
        out.append((reason, where, len(positions)))
    return out


class RankSets:
    """Ids of a cluster file's top-level keys, each key stored once (table comm_rank_sets): a rank
    set of a 2,048-rank job is a 10 kB string, and every row of the file holds one."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def id(self, key: str | None) -> int | None:
        return None if key is None else self.ids.setdefault(key, len(self.ids))

    def insert(self, ctx: Context) -> None:
        if self.ids:
            ctx.con.executemany(
                "INSERT INTO comm_rank_sets VALUES (?, ?, ?)", [[ctx.source_id, i, k] for k, i in self.ids.items()]
            )


def _insert(ctx: Context, table_name: str, table: pa.Table) -> None:
    with arrow_view(ctx, f"cluster_{table_name}", table) as name:
        ctx.con.execute(f'INSERT INTO {table_name} BY NAME SELECT * FROM "{name}"')


def _ingest_step_trace(ctx: Context) -> Outcome:
    """cluster_step_trace_time.csv (format cluster_step), or one rank's step_trace_time.csv
    (format step_trace: every row is a rank row whose rank is the file's, sources.rank)."""
    path = ctx.path
    per_rank = ctx.format == "step_trace"
    required = _RANK_STEP_REQUIRED if per_rank else _STEP_REQUIRED
    what = "step_trace_time.csv" if per_rank else "cluster_step_trace_time.csv"
    with open_bytes(path) as f:
        raw = f.read()
    text = raw.decode("utf-8-sig", errors="replace")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise InputError(path, f"a CSV header line, found one that does not parse ({exc})", position="line 1") from None
    if not header or not any(h.strip() for h in header):
        raise InputError(
            path,
            f"a {what} header line, found an empty first line",
            position="line 1",
            hint="re-run the profiler's analysis to write the file again",
        )
    names = [n.strip() for n in header]
    index: dict[str, int] = {}
    for i, n in enumerate(names):
        index.setdefault(_norm(n), i)
    mapped = {col: index[_norm(h)] for col, (h, _kind) in _STEP_FIELDS.items() if _norm(h) in index}
    missing = [_STEP_FIELDS[c][0] for c in required if c not in mapped]
    if missing:
        raise InputError(
            path,
            f"missing required column(s) {', '.join(f'`{m}`' for m in missing)}; the header found is: "
            f"{','.join(names)}",
            position="line 1",
            hint=(
                "expected an Ascend step_trace_time.csv (Step,Computing,Communication(Not Overlapped),Overlapped,"
                "Communication,Free,Stage,Bubble,...)"
                if per_rank
                else "expected an msprof-analyze cluster_step_trace_time.csv (Step,Type,Index,Computing,"
                "Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,...)"
            ),
        )

    cols: dict[str, list] = {f.name: [] for f in _step_schema()}
    drops: list[tuple[str, int]] = []
    kept = 0
    prev = reader.line_num
    n_fields = len(names)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise InputError(
                path,
                f"a readable CSV row, the CSV reader failed ({exc})",
                position=f"line {reader.line_num}",
                hint="check that the file is a complete CSV export",
            ) from None
        line, prev = prev + 1, reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # blank line: not a row
        if len(row) != n_fields:
            drops.append((f"ragged row, {len(row)} fields where the header has {n_fields}", line))
            continue
        try:
            vals: dict = {}
            for col, i in mapped.items():
                kind = _STEP_FIELDS[col][1]
                cell = _cell(row[i])
                if col in required and cell is None:
                    raise _BadValue(f"missing {names[i]} value")
                vals[col] = cell if kind == "text" else (_us(cell, names[i]) if kind == "us" else _int(cell, names[i]))
            rtype = "rank" if per_rank else vals["type"].lower()
            rank = None
            if rtype == "rank" and not per_rank:
                rank = _int(vals["index"], "Index (rank id)")
        except _BadValue as exc:
            drops.append((str(exc), line))
            continue
        kept += 1
        cols["source_id"].append(ctx.source_id)
        cols["line_no"].append(line)
        cols["step_id"].append(_step_id(vals.get("step")))
        cols["rank"].append(rank)
        vals["type"] = rtype
        for col in _STEP_FIELDS:
            cols[col].append(vals.get(col))

    if kept:
        _insert(ctx, "step_trace_rows", pa.table(cols, schema=_step_schema()))
    n_dropped = len(drops)
    drop_entries = _drop_list(drops, "line")
    message = ""
    if kept + n_dropped == 0:
        message = "header only: no step trace rows"
    elif n_dropped:
        message = f"{n_dropped} of {kept + n_dropped} rows dropped (first: {drops[0][0]}, line {drops[0][1]})"
    ranks = sorted({r for r in cols["rank"] if r is not None})
    metadata = {
        "columns": len(names),
        "has_preparing": "preparing_us" in mapped,
        "has_parallel_index": any(c in mapped for c in ("dp_index", "pp_index", "tp_index")),
        "rank_rows": sum(1 for t in cols["type"] if t == "rank"),
        "stage_rows": sum(1 for t in cols["type"] if t == "stage"),
        "ranks": len(ranks),
        "steps": len(set(cols["step"])),
        "extra_columns": [n for i, n in enumerate(names) if i not in set(mapped.values())],
    }
    return Outcome(
        rows_seen=kept + n_dropped,
        rows_kept=kept,
        rows_dropped=n_dropped,
        status="salvaged" if n_dropped else "ok",
        message=message,
        drops=drop_entries,
        metadata=metadata,
    )


# ---------------------------------------------------------------------------------------------
# cluster_communication.json

# A top-level key like "(0, 1)" (also "()" and "(3,)"), or msprof-analyze's "p2p" / "collective"
# group of all point-to-point / collective ops, then, in the head, a leaf's time block.
_RANK_SET = r"\(\s*(?:[0-9]+\s*(?:,\s*[0-9]+\s*)*,?\s*)?\)"
_COMM_TYPES = ("p2p", "collective")
_RANK_SET_KEY = re.compile(rb'\{\s*"(?:' + _RANK_SET.encode() + rb'|p2p|collective)"\s*:')
_RANK_SET_RE = re.compile(_RANK_SET)
# The per-rank communication.json of the Ascend PyTorch Profiler: {step: {"collective"|"p2p": {op: leaf}}}
_PER_RANK_KEY = re.compile(rb'\{\s*"[^"]{0,200}"\s*:\s*\{\s*"(?:p2p|collective)"\s*:')
_TIME_INFO = "Communication Time Info"
_BANDWIDTH_INFO = "Communication Bandwidth Info"
_TOTAL_OP = "Total Op Info"

# comm_summary_rows column -> accepted key names in "Communication Time Info"
_TIME_FIELDS: dict[str, tuple[str, ...]] = {
    "start_us": ("Start Timestamp(us)",),
    "elapse_ms": ("Elapse Time(ms)", "Elapsed Time(ms)"),
    "transit_ms": ("Transit Time(ms)",),
    "wait_ms": ("Wait Time(ms)",),
    "sync_ms": ("Synchronization Time(ms)",),
    "idle_ms": ("Idle Time(ms)",),
    "wait_ratio": ("Wait Time Ratio",),
    "sync_ratio": ("Synchronization Time Ratio",),
}
_LINKS = ("RDMA", "HCCS", "PCIE", "SDMA")
# suffix -> key in a link block
_LINK_FIELDS: dict[str, tuple[str, ...]] = {
    "transit_mb": ("Transit Size(MB)",),
    "transit_ms": ("Transit Time(ms)",),
    "bandwidth_gbps": ("Bandwidth(GB/s)",),
    "large_packet_ratio": ("Large Packet Ratio",),
}
_SIZE_DISTRIBUTION = "Size Distribution"


@functools.cache
def _comm_schema():
    return pa.schema(
        [
            ("source_id", pa.int32()),
            ("rank_set_id", pa.int32()),
            ("step", pa.string()),
            ("step_id", pa.int32()),
            ("op_name", pa.string()),
            ("group_name", pa.string()),
            ("rank", pa.int32()),
        ]
        + [(c, pa.float64()) for c in _TIME_FIELDS]
        + [(f"{link.lower()}_{suffix}", pa.float64()) for link in _LINKS for suffix in _LINK_FIELDS]
        + [("size_distribution", pa.string()), ("other_links", pa.string()), ("comm_type", pa.string())]
    )


def _lookup(block: dict, aliases: tuple[str, ...]):
    """(found, value) of the first alias present, matching names loosely."""
    for a in aliases:
        if a in block:
            return True, block[a]
    norm = {_norm(k): k for k in block}
    for a in aliases:
        k = norm.get(_norm(a))
        if k is not None:
            return True, block[k]
    return False, None


def _number(value, what: str) -> float | None:
    """A JSON number as float; None for null (and NaN / Infinity, read as null)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _BadValue(f"{what} is {_kind(value)} ({json.dumps(value)[:40]}), not a number")
    v = float(value)
    return v if math.isfinite(v) else None


def _load_json(path: Path) -> tuple[object, bool]:
    """The document, and whether it needed the lenient parser (NaN / Infinity read as null)."""
    with open_bytes(path) as f:
        data = f.read()
    try:
        return orjson.loads(data), False
    except orjson.JSONDecodeError as exc:
        first = exc
    # Python's json.dump (which msprof-analyze uses) writes NaN / Infinity for float NaN / inf.
    try:
        return json.loads(data.decode("utf-8-sig"), parse_constant=lambda _c: None), True
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InputError(
            path,
            f"not valid JSON ({first})",
            position=f"byte {getattr(first, 'pos', '?')}",
            hint="the file is cut or corrupt: re-run the profiler analysis (or msprof-analyze cluster) to write it again",
        ) from None


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def _shape_error(path: Path, where: str, found, expected: str) -> InputError:
    kind = _kind(found)
    return InputError(
        path,
        f"{expected}, found {kind}",
        position="document" if where == "document" else f"key {where}",
        hint='expected msprof-analyze\'s cluster_communication.json: {"(rank set)": {step: '
        '{"op@group": {rank: {"Communication Time Info": {...}, '
        '"Communication Bandwidth Info": {...}}}}}}',
    )


def _comm_row(info: dict, out: dict) -> None:
    """Fill one row's value columns from a rank leaf; raises _BadValue."""
    time_info = info.get(_TIME_INFO)
    if not isinstance(time_info, dict):
        raise _BadValue(f'no "{_TIME_INFO}" object' if time_info is None else f'"{_TIME_INFO}" is not an object')
    for col, aliases in _TIME_FIELDS.items():
        _found, v = _lookup(time_info, aliases)
        out[col] = _number(v, f"{aliases[0]}")
    bw = info.get(_BANDWIDTH_INFO)
    if bw is not None and not isinstance(bw, dict):
        raise _BadValue(f'"{_BANDWIDTH_INFO}" is not an object')
    sizes: dict = {}
    others: dict = {}
    for link, block in (bw or {}).items():
        name = link.strip().upper()
        if name not in _LINKS:
            others[link] = block
            continue
        if not isinstance(block, dict):
            raise _BadValue(f"{link} bandwidth block is not an object")
        found_bw = False
        for suffix, aliases in _LINK_FIELDS.items():
            found, v = _lookup(block, aliases)
            found_bw |= found and suffix == "bandwidth_gbps"
            out[f"{name.lower()}_{suffix}"] = _number(v, f"{link} {aliases[0]}")
        # The profiler's "Total Op Info" link blocks carry size and time but no bandwidth: it is
        # size / time (MB / ms = GB/s, the profiler's own definition).
        size, ms = out[f"{name.lower()}_transit_mb"], out[f"{name.lower()}_transit_ms"]
        if not found_bw and size is not None and ms:
            out[f"{name.lower()}_bandwidth_gbps"] = round(size / ms, 4)
        dist = block.get(_SIZE_DISTRIBUTION)
        if dist:
            sizes[link] = dist
    out["size_distribution"] = orjson.dumps(sizes).decode() if sizes else None
    out["other_links"] = orjson.dumps(others).decode() if others else None


def _comm_leaves(path: Path, doc: dict, per_rank: bool):
    """(rank_set, comm_type, step, op key, rank key, leaf, where) for every leaf of either layout:
    cluster ``{rank set | "p2p": {step: {op: {rank: leaf}}}}`` or per-rank
    ``{step: {"collective" | "p2p": {op: leaf}}}`` (rank set and rank key None: the file's rank)."""
    for top, level1 in doc.items():
        if per_rank:
            step = top
            if not isinstance(level1, dict):
                raise _shape_error(path, step, level1, 'an object keyed by "collective" / "p2p"')
            for ctype, ops in level1.items():
                if not isinstance(ops, dict):
                    raise _shape_error(path, f"{step} / {ctype}", ops, "an object keyed by communication op")
                for op, leaf in ops.items():
                    yield None, ctype, step, op, None, leaf, f"{step} / {ctype} / {op}"
            continue
        rank_set = top
        if not (_RANK_SET_RE.fullmatch(rank_set.strip()) or rank_set.strip() in _COMM_TYPES):
            raise InputError(
                path,
                f'top-level key {rank_set[:60]!r} is not a rank set like "(0, 1)" or "p2p"',
                position="document",
                hint="this is not an msprof-analyze cluster_communication.json",
            )
        # "p2p" (and "collective") hold every rank's ops of that kind; a rank-set key is a
        # collective communication domain.
        ctype = rank_set.strip() if rank_set.strip() in _COMM_TYPES else "collective"
        if not isinstance(level1, dict):
            raise _shape_error(path, rank_set, level1, "an object keyed by step")
        for step, ops in level1.items():
            if not isinstance(ops, dict):
                raise _shape_error(path, f"{rank_set} / {step}", ops, "an object keyed by communication op")
            for op, ranks in ops.items():
                where = f"{rank_set} / {step} / {op}"
                if not isinstance(ranks, dict):
                    raise _shape_error(path, where, ranks, "an object keyed by rank")
                for rank_key, leaf in ranks.items():
                    yield rank_set, ctype, step, op, rank_key, leaf, f"{where} / {rank_key}"


def _ingest_communication(ctx: Context) -> Outcome:
    """cluster_communication.json (format cluster_communication) or one rank's communication.json
    (format communication: rank NULL in the rows, the view takes the file's rank)."""
    path = ctx.path
    per_rank = ctx.format == "communication"
    doc, lenient = _load_json(path)
    if not isinstance(doc, dict):
        raise _shape_error(
            path,
            "document",
            doc,
            "a JSON object keyed by step" if per_rank else 'a JSON object keyed by rank sets like "(0, 1)"',
        )
    cols: dict[str, list] = {f.name: [] for f in _comm_schema()}
    value_cols = [f.name for f in _comm_schema()][7:-1]
    rank_sets = RankSets()
    drops: list[tuple[str, str]] = []
    kept = 0
    for rank_set, ctype, step, op, rank_key, info, where in _comm_leaves(path, doc, per_rank):
        if not isinstance(info, dict):
            raise _shape_error(path, where, info, f'an object with "{_TIME_INFO}" and "{_BANDWIDTH_INFO}"')
        op_name, sep, group = op.rpartition("@")
        if not sep:
            op_name, group = op, None
        row: dict = {}
        try:
            rank = None if rank_key is None else _int(rank_key.strip(), "rank key")
            _comm_row(info, row)
        except _BadValue as exc:
            drops.append((str(exc), where))
            continue
        kept += 1
        cols["source_id"].append(ctx.source_id)
        cols["rank_set_id"].append(rank_sets.id(rank_set))
        cols["step"].append(step)
        cols["step_id"].append(_step_id(step))
        cols["op_name"].append(op_name)
        cols["group_name"].append(group)
        cols["rank"].append(rank)
        cols["comm_type"].append(ctype)
        for c in value_cols:
            cols[c].append(row.get(c))
    n_dropped = len(drops)
    if n_dropped and not kept:
        raise InputError(
            path,
            f"no usable communication entry: {drops[0][0]}",
            position=f"key {drops[0][1]}",
            hint='each rank entry needs a "Communication Time Info" object of numbers',
        )
    if kept:
        rank_sets.insert(ctx)
        _insert(ctx, "comm_summary_rows", pa.table(cols, schema=_comm_schema()))
    message = "" if kept else "no communication entries"
    if n_dropped:
        message = f"{n_dropped} of {kept + n_dropped} entries dropped (first: {drops[0][0]}, key {drops[0][1]})"
    if lenient:
        message = (message + "; " if message else "") + "NaN / Infinity values read as NULL"
    metadata = {
        "rank_sets": len(rank_sets.ids),
        "steps": len(set(cols["step"])),
        "ops": len({(o, g) for o, g in zip(cols["op_name"], cols["group_name"]) if o != _TOTAL_OP}),
        "ranks": len({r for r in cols["rank"] if r is not None}),
        "has_total_op_info": _TOTAL_OP in cols["op_name"],
        "nan_as_null": lenient,
    }
    return Outcome(
        rows_seen=kept + n_dropped,
        rows_kept=kept,
        rows_dropped=n_dropped,
        status="salvaged" if n_dropped else "ok",
        message=message,
        drops=_drop_list(drops, "key"),
        metadata=metadata,
    )


class ClusterAnalysisReader:
    """Reader for msprof-analyze's cluster_step_trace_time.csv and cluster_communication.json."""

    name = "cluster_analysis"

    def sniff(self, path: Path, head: bytes) -> str | None:
        body = strip_bom(head).lstrip()
        if body.startswith(b"{"):
            if b'"' + _TIME_INFO.encode() + b'"' not in body:
                return None
            if _RANK_SET_KEY.match(body):
                return "cluster_communication"
            if _PER_RANK_KEY.match(body):
                return "communication"
            return None
        names = _parse_header(_first_line(head))
        if not names:
            return None
        if _is_step_header(names):
            return "cluster_step"
        return "step_trace" if _is_rank_step_header(names) else None

    def ingest(self, ctx: Context) -> Outcome:
        if ctx.format in ("cluster_step", "step_trace"):
            return _ingest_step_trace(ctx)
        if ctx.format in ("cluster_communication", "communication"):
            return _ingest_communication(ctx)
        raise InputError(ctx.path, f"unknown cluster-analysis format {ctx.format!r}")


READER = ClusterAnalysisReader()
