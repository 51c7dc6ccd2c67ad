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

from slowcard import store  # noqa: E402

CLI = [sys.executable, "-m", "slowcard"]


def _cli(*args, env=None, timeout=300, **kw):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def run4(tmp_path_factory):
    d = tmp_path_factory.mktemp("run4")
    paths = synth_kineto.write_ep_run(d, ranks=4, steps=2, layers=2, gz=False)
    return d, paths


def _state(db: Path) -> dict[str, tuple[str, int, int]]:
    """path -> (status, rows_kept in sources, rows visible in events)."""
    con = store.open_db(db)
    try:
        return {p: (st, kept, n) for p, st, kept, n in con.execute(
            """SELECT s.path, s.status, s.rows_kept,
                      (SELECT count(*) FROM events e WHERE e.source_id = s.source_id)
               FROM sources s""").fetchall()}
    finally:
        con.close()


# --- 1: source ids never collide ----------------------------------------------------------------

def test_1_source_ids_are_unique_across_threads_when_the_sequence_is_behind(tmp_path):
    db = tmp_path / "ids.duckdb"
    con = store.open_db(db)
    # After a crash the sequence can be behind the ids in use: max()+1 is what protects them.
    con.execute("INSERT INTO sources (source_id, run, path, status) "
                "SELECT i, 'r', 'p' || i, 'ok' FROM range(1, 51) t(i)")
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
    store.discard_source(con, sid)          # a failing file's cleanup holding a colliding id
    assert con.execute("SELECT count(*) FROM events WHERE source_id = ?", [sid]).fetchone()[0] == kept
    con.close()


@pytest.mark.parametrize("point", ["committed:1", "commit:2", "pending:3", "committed:3"])
def test_1_jobs2_killed_at_a_known_point_then_rerun_keeps_every_committed_row(tmp_path, run4, point):
    folder, paths = run4
    db = tmp_path / "k.duckdb"
    killed = _cli("ingest", folder, "--db", db, "--run", "r", "--jobs", "2", "-q",
                  env={"SLOWCARD_FAULT": point})
    assert killed.returncode == -9, f"the kill at {point} did not land: {killed.returncode} {killed.stderr}"
    name, n = point.split(":")
    n = int(n)
    before = _state(db)
    committed_min = {"committed": n, "commit": n - 1, "pending": n - 2}[name]
    assert committed_min <= len(before) < len(paths), (point, before)
    for path, (_st, kept, visible) in before.items():
        assert kept == visible, (point, path)
    for _ in range(2):                     # the re-run, and one more on a database that is whole
        again = _cli("ingest", folder, "--db", db, "--run", "r", "--jobs", "2", "-q")
        assert again.returncode == 0, again.stderr
        after = _state(db)
        assert sorted(after) == sorted(str(p.resolve()) for p in paths)
        for path, (st, kept, visible) in after.items():
            assert st == "ok" and kept == visible and kept > 0, (point, path, st, kept, visible)
    con = duckdb.connect(str(db))
    assert con.execute("SELECT count(*) FROM event_rows WHERE source_id NOT IN "
                       "(SELECT source_id FROM sources)").fetchone()[0] == 0
    con.close()


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
