"""Issue 16: what a hostile or careless user broke. One test (or more) per item; the item number
is in each test's name or docstring."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_kineto  # noqa: E402
from conftest import PEAK_RSS_CHILD  # noqa: E402

from slowcard import store  # noqa: E402

CLI = [sys.executable, "-m", "slowcard"]


def _cli(*args, env=None, timeout=300, **kw):
    return subprocess.run(
        CLI + [str(a) for a in args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        **kw,
    )


@pytest.fixture(scope="module")
def run4(tmp_path_factory):
    d = tmp_path_factory.mktemp("run4")
    paths = synth_kineto.write_ep_run(
        d, ranks=4, steps=3, layers=4, gz=False
    )  # 12 layer instances: enough for ep-slow-rank to judge
    return d, paths


def _state(db: Path) -> dict[str, tuple[str, int, int]]:
    """path -> (status, rows_kept in sources, rows visible in events)."""
    con = store.open_db(db)
    try:
        return {
            p: (st, kept, n)
            for p, st, kept, n in con.execute(
                """SELECT s.path, s.status, s.rows_kept,
                      (SELECT count(*) FROM events e WHERE e.source_id = s.source_id)
               FROM sources s"""
            ).fetchall()
        }
    finally:
        con.close()


# --- 1: source ids never collide ----------------------------------------------------------------


def test_1_source_ids_are_unique_across_threads_when_the_sequence_is_behind(tmp_path):
    db = tmp_path / "ids.duckdb"
    con = store.open_db(db)
    # After a crash the sequence can be behind the ids in use: max()+1 is what protects them.
    con.execute(
        "INSERT INTO sources (source_id, run, path, status) SELECT i, 'r', 'p' || i, 'ok' FROM range(1, 51) t(i)"
    )
    ids, lock, barrier = [], threading.Lock(), threading.Barrier(4)

    def worker():
        cur = con.cursor()
        barrier.wait()
        for _ in range(30):
            sid = store.new_source_id(cur)
            with lock:
                ids.append(sid)
        cur.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    con.close()
    assert len(ids) == 120 and len(set(ids)) == 120
    assert min(ids) > 50


def test_1_discard_never_deletes_a_committed_source(tmp_path, run4):
    _, paths = run4
    db = tmp_path / "d.duckdb"
    assert _cli("ingest", paths[0], "--db", db, "-q").returncode == 0
    con = store.open_db(db)
    sid, kept = con.execute("SELECT source_id, rows_kept FROM sources").fetchone()
    store.discard_source(con, sid)  # a failing file's cleanup holding a colliding id
    assert con.execute("SELECT count(*) FROM events WHERE source_id = ?", [sid]).fetchone()[0] == kept
    con.close()


@pytest.mark.parametrize("point", ["committed:1", "commit:2", "pending:3", "committed:3"])
def test_1_jobs2_killed_at_a_known_point_then_rerun_keeps_every_committed_row(tmp_path, run4, point):
    folder, paths = run4
    db = tmp_path / "k.duckdb"
    killed = _cli("ingest", folder, "--db", db, "--run", "r", "--jobs", "2", "-q", env={"SLOWCARD_FAULT": point})
    assert killed.returncode == -9, f"the kill at {point} did not land: {killed.returncode} {killed.stderr}"
    name, n = point.split(":")
    n = int(n)
    before = _state(db)
    # The 4 small traces are one batch (ingest/_shared.py), committed in ONE transaction: a kill
    # before it ("pending", or "commit" inside it) leaves no file, one after it ("committed")
    # finds all four in. Never a part of the batch.
    committed = {"committed": len(paths), "commit": 0, "pending": 0}[name]
    assert len(before) == committed, (point, before)
    for path, (_st, kept, visible) in before.items():
        assert kept == visible, (point, path)
    for _ in range(2):  # the re-run, and one more on a database that is whole
        again = _cli("ingest", folder, "--db", db, "--run", "r", "--jobs", "2", "-q")
        assert again.returncode == 0, again.stderr
        after = _state(db)
        assert sorted(after) == sorted(str(p.resolve()) for p in paths)
        for path, (st, kept, visible) in after.items():
            assert st == "ok" and kept == visible and kept > 0, (point, path, st, kept, visible)
    con = duckdb.connect(str(db))
    assert (
        con.execute(
            "SELECT count(*) FROM event_rows WHERE source_id NOT IN (SELECT source_id FROM sources)"
        ).fetchone()[0]
        == 0
    )
    con.close()


@pytest.mark.parametrize("point, committed", [("commit:3", 0), ("committed:1", 4)])
def test_1_kill_inside_a_batch_commit_leaves_no_file_of_it_and_keeps_the_earlier_run(tmp_path, run4, point, committed):
    """A batch commits its files in one transaction (store.commit_sources): SIGKILL inside it, at
    its 3rd file's point, leaves none of the batch's files (not the first two either: no file is
    half-registered, no row of it is visible or left over); SIGKILL right after its first file's
    "committed" point finds all four in (one COMMIT published them). Every row of a run
    ingested before is intact; the same ingest again then completes the batch."""
    folder, paths = run4
    db = tmp_path / "b.duckdb"
    other = tmp_path / "earlier" / paths[0].name
    other.parent.mkdir()
    other.write_bytes(paths[0].read_bytes())
    first = _cli("ingest", other, "--db", db, "--run", "earlier", "-q")
    assert first.returncode == 0, first.stderr
    earlier = _state(db)
    assert len(earlier) == 1
    killed = _cli("ingest", folder, "--db", db, "--run", "r", "-q", env={"SLOWCARD_FAULT": point})
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    state = _state(db)  # opened: WAL replayed, the batch's pending rows removed
    assert {p: v for p, v in state.items() if p in earlier} == earlier
    assert len(state) == 1 + committed and all(kept == visible > 0 for _st, kept, visible in state.values())
    con = duckdb.connect(str(db))
    try:
        assert con.execute("SELECT count(*) FROM pending_sources").fetchone()[0] == 0
        for table in ("event_rows", "op_class_rows"):
            n = con.execute(f"SELECT count(*) FROM {table} WHERE source_id NOT IN (SELECT source_id FROM sources)")
            assert n.fetchone()[0] == 0, table
        assert con.execute("SELECT count(*) FROM sources WHERE run = 'r'").fetchone()[0] == committed
    finally:
        con.close()
    again = _cli("ingest", folder, "--db", db, "--run", "r", "-q")
    assert again.returncode == 0, again.stderr
    after = _state(db)
    assert len(after) == 1 + len(paths) and all(kept == visible > 0 for _st, kept, visible in after.values())


# --- 9: a bad SLOWCARD_LOCK_WAIT ----------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "abc", "nan", "-1", "inf"])
def test_9_bad_lock_wait_falls_back_with_a_warning(value):
    res = _cli("--help", env={"SLOWCARD_LOCK_WAIT": value})
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    if value:
        assert "SLOWCARD_LOCK_WAIT" in res.stderr and "using 30 s" in res.stderr
    assert store.lock_wait_from_env(value)[0] == 30.0
    assert store.lock_wait_from_env("2.5") == (2.5, None)


def test_9_a_tmp_dir_that_is_no_folder_falls_back_with_a_warning(tmp_path, run4):
    """SLOWCARD_TMP_DIR naming no folder: a warning, and the parts go where they go by default
    (the ingest succeeds); naming a folder: no warning, and nothing is left in it after the ingest
    (that the parts do go there is shown by test_11, which finds a killed ingest's parts in it)."""
    _, paths = run4
    missing = tmp_path / "no-such-folder"
    res = _cli("ingest", paths[0], "--db", tmp_path / "a.duckdb", "-q", env={"SLOWCARD_TMP_DIR": str(missing)})
    assert res.returncode == 0, res.stderr
    assert f"SLOWCARD_TMP_DIR={str(missing)!r} is not a folder" in res.stderr and not missing.exists()
    chosen = tmp_path / "parts"
    chosen.mkdir()
    res = _cli("ingest", paths[0], "--db", tmp_path / "b.duckdb", "-q", env={"SLOWCARD_TMP_DIR": str(chosen)})
    assert res.returncode == 0 and "SLOWCARD_TMP_DIR" not in res.stderr, res.stderr
    assert list(chosen.iterdir()) == []  # its part folder was made there and removed


# --- 13: parameters that are not finite numbers ---------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "NaN"])
def test_13_non_finite_parameter_is_refused(tmp_path, value):
    from slowcard import queries
    from slowcard.errors import UsageError

    q = queries.find(queries.load_catalog(None), "ep-slow-rank")
    with pytest.raises(UsageError, match="min_cost_pct"):
        queries.bind_params(q, {"min_cost_pct": value})
    res = _cli("query", "ep-slow-rank", "-p", f"min_cost_pct={value}", "--db", tmp_path / "none.duckdb")
    assert res.returncode == 2 and "not a valid DOUBLE" in res.stderr, res.stderr
    assert queries.bind_params(q, {"min_cost_pct": "1.5"})["min_cost_pct"] == 1.5


# --- 7: inputs that tracebacked or hung ----------------------------------------------------------

_ONE_EVENT = '"traceEvents": [{"ph":"X","name":"a","ts":1,"dur":2,"pid":1,"tid":1}]}'


@pytest.mark.parametrize("base", ["Infinity", "-Infinity", "NaN", "1e400", "99999999999999999999999"])
def test_7_unusable_base_time_is_ignored_not_a_traceback(tmp_path, base):
    f = tmp_path / "t.json"
    f.write_text('{"baseTimeNanoseconds": ' + base + ", " + _ONE_EVENT)
    res = _cli("ingest", f, "--db", tmp_path / "b.duckdb", "-q")
    assert "Traceback" not in res.stderr and res.returncode == 0, res.stderr
    state = _state(tmp_path / "b.duckdb")
    assert [v[:2] for v in state.values()] == [("ok", 1)]


@pytest.fixture
def odd_folder(tmp_path):
    d = tmp_path / "odd"
    d.mkdir()
    (d / "good.json").write_text("{" + _ONE_EVENT)
    (d / "dangling.json").symlink_to("nowhere.json")
    (d / "loop1").symlink_to("loop2")
    (d / "loop2").symlink_to("loop1")
    os.mkfifo(d / "pipe.json")
    return d


def test_7_folder_with_dangling_link_loop_and_fifo_ingests_the_rest(tmp_path, odd_folder):
    res = _cli("ingest", odd_folder, "--db", tmp_path / "o.duckdb", timeout=60)
    assert "Traceback" not in res.stderr and res.returncode == 0, res.stderr
    out = res.stdout
    assert "dangling symbolic link" in out and "symbolic link loop" in out and "named pipe (FIFO)" in out
    assert "1 ok, 4 skipped" in out
    assert [v[:2] for v in _state(tmp_path / "o.duckdb").values()] == [("ok", 1)]


@pytest.mark.parametrize(
    "name,phrase",
    [
        ("pipe.json", "named pipe (FIFO)"),
        ("loop1", "symbolic link loop"),
        ("dangling.json", "dangling symbolic link"),
        ("/dev/zero", "a device"),
    ],
)
def test_7_15_special_file_named_explicitly_fails_with_what_it_is(tmp_path, odd_folder, name, phrase):
    target = name if name.startswith("/") else odd_folder / name
    res = _cli("ingest", target, "--db", tmp_path / "e.duckdb", "-q", timeout=60)
    assert res.returncode == 1 and phrase in res.stderr and str(target) in res.stderr, res.stderr
    assert "no such file" not in res.stderr and "Traceback" not in res.stderr


# --- 3, 10: export replaces what it exports; bad targets are usage errors --------------------------


def _ranks_in(out: Path, run: str | None = None) -> list:
    con = duckdb.connect()
    where = f"WHERE run = '{run}'" if run else ""
    got = con.execute(
        f"SELECT DISTINCT run, rank FROM read_parquet('{out}/events/**/*.parquet', "
        f"hive_partitioning = true) {where} ORDER BY ALL"
    ).fetchall()
    con.close()
    return got


@pytest.fixture(scope="module")
def two_dbs(tmp_path_factory):
    """The same run name with 4 ranks, then with 2; and a second run "other run/x"."""
    root = tmp_path_factory.mktemp("exp")
    four = synth_kineto.write_ep_run(root / "four", ranks=4, steps=1, layers=1, gz=False)
    two = synth_kineto.write_ep_run(root / "two", ranks=2, steps=1, layers=1, gz=False)
    db4, db2 = root / "four.duckdb", root / "two.duckdb"
    assert _cli("ingest", *four, "--db", db4, "--run", "r", "-q").returncode == 0
    assert _cli("ingest", *two[:1], "--db", db4, "--run", "other run/x", "-q").returncode == 0
    assert _cli("ingest", *two, "--db", db2, "--run", "r", "-q").returncode == 0
    return db4, db2


def test_3_export_into_an_existing_folder_drops_stale_partitions(tmp_path, two_dbs):
    db4, db2 = two_dbs
    out = tmp_path / "pq"
    assert _cli("export", "--parquet", out, "--db", db4).returncode == 0
    assert _ranks_in(out, "r") == [("r", 0), ("r", 1), ("r", 2), ("r", 3)]
    res = _cli("export", "--parquet", out, "--db", db2)
    assert res.returncode == 0, res.stderr
    assert _ranks_in(out) == [("r", 0), ("r", 1)]
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "staging left behind"


def test_3_export_of_one_run_replaces_that_run_and_keeps_the_others(tmp_path, two_dbs):
    db4, db2 = two_dbs
    out = tmp_path / "pq"
    assert _cli("export", "--parquet", out, "--db", db4).returncode == 0
    res = _cli("export", "--parquet", out, "--db", db2, "--run", "r")
    assert res.returncode == 0, res.stderr
    assert _ranks_in(out) == [("other run/x", 0), ("r", 0), ("r", 1)]


@pytest.mark.parametrize("kind", ["file", "under_file"])
def test_10_export_to_a_file_or_under_a_file_is_a_usage_error(tmp_path, two_dbs, kind):
    _, db2 = two_dbs
    f = tmp_path / "plain.txt"
    f.write_text("keep me")
    target = f if kind == "file" else f / "sub"
    res = _cli("export", "--parquet", target, "--db", db2)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert str(target) in res.stderr and ("is a file" in res.stderr or "a part of the path is a file" in res.stderr)
    assert f.read_text() == "keep me"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_10_export_to_a_read_only_folder_is_a_usage_error(tmp_path, two_dbs):
    _, db2 = two_dbs
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    res = _cli("export", "--parquet", ro, "--db", db2)
    assert res.returncode == 2 and "not writable" in res.stderr and "Traceback" not in res.stderr


# --- 5, 10, 15: databases that are not slowcard's --------------------------------------------------


def _relations(db: Path) -> list[str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables ORDER BY 1").fetchall()]
    finally:
        con.close()


@pytest.mark.parametrize(
    "command",
    [
        ["query"],
        ["query", "ep-slow-rank"],
        ["report", "--out", "{tmp}/r.html"],
        ["export", "--parquet", "{tmp}/pq"],
        ["ingest", "{file}"],
        ["diagnose"],
        ["annotate", "--out", "{tmp}/a.json"],
    ],
)
def test_5_10_foreign_duckdb_is_refused_and_left_untouched(tmp_path, run4, command):
    db = tmp_path / "theirs.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE events (a INTEGER)")
    con.execute("INSERT INTO events VALUES (1)")
    con.execute("CREATE VIEW mine AS SELECT 1")
    con.close()
    before = _relations(db)
    args = [a.format(tmp=tmp_path, file=run4[1][0]) for a in command]
    res = _cli(*args, "--db", db)
    assert res.returncode == 2, res.stderr
    assert "not created by slowcard" in res.stderr and str(db) in res.stderr and "Traceback" not in res.stderr
    assert _relations(db) == before


def test_15_sqlite_file_as_db_is_named_and_no_extension_is_fetched(tmp_path):
    import sqlite3

    db = tmp_path / "s.db"
    c = sqlite3.connect(db)
    c.execute("CREATE TABLE t (a)")
    c.commit()
    c.close()
    size = db.stat().st_size
    res = _cli("query", "--db", db)
    assert res.returncode == 2 and "a SQLite database" in res.stderr and "Traceback" not in res.stderr
    assert "extension" not in res.stderr.lower() and db.stat().st_size == size


# --- 4: --out never replaces a link, a FIFO or a device -------------------------------------------


def _drain(fifo: Path, got: list) -> None:
    with open(fifo, "rb") as f:
        got.append(f.read())


def test_4_atomic_output_keeps_links_fifos_and_devices(tmp_path):
    import stat as st_

    from slowcard.outfile import atomic_output

    real = tmp_path / "real.json"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with atomic_output(link) as f:
        f.write(b"new")
    assert link.is_symlink() and real.read_text() == "new" and st_.S_IMODE(real.stat().st_mode) == 0o640

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=_drain, args=(fifo, got))
    reader.start()
    with atomic_output(fifo) as f:
        f.write(b"streamed")
    reader.join(10)
    assert got == [b"streamed"] and st_.S_ISFIFO(os.lstat(fifo).st_mode)

    with atomic_output("/dev/null") as f:
        f.write(b"x")
    assert st_.S_ISCHR(os.lstat("/dev/null").st_mode)

    with pytest.raises(RuntimeError):
        with atomic_output(real) as f:
            f.write(b"half")
            raise RuntimeError("writer failed")
    assert real.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "pipe", "real.json"]


def test_4_annotate_out_to_a_fifo_streams_into_it(tmp_path, run4):
    _, paths = run4
    db = tmp_path / "a.duckdb"
    assert _cli("ingest", *paths, "--db", db, "--run", "r", "-q").returncode == 0
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=_drain, args=(fifo, got))
    reader.start()
    res = _cli("annotate", "--db", db, "--out", fifo, timeout=120)
    reader.join(30)
    assert res.returncode == 0, res.stderr
    import json

    assert json.loads(got[0])["traceEvents"]
    assert os.path.exists(fifo) and not os.path.isfile(fifo)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []


# --- 2: an over-long CSV row is a counted drop, not a silent loss --------------------------------

_KD_HEADER = (
    "Step Id,Model ID,Task ID,Stream ID,Name,Type,OP State,Accelerator Core,Start Time(us),"
    "Duration(us),Wait Time(us),Block Dim\n"
)


def test_2_csv_row_over_the_line_limit_is_dropped_with_its_line(tmp_path):
    f = tmp_path / "kernel_details.csv"
    rows = [
        f"1,0,{i},1,{'X' * (3 << 20) if i == 2 else f'op{i}'},MatMul,dynamic,AI_CORE,{1000 + i * 10},5,0,8\n"
        for i in range(5)
    ]
    f.write_text(_KD_HEADER + "".join(rows))
    db = tmp_path / "c.duckdb"
    res = _cli("ingest", f, "--db", db, "-q")
    assert res.returncode == 1 and "line too long" in res.stderr and "line 4" in res.stderr, res.stderr
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT status, rows_seen, rows_kept, rows_dropped FROM sources").fetchone() == (
        "salvaged",
        5,
        4,
        1,
    )
    assert con.execute("SELECT n_rows, position FROM source_drops").fetchall() == [(1, "line 4")]
    assert [r[0] for r in con.execute("SELECT line_no FROM op_rows ORDER BY 1").fetchall()] == [2, 3, 5, 6]
    con.close()


# --- 14: values of the wrong JSON type are not read as numbers ----------------------------------


def test_14_boolean_rank_and_times_are_not_numbers(tmp_path):
    f = tmp_path / "t.json"
    f.write_text(
        '{"distributedInfo": {"rank": true, "world_size": true}, "traceEvents": ['
        '{"ph":"X","name":"a","ts":true,"dur":2,"pid":1,"tid":1},'
        '{"ph":"X","name":"b","ts":5,"dur":false,"pid":1,"tid":1},'
        '{"ph":"X","name":"c","ts":7,"dur":1,"pid":1,"tid":1}]}'
    )
    db = tmp_path / "t.duckdb"
    res = _cli("ingest", f, "--db", db, "-q")
    assert res.returncode == 1 and "ts is not a number" in res.stderr and "dur is not a finite number" in res.stderr
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT rank, world_size, rows_kept, rows_dropped FROM sources").fetchone() == (None, None, 1, 2)
    assert con.execute("SELECT name, ts_ns, dur_ns FROM event_rows").fetchall() == [("c", 7000, 1000)]
    con.close()


# --- 12: a query is one statement and leaves nothing behind -------------------------------------

_USER_QUERY = """-- name: {name}
-- version: 1
-- description: a user query
-- requires: events
-- verdict: warn if rows > 0
-- summary: rank {{rank}}
{body}
"""


def _user_query(folder: Path, name: str, body: str):
    from slowcard import queries

    folder.mkdir(exist_ok=True)
    p = folder / f"{name}.sql"
    p.write_text(_USER_QUERY.format(name=name, body=body))
    return queries.parse_query(p)


def test_12_several_statements_are_refused_and_temp_objects_do_not_survive(tmp_path, run4):
    from slowcard import queries

    _, paths = run4
    db = tmp_path / "q.duckdb"
    assert _cli("ingest", *paths, "--db", db, "--run", "r", "-q").returncode == 0
    user = tmp_path / "mine"
    multi = _user_query(
        user,
        "two-statements",
        "CREATE TEMP TABLE moe_layer_facts AS SELECT * FROM moe_layer_facts WHERE false;\n"
        "SELECT rank FROM events WHERE run = $run LIMIT 0",
    )
    shadow = _user_query(
        user, "shadow", "CREATE TEMP TABLE moe_layer_facts AS SELECT * FROM moe_layer_facts WHERE false AND $run = ''"
    )
    macro = _user_query(user, "macro", "CREATE TEMP MACRO slow_rank() AS 1 + length($run)")
    builtin = queries.find(queries.load_catalog(None), "ep-slow-rank")
    con = queries.open_readonly(db)
    try:
        before = queries.run_query(con, builtin, "r")
        res = queries.run_query(con, multi, "r")
        assert res.status == "ERROR" and "2 SQL statements" in res.summary
        queries.run_query(con, shadow, "r")
        queries.run_query(con, macro, "r")
        after = queries.run_query(con, builtin, "r")
        assert (after.status, after.rows) == (before.status, before.rows) and after.status != "SKIP"
        assert not con.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary").fetchone()[0]
        assert not con.execute("SELECT count(*) FROM duckdb_functions() WHERE function_name = 'slow_rank'").fetchone()[
            0
        ]
    finally:
        con.close()


# --- 17: a query on one run reads that run only -----------------------------------------------


def test_17_a_query_reads_only_its_run_and_gives_what_a_database_of_its_own_gives(tmp_path, run4):
    """The views filter on the query's run at the bottom (scoped_sources), so a query's cost follows
    its run's size: here the views a query reads hold its run and nothing else, and every built-in
    query gives one run the same answer beside another run as in a database of its own."""
    from slowcard import queries

    _, paths = run4
    both, alone = tmp_path / "both.duckdb", tmp_path / "alone.duckdb"
    assert _cli("ingest", *paths, "--db", both, "--run", "a", "-q").returncode == 0
    assert _cli("ingest", *paths[:2], "--db", both, "--run", "b", "-q").returncode == 0
    assert _cli("ingest", *paths, "--db", alone, "--run", "a", "-q").returncode == 0
    seen = _user_query(
        tmp_path / "mine",
        "runs-seen",
        "SELECT (SELECT count(DISTINCT run) FROM events) AS rank, (SELECT min(run) FROM op_classes) AS run_a,\n"
        "       (SELECT count(*) FROM sources) AS table_rows, $run AS asked,\n"
        "       (SELECT count(DISTINCT source_id) FROM events) AS files",
    )
    con = queries.open_readonly(both)
    try:
        for run, n_files in (("a", 4), ("b", 2)):
            res = queries.run_query(con, seen, run)
            assert res.status != "ERROR", res.summary
            row = res.rows[0]
            assert (row["rank"], row["run_a"], row["asked"], row["files"]) == (1, run, run, n_files)
            assert row["table_rows"] == 6  # the tables themselves are whole; only the views are scoped
        # outside a query (the duckdb shell, ad-hoc SQL) the views read every run
        assert con.execute("SELECT count(DISTINCT run) FROM events").fetchone()[0] == 2
        catalog = queries.load_catalog(None)
        con_alone = queries.open_readonly(alone)
        try:
            for q in catalog.values():
                got, want = queries.run_query(con, q, "a"), queries.run_query(con_alone, q, "a")
                assert (got.status, got.rows) == (want.status, want.rows), q.name
        finally:
            con_alone.close()
    finally:
        con.close()


# --- 8: a query stops at its time limit and on Ctrl-C ---------------------------------------------

_HEAVY = (
    "SELECT count(*) AS rank FROM range(200000) a, range(200000) b WHERE hash(a.range + b.range) = 0 AND $run <> ''"
)


def test_8_query_time_limit_and_ctrl_c(tmp_path, run4):
    import time

    _, paths = run4
    db = tmp_path / "q.duckdb"
    assert _cli("ingest", *paths, "--db", db, "--run", "r", "-q").returncode == 0
    _user_query(tmp_path / "mine", "heavy", _HEAVY)
    t0 = time.monotonic()
    res = _cli("query", "heavy", "--sql-dir", tmp_path / "mine", "--db", db, env={"SLOWCARD_QUERY_TIMEOUT": "1"})
    assert res.returncode == 1 and "stopped after 1 s (SLOWCARD_QUERY_TIMEOUT" in res.stdout, res.stdout + res.stderr
    assert time.monotonic() - t0 < 30
    # Ctrl-C while DuckDB runs the statement (the hook sends SIGINT right after it started)
    t0 = time.monotonic()
    res = _cli("query", "heavy", "--sql-dir", tmp_path / "mine", "--db", db, env={"SLOWCARD_FAULT": "query:1:INT"})
    assert res.returncode == 130 and "interrupted" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert time.monotonic() - t0 < 30


def test_8_query_memory_limit(tmp_path, run4):
    _, paths = run4
    db = tmp_path / "q.duckdb"
    assert _cli("ingest", *paths[:1], "--db", db, "--run", "r", "-q").returncode == 0
    _user_query(
        tmp_path / "mine",
        "greedy",
        "SELECT length(string_agg(repeat('x', 1000), ',')) AS rank FROM range(2000000) WHERE $run <> ''",
    )
    res = _cli("query", "greedy", "--sql-dir", tmp_path / "mine", "--db", db, env={"SLOWCARD_QUERY_MEMORY": "64MB"})
    assert res.returncode == 1 and "ERROR" in res.stdout and "memory" in res.stdout.lower(), res.stdout + res.stderr
    bad = _cli("query", "--db", db, env={"SLOWCARD_QUERY_MEMORY": "lots"})
    assert bad.returncode == 2 and "SLOWCARD_QUERY_MEMORY" in bad.stderr and "Traceback" not in bad.stderr


# --- 11: temp space of a killed process is cleaned at the next start ----------------------------


def test_11_temp_folders_of_a_killed_ingest_are_removed_at_the_next_start(tmp_path, run4):
    import glob

    from slowcard import tempspace

    _, paths = run4
    db = tmp_path / "t.duckdb"
    # the part folders in a folder of this test's own (SLOWCARD_TMP_DIR): in /dev/shm any other
    # slowcard starting meanwhile (a parallel test worker) may clean the dead ingest's folder first
    parts = tmp_path / "parts"
    parts.mkdir()
    env = {**os.environ, "SLOWCARD_TMP_DIR": str(parts)}
    proc = subprocess.Popen(
        CLI + ["ingest", str(paths[0]), "--db", str(db), "-q"],
        env={**env, "SLOWCARD_FAULT": "parts:1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert proc.wait(120) == -9
    left = glob.glob(f"{parts}/slowcard-part-*-{proc.pid}-*")
    assert left, "the kill did not land while the part folder existed"
    # a stale folder of a dead process beside the database (a killed Dask ingest's staging)
    # (its owner file names it, unlocked: the lock died with the process; issue 31)
    stale = tmp_path / f".slowcard-dask-{tempspace._host()}-{proc.pid}-abc123"
    stale.mkdir()
    (stale / tempspace.OWNER_FILE).write_text(f"slowcard temp folder abc123\npid {proc.pid}\n")
    (stale / "part.parquet").write_bytes(b"x" * 1000)
    # ... and a folder of a live process, which must stay
    live = tempspace.make_dir("part", tmp_path)
    assert _cli("ingest", paths[1], "--db", db, "-q", env=env).returncode == 0
    assert not [p for p in left if os.path.exists(p)] and not stale.exists()
    assert live.exists()
    import shutil

    shutil.rmtree(live)  # (holds its owner file)


# --- 6: resources stay bounded -------------------------------------------------------------------


def test_6_huge_world_size_is_reported_without_building_every_rank(tmp_path):
    import resource

    f = tmp_path / "t.json"
    f.write_text('{"distributedInfo": {"rank": 3, "world_size": 1000000000}, ' + _ONE_EVENT)
    res = _cli(
        "ingest",
        f,
        "--db",
        tmp_path / "w.duckdb",
        "-q",
        timeout=60,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)),
    )
    assert res.returncode == 0, res.stderr
    assert "world_size is 1000000000 but 999999999 ranks are missing (0, 1, 2, 4, 5" in res.stderr


_MAXRSS = PEAK_RSS_CHILD  # peak RSS of the child itself (conftest)


def _bomb(path: Path, filler: bytes, inside_string: bool, mb: int = 256) -> None:
    import gzip

    ev = b'{"ph":"X","name":"a","ts":1,"dur":2,"pid":1,"tid":1}'
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b'{"traceEvents":[' + ev + b"," + (b'{"ph":"X","name":"' if inside_string else b""))
        chunk = filler * (1 << 20)
        for _ in range(mb):
            f.write(chunk)
        f.write((b'","ts":3,"dur":1,"pid":1,"tid":1},' if inside_string else b"") + ev + b"]}")


@pytest.mark.parametrize("filler,inside_string", [(b" ", False), (b"A", True)])
def test_6_gzip_bombs_stay_bounded_and_say_where_they_stopped(tmp_path, filler, inside_string):
    f = tmp_path / "bomb.json.gz"
    _bomb(f, filler, inside_string)
    assert f.stat().st_size < 2 << 20
    res = subprocess.run(
        [sys.executable, "-c", _MAXRSS, "ingest", str(f), "--db", str(tmp_path / "b.duckdb"), "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SLOWCARD_MAX_EVENT_MB": "32"},
    )
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "no event boundary within 32 MB" in res.stderr and "SLOWCARD_MAX_EVENT_MB" in res.stderr
    assert "slowcard-part" not in res.stderr  # no internal temp file named
    rss_mb = int(res.stderr.split("maxrss_kb=")[1].split()[0]) / 1024
    assert rss_mb < 1024, rss_mb
    state = _state(tmp_path / "b.duckdb")
    assert [v[0] for v in state.values()] == ["truncated"]


# --- 15: messages that say what the file is and what to do ----------------------------------------


@pytest.mark.parametrize(
    "kind,phrase",
    [
        ("bz2", "bzip2-compressed"),
        ("xz", "xz-compressed"),
        ("zlib", "raw zlib data"),
        ("utf16", "UTF-16 text"),
        ("utf16le", "UTF-16 text"),
    ],
)
def test_15_unknown_format_says_what_the_file_really_is(tmp_path, kind, phrase):
    import bz2
    import lzma
    import zlib

    text = "{" + _ONE_EVENT
    data = {
        "bz2": lambda: bz2.compress(text.encode()),
        "xz": lambda: lzma.compress(text.encode()),
        "zlib": lambda: zlib.compress(text.encode()),
        "utf16": lambda: text.encode("utf-16"),
        "utf16le": lambda: text.encode("utf-16-le"),
    }[kind]()
    f = tmp_path / ("t.json" if kind.startswith("utf") else "t.json.gz")
    f.write_bytes(data)
    res = _cli("ingest", f, "--db", tmp_path / "u.duckdb", "-q")
    assert res.returncode == 1 and phrase in res.stderr and str(f) in res.stderr, res.stderr


@pytest.mark.parametrize(
    "args", [["{tmp}/missing.json"], ["{file}", "--rank-pattern", "("], ["{file}", "--rank-map", "{tmp}/missing.csv"]]
)
def test_15_usage_error_creates_no_database(tmp_path, run4, args):
    db = tmp_path / "new.duckdb"
    res = _cli("ingest", *[a.format(tmp=tmp_path, file=run4[1][0]) for a in args], "--db", db)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert not db.exists()


# --- 16: names cannot drive the terminal or a spreadsheet -----------------------------------------


def test_16_control_characters_in_names_are_escaped_in_every_output(tmp_path):
    folder = tmp_path / "run\x1b[31mred"
    folder.mkdir()
    evil = "a\x1b]0;pwned\x07\nforged row ok\u202e\x9b2K.json"
    (folder / evil).write_text('{"distributedInfo": {"rank": 0}, ' + _ONE_EVENT)
    db = tmp_path / "e.duckdb"
    res = _cli("ingest", folder, "--db", db)
    for out in (res.stdout, res.stderr):
        assert not any(c in out for c in "\x1b\x07\x9b\u202e"), repr(out)
    rows = [line for line in res.stdout.splitlines() if "json" in line]
    assert len(rows) == 1 and "\\u001b]0;pwned\\u0007\\u000aforged row" in rows[0]
    q = _cli("query", "--db", db, "--all-runs")
    # (click itself strips colour sequences when stdout is not a terminal; the rest is escaped)
    assert "\x1b" not in q.stdout + q.stderr and "[run run" in q.stdout


def test_16_csv_cells_that_a_spreadsheet_would_run_are_quoted_as_text(tmp_path, run4):
    import csv
    import io

    _, paths = run4
    db = tmp_path / "c.duckdb"
    assert _cli("ingest", paths[0], "--db", db, "--run", "=cmd|'/c calc'!A1", "-q").returncode == 0
    _user_query(
        tmp_path / "mine",
        "cells",
        "SELECT '=HYPERLINK(\"http://x\")' AS rank, '@SUM(A1)' AS a, '-2.5' AS b, -3 AS c, '+x' AS d WHERE $run <> ''",
    )
    res = _cli("query", "cells", "--sql-dir", tmp_path / "mine", "--db", db, "-f", "csv")
    rows = list(csv.reader(io.StringIO(res.stdout)))
    assert rows[1][2] == "'=cmd|'/c calc'!A1"
    assert rows[1][4:] == ['\'=HYPERLINK("http://x")', "'@SUM(A1)", "-2.5", "-3", "'+x"]


# --- 8: Ctrl-C during an ingest -------------------------------------------------------------------


@pytest.fixture(scope="module")
def piped_run(tmp_path_factory):
    """Two ranks of ~9 MB: each file goes to DuckDB in several parts through named pipes."""
    d = tmp_path_factory.mktemp("piped")
    paths = synth_kineto.write_ep_run(d, ranks=2, steps=2, layers=2, gz=False, events_per_rank=20000)
    assert all(p.stat().st_size > 8 << 20 for p in paths)
    return d, paths


@pytest.mark.parametrize(
    "point,jobs", [("feed:1:INT", 1), ("feed:2:INT", 2), ("committed:1:INT", 2), ("pending:2:INT", 1)]
)
def test_8_ctrl_c_during_ingest_is_one_line_exit_130_and_keeps_the_database_whole(tmp_path, piped_run, point, jobs):
    import time

    folder, paths = piped_run
    db = tmp_path / "i.duckdb"
    t0 = time.monotonic()
    res = _cli(
        "ingest", folder, "--db", db, "--run", "r", "--jobs", jobs, "-q", env={"SLOWCARD_FAULT": point}, timeout=120
    )
    assert res.returncode == 130, (res.returncode, res.stderr)
    assert res.stderr.strip().splitlines() == ["interrupted (Ctrl-C); what was committed before it is kept"]
    assert time.monotonic() - t0 < 60
    before = _state(db)
    lo, hi = {"feed:1:INT": (0, 0), "feed:2:INT": (0, 1), "committed:1:INT": (1, 2), "pending:2:INT": (1, 1)}[point]
    assert lo <= len(before) <= hi, before
    for _path, (st, kept, visible) in before.items():
        assert st == "ok" and kept == visible
    again = _cli("ingest", folder, "--db", db, "--run", "r", "--jobs", jobs, "-q")
    assert again.returncode == 0, again.stderr
    assert sorted(_state(db)) == sorted(str(p.resolve()) for p in paths)
