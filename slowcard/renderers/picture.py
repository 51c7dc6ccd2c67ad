"""The small picture in text: one bar per rank (or DP domain), split into its parts, the slow
card marked. Block characters on a terminal, plain ASCII characters otherwise (a file, a pipe, a
ticket): the caller decides (``Style``). Colour is added afterwards, to text already made safe
(``terminal.colour``), never here.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import clip

ASCII = ("#", "=", "~", ".")
BLOCKS = ("█", "▓", "░", "─")


@dataclass(frozen=True)
class Style:
    """How text may be drawn: ``unicode`` block characters (a terminal) or ASCII."""

    unicode: bool = False


PLAIN = Style()


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _pick(rows: list, most: int) -> list[int]:
    """Indices of the rows to draw when there are more than ``most``: the marked ones, then the
    largest and smallest totals in turn, in their original order."""
    if len(rows) <= most:
        return list(range(len(rows)))
    keep = [i for i, r in enumerate(rows) if r.mark][:most]
    order = sorted(range(len(rows)), key=lambda i: -rows[i].total)
    lo, hi = len(order) - 1, 0
    while len(keep) < most:
        for i in (order[hi], order[lo]):
            if len(keep) < most and i not in keep:
                keep.append(i)
        hi, lo = hi + 1, lo - 1
    return sorted(keep)


def bar_lines(bars, width: int = 100, style: Style = PLAIN, most: int | None = None) -> list[str]:
    """The picture as lines of at most ``width`` characters: a title with the legend, then one
    bar per row (at most ``most``, the rest folded into "(N more: -v)")."""
    if bars is None or not bars.rows:
        return []
    chars = BLOCKS if style.unicode else ASCII
    legend = "  ".join(f"{chars[i]} {p}" for i, p in enumerate(bars.parts)) if len(bars.parts) > 1 else ""
    title = f"{bars.title} ({bars.unit})" + (f": {legend}" if legend else "")
    src = f"  ({bars.source})"
    lines = [title + src if len(title) + len(src) <= width else clip(title, width)]
    shown = _pick(bars.rows, most) if most is not None else list(range(len(bars.rows)))
    label_w = max(len(r.label) for r in bars.rows)
    num_w = max(len(_fmt(r.total)) for r in bars.rows)
    mark_w = min(max((len(r.mark) + 2 for r in bars.rows if r.mark), default=0), 34)
    bar_w = max(min(width - 2 - label_w - 1 - 1 - num_w - mark_w - 1, 50), 10)
    top = max((r.total for r in bars.rows), default=0.0) or 1.0
    for i in shown:
        r = bars.rows[i]
        cells = []
        done = 0
        acc = 0.0
        for k, v in enumerate(r.values):
            acc += v
            end = round(acc / top * bar_w)
            n = max(end - done, 0)
            cells.append(chars[k % len(chars)] * n)
            done += n
        bar = "".join(cells) + " " * (bar_w - done)
        mark = ""
        if r.mark:
            mark = " " + clip("< " + r.mark, mark_w)
        lines.append(f"  {r.label:<{label_w}} {bar} {_fmt(r.total):>{num_w}}{mark}")
    if len(shown) < len(bars.rows):
        lines.append(f"  ({len(bars.rows) - len(shown)} more: -v)")
    return lines
