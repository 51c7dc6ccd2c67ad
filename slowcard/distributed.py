"""Ingest past one machine: parse each file on a Dask worker, register its Parquet centrally.

Owns: shipping files to ``dask.distributed`` workers, the Parquet staging folder, and the
registration of each file in the database. Parsing is the cost and it is per file, so each file
is one task: the worker ingests that ONE file with the ordinary local code
(``slowcard.ingest.ingest_file``, same readers, same rank resolution on the real path, the
coordinator's operator taxonomy) into a private temporary DuckDB, where its commit also derives
the per-file rows the queries read (op classes, all-to-all splits). The worker then writes the
file's event rows and those derived rows as Parquet into the lake (``slowcard/lake.py``:
``<db>.lake/<table>/run=…/rank=…/``), under the source id the coordinator gave the task, stages
the few small tables that remain (drops, groups, metrics …) as Parquet too, and returns a small
dict. The coordinator registers each file with ``store.commit_source`` in one transaction: the
``sources`` row, the small staged tables, and the lake files (rows of ``lake_files``; the views
``<table>_all`` now read them). The event rows are never copied: the coordinator's cost per file
does not grow with the file, so adding workers shortens the job (bench/README.md, Scale). The
stored cross-rank views (moe_layer_facts, collectives …) are refreshed once at the end, reading
the workers' op-class Parquet in place.

Atomicity is the local path's: a file appears whole or not at all (its registration is one
commit); a task whose worker dies, or that fails, registers nothing and its Parquet is deleted;
a coordinator killed mid-run leaves pending ids (removed at the next write-open) and unregistered
Parquet files (removed by the next Dask ingest into the database), never half a file.

Requirements of a real cluster: every worker sees the input files at the same paths as the
coordinator (the stored ``path`` and the rank resolution use it), ``shared_dir`` is a folder
every worker and the coordinator can reach (NFS, a shared volume), and the workers run the same
slowcard version (checked: another schema fails the file with a message). The lake is part of
the database: keep ``<db>.lake`` (or ``<shared_dir>/<db name>-<id>.lake``) where it was written.

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

from . import devices, lake, store, taxonomy, tempspace
from .errors import UsageError
from .ingest import FileResult, IngestReport, ingest_file, prepare_batch, run_checks
from .ingest.base import IngestOptions

INSTALL_HINT = "pip install -e .[dask]"
# Tables never staged: the pending-id bookkeeping, and the drops (they travel in the result dict
# and commit_source writes them). The tables of lake.LAKE_TABLES go to the lake, not the stage.
NOT_STAGED = frozenset({"pending_sources", "source_drops"})
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


def _template_db(stage_dir: str, user_taxonomy: list[tuple]) -> Path:
    """This process's empty schema-applied database for one ingest call (keyed by its staging
    folder, so that concurrent ingests on a shared cluster never remove each other's), holding
    the coordinator's user taxonomy rows: the op classes derived here are the coordinator's."""
    key = (store.ddl_fingerprint(), stage_dir)
    path = _TEMPLATE.get(key)
    if path is None or not path.exists():
        folder = tempspace.make_dir("template")
        path = folder / "template.duckdb"
        con = store.open_db(path)
        try:
            con.execute("DELETE FROM op_taxonomy WHERE origin = 'user'")
            if user_taxonomy:
                taxonomy.replace_user_rows(con, [tuple(r) for r in user_taxonomy])
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
    sid: int,
    lake_dir: str,
    user_taxonomy: list[tuple] = (),  # type: ignore[assignment]
) -> dict:
    """Task body (runs on a worker): ingest one file into a private temporary database, write its
    event and derived rows to the lake under source id ``sid`` and stage its other rows as Parquet
    in ``stage_dir``. Returns the small dict the coordinator registers."""
    t0 = time.perf_counter()
    work = tempspace.make_dir("worker")
    out: dict = {
        "source": None,
        "row_drops": [],
        "cell_drops": [],
        "parquet": {},
        "columns": {},
        "lake": [],
        "ddl_fingerprint": store.ddl_fingerprint(),
    }
    try:
        db = work / "file.duckdb"
        shutil.copyfile(_template_db(stage_dir, list(user_taxonomy)), db)
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
                own_sid = out["source"]["source_id"]  # in the private database
                for scope in ("row", "cell"):
                    out[f"{scope}_drops"] = [
                        tuple(r)
                        for r in con.execute(
                            "SELECT reason, position, n_rows FROM source_drops WHERE source_id = ? AND scope = ?",
                            [own_sid, scope],
                        ).fetchall()
                    ]
                token = uuid.uuid4().hex
                for table in _staged_tables(con):
                    if not con.execute(f'SELECT 1 FROM "{table}" LIMIT 1').fetchall():
                        continue
                    if table in lake.LAKE_TABLES:
                        rank = out["source"]["rank"]
                        target = lake.file_path(lake_dir, table, out["source"]["run"], rank, sid, token)
                        target.parent.mkdir(parents=True, exist_ok=True)
                        (n,) = store.one_row(
                            con,
                            f'COPY (SELECT * REPLACE ({int(sid)}::INTEGER AS source_id) FROM "{table}") '
                            f"TO '{_sql_str(str(target))}' (FORMAT parquet)",
                        )
                        out["lake"].append((table, str(target), int(n)))
                        store.fault_point("lake-" + Path(path).name)  # crash tests: a worker dies here
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


def _register(con, run: str, size: int, out: dict, columns: dict[str, list[str]], sid: int) -> FileResult:
    """Register one file under its pending id ``sid``: copy its small staged tables in and publish
    it with its lake files (one commit). Nothing is registered when the worker found nothing to
    keep, or ran another schema; the caller then discards ``sid`` and deletes the lake files."""
    res = FileResult(**out["result"])
    src = out["source"]
    if src is None:  # failed or skipped on the worker: nothing to register
        return res
    t0 = time.perf_counter()
    # Workers on another machine may run another slowcard version: the rows they wrote must be of
    # this database's schema (the lake files are read in place, under this schema's views).
    theirs = out.get("ddl_fingerprint")
    if theirs != store.ddl_fingerprint() or any(columns.get(t) is None for t in out["columns"]):
        res.status, res.rows_kept, res.rows_dropped, res.rank, res.rank_source = "failed", 0, 0, None, None
        res.message = (
            f"{res.path}: the Dask worker runs another slowcard schema ({theirs}, this database "
            f"{store.ddl_fingerprint()}); install the same slowcard version on every worker"
        )
        return res
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
                con,
                sid,
                run,
                res.path,
                size,
                src["fingerprint"],
                _record(src),
                out["row_drops"],
                out["cell_drops"],
                derive=False,  # the worker derived them: they are among the lake files
                lake_files=[tuple(x) for x in out["lake"]],
            )
    except duckdb.Error as exc:
        res.status, res.rows_kept, res.rows_dropped = "failed", 0, 0
        res.rank = res.rank_source = None
        res.message = f"{res.path}: the database refused the rows ({str(exc).splitlines()[0]})"
    res.seconds += time.perf_counter() - t0
    return res


def _lake_dir(con, db_path: Path, shared_dir: str | Path | None) -> Path:
    """Where this database's workers write their Parquet: ``<db>.lake`` beside the database, or
    in ``shared_dir`` ``<db name>-<id>.lake`` with an id of this database (kept in ``meta``), so
    that two databases of the same name sharing a folder never take (or clean) each other's."""
    if not shared_dir:
        return (db_path.resolve().parent / f"{db_path.name}.lake").resolve()
    row = con.execute("SELECT value FROM meta WHERE key = 'lake_id'").fetchone()
    lake_id = row[0] if row else uuid.uuid4().hex[:12]
    if row is None:
        con.execute("INSERT INTO meta VALUES ('lake_id', ?)", [lake_id])
    return (Path(shared_dir) / f"{db_path.name}-{lake_id}.lake").resolve()


def _committed(con, sid: int) -> bool:
    return con.execute("SELECT 1 FROM sources WHERE source_id = ?", [sid]).fetchone() is not None


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


def _unlink_staged(out: dict | None, registered: bool) -> None:
    """The staged copies go in any case; the lake files too unless the file was registered."""
    for pq in (out or {}).get("parquet", {}).values():
        try:
            os.unlink(pq)
        except OSError:
            pass
    if not registered:
        lake.delete_files(p for _t, p, _n in (out or {}).get("lake", []))


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
            created in it for the Parquet staging and removed at the end, and the lake (the
            event rows' Parquet, read in place: part of the database) is
            ``<db name>-<id>.lake`` in it (the id is the database's own, kept in ``meta``).
            Default: the database's folder.
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
        columns = {
            t: _table_columns(con, t)
            for t in store.row_tables(con)
            if t not in NOT_STAGED and t not in lake.LAKE_TABLES
        }
        lake_dir = _lake_dir(con, db_path, shared_dir)
        try:
            lake_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(
                f"{lake_dir}: cannot create the Parquet lake folder ({exc}); "
                "give --shared-dir a writable folder every worker can reach"
            ) from None
        # Parquet of an earlier ingest killed before its registration committed: no view reads it.
        lake.remove_unregistered(con, lake_dir)
        user_taxonomy = con.execute(
            "SELECT pattern, op_class, coll_kind, priority FROM op_taxonomy WHERE origin = 'user' ORDER BY ALL"
        ).fetchall()
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

        by_key: dict[str, tuple[int, Path, int, int]] = {}
        results: list[FileResult | None] = [None] * len(files)
        todo = iter(enumerate(files))

        def submit(ac=None):
            item = next(todo, None)
            if item is None:
                return None
            i, (p, explicit) = item
            # The id is handed out (pending) before the task runs: the worker writes it into the
            # lake files, so registering them is a row in lake_files, not a rewrite.
            sid = store.new_source_id(con)
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
                sid,
                str(lake_dir),
                user_taxonomy,
                pure=False,
                key=f"slowcard-ingest-{uuid.uuid4().hex}",
            )
            by_key[fut.key] = (i, p, sizes[p], sid)
            if ac is not None:
                ac.add(fut)
            return fut

        first = [f for f in (submit() for _ in range(window)) if f is not None]
        ac = as_completed(first)
        for fut in ac:
            i, p, size, sid = by_key.pop(fut.key)
            out = None
            registered = False
            try:
                out = fut.result()
            except Exception as exc:  # the task raised or its worker died: this file fails, the rest go on
                res = _failed(p, size, exc)
            else:
                res = _register(con, run, size, out, columns, sid)
            finally:
                registered = _committed(con, sid)
                if not registered:
                    store.discard_source(con, sid)
                    if out is None:  # the worker died: what it wrote is found by its source id
                        lake.remove_unregistered(con, lake_dir, [sid])
                _unlink_staged(out, registered)
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
