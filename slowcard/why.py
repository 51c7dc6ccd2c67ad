"""Why is this card slow: the why-analysis of each slow card a verdict names (issue 18).

The analyses are queries whose header says ``shows: why`` (why-op-diff, …): each returns rows
about every rank (a ``rank`` column), each rank compared with the median rank. This module picks,
for each slow card of ``findings.slow_cards``, the rows about that card's ranks: the card's own
rank (EP rank, straggler), or the ranks of a DP domain (``sources.dp_rank``). Read the same way
by ``diagnose`` (text and JSON) and the HTML report. Pure library code: no printing.
"""

from __future__ import annotations

from . import findings as findings_mod
from .verdict import Status, fill

PLACE = "why"
# Row lines shown per (card, query) in text (the JSON carries every row of the card).
LINES = 5


def why_results(results: dict) -> list:
    """The results of the why queries, in diagnosis order."""
    out = [r for r in results.values() if getattr(r, "spec", None) is not None and PLACE in r.spec.shows]
    return sorted(out, key=lambda r: (r.spec.order, r.query))


def card_ranks(finding, con=None, run: str | None = None) -> list[int]:
    """The ranks a slow card stands for: its rank, or the traced ranks of its DP domain."""
    if finding.rank is not None:
        return [finding.rank]
    dp = next((v for kind, v in finding.subject if kind == "dp_rank"), None)
    if dp is None or con is None or run is None:
        return []
    try:
        rows = con.execute(
            "SELECT DISTINCT rank FROM sources WHERE run = ? AND dp_rank = ? AND rank IS NOT NULL ORDER BY rank",
            [run, int(dp)],
        ).fetchall()
    except (TypeError, ValueError):
        return []
    return [int(r[0]) for r in rows]


def _row_line(res, row: dict) -> str:
    spec = res.spec
    if spec.summary:
        return fill(spec.summary, {**res.params, **row})
    return ", ".join(f"{k}={v}" for k, v in row.items() if v is not None)


def explain(results: dict, con=None, run: str | None = None) -> list[dict]:
    """One entry per slow card: {card, cause, query, ranks, note, parts: [{query, status,
    summary, lines, rows}]}; empty when no verdict names a slow card."""
    out: list[dict] = []
    seen: set[str] = set()
    whys = why_results(results)
    for f in findings_mod.slow_cards(results):
        if f.label in seen:
            continue
        seen.add(f.label)
        ranks = card_ranks(f, con, run)
        note = None
        if not ranks:
            note = (
                f"no traced rank belongs to {f.label} in this run: the why-analysis compares ranks' "
                "traces (ingest the profiler traces of its ranks)"
            )
        parts = []
        for res in whys:
            part = {"query": f"{res.query}@v{res.version}", "status": str(res.status), "summary": "", "lines": []}
            if res.status in (Status.SKIP, Status.ERROR):
                part["summary"] = res.summary
                part["rows"] = []
            else:
                rows = [r for r in res.rows if r.get("rank") is not None and int(r["rank"]) in ranks]
                part["rows"] = rows
                part["lines"] = [_row_line(res, r) for r in rows]
                if rows:
                    part["summary"] = part["lines"][0]
                elif res.status == Status.PASS:  # a verdict that found nothing says so itself
                    part["summary"] = res.summary
                else:
                    part["summary"] = (
                        f"nothing on {', '.join(f'rank {r}' for r in ranks)} stands out against the median rank"
                        if ranks
                        else "no rank to look at"
                    )
            parts.append(part)
        out.append({"card": f.label, "cause": f.causes, "query": f.ref, "ranks": ranks, "note": note, "parts": parts})
    return out


def text(why: list[dict], limit: int = LINES) -> list[str]:
    """The why-section as text lines (for `slowcard diagnose`)."""
    lines: list[str] = []
    for card in why:
        lines.append(f"Why is {card['card']} slow ({card['cause'] or card['query']}):")
        if card["note"]:
            lines.append(f"   {card['note']}")
        if not card["parts"]:
            lines.append("   no why-analysis query in the catalog")
        for part in card["parts"]:
            if part["lines"]:
                lines.append(f"   {part['query']}:")
                lines += [f"     - {line}" for line in part["lines"][:limit]]
                if len(part["lines"]) > limit:
                    lines.append(f"     (+{len(part['lines']) - limit} more)")
            else:
                lines.append(f"   {part['query']} {part['status']}: {part['summary']}")
    return lines
