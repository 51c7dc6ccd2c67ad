"""The renderers: what a reader sees, drawn from what the library built (``slowcard.view.Screen``,
query results, comparisons). One module per medium:

- ``terminal``: the first screen of `slowcard diagnose` (and its ``-v`` form), watch lines,
  `slowcard compare`;
- ``picture``: the small bar picture (MoE time per rank, requests per DP domain) in text;
- ``tables``: query result tables (headline columns, ``--wide``, markdown), fitted to a width;
- ``markdown``: the first screen as markdown, for tickets;
- ``html``: the HTML report (first screen on top, figures, live metrics).

Renderers return strings: they never print, never run queries of their own (the HTML report
completes missing results through the catalog), and never import the package front
(``slowcard/__init__``). This module holds the text helpers they share.
"""

from __future__ import annotations

import textwrap

ELLIPSIS = "…"


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in "…" when cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + ELLIPSIS


def wrap(text: str, width: int, indent: str = "", first: str = "", lines: int | None = None) -> list[str]:
    """``text`` broken at spaces into lines of at most ``width`` characters: the first starts
    with ``first``, the others with ``indent``; at most ``lines`` lines (the last ending in "…")."""
    out = textwrap.wrap(
        text,
        width=max(width, len(first) + 10),
        initial_indent=first,
        subsequent_indent=indent,
        break_long_words=True,
        break_on_hyphens=False,
    ) or [first.rstrip()]
    if lines is not None and len(out) > lines:
        out = out[:lines]
        last = out[-1]
        out[-1] = last + " " + ELLIPSIS if len(last) + 2 <= width else last[: width - 1] + ELLIPSIS
    return out
