"""Findings: what a verdict query flags, read the same way by diagnose, report, annotate and compare.

A verdict query's rows are its findings. Which rows count, and at what level, comes from the
query's verdict rule (``fail if rows where impact > 0; warn if rows > 0``: a row counted by the
fail clause is a FAIL finding, one counted only by the warn clause a WARN finding); a ``level``
column (FAIL / WARN) in the rows decides by itself. What a finding is about comes from the
query's ``subject:`` header, its cause from a ``cause`` (or ``finding``) column, the remedy from
``next_step``, and its cost from ``cost_ms`` / ``cost_pct`` when the query returns them. A
``causes`` column, when present, is how the cause reads when more than one carries the cost
("token-skew 58 %, slow-compute 42 %"); ``cause`` stays the one that carries the most.

``slow_cards(results)`` is THE answer to "which card is slow": the findings of the verdict that
speaks first, i.e. the most severe status, then the lowest ``priority:``. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .queries import RANK_KINDS, SUBJECT_KINDS
from .verdict import Status, row_levels

# Columns that say what a finding is or what to do, not evidence of it.
NON_EVIDENCE = ("cause", "finding", "next_step", "subject", "level", "skip_reason")


@dataclass(frozen=True)
class Finding:
    """One flagged row of a verdict result."""

    query: str
    version: int
    level: Status  # FAIL or WARN
    subject: tuple[tuple[str, Any], ...]  # (kind, value) for each subject column present
    label: str  # "rank 1", "DP domain 1", "expert 5, layer 0" (or the query)
    cause: str | None
    next_step: str | None
    cost_ms: float | None
    cost_pct: float | None
    row: dict

    @property
    def ref(self) -> str:
        return f"{self.query}@v{self.version}"

    @property
    def rank(self) -> int | None:
        """The rank this finding names when its subject is a rank (else None)."""
        if self.subject and self.subject[0][0] in RANK_KINDS:
            try:
                return int(self.subject[0][1])
            except (TypeError, ValueError):
                return None
        return None

    @property
    def causes(self) -> str | None:
        """The cause as read: the query's ``causes`` column (several causes with their shares)
        when it has one, else ``cause``."""
        shown = self.row.get("causes")
        return str(shown) if shown else self.cause

    def short(self) -> str:
        """``rank 1 token-skew``: the subject and the cause."""
        return f"{self.label} {self.causes or ''}".strip()

    def to_dict(self) -> dict:
        return {
            "query": self.ref,
            "level": str(self.level),
            "subject": dict(self.subject),
            "label": self.label,
            "cause": self.cause,
            "causes": self.causes,
            "next_step": self.next_step,
            "cost_ms": self.cost_ms,
            "cost_pct": self.cost_pct,
        }


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def findings(result) -> list[Finding]:
    """The findings of one result: none unless it is a verdict that FAILed or WARNed."""
    spec = getattr(result, "spec", None)
    if spec is None or not spec.is_verdict or not Status(result.status).flags:
        return []
    out = []
    for row, level in zip(result.rows, row_levels(result.rows, spec.rule)):
        if level is None:
            continue
        subject = tuple((kind, row[col]) for col, kind in spec.subject if row.get(col) is not None)
        label = ", ".join(f"{SUBJECT_KINDS[kind]} {value}" for kind, value in subject) or spec.name
        cause = row.get("cause") or row.get("finding") or None
        out.append(
            Finding(
                query=spec.name,
                version=spec.version,
                level=level,
                subject=subject,
                label=label,
                cause=None if cause is None else str(cause),
                next_step=row.get("next_step") or None,
                cost_ms=_number(row.get("cost_ms")),
                cost_pct=_number(row.get("cost_pct")),
                row=row,
            )
        )
    return out


def speaking_order(results) -> list:
    """The verdict results that may name the slow card, the first to speak first: by status
    (FAIL before WARN), then ``priority:`` (lower first), then name. Reports, and verdicts with
    ``priority: none``, never speak."""
    cands = [
        r
        for r in results
        if getattr(r, "spec", None) is not None
        and r.spec.is_verdict
        and r.spec.priority is not None
        and Status(r.status).flags
    ]
    return sorted(cands, key=lambda r: (Status(r.status).severity, r.spec.priority, r.query))


def speaker(results: dict):
    """(result, its findings) of the verdict that names the slow card, or (None, [])."""
    for res in speaking_order(results.values()):
        found = findings(res)
        if found:
            return res, found
    return None, []


def by_cost(found: list[Finding]) -> list[Finding]:
    """Findings FAIL before WARN, then the costliest first (``cost_pct``, else ``cost_ms``);
    findings without a cost keep their order, after the costed ones of their level."""

    def key(f: Finding):
        cost = f.cost_pct if f.cost_pct is not None else f.cost_ms
        return (f.level.severity, cost is None, -(cost or 0.0))

    return sorted(found, key=key)


def slow_cards(results: dict) -> list[Finding]:
    """The run's slow cards: the findings of the verdict that speaks first (see ``speaker``),
    FAIL before WARN and the costliest first (``by_cost``)."""
    return by_cost(speaker(results)[1])


def slow_ranks(results: dict, shown_in: str | None = None) -> dict[int, Finding]:
    """rank -> its first finding, for the slow cards that are ranks (optionally only those of
    queries whose ``shows:`` holds ``shown_in``)."""
    out: dict[int, Finding] = {}
    for f in slow_cards(results):
        spec = results[f.query].spec
        if f.rank is not None and (shown_in is None or shown_in in spec.shows):
            out.setdefault(f.rank, f)
    return out


def result_dict(result) -> dict:
    """``result.to_dict()`` plus, for a verdict, its ``findings`` (level, subject, label, cause,
    next step, cost): the JSON of `slowcard query` and `slowcard diagnose`."""
    out = result.to_dict()
    spec = getattr(result, "spec", None)
    if spec is not None and spec.is_verdict:
        out["findings"] = [f.to_dict() for f in findings(result)]
    return out


def evidence(f: Finding, subject_columns) -> str:
    """The finding's numbers as ``col=value, …`` (subject and text columns left out, and columns
    without a value: a verdict's rows share columns that only some of them fill)."""
    from .verdict import fmt_value

    skip = set(subject_columns) | set(NON_EVIDENCE)
    return ", ".join(
        f"{k}={fmt_value(v)}"
        for k, v in f.row.items()
        if k not in skip and v is not None and v != "" and not isinstance(v, (dict, list))
    )
