"""Operator taxonomy: op-name patterns -> op class (grouped_matmul, dispatch, combine, gating,
collective + kind, moe_layer, step, …).

The built-in patterns live in ``taxonomy.csv`` beside this module; users extend or override them
without editing the package, with ``slowcard ingest --taxonomy FILE`` (same CSV columns;
``store.load_user_taxonomy`` from Python) or plain
INSERTs into ``op_taxonomy`` with origin 'user'. User rows always win over built-in rows; within
an origin the lower priority wins. Classification itself happens in SQL (``views/10_classes.sql``,
view ``_name_class``), so it shows which pattern classified what.
"""

from __future__ import annotations

import csv
import importlib.resources as resources
import io
from pathlib import Path

import duckdb

from .errors import UsageError

COLUMNS = ("pattern", "op_class", "coll_kind", "priority")
OP_CLASSES = {
    "grouped_matmul",
    "dispatch",
    "combine",
    "gating",
    "collective",
    "moe_layer",
    "moe_fused",
    "step",
    "compute",
}
COLL_KINDS = {"all_to_all", "all_reduce", "all_gather", "reduce_scatter", "send_recv", "broadcast", "other"}


def builtin_text() -> str:
    return (resources.files("slowcard") / "taxonomy.csv").read_text("utf-8")


def parse(text: str, where: str) -> list[tuple]:
    """Rows (pattern, op_class, coll_kind, priority) of a taxonomy CSV; '#' lines are comments."""
    lines = [ln for ln in io.StringIO(text) if ln.strip() and not ln.lstrip().startswith("#")]
    reader = csv.DictReader(lines)
    if reader.fieldnames is None or set(COLUMNS) - set(reader.fieldnames):
        raise UsageError(f"{where}: a taxonomy CSV needs the header {','.join(COLUMNS)}")
    rows = []
    for i, r in enumerate(reader, start=2):
        cls, kind = r["op_class"].strip(), (r["coll_kind"] or "").strip() or None
        if cls not in OP_CLASSES:
            raise UsageError(f"{where}:{i}: op_class {cls!r} is not one of {', '.join(sorted(OP_CLASSES))}")
        if kind is not None and kind not in COLL_KINDS:
            raise UsageError(f"{where}:{i}: coll_kind {kind!r} is not one of {', '.join(sorted(COLL_KINDS))}")
        try:
            prio = int(r["priority"])
        except (TypeError, ValueError):
            raise UsageError(f"{where}:{i}: priority must be an integer") from None
        rows.append((r["pattern"].strip(), cls, kind, prio))
    return rows


def _check_patterns(con, rows, where: str) -> None:
    for pattern, *_ in rows:
        try:
            con.execute("SELECT regexp_matches('', ?)", [pattern]).fetchall()
        except duckdb.Error as exc:
            raise UsageError(f"{where}: pattern {pattern!r} is not a valid regular expression ({exc})") from None


def load_builtin(con) -> None:
    rows = parse(builtin_text(), "slowcard/taxonomy.csv")
    con.execute("DELETE FROM op_taxonomy WHERE origin = 'builtin'")
    _insert(con, rows, "builtin")
    define_builtin_prefilter(con, rows)


def _sql_literal(v) -> str:
    """A taxonomy value (pattern, class, priority or NULL) as a DuckDB literal."""
    if v is None:
        return "NULL"
    if isinstance(v, int):
        return str(int(v))
    return "'" + str(v).replace("'", "''") + "'"


def define_builtin_prefilter(con, rows: list[tuple]) -> None:
    """(Re)write two macros over the built-in patterns, each with CONSTANT regexes (compiled once
    per query; a join with the pattern column compiles every pattern for every name, see
    views/10_classes.sql): ``_builtin_taxonomy_any(name)``, true when ``name`` matches any
    built-in pattern (one alternation: RE2 runs it in one pass), and
    ``_builtin_taxonomy_hit(name)``, the winning built-in pattern (lowest priority, then file
    order). User rows are matched separately there, so they never go stale here."""
    alternation = "|".join(f"(?:{pattern})" for pattern, *_ in rows) or "$^"
    con.execute(
        f"CREATE OR REPLACE MACRO _builtin_taxonomy_any(name) AS regexp_matches(name, {_sql_literal(alternation)}, 'i')"
    )
    ordered = sorted(enumerate(rows), key=lambda ir: (ir[1][3], ir[0]))
    whens = " ".join(
        f"WHEN regexp_matches(name, {_sql_literal(pattern)}, 'i') THEN {_sql_literal(pattern)}"
        for _, (pattern, *_rest) in ordered
    )
    con.execute(
        "CREATE OR REPLACE MACRO _builtin_taxonomy_hit(name) AS " + (f"CASE {whens} END" if whens else "NULL::VARCHAR")
    )


def _insert(con, rows: list[tuple], origin: str) -> None:
    """One statement for all rows (executemany runs one statement per row), values as literals:
    DuckDB's Python client tries `import pandas` for every bound parameter (540 here), a sys.path
    search each when pandas is not installed (~30 ms of every new database)."""
    if rows:
        values = ", ".join("(" + ", ".join(_sql_literal(v) for v in (*row, origin)) + ")" for row in rows)
        con.execute(f"INSERT INTO op_taxonomy VALUES {values}")


def read_user_taxonomy(con, path: str | Path) -> list[tuple]:
    """The checked rows of a user taxonomy CSV (patterns compiled by DuckDB). Raises UsageError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{p}: cannot read the taxonomy file ({exc})") from None
    rows = parse(text, str(p))
    _check_patterns(con, rows, str(p))
    return rows


def replace_user_rows(con, rows: list[tuple]) -> None:
    """Add user rows, replacing the user rows of the same patterns (inside the caller's
    transaction; the caller rebuilds what is derived from the taxonomy: ``store.load_user_taxonomy``)."""
    con.execute(
        "DELETE FROM op_taxonomy WHERE origin = 'user' AND list_contains(?, pattern)", [[row[0] for row in rows]]
    )
    # a pattern given twice in one file: the last row wins, as it did row by row
    _insert(con, list({row[0]: row for row in rows}.values()), "user")


# ------------------------------------------------------------------ what the taxonomy matched


def usage(con, run: str, include_unused: bool = False) -> tuple[list[str], list[tuple]]:
    """Per taxonomy row: what it classified in ``run`` (operations, distinct names, total time,
    example names). Classifications that come from elsewhere (a kernel's "Collective name" arg,
    an NCCL kernel launched inside a host all-to-all) get a row of their own. With
    ``include_unused`` the rows that matched nothing are listed too (with 0)."""
    cols = ["op_class", "coll_kind", "pattern", "origin", "priority", "ops", "names", "total_ms", "examples"]
    rows = con.execute(
        """
        WITH hits AS (
            SELECT op_class, coll_kind, pattern, count(*) AS ops, count(DISTINCT name) AS names,
                   round(sum(dur_ns) / 1e6, 3) AS total_ms,
                   list(DISTINCT left(name, 90) ORDER BY left(name, 90))[1:3] AS examples
            FROM op_classes WHERE run = ?
            GROUP BY ALL
        ),
        rules AS (
            SELECT pattern, op_class, coll_kind, origin, priority FROM op_taxonomy
            QUALIFY row_number() OVER (PARTITION BY pattern ORDER BY origin = 'user' DESC) = 1
        )
        SELECT coalesce(h.op_class, r.op_class), coalesce(h.coll_kind, r.coll_kind),
               coalesce(h.pattern, r.pattern), coalesce(r.origin, 'derived'), r.priority,
               coalesce(h.ops, 0), coalesce(h.names, 0), coalesce(h.total_ms, 0),
               array_to_string(coalesce(h.examples, []), ' | ')
        FROM hits h FULL JOIN rules r ON h.pattern = r.pattern AND h.op_class = r.op_class
        WHERE h.ops IS NOT NULL OR ?
        ORDER BY 1, coalesce(h.total_ms, 0) DESC, 3
        """,
        [run, include_unused],
    ).fetchall()
    return cols, rows


def unmatched(con, run: str, limit: int = 20) -> tuple[list[str], list[tuple]]:
    """The unclassified names of ``run`` that cost the most time: device kernels, device
    annotations, cpu_ops and user annotations (python frames are left out: too many). These are
    the names a new stack's taxonomy rows would have to match."""
    cols = ["cat", "name", "ops", "total_ms"]
    rows = con.execute(
        """
        SELECT e.cat, left(e.name, 160), count(*) AS ops, round(sum(e.dur_ns) / 1e6, 3) AS total_ms
        FROM events e
        WHERE e.run = ? AND e.ph = 'X' AND e.dur_ns IS NOT NULL
          AND e.cat IN ('kernel', 'gpu_user_annotation', 'cpu_op', 'user_annotation')
          AND NOT EXISTS (SELECT 1 FROM op_classes o WHERE o.source_id = e.source_id AND o.name = e.name)
        GROUP BY ALL
        ORDER BY total_ms DESC, 2
        LIMIT ?
        """,
        [run, limit],
    ).fetchall()
    return cols, rows


def classify_names(con, names: list[str]) -> tuple[list[str], list[tuple]]:
    """How the taxonomy of ``con`` (built-in plus user rows) classifies each of ``names``."""
    cols = ["name", "op_class", "coll_kind", "pattern", "origin"]
    rows = con.execute(
        "SELECT name, op_class, coll_kind, pattern, origin FROM _classify_names(?)", [list(names)]
    ).fetchall()
    order = {n: i for i, n in enumerate(names)}
    return cols, sorted(rows, key=lambda r: order.get(r[0], 0))
