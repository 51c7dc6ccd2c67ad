"""Export the tables as Hive-partitioned Parquet (``<dir>/<table>/run=…/rank=…/*.parquet``),
readable as-is by DuckDB, pyarrow, Spark or pandas. Writes files; prints nothing.

What is exported: every table or view of the contract that has a ``run`` column and no leading
underscore (events, ops, sources, moe_layer_facts, batches, expert_load, …). Relations with a
``rank`` column are partitioned by run and rank, the others by run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import unquote

from . import tempspace
from .errors import UsageError


def exportable(con) -> list[tuple[str, bool]]:
    """(relation, has_rank) for every exportable table / view."""
    rows = con.execute(
        """SELECT table_name, bool_or(column_name = 'rank') AS has_rank
           FROM information_schema.columns
           WHERE table_schema = 'main' AND NOT starts_with(table_name, '_')
           GROUP BY table_name
           HAVING bool_or(column_name = 'run')
           ORDER BY table_name"""
    ).fetchall()
    return [(name, bool(has_rank)) for name, has_rank in rows]


def export_parquet(
    con, out_dir: str | Path, runs: list[str] | None = None, tables: list[str] | None = None
) -> dict[str, int]:
    """Write the tables; returns rows written per table. ``runs`` None means every run.

    What is exported replaces what the folder held for it, never adds to it: without ``runs``
    each ``<dir>/<table>`` is replaced whole; with ``runs`` its ``run=…`` partitions of those runs
    (other runs' partitions stay). Each table is written into a staging folder inside ``out_dir``
    first and moved into place when complete, so a failed export leaves the previous one intact.
    """
    out = Path(out_dir)
    _prepare_folder(out)
    available = dict(exportable(con))
    chosen = tables or list(available)
    unknown = [t for t in chosen if t not in available]
    if unknown:
        raise UsageError(f"cannot export {', '.join(unknown)}; exportable: {', '.join(available)}")
    written = {}
    tempspace.clean_stale([out])  # staging of an export that was killed
    stage = tempspace.make_dir("export", out, hidden=True)
    try:
        for table in chosen:
            where = ""
            params: list = []
            if runs:
                where = "WHERE run IN (SELECT unnest(?))"
                params = [runs]
            n = con.execute(f'SELECT count(*) FROM "{table}" {where}', params).fetchone()[0]
            parts = "run, rank" if available[table] else "run"
            staged = stage / table
            if n:
                con.execute(
                    f"""COPY (SELECT * FROM "{table}" {where}) TO '{_quote(staged)}'
                        (FORMAT PARQUET, PARTITION_BY ({parts}), COMPRESSION ZSTD)""",
                    params,
                )
                written[table] = n
            _replace(out / table, staged, runs, stage / f"old-{table}")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return written


def _prepare_folder(out: Path) -> None:
    """The output folder exists and is writable, or a UsageError says why not."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: is a file, not a folder; --parquet takes a folder (it is created when missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (NotADirectoryError, FileExistsError):
        raise UsageError(f"{out}: cannot create the folder: a part of the path is a file") from None
    except OSError as exc:
        raise UsageError(f"{out}: cannot create the folder ({exc.strerror or exc})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"{out}: the folder is not writable; choose another --parquet folder")


def _run_of(partition: str) -> str | None:
    """The run a ``run=…`` partition folder holds (DuckDB percent-encodes special characters)."""
    return unquote(partition[4:]) if partition.startswith("run=") else None


def _replace(target: Path, staged: Path, runs: list[str] | None, old: Path) -> None:
    """Move what was staged for one table into place; what it replaces goes to ``old`` (inside
    the staging folder, removed with it)."""
    if runs is None:
        moved = target.exists()
        if moved:
            os.replace(target, old)
        if staged.exists():
            os.replace(staged, target)
        if moved:
            shutil.rmtree(old, ignore_errors=True)
        return
    if target.is_dir():
        for part in list(target.iterdir()):
            if _run_of(part.name) in runs:
                shutil.rmtree(part, ignore_errors=True)
    if staged.exists():
        target.mkdir(exist_ok=True)
        for part in staged.iterdir():
            os.replace(part, target / part.name)


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")
