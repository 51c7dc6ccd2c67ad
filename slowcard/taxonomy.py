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
OP_CLASSES = {"grouped_matmul", "dispatch", "combine", "gating", "collective", "moe_layer", "moe_fused",
              "step", "compute"}
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


def _insert(con, rows: list[tuple], origin: str) -> None:
    """One statement for all rows (executemany runs one statement per row)."""
    if rows:
        values = ", ".join(["(?, ?, ?, ?, ?)"] * len(rows))
        con.execute(f"INSERT INTO op_taxonomy VALUES {values}",
                    [v for row in rows for v in (*row, origin)])


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
    con.execute("DELETE FROM op_taxonomy WHERE origin = 'user' AND list_contains(?, pattern)",
                [[row[0] for row in rows]])
    # a pattern given twice in one file: the last row wins, as it did row by row
    _insert(con, list({row[0]: row for row in rows}.values()), "user")
