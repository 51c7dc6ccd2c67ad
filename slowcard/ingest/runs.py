"""Ingest several runs at once, with the choices `slowcard ingest` offers: one run per sub-folder,
a user taxonomy, and the executor (local threads or Dask workers).

The CLI is a thin shell over ``ingest_runs``; notebooks call it (or ``slowcard.ingest_runs``)
with the same options. Raises UsageError for bad choices; prints nothing.
"""

from __future__ import annotations

from pathlib import Path

from .. import store
from ..devices import load_device_map
from ..errors import UsageError

EXECUTORS = ("local", "dask")


def groups_files(groups) -> list[str]:
    """The ``--groups`` files, checked to be parallel-group files (JSON or CSV) before anything is
    written; raises UsageError naming the file and the expected shape."""
    from ..errors import InputError
    from . import detect

    out = []
    for g in groups or []:
        p = Path(g)
        if not p.is_file():
            raise UsageError(f"--groups {g}: no such file")
        try:
            _reader, fmt = detect(p)
        except InputError as exc:
            raise UsageError(f"--groups {g}: {exc}") from None
        if fmt != "parallel_groups":
            raise UsageError(
                f"--groups {g}: not a parallel-groups file ({'read as ' + fmt if fmt else 'unknown format'}); "
                'expected JSON {"parallel_groups": [{"kind": "tp", "ranks": [0, 1, 2, 3]}, ...]} or a CSV '
                "with the header kind,ranks[,name] (README, Parallel groups)"
            )
        out.append(str(p))
    return out


def run_batches(paths, run: str | None, per_folder: bool) -> tuple[list[tuple[str | None, list]], list[str]]:
    """((run name, paths) batches, notes): one batch, or one per sub-folder of each path with
    ``per_folder`` (files at a root itself make one more run, named after the root; a note says
    so: see ``ingest.run_batches``)."""
    from . import run_batches as batches_of

    if per_folder and run:
        raise UsageError(
            "--run and --run-per-folder exclude each other: with --run-per-folder each sub-folder names its run"
        )
    return batches_of(paths, run, per_folder)


def ingest_runs(
    db,
    paths,
    run: str | None = None,
    *,
    run_per_folder: bool = False,
    taxonomy: str | Path | None = None,
    executor: str = "local",
    scheduler: str | None = None,
    jobs: int | None = None,
    rank_pattern: str | None = None,
    rank_map: str | Path | None = None,
    device_map: str | Path | None = None,
    groups=None,
    progress=None,
) -> list:
    """Ingest ``paths`` into ``db``; one IngestReport per run.

    Args:
        run: the run name (default: taken from the path); not with ``run_per_folder``.
        run_per_folder: each sub-folder of each path is its own run, named after it.
        taxonomy: a CSV of user op-name patterns (``pattern,op_class,coll_kind,priority``),
            loaded before the files (user rows win over the built-in ones).
        executor: ``local`` (``jobs`` threads; None: one per core for small files, see
            ``auto_jobs``) or ``dask`` (Dask workers; ``scheduler`` is ``tcp://HOST:PORT``,
            default a LocalCluster on loopback).
        groups: parallel-group files (``--groups FILE``, see ``ingest/parallel_groups.py``),
            ingested into every run of the call; a file of another format is a UsageError.
    """
    from . import ingest_paths, prepare_batch

    if executor not in EXECUTORS:
        raise UsageError(f"--executor {executor!r}: expected one of {', '.join(EXECUTORS)}")
    group_files = groups_files(groups)
    batches, notes = run_batches(paths, run, run_per_folder)
    batches = [(r, [*p, *group_files]) for r, p in batches]
    for batch_run, batch_paths in batches:  # usage errors before the database is created
        prepare_batch(batch_paths, batch_run, rank_pattern, rank_map)
    if device_map:
        load_device_map(device_map)  # a bad map is refused before any file goes in
    if taxonomy:
        con = store.open_db(db)
        try:
            store.load_user_taxonomy(con, taxonomy)
        finally:
            con.close()
    reports = []
    for batch_run, batch_paths in batches:
        if executor == "dask":
            from ..distributed import ingest_paths_dask

            reports.append(
                ingest_paths_dask(
                    db,
                    batch_paths,
                    run=batch_run,
                    scheduler=scheduler,
                    rank_pattern=rank_pattern,
                    rank_map=rank_map,
                    device_map=device_map,
                    progress=progress,
                )
            )
            continue
        con = store.open_db(db)
        try:
            reports.append(
                ingest_paths(
                    db,
                    batch_paths,
                    run=batch_run,
                    jobs=jobs,
                    rank_pattern=rank_pattern,
                    rank_map=rank_map,
                    device_map=device_map,
                    progress=progress,
                    con=con,
                )
            )
        finally:
            con.close()
    if reports and notes:
        reports[-1].warnings[:0] = notes  # (the root files' run is the last batch)
    return reports
