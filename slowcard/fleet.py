"""Across runs: which physical card keeps coming up slow, and which rank is slow wherever it lands.

A run's verdicts are computed on demand and never kept; the fleet needs them for every run. So
``judge`` runs the slow-card verdicts of each run not yet judged (or whose files, or the
verdict queries, changed since) and stores the run's conclusion in ``run_verdicts`` and its slow
cards in ``run_slow_cards``; the fleet queries (``sql/fleet-*.sql``, ``scope: fleet``) count
those rows per device and per rank through the view ``fleet_rank_runs``. Library code: no
printing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from . import diagnosis as diagnosis_mod
from . import findings as findings_mod
from . import queries as queries_mod
from . import store


@dataclass
class Fleet:
    """The fleet queries' results, and what ``judge`` did first."""

    judged: list[str] = field(default_factory=list)  # runs judged now
    kept: int = 0  # runs whose stored verdicts were still current
    no_device: int = 0  # (judged run, rank) pairs whose device is unknown: not in the device counts
    results: dict = field(default_factory=dict)  # fleet query name -> Result

    def to_dict(self) -> dict:
        return {
            "judged_now": self.judged,
            "judged_before": self.kept,
            "ranks_without_device": self.no_device,
            "results": [findings_mod.result_dict(r) for r in self.results.values()],
        }


def speakers(catalog: dict) -> list:
    """The verdicts that can name a slow card (a ``priority:``), the only ones a judgement runs."""
    return [q for q in diagnosis_mod.ordered(catalog) if q.is_verdict and q.priority is not None]


def _stamp(con, run: str, refs: str) -> str:
    n, newest = con.execute("SELECT count(*), max(ingested_at) FROM sources WHERE run = ?", [run]).fetchone()
    return hashlib.sha256(f"{n}|{newest}|{refs}".encode()).hexdigest()[:16]


def stale_runs(con, catalog: dict, rejudge: bool = False) -> list[str]:
    """The runs whose stored judgement is missing or older than their files or the verdicts."""
    refs = ",".join(q.ref() for q in speakers(catalog))
    have = dict(con.execute("SELECT run, files_stamp FROM run_verdicts").fetchall())
    runs = [r for (r,) in con.execute("SELECT DISTINCT run FROM sources ORDER BY run").fetchall()]
    return [r for r in runs if rejudge or have.get(r) != _stamp(con, r, refs)]


def judge_one(con, run: str, catalog: dict) -> tuple[dict, list[dict]]:
    """(conclusion, slow cards) of one run: its slow-card verdicts, concluded as diagnose does."""
    results = {q.name: queries_mod.run_query(con, q, run) for q in speakers(catalog)}
    conclusion = diagnosis_mod.conclude(results)
    cards: dict[str, dict] = {}
    for f in findings_mod.slow_cards(results):
        cards.setdefault(
            f.label,
            {
                "rank": f.rank,
                "label": f.label,
                "level": str(f.level),
                "cause": f.causes or f.cause,
                "cost_ms": f.cost_ms,
                "cost_pct": f.cost_pct,
                "query": f.ref,
            },
        )
    return conclusion, list(cards.values())


def judge(db: str | Path, sql_dirs=None, rejudge: bool = False) -> tuple[list[str], int]:
    """Judge every run of ``db`` whose stored verdicts are missing or stale; (runs judged, runs
    kept). The verdicts run on a read-only connection (a --sql-dir query cannot write); the
    results are written afterwards, one transaction per run."""
    catalog = queries_mod.load_catalog(sql_dirs)
    refs = ",".join(q.ref() for q in speakers(catalog))
    con = queries_mod.open_readonly(db)
    try:
        todo = stale_runs(con, catalog, rejudge)
        total = store.scalar(con, "SELECT count(DISTINCT run) FROM sources")
        done = [(run, _stamp(con, run, refs), *judge_one(con, run, catalog)) for run in todo]
    finally:
        con.close()
    if done:
        con = store.open_db(db)
        try:
            for run, stamp, conclusion, cards in done:
                record(con, run, stamp, conclusion, cards)
        finally:
            con.close()
    return todo, total - len(todo)


def record(con, run: str, stamp: str, conclusion: dict, cards: list[dict]) -> None:
    """Replace the stored judgement of one run."""
    con.execute("BEGIN")
    try:
        con.execute("DELETE FROM run_verdicts WHERE run = ?", [run])
        con.execute("DELETE FROM run_slow_cards WHERE run = ?", [run])
        con.execute(
            "INSERT INTO run_verdicts (run, status, query, files_stamp, judged_at) VALUES (?, ?, ?, ?, now())",
            [run, conclusion.get("status"), conclusion.get("query"), stamp],
        )
        if cards:
            con.executemany(
                "INSERT INTO run_slow_cards (run, rank, label, level, cause, cost_ms, cost_pct, query) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (run, c["rank"], c["label"], c["level"], c["cause"], c["cost_ms"], c["cost_pct"], c["query"])
                    for c in cards
                ],
            )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def fleet(
    db: str | Path,
    params: dict | None = None,
    sql_dirs=None,
    rejudge: bool = False,
    reports: bool = True,
) -> Fleet:
    """Judge what is stale, then run the fleet queries (``scope: fleet``) in their order.
    ``params``: parameter -> value, given to each query that declares it (``since`` is shared by
    all); ``reports``: run the report queries too (the trend), not only the verdicts."""
    judged, kept = judge(db, sql_dirs, rejudge)
    out = Fleet(judged=judged, kept=kept)
    catalog = queries_mod.load_catalog(sql_dirs, scope="fleet")
    con = queries_mod.open_readonly(db)
    try:
        out.no_device = store.scalar(con, "SELECT count(*) FROM fleet_rank_runs WHERE device IS NULL")
        for q in diagnosis_mod.ordered(catalog):
            if not (q.is_verdict or reports):
                continue
            declared = {p.name for p in q.params}
            qp = {k: v for k, v in (params or {}).items() if k in declared}
            label = f"runs since {qp['since']}" if qp.get("since") else "all runs"
            out.results[q.name] = queries_mod.run_query(con, q, label, qp)
    finally:
        con.close()
    return out
