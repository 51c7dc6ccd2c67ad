"""The query catalog: loading ``sql/*.sql`` with their headers, binding parameters, running
a query read-only and handing the rows to ``verdict`` for a status.

Header rules (docs/contract.md): ``name`` equals the file stem (kebab-case); ``version`` is an
integer; ``description`` one line; ``requires`` the tables/views read; ``param: NAME TYPE =
DEFAULT -- help`` for each ``$NAME`` (``$run`` is always bound); ``verdict`` a rule or ``none``;
optional ``summary`` (per-row template) and ``pass`` (text when no rows). Does not decide statuses.

What the rest of slowcard needs to know about a query is in its header too, so that a new
analysis is one new SQL file: ``role`` (report or verdict), ``subject`` (the columns naming what a
finding is about, e.g. ``rank`` or ``suspect_rank as rank``), ``priority`` (which verdict names the
slow card first in a diagnosis), ``order`` (when it runs in a diagnosis) and ``shows`` (the report
section or trace annotation that shows it). No module names a query in code. ``headline`` says
what a reader sees first: the columns a query table shows by default and, as phrases, the
evidence lines of a slow card on the first screen of `slowcard diagnose` (presentation only:
not part of the fingerprint).
"""

from __future__ import annotations

import hashlib
import importlib.resources as resources
import math
import re
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from . import verdict as verdict_mod
from .errors import QueryDefinitionError, UsageError

KEYS = (
    "name",
    "version",
    "description",
    "requires",
    "param",
    "verdict",
    "summary",
    "pass",
    "role",
    "subject",
    "priority",
    "order",
    "shows",
    "headline",
    "scope",
)
# What a query reads: one run (`$run`, the default; diagnose, report and compare run these) or
# every run of the database (`scope: fleet`, sql/fleet-*.sql: `slowcard fleet` runs these, over
# the slow cards stored per run; never part of one run's diagnosis).
SCOPES = ("run", "fleet")
ROLES = ("report", "verdict")
# What a finding can be about: subject kind -> the label printed before its value ("DP domain 1").
SUBJECT_KINDS = {
    "rank": "rank",
    "ep_rank": "EP rank",
    "dp_rank": "DP domain",
    "expert": "expert",
    "layer": "layer",
    "step": "step",
    "host": "host",
    "device": "device",
    "pg": "process group",
}
# Subject kinds that name a rank (the ones `annotate` can mark in the merged trace).
RANK_KINDS = ("rank", "ep_rank")
# Where a query's result is shown (the report's sections, the merged trace, `slowcard compare`).
SHOWS = {
    "report.moe": "report: MoE time per rank (report query: the stacked bars; verdict: its rank findings are marked)",
    "report.waits": "report: rank x (step, layer) wait heat maps",
    "report.collectives": "report: per-collective skews (table, and the heat map when report.waits is absent)",
    "report.experts": "report: expert hotness heat map (verdict: its verdict line under the figure)",
    "report.dp": "report: DP domains table (verdict: its dp_rank findings are highlighted, verdict line)",
    "report.dp-windows": "report: per-window DP figures",
    "report.metrics": "report: live metrics over time (per DP domain and the instance, the alert windows marked)",
    "annotate": "merged trace: the collectives where this verdict's slow rank arrives last are marked",
    "compare": "slowcard compare: the report's rows side by side (verdicts are always compared)",
    "why": "diagnose and report: the why-section of each slow card (its rows about that card's ranks)",
}
DEFAULT_PRIORITY = 100  # a verdict without `priority:` speaks after the built-in ones
DEFAULT_ORDER = 1000  # a query without `order:` runs after the built-in ones (by name)
TYPES = {"INTEGER": int, "BIGINT": int, "DOUBLE": float, "VARCHAR": str, "BOOLEAN": bool}
_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_PARAM = re.compile(r"^(?P<name>[a-z_][a-z0-9_]*)\s+(?P<type>[A-Z]+)\s*=\s*(?P<default>.*?)\s*(?:--\s*(?P<help>.*))?$")
_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_HEADLINE_FIELD = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_COLUMN = re.compile(r"^[a-z_][a-z0-9_]*$")


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    default: object
    help: str = ""


@dataclass
class Query:
    """One named query file."""

    name: str
    version: int
    description: str
    requires: list[str]
    params: list[Param]
    rule: list[verdict_mod.Clause] | None
    rule_text: str
    summary: str | None
    pass_text: str | None
    body: str
    path: Path
    role: str = "report"
    subject: tuple[tuple[str, str], ...] = ()  # (column, kind) pairs, the card first
    priority: int | None = None  # verdicts: lower names the slow card first; None never
    order: int = DEFAULT_ORDER
    shows: tuple[str, ...] = ()
    headline: tuple[str, ...] = ()  # entries: a column name, or a phrase with {column} placeholders
    scope: str = "run"  # run | fleet (SCOPES)

    @property
    def headline_columns(self) -> list[str]:
        """The columns a query table shows by default (besides subject, level, cause and cost):
        each headline entry's column, i.e. the entry itself or its first ``{column}``."""
        out: list[str] = []
        for entry in self.headline:
            m = _HEADLINE_FIELD.search(entry)
            col = m.group(1) if m else entry
            if col not in out:
                out.append(col)
        return out

    @property
    def is_verdict(self) -> bool:
        return self.role == "verdict"

    def ref(self) -> str:
        return f"{self.name}@v{self.version}"

    def fingerprint(self) -> str:
        """What must not change without a version bump: body, params and rule (not comments, nor
        the presentation headers summary / pass / headline)."""
        h = hashlib.sha256()
        h.update(_normalise_sql(self.body).encode())
        for p in self.params:
            h.update(f"{p.name}:{p.type}={p.default!r}".encode())
        h.update(self.rule_text.strip().lower().encode())
        return h.hexdigest()[:16]


_LEXEMES = re.compile(r"'(?:[^']|'')*'|--[^\n]*|/\*.*?\*/", re.S)


def _strip_comments_and_strings(sql: str) -> str:
    """SQL with string literals emptied and comments removed, in ONE left-to-right pass (so an
    apostrophe inside a comment does not open a string, nor '--' inside a string a comment)."""
    return _LEXEMES.sub(lambda m: "''" if m.group(0).startswith("'") else " ", sql)


def _normalise_sql(sql: str) -> str:
    without = re.sub(r"--[^\n]*", "", sql)
    return " ".join(without.split())


def _coerce(value: str, typ: str, where: str):
    try:
        if typ == "BOOLEAN":
            low = str(value).strip().lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return low in ("true", "1", "yes")
        out = TYPES[typ](value.strip().strip("'") if typ == "VARCHAR" else value)
        _check_finite(out)
        return out
    except (ValueError, TypeError):
        raise UsageError(f"{where}: {value!r} is not a valid {typ}") from None


def _check_finite(value) -> None:
    """nan, inf and 1e400 (inf once parsed) make every comparison false or true, so a FAIL turns
    into a PASS; integers beyond BIGINT fail inside DuckDB. Both are refused as bad values."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        raise ValueError(value)


def parse_query(path: Path, text: str | None = None) -> Query:
    """Parse one query file; raise QueryDefinitionError naming file and line on any rule break."""
    text = path.read_text(encoding="utf-8") if text is None else text
    lines = text.splitlines()
    fields: dict[str, list[tuple[int, str]]] = {}
    body_start = len(lines)
    for i, raw in enumerate(lines):
        if not raw.startswith("--"):
            body_start = i
            break
        m = re.match(r"^--\s*([a-z]+):\s?(.*)$", raw)
        if not m:
            continue  # a plain comment inside the header block
        key, value = m.group(1), m.group(2).strip()
        if key not in KEYS:
            raise QueryDefinitionError(f"{path}:{i + 1}: unknown header key {key!r} (allowed: {', '.join(KEYS)})")
        if key != "param" and key in fields:
            raise QueryDefinitionError(f"{path}:{i + 1}: duplicate header key {key!r}")
        fields.setdefault(key, []).append((i + 1, value))

    def one(key, required=True):
        if key not in fields:
            if required:
                raise QueryDefinitionError(f"{path}:1: missing header '-- {key}: …'")
            return None, None
        return fields[key][0]

    line, name = one("name")
    if name != path.stem or not _NAME.match(name):
        raise QueryDefinitionError(
            f"{path}:{line}: name {name!r} must equal the file stem {path.stem!r} and be kebab-case"
        )
    line, version = one("version")
    if not version.isdigit() or int(version) < 1:
        raise QueryDefinitionError(f"{path}:{line}: version must be an integer >= 1, got {version!r}")
    _, description = one("description")
    _, requires = one("requires")
    line, rule_text = one("verdict")
    try:
        rule = verdict_mod.parse_rule(rule_text)
    except ValueError as exc:
        raise QueryDefinitionError(f"{path}:{line}: {exc}") from None
    params = []
    for line, value in fields.get("param", []):
        m = _PARAM.match(value)
        if not m or m["type"] not in TYPES:
            raise QueryDefinitionError(
                f"{path}:{line}: bad param {value!r}; expected "
                f"'NAME TYPE = DEFAULT -- help' with TYPE one of {', '.join(TYPES)}"
            )
        if m["name"] == "run":
            raise QueryDefinitionError(f"{path}:{line}: 'run' is bound by the runner; do not declare it")
        default = _coerce(m["default"], m["type"], f"{path}:{line}")
        params.append(Param(m["name"], m["type"], default, (m["help"] or "").strip()))
    body = "\n".join(lines[body_start:]).strip().rstrip(";").strip()
    if not body:
        raise QueryDefinitionError(f"{path}: the query has no SQL body after the header")
    used = set(_DOLLAR.findall(_strip_comments_and_strings(body)))
    declared = {p.name for p in params}
    if used - declared - {"run"}:
        raise QueryDefinitionError(
            f"{path}: parameters used but not declared: {', '.join(sorted(used - declared - {'run'}))}"
        )
    if declared - used:
        raise QueryDefinitionError(f"{path}: parameters declared but not used: {', '.join(sorted(declared - used))}")
    scope_line, scope = one("scope", required=False)
    scope = scope or "run"
    if scope not in SCOPES:
        raise QueryDefinitionError(f"{path}:{scope_line}: scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if "run" not in used and scope == "run":
        raise QueryDefinitionError(f"{path}: the query must filter on the run (use $run)")
    _, summary = one("summary", required=False)
    _, pass_text = one("pass", required=False)
    meta = _parse_meta(
        path, rule, {k: fields[k][0] for k in ("role", "subject", "priority", "order", "shows") if k in fields}
    )
    if "headline" in fields:
        meta["headline"] = _parse_headline(path, *fields["headline"][0])
    return Query(
        name=name,
        version=int(version),
        description=description,
        requires=[r.strip() for r in requires.split(",") if r.strip()],
        params=params,
        rule=rule,
        rule_text=rule_text,
        summary=summary,
        pass_text=pass_text,
        body=body,
        path=path,
        scope=scope,
        **meta,
    )


def _parse_headline(path: Path, line: int, value: str) -> tuple[str, ...]:
    """``headline: ENTRY | ENTRY | …``: each entry a column name or a phrase with ``{column}``
    placeholders (the first one is the entry's column in query tables)."""
    entries = tuple(e.strip() for e in value.split("|"))
    for e in entries:
        if not (_COLUMN.match(e) or _HEADLINE_FIELD.search(e)):
            raise QueryDefinitionError(
                f"{path}:{line}: headline entry {e!r}: expected a column name or a phrase with "
                "{column} placeholders, entries separated by ' | '"
            )
    return entries


_SUBJECT = re.compile(r"^(?P<col>[a-z_][a-z0-9_]*)(?:\s+as\s+(?P<kind>[a-z_][a-z0-9_]*))?$")


def _parse_meta(path: Path, rule, given: dict[str, tuple[int, str]]) -> dict:
    """role / subject / priority / order / shows of one query, checked against each other."""
    role = "report" if rule is None else "verdict"
    if "role" in given:
        line, value = given["role"]
        if value not in ROLES:
            raise QueryDefinitionError(f"{path}:{line}: role must be one of {', '.join(ROLES)}, got {value!r}")
        if value != role:
            raise QueryDefinitionError(
                f"{path}:{line}: role {value} does not match 'verdict: {'none' if rule is None else '…'}' "
                "(a report has 'verdict: none', a verdict has a rule)"
            )
    subject: list[tuple[str, str]] = []
    if "subject" in given:
        line, value = given["subject"]
        for part in value.split(","):
            m = _SUBJECT.match(part.strip())
            kind = (m["kind"] or m["col"]) if m else None
            if kind not in SUBJECT_KINDS:
                raise QueryDefinitionError(
                    f"{path}:{line}: bad subject {part.strip()!r}; expected 'COLUMN' or 'COLUMN as KIND' "
                    f"with KIND one of {', '.join(SUBJECT_KINDS)}"
                )
            assert m is not None  # no match gives kind None, refused above
            subject.append((m["col"], kind))
    priority = DEFAULT_PRIORITY if role == "verdict" else None
    if "priority" in given:
        line, value = given["priority"]
        if role != "verdict":
            raise QueryDefinitionError(f"{path}:{line}: priority is for verdict queries (this one is a report)")
        if value == "none":
            priority = None
        elif value.isdigit():
            priority = int(value)
        else:
            raise QueryDefinitionError(f"{path}:{line}: priority must be an integer >= 0 or 'none', got {value!r}")
    order = DEFAULT_ORDER
    if "order" in given:
        line, value = given["order"]
        if not value.isdigit():
            raise QueryDefinitionError(f"{path}:{line}: order must be an integer >= 0, got {value!r}")
        order = int(value)
    shows: list[str] = []
    if "shows" in given:
        line, value = given["shows"]
        for part in (v.strip() for v in value.split(",")):
            if part not in SHOWS:
                raise QueryDefinitionError(f"{path}:{line}: shows {part!r} is not one of {', '.join(SHOWS)}")
            if part == "annotate" and (role != "verdict" or not subject or subject[0][1] not in RANK_KINDS):
                raise QueryDefinitionError(
                    f"{path}:{line}: 'shows: annotate' needs a verdict whose subject "
                    f"is a rank ({' or '.join(RANK_KINDS)})"
                )
            if part == "compare" and role != "report":
                raise QueryDefinitionError(
                    f"{path}:{line}: 'shows: compare' is for report queries (every verdict is compared)"
                )
            shows.append(part)
    return {"role": role, "subject": tuple(subject), "priority": priority, "order": order, "shows": tuple(shows)}


def builtin_sql_dir() -> Path:
    """The packaged queries (wheel) or the repository's top-level sql/ (editable install)."""
    packaged = resources.files("slowcard") / "sql"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "sql"


def load_catalog(
    sql_dirs: Sequence[str | Path] | None = None, include_builtin: bool = True, scope: str | None = "run"
) -> dict[str, Query]:
    """Every query of ``scope`` (``run``: the per-run queries diagnose runs; ``fleet``: the
    cross-run ones; None: both), built-in first, then each user folder; a user query may not
    shadow a name (of either scope)."""
    dirs = ([builtin_sql_dir()] if include_builtin else []) + [Path(d) for d in (sql_dirs or [])]
    catalog: dict[str, Query] = {}
    for d in dirs:
        if not d.is_dir():
            raise UsageError(f"{d}: --sql-dir is not a folder")
        for path in sorted(d.glob("*.sql")):
            if path.name.startswith("_"):
                continue
            q = parse_query(path)
            if q.name in catalog:
                raise QueryDefinitionError(f"{path}: query {q.name!r} is already defined in {catalog[q.name].path}")
            catalog[q.name] = q
    return {k: q for k, q in catalog.items() if scope is None or q.scope == scope}


def catalog_rows(catalog: dict[str, Query]) -> list[dict]:
    """One row per query with its header metadata, in diagnosis order (what `slowcard list` prints)."""
    rows = []
    for q in sorted(catalog.values(), key=lambda q: (q.order, q.name)):
        rows.append(
            {
                "query": q.name,
                "version": f"v{q.version}",
                "role": q.role,
                "verdict": q.rule_text,
                "subject": ", ".join(col if col == kind else f"{col} as {kind}" for col, kind in q.subject) or "-",
                "priority": "-" if q.priority is None else q.priority,
                "order": q.order,
                "shows": ", ".join(q.shows) or "-",
                "description": q.description,
            }
        )
    return rows


def find(catalog: dict[str, Query], name: str) -> Query:
    if name in catalog:
        return catalog[name]
    import difflib

    close = difflib.get_close_matches(name, list(catalog), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `slowcard query --list` shows them all"
    raise UsageError(f"unknown query {name!r}{hint}")


@dataclass
class Result:
    """The outcome of one query on one run (the JSON contract of `slowcard query --format json`)."""

    query: str
    version: int
    run: str
    status: verdict_mod.Status  # a str too: "PASS", "FAIL", …
    summary: str
    columns: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    elapsed_s: float = 0.0
    rule: str = ""
    spec: Query | None = field(default=None, repr=False, compare=False)  # the query it came from

    def to_arrow(self):
        """The rows as a pyarrow Table (columns in result order)."""
        import pyarrow as pa

        return (
            pa.Table.from_pylist(self.rows, schema=None)
            if self.rows
            else pa.table({c: pa.array([], pa.null()) for c in self.columns})
        )

    def to_dict(self) -> dict:
        return {
            "query": self.query,
            "version": self.version,
            "run": self.run,
            "status": str(self.status),
            "summary": self.summary,
            "columns": self.columns,
            "rows": self.rows,
            "params": self.params,
            "rule": self.rule,
        }


def with_specs(results: dict, catalog: dict) -> dict:
    """``results`` where each Result made without its query (``spec`` None) gets it from ``catalog``."""
    import dataclasses

    return {
        name: dataclasses.replace(r, spec=catalog[r.query]) if r.spec is None and r.query in catalog else r
        for name, r in results.items()
    }


def bind_params(query: Query, given: dict | None) -> dict:
    """Defaults overlaid with the user's values (strings from the CLI are coerced)."""
    given = dict(given or {})
    values = {p.name: p.default for p in query.params}
    types = {p.name: p.type for p in query.params}
    for key, raw in given.items():
        if key not in values:
            known = ", ".join(values) or "none"
            raise UsageError(f"query {query.name!r} has no parameter {key!r} (parameters: {known})")
        values[key] = _coerce(raw, types[key], f"-p {key}") if isinstance(raw, str) else raw
    return values


# Per read-only connection from open_db (nothing can write while it is open, so neither its
# catalog nor its rows change): key -> answer, for what every query of a diagnose asks again (the
# relations and whether they have rows for the run, the rank-conflict note of each skipped query:
# ~6 ms each, the stored-view errors).
_KNOWN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _once(con, key: tuple, compute):
    """``compute()``, once per read-only connection from open_db; every time on other connections."""
    from .store import _FRESH

    if con not in _FRESH:
        return compute()
    known = _KNOWN.setdefault(con, {})
    if key not in known:
        known[key] = compute()
    return known[key]


def _relation_has_run(con, name: str) -> bool | None:
    """None when the table/view does not exist; else whether it has a `run` column. One catalog
    read instead of one information_schema query per required relation per query."""

    def relations() -> dict:
        return dict(
            con.execute(
                "SELECT table_name, bool_or(column_name = 'run') FROM information_schema.columns "
                "WHERE table_schema = 'main' GROUP BY table_name"
            ).fetchall()
        )

    return _once(con, ("relations",), relations).get(name)


def _relation_rows(con, name: str, run: str | None) -> int | None:
    """None when the table/view does not exist; else 1 if it has a row for the run (any row: run
    None), 0 if not."""
    has_run = _relation_has_run(con, name)
    if has_run is None:
        return None

    def count() -> int:
        cur = scoped_cursor(con, run)
        try:
            if has_run and run is not None:
                return len(cur.execute(f'SELECT 1 FROM "{name}" WHERE run = ? LIMIT 1', [run]).fetchall())
            return len(cur.execute(f'SELECT 1 FROM "{name}" LIMIT 1').fetchall())
        finally:
            cur.close()

    return _once(con, ("rows", name, run), count)


def scoped_cursor(con, run: str | None):
    """A connection of its own whose views read ``run`` only (every run when None): the variable
    slowcard_scope that ``scoped_sources`` (schema.sql) filters on."""
    from .store import set_scope

    cur = con.cursor()
    if run is not None:
        set_scope(cur, run)
    return cur


def runs(con) -> list[str]:
    return [r[0] for r in con.execute("SELECT run FROM runs ORDER BY created_at, run").fetchall()]


def _rank_conflict_note(con, run: str) -> str:
    """Why the cross-rank views are empty for a run whose ranks are not unique (05_runs.sql)."""
    return _once(con, ("rank_conflicts", run), lambda: _rank_conflict_note_now(con, run))


def _rank_conflict_note_now(con, run: str) -> str:
    try:
        rows = con.execute(
            "SELECT rank, format, n_files FROM rank_conflicts WHERE run = ? ORDER BY rank, format LIMIT 4", [run]
        ).fetchall()
    except duckdb.Error:
        return ""
    if not rows:
        return ""
    shown = ", ".join(f"rank {r} in {n} {f} files" for r, f, n in rows[:3]) + (", …" if len(rows) > 3 else "")
    return (
        f" (run {run!r} has duplicate ranks: {shown}; ranks cannot be compared in it. Ingest each "
        "job as its own run: --run NAME per job, or --run-per-folder; see the rank_conflicts view)"
    )


def run_query(con, query: Query, run: str, params: dict | None = None) -> Result:
    """Run one query for one run. Never raises for SQL errors: they become status ERROR."""
    from .store import ensure_fresh

    values = bind_params(query, params)
    ensure_fresh(con)  # the stored cross-rank views (store.MATERIALIZED) match the files
    res = Result(
        query=query.name,
        version=query.version,
        run=run,
        status=verdict_mod.Status.SKIP,
        summary="",
        params=values,
        rule=query.rule_text,
        spec=query,
    )
    t0 = time.perf_counter()
    try:
        from .store import stored_view_errors

        for view, message in _once(con, ("stored_view_errors", run), lambda: stored_view_errors(con, run)).items():
            if re.search(rf"\b{view}\b", _strip_comments_and_strings(query.body) + " " + " ".join(query.requires)):
                # what running the view's definition inside this query gave (store.refresh_materialized)
                res.status = verdict_mod.Status.ERROR
                res.summary = f"{query.path.name}: {message}"
                return res
        fleet = query.scope == "fleet"
        for rel in query.requires:
            n = _relation_rows(con, rel, None if fleet else run)
            if not n:
                res.summary = (
                    f"requires {rel}: "
                    + (
                        "no such table or view in this database"
                        if n is None
                        else ("no rows in this database" if fleet else f"no rows for run {run!r}")
                    )
                ) + _rank_conflict_note(con, run)
                return res
        # Bind exactly the parameters the body uses (DuckDB rejects unused named parameters).
        used = set(_DOLLAR.findall(_strip_comments_and_strings(query.body)))
        bound = {k: v for k, v in {"run": run, **values}.items() if k in used}
        # a fleet query reads every run; a query given a second run to compare with (before_run,
        # as eplb-converged under `compare`) reads both: the views are not narrowed to one run then
        scope = None if fleet or values.get("before_run") else run
        res.columns, rows = isolated_select(con, query.body, bound, scope=scope)
        res.rows = [dict(zip(res.columns, _plain(r))) for r in rows]
    except QueryAborted as exc:
        res.status = verdict_mod.Status.ERROR
        res.summary = f"{query.path.name}: {exc}"
        return res
    except duckdb.Error as exc:
        res.status = verdict_mod.Status.ERROR
        res.summary = f"{query.path.name}: {str(exc).splitlines()[0]}"
        return res
    finally:
        res.elapsed_s = time.perf_counter() - t0
    res.status = verdict_mod.evaluate(res.rows, query.rule)
    res.summary = verdict_mod.summarise(res.status, res.rows, query.summary, query.pass_text, values)
    return res


class QueryAborted(Exception):
    """A query body that is not one SELECT, or that ran past its time limit."""


# Wall-clock limit of one query (seconds; 0 = none): SLOWCARD_QUERY_TIMEOUT overrides it.
QUERY_TIMEOUT_S = 600.0


def _query_timeout() -> float:
    import os

    try:
        value = float(os.environ.get("SLOWCARD_QUERY_TIMEOUT", QUERY_TIMEOUT_S))
    except ValueError:
        return QUERY_TIMEOUT_S
    # 0, negative, non-finite or beyond a year (a wait that long overflows the platform's
    # timeout: 1e300 was a traceback): no limit
    return value if math.isfinite(value) and 0 < value <= 366 * 86400 else 0.0


def isolated_select(con, body: str, params: dict, scope: str | None = None) -> tuple[list[str], list]:
    """(columns, rows) of one query body, run so that nothing it does outlives it (issue 16).

    - exactly one statement (the contract): a body that also created a temp table, view or macro
      changed the verdicts of the queries run after it;
    - on its own cursor (a DuckDB connection of its own: temp objects and session settings die
      with it; the read-only database, disabled file access and locked configuration hold);
    - in a worker thread, so that Ctrl-C (KeyboardInterrupt in the main thread) and the time
      limit interrupt DuckDB instead of waiting for the statement to finish.

    ``scope`` (a run) makes the views read that run only (see ``scoped_sources`` in schema.sql):
    the answer for the run is the same, and its cost follows the run's size.
    """
    import threading

    statements = duckdb.extract_statements(body)
    if len(statements) != 1:
        raise QueryAborted(
            f"the query body holds {len(statements)} SQL statements; a query is exactly "
            "one statement, a SELECT (see docs/contract.md)"
        )
    cur = scoped_cursor(con, scope)
    out: dict = {}

    def work():
        try:
            c = cur.execute(body, params)
            out["columns"] = [d[0] for d in c.description]
            out["rows"] = c.fetchall()
        except BaseException as exc:  # handed to the caller's thread
            out["error"] = exc

    from .store import fault_point

    worker = threading.Thread(target=work, name="slowcard-query", daemon=True)
    limit = _query_timeout()
    try:
        worker.start()
        fault_point("query")
        worker.join(limit or None)
        if worker.is_alive():
            _stop(cur, worker)
            raise QueryAborted(f"stopped after {limit:g} s (SLOWCARD_QUERY_TIMEOUT, seconds)")
    except KeyboardInterrupt:
        _stop(cur, worker)
        raise
    finally:
        cur.close()
    if "error" in out:
        raise out["error"]
    return out["columns"], out["rows"]


def _query_memory() -> str:
    import os

    value = os.environ.get("SLOWCARD_QUERY_MEMORY", "").strip() or "4GB"
    return value.replace("'", "")


def _stop(cur, worker) -> None:
    """Interrupt the cursor until its thread ends (an interrupt that comes before DuckDB has
    started the statement is lost, so one is not enough)."""
    while worker.is_alive():
        cur.interrupt()
        worker.join(0.05)


def _plain(row) -> list:
    """DuckDB values that JSON can carry (Decimal -> float, lists kept)."""
    from decimal import Decimal

    out = []
    for v in row:
        if isinstance(v, Decimal):
            v = float(v)
        out.append(v)
    return out


def open_readonly(db_path: str | Path):
    """A read-only connection for queries: no writes, and no access to files outside the database
    (read_csv, COPY … TO, ATTACH are refused), so a query from --sql-dir cannot change or leak data."""
    from . import store

    con = store.open_db(db_path, read_only=True)
    # A bound on what one query may hold in memory (DuckDB spills or fails the query past it,
    # instead of growing to 80% of RAM); SLOWCARD_QUERY_MEMORY overrides it (e.g. 8GB).
    try:
        con.execute(f"SET memory_limit = '{_query_memory()}'")
    except duckdb.Error as exc:
        con.close()
        raise UsageError(f"SLOWCARD_QUERY_MEMORY: {str(exc).splitlines()[0]}") from None
    # The Parquet files of the Dask path (slowcard/lake.py) are the database's own rows: those
    # registered files, and nothing else, stay readable (a query is one SELECT: it cannot write).
    paths = lake_paths(con)
    if paths:
        con.execute("SET allowed_paths = ?", [paths])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def lake_paths(con) -> list[str]:
    """The Parquet files a database reads in place (``lake_files``; none in a database of a
    version before the lake)."""
    try:
        return [r[0] for r in con.execute("SELECT path FROM lake_files ORDER BY path").fetchall()]
    except duckdb.CatalogException:
        return []


def _sql_literal(value, typ: str) -> str:
    if typ == "VARCHAR":
        # one line whatever the value holds: a newline in a run name must not start a line of the
        # script (the duckdb shell reads a line starting with '.' as a command); control
        # characters are spelled chr(N)
        text = "'" + str(value).replace("'", "''") + "'"
        return re.sub(r"[\x00-\x1f\x7f]", lambda m: f"' || chr({ord(m.group())}) || '", text)
    if typ == "BOOLEAN":
        return "true" if value else "false"
    return f"CAST({value!r} AS {typ})"


def shell_refusal(query: Query) -> str | None:
    """Why `slowcard show` must not print a query for the duckdb shell (None: it may): what
    `slowcard query` refuses. A query runs as exactly one SELECT on a read-only connection
    without file access; the shell runs whatever it is given, `.shell` lines and COPY included."""
    try:
        statements = duckdb.extract_statements(query.body)
    except duckdb.Error as exc:
        return f"its body does not parse as one SQL statement ({str(exc).splitlines()[0][:160]})"
    if len(statements) != 1:
        return (
            f"its body holds {len(statements)} SQL statements; a query is exactly one statement, a SELECT "
            "(see docs/contract.md)"
        )
    if statements[0].type != duckdb.StatementType.SELECT:
        return f"its body is a {statements[0].type.name} statement, not a SELECT (see docs/contract.md)"
    return None


def check_shell_safe(query: Query) -> None:
    """UsageError when `slowcard show` must not print the query (``shell_refusal``)."""
    why = shell_refusal(query)
    if why:
        raise UsageError(f"{query.path}: {why}; `slowcard query` refuses this query, so `show` does not print it")


def shell_sql(
    query: Query, run: str | None = None, params: dict | None = None, allowed_paths: Sequence[str] = ()
) -> str:
    """The query as a script for the `duckdb` shell: its header as comments, one ``SET VARIABLE``
    per parameter (defaults overlaid with ``params``; ``run`` the given run, else the database's
    first run), and the body with each ``$name`` read by ``getvariable('name')``. Piped into
    ``duckdb DB`` it prints the query's rows; edit a SET line to try another value.
    ``allowed_paths``: the database's lake files (``lake_paths``), left readable in the sandbox."""
    check_shell_safe(query)
    values = bind_params(query, params)
    head = query.path.read_text(encoding="utf-8").splitlines()
    header = head[: next((i for i, line in enumerate(head) if not line.startswith("--")), len(head))]
    lines = [
        *header,
        "",
        f"-- For the duckdb shell: slowcard show {query.name} | duckdb slowcard.duckdb",
        "-- (parameters are variables: change a value below to try another)",
        "-- the sandbox of `slowcard query`: no file access, settings locked",
        *(
            ["-- but the database's own Parquet files (Dask ingest, lake_files)"]
            + ["SET allowed_paths = [" + ", ".join(_sql_literal(p, "VARCHAR") for p in allowed_paths) + "];"]
            if allowed_paths
            else []
        ),
        "SET enable_external_access = false;",
        "SET lock_configuration = true;",
    ]
    if query.scope == "fleet":
        lines.append("-- every run of the database (scope: fleet); `slowcard fleet` judges new runs first")
    else:
        if run is None:
            lines.append("-- run: the database's first run (or write 'NAME')")
        run_value = (
            _sql_literal(run, "VARCHAR")
            if run is not None
            else "(SELECT run FROM runs ORDER BY created_at, run LIMIT 1)"
        )
        lines.append(f"SET VARIABLE run = {run_value};")
        if values.get("before_run"):  # as run_query: a query given the run before reads both runs
            lines.append("-- the views read every run: the query compares run with before_run")
        else:
            lines.append(
                "SET VARIABLE slowcard_scope = getvariable('run');  -- views read this run only; "
                "RESET VARIABLE slowcard_scope: all"
            )
    types = {p.name: p.type for p in query.params}
    for name, value in values.items():
        lines.append(f"SET VARIABLE {name} = {_sql_literal(value, types[name])};")
    # $name -> getvariable('name'), in code only (never inside a string literal or a comment)
    out, pos = [], 0
    for m in _LEXEMES.finditer(query.body):
        out.append(_DOLLAR.sub(lambda d: f"getvariable('{d.group(1)}')", query.body[pos : m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_DOLLAR.sub(lambda d: f"getvariable('{d.group(1)}')", query.body[pos:]))
    # the ';' on a line of its own: a body may end with a -- comment
    lines += ["", "".join(out).rstrip(), ";"]
    return "\n".join(lines)
