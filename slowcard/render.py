"""Machine formats and the escaping every output line passes: JSON (the contract), CSV, the
per-file ingest table and the totals line. The screens for people are in ``renderers/``. Pure:
returns strings."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from datetime import date, datetime
from decimal import Decimal

from .verdict import Status


def tabulate(*args, **kwargs) -> str:
    """tabulate.tabulate, imported on first use (it and wcwidth cost ~15 ms at every start)."""
    from tabulate import tabulate as _tabulate

    return _tabulate(*args, **kwargs)


FORMATS = ("table", "json", "csv", "markdown")

# Characters that a terminal acts on instead of showing: C0 controls (newline included: one
# name must not print as two lines), DEL, C1 controls (CSI 0x9b…), the bidi overrides that
# reorder what is shown, and lone surrogates (a file name that is not UTF-8: Python keeps each
# undecodable byte as U+DC80..U+DCFF, which no terminal or JSON reader can take). File, host and
# run names, server answers and messages can hold them; printed raw they set titles,
# hyperlinks, colours, clear lines or forge whole lines (issues 16 and 31).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]|\r(?!\n)")


def _escape(m: re.Match) -> str:
    code = ord(m.group())
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte of an OS name, shown as that byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def safe_field(text: str) -> str:
    """The one escaping rule for anything from outside (names, paths, messages, server
    answers) put into a printed line: every control character, newlines included, becomes
    ``\\uXXXX`` (an undecodable byte of an OS name ``\\xNN``), so one value is one line and
    never a forged one."""
    return _CONTROL.sub(_escape, text)


def terminal_safe(text: str) -> str:
    """Whole output text (the last filter before the terminal): control characters escaped,
    line breaks (LF, CRLF) and tabs kept. Values inside a line are escaped before, by
    ``safe_field``: this filter cannot tell a newline inside a value from the end of a line."""
    return _CONTROL_BUT_LINES.sub(_escape, text)


_NONFINITE_NAMES = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _jsonable(v):
    """A value strict JSON can carry. NaN and +-Infinity become null, and the object holding
    one gets a flag beside it (``"<key>_nonfinite": "Infinity"``): JSON has no such numbers,
    and ``NaN`` in a body breaks strict readers (webhooks, jq)."""
    if isinstance(v, Decimal):
        v = float(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            out[str(k)] = _jsonable(x)
            if isinstance(x, (float, Decimal)) and not math.isfinite(x):
                out[f"{k}_nonfinite"] = _NONFINITE_NAMES[repr(float(x))]
        return out
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, str):
        return _CONTROL_SURROGATE.sub(_escape, v)
    return v


_CONTROL_SURROGATE = re.compile("[\ud800-\udfff]")


def to_json(obj, indent: int | None = 2) -> str:
    """Strict JSON (no NaN / Infinity: see ``_jsonable``)."""
    return json.dumps(_jsonable(obj), indent=indent, ensure_ascii=False, allow_nan=False, default=str)


def _cell(v):
    if isinstance(v, str):
        v = safe_field(v)
    if isinstance(v, str) and len(v) > 120:
        return v[:117] + "..."
    if isinstance(v, dict):
        return ", ".join(f"{k}:{x}" for k, x in v.items())
    return v


def totals_line(results) -> str:
    """``FAIL=1 ERROR=0 WARN=0 PASS=2 INFO=3 SKIP=4 TOTAL=10``: how many results per status,
    worst first (dbt's summary line)."""
    counts = {str(s): 0 for s in Status}
    for r in results:
        counts[str(r.status)] = counts.get(str(r.status), 0) + 1
    return " ".join(f"{k}={v}" for k, v in counts.items()) + f" TOTAL={sum(counts.values())}"


def render_results(results, fmt: str = "json") -> str:
    """Results as JSON (the contract) or CSV (one row per result row). The tables for people
    (table, markdown) are ``renderers.tables.render_results``."""
    if fmt == "json":
        from .findings import result_dict

        return to_json([result_dict(r) for r in results])
    if fmt != "csv":
        raise ValueError(f"render_results: {fmt!r} is not json or csv (tables: renderers.tables)")
    out = io.StringIO()
    w = csv.writer(out)
    cols: list[str] = []
    for r in results:
        cols += [c for c in r.columns if c not in cols]
    w.writerow(["query", "version", "run", "status"] + cols)
    for r in results:
        for row in r.rows:
            w.writerow([r.query, r.version, _csvcell(r.run), r.status] + [_csvcell(row.get(c)) for c in cols])
        if not r.rows:
            w.writerow([r.query, r.version, _csvcell(r.run), r.status] + [""] * len(cols))
    return out.getvalue().rstrip("\n")


def _csvcell(v):
    if v is None:
        return ""
    if isinstance(v, (dict, list)):
        v = json.dumps(_jsonable(v))
    if isinstance(v, str) and v[:1] in _FORMULA_START and not _NUMBER.fullmatch(v):
        # A spreadsheet runs a cell starting with = + - @ (or tab / CR before one) as a formula:
        # a quote makes it text (OWASP CSV injection). Numbers written as text stay as they are.
        return "'" + v
    return v


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def ingest_table(report) -> str:
    """The per-file summary printed at the end of `slowcard ingest`."""
    rows = []
    for f in report.files:
        rows.append(
            [
                safe_field(f.path),
                f.format or "-",
                "NULL" if f.rank is None else f.rank,
                f.rows_kept,
                f.rows_dropped,
                f.status,
                _cell(f.message) if f.message else "",
            ]
        )
    table = tabulate(
        rows, headers=["file", "format", "rank", "kept", "dropped", "status", "message"], tablefmt="simple"
    )
    counts: dict[str, int] = {}
    for f in report.files:
        counts[f.status] = counts.get(f.status, 0) + 1
    tail = f"run {report.run!r} in {report.db_path}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    return "\n".join([table, tail, *(safe_field(n) for n in getattr(report, "notes", []))])
