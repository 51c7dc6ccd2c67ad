"""Query results as tables for people: `slowcard query` (table and markdown), `slowcard list`.

By default a table shows what answers the question: the subject columns, ``level``, ``cause``,
``cost_ms``, ``cost_pct`` (those the query returns) and the columns its ``headline:`` header
names; ``wide`` shows every column. Headers carry units on a line of their own (``cost`` over
``[ms]``). A table is fitted to the width: long text cells are cut ("…"), and when even that
is not enough the last columns are left out with a note (never a wrapped row).
"""

from __future__ import annotations

from .. import verdict
from ..view import UNITS
from . import clip, wrap

STANDARD = ("level", "cause", "finding", "cost_ms", "cost_pct")
MIN_TEXT = 8  # a text column is never cut narrower than this
MAX_CELL = 60  # nor shown wider (the JSON and --wide carry it whole)


def split_unit(column: str) -> tuple[str, str]:
    """(name, unit) of a column: ``cost_ms`` -> ("cost", "ms"), ``gmm_us_per_layer`` ->
    ("gmm_per_layer", "us"), ``requests_per_s`` -> ("requests", "/s"), ``rank`` -> ("rank", "")."""
    parts = column.split("_")
    for i, p in enumerate(parts[1:], start=1):
        if p in UNITS:
            if parts[i - 1] == "per" and i >= 2:  # requests_per_s -> ("requests", "/s")
                return "_".join(parts[: i - 1] + parts[i + 1 :]), "/" + UNITS[p]
            return "_".join(parts[:i] + parts[i + 1 :]), UNITS[p]
    return column, ""


def fmt_cell(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, dict):
        return ", ".join(f"{k}:{verdict.fmt_value(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(verdict.fmt_value(x) for x in v)
    if isinstance(v, float):
        return verdict.fmt_value(v)
    return str(v)


def _numeric(values: list) -> bool:
    present = [v for v in values if v is not None]
    return bool(present) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present)


def default_columns(res, wide: bool = False) -> list[str]:
    """The columns a table of ``res`` shows (see the module docstring)."""
    cols = list(res.columns)
    if verdict.pass_rows(res.rows) or verdict.skip_reason(res.rows) is not None:
        # what a PASS rests on, or why a SKIP: a few columns of a finding's many; show those
        return [c for c in cols if any(r.get(c) is not None for r in res.rows)]
    spec = getattr(res, "spec", None)
    if wide or spec is None or not spec.headline:
        return cols
    chosen = [col for col, _ in spec.subject] + list(STANDARD) + spec.headline_columns
    return [c for c in dict.fromkeys(chosen) if c in cols]


def _header_lines(name: str, width: int) -> list[str]:
    """A column name on one line, or on two (broken at an underscore) when it is much wider than
    its values: ``transfer_per_layer`` over 3-digit numbers reads as ``transfer_per`` / ``_layer``."""
    if len(name) <= max(width, 10) or "_" not in name:
        return [name]
    cuts = [i for i, ch in enumerate(name) if ch == "_"]
    best = min(cuts, key=lambda i: max(i, len(name) - i))
    return [name[:best], name[best:]]


def table(
    cols: list[str], rows: list[dict], width: int | None = 100, units: bool = True, min_text: int = MIN_TEXT
) -> tuple[list[str], int]:
    """(lines, columns left out) of a plain-text table of ``rows`` fitted to ``width`` (None:
    nothing cut): header lines (a long name broken in two, then the units), a rule, the rows.
    Text columns are cut down to ``min_text`` characters before the last columns are left out."""
    cells = [[fmt_cell(r.get(c)) for c in cols] for r in rows]
    numeric = [_numeric([r.get(c) for r in rows]) for c in cols]
    cap = MAX_CELL if width is not None else 10**6
    natural = [max([0] + [min(len(row[i]), cap) for row in cells]) for i in range(len(cols))]
    heads = []
    for i, c in enumerate(cols):
        name, unit = split_unit(c) if units else (c, "")
        heads.append((_header_lines(name, natural[i]), f"[{unit}]" if unit else ""))
    head_w = [max([len(x) for x in h[0]] + [len(h[1])]) for h in heads]
    widths = [max(n, h) for n, h in zip(natural, head_w)]
    left_out = 0
    if width is not None:
        floor = [w if numeric[i] else min(w, max(min_text, head_w[i])) for i, w in enumerate(widths)]
        while len(widths) > 1 and sum(floor) + 2 * (len(floor) - 1) > width:
            for lst in (widths, floor, heads, numeric, cols):
                lst.pop()
            left_out += 1
        over = sum(widths) + 2 * (len(widths) - 1) - width
        while over > 0:  # cut the widest text column that still can give
            give = [i for i in range(len(widths)) if widths[i] > floor[i]]
            if not give:
                break
            i = max(give, key=lambda k: widths[k])
            cut = min(over, widths[i] - floor[i])
            widths[i] -= cut
            over -= cut
        for row in cells:
            del row[len(widths) :]

    def line(values: list[str]) -> str:
        out = []
        for i, v in enumerate(values):
            v = clip(v, widths[i])
            out.append(v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]))
        return "  ".join(out).rstrip()

    depth = max(len(h[0]) for h in heads)
    lines = [
        line(
            [(h[0] + [""] * depth)[k] if len(h[0]) == depth else ([""] * (depth - len(h[0])) + h[0])[k] for h in heads]
        )
        for k in range(depth)
    ]
    if any(h[1] for h in heads):
        lines.append(line([h[1] for h in heads]))
    lines.append("  ".join("-" * w for w in widths))
    lines += [line(row) for row in cells]
    return lines, left_out


def markdown_table(cols: list[str], rows: list[dict]) -> list[str]:
    """A GitHub table: headers ``cost (ms)``, pipes in cells escaped."""

    def esc(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    heads = []
    for c in cols:
        name, unit = split_unit(c)
        heads.append(f"{name} ({unit})" if unit else name)
    numeric = [_numeric([r.get(c) for r in rows]) for c in cols]
    out = ["| " + " | ".join(heads) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    out += ["| " + " | ".join(esc(fmt_cell(r.get(c))) for c in cols) + " |" for r in rows]
    return out


def result_table(res, fmt: str = "table", limit: int = 20, width: int | None = 100, wide: bool = False) -> str:
    """One result: its verdict line, its table (headline columns; ``wide``: all), the parameters."""
    from ..render import safe_field

    head = f"{res.query}@v{res.version} {res.status} [run {safe_field(str(res.run))}]"
    summary = safe_field(res.summary or "")
    shown = (res.rows[:limit] if limit else res.rows) if res.rows else []
    cols = default_columns(res, wide)
    parts: list[str] = []
    if fmt == "markdown":
        parts.append(f"### {head} {summary}")
        if shown:
            parts += markdown_table(cols, [{k: _safe(v) for k, v in r.items()} for r in shown])
    else:
        fit = None if wide else width
        if fit is None:
            parts.append(f"{head} {summary}")
        elif shown and verdict.Status(res.status).flags or res.status == verdict.Status.INFO:
            parts.append(clip(f"{head} {summary}", fit))  # the rows below say it in full
        else:
            parts += wrap(summary, fit, indent="  ", first=head + " ")
        if shown:
            lines, left_out = table(cols, [{k: _safe(v) for k, v in r.items()} for r in shown], fit)
            parts += lines
            hidden = len(res.columns) - len(cols) + left_out
            if hidden and not wide:
                parts.append(f"({hidden} more column{'s' if hidden != 1 else ''}: --wide)")
    if res.rows and len(res.rows) > len(shown):
        parts.append(f"(showing {len(shown)} of {len(res.rows)} rows; --limit 0 shows all)")
    if res.params:
        text = "params: " + " ".join(f"{k}={v}" for k, v in res.params.items())
        parts += [text] if fmt == "markdown" or wide else wrap(text, width or 10**6, indent="  ")
    return "\n".join(parts)


def render_results(results, fmt: str = "table", limit: int = 20, width: int | None = 100, wide: bool = False) -> str:
    """`slowcard query`'s output: a table (or markdown) per result and the totals line; JSON and
    CSV as ``render.render_results`` writes them."""
    from ..render import render_results as machine
    from ..render import totals_line

    if fmt in ("json", "csv"):
        return machine(results, fmt)
    blocks = [result_table(r, fmt, limit, width, wide) for r in results]
    return "\n\n".join(blocks + [totals_line(results)])


def _safe(v):
    """Trace strings in a cell: control characters escaped (a newline must not forge a row)."""
    from ..render import safe_field

    return safe_field(v) if isinstance(v, str) else v


def catalog_table(rows: list[dict], width: int | None = 100, wide: bool = False) -> str:
    """`slowcard list`: the query, version, role, verdict and description (``wide``: every header
    field), fitted to the width."""
    if not rows:
        return ""
    cols = (
        list(rows[0]) if wide else [c for c in ("query", "version", "role", "verdict", "description") if c in rows[0]]
    )
    lines, _ = table(cols, rows, None if wide else width, units=False)
    return "\n".join(lines)
