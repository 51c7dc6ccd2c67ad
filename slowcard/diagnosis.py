"""One-command diagnosis: run every query whose tables are present, in the order the guides
follow, and draw ONE conclusion from their verdicts.

The order is each query's ``order:`` header (methodology.md: is the slowdown in MoE / in one DP
domain (breakdowns, reports)? is it persistent and where (waits, hot spots)? why (the verdict
queries)?). The conclusion is the slow cards of ``findings.slow_cards``: the most severe verdict,
and among equally severe ones the lowest ``priority:`` (the most specific evidence first).
Pure library code: no printing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import findings as findings_mod
from . import queries as queries_mod
from . import why as why_mod
from .verdict import Status


@dataclass
class Diagnosis:
    run: str
    results: dict = field(default_factory=dict)  # query name -> Result, in ORDER
    conclusion: dict = field(default_factory=dict)
    why: list = field(default_factory=list)  # per slow card, the rows of the why queries about it (why.explain)

    @property
    def status(self) -> Status:
        return Status.worst(r.status for r in self.results.values())

    @property
    def slow_cards(self) -> list:
        """The findings that name the slow cards (``findings.slow_cards``)."""
        return findings_mod.slow_cards(self.results)

    def to_dict(self) -> dict:
        return {
            "run": self.run,
            "status": str(self.status),
            "conclusion": self.conclusion,
            "why": self.why,
            "results": [findings_mod.result_dict(r) for r in self.results.values()],
        }


def ordered(catalog: dict) -> list:
    """The catalog's queries in diagnosis order (``order:`` header, then name)."""
    return sorted(catalog.values(), key=lambda q: (q.order, q.name))


def diagnose(con, run: str, catalog: dict | None = None, params: dict | None = None) -> Diagnosis:
    """Run the catalog on one run and conclude. ``params`` maps query name -> its parameters."""
    catalog = catalog or queries_mod.load_catalog()
    diag = Diagnosis(run=run)
    for q in ordered(catalog):
        diag.results[q.name] = queries_mod.run_query(con, q, run, (params or {}).get(q.name))
    diag.conclusion = conclude(diag.results)
    diag.why = why_mod.explain(diag.results, con, run)
    return diag


def conclude(results: dict) -> dict:
    """The headline: which card is slow, why, the numbers, and what to do next."""
    res, found = findings_mod.speaker(results)
    if res is not None:
        found = findings_mod.by_cost(found)
        first = found[0]
        # one entry per card, each with its own cause and cost (a card with several rows: its
        # first, i.e. costliest, speaks), FAIL before WARN and the costliest first
        cards: dict[str, dict] = {}
        for f in found:
            cards.setdefault(f.label, card_dict(f, res.query, results))
        return {
            "status": str(res.status),
            "headline": ("Slow cards: " if len(cards) > 1 else "Slow card: ") + headline_cards(list(cards.values())),
            "slow_cards": list(cards),
            "cards": list(cards.values()),
            "cause": first.cause or res.query,
            "evidence": findings_mod.evidence(first, [col for col, _ in res.spec.subject]),
            "summary": res.summary,
            "next_step": next_without_passed(first.next_step, results) or "see the query rows",
            "query": f"{res.query}@v{res.version}",
        }
    ran = [r for r in results.values() if r.status not in (Status.SKIP, Status.ERROR)]
    errors = [f"{r.query}: {r.summary}" for r in results.values() if r.status == Status.ERROR]
    if not ran:
        return {
            "status": str(Status.SKIP),
            "headline": "Nothing to diagnose: no query found its tables in this run",
            "slow_cards": [],
            "cause": None,
            "evidence": "; ".join(errors),
            "next_step": "ingest traces (Kineto / Ascend), operator CSVs, service CSVs or expert data",
            "query": None,
        }
    speakers = [r for r in ran if r.spec is not None and r.spec.is_verdict and r.spec.priority is not None]
    if not speakers:
        # reports ran, but no verdict that names a slow card could decide (one rank, one DP
        # domain, no collectives): "no slow card" would be a claim this run cannot back
        return cannot_tell(results)
    # the reports behind the report's figures that have data for this run
    reports = [
        r.query
        for r in ran
        if r.spec is not None and not r.spec.is_verdict and any(s.startswith("report.") for s in r.spec.shows)
    ]
    return {
        "status": str(Status.PASS),
        "headline": "No slow card: no verdict query flags a rank, DP domain or expert",
        "slow_cards": [],
        "cause": None,
        "evidence": "; ".join(f"{r.query}@v{r.version} {r.status}" for r in speakers),
        "next_step": "if the service is still slow, look outside MoE/DP balance (host overhead, "
        "scheduling, memory) — see " + (_and(reports) or "the report queries"),
        "query": None,
    }


def cannot_tell(results: dict) -> dict:
    """The SKIP conclusion of a run whose slow-card verdicts all SKIPped: the headline gives the
    reason of the first one that had data but not enough of it (its own skip_reason, e.g. "1
    rank(s) …; comparing a rank with the median rank needs >= 3"), else says which inputs none
    of them found."""
    skipped = sorted(
        (
            r
            for r in results.values()
            if r.spec is not None and r.spec.is_verdict and r.spec.priority is not None and r.status == Status.SKIP
        ),
        key=lambda r: (r.spec.priority, r.query),
    )
    short = [r for r in skipped if r.rows]  # SKIP from the query's own skip_reason: data, but too little
    first = (short or skipped or [None])[0]
    reason = f"{first.summary} ({first.query})" if first is not None else "no verdict query ran"
    return {
        "status": str(Status.SKIP),
        "headline": "Cannot name a slow card: " + reason,
        "slow_cards": [],
        "cause": None,
        "evidence": "; ".join(f"{r.query}@v{r.version} SKIP: {r.summary}" for r in (short or skipped)),
        "next_step": "compare several cards: ingest the traces of every rank (at least 3), or the service "
        "data / metrics of every DP domain",
        "query": None,
    }


def card_dict(f, query: str, results: dict) -> dict:
    """One slow card of the conclusion: the card, its level, its own cause(s) and cost."""
    return {
        "card": f.label,
        "level": str(f.level),
        "cause": f.cause or query,
        "causes": f.causes or query,
        "cost_ms": f.cost_ms,
        "cost_pct": f.cost_pct,
        "next_step": next_without_passed(f.next_step, results),
    }


# A clause of a next step that ends by pointing at a query: "...; inside its MoE layers, ep-slow-rank"
_POINTER = re.compile(r",\s*([a-z0-9][a-z0-9-]*)\s*\Z")


def next_without_passed(next_step: str | None, results: dict) -> str | None:
    """The next step without its clauses ("; "-separated) that end by pointing at a query which
    PASSed in this diagnosis: they would send the reader to a query that found nothing (issue 42:
    a straggler whose MoE work is normal is not sent to ep-slow-rank when it PASSes). A pointer in
    brackets is part of its sentence and stays; a query not run, or not PASS, keeps its clause."""
    if not next_step:
        return next_step
    kept = []
    for clause in next_step.split("; "):
        m = _POINTER.search(clause)
        res = results.get(m.group(1)) if m else None
        if res is None or res.status != Status.PASS:
            kept.append(clause)
    return "; ".join(kept) if kept else next_step


def headline_cards(cards: list[dict], most: int = 4) -> str:
    """``rank 0 — token-skew (59.9 ms, 63.8 %); rank 5 — slow-compute (…)``: each card with its
    cause(s) and cost. Cards without a cost that share their cause read as one group ("expert 5,
    layer 0; expert 4, layer 1 — hot experts …"), at most ``most`` labels a group."""
    groups: list[tuple[list[str], dict]] = []
    for card in cards:
        if groups and not _costed(card) and groups[-1][1]["causes"] == card["causes"] and not _costed(groups[-1][1]):
            groups[-1][0].append(card["card"])
        else:
            groups.append(([card["card"]], card))
    out = []
    for labels, card in groups:
        shown = "; ".join(labels[:most]) + (f" (+{len(labels) - most} more)" if len(labels) > most else "")
        cost = []
        if card["cost_ms"] is not None:
            cost.append(f"{card['cost_ms']:.3g} ms")
        if card["cost_pct"] is not None:
            cost.append(f"{card['cost_pct']:.3g} %")
        out.append(f"{shown} — {card['causes']}" + (f" ({', '.join(cost)})" if cost else ""))
    return "; ".join(out)


def _costed(card: dict) -> bool:
    return card["cost_ms"] is not None or card["cost_pct"] is not None


def _and(items: list[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    return " and ".join([", ".join(items[:-1]), items[-1]]) if len(items) > 1 else "".join(items)
