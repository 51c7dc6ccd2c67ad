"""The Dask executor: a real LocalCluster on loopback with two worker processes must give the same
database as a plain local ingest, row for row, and the same verdicts."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="dask.distributed is an optional extra: pip install -e .[dask]")

sys.path.insert(0, str(Path(__file__).parent))
import synth_kineto  # noqa: E402

import slowcard.distributed  # noqa: E402
from slowcard import queries, store  # noqa: E402
from slowcard.distributed import ingest_paths_dask  # noqa: E402
from slowcard.errors import UsageError  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

CATALOG = queries.load_catalog()
RUN = "ep"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A 4-rank EP run (rank 1 token-skewed), a truncated host-side Chrome trace and a README in
    the same folder, and an explicitly named non-trace file (failed, not skipped)."""
    d = tmp_path_factory.mktemp("dask_in")
    synth_kineto.write_ep_run(
        d / "trace", scenario="token_skew", slow_rank=1, ranks=4, steps=3, layers=4
    )  # 12 instances: enough to judge
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"op{i}",
            "pid": 1,
            "tid": 2,
            "ts": 1000 + 10 * i,
            "dur": 5,
            "args": {"i": i},
        }
        for i in range(50)
    ]
    text = json.dumps(events)
    (d / "trace" / "host_side.json").write_text(text[: len(text) * 3 // 4])  # cut inside an event
    (d / "trace" / "README.txt").write_text("notes about this run\n")
    (d / "garbage.json").write_text("this is not a trace\n")
    # The host-side trace names no rank: a rank map gives it one (resolved on the worker).
    (d / "ranks.json").write_text(json.dumps({"host_side.json": 7}))
    return [d / "trace", d / "garbage.json"]


def _rank_map(inputs):
    return inputs[0].parent / "ranks.json"


def _temp_leftovers(tmp: Path) -> set[str]:
    return {p.name for p in tmp.iterdir() if p.name.startswith(("slowcard-worker-", "slowcard-template-"))}


@pytest.fixture(scope="module")
def dbs(inputs, tmp_path_factory):
    d = tmp_path_factory.mktemp("dask_db")
    local = ingest_paths(d / "local.duckdb", inputs, run=RUN, rank_map=_rank_map(inputs))
    # The workers' temp folders in a temp folder of this test's own (TMPDIR, inherited by the worker
    # processes): another suite's Dask ingest running meanwhile leaves its folders elsewhere.
    worker_tmp = d / "worker_tmp"
    worker_tmp.mkdir()
    shared = d / "shared"
    seen = []
    with pytest.MonkeyPatch.context() as mp, socket.socket() as busy:
        mp.setenv("TMPDIR", str(worker_tmp))
        # The port Dask's scheduler once took for its HTTP server whatever the dashboard setting:
        # held here, as another cluster on the machine would hold it (slowcard must not need it).
        try:
            busy.bind(("127.0.0.1", 8787))
        except OSError:
            pass  # already held by someone else: the same situation
        dask = ingest_paths_dask(
            d / "dask.duckdb",
            inputs,
            run=RUN,
            n_workers=2,
            shared_dir=shared,
            rank_map=_rank_map(inputs),
            progress=seen.append,
        )
    return {
        "local": (d / "local.duckdb", local),
        "dask": (d / "dask.duckdb", dask),
        "shared": shared,
        "progress": seen,
        "leftovers": _temp_leftovers(worker_tmp),
    }


def _rows(db, sql):
    con = store.connect(db, read_only=True)
    try:
        return sorted(con.execute(sql).fetchall(), key=repr)
    finally:
        con.close()


def _summary(report):
    return sorted(
        (
            Path(f.path).name,
            f.format,
            f.status,
            f.rank,
            f.rank_source,
            f.rows_kept,
            f.rows_dropped,
            f.size_bytes,
            f.message,
        )
        for f in report.files
    )


def test_report_matches_local(dbs):
    _, local = dbs["local"]
    _, dask = dbs["dask"]
    assert _summary(dask) == _summary(local)
    by_status = {Path(f.path).name: f.status for f in dask.files}
    assert by_status["host_side.json"] == "truncated"
    assert by_status["README.txt"] == "skipped"
    assert by_status["garbage.json"] == "failed"
    assert sorted(f.rank for f in dask.files if f.format == "kineto") == [0, 1, 2, 3]
    ranks = {Path(f.path).name: (f.rank, f.rank_source) for f in dask.files}
    assert ranks["host_side.json"] == (7, "rank_map")
    assert ranks["rank1.pt.trace.json.gz"] == (1, "distributedInfo")
    assert dask.warnings == local.warnings and dask.exit_code == local.exit_code == 1
    assert dask.run == RUN


@pytest.mark.parametrize(
    "sql",
    [
        # sources minus ids and timestamps (paths are the same files in both databases)
        "SELECT * EXCLUDE (source_id, ingested_at) FROM sources",
        "SELECT s.path, d.* EXCLUDE (source_id) FROM source_drops d JOIN sources s USING (source_id)",
        "SELECT * EXCLUDE (source_id) FROM events",
        "SELECT * EXCLUDE (source_id) FROM op_classes",
        "SELECT * EXCLUDE (source_id) FROM moe_layer_facts",
        "SELECT run, world_size FROM runs",
        "SELECT count(*) FROM pending_sources",
    ],
)
def test_tables_equal_row_for_row(dbs, sql):
    local = _rows(dbs["local"][0], sql)
    dask = _rows(dbs["dask"][0], sql)
    assert len(dask) == len(local)
    assert dask == local
    if "events" in sql:
        assert len(local) > 1000  # the EP run and the salvaged events are really there


def test_same_verdict(dbs):
    out = {}
    for key in ("local", "dask"):
        con = queries.open_readonly(dbs[key][0])
        try:
            out[key] = queries.run_query(con, CATALOG["ep-slow-rank"], RUN)
        finally:
            con.close()
    assert out["local"].status == "FAIL" and out["local"].rows[0]["rank"] == 1
    assert (out["dask"].status, out["dask"].summary, out["dask"].rows) == (
        out["local"].status,
        out["local"].summary,
        out["local"].rows,
    )


def _lake_files_on_disk(shared: Path) -> set[str]:
    return {str(p) for p in shared.rglob("*.parquet")}


def _lake_files_registered(db) -> set[str]:
    return {r[0] for r in _rows(db, "SELECT path FROM lake_files")}


def test_staging_and_worker_temp_removed(dbs):
    # the shared folder keeps the lake only (the event rows read in place), no staging
    assert dbs["shared"].is_dir()
    [lake] = [p.name for p in dbs["shared"].iterdir()]
    assert lake.startswith("dask.duckdb-") and lake.endswith(".lake")
    on_disk = _lake_files_on_disk(dbs["shared"])
    assert on_disk and on_disk == _lake_files_registered(dbs["dask"][0])
    assert dbs["leftovers"] == set()
    assert not list(Path(dbs["dask"][0]).parent.glob(".slowcard-dask-*"))


def test_progress_reports_every_file(dbs):
    seen = dbs["progress"]
    n = len(dbs["dask"][1].files)
    assert [p["files_done"] for p in seen] == list(range(1, n + 1))
    assert seen[-1]["bytes_done"] == seen[-1]["bytes_total"] > 0
    assert seen[-1]["events"] == sum(f.rows_kept for f in dbs["dask"][1].files)


def test_reingest_through_scheduler_replaces(dbs, inputs, cluster):
    """Ingesting the same files again into the same run, via tcp://127.0.0.1:PORT, replaces
    every file's rows: no duplicate sources, events or derived rows."""
    db = dbs["dask"][0]
    count_sql = (
        "SELECT (SELECT count(*) FROM sources), (SELECT count(*) FROM event_rows_all), "
        "(SELECT count(*) FROM op_class_rows_all), (SELECT count(*) FROM source_drops), "
        "(SELECT list(source_id ORDER BY source_id) FROM sources)"
    )
    before = _rows(db, count_sql)[0]
    assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
    report = ingest_paths_dask(db, inputs, run=RUN, scheduler=cluster.scheduler_address, rank_map=_rank_map(inputs))
    assert _summary(report) == _summary(dbs["dask"][1])
    after = _rows(db, count_sql)[0]
    assert after[:4] == before[:4]
    assert not set(after[4]) & set(before[4])  # every file was published under a new id
    sql = "SELECT * EXCLUDE (source_id) FROM events"
    assert _rows(db, sql) == _rows(dbs["local"][0], sql)
    # without a shared folder the lake is beside the database; the replaced files' Parquet (in
    # the first ingest's lake) is gone, the new files are all registered
    assert _lake_files_on_disk(dbs["shared"]) == set()
    assert _lake_files_on_disk(Path(db).parent / "dask.duckdb.lake") == _lake_files_registered(db)


def test_bad_scheduler_is_a_usage_error(inputs, tmp_path, monkeypatch):
    monkeypatch.setattr(slowcard.distributed, "CONNECT_TIMEOUT_S", 2)
    with pytest.raises(UsageError, match="cannot reach the Dask scheduler"):
        ingest_paths_dask(tmp_path / "x.duckdb", inputs, run=RUN, scheduler="tcp://127.0.0.1:1")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".slowcard-dask-")] == []


def test_missing_dask_names_the_install_command(inputs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # import -> ImportError
    with pytest.raises(UsageError, match=r"pip install -e \.\[dask\]"):
        ingest_paths_dask(tmp_path / "x.duckdb", inputs, run=RUN)
