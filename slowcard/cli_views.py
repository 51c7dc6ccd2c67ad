"""The `report` and `annotate` commands (added to the typer app by ``register(app)``).

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


def register(app: typer.Typer) -> None:
    """Add the `report` and `annotate` commands to ``app``."""

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
        from .report import build_report

        con = queries_mod.open_readonly(db)
        try:
            chosen = pick_run(con, run)
            results, conclusion, catalog = _results(con, chosen, sql_dir)
            page = build_report(con, chosen, results, conclusion=conclusion, catalog=catalog)
        finally:
            con.close()
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(page, encoding="utf-8")
        except OSError as exc:
            fail(f"{out}: cannot write the report ({exc.strerror or exc})", 2)
        bad = sorted(r.query for r in results.values() if r.status == Status.ERROR)
        typer.echo(f"wrote {out} (run {chosen!r}, {len(page) / 1e6:.1f} MB)")
        if bad:
            typer.echo(f"warning: these queries ended in ERROR and show as such in the report: {', '.join(bad)}",
                       err=True)
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
        typer.echo(f"wrote {out}: {stats.events:,} events of {stats.processes} process(es), "
                   f"slow card(s): {slow}, {stats.markers} arrival marker(s), {stats.flows} flow(s), "
                   f"{stats.verdicts} verdict(s)"
                   + (f"; {stats.moved_events} overlapping event(s) moved to {stats.overlap_threads} extra "
                      "thread(s)" if stats.moved_events else ""))
        raise typer.Exit(0)
