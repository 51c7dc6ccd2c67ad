"""What a reader sees first, built once from a diagnosis: the slow cards (each with its cause,
cost, evidence lines in words, why lines and next step), the findings list, the results folded
by status (PASS and INFO counted, SKIPs grouped by the input that would enable them), the
totals, and the numbers of the small picture (MoE time per rank, or requests per DP domain).

The renderers in ``slowcard/renderers/`` (terminal, markdown, HTML) draw a ``Screen``; they fold
long lists to fit, but decide nothing. The words come from the query headers: a slow card's
evidence lines are its verdict's ``headline:`` phrases filled from the card's row, a why line
the why query's. Pure library code: no printing; ``run_inputs`` reads the run's ``sources``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import findings as findings_mod
from . import why as why_mod
from .diagnosis import headline_cards
from .verdict import Status, fmt_value, skip_reason

# What ingesting gives a required table or view: the input a SKIPped query lacks.
INPUTS = {
    "_dp_batches": "service data",  # msServiceProfiler batch / request data
    "expert_load": "expert load",
    "metric_windows": "watch metrics",  # slowcard watch
    "step_trace": "step trace",  # step_trace_time.csv
    "moe_layer_facts": "MoE traces",
    "moe_layers": "MoE traces",
    "_layer_collectives": "multi-rank traces",
    "collective_waits": "multi-rank traces",
    "clock_offsets": "multi-rank traces",
    "op_classes": "traces or op CSVs",
}
SHORT_OF_DATA = "too little data"  # the SKIP group of queries that had their tables but too little in them

# Words for the parts of a column name (abbreviations and units), for bare headline columns.
_WORDS = {
    "gmm": "GroupedMatmul",
    "kv": "KV",
    "ttft": "first-token",
    "e2e": "end-to-end",
    "dp": "DP",
    "ep": "EP",
    "pg": "process group",
    "bw": "bandwidth",
    "par": "peak/avg",
    "exec": "execution",
    "n": "number of",
}
UNITS = {
    "ns": "ns",
    "us": "us",
    "ms": "ms",
    "s": "s",
    "pct": "%",
    "bytes": "bytes",
    "mbytes": "MB",
    "gbps": "GB/s",
    "tflops": "TFLOP/s",
    "ratio": "x",
}
_FIELD = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


@dataclass
class Card:
    """One slow card as the first screen shows it."""

    card: str
    level: str
    causes: str
    cost_ms: float | None
    cost_pct: float | None
    query: str  # name@vN of the verdict that names it
    evidence: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)  # one line per why query with rows about the card
    why_quiet: list[tuple[str, str]] = field(default_factory=list)  # (query, status) of the others
    why_note: str | None = None
    next_step: str | None = None

    def cost(self) -> str:
        return cost_text(self.cost_ms, self.cost_pct)


def cost_text(cost_ms: float | None, cost_pct: float | None) -> str:
    """``63.3 ms (67.4 %)``, or what of it the query gives ("" for none)."""
    parts = []
    if cost_ms is not None:
        parts.append(f"{fmt_value(cost_ms)} ms")
    if cost_pct is not None:
        parts.append(f"({fmt_value(cost_pct)} %)" if parts else f"{fmt_value(cost_pct)} %")
    return " ".join(parts)


@dataclass
class FindingLine:
    level: str
    query: str  # name@vN
    label: str
    causes: str
    cost: str  # "63.3 ms (67.4 %)" or ""


@dataclass
class SkipGroup:
    need: str  # the input that would enable these queries, or SHORT_OF_DATA
    queries: list[str]
    reasons: list[str]  # the queries' own SKIP summaries, in the same order


@dataclass
class BarRow:
    label: str
    values: list[float]  # one per Bars.parts
    total: float
    mark: str | None  # "slow card: token-skew" on the slow cards


@dataclass
class Bars:
    title: str
    unit: str
    parts: list[str]
    rows: list[BarRow]
    source: str  # name@vN of the report query


@dataclass
class Screen:
    run: str
    status: str  # the conclusion's status
    headline: str
    inputs: dict
    cards: list[Card]
    findings: list[FindingLine]
    errors: list[str]  # "name@vN: message"
    passed: list[str]  # names of the verdicts that PASSed
    resting: list[str]  # what a PASS conclusion rests on: "name@vN: summary" of the slow-card verdicts that PASSed
    info: list[str]  # names of the reports (INFO)
    skips: list[SkipGroup]
    totals: dict  # status -> count, every status, worst first
    bars: Bars | None
    conclusion: dict
    lines: list[str] = field(default_factory=list)  # every result's one line (verbose)
    why_lines: list[str] = field(default_factory=list)  # the why-section in full (verbose)

    @property
    def total(self) -> int:
        return sum(self.totals.values())

    def headline_fitting(self, width: int) -> str:
        """The headline within ``width`` characters: as many cards as fit, then "(+N more)"."""
        text = self.headline
        if len(text) <= width or not self.conclusion.get("cards"):
            return text
        cards = self.conclusion["cards"]
        head = "Slow cards: " if len(cards) > 1 else "Slow card: "
        for k in range(len(cards), 0, -1):
            more = f" (+{len(cards) - k} more cards)" if k < len(cards) else ""
            text = head + headline_cards(cards[:k], most=k) + more
            if len(text) <= width:
                return text
        return text  # one card is already wider: the caller wraps it


def run_inputs(con, run: str) -> dict:
    """What the run holds: files per format, rows kept, distinct ranks and DP ranks."""
    try:
        fmts = con.execute(
            "SELECT format, count(*) FROM sources WHERE run = ? GROUP BY format ORDER BY count(*) DESC, format",
            [run],
        ).fetchall()
        ranks, dps, rows = con.execute(
            "SELECT count(DISTINCT rank), count(DISTINCT dp_rank), coalesce(sum(rows_kept), 0) FROM sources "
            "WHERE run = ?",
            [run],
        ).fetchone()
    except Exception:  # a database without the bookkeeping tables: say nothing about inputs
        return {}
    return {"formats": {f or "?": n for f, n in fmts}, "ranks": ranks, "dp_ranks": dps, "rows": rows}


def column_words(column: str) -> tuple[str, str]:
    """(words, unit) of a column name: ``gmm_us_per_layer`` -> ("GroupedMatmul per layer", "us")."""
    parts = column.split("_")
    unit = ""
    words: list[str] = []
    for p in parts:
        if not unit and p in UNITS and words:
            unit = UNITS[p]
            continue
        words.append(_WORDS.get(p, p))
    return " ".join(words), unit


def _value(v) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, (dict, list)):
        return (
            ", ".join(f"{k}: {fmt_value(x)}" for k, x in v.items()) if isinstance(v, dict) else ", ".join(map(str, v))
        )
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10_000:
        return f"{v:,}"
    return fmt_value(v)


_GROUP = re.compile(r" ?\(([^()]*)\)")


def _missing(v) -> bool:
    return v is None or v == ""


def phrase(entry: str, row: dict) -> str | None:
    """One headline entry filled from a row; None when its column has no value in the row.

    A value that is missing (NULL) reads "-", except: inside parentheses, each "; "-separated
    part with a missing value is left out (and the parentheses when no part is left), and a
    placeholder glued to the word before it (a text fragment column) reads as nothing."""
    m = _FIELD.search(entry)
    column = m.group(1) if m else entry
    if _missing(row.get(column)):
        return None
    if m is None:
        words, unit = column_words(column)
        value = _value(row[column])
        return f"{words}: {value}{'x' if unit == 'x' else (' ' + unit if unit else '')}"

    def group(g: re.Match) -> str:
        kept = [p for p in g.group(1).split("; ") if not any(_missing(row.get(f)) for f in _FIELD.findall(p))]
        return f"{' ' if g.group(0).startswith(' ') else ''}({'; '.join(kept)})" if kept else ""

    entry = _GROUP.sub(group, entry)

    def fill(f: re.Match) -> str:
        v = row.get(f.group(1))
        # a placeholder glued to the text before it is a fragment ("…us){work}"): empty when NULL
        if _missing(v) and f.start() > 0 and not entry[f.start() - 1].isspace():
            return ""
        return _value(v)

    return _FIELD.sub(fill, entry)


def evidence_lines(spec, row: dict) -> list[str]:
    """A finding's evidence in words: its query's headline phrases filled from its row (queries
    without a headline: their numeric columns, in words with units)."""
    if spec is not None and spec.headline:
        return [p for p in (phrase(e, row) for e in spec.headline) if p]
    skip = set(findings_mod.NON_EVIDENCE) | {col for col, _ in (spec.subject if spec else ())}
    cols = [k for k, v in row.items() if k not in skip and isinstance(v, (int, float)) and not isinstance(v, bool)]
    return [p for p in (phrase(c, row) for c in cols[:5]) if p]


def _why_line(res, row: dict) -> str:
    spec = res.spec
    if spec is not None and spec.headline:
        return ", ".join(p for p in (phrase(e, row) for e in spec.headline) if p)
    return ", ".join(f"{k}={fmt_value(v)}" for k, v in row.items() if v is not None)


def _cards(diag) -> list[Card]:
    results = diag.results
    found: dict = {}
    for f in diag.slow_cards:
        found.setdefault(f.label, f)
    why = {w["card"]: w for w in (getattr(diag, "why", None) or [])}
    out = []
    for c in diag.conclusion.get("cards", []):
        f = found.get(c["card"])
        res = results.get(f.query) if f is not None else None
        card = Card(
            card=c["card"],
            level=c["level"],
            causes=c.get("causes") or c.get("cause") or "",
            cost_ms=c.get("cost_ms"),
            cost_pct=c.get("cost_pct"),
            query=f.ref if f is not None else diag.conclusion.get("query") or "",
            evidence=evidence_lines(res.spec if res is not None else None, f.row) if f is not None else [],
            next_step=c.get("next_step"),
        )
        w = why.get(c["card"])
        if w is not None:
            if w.get("ranks"):
                for part in w["parts"]:
                    name = part["query"].split("@")[0]
                    wres = results.get(name)
                    if part["rows"] and wres is not None:
                        card.why.append(_why_line(wres, part["rows"][0]))
                    else:
                        card.why_quiet.append((part["query"], part["status"]))
            else:
                card.why_note = w.get("note")
        out.append(card)
    return out


def _findings(results: dict) -> tuple[list[FindingLine], list[str]]:
    lines: list[tuple[int, FindingLine]] = []
    for res in findings_mod.speaking_order(results.values()) + [
        r
        for r in results.values()
        if r.spec is not None and r.spec.is_verdict and r.spec.priority is None and Status(r.status).flags
    ]:
        for f in findings_mod.by_cost(findings_mod.findings(res)):
            line = FindingLine(str(f.level), f.ref, f.label, f.causes or "", cost_text(f.cost_ms, f.cost_pct))
            lines.append((f.level.severity, line))
    lines.sort(key=lambda t: t[0])  # FAIL before WARN; the speaking order within a level
    errors = [f"{r.query}@v{r.version}: {r.summary}" for r in results.values() if r.status == Status.ERROR]
    return [fl for _, fl in lines], errors


_REQUIRES = re.compile(r"^requires ([A-Za-z_][A-Za-z0-9_]*):")


def _skips(results: dict) -> list[SkipGroup]:
    groups: dict[str, SkipGroup] = {}
    for r in results.values():
        if r.status != Status.SKIP:
            continue
        m = _REQUIRES.match(r.summary or "")
        if m and not skip_reason(r.rows):
            need = INPUTS.get(m.group(1), f"{m.group(1)} rows")
        else:
            need = SHORT_OF_DATA
        g = groups.setdefault(need, SkipGroup(need, [], []))
        g.queries.append(r.query)
        g.reasons.append(r.summary)
    # the inputs that would enable the most checks first; "more data" last
    return sorted(groups.values(), key=lambda g: (g.need == SHORT_OF_DATA, -len(g.queries), g.need))


def _usable(res) -> bool:
    return res is not None and res.status not in (Status.SKIP, Status.ERROR) and bool(res.rows)


def _data(results: dict, place: str):
    """The report query that feeds a report place (first in diagnosis order), or None."""
    found = sorted(
        (r for r in results.values() if r.spec is not None and place in r.spec.shows and not r.spec.is_verdict),
        key=lambda r: (r.spec.order, r.query),
    )
    return found[0] if found else None


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def bars(results: dict) -> Bars | None:
    """The picture's numbers: MoE time per rank split into GroupedMatmul, dispatch+combine (its
    waiting apart) and other, from the query that feeds the report's MoE figure; else requests
    per DP domain from the one that feeds its DP table. The slow cards are marked."""
    marks = {
        rank: f"slow card: {f.causes or f.cause or 'slow'}" for rank, f in findings_mod.slow_ranks(results).items()
    }
    moe = _data(results, "report.moe")
    if _usable(moe):
        rows = [r for r in moe.rows if r.get("layer") is None] or moe.rows
        out = []
        for r in rows:
            gmm, disp, comb, wait = (_num(r.get(k)) for k in ("gmm_ms", "dispatch_ms", "combine_ms", "wait_ms"))
            total = _num(r.get("moe_ms")) or gmm + disp + comb
            comm = max(disp + comb - wait, 0.0)
            other = max(total - gmm - comm - wait, 0.0)
            rank = r.get("rank")
            out.append(
                BarRow(
                    f"rank {rank}", [gmm, comm, wait, other], total, marks.get(int(rank)) if rank is not None else None
                )
            )
        return Bars(
            "MoE time per rank",
            "ms",
            ["GroupedMatmul", "dispatch+combine", "waiting", "other"],
            out,
            f"{moe.query}@v{moe.version}",
        )
    dp = _data(results, "report.dp")
    if _usable(dp):
        hot = {
            value: f"slow card: {f.causes or f.cause}"
            for f in findings_mod.slow_cards(results)
            for kind, value in f.subject
            if kind == "dp_rank"
        }
        out = [
            BarRow(
                f"DP {r.get('dp_rank')}", [_num(r.get("requests"))], _num(r.get("requests")), hot.get(r.get("dp_rank"))
            )
            for r in dp.rows
            if r.get("dp_rank") is not None
        ]
        return Bars("Requests per DP domain", "requests", ["requests"], out, f"{dp.query}@v{dp.version}")
    return None


def screen(diag, inputs: dict | None = None) -> Screen:
    """The first screen of a diagnosis (``diagnosis.Diagnosis``); ``inputs`` from ``run_inputs``."""
    results = diag.results
    c = diag.conclusion
    found, errors = _findings(results)
    totals = {str(s): 0 for s in Status}
    for r in results.values():
        totals[str(r.status)] = totals.get(str(r.status), 0) + 1
    inputs = dict(inputs or {})
    dp = _data(results, "report.dp")
    if _usable(dp) and not inputs.get("dp_ranks"):
        inputs["dp_ranks"] = len({r.get("dp_rank") for r in dp.rows if r.get("dp_rank") is not None})
    return Screen(
        run=diag.run,
        status=str(c.get("status") or diag.status),
        headline=c.get("headline", ""),
        inputs=inputs,
        cards=_cards(diag),
        findings=found,
        errors=errors,
        passed=[r.query for r in results.values() if r.status == Status.PASS],
        resting=[
            f"{r.query}@v{r.version}: {r.summary}"
            for r in results.values()
            if r.status == Status.PASS and r.spec is not None and r.spec.priority is not None
        ],
        info=[r.query for r in results.values() if r.status == Status.INFO],
        skips=_skips(results),
        totals=totals,
        bars=bars(results),
        conclusion=c,
        lines=[f"{r.query}@v{r.version} {r.status} {r.summary}" for r in results.values()],
        why_lines=why_mod.text(getattr(diag, "why", None) or [], limit=10**6),
    )
