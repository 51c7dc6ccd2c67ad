"""One-command diagnosis: run every query whose tables are present, in the order the guides
follow, and draw ONE conclusion from their verdicts.

Order (methodology.md): is the slowdown in MoE / in one DP domain (breakdowns, reports)?
is it persistent and where (waits, hot spots)? why (the verdict queries)? The conclusion is taken
from the most specific failing verdict: ep-hot-chain (hot expert, hot rank and slow operator
coincide) before ep-slow-rank, then dp-imbalance, cluster-step-skew (msprof-analyze step
trace), expert-hotspots, eplb-effect, and stragglers
from rank-waits. Pure library code: no printing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import queries as queries_mod
from .verdict import fmt_value

# The order queries run in: overview first, then the verdicts that explain.
ORDER = (
    "moe-layer-durations", "moe-breakdown", "dp-report", "dp-batch",
    "clock-offsets", "rank-waits", "sync-gaps",
    "expert-hotspots", "eplb-effect", "eplb-whatif",
    "ep-slow-rank", "ep-hot-chain", "dp-imbalance", "dp-metrics-imbalance", "cluster-step-skew",
)
# Which verdict speaks first when several fail (most specific evidence first).
PRIORITY = ("ep-hot-chain", "ep-slow-rank", "dp-imbalance", "dp-metrics-imbalance", "cluster-step-skew", "expert-hotspots",
            "eplb-effect", "rank-waits")
# How each verdict query names its finding.
SUBJECT = {
    "ep-hot-chain": ("rank", "EP rank"),
    "ep-slow-rank": ("rank", "rank"),
    "dp-imbalance": ("dp_rank", "DP domain"),
    "dp-metrics-imbalance": ("dp_rank", "DP domain"),
    "cluster-step-skew": ("suspect_rank", "rank"),
    "expert-hotspots": ("rank", "rank"),
    "rank-waits": ("rank", "rank"),
}


@dataclass
class Diagnosis:
    run: str
    results: dict = field(default_factory=dict)       # query name -> Result, in ORDER
    conclusion: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        statuses = {r.status for r in self.results.values()}
        for s in ("ERROR", "FAIL", "WARN", "PASS", "INFO", "SKIP"):
            if s in statuses:
                return s
        return "SKIP"

    def to_dict(self) -> dict:
        return {"run": self.run, "status": self.status, "conclusion": self.conclusion,
                "results": [r.to_dict() for r in self.results.values()]}


def ordered(catalog: dict) -> list:
    known = [catalog[n] for n in ORDER if n in catalog]
    rest = [q for n, q in sorted(catalog.items()) if n not in ORDER]
    return known + rest


def diagnose(con, run: str, catalog: dict | None = None, params: dict | None = None) -> Diagnosis:
    """Run the catalog on one run and conclude. ``params`` maps query name -> its parameters."""
    catalog = catalog or queries_mod.load_catalog()
    diag = Diagnosis(run=run)
    for q in ordered(catalog):
        diag.results[q.name] = queries_mod.run_query(con, q, run, (params or {}).get(q.name))
    diag.conclusion = conclude(diag.results)
    return diag


def _subject(name: str, row: dict) -> str:
    col, label = SUBJECT.get(name, (None, None))
    parts = []
    if col and row.get(col) is not None:
        parts.append(f"{label} {row[col]}")
    for extra in ("expert", "layer"):
        if extra in row and row[extra] is not None and name in ("ep-hot-chain", "expert-hotspots"):
            parts.append(f"{extra} {row[extra]}")
    return ", ".join(parts) or name


def conclude(results: dict) -> dict:
    """The headline: which card is slow, why, the numbers, and what to do next."""
    for level in ("FAIL", "WARN"):
        for name in PRIORITY:
            res = results.get(name)
            if res is None or res.status != level or not res.rows:
                continue
            flagged = res.rows if name != "rank-waits" else [r for r in res.rows if r.get("straggler")]
            if not flagged:
                continue
            first = flagged[0]
            cards = list(dict.fromkeys(_subject(name, r) for r in flagged))   # one card, several rows
            cause = first.get("cause") or first.get("finding") or ("straggler" if name == "rank-waits" else "hot spot")
            skip = {SUBJECT.get(name, ("", ""))[0], "cause", "finding", "next_step", "subject"}
            numbers = ", ".join(f"{k}={fmt_value(v)}" for k, v in first.items()
                                if k not in skip and v != "" and not isinstance(v, (dict, list)))
            return {
                "status": level,
                "headline": f"Slow card: {'; '.join(cards)} — {cause}",
                "slow_cards": cards,
                "cause": cause,
                "evidence": numbers,
                "summary": res.summary,
                "next_step": first.get("next_step") or _default_next(name),
                "query": f"{res.query}@v{res.version}",
            }
    ran = [r for r in results.values() if r.status not in ("SKIP", "ERROR")]
    errors = [f"{r.query}: {r.summary}" for r in results.values() if r.status == "ERROR"]
    if not ran:
        return {"status": "SKIP", "headline": "Nothing to diagnose: no query found its tables in this run",
                "slow_cards": [], "cause": None, "evidence": "; ".join(errors),
                "next_step": "ingest traces (Kineto / Ascend), operator CSVs, service CSVs or expert data",
                "query": None}
    return {"status": "PASS", "headline": "No slow card: no verdict query flags a rank, DP domain or expert",
            "slow_cards": [], "cause": None,
            "evidence": "; ".join(f"{r.query}@v{r.version} {r.status}" for r in ran if r.query in PRIORITY),
            "next_step": "if the service is still slow, look outside MoE/DP balance (host overhead, "
                         "scheduling, memory) — see moe-breakdown and sync-gaps",
            "query": None}


def _default_next(name: str) -> str:
    return {
        "rank-waits": "the others wait for this rank at collectives: see ep-slow-rank and moe-breakdown for why",
        "expert-hotspots": "check the expert map / EPLB placement of the hot experts (eplb-effect, eplb-whatif)",
        "eplb-effect": "the EPLB update did not reduce imbalance: check the EPLB config and expert mapping",
    }.get(name, "see the query rows")
