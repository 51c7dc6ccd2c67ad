"""Export the tables as Hive-partitioned Parquet (``<dir>/<table>/run=…/rank=…/*.parquet``),
readable as-is by DuckDB, pyarrow, Spark or pandas. Writes files; prints nothing.

What is exported: every table or view of the contract that has a ``run`` column and no leading
underscore (events, ops, sources, moe_layer_facts, batches, expert_load, …). Relations with a
``rank`` column are partitioned by run and rank, the others by run.
"""

from __future__ import annotations

from pathlib import Path

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


def export_parquet(con, out_dir: str | Path, runs: list[str] | None = None,
                   tables: list[str] | None = None) -> dict[str, int]:
    """Write the tables; returns rows written per table. ``runs`` None means every run."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    available = dict(exportable(con))
    chosen = tables or list(available)
    unknown = [t for t in chosen if t not in available]
    if unknown:
        raise UsageError(f"cannot export {', '.join(unknown)}; exportable: {', '.join(available)}")
    written = {}
    for table in chosen:
        where = ""
        params: list = []
        if runs:
            where = "WHERE run IN (SELECT unnest(?))"
            params = [runs]
        n = con.execute(f'SELECT count(*) FROM "{table}" {where}', params).fetchone()[0]
        if n == 0:
            continue
        parts = "run, rank" if available[table] else "run"
        target = out / table
        con.execute(
            f"""COPY (SELECT * FROM "{table}" {where}) TO '{_quote(target)}'
                (FORMAT PARQUET, PARTITION_BY ({parts}), OVERWRITE_OR_IGNORE TRUE, COMPRESSION ZSTD)""",
            params,
        )
        written[table] = n
    return written


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")
