"""Per-file rows kept as Parquet beside the database and read in place (the Dask path's lake).

Owns: the ``lake_files`` registry and the views ``<table>_all`` that every reader of the large
per-file tables goes through. A Dask worker writes a file's event rows (and the rows derived from
them: op classes, all-to-all splits) as Parquet under a Hive layout
``<lake>/<table>/run=<run>/rank=<rank>/<source_id>-<token>.parquet``; the coordinator registers
them (rows of ``lake_files``) in the same transaction as the file's ``sources`` row, and replaces
each view ``<table>_all`` with ``SELECT * FROM <table> UNION ALL SELECT … FROM read_parquet([the
registered files])``. So the rows are never copied into the database, a file appears whole or not
at all (an uncommitted registration is rolled back with the rest), and every view, query and the
duckdb shell read the same relation as before: the views join ``sources`` as always, so rows of
unregistered or pending files are never read.

The file list is written into the view as literals because DuckDB's ``read_parquet`` takes a
constant list only. The registered paths are absolute: the lake must stay where it was written
(it is part of the database; moving the database alone loses those rows' files).

Must not know any file format; imports nothing of slowcard (the store calls it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import quote

# Tables whose rows a Dask worker writes to the lake instead of staging them for a copy: the
# event tables and the rows derived from them (the large ones; the other per-file tables are
# small and still copied). Each has a view ``<table>_all`` in the DDL.
LAKE_TABLES = ("event_rows", "op_rows", "op_class_rows", "a2a_split_rows")

# A lake file's name: the source id it was written for, then a random token.
_FILE_NAME = re.compile(r"^(?P<sid>\d+)-[0-9a-f]{32}\.parquet$")


def view_name(table: str) -> str:
    return f"{table}_all"


def file_path(lake_dir: str | Path, table: str, run: str, rank: int | None, sid: int, token: str) -> Path:
    """Where a worker writes one table's rows of one file (the layout ``slowcard export`` writes:
    run and rank percent-encoded as DuckDB does; a file without a rank goes to ``rank=NULL``)."""
    part = "NULL" if rank is None else str(int(rank))
    return Path(lake_dir) / table / f"run={quote(run, safe='')}" / f"rank={part}" / f"{int(sid)}-{token}.parquet"


def _sql_str(s: str) -> str:
    return s.replace("'", "''")


def _columns(con, table: str) -> list[tuple[str, str]]:
    return [
        (r[0], r[1])
        for r in con.execute(
            # duckdb_columns(), not information_schema: half the cost, and this runs per registration
            "SELECT column_name, data_type FROM duckdb_columns() WHERE schema_name = 'main' "
            "AND table_name = ? ORDER BY column_index",
            [table],
        ).fetchall()
    ]


def rebuild_views(con, tables: Iterable[str] = LAKE_TABLES) -> None:
    """Make each ``<table>_all`` read the table and its registered Parquet files (inside the
    caller's transaction, if any)."""
    for table in tables:
        paths = [
            r[0]
            for r in con.execute(
                "SELECT path FROM lake_files WHERE table_name = ? ORDER BY source_id, path", [table]
            ).fetchall()
        ]
        sql = f'CREATE OR REPLACE VIEW "{view_name(table)}" AS SELECT * FROM "{table}"'
        if paths:
            # the table's own column order and types: a JSON column comes back from Parquet as text
            cols = ", ".join(f'CAST("{c}" AS {t}) AS "{c}"' for c, t in _columns(con, table))
            files = ", ".join(f"'{_sql_str(p)}'" for p in paths)
            sql += f" UNION ALL SELECT {cols} FROM read_parquet([{files}], hive_partitioning = false)"
        con.execute(sql)


def register(con, sid: int, files: Sequence[tuple[str, str, int]]) -> None:
    """Inside the caller's transaction: register a file's Parquet files (table, path, rows) and
    make the views read them."""
    if not files:
        return
    con.executemany(
        "INSERT INTO lake_files (source_id, table_name, path, n_rows) VALUES (?, ?, ?, ?)",
        [(sid, t, str(p), n) for t, p, n in files],
    )
    rebuild_views(con, sorted({t for t, _p, _n in files}))


def unregister(con, sids: Sequence[int] = (), tables: Sequence[str] = ()) -> list[str]:
    """Inside the caller's transaction: forget the lake files of sources ``sids`` or of whole
    ``tables`` (derived rows rebuilt in the database), and make the views stop reading them.
    Returns their paths, for the caller to delete once its transaction has committed."""
    rows = con.execute(
        "SELECT table_name, path FROM lake_files WHERE list_contains(?::INTEGER[], source_id) "
        "OR list_contains(?::VARCHAR[], table_name)",
        [list(sids), list(tables)],
    ).fetchall()
    if not rows:
        return []
    con.execute(
        "DELETE FROM lake_files WHERE list_contains(?::INTEGER[], source_id) OR list_contains(?::VARCHAR[], table_name)",
        [list(sids), list(tables)],
    )
    rebuild_views(con, sorted({t for t, _p in rows}))
    return [p for _t, p in rows]


def delete_files(paths: Iterable[str]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass


def remove_unregistered(con, lake_dir: str | Path, sids: Iterable[int] | None = None) -> int:
    """Delete the Parquet files under ``lake_dir`` that no committed file registers: those of a
    worker or coordinator killed before the registration committed, or of rows since replaced.
    ``sids``: only the files written for these source ids (a task that failed). Only names the
    workers write (``<sid>-<token>.parquet``) are touched. Returns how many were deleted."""
    root = Path(lake_dir)
    if not root.is_dir():
        return 0
    wanted = None if sids is None else {int(s) for s in sids}
    if wanted is not None and not wanted:
        return 0
    registered = {r[0] for r in con.execute("SELECT path FROM lake_files").fetchall()}
    n = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            m = _FILE_NAME.match(name)
            if not m or (wanted is not None and int(m.group("sid")) not in wanted):
                continue
            path = os.path.join(dirpath, name)
            if path not in registered:
                try:
                    os.unlink(path)
                    n += 1
                except OSError:
                    pass
    return n
