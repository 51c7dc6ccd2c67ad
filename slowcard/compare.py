"""Two runs side by side: the same per-rank / per-layer / per-DP metrics with deltas and ratios,
and which verdicts changed (did the fix remove the slow card?). Runs queries; prints nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import findings as findings_mod
from . import queries as queries_mod
from .verdict import Status

# Columns that identify a row across runs (the first ones a query has are its key).
KEY_COLUMNS = ("rank", "dp_rank", "layer", "expert", "host", "pg", "coll_kind")


@dataclass
class Comparison:
    run_a: str
    run_b: str
    verdicts: list = field(default_factory=list)  # one dict per verdict query
    metrics: dict = field(default_factory=dict)  # query -> {"key": [...], "rows": [...]}
    slow_cards_a: list = field(default_factory=list)  # the run's slow cards (findings.slow_cards)
    slow_cards_b: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "run_a": self.run_a,
            "run_b": self.run_b,
            "slow_cards_a": self.slow_cards_a,
            "slow_cards_b": self.slow_cards_b,
            "verdicts": self.verdicts,
            "metrics": self.metrics,
        }


def _flagged(res) -> list[str]:
    """The findings of a verdict result as short strings ("rank 1 token-skew")."""
    return list(dict.fromkeys(f.short() for f in findings_mod.findings(res)))


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def side_by_side(res_a, res_b) -> dict:
    """Join two results of one report query on their key columns; numeric columns get _a, _b,
    _delta (b - a) and _ratio (b / a)."""
    cols = [c for c in res_a.columns if c in res_b.columns]
    key = [c for c in KEY_COLUMNS if c in cols]
    if not key:
        return {"key": [], "rows": []}
    index_b = {tuple(r.get(k) for k in key): r for r in res_b.rows}
    keys = [tuple(r.get(k) for k in key) for r in res_a.rows]
    keys += [k for k in index_b if k not in set(keys)]
    index_a = {tuple(r.get(k) for k in key): r for r in res_a.rows}
    rows = []
    for k in keys:
        a, b = index_a.get(k, {}), index_b.get(k, {})
        row = dict(zip(key, k))
        for c in cols:
            if c in key:
                continue
            va, vb = a.get(c), b.get(c)
            if _number(va) or _number(vb):
                row[f"{c}_a"], row[f"{c}_b"] = va, vb
                if _number(va) and _number(vb):
                    row[f"{c}_delta"] = round(vb - va, 6)
                    row[f"{c}_ratio"] = round(vb / va, 4) if va else None
        rows.append(row)
    return {"key": key, "rows": rows}


def compare(con, run_a: str, run_b: str, catalog: dict | None = None) -> Comparison:
    catalog = catalog or queries_mod.load_catalog()
    cmp = Comparison(run_a=run_a, run_b=run_b)
    # every verdict (the ones that name slow cards first), then the reports shown in compare
    verdicts = sorted(
        (q for q in catalog.values() if q.is_verdict), key=lambda q: (q.priority is None, q.priority or 0, q.name)
    )
    metrics = sorted((q for q in catalog.values() if "compare" in q.shows), key=lambda q: (q.order, q.name))
    results_a, results_b = {}, {}
    for q in verdicts + metrics:
        ra = results_a[q.name] = queries_mod.run_query(con, q, run_a)
        # a query that compares with the run before (eplb-converged) gets run A as that run
        before = {"before_run": run_a} if any(p.name == "before_run" for p in q.params) else None
        rb = results_b[q.name] = queries_mod.run_query(con, q, run_b, before)
        if q.is_verdict:
            fa, fb = _flagged(ra), _flagged(rb)
            gone = [f for f in fa if f not in fb]
            new = [f for f in fb if f not in fa]
            note = []
            if gone:
                note.append("gone in B: " + "; ".join(gone))
            if new:
                note.append("new in B: " + "; ".join(new))
            cmp.verdicts.append(
                {
                    "query": f"{q.name}@v{q.version}",
                    "status_a": ra.status,
                    "status_b": rb.status,
                    "flagged_a": fa,
                    "flagged_b": fb,
                    "changed": ra.status != rb.status or fa != fb,
                    "note": "; ".join(note) or ("unchanged" if ra.status == rb.status else "status changed"),
                }
            )
        elif not {ra.status, rb.status} & {Status.SKIP, Status.ERROR}:
            cmp.metrics[f"{q.name}@v{q.version}"] = side_by_side(ra, rb)
    cmp.slow_cards_a = [f.short() for f in findings_mod.slow_cards(results_a)]
    cmp.slow_cards_b = [f.short() for f in findings_mod.slow_cards(results_b)]
    return cmp
