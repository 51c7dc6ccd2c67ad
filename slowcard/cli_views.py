"""The `report`, `annotate` and `show-taxonomy` commands (added to the typer app by ``register(app)``).

Like the rest of the CLI they print only through typer.echo and exit with typer.Exit:
0 written, 2 usage or input error (unknown run, missing database, plotly not installed; library
errors reach the group's error boundary, ``cli_common.Commands``).
"""

from __future__ import annotations

from pathlib import Path

import typer

from . import queries as queries_mod
from .cli_common import DEFAULT_DB, DbOption, RunOption, SqlDirOption, fail, pick_run
from .verdict import Status


def _results(con, run: str, sql_dir) -> tuple[dict, dict, dict]:
    """Every query's result for the run (in the diagnosis order), the diagnosis conclusion and
    the catalog (built-in queries and those of ``--sql-dir``)."""
    from .diagnosis import diagnose

    catalog = queries_mod.load_catalog(sql_dir)
    diag = diagnose(con, run, catalog)
    return dict(diag.results), diag.conclusion, catalog


def _table(cols, rows, fmt: str) -> str:
    if fmt == "json":
        import json

        return json.dumps([dict(zip(cols, r)) for r in rows], indent=1, default=str)
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(cols)
        w.writerows(rows)
        return buf.getvalue().rstrip("\n")
    from tabulate import tabulate

    return tabulate(rows, headers=cols, tablefmt="simple", missingval="NULL")


def register(app: typer.Typer) -> None:
    """Add the `report`, `annotate` and `show-taxonomy` commands to ``app``."""

    @app.command("show-taxonomy")
    def show_taxonomy(
        db: DbOption = Path(DEFAULT_DB),
        run: RunOption = None,
        name: list[str] | None = typer.Option(
            None, "--name", help="Only classify these op/kernel names (repeatable); no run needed."
        ),
        taxonomy_file: Path | None = typer.Option(
            None,
            "--taxonomy",
            help="With --name: also apply this user taxonomy CSV (pattern,op_class,coll_kind,priority).",
        ),
        unmatched: int = typer.Option(
            15,
            "--unmatched",
            help="Also list the N costliest unclassified kernels / cpu_ops / annotations of the run (0: none).",
        ),
        all_rows: bool = typer.Option(False, "--all", help="Also list taxonomy rows that matched nothing in the run."),
        fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json"),
    ):
        """Show what each taxonomy row (built-in or --taxonomy user row) classified in a run:
        operations, names, time and examples per pattern, then the costliest names nothing
        matched, which is where the rows for a new MoE stack come from. With --name, classify
        the given names only.

        Examples:
            slowcard show-taxonomy --db ep.duckdb
            slowcard show-taxonomy --name 'void deep_ep::internode::dispatch<...>' --name fused_moe_kernel
        """
        from . import store
        from . import taxonomy as taxonomy_mod

        if fmt not in ("table", "csv", "json"):
            fail(f"--format must be table, csv or json, not {fmt!r}")
        if name:
            if taxonomy_file is not None or not db.exists():
                # a scratch database: the built-in rows, plus the user file when given
                con = store.open_db(":memory:")
                if taxonomy_file is not None:
                    store.load_user_taxonomy(con, taxonomy_file)
            else:
                con = queries_mod.open_readonly(db)
            try:
                cols, rows = taxonomy_mod.classify_names(con, list(name))
            finally:
                con.close()
            typer.echo(_table(cols, rows, fmt))
            raise typer.Exit(0)
        con = queries_mod.open_readonly(db)
        try:
            chosen = pick_run(con, run)
            cols, rows = taxonomy_mod.usage(con, chosen, include_unused=all_rows)
            extra = taxonomy_mod.unmatched(con, chosen, unmatched) if unmatched > 0 else None
        finally:
            con.close()
        if fmt == "json" and extra is not None:
            import json

            typer.echo(
                json.dumps(
                    {
                        "matched": [dict(zip(cols, r)) for r in rows],
                        "unmatched": [dict(zip(extra[0], r)) for r in extra[1]],
                    },
                    indent=1,
                    default=str,
                )
            )
            raise typer.Exit(0)
        if fmt == "table":
            typer.echo(f"taxonomy rows that classified operations of run {chosen!r}:")
        typer.echo(_table(cols, rows, fmt) if rows else "(none: no operation of this run matched the taxonomy)")
        if extra is not None and fmt != "json":
            typer.echo("")
            if fmt == "table":
                typer.echo(
                    "costliest names nothing matched (add rows for them with `slowcard ingest --taxonomy FILE`):"
                )
            typer.echo(_table(*extra, fmt) if extra[1] else "(none)")
        raise typer.Exit(0)

    @app.command()
    def report(
        out: Path = typer.Option(..., "--out", "-o", help="HTML file to write (one self-contained page)."),
        db: DbOption = Path(DEFAULT_DB),
        run: RunOption = None,
        sql_dir: SqlDirOption = None,
    ):
        """Write one self-contained HTML report (opens offline): MoE time per rank, wait heat
        maps, expert hotness, DP domains and every verdict, each figure naming its query.

        Example:
            slowcard report --db ep.duckdb --out report.html
        """
        from .renderers.html import build_report

        con = queries_mod.open_readonly(db)
        try:
            chosen = pick_run(con, run)
            results, conclusion, catalog = _results(con, chosen, sql_dir)
            page = build_report(con, chosen, results, conclusion=conclusion, catalog=catalog)
        finally:
            con.close()
        try:
            from .outfile import atomic_output

            with atomic_output(out) as f:
                f.write(page.encode("utf-8"))
        except OSError as exc:
            fail(f"{out}: cannot write the report ({exc.strerror or exc})", 2)
        bad = sorted(r.query for r in results.values() if r.status == Status.ERROR)
        typer.echo(f"wrote {out} (run {chosen!r}, {len(page) / 1e6:.1f} MB)")
        if bad:
            typer.echo(
                f"warning: these queries ended in ERROR and show as such in the report: {', '.join(bad)}", err=True
            )
        raise typer.Exit(0)

    @app.command()
    def annotate(
        out: Path = typer.Option(..., "--out", "-o", help="Chrome-trace JSON file to write."),
        db: DbOption = Path(DEFAULT_DB),
        run: RunOption = None,
        sql_dir: SqlDirOption = None,
    ):
        """Merge every rank of a run into one Chrome trace (clock offsets applied, one process
        per rank) with the findings marked: where the slow rank arrives last, arrows to the ranks
        that wait for it, and a track of verdicts. Opens in Perfetto UI and chrome://tracing.

        Example:
            slowcard annotate --db ep.duckdb --run kineto_cpu_ep4_hot1 --out merged.json
        """
        from .annotate import write_annotated

        con = queries_mod.open_readonly(db)
        try:
            chosen = pick_run(con, run)
            results, _, catalog = _results(con, chosen, sql_dir)
            try:
                stats = write_annotated(con, chosen, out, results, catalog=catalog)
            except FileNotFoundError:
                raise
            except OSError as exc:
                fail(f"{out}: cannot write the trace ({exc.strerror or exc})", 2)
        finally:
            con.close()
        slow = "; ".join(stats.slow_cards) or "none"
        typer.echo(
            f"wrote {out}: {stats.events:,} events of {stats.processes} process(es), "
            f"slow card(s): {slow}, {stats.markers} arrival marker(s), {stats.flows} flow(s), "
            f"{stats.verdicts} verdict(s)"
            + (
                f"; {stats.moved_events} overlapping event(s) moved to {stats.overlap_threads} extra thread(s)"
                if stats.moved_events
                else ""
            )
        )
        raise typer.Exit(0)
