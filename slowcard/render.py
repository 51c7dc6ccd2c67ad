"""Turning results into text: tables (tabulate), JSON, CSV, Markdown. Pure: returns strings."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from datetime import date, datetime
from decimal import Decimal

from . import verdict
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


def result_table(res, fmt: str = "simple", limit: int = 20) -> str:
    """One result: the verdict line, its table, and the parameters it ran with."""
    head = safe_field(f"{res.query}@v{res.version} {res.status} [run {res.run}] {res.summary}")
    if fmt == "github":
        head = "### " + head
    parts = [head]
    if res.rows:
        shown = res.rows[:limit] if limit else res.rows
        cols = res.columns
        if verdict.pass_rows(res.rows) or verdict.skip_reason(res.rows) is not None:
            # what a PASS rests on, or why a SKIP: a few columns of a finding's many; show those
            cols = [c for c in cols if any(r.get(c) is not None for r in res.rows)]
        table = tabulate(
            [[_cell(r.get(c)) for c in cols] for r in shown],
            headers=cols,
            tablefmt=fmt,
            floatfmt="g",
            missingval="NULL",
        )
        parts.append(table)
        if len(res.rows) > len(shown):
            parts.append(f"(showing {len(shown)} of {len(res.rows)} rows; --limit 0 shows all)")
    if res.params:
        parts.append(safe_field("params: " + " ".join(f"{k}={v}" for k, v in res.params.items())))
    return "\n".join(parts)


def totals_line(results) -> str:
    """``FAIL=1 ERROR=0 WARN=0 PASS=2 INFO=3 SKIP=4``: how many results per status, worst first."""
    counts = {str(s): 0 for s in Status}
    for r in results:
        counts[str(r.status)] = counts.get(str(r.status), 0) + 1
    return " ".join(f"{k}={v}" for k, v in counts.items())


def render_results(results, fmt: str = "table", limit: int = 20) -> str:
    if fmt == "json":
        from .findings import result_dict

        return to_json([result_dict(r) for r in results])
    if fmt == "csv":
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
    tablefmt = "github" if fmt == "markdown" else "simple"
    blocks = [result_table(r, tablefmt, limit) for r in results]
    return "\n\n".join(blocks + [totals_line(results)])


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
    return table + "\n" + safe_field(tail)


def diagnosis_text(diag) -> str:
    """The conclusion first, then one verdict line per query (name@vN STATUS summary)."""
    c = diag.conclusion
    lines = [f"== slowcard diagnosis of run {diag.run!r}: {c.get('status')} ==", c.get("headline", "")]
    if c.get("query"):
        lines.append(f"   evidence ({c['query']}): {c.get('evidence', '')}")
        lines.append(f"   verdict: {c.get('summary', '')}")
    elif c.get("evidence"):
        lines.append(f"   evidence: {c['evidence']}")
    if c.get("next_step"):
        lines.append(f"   next: {c['next_step']}")
    from .why import text as why_text

    lines += why_text(getattr(diag, "why", None) or [])
    lines.append("")
    for r in diag.results.values():
        lines.append(f"{r.query}@v{r.version} {r.status} {r.summary}")
    lines.append(totals_line(diag.results.values()))
    return "\n".join(safe_field(line) for line in lines)


def fmt_num(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def comparison_text(cmp, limit: int = 20) -> str:
    """Verdict changes first, then one side-by-side table per metric query."""
    lines = [
        safe_field(f"== {cmp.run_a} (A) vs {cmp.run_b} (B) =="),
        safe_field(
            f"slow card(s) in A: {'; '.join(cmp.slow_cards_a) or 'none'}; in B: {'; '.join(cmp.slow_cards_b) or 'none'}"
        ),
    ]
    rows = [
        [
            v["query"],
            v["status_a"],
            v["status_b"],
            "; ".join(v["flagged_a"]) or "-",
            "; ".join(v["flagged_b"]) or "-",
            v["note"],
        ]
        for v in cmp.verdicts
    ]
    lines.append(
        tabulate(rows, headers=["verdict", "A", "B", "flagged in A", "flagged in B", "change"], tablefmt="simple")
    )
    for name, block in cmp.metrics.items():
        if not block["rows"]:
            continue
        lines.append("")
        lines.append(f"{name} (A -> B, and B / A where both are numbers)")
        shown = block["rows"][:limit] if limit else block["rows"]
        key = block["key"]
        metrics = list(dict.fromkeys(c[:-2] for r in shown for c in r if c.endswith("_a")))
        table = []
        for r in shown:
            row = [r.get(k) for k in key]
            for m in metrics:
                a, b, ratio = r.get(f"{m}_a"), r.get(f"{m}_b"), r.get(f"{m}_ratio")
                cell = f"{fmt_num(a)} -> {fmt_num(b)}"
                row.append(cell + (f" ({ratio:.2f}x)" if isinstance(ratio, float) and ratio != 1 else ""))
            table.append(row)
        lines.append(tabulate(table, headers=key + metrics, tablefmt="simple", missingval="-"))
    return "\n".join(lines)
