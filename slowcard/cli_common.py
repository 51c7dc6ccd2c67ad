"""What every `slowcard` command shares: the options declared once, the one error boundary, run
picking and the progress line. Part of the command line (it may print to stderr and exit).

The error boundary (``error_boundary``, around the command group's commands): a library error (SlowcardError)
or a missing file ends the command with ``Error: <message>`` on stderr and exit code 2; with
``--debug`` (``slowcard --debug CMD`` or anywhere on the command line) it is re-raised with its
traceback instead.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from . import queries as queries_mod
from .errors import SlowcardError, UsageError
from .render import safe_field

DEFAULT_DB = "slowcard.duckdb"

# Options several commands take, declared once.
DbOption = Annotated[Path, typer.Option("--db", help="DuckDB database file.")]
SqlDirOption = Annotated[
    list[Path] | None, typer.Option("--sql-dir", help="Extra folder of query files (same header rules).")
]
RunOption = Annotated[str | None, typer.Option("--run", help="Run name (default: the latest run).")]
StrictOption = Annotated[bool, typer.Option("--strict", help="Exit 1 on WARN too.")]
LimitOption = Annotated[int, typer.Option("--limit", help="Rows shown per table in table formats (0: all).")]
FormatOption = Annotated[str, typer.Option("--format", "-f", help="table | json (query: also csv | markdown)")]
DebugOption = Annotated[bool, typer.Option("--debug", help="Re-raise library errors with their traceback.")]


def debug_on(ctx=None) -> bool:
    """--debug given (to the group, or anywhere on the command line through ``main``)."""
    return bool(ctx is not None and ctx.params.get("debug")) or os.environ.get("SLOWCARD_DEBUG") == "1"


@contextmanager
def error_boundary(ctx=None):
    """The one place where library errors become exit code 2: around the command group's commands
    (``Commands``) and around the commands that ``cli.main`` runs without typer (``cli._run_fast``)."""
    try:
        yield
    except (SlowcardError, FileNotFoundError) as exc:
        if debug_on(ctx):
            raise
        typer.echo(safe_field(f"Error: {exc}"), err=True)  # one line whatever names it holds
        raise typer.Exit(2) from None


class Commands(TyperGroup):
    """The command group: its commands run inside the error boundary."""

    def invoke(self, ctx):
        with error_boundary(ctx):
            return super().invoke(ctx)


def fail(msg: str, code: int = 2):
    """Print ``Error: msg`` on stderr and exit (for checks of the command line itself)."""
    typer.echo(safe_field(f"Error: {msg}"), err=True)
    raise typer.Exit(code)


def check_format(fmt: str, allowed) -> None:
    if fmt not in allowed:
        fail(f"--format {fmt!r}: expected one of {', '.join(allowed)}")


def pick_runs(
    con, run: list[str] | None, all_runs: bool = False, choose: str = "--run NAME or --all-runs"
) -> list[str]:
    """The runs to work on: the given ones (checked), all, or the latest (with a note on stderr)."""
    known = queries_mod.runs(con)
    if not known:
        raise UsageError("the database holds no run yet; run `slowcard ingest PATH --db FILE` first")
    if all_runs:
        return known
    if run:
        missing = [r for r in run if r not in known]
        if missing:
            raise UsageError(f"no run named {', '.join(map(repr, missing))}; runs in the database: {', '.join(known)}")
        return list(run)
    if len(known) > 1:
        typer.echo(
            f"note: {len(known)} runs in the database; using the latest, {known[-1]!r} ({choose} to choose)", err=True
        )
    return [known[-1]]


def pick_run(con, run: str | None) -> str:
    """One run: the given one (checked) or the latest."""
    return pick_runs(con, [run] if run else None, choose="--run NAME")[0]


def progress_printer():
    """A one-line progress bar on stderr when it is a terminal; nothing otherwise."""
    if not sys.stderr.isatty():
        return None

    def show(state: dict):
        mb_done = state["bytes_done"] / 1e6
        mb_total = state["bytes_total"] / 1e6
        cur = safe_field(Path(state["current"]).name) if state.get("current") else ""
        sys.stderr.write(
            f"\r[{state['files_done']}/{state['files_total']} files] {mb_done:,.1f}/{mb_total:,.1f} MB "
            f"{state['events']:,} rows  {cur[:40]:<40}"
        )
        if state["files_done"] == state["files_total"]:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show
