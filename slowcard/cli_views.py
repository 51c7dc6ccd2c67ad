"""The `report` and `annotate` commands (added to the typer app by ``register(app)``).

Like the rest of the CLI they print only through typer.echo and exit with typer.Exit:
0 written, 2 usage or input error (unknown run, missing database, plotly not installed).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from . import queries as queries_mod
from .errors import SlowcardError, UsageError

DEFAULT_DB = "slowcard.duckdb"


def _fail(msg: str, code: int = 2):
    typer.echo(f"Error: {msg}", err=True)
    raise typer.Exit(code)


def _pick_run(con, run: Optional[str]) -> str:
    known = queries_mod.runs(con)
    if not known:
        raise UsageError("the database holds no run yet; run `slowcard ingest PATH --db FILE` first")
    if run:
        if run not in known:
            raise UsageError(f"no run named {run!r}; runs in the database: {', '.join(known)}")
        return run
    if len(known) > 1:
        typer.echo(f"note: {len(known)} runs in the database; using the latest, {known[-1]!r} (--run NAME to choose)",
                   err=True)
    return known[-1]


def _results(con, run: str, sql_dir) -> tuple[dict, dict]:
    """Every query's result for the run (in the diagnosis order) and the diagnosis conclusion."""
    from .diagnosis import diagnose

    diag = diagnose(con, run, queries_mod.load_catalog(sql_dir))
    return dict(diag.results), diag.conclusion


def register(app: typer.Typer) -> None:
    """Add the `report` and `annotate` commands to ``app``."""

    @app.command()
    def report(
        out: Path = typer.Option(..., "--out", "-o", help="HTML file to write (one self-contained page)."),
        db: Path = typer.Option(DEFAULT_DB, "--db", help="DuckDB database file."),
        run: Optional[str] = typer.Option(None, "--run", help="Run name (default: the latest run)."),
        sql_dir: Optional[List[Path]] = typer.Option(None, "--sql-dir", help="Extra folder of query files."),
    ):
        """Write one self-contained HTML report (opens offline): MoE time per rank, wait heat
        maps, expert hotness, DP domains and every verdict, each figure naming its query.

        Example:
            slowcard report --db ep.duckdb --out report.html
        """
        from .report import build_report

        try:
            con = queries_mod.open_readonly(db)
            try:
                chosen = _pick_run(con, run)
                results, conclusion = _results(con, chosen, sql_dir)
                page = build_report(con, chosen, results, conclusion=conclusion)
            finally:
                con.close()
            from .outfile import atomic_output

            with atomic_output(out) as f:
                f.write(page.encode("utf-8"))
        except (SlowcardError, FileNotFoundError) as exc:
            _fail(str(exc), 2)
        except OSError as exc:
            _fail(f"{out}: cannot write the report ({exc.strerror or exc})", 2)
        bad = sorted(r.query for r in results.values() if r.status == "ERROR")
        typer.echo(f"wrote {out} (run {chosen!r}, {len(page) / 1e6:.1f} MB)")
        if bad:
            typer.echo(f"warning: these queries ended in ERROR and show as such in the report: {', '.join(bad)}",
                       err=True)
        raise typer.Exit(0)

    @app.command()
    def annotate(
        out: Path = typer.Option(..., "--out", "-o", help="Chrome-trace JSON file to write."),
        db: Path = typer.Option(DEFAULT_DB, "--db", help="DuckDB database file."),
        run: Optional[str] = typer.Option(None, "--run", help="Run name (default: the latest run)."),
        sql_dir: Optional[List[Path]] = typer.Option(None, "--sql-dir", help="Extra folder of query files."),
    ):
        """Merge every rank of a run into one Chrome trace (clock offsets applied, one process
        per rank) with the findings marked: where the slow rank arrives last, arrows to the ranks
        that wait for it, and a track of verdicts. Opens in Perfetto UI and chrome://tracing.

        Example:
            slowcard annotate --db ep.duckdb --run kineto_cpu_ep4_hot1 --out merged.json
        """
        from .annotate import write_annotated

        try:
            con = queries_mod.open_readonly(db)
            try:
                chosen = _pick_run(con, run)
                results, _ = _results(con, chosen, sql_dir)
                stats = write_annotated(con, chosen, out, results)
            finally:
                con.close()
        except (SlowcardError, FileNotFoundError) as exc:
            _fail(str(exc), 2)
        except OSError as exc:
            _fail(f"{out}: cannot write the trace ({exc.strerror or exc})", 2)
        slow = ", ".join(f"rank {r}" for r in stats.slow_ranks) or "none"
        typer.echo(f"wrote {out}: {stats.events:,} events of {stats.processes} process(es), "
                   f"slow card(s): {slow}, {stats.markers} arrival marker(s), {stats.flows} flow(s), "
                   f"{stats.verdicts} verdict(s)"
                   + (f"; {stats.moved_events} overlapping event(s) moved to {stats.overlap_threads} extra "
                      "thread(s)" if stats.moved_events else ""))
        raise typer.Exit(0)
