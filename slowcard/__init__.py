"""slowcard: find the slow card (rank, device, DP domain, expert) in large-model clusters.

The Python API is the same code the CLI runs, for notebooks::

    import slowcard
    slowcard.ingest_files("run.duckdb", ["traces/"], run="baseline")
    res = slowcard.query("run.duckdb", "ep-slow-rank", run="baseline", params={"min_token_ratio": 1.5})
    res.status, res.summary, res.to_arrow()        # PASS/WARN/FAIL/..., one line, a pyarrow.Table
    diag = slowcard.diagnose("run.duckdb", run="baseline")
    diag.conclusion["headline"]
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ._version import __version__
from .errors import DatabaseBusy, InputError, QueryDefinitionError, SlowcardError, UsageError

if TYPE_CHECKING:
    from .diagnosis import Diagnosis
    from .ingest import IngestReport
    from .queries import Query, Result


def __getattr__(name: str):
    """Diagnosis and IngestReport on first use: `slowcard query` needs neither the ingest
    package nor the diagnosis modules (issue 17); Query and Result too: an ingest needs no
    query module (~20 ms of every ingest process, issue 30)."""
    if name in ("Query", "Result"):
        from . import queries

        return getattr(queries, name)
    if name == "Diagnosis":
        from .diagnosis import Diagnosis

        return Diagnosis
    if name == "IngestReport":
        from .ingest import IngestReport

        return IngestReport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "__version__",
    "open_db",
    "ingest_files",
    "ingest_runs",
    "list_queries",
    "query",
    "diagnose",
    "Query",
    "Result",
    "Diagnosis",
    "IngestReport",
    "SlowcardError",
    "InputError",
    "UsageError",
    "QueryDefinitionError",
    "DatabaseBusy",
]


def open_db(path: str | Path, read_only: bool = True):
    """A DuckDB connection to a slowcard database (read-only by default, as queries use)."""
    from . import queries, store

    return queries.open_readonly(path) if read_only else store.open_db(path)


def ingest_files(
    db: str | Path,
    paths,
    run: str | None = None,
    *,
    taxonomy: str | Path | None = None,
    executor: str = "local",
    scheduler: str | None = None,
    **options,
) -> IngestReport:
    """Ingest files / folders / globs into ``db`` under ``run``; see `slowcard ingest --help`.

    ``taxonomy`` (a CSV of user op-name patterns), ``executor`` (``local`` or ``dask``) and
    ``scheduler`` are the CLI's choices; ``options`` go to ``slowcard.ingest.ingest_paths``
    (``jobs``, ``rank_pattern``, ``rank_map``, ``progress``, …). One run per sub-folder:
    ``ingest_runs``. (Not called ``ingest``: that name is the ``slowcard.ingest`` package.)
    """
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if taxonomy is None and executor == "local" and scheduler is None:
        from .ingest import ingest_paths

        return ingest_paths(db, paths, run=run, **options)
    return ingest_runs(db, paths, run, taxonomy=taxonomy, executor=executor, scheduler=scheduler, **options)[0]


def ingest_runs(db: str | Path, paths, run: str | None = None, **options) -> list[IngestReport]:
    """Like `slowcard ingest` with all its choices: ``run_per_folder`` (each sub-folder of each
    path is its own run), ``taxonomy``, ``executor``, ``scheduler``, ``jobs``, ``rank_pattern``,
    ``rank_map``, ``progress``. One IngestReport per run."""
    from .ingest.runs import ingest_runs as _ingest_runs

    return _ingest_runs(db, [paths] if isinstance(paths, (str, Path)) else list(paths), run, **options)


def list_queries(sql_dirs=None) -> dict[str, Query]:
    """Every query by name (built-in first, then ``sql_dirs``)."""
    from .queries import load_catalog

    return load_catalog(sql_dirs)


def _runs_for(con, run):
    from .queries import runs

    known = runs(con)
    if run is None:
        if not known:
            raise UsageError("the database holds no run yet")
        return known[-1]
    if run not in known:
        raise UsageError(f"no run named {run!r}; runs: {', '.join(known)}")
    return run


def query(db, name: str, run: str | None = None, params: dict | None = None, sql_dirs=None) -> Result:
    """Run one named query on one run (default: the latest) of a database path or connection."""
    from .queries import find, load_catalog, run_query

    q = find(load_catalog(sql_dirs), name)
    con = db if hasattr(db, "execute") else open_db(db)
    try:
        return run_query(con, q, _runs_for(con, run), params)
    finally:
        if con is not db:
            con.close()


def diagnose(db, run: str | None = None, sql_dirs=None) -> Diagnosis:
    """Every query whose data is present, and one conclusion (see `slowcard diagnose`)."""
    from .diagnosis import diagnose as _diagnose
    from .queries import load_catalog

    con = db if hasattr(db, "execute") else open_db(db)
    try:
        return _diagnose(con, _runs_for(con, run), load_catalog(sql_dirs))
    finally:
        if con is not db:
            con.close()
