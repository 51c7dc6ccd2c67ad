"""The Dask path's lake (slowcard/lake.py): the workers' Parquet is read in place, never copied.

Against a plain local ingest of the same files, a Dask ingest (a real LocalCluster on loopback,
two worker processes) must give the same rows and the same verdict of every query, on the shared
real runs and on a generated 128-rank run; a worker killed with SIGKILL in the middle of its file
must leave nothing registered and no Parquet behind; and a coordinator killed with SIGKILL inside
a registration must leave every earlier file whole and nothing of the one it was registering."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="dask.distributed is an optional extra: pip install -e .[dask]")

sys.path.insert(0, str(Path(__file__).parent))
import synth_kineto  # noqa: E402
from conftest import REALDATA, duckdb_cli  # noqa: E402

import slowcard.distributed  # noqa: E402
from slowcard import queries, store  # noqa: E402
from slowcard.distributed import ingest_paths_dask  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CATALOG = queries.load_catalog()
REAL_RUNS = ["kineto_cpu_ep4_hot1", "kineto_cpu_ep_noise/hot_r5_w6", "kineto", "ascend"]
# Relations compared row for row (source ids differ between the two databases)
TABLES = [
    "SELECT * EXCLUDE (source_id, ingested_at) FROM sources",
    "SELECT * EXCLUDE (source_id) FROM events",
    "SELECT * EXCLUDE (source_id) FROM ops",
    "SELECT * EXCLUDE (source_id) FROM op_classes",
    "SELECT * EXCLUDE (source_id) FROM moe_layer_facts",
    "SELECT * EXCLUDE (source_id) FROM collective_waits",
]


@pytest.fixture(scope="module")
def client(cluster):
    from dask.distributed import Client

    with Client(cluster) as c:
        yield c


def _rows(db, sql):
    con = queries.open_readonly(db)  # the query sandbox: the lake must stay readable in it
    try:
        return sorted(con.execute(sql).fetchall(), key=repr)
    finally:
        con.close()


def _verdicts(db, run):
    con = queries.open_readonly(db)
    try:
        out = {}
        for name, q in sorted(CATALOG.items()):
            r = queries.run_query(con, q, run)
            # source ids differ between the databases (the files commit in another order)
            out[name] = (r.status, r.summary, [{k: v for k, v in row.items() if k != "source_id"} for row in r.rows])
        return out
    finally:
        con.close()


def _lake_on_disk(db) -> set[str]:
    return {str(p) for p in Path(f"{db}.lake").rglob("*.parquet")}


def _registered(db) -> set[str]:
    return {r[0] for r in _rows(db, "SELECT path FROM lake_files")}


def _compare(local_db, dask_db, run):
    for sql in TABLES:
        assert _rows(dask_db, sql) == _rows(local_db, sql), sql
    local_v, dask_v = _verdicts(local_db, run), _verdicts(dask_db, run)
    assert dask_v == local_v
    # the event rows are in the lake, not copied into the database
    assert _rows(dask_db, "SELECT count(*) FROM event_rows") == [(0,)]
    assert _lake_on_disk(dask_db) == _registered(dask_db)
    return local_v


@pytest.mark.parametrize("name", REAL_RUNS)
def test_real_runs_same_rows_and_verdicts(name, tmp_path, client):
    if not REALDATA.is_dir():
        pytest.skip(f"real profiler data not found at {REALDATA} (shared/ is not beside the checkout)")
    src = REALDATA / name
    run = "real"
    local = ingest_paths(tmp_path / "local.duckdb", [src], run=run)
    dask = ingest_paths_dask(tmp_path / "dask.duckdb", [src], run=run, client=client)
    assert sorted((Path(f.path).name, f.status, f.rows_kept) for f in dask.files) == sorted(
        (Path(f.path).name, f.status, f.rows_kept) for f in local.files
    )
    assert sum(f.rows_kept for f in dask.files) > 0
    verdicts = _compare(tmp_path / "local.duckdb", tmp_path / "dask.duckdb", run)
    # the queries really ran on these rows (some answer), and none failed on the lake
    assert any(s.value in ("PASS", "INFO", "WARN", "FAIL") for s, _sum, _rows in verdicts.values())
    assert not [q for q, (s, _sum, _rows) in verdicts.items() if s.value == "ERROR"]


def test_128_ranks_same_rows_and_verdicts(tmp_path, client):
    synth_kineto.write_ep_run(tmp_path / "in", scenario="token_skew", slow_rank=5, ranks=128, steps=4, layers=4)
    ingest_paths(tmp_path / "local.duckdb", [tmp_path / "in"], run="r128")
    rep = ingest_paths_dask(tmp_path / "dask.duckdb", [tmp_path / "in"], run="r128", client=client)
    assert len(rep.files) == 128 and all(f.status == "ok" for f in rep.files)
    verdicts = _compare(tmp_path / "local.duckdb", tmp_path / "dask.duckdb", "r128")
    status, _summary, rows = verdicts["ep-slow-rank"]
    assert status.value == "FAIL" and rows[0]["rank"] == 5


def test_duckdb_shell_reads_the_lake(tmp_path, client):
    """The plain shell reads the views over the lake; a `slowcard show --db` script keeps the
    query sandbox and still reads them; without --db the sandbox refuses the lake's files."""
    exe = duckdb_cli()
    if exe is None:
        pytest.skip("the duckdb shell is not installed (pip install duckdb-cli)")
    synth_kineto.write_ep_run(tmp_path / "in", scenario="token_skew", slow_rank=2, ranks=4, steps=3, layers=4)
    db = tmp_path / "dask.duckdb"
    ingest_paths_dask(db, [tmp_path / "in"], run="r", client=client)
    want = _rows(db, "SELECT count(*) FROM events")[0][0]

    def shell(script: str | None, *args: str):
        return subprocess.run(
            [exe, "-readonly", "-csv", *args, str(db)],
            input=script,
            capture_output=True,
            text=True,
            timeout=120,
        )

    out = shell(None, "-noheader", "-c", "SELECT count(*) FROM events")
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) == want > 0

    def show(*extra: str) -> str:
        cmd = [sys.executable, "-m", "slowcard", "show", "ep-slow-rank", "--run", "r", *extra]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert res.returncode == 0, res.stderr
        return res.stdout

    with_db = shell(show("--db", str(db)))
    assert with_db.returncode == 0, with_db.stderr
    assert "token-skew" in with_db.stdout and ",2," in with_db.stdout  # rank 2 named, as slowcard query does
    without = shell(show())
    assert "file system operations are disabled" in (without.stderr + without.stdout)


def test_killed_worker_registers_nothing(tmp_path, monkeypatch):
    """SIGKILL of the worker process right after it wrote its file's first Parquet (every time
    the file is tried): that file fails, the others are registered whole, and no Parquet of the
    dead task is left in the lake."""
    import dask
    from dask.distributed import LocalCluster

    synth_kineto.write_ep_run(tmp_path / "in", scenario="token_skew", slow_rank=1, ranks=4, steps=2, layers=2)
    monkeypatch.setenv("SLOWCARD_FAULT", "lake-rank2.pt.trace.json.gz:1")  # inherited by the workers
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):  # no retry of the killed task
        with LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            silence_logs=logging.CRITICAL,
            **slowcard.distributed.LOCAL_CLUSTER_HTTP,
        ) as c:
            db = tmp_path / "dask.duckdb"
            rep = ingest_paths_dask(db, [tmp_path / "in"], run="r", scheduler=c.scheduler_address)
    monkeypatch.delenv("SLOWCARD_FAULT")
    status = {Path(f.path).name: f.status for f in rep.files}
    assert status.pop("rank2.pt.trace.json.gz") == "failed"
    assert set(status.values()) == {"ok"} and len(status) == 3
    assert {Path(p).name for (p,) in _rows(db, "SELECT path FROM sources")} == set(status)
    assert _rows(db, "SELECT count(*) FROM pending_sources") == [(0,)]
    assert _lake_on_disk(db) == _registered(db) != set()
    # what is registered is whole: each file's events are its rows_kept
    kept = dict(_rows(db, "SELECT source_id, rows_kept FROM sources"))
    counted = dict(_rows(db, "SELECT source_id, count(*) FROM events GROUP BY ALL"))
    assert counted == kept


COORDINATOR = """
import sys
from slowcard.distributed import ingest_paths_dask
ingest_paths_dask(sys.argv[1], [sys.argv[2]], run="r", n_workers=1)
"""


def test_killed_coordinator_leaves_nothing_half_registered(tmp_path):
    """SIGKILL of the coordinator inside its third registration (the sources row, lake_files rows
    and the rewritten views written, not committed): the two files before it are whole, nothing
    of the third is visible, and the next Dask ingest removes its Parquet and completes."""
    synth_kineto.write_ep_run(tmp_path / "in", scenario="token_skew", slow_rank=1, ranks=4, steps=2, layers=2)
    db = tmp_path / "dask.duckdb"
    env = {**os.environ, "SLOWCARD_FAULT": "lake_commit:3", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", COORDINATOR, str(db), str(tmp_path / "in")],
        env=env,
        cwd=ROOT,
        start_new_session=True,  # its own process group: its worker processes go with it below
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _out, err = proc.communicate(timeout=300)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the LocalCluster it left behind
        except ProcessLookupError:
            pass
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    orphans = _lake_on_disk(db)
    con = store.open_db(db)  # the next write-open: pending ids of the dead coordinator are removed
    con.close()
    assert _rows(db, "SELECT count(*) FROM pending_sources") == [(0,)]
    kept = dict(_rows(db, "SELECT source_id, rows_kept FROM sources"))
    assert len(kept) == 2
    counted = dict(_rows(db, "SELECT source_id, count(*) FROM events GROUP BY ALL"))
    assert counted == kept
    assert _registered(db) < orphans  # the third file's Parquet exists, unregistered: unread
    assert {r[0] for r in _rows(db, "SELECT DISTINCT source_id FROM lake_files")} == set(kept)
    # the next Dask ingest deletes the dead run's Parquet and ingests every file
    rep = ingest_paths_dask(db, [tmp_path / "in"], run="r", n_workers=1)
    assert len(rep.files) == 4 and all(f.status == "ok" for f in rep.files)
    assert _lake_on_disk(db) == _registered(db)
    assert len(_rows(db, "SELECT * FROM sources")) == 4
    assert json.dumps(_rows(db, "SELECT count(*) FROM events")) == json.dumps([(sum(f.rows_kept for f in rep.files),)])


def test_user_taxonomy_reaches_the_workers_and_a_later_one_the_lake(tmp_path, client):
    """A user taxonomy row loaded before the Dask ingest classifies on the workers as it does
    locally; one loaded after it re-derives the op classes of the lake's files too (the workers'
    op-class Parquet follows the old taxonomy: it is unregistered and derived again)."""
    synth_kineto.write_ep_run(tmp_path / "in", scenario="token_skew", slow_rank=1, ranks=2, steps=1, layers=2)
    first = tmp_path / "first.csv"
    first.write_text("pattern,op_class,coll_kind,priority\n^decode_step,step,,1\n")
    later = tmp_path / "later.csv"
    later.write_text("pattern,op_class,coll_kind,priority\ngroupedmatmul|gmm,compute,,1\n")
    dbs = {"local": tmp_path / "local.duckdb", "dask": tmp_path / "dask.duckdb"}
    for db in dbs.values():
        con = store.open_db(db)
        store.load_user_taxonomy(con, first)
        con.close()
    ingest_paths(dbs["local"], [tmp_path / "in"], run="r")
    ingest_paths_dask(dbs["dask"], [tmp_path / "in"], run="r", client=client)
    sql = "SELECT * EXCLUDE (source_id) FROM op_classes"
    by_user = "SELECT count(*) FROM op_classes WHERE pattern = '^decode_step'"
    assert _rows(dbs["dask"], sql) == _rows(dbs["local"], sql)
    assert _rows(dbs["dask"], by_user)[0][0] > 0  # the user row did classify on the workers
    for db in dbs.values():
        con = store.open_db(db)
        store.load_user_taxonomy(con, later)
        con.close()
    assert _rows(dbs["dask"], sql) == _rows(dbs["local"], sql)
    assert _rows(dbs["dask"], "SELECT count(*) FROM op_classes WHERE pattern = 'groupedmatmul|gmm'")[0][0] > 0
    # the derived rows are in the database now; the lake keeps the event rows only
    assert {r[0] for r in _rows(dbs["dask"], "SELECT DISTINCT table_name FROM lake_files")} == {"event_rows"}


def test_two_databases_of_one_name_share_a_folder(tmp_path, client):
    """Two databases named alike, one --shared-dir: each has a lake of its own there, and the
    second's cleanup of unregistered Parquet never touches the first's files."""
    synth_kineto.write_ep_run(tmp_path / "in", ranks=2, steps=1, layers=2)
    shared = tmp_path / "shared"
    dbs = [tmp_path / "a" / "x.duckdb", tmp_path / "b" / "x.duckdb"]
    for db in dbs:
        db.parent.mkdir()
        ingest_paths_dask(db, [tmp_path / "in"], run="r", client=client, shared_dir=shared)
    assert len(list(shared.iterdir())) == 2
    want = _rows(dbs[1], "SELECT count(*) FROM events")
    assert want[0][0] > 0 and _rows(dbs[0], "SELECT count(*) FROM events") == want
    for db in dbs:
        assert all(Path(p).is_file() for p in _registered(db))
