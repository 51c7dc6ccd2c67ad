"""The `slowcard` command line: the only module that prints or exits.

Exit codes (the contract the README documents):
    0  success: every file ingested / no query FAILed or ERRORed (WARN too, unless --strict)
    1  some file failed or was salvaged / truncated; some query FAILed or ERRORed (or WARNed with --strict)
    2  usage or input error: bad option, unknown query, bad parameter, unreadable database
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from . import queries as queries_mod
from . import render
from .errors import DatabaseBusy, QueryDefinitionError, SlowcardError, UsageError

DEFAULT_DB = "slowcard.duckdb"

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Find the slow card (rank, device, DP domain, expert) in profiler output of LLM clusters.",
    pretty_exceptions_enable=False,
)


def _fail(msg: str, code: int = 2):
    typer.echo(f"Error: {msg}", err=True)
    raise typer.Exit(code)


def _progress_printer():
    """A one-line progress bar on stderr when it is a terminal; nothing otherwise."""
    if not sys.stderr.isatty():
        return None

    def show(state: dict):
        mb_done = state["bytes_done"] / 1e6
        mb_total = state["bytes_total"] / 1e6
        cur = Path(state["current"]).name if state.get("current") else ""
        sys.stderr.write(
            f"\r[{state['files_done']}/{state['files_total']} files] {mb_done:,.1f}/{mb_total:,.1f} MB "
            f"{state['events']:,} rows  {cur[:40]:<40}"
        )
        if state["files_done"] == state["files_total"]:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


@app.command()
def ingest(
    paths: List[str] = typer.Argument(..., help="Files, folders (walked recursively) or globs."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="DuckDB database file (created if missing)."),
    run: Optional[str] = typer.Option(None, "--run", help="Run name (default: the folder given)."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Files parsed in parallel."),
    rank_pattern: Optional[str] = typer.Option(None, "--rank-pattern", help="Regex on the path; group 'rank' (or the first group) is the rank."),
    rank_map: Optional[Path] = typer.Option(None, "--rank-map", help="CSV 'path,rank' or JSON {path-or-glob: rank}; overrides every other source."),
    taxonomy: Optional[Path] = typer.Option(None, "--taxonomy", help="CSV pattern,op_class,coll_kind,priority of user op-name patterns (win over built-ins)."),
    run_per_folder: bool = typer.Option(False, "--run-per-folder", help="Each sub-folder of PATH is its own run, named after it."),
    executor: str = typer.Option("local", "--executor", help="local | dask (parse files on Dask workers)."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Dask scheduler tcp://HOST:PORT (default: a LocalCluster on loopback)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-file summary table."),
):
    """Stream profiler output into one DuckDB database, tagged with a run name.

    Example:
        slowcard ingest ../shared/realdata/kineto_cpu_ep4_hot1 --db ep.duckdb
    """
    from . import store
    from .ingest import ingest_paths
    from .taxonomy import load_user_taxonomy

    if executor not in ("local", "dask"):
        _fail(f"--executor {executor!r}: expected local or dask")
    if run_per_folder and run:
        _fail("--run and --run-per-folder exclude each other: with --run-per-folder each sub-folder names its run")
    try:
        batches = _run_batches(paths, run, run_per_folder)
        reports = []
        for batch_run, batch_paths in batches:
            if executor == "dask":
                from .distributed import ingest_paths_dask

                if taxonomy:
                    con = store.open_db(db)
                    load_user_taxonomy(con, taxonomy)
                    con.close()
                reports.append(ingest_paths_dask(db, batch_paths, run=batch_run, scheduler=scheduler,
                                                 rank_pattern=rank_pattern, rank_map=rank_map,
                                                 progress=_progress_printer()))
                continue
            con = store.open_db(db)
            try:
                if taxonomy:
                    load_user_taxonomy(con, taxonomy)
                reports.append(ingest_paths(db, batch_paths, run=batch_run, jobs=jobs,
                                            rank_pattern=rank_pattern, rank_map=rank_map,
                                            progress=_progress_printer(), con=con))
            finally:
                con.close()
    except SlowcardError as exc:
        _fail(str(exc), 2)
    for report in reports:
        if not quiet:
            typer.echo(render.ingest_table(report))
        for w in report.warnings:
            typer.echo(f"warning: {w}", err=True)
        for f in report.files:
            if f.status in ("failed", "truncated", "salvaged"):
                typer.echo(f"{f.status}: {f.path}: {f.message}" if f.path not in f.message
                       else f"{f.status}: {f.message}", err=True)
    raise typer.Exit(max(r.exit_code for r in reports))


def _run_batches(paths: List[str], run: Optional[str], per_folder: bool) -> list[tuple[Optional[str], list]]:
    """(run name, paths) to ingest: one batch, or one per sub-folder with --run-per-folder."""
    if not per_folder:
        return [(run, list(paths))]
    batches = []
    for raw in paths:
        root = Path(raw)
        if not root.is_dir():
            raise UsageError(f"{raw}: --run-per-folder needs folders whose sub-folders are runs")
        subs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not subs:
            raise UsageError(f"{raw}: has no sub-folders to take as runs")
        batches += [(sub.name, [sub]) for sub in subs]
    return batches


def _pick_runs(con, run: Optional[List[str]], all_runs: bool) -> list[str]:
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
        typer.echo(f"note: {len(known)} runs in the database; using the latest, {known[-1]!r} "
                   "(--run NAME or --all-runs to choose)", err=True)
    return [known[-1]]


def _parse_params(pairs: List[str]) -> dict:
    out = {}
    for p in pairs or []:
        if "=" not in p:
            raise UsageError(f"-p {p!r}: expected key=value")
        k, v = p.split("=", 1)
        out[k.strip()] = v
    return out


@app.command()
def query(
    names: List[str] = typer.Argument(None, help="Query names (default: every query)."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="DuckDB database file."),
    run: Optional[List[str]] = typer.Option(None, "--run", help="Run name (repeatable; default: the latest run)."),
    all_runs: bool = typer.Option(False, "--all-runs", help="Every run in the database, one result each."),
    param: Optional[List[str]] = typer.Option(None, "--param", "-p", help="Query parameter key=value (repeatable)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table | json | csv | markdown"),
    sql_dir: Optional[List[Path]] = typer.Option(None, "--sql-dir", help="Extra folder of query files (same header rules)."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on WARN too."),
    limit: int = typer.Option(20, "--limit", help="Rows shown per result in table formats (0: all)."),
    list_: bool = typer.Option(False, "--list", help="List the queries and exit."),
):
    """Run named, versioned SQL queries and print their verdicts.

    Example:
        slowcard query ep-slow-rank --db ep.duckdb
    """
    if fmt not in render.FORMATS:
        _fail(f"--format {fmt!r}: expected one of {', '.join(render.FORMATS)}")
    try:
        catalog = queries_mod.load_catalog(sql_dir)
        if list_:
            _print_catalog(catalog)
            raise typer.Exit(0)
        selected = [queries_mod.find(catalog, n) for n in names] if names else list(catalog.values())
        params = _parse_params(param)
        if params and len(selected) > 1:
            raise UsageError("-p applies to one query; name exactly one query")
        for q in selected:
            queries_mod.bind_params(q, params)       # validate before running anything
        con = queries_mod.open_readonly(db)
        try:
            results = [queries_mod.run_query(con, q, r, params)
                       for r in _pick_runs(con, run, all_runs) for q in selected]
        finally:
            con.close()
    except (UsageError, QueryDefinitionError, DatabaseBusy, FileNotFoundError) as exc:
        _fail(str(exc), 2)
    except SlowcardError as exc:
        _fail(str(exc), 2)
    typer.echo(render.render_results(results, fmt, limit))
    raise typer.Exit(exit_code(results, strict))


def exit_code(results, strict: bool = False) -> int:
    bad = {"FAIL", "ERROR"} | ({"WARN"} if strict else set())
    return 1 if any(r.status in bad for r in results) else 0


def _print_catalog(catalog):
    from tabulate import tabulate

    rows = [[q.name, f"v{q.version}", q.rule_text, q.description] for q in catalog.values()]
    typer.echo(tabulate(rows, headers=["query", "version", "verdict", "description"], tablefmt="simple"))


@app.command("list")
def list_queries(
    sql_dir: Optional[List[Path]] = typer.Option(None, "--sql-dir", help="Extra folder of query files."),
):
    """List every query with its version, verdict rule and description.

    Example:
        slowcard list
    """
    try:
        _print_catalog(queries_mod.load_catalog(sql_dir))
    except SlowcardError as exc:
        _fail(str(exc), 2)


@app.command()
def show(
    name: str = typer.Argument(..., help="Query name."),
    run: Optional[str] = typer.Option(None, "--run", help="Run to bind (default: the database's first run)."),
    param: Optional[List[str]] = typer.Option(None, "--param", "-p", help="key=value, repeatable (default: the query's defaults)."),
    raw: bool = typer.Option(False, "--raw", help="The query file as it is ($parameters unbound)."),
    sql_dir: Optional[List[Path]] = typer.Option(None, "--sql-dir", help="Extra folder of query files."),
):
    """Print a query as a script for the duckdb shell: parameters become SET VARIABLE lines
    (defaults, or --run / -p), so it runs as printed.

    Example:
        slowcard show ep-slow-rank | duckdb slowcard.duckdb
    """
    try:
        q = queries_mod.find(queries_mod.load_catalog(sql_dir), name)
        text = (q.path.read_text(encoding="utf-8").rstrip() if raw
                else queries_mod.shell_sql(q, run, _parse_params(param)))
    except SlowcardError as exc:
        _fail(str(exc), 2)
    typer.echo(text)


@app.command()
def diagnose(
    paths: List[str] = typer.Argument(None, help="Profiler output to ingest first (files, folders, globs)."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="DuckDB database file."),
    run: Optional[str] = typer.Option(None, "--run", help="Run to diagnose (default: the one just ingested, else the latest)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table | json"),
    sql_dir: Optional[List[Path]] = typer.Option(None, "--sql-dir", help="Extra folder of query files."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on WARN too."),
):
    """Answer "which card is slow, and why?" in one command: ingest (when given paths), run every
    query whose data is present, and print one conclusion and the verdict lines.

    Example:
        slowcard diagnose testdata/ep4_token_skew --db demo.duckdb
    """
    from . import store
    from .diagnosis import diagnose as run_diagnosis
    from .ingest import ingest_paths

    if fmt not in ("table", "json"):
        _fail(f"--format {fmt!r}: expected table or json")
    try:
        catalog = queries_mod.load_catalog(sql_dir)
        if paths:
            con = store.open_db(db)
            try:
                report = ingest_paths(db, paths, run=run, con=con, progress=_progress_printer())
            finally:
                con.close()
            run = report.run
            for f in report.files:
                if f.status in ("failed", "truncated", "salvaged"):
                    typer.echo(f"{f.status}: {f.message}", err=True)
        con = queries_mod.open_readonly(db)
        try:
            chosen = _pick_runs(con, [run] if run else None, False)[0]
            diag = run_diagnosis(con, chosen, catalog)
        finally:
            con.close()
    except SlowcardError as exc:
        _fail(str(exc), 2)
    except FileNotFoundError as exc:
        _fail(str(exc), 2)
    if fmt == "json":
        typer.echo(render.to_json(diag.to_dict()))
    else:
        typer.echo(render.diagnosis_text(diag))
    raise typer.Exit(exit_code(diag.results.values(), strict))


@app.command()
def compare(
    run_a: str = typer.Argument(..., help="The run before (e.g. the slow one)."),
    run_b: str = typer.Argument(..., help="The run after (e.g. with the fix)."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="DuckDB database file."),
    fmt: str = typer.Option("table", "--format", "-f", help="table | json"),
    limit: int = typer.Option(20, "--limit", help="Rows shown per metric table (0: all)."),
):
    """Two runs side by side: per-rank / per-layer / per-DP metrics with deltas and ratios, and
    which verdicts changed (did the fix remove the slow card?). Exit 1 when run B still FAILs.

    Example:
        slowcard compare before after --db runs.duckdb
    """
    from .compare import compare as run_compare

    if fmt not in ("table", "json"):
        _fail(f"--format {fmt!r}: expected table or json")
    try:
        con = queries_mod.open_readonly(db)
        try:
            _pick_runs(con, [run_a, run_b], False)
            cmp = run_compare(con, run_a, run_b)
        finally:
            con.close()
    except (SlowcardError, FileNotFoundError) as exc:
        _fail(str(exc), 2)
    typer.echo(render.to_json(cmp.to_dict()) if fmt == "json" else render.comparison_text(cmp, limit))
    raise typer.Exit(1 if any(v["status_b"] in ("FAIL", "ERROR") for v in cmp.verdicts) else 0)


@app.command()
def export(
    parquet: Path = typer.Option(..., "--parquet", help="Output folder for Hive-partitioned Parquet."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="DuckDB database file."),
    run: Optional[List[str]] = typer.Option(None, "--run", help="Only these runs (repeatable; default all)."),
    table: Optional[List[str]] = typer.Option(None, "--table", help="Only these tables (repeatable)."),
):
    """Write the tables as Parquet partitioned by run (and rank): <dir>/<table>/run=…/rank=…/.

    Example:
        slowcard export --parquet out/ --db runs.duckdb
    """
    import duckdb

    from . import store
    from .export import export_parquet

    try:
        store.open_db(db, read_only=True).close()     # refresh views if this version changed them
        con = store.connect(db, read_only=True)
        try:
            if run:
                _pick_runs(con, run, False)
            written = export_parquet(con, parquet, runs=run, tables=table)
        finally:
            con.close()
    except (SlowcardError, FileNotFoundError) as exc:
        _fail(str(exc), 2)
    except duckdb.Error as exc:
        _fail(f"{parquet}: export failed ({str(exc).splitlines()[0]})", 2)
    for name, n in written.items():
        typer.echo(f"{name}: {n} rows -> {parquet / name}")


from . import cli_views  # noqa: E402  (report and annotate commands)

cli_views.register(app)

from . import cli_watch  # noqa: E402  (watch command)

cli_watch.register(app)


def main():
    """Console entry point; --debug anywhere re-raises library errors with their traceback."""
    if "--debug" in sys.argv:
        sys.argv.remove("--debug")
        os.environ["SLOWCARD_DEBUG"] = "1"
    app()


if __name__ == "__main__":
    main()
