"""Ingest past one machine: parse each file on a Dask worker, register the rows centrally.

Owns: shipping files to ``dask.distributed`` workers, the Parquet staging folder, and the
registration of staged rows in the database. Parsing is the cost and it is per file, so each
file is one task: the worker ingests that ONE file with the ordinary local code
(``slowcard.ingest.ingest_file``, same readers, same rank resolution on the real path) into a
private temporary DuckDB, writes every per-file row table to Parquet under a folder all workers
and the coordinator can reach, and returns a small dict (the file's summary, its ``sources`` row
and drops, and the Parquet paths). The coordinator, as results arrive, copies each file's Parquet
into the database under a fresh source id and publishes it with ``store.commit_source``: the
same one-commit-per-file rule, the same replacement on re-ingest, the same derived
``op_class_rows``, so every query runs unchanged. No file's rows pass through Python on the
coordinator (DuckDB reads the Parquet directly), and at most a few files per worker thread are
staged at any time.

Requirements of a real cluster: every worker sees the input files at the same paths as the
coordinator (the stored ``path`` and the rank resolution use it), ``shared_dir`` is a folder
every worker and the coordinator can reach (NFS, a shared volume), and the workers run the same
slowcard version (checked: a different schema fails the file with a message).

``dask[distributed]`` is an optional extra (``pip install -e .[dask]``), imported only here and
only when called.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

import duckdb

from . import devices, store, tempspace
from .errors import UsageError
from .ingest import FileResult, IngestReport, ingest_file, prepare_batch, run_checks
from .ingest.base import IngestOptions

INSTALL_HINT = "pip install -e .[dask]"
# Tables never staged: derived rows (rebuilt by commit_source from the view), the pending-id
# bookkeeping, and the drops (they travel in the result dict and commit_source writes them).
NOT_STAGED = frozenset({table for table, _macro in store.DERIVED} | {"pending_sources", "source_drops"})
# Files in flight per worker thread: enough to keep every thread busy while the coordinator
# registers, few enough that the Parquet staging folder holds only a handful of files.
IN_FLIGHT_PER_THREAD = 2
# How long to try reaching a --scheduler before saying it is unreachable.
CONNECT_TIMEOUT_S = 20

# Per worker process: a schema-applied empty database copied for each file, because applying
# the whole DDL takes ~1 s and a copy ~0.1 s (see bench/README.md, Scale).
_TEMPLATE: dict[tuple[str, str], Path] = {}
_STAGED: dict[str, list[str]] = {}  # per schema fingerprint: the tables to stage


# The scheduler always serves HTTP (/health, /metrics), dashboard or not: with no address it takes
# port 8787, so a second cluster on the machine (another ingest, another test suite) found the
# port taken and failed with "Port 8787 is already in use". Port 0 lets the OS choose; the
# dashboard stays off.
LOCAL_CLUSTER_HTTP = {"dashboard_address": "127.0.0.1:0", "scheduler_kwargs": {"dashboard": False}}


def _dask():
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise UsageError(
            f"--executor dask needs dask.distributed, which is not installed; run `{INSTALL_HINT}`"
        ) from None
    return Client, LocalCluster, as_completed


# ----------------------------------------------------------------------------------------------
# worker side


def _template_db(stage_dir: str) -> Path:
    """This process's empty schema-applied database for one ingest call (keyed by its staging
    folder, so that concurrent ingests on a shared cluster never remove each other's)."""
    key = (store.ddl_fingerprint(), stage_dir)
    path = _TEMPLATE.get(key)
    if path is None or not path.exists():
        folder = tempspace.make_dir("template")
        path = folder / "template.duckdb"
        con = store.open_db(path)
        try:
            # The worker's op_class_rows are never staged: the coordinator derives them with its
            # own taxonomy (which may hold --taxonomy user rows). Without taxonomy rows the
            # derivation that ingest_file's commit runs here finds nothing and costs nothing.
            con.execute("DELETE FROM op_taxonomy")
        finally:
            con.close()
        _TEMPLATE[key] = path
    return path


def _drop_templates(stage_dir: str) -> int:
    """Remove this worker process's template databases of one ingest call (run on every worker
    at the end of it)."""
    n = 0
    for key in [k for k in _TEMPLATE if k[1] == stage_dir]:
        shutil.rmtree(_TEMPLATE.pop(key).parent, ignore_errors=True)
        n += 1
    return n


def _staged_tables(con) -> list[str]:
    fp = store.ddl_fingerprint()
    if fp not in _STAGED:
        _STAGED[fp] = [t for t in store.row_tables(con) if t not in NOT_STAGED]
    return _STAGED[fp]


def _worker_memory_limit() -> int | None:
    try:
        from distributed import get_worker

        return int(get_worker().memory_manager.memory_limit or 0) or None
    except (ImportError, ValueError, AttributeError):
        return None


def ingest_one_file(
    path: str,
    run: str,
    explicit: bool,
    size: int,
    options: IngestOptions,
    rank_pattern: str | None,
    rank_map,
    stage_dir: str,
) -> dict:
    """Task body (runs on a worker): ingest one file into a private temporary database and stage
    its rows as Parquet in ``stage_dir``. Returns the small dict the coordinator registers."""
    t0 = time.perf_counter()
    work = tempspace.make_dir("worker")
    out: dict = {"source": None, "row_drops": [], "cell_drops": [], "parquet": {}, "columns": {}}
    try:
        db = work / "file.duckdb"
        shutil.copyfile(_template_db(stage_dir), db)
        con = store.open_db(db)
        try:
            limit = _worker_memory_limit()
            if limit:
                # Leave the rest of the worker's budget to Python; Dask's nanny restarts a worker
                # that goes past its limit, and DuckDB spills to disk instead.
                con.execute(f"SET memory_limit = '{max(64, int(limit * 0.6) >> 20)}MiB'")
            res = ingest_file(con, Path(path), run, explicit, size, options, rank_pattern, rank_map)
            out["result"] = dataclasses.asdict(res)
            cur = con.execute("SELECT * FROM sources")
            rows = cur.fetchall()
            if rows:
                out["source"] = dict(zip([d[0] for d in cur.description], rows[0]))
                sid = out["source"]["source_id"]
                for scope in ("row", "cell"):
                    out[f"{scope}_drops"] = [
                        tuple(r)
                        for r in con.execute(
                            "SELECT reason, position, n_rows FROM source_drops WHERE source_id = ? AND scope = ?",
                            [sid, scope],
                        ).fetchall()
                    ]
                token = uuid.uuid4().hex
                for table in _staged_tables(con):
                    if not con.execute(f'SELECT 1 FROM "{table}" LIMIT 1').fetchall():
                        continue
                    target = Path(stage_dir) / f"{token}-{table}.parquet"
                    con.execute(f"COPY \"{table}\" TO '{_sql_str(str(target))}' (FORMAT parquet)")
                    out["parquet"][table] = str(target)
                    out["columns"][table] = [d[0] for d in con.execute(f'SELECT * FROM "{table}" LIMIT 0').description]
            # The database is deleted right after: skip the checkpoint DuckDB does on close.
            con.execute("PRAGMA disable_checkpoint_on_shutdown")
        finally:
            con.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["result"]["seconds"] = time.perf_counter() - t0
    return out


def _sql_str(s: str) -> str:
    return s.replace("'", "''")


# ----------------------------------------------------------------------------------------------
# coordinator side


def _table_columns(con, table: str) -> list[str]:
    return [
        r[0]
        for r in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = 'main' "
            "AND table_name = ? ORDER BY ordinal_position",
            [table],
        ).fetchall()
    ]


def _record(src: dict) -> store.SourceRecord:
    meta = src.get("metadata")
    meta = json.loads(meta) if isinstance(meta, str) else (meta or {})
    fields = {f.name for f in dataclasses.fields(store.SourceRecord)}
    kw = {k: v for k, v in src.items() if k in fields and k != "metadata"}
    return store.SourceRecord(metadata=meta, **kw)


def _register(con, run: str, size: int, out: dict, columns: dict[str, list[str]]) -> FileResult:
    """Copy one staged file into the database and publish it (one commit)."""
    res = FileResult(**out["result"])
    src = out["source"]
    if src is None:  # failed or skipped on the worker: nothing to register
        return res
    t0 = time.perf_counter()
    # Workers on another machine may run another slowcard version: their staged tables must have
    # exactly this database's columns (names; DuckDB casts the types on insert).
    for table, cols in sorted(out["columns"].items()):
        mine = columns.get(table)
        if mine is None or sorted(mine) != sorted(cols):
            res.status, res.rows_kept, res.rows_dropped, res.rank, res.rank_source = "failed", 0, 0, None, None
            what = (
                "has no such table" if mine is None else f"has columns {sorted(set(mine) ^ set(cols))} on one side only"
            )
            res.message = (
                f"{res.path}: the Dask worker staged {table!r} but this database {what}; "
                "install the same slowcard version on every worker"
            )
            return res
    sid = store.new_source_id(con)
    try:
        with store.discard_on_error(con, sid):
            for table, pq in sorted(out["parquet"].items()):
                cols = [c for c in columns[table] if c != "source_id"]
                names = ", ".join(f'"{c}"' for c in cols)
                con.execute(
                    f'INSERT INTO "{table}" ("source_id", {names}) SELECT $sid, {names} FROM read_parquet($pq)',
                    {"sid": sid, "pq": pq},
                )
            store.commit_source(
                con, sid, run, res.path, size, src["fingerprint"], _record(src), out["row_drops"], out["cell_drops"]
            )
    except duckdb.Error as exc:
        res.status, res.rows_kept, res.rows_dropped = "failed", 0, 0
        res.rank = res.rank_source = None
        res.message = f"{res.path}: the database refused the rows ({str(exc).splitlines()[0]})"
    res.seconds += time.perf_counter() - t0
    return res


def _failed(path: Path, size: int, exc: BaseException) -> FileResult:
    return FileResult(
        path=str(path),
        format=None,
        status="failed",
        size_bytes=size,
        message=(
            f"{path}: the Dask task failed ({type(exc).__name__}: {exc}); "
            "the other files were ingested; ingest this file again, or locally "
            "(--executor local) to see the reader's message"
        ),
    )


def _unlink_staged(out: dict | None) -> None:
    for pq in (out or {}).get("parquet", {}).values():
        try:
            os.unlink(pq)
        except OSError:
            pass


def ingest_paths_dask(
    db_path: str | Path,
    paths: list[str | Path],
    run: str | None = None,
    scheduler: str | None = None,
    shared_dir: str | Path | None = None,
    n_workers: int = 2,
    rank_pattern: str | None = None,
    rank_map: str | Path | None = None,
    progress=None,
    options: IngestOptions | None = None,
    client=None,
    device_map: str | Path | None = None,
) -> IngestReport:
    """Like ``slowcard.ingest.ingest_paths``, with the parsing fanned out over Dask workers.

    Args:
        scheduler: ``tcp://HOST:PORT`` of a running Dask scheduler; None starts a
            ``LocalCluster`` of ``n_workers`` single-threaded processes on 127.0.0.1 (no
            dashboard) and closes it at the end.
        shared_dir: a folder every worker and this process can reach; a private sub-folder is
            created in it for the Parquet staging and removed at the end. Default: a hidden
            temporary folder next to the database.
        options: per-file reader options; default one DuckDB thread per Dask task (a worker
            runs as many tasks at once as it has threads, so the threads add up to its cores).
        client: an existing ``dask.distributed.Client`` to use (neither created nor closed).

    Returns the same IngestReport as ``ingest_paths``: each file is one commit, a file ingested
    again into the same run replaces its rows, failed files are reported and the others go on.
    """
    if not paths:
        raise UsageError("give at least one file, folder or glob to ingest")
    Client, LocalCluster, as_completed = _dask()
    files, run, rmap = prepare_batch(paths, run, rank_pattern, rank_map)
    dmap = devices.load_device_map(device_map) if device_map else None
    opts = options or IngestOptions(threads=1)
    sizes = {p: p.stat().st_size for p, _ in files}
    state = {
        "files_done": 0,
        "files_total": len(files),
        "bytes_done": 0,
        "bytes_total": sum(sizes.values()),
        "events": 0,
        "current": None,
    }

    db_path = Path(db_path)
    base = Path(shared_dir) if shared_dir else db_path.resolve().parent
    try:
        base.mkdir(parents=True, exist_ok=True)
        stage = tempspace.make_dir("dask", base, hidden=True)
    except OSError as exc:
        raise UsageError(
            f"{base}: cannot create the Parquet staging folder ({exc}); "
            "give --shared-dir a writable folder every worker can reach"
        ) from None

    cluster = own_client = None
    con = None
    report = IngestReport(run=run, db_path=str(db_path))
    try:
        con = store.open_db(db_path)
        store.ensure_run(con, run, str(Path(paths[0]).resolve()))
        columns = {t: _table_columns(con, t) for t in store.row_tables(con) if t not in NOT_STAGED}
        if client is None:
            if scheduler:
                try:
                    own_client = Client(scheduler, timeout=f"{CONNECT_TIMEOUT_S}s")
                except (OSError, TimeoutError) as exc:
                    raise UsageError(
                        f"cannot reach the Dask scheduler at {scheduler} ({exc}); "
                        "check the address (tcp://HOST:PORT) and that it is running"
                    ) from None
            else:
                # Loopback only: nothing listens beyond this machine, and no dashboard.
                cluster = LocalCluster(
                    n_workers=n_workers,
                    threads_per_worker=1,
                    processes=True,
                    host="127.0.0.1",
                    silence_logs=logging.ERROR,
                    **LOCAL_CLUSTER_HTTP,
                )
                own_client = Client(cluster)
            client = own_client
        threads = sum(w.get("nthreads", 1) for w in client.scheduler_info()["workers"].values()) or n_workers
        window = max(2, IN_FLIGHT_PER_THREAD * threads)

        by_key: dict[str, tuple[int, Path, int]] = {}
        results: list[FileResult | None] = [None] * len(files)
        todo = iter(enumerate(files))

        def submit(ac=None):
            item = next(todo, None)
            if item is None:
                return None
            i, (p, explicit) = item
            fut = client.submit(
                ingest_one_file,
                str(p),
                run,
                explicit,
                sizes[p],
                opts,
                rank_pattern,
                rmap,
                str(stage),
                pure=False,
                key=f"slowcard-ingest-{uuid.uuid4().hex}",
            )
            by_key[fut.key] = (i, p, sizes[p])
            if ac is not None:
                ac.add(fut)
            return fut

        first = [f for f in (submit() for _ in range(window)) if f is not None]
        ac = as_completed(first)
        for fut in ac:
            i, p, size = by_key.pop(fut.key)
            out = None
            try:
                out = fut.result()
            except Exception as exc:  # the task raised or its worker died: this file fails, the rest go on
                res = _failed(p, size, exc)
            else:
                res = _register(con, run, size, out, columns)
            finally:
                _unlink_staged(out)
                fut.release()
            results[i] = res
            state["files_done"] += 1
            state["bytes_done"] += size
            state["events"] += res.rows_kept
            state["current"] = res.path
            if progress:
                progress(dict(state))
            submit(ac)
        report.files = [r for r in results if r is not None]
        report.warnings = run_checks(con, run)
        report.notes, extra = devices.identify(con, run, dmap)
        report.warnings += extra
        store.refresh_materialized(con)  # the stored views follow the new files (as ingest_paths)
    finally:
        if con is not None:
            con.close()
        if client is not None:
            try:
                client.run(_drop_templates, str(stage))
            except Exception:  # noqa: BLE001 - cleanup of worker temp files must not hide the result
                pass
        if own_client is not None:
            own_client.close()
        if cluster is not None:
            cluster.close()
        shutil.rmtree(stage, ignore_errors=True)
    return report
