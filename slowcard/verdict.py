"""Verdicts: a query's rows + its rule -> PASS / WARN / FAIL / INFO (and SKIP / ERROR from the runner).

Pure functions, no I/O. The rule comes from the query header, e.g.
``fail if rows where impact > 0; warn if rows > 0``: fail is checked first, then warn, else PASS;
``none`` makes the query a report (INFO). Rules are never pasted into SQL.
"""

from __future__ import annotations

import enum
import math
import operator
import re
import sys
from dataclasses import dataclass

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # requires-python is 3.10: the same str()/format() as 3.11's StrEnum

    class StrEnum(str, enum.Enum):
        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


class Status(StrEnum):
    """The outcome of one query on one run, with ONE severity order used everywhere.

    A plain string as well (``Status.FAIL == "FAIL"``, JSON writes ``"FAIL"``). Worst first:
    FAIL (a finding that fails the run), ERROR (the query raised), WARN (a finding worth a
    look), PASS (a verdict found nothing), INFO (a report: no verdict), SKIP (its data is absent).
    """

    FAIL = "FAIL"
    ERROR = "ERROR"
    WARN = "WARN"
    PASS = "PASS"
    INFO = "INFO"
    SKIP = "SKIP"

    @property
    def severity(self) -> int:
        """0 for the worst (FAIL) up to 5 (SKIP): sort by it to put the worst first."""
        return _SEVERITY[self]

    @property
    def flags(self) -> bool:
        """True for the statuses a verdict gives when it has findings (FAIL, WARN)."""
        return self in (Status.FAIL, Status.WARN)

    @classmethod
    def worst(cls, statuses) -> Status:
        """The most severe of ``statuses`` (SKIP when there are none)."""
        return min((cls(s) for s in statuses), key=lambda s: s.severity, default=cls.SKIP)


_SEVERITY = {s: i for i, s in enumerate(Status)}
# Every status, worst first (the one severity order; the CLI totals line keeps its own layout).
STATUSES = tuple(Status)


def severity(status) -> int:
    """Sort key of a status given as a Status or its string (unknown strings sort last)."""
    try:
        return Status(status).severity
    except ValueError:
        return len(_SEVERITY)


_OPS = {">": operator.gt, ">=": operator.ge, "=": operator.eq, "<": operator.lt, "<=": operator.le}
_CLAUSE = re.compile(
    r"^\s*(?P<level>fail|warn)\s+if\s+rows(?:\s+where\s+(?P<col>[A-Za-z_][A-Za-z0-9_]*))?"
    r"\s*(?P<op>>=|<=|>|<|=)\s*(?P<n>\d+)\s*$"
)


@dataclass(frozen=True)
class Clause:
    level: str  # fail | warn
    column: str | None  # count only rows whose column is true / non-zero
    op: str
    n: int

    def holds(self, rows: list[dict]) -> bool:
        count = len(rows) if self.column is None else sum(1 for r in rows if _truthy(r.get(self.column)))
        return _OPS[self.op](count, self.n)

    def describe(self) -> str:
        what = "rows" if self.column is None else f"rows where {self.column}"
        return f"{self.level} if {what} {self.op} {self.n}"


def parse_rule(text: str) -> list[Clause] | None:
    """Parse a verdict header value; None means ``none`` (a report). Raises ValueError."""
    text = text.strip()
    if text.lower() == "none":
        return None
    clauses = []
    for part in text.split(";"):
        m = _CLAUSE.match(part)
        if not m:
            raise ValueError(
                f"bad verdict clause {part.strip()!r}; expected e.g. 'fail if rows > 0' "
                "or 'warn if rows where impact > 0'"
            )
        clauses.append(Clause(m["level"], m["col"], m["op"], int(m["n"])))
    levels = [c.level for c in clauses]
    if len(set(levels)) != len(levels):
        raise ValueError("at most one fail clause and one warn clause")
    return sorted(clauses, key=lambda c: c.level != "fail")


def _truthy(v) -> bool:
    if v is None:
        return False
    if isinstance(v, float) and math.isnan(v):
        return False
    return bool(v)


def skip_reason(rows: list[dict]) -> str | None:
    """Why a query's data is not enough to decide, or None.

    A query says so by returning rows that ALL carry a non-empty ``skip_reason`` column (e.g. one
    row "only 1 DP domain: nothing to compare"): the result is then SKIP with the distinct reasons
    as its summary, whatever its verdict rule. A result where only some rows carry one decides as
    usual.
    """
    if not rows or not all(r.get("skip_reason") not in (None, "") for r in rows):
        return None
    return "; ".join(dict.fromkeys(str(r["skip_reason"]) for r in rows))


def pass_rows(rows: list[dict]) -> bool:
    """True when the rows are what a PASS rests on, not findings: every row has ``level`` PASS
    (e.g. dp-imbalance's one row with the requests, windows and the skew the run could show)."""
    return bool(rows) and all(str(r.get("level") or "").upper() == "PASS" for r in rows)


def evaluate(rows: list[dict], rule: list[Clause] | None) -> Status:
    """Status of a result: SKIP when every row gives a ``skip_reason``; INFO for reports, else
    FAIL / WARN / PASS by the first clause that holds. When the rows carry a ``level`` column
    (FAIL / WARN per row), the result's status is the worst row level (PASS when none), so the
    status and the findings' levels (``row_levels``) always agree."""
    if skip_reason(rows) is not None:
        return Status.SKIP
    if rule is None:
        return Status.INFO
    if rows and "level" in rows[0]:
        return Status.worst([lv for lv in row_levels(rows, rule) if lv is not None] or [Status.PASS])
    for clause in rule:
        if clause.holds(rows):
            return Status(clause.level.upper())
    return Status.PASS


def row_levels(rows: list[dict], rule: list[Clause] | None) -> list[Status | None]:
    """The level of each row of a verdict result: the first clause (fail before warn) that holds
    for the result and counts the row; None when no holding clause counts it (not a finding).

    A ``level`` column (FAIL / WARN, e.g. from a calibrated verdict) decides for its row by itself.
    """
    if rule is None:
        return [None] * len(rows)
    holding = [c for c in rule if c.holds(rows)]
    out: list[Status | None] = []
    for row in rows:
        if "level" in row:
            lv = str(row["level"] or "").upper()
            out.append(Status(lv) if lv in ("FAIL", "WARN") else None)
            continue
        out.append(
            next((Status(c.level.upper()) for c in holding if c.column is None or _truthy(row.get(c.column))), None)
        )
    return out


def fmt_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return "NULL" if v is None else str(v)


_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def fill(template: str, values: dict) -> str:
    """Replace {name} by the formatted value (unknown names are left as they are)."""
    return _FIELD.sub(lambda m: fmt_value(values[m[1]]) if m[1] in values else m[0], template)


def summarise(
    status: str, rows: list[dict], row_template: str | None, pass_template: str | None, params: dict, limit: int = 3
) -> str:
    """One summary line: the skip reason, the first findings from the row template, or the pass text
    (filled with the params and, when the rows are context rows of a PASS, the first one's columns)."""
    reason = skip_reason(rows)
    if reason is not None:
        return reason
    if not rows or pass_rows(rows):
        context = rows[0] if rows else {}
        return fill(pass_template, {**params, **context}) if pass_template else "No rows."
    if not row_template:
        return f"{len(rows)} row{'s' if len(rows) != 1 else ''}."
    parts = [fill(row_template, {**params, **r}) for r in rows[:limit]]
    more = f" (+{len(rows) - limit} more)" if len(rows) > limit else ""
    return " | ".join(parts) + more
