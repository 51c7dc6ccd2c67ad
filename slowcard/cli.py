"""The `slowcard` command line: the only module that prints or exits.

Exit codes (the contract the README documents):
    0  success: every file ingested / no query FAILed or ERRORed (WARN too, unless --strict)
    1  some file failed or was salvaged / truncated; some query FAILed or ERRORed (or WARNed with --strict)
    2  usage or input error: bad option, unknown query, bad parameter, unreadable database

Library errors become exit code 2 in one place, the command group (``cli_common.Commands``);
``--debug`` re-raises them with the traceback. Options several commands share are declared once
in ``cli_common``.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import typer

from . import queries as queries_mod
from . import render
from .cli_common import (
    DEFAULT_DB,
    Commands,
    DbOption,
    DebugOption,
    FormatOption,
    LimitOption,
    SqlDirOption,
    StrictOption,
    VerboseOption,
    WideOption,
    check_format,
    echo_screen,
    exit_code,
    pick_runs,
    progress_printer,
    screen_style,
    screen_width,
)
from .errors import SlowcardError, UsageError
from .verdict import Status

app = typer.Typer(
    cls=Commands,
    add_completion=False,
    no_args_is_help=True,
    help="Find the slow card (rank, device, DP domain, expert) in profiler output of LLM clusters.",
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        import platform

        import duckdb

        from . import __version__

        typer.echo(f"slowcard {__version__} (duckdb {duckdb.__version__}, Python {platform.python_version()})")
        raise typer.Exit(0)


@app.callback()
def _main(
    debug: DebugOption = False,
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
):
    """Find the slow card (rank, device, DP domain, expert) in profiler output of LLM clusters."""


def _fail(msg: str, code: int = 2):
    typer.echo(render.safe_field(f"Error: {msg}"), err=True)
    raise typer.Exit(code)


@app.command()
def ingest(
    paths: list[str] = typer.Argument(..., help="Files, folders (walked recursively) or globs."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="DuckDB database file (created if missing)."),
    run: str | None = typer.Option(None, "--run", help="Run name (default: the folder given)."),
    jobs: int | None = typer.Option(
        None,
        "--jobs",
        "-j",
        min=1,
        help="Files parsed in parallel (default: one per core, up to 8, when every file is under 32 MB; else 1). "
        "Unless 1, .json and .json.gz traces up to 256 MB go in batches, their parts in one INSERT.",
    ),
    rank_pattern: str | None = typer.Option(
        None, "--rank-pattern", help="Regex on the path; group 'rank' (or the first group) is the rank."
    ),
    rank_map: Path | None = typer.Option(
        None, "--rank-map", help="CSV 'path,rank' or JSON {path-or-glob: rank}; overrides every other source."
    ),
    device_map: Path | None = typer.Option(
        None,
        "--device-map",
        help="CSV 'rank,host,device_id' or JSON {rank: {host, device_id}}: the physical device of each rank "
        "where the files do not say (slowcard fleet counts slow cards per device).",
    ),
    groups: list[Path] | None = typer.Option(
        None,
        "--groups",
        help='Parallel groups (TP/PP/DP/EP/stage) the files do not carry: JSON {"parallel_groups": '
        '[{"kind": "tp", "ranks": [0, 1]}]} or CSV kind,ranks[,name] (repeatable).',
    ),
    taxonomy: Path | None = typer.Option(
        None,
        "--taxonomy",
        help="CSV pattern,op_class,coll_kind,priority of user op-name patterns (win over built-ins).",
    ),
    run_per_folder: bool = typer.Option(
        False, "--run-per-folder", help="Each sub-folder of PATH is its own run, named after it."
    ),
    executor: str = typer.Option("local", "--executor", help="local | dask (parse files on Dask workers)."),
    scheduler: str | None = typer.Option(
        None, "--scheduler", help="Dask scheduler tcp://HOST:PORT (default: a LocalCluster on loopback)."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-file summary table."),
):
    """Stream profiler output into one DuckDB database, tagged with a run name.

    Example:
        slowcard ingest ../shared/realdata/kineto_cpu_ep4_hot1 --db ep.duckdb
    """
    from .ingest.runs import ingest_runs

    reports = ingest_runs(
        db,
        paths,
        run,
        run_per_folder=run_per_folder,
        taxonomy=taxonomy,
        executor=executor,
        scheduler=scheduler,
        jobs=jobs,
        rank_pattern=rank_pattern,
        rank_map=rank_map,
        device_map=device_map,
        groups=groups,
        progress=progress_printer(),
    )
    for report in reports:
        if not quiet:
            typer.echo(render.ingest_table(report))
        for w in report.warnings:
            typer.echo(render.safe_field(f"warning: {w}"), err=True)
        for f in report.files:
            if f.status in ("failed", "truncated", "salvaged"):
                typer.echo(
                    render.safe_field(
                        f"{f.status}: {f.path}: {f.message}" if f.path not in f.message else f"{f.status}: {f.message}"
                    ),
                    err=True,
                )
    raise typer.Exit(max(r.exit_code for r in reports))


def _parse_params(pairs: list[str] | None) -> dict:
    out = {}
    for p in pairs or []:
        if "=" not in p:
            raise UsageError(f"-p {p!r}: expected key=value")
        k, v = p.split("=", 1)
        out[k.strip()] = v
    return out


@app.command()
def query(
    names: list[str] = typer.Argument(None, help="Query names (default: every query)."),
    db: DbOption = Path(DEFAULT_DB),
    run: list[str] | None = typer.Option(None, "--run", help="Run name (repeatable; default: the latest run)."),
    all_runs: bool = typer.Option(False, "--all-runs", help="Every run in the database, one result each."),
    param: list[str] | None = typer.Option(None, "--param", "-p", help="Query parameter key=value (repeatable)."),
    fmt: FormatOption = "table",
    sql_dir: SqlDirOption = None,
    strict: StrictOption = False,
    limit: LimitOption = 20,
    wide: WideOption = False,
    list_: bool = typer.Option(False, "--list", help="List the queries and exit."),
):
    """Run named, versioned SQL queries and print their verdicts.

    Per query its verdict line and a table of the columns its header names as headline
    (--wide: every column), fitted to the terminal.

    Example:
        slowcard query ep-slow-rank --db ep.duckdb
    """
    check_format(fmt, render.FORMATS)
    catalog = queries_mod.load_catalog(sql_dir)
    if list_:
        _print_catalog(catalog)
        raise typer.Exit(0)
    every = queries_mod.load_catalog(sql_dir, scope=None)
    for n in names or []:
        if n not in catalog and n in every:
            raise UsageError(f"{n} reads every run of the database (scope: fleet): run it with `slowcard fleet`")
    selected = [queries_mod.find(catalog, n) for n in names] if names else list(catalog.values())
    params = _parse_params(param)
    if params and len(selected) > 1:
        raise UsageError("-p applies to one query; name exactly one query")
    for q in selected:
        queries_mod.bind_params(q, params)  # validate before running anything
    con = queries_mod.open_readonly(db)
    try:
        results = [queries_mod.run_query(con, q, r, params) for r in pick_runs(con, run, all_runs) for q in selected]
    finally:
        con.close()
    from .renderers.tables import render_results

    typer.echo(render_results(results, fmt, limit, screen_width(), wide))
    raise typer.Exit(exit_code(results, strict))


def _print_catalog(catalog, wide: bool = False):
    from .renderers.tables import catalog_table

    typer.echo(catalog_table(queries_mod.catalog_rows(catalog), screen_width(), wide))


@app.command("list")
def list_queries(
    sql_dir: SqlDirOption = None,
    fmt: str = typer.Option("table", "--format", "-f", help="table | markdown (the page docs/queries.md)"),
    wide: WideOption = False,
):
    """List every query with its version, role, verdict rule and description (diagnosis order).

    Fitted to the terminal; --wide adds subject, priority, order and where it shows.

    Example:
        slowcard list
        slowcard list --format markdown > docs/queries.md
    """
    check_format(fmt, ("table", "markdown"))
    catalog = queries_mod.load_catalog(sql_dir, scope=None)  # the fleet queries too
    if fmt == "markdown":
        from .catalog_doc import catalog_markdown

        typer.echo(catalog_markdown(catalog), nl=False)
    else:
        _print_catalog(catalog, wide)


@app.command()
def show(
    name: str = typer.Argument(..., help="Query name."),
    run: str | None = typer.Option(None, "--run", help="Run to bind (default: the database's first run)."),
    param: list[str] | None = typer.Option(
        None, "--param", "-p", help="key=value, repeatable (default: the query's defaults)."
    ),
    raw: bool = typer.Option(False, "--raw", help="The query file as it is ($parameters unbound)."),
    sql_dir: list[Path] | None = typer.Option(None, "--sql-dir", help="Extra folder of query files."),
    db: Path | None = typer.Option(
        None, "--db", help="The database the script is for: its Parquet files (Dask ingest) stay readable."
    ),
):
    """Print a query as a script for the duckdb shell: parameters become SET VARIABLE lines
    (defaults, or --run / -p), so it runs as printed.

    Example:
        slowcard show ep-slow-rank | duckdb slowcard.duckdb
    """
    try:
        q = queries_mod.find(queries_mod.load_catalog(sql_dir, scope=None), name)  # fleet queries too
        queries_mod.check_shell_safe(q)  # what `query` refuses is not printed for the shell either
        allowed: list[str] = []
        if db is not None and not raw:
            from . import store

            if not db.exists():
                raise UsageError(f"{db}: no such database; give --db the database the script is for")
            con = store.open_db(db, read_only=True)
            try:
                allowed = queries_mod.lake_paths(con)
            finally:
                con.close()
        text = (
            q.path.read_text(encoding="utf-8").rstrip()
            if raw
            else queries_mod.shell_sql(q, run, _parse_params(param), allowed)
        )
    except SlowcardError as exc:
        _fail(str(exc), 2)
    typer.echo(text)


@app.command()
def diagnose(
    paths: list[str] = typer.Argument(None, help="Profiler output to ingest first (files, folders, globs)."),
    db: DbOption = Path(DEFAULT_DB),
    run: str | None = typer.Option(
        None, "--run", help="Run to diagnose (default: the one just ingested, else the latest)."
    ),
    fmt: FormatOption = "table",
    sql_dir: SqlDirOption = None,
    strict: StrictOption = False,
    verbose: VerboseOption = False,
):
    """Answer "which card is slow, and why?" in one command.

    Ingests the paths when given, runs every query whose data is present, and prints the answer
    first: each slow card with its cause, cost, evidence, why and next step, then the findings,
    the folded lists and the totals (-v: everything).

    Example:
        slowcard diagnose testdata/ep4_token_skew --db demo.duckdb
    """
    from . import store
    from .diagnosis import diagnose as run_diagnosis
    from .ingest import ingest_paths
    from .view import run_inputs

    check_format(fmt, ("table", "json", "markdown"))
    catalog = queries_mod.load_catalog(sql_dir)
    if paths and len(paths) == 1 and store.is_duckdb_file(paths[0]):
        # `slowcard diagnose run.duckdb`: a database where input goes is the database to read
        if db != Path(DEFAULT_DB) and Path(db).resolve() != Path(paths[0]).resolve():
            raise UsageError(
                f"{paths[0]}: is a DuckDB database, not profiler output; to diagnose it: slowcard diagnose --db {paths[0]}"
            )
        typer.echo(f"{paths[0]} is a DuckDB database: diagnosing it (as --db {paths[0]})", err=True)
        db, paths = Path(paths[0]), []
    if paths:
        con = store.open_db(db)
        try:
            # ingest_paths refreshes the stored views at its end: the read-only open finds them fresh
            report = ingest_paths(db, paths, run=run, con=con, progress=progress_printer())
        finally:
            con.close()
        run = report.run
        for f in report.files:
            if f.status in ("failed", "truncated", "salvaged"):
                typer.echo(render.safe_field(f"{f.status}: {f.message}"), err=True)
    con = queries_mod.open_readonly(db)
    try:
        chosen = pick_runs(con, [run] if run else None)[0]
        diag = run_diagnosis(con, chosen, catalog)
        inputs = run_inputs(con, chosen) if fmt != "json" else {}
    finally:
        con.close()
    if fmt == "json":
        typer.echo(render.to_json(diag.to_dict()))
        raise typer.Exit(exit_code(diag.results.values(), strict))
    from .view import screen

    sc = screen(diag, inputs)
    if fmt == "markdown":
        from .renderers.markdown import screen as markdown_screen

        typer.echo(markdown_screen(sc))
    else:
        from .renderers import terminal

        style, colour = screen_style()
        text = (
            terminal.verbose_text(sc, screen_width(), style)
            if verbose
            else terminal.first_screen(sc, screen_width(), style)
        )
        echo_screen(text, colour)
    raise typer.Exit(exit_code(diag.results.values(), strict))


@app.command()
def compare(
    run_a: str = typer.Argument(..., help="The run before (e.g. the slow one)."),
    run_b: str = typer.Argument(..., help="The run after (e.g. with the fix)."),
    db: DbOption = Path(DEFAULT_DB),
    fmt: FormatOption = "table",
    limit: LimitOption = 20,
    sql_dir: SqlDirOption = None,
):
    """Two runs side by side: per-rank / per-layer / per-DP metrics with deltas and ratios, and
    which verdicts changed (did the fix remove the slow card?). Exit 1 when run B still FAILs.

    Example:
        slowcard compare before after --db runs.duckdb
    """
    from .compare import compare as run_compare

    check_format(fmt, ("table", "json"))
    catalog = queries_mod.load_catalog(sql_dir)
    con = queries_mod.open_readonly(db)
    try:
        pick_runs(con, [run_a, run_b])
        cmp = run_compare(con, run_a, run_b, catalog)
    finally:
        con.close()
    if fmt == "json":
        typer.echo(render.to_json(cmp.to_dict()))
    else:
        from .renderers.terminal import compare_text

        typer.echo(compare_text(cmp, catalog, limit, screen_width()))
    raise typer.Exit(1 if any(v["status_b"] in (Status.FAIL, Status.ERROR) for v in cmp.verdicts) else 0)


@app.command()
def export(
    parquet: Path = typer.Option(..., "--parquet", help="Output folder for Hive-partitioned Parquet."),
    db: DbOption = Path(DEFAULT_DB),
    run: list[str] | None = typer.Option(None, "--run", help="Only these runs (repeatable; default all)."),
    table: list[str] | None = typer.Option(None, "--table", help="Only these tables (repeatable)."),
):
    """Write the tables as Parquet partitioned by run (and rank): <dir>/<table>/run=…/rank=…/.

    Example:
        slowcard export --parquet out/ --db runs.duckdb
    """
    import duckdb

    from . import store
    from .export import export_parquet

    try:
        store.open_db(db, read_only=True).close()  # refresh views if this version changed them
        con = store.connect(db, read_only=True)
        try:
            if run:
                pick_runs(con, run)
            written = export_parquet(con, parquet, runs=run, tables=table)
        finally:
            con.close()
    except (duckdb.Error, OSError) as exc:
        _fail(f"{parquet}: export failed ({str(exc).splitlines()[0]})", 2)
    for name, n in written.items():
        typer.echo(render.safe_field(f"{name}: {n} rows -> {parquet / name}"))


from . import cli_views  # noqa: E402  (report and annotate commands)

cli_views.register(app)

from . import cli_watch  # noqa: E402  (watch command)

cli_watch.register(app)

from . import cli_plan  # noqa: E402  (plan eplb command)

cli_plan.register(app)

from . import cli_fleet  # noqa: E402  (fleet command)

cli_fleet.register(app)


def main():
    """Console entry point; --debug anywhere re-raises library errors with their traceback."""
    if "--debug" in sys.argv:
        sys.argv.remove("--debug")
        os.environ["SLOWCARD_DEBUG"] = "1"
    sys.stdout = _TerminalSafe(sys.stdout)
    sys.stderr = _TerminalSafe(sys.stderr)
    sys.argv[1:] = _run_names_as_text(sys.argv[1:])
    _no_pandas_search()
    _env_warnings()
    signal.signal(signal.SIGINT, _on_interrupt)
    fast = fast_parse(sys.argv[1:])
    if fast is None:
        app()
    else:
        _run_fast(*fast)


def _run_names_as_text(args: list[str]) -> list[str]:
    """A --run value is a name, stored as text: the bytes of one that are not UTF-8 become
    ``\\xNN`` (store.db_text), so `--run NAME` finds the run an ingest stored under NAME. Paths
    stay as the OS gave them."""
    from .store import db_text

    out, after_run = [], False
    for a in args:
        if after_run:
            a = db_text(a)
        elif a.startswith("--run="):
            a = "--run=" + db_text(a[len("--run=") :])
        out.append(a)
        after_run = a == "--run"
    return out


# The common forms of the commands run in loops (`query`, `diagnose`, `ingest`) are parsed here, without
# typer: typer builds a pydantic adapter per parameter at every start (~0.1 s, a third of a
# `slowcard query` on a small run; issue 17). Anything else, or anything unusual in them (--help,
# an unknown or repeated option, `-f=x`, `--`, a value starting with '-'), goes to typer, so
# every form behaves as typer parses it (tests/test_cli_fast.py checks both give the same values).
# option -> (parameter, kind): flag | str | path | int | int1 | strs | paths (int1: an int typer
# declares with min=1; strs/paths: repeatable)
_FAST_SPECS: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "query": (
        "names",
        {
            "--db": ("db", "path"),
            "--run": ("run", "strs"),
            "--all-runs": ("all_runs", "flag"),
            "--param": ("param", "strs"),
            "-p": ("param", "strs"),
            "--format": ("fmt", "str"),
            "-f": ("fmt", "str"),
            "--sql-dir": ("sql_dir", "paths"),
            "--strict": ("strict", "flag"),
            "--limit": ("limit", "int"),
            "--wide": ("wide", "flag"),
            "--list": ("list_", "flag"),
        },
    ),
    "diagnose": (
        "paths",
        {
            "--db": ("db", "path"),
            "--run": ("run", "str"),
            "--format": ("fmt", "str"),
            "-f": ("fmt", "str"),
            "--sql-dir": ("sql_dir", "paths"),
            "--strict": ("strict", "flag"),
            "--verbose": ("verbose", "flag"),
            "-v": ("verbose", "flag"),
        },
    ),
    "ingest": (
        "paths",
        {
            "--db": ("db", "path"),
            "--run": ("run", "str"),
            "--jobs": ("jobs", "int1"),
            "-j": ("jobs", "int1"),
            "--rank-pattern": ("rank_pattern", "str"),
            "--rank-map": ("rank_map", "path"),
            "--device-map": ("device_map", "path"),
            "--groups": ("groups", "paths"),
            "--taxonomy": ("taxonomy", "path"),
            "--run-per-folder": ("run_per_folder", "flag"),
            "--executor": ("executor", "str"),
            "--scheduler": ("scheduler", "str"),
            "--quiet": ("quiet", "flag"),
            "-q": ("quiet", "flag"),
        },
    ),
}
# Commands whose positional argument typer requires (no value: typer's usage error).
_FAST_REQUIRED = {"ingest"}
_FAST_DEFAULTS: dict[str, dict] = {
    "query": {
        "db": Path(DEFAULT_DB),
        "run": None,
        "all_runs": False,
        "param": None,
        "fmt": "table",
        "sql_dir": None,
        "strict": False,
        "limit": 20,
        "wide": False,
        "list_": False,
    },
    "diagnose": {
        "db": Path(DEFAULT_DB),
        "run": None,
        "fmt": "table",
        "sql_dir": None,
        "strict": False,
        "verbose": False,
    },
    "ingest": {
        "db": Path(DEFAULT_DB),
        "run": None,
        "jobs": None,
        "rank_pattern": None,
        "rank_map": None,
        "device_map": None,
        "groups": None,
        "taxonomy": None,
        "run_per_folder": False,
        "executor": "local",
        "scheduler": None,
        "quiet": False,
    },
}


def fast_parse(argv: list[str]) -> tuple[str, dict] | None:
    """(command, keyword arguments) of a plain `query` / `diagnose` / `ingest` command line; None
    when typer must parse it."""
    if not argv or argv[0] not in _FAST_SPECS:
        return None
    command = argv[0]
    positional, spec = _FAST_SPECS[command]
    kwargs = dict(_FAST_DEFAULTS[command])
    given: set[str] = set()
    values: list[str] = []
    args = argv[1:]
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("-") or token == "-":
            values.append(token)
            i += 1
            continue
        if token not in spec:
            return None  # --help, --opt=value, -f=x, --, unknown options: typer's
        dest, kind = spec[token]
        if kind == "flag":
            if dest in given:
                return None
            given.add(dest)
            kwargs[dest] = True
            i += 1
            continue
        if i + 1 >= len(args) or args[i + 1].startswith("-"):
            return None
        value = args[i + 1]
        i += 2
        if kind in ("strs", "paths"):
            kwargs[dest] = (kwargs[dest] or []) + [Path(value) if kind == "paths" else value]
            continue
        if dest in given:
            return None
        given.add(dest)
        if kind in ("int", "int1"):
            # below typer's min=1: typer's to refuse
            if not (value.isascii() and value.isdigit()) or (kind == "int1" and int(value) < 1):
                return None
            kwargs[dest] = int(value)
        else:
            kwargs[dest] = Path(value) if kind == "path" else value
    if not values and command in _FAST_REQUIRED:
        return None
    kwargs[positional] = values or None
    return command, kwargs


def _run_fast(command: str, kwargs: dict) -> None:
    """Run a command parsed by fast_parse the way typer runs it: cli_common's error boundary,
    typer.Exit -> exit code, Ctrl-C -> 130."""
    from .cli_common import error_boundary

    commands: dict[str, Callable[..., None]] = {"query": query, "diagnose": diagnose, "ingest": ingest}
    func = commands[command]
    try:
        try:
            with error_boundary():
                func(**kwargs)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except EOFError:
            typer.echo("\nAborted!", err=True)
            raise typer.Exit(1) from None
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            # the reader went away (`| head`): exit 1 quietly, as typer does
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(1) from None
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    sys.exit(0)


class _TerminalSafe:
    """stdout / stderr with the control characters of names and messages escaped (issue 16):
    every line the CLI prints passes here. A leading carriage return on a terminal is the one
    control character kept. ``unfiltered`` is the stream itself, for what escapes its own
    content first (the coloured screen, cli_common.echo_screen; rich's progress bar, whose file
    names are escaped before it draws them)."""

    def __init__(self, stream):
        self._stream = stream
        self.unfiltered = stream

    def write(self, text):
        if isinstance(text, str):
            cr = text.startswith("\r") and self._stream.isatty()
            text = ("\r" if cr else "") + render.terminal_safe(text[1:] if cr else text)
        return self._stream.write(text)

    def __getattr__(self, name):
        if name == "buffer":  # click would write bytes straight to it, around this filter
            raise AttributeError(name)
        return getattr(self._stream, name)


def _on_interrupt(signum, frame):
    """Ctrl-C: one line, then typer exits with 130 (the code of SIGINT, not 1 "a file failed");
    what committed before stays, and the file being written is removed at the next open."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C is not delayed
    sys.stderr.write("interrupted (Ctrl-C); what was committed before it is kept\n")
    raise KeyboardInterrupt


def _no_pandas_search():
    """DuckDB tries `import pandas` for every bound parameter (twice per list element). Without
    pandas installed each try searches sys.path again: 1,146 tries, ~60 ms of a diagnose of the
    4-rank example (issue 17). Once pandas is known to be absent, a finder first on the import
    path answers each try at once with the same ModuleNotFoundError. (Not a None entry in
    sys.modules: pyarrow reads sys.modules["pandas"] and failed on None.) An installed pandas is
    left alone."""
    import importlib.util

    if "pandas" in sys.modules or any(isinstance(f, _AbsentModule) for f in sys.meta_path):
        return
    if importlib.util.find_spec("pandas") is None:
        sys.meta_path.insert(0, _AbsentModule("pandas"))


class _AbsentModule:
    """A meta path finder for one module known not to be installed: importing it raises
    ModuleNotFoundError without searching sys.path; every other name goes to the next finder."""

    def __init__(self, name: str):
        self.name = name

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def _env_warnings():
    """Bad environment settings are reported and replaced by their defaults (issue 16)."""
    from .store import LOCK_WAIT_WARNING
    from .tempspace import tmp_dir_warning

    for warning in (LOCK_WAIT_WARNING, tmp_dir_warning()):
        if warning:
            typer.echo(f"warning: {warning}", err=True)


if __name__ == "__main__":
    main()
