"""The first screen of a diagnosis as markdown, for a ticket or a pull request: the same view as
the terminal (``view.Screen``), nothing cut (a page scrolls), the lists folded the same way."""

from __future__ import annotations

from .picture import PLAIN, bar_lines
from .terminal import header_line


def cell(text) -> str:
    """A table cell: pipes escaped, no line breaks."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def screen(sc) -> str:
    """The diagnosis ``sc`` (``view.Screen``) as a markdown section."""
    out = [f"### {header_line(sc, 10**6)}: {sc.status}", "", f"**{sc.headline}**", ""]
    for card in sc.cards:
        cost = card.cost()
        out.append(f"#### {card.card} — {card.causes} ({card.level}{', costs ' + cost if cost else ''})")
        out.append("")
        out += [f"- {line}" for line in card.evidence]
        out += [f"- why: {line}" for line in card.why]
        if card.why_quiet:
            out.append("- also checked: " + ", ".join(f"`{q}` {s}" for q, s in card.why_quiet))
        if card.why_note:
            out.append(f"- why: {card.why_note}")
        if card.next_step:
            out.append(f"- **next:** {card.next_step}")
        out += [f"- from `{card.query}`", ""]
    if not sc.cards:
        out += [f"- {line}" for line in sc.resting]
        if sc.conclusion.get("next_step"):
            out.append(f"- **next:** {sc.conclusion['next_step']}")
        out.append("")
    if sc.bars is not None and sc.bars.rows:
        out += ["```text", *bar_lines(sc.bars, 100, PLAIN), "```", ""]
    if sc.findings or sc.errors:
        out += ["| level | query | subject | cause | cost |", "|---|---|---|---|---|"]
        out += [
            f"| {f.level} | `{f.query}` | {cell(f.label)} | {cell(f.causes)} | {cell(f.cost)} |" for f in sc.findings
        ]
        out += [
            f"| ERROR | `{cell(e.split(':', 1)[0])}` | | {cell(e.split(':', 1)[-1].strip())} | |" for e in sc.errors
        ]
        out.append("")
    quiet = []
    if sc.passed:
        quiet.append(f"PASS {len(sc.passed)}: " + ", ".join(f"`{q}`" for q in sc.passed))
    if sc.info:
        quiet.append(f"INFO {len(sc.info)}: " + ", ".join(f"`{q}`" for q in sc.info))
    out += [f"- {q}" for q in quiet]
    for g in sc.skips:
        out.append(f"- SKIP {len(g.queries)}, would run with {g.need}: " + ", ".join(f"`{q}`" for q in g.queries))
    out += ["", "`" + " ".join(f"{k}={v}" for k, v in sc.totals.items()) + f" TOTAL={sc.total}`"]
    return "\n".join(out)
