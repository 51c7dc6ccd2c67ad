"""What every `slowcard` command shares: the options declared once, the one error boundary, run
picking, the width and style of the screen, and the ingest progress bar. Part of the command line (it may print to stderr and exit).

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
VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="Everything, unfolded: every card, finding, bar and query line.")
]
WideOption = Annotated[bool, typer.Option("--wide", help="Every column of every table (default: the headline ones).")]
LimitOption = Annotated[int, typer.Option("--limit", help="Rows shown per table in table formats (0: all).")]
FormatOption = Annotated[
    str, typer.Option("--format", "-f", help="table | json | markdown (query: also csv; compare: table | json)")
]
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
    """The command group: its commands run inside the error boundary; their help shows a flag
    as a flag (``--strict``), not as an option taking a value (typer writes ``<bool>``), and the
    commands list shows each command's first paragraph as one wrapped line."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for command in [self, *self.commands.values()]:
            for param in command.params:
                _as_flag(param)
            command.get_help_option = _help_as_flag(command.get_help_option)
            if command is not self and command.help and not command.short_help:
                # the commands list shows the first paragraph on one line, wrapped to the screen
                command.short_help = " ".join(command.help.strip().split("\n\n")[0].split())

    def invoke(self, ctx):
        with error_boundary(ctx):
            return super().invoke(ctx)


def _as_flag(param) -> None:
    if getattr(param, "is_flag", False) and param.metavar is None:
        param.metavar = ""


def _help_as_flag(get_help_option):
    """A command's get_help_option whose --help shows as a flag too."""

    def wrapped(ctx):
        option = get_help_option(ctx)
        if option is not None:
            _as_flag(option)
        return option

    return wrapped


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


def screen_width() -> int:
    """Columns to fit output to: $COLUMNS, else the terminal's, else 100 (a file or a pipe)."""
    import shutil

    return max(shutil.get_terminal_size(fallback=(100, 30)).columns, 60)


def screen_style(stream=None):
    """How to draw on ``stream`` (stdout): (picture.Style, colour). Block characters on a
    terminal; colour only there, and never with NO_COLOR set (https://no-color.org) or TERM=dumb."""
    from .renderers.picture import Style

    stream = stream or sys.stdout
    tty = bool(getattr(stream, "isatty", lambda: False)())
    colour = tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
    return Style(unicode=tty), colour


def echo_screen(text: str, colour: bool) -> None:
    """Print a screen; with ``colour``, escaped first (names from traces stay inert) and then
    coloured, written past the output filter that would escape the colour codes again."""
    if not colour:
        typer.echo(text)
        return
    from .render import terminal_safe
    from .renderers.terminal import colour as add_colour

    out = add_colour(terminal_safe(text)) + "\n"
    stream = getattr(sys.stdout, "unfiltered", sys.stdout)
    stream.write(out)
    stream.flush()


def progress_printer():
    """Ingest progress on stderr through rich (files, bytes, rate, time left, rows, the file
    being read) when stderr is a terminal; None (silent) otherwise."""
    if not sys.stderr.isatty():
        return None
    return _Progress()


class _Progress:
    """The ingest progress callback: one rich progress bar per batch of files (``ingest_runs``
    starts a batch per run; a new total starts a new bar)."""

    def __init__(self):
        self.bar = None
        self.task = None
        self.totals = None

    def __call__(self, state: dict) -> None:
        totals = (state["files_total"], state["bytes_total"])
        if self.bar is None or totals != self.totals:
            self.close()
            self.start(state)
        from rich.markup import escape

        from .render import safe_field

        current = Path(state["current"]).name if state.get("current") else ""
        assert self.bar is not None and self.task is not None
        self.bar.update(
            self.task,
            completed=state["bytes_done"],
            files=f"{state['files_done']}/{state['files_total']} files",
            rows=f"{state['events']:,} rows",
            current=escape(safe_field(current)[:40]),
        )
        if state["files_done"] >= state["files_total"]:
            self.close()

    def start(self, state: dict) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        # the terminal itself: the output filter (cli._TerminalSafe) would escape rich's cursor moves
        console = Console(file=getattr(sys.stderr, "unfiltered", sys.stderr))
        self.bar = Progress(
            TextColumn("{task.fields[files]}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[rows]}  {task.fields[current]}"),
            console=console,
            transient=False,
        )
        self.bar.start()
        self.totals = (state["files_total"], state["bytes_total"])
        self.task = self.bar.add_task("ingest", total=state["bytes_total"] or None, files="", rows="", current="")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        self.bar = self.task = None


def exit_code(results, strict: bool = False) -> int:
    """1 when a result FAILs or ERRORs (WARN too with ``strict``), else 0."""
    from .verdict import Status

    bad = {Status.FAIL, Status.ERROR} | ({Status.WARN} if strict else set())
    return 1 if any(r.status in bad for r in results) else 0
