"""Crashes, locks and full disks: the database stays whole and holds exactly what committed."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_kineto  # noqa: E402

from slowcard import store  # noqa: E402
from slowcard.errors import DatabaseBusy  # noqa: E402

CLI = [sys.executable, "-m", "slowcard"]


@pytest.fixture(scope="module")
def many_files(tmp_path_factory):
    """A generated 8-rank run: 8 files, each a few hundred KB."""
    d = tmp_path_factory.mktemp("run8")
    paths = synth_kineto.write_ep_run(d, ranks=8, steps=6, layers=6, gz=False)
    return d, paths


def _committed(db: Path) -> dict[str, tuple[int, int]]:
    """path -> (rows_kept in sources, rows actually visible in events)."""
    con = store.open_db(db)
    try:
        return {
            p: (kept, n)
            for p, kept, n in con.execute(
                """SELECT s.path, s.rows_kept, (SELECT count(*) FROM events e WHERE e.source_id = s.source_id)
               FROM sources s"""
            ).fetchall()
        }
    finally:
        con.close()


# Kill points (store.fault_point, SLOWCARD_FAULT=NAME:N): the Nth time the ingest reaches NAME it
# SIGKILLs itself, so each kill lands exactly where the test means it to, never after a guessed
# sleep. (point, n, files committed when it dies): "pending" is before a file's rows are written,
# "commit" inside its commit transaction, "committed" just after the commit.
KILL_POINTS = [("pending", 1, 0), ("pending", 4, 3), ("commit", 2, 1), ("committed", 5, 5), ("commit", 8, 7)]


def test_kill_9_mid_ingest_keeps_exactly_the_committed_files(tmp_path, many_files):
    folder, paths = many_files
    db = tmp_path / "k.duckdb"
    for point, n, committed in KILL_POINTS:
        if db.exists():
            db.unlink()
        env = {**os.environ, "SLOWCARD_FAULT": f"{point}:{n}"}
        # one file at a time, so that the kill point says how many files were committed (files at
        # once, killed at known points: test_hostile.py's --jobs 2 test)
        proc = subprocess.run(
            CLI + ["ingest", str(folder), "--db", str(db), "--run", "r", "-q", "--jobs", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == -signal.SIGKILL, (point, n, proc.returncode, proc.stderr)
        state = _committed(db)  # opens: WAL replayed, pending rows of the dead ingest removed
        assert len(state) == committed, (point, n, sorted(state))
        for path, (kept, visible) in state.items():
            assert kept == visible and kept > 0, f"{point}:{n}: {path} has {visible} rows visible, {kept} committed"
        con = duckdb.connect(str(db))
        orphans = con.execute(
            "SELECT count(*) FROM event_rows WHERE source_id NOT IN (SELECT source_id FROM sources)"
        ).fetchone()[0]
        con.close()
        assert orphans == 0, (point, n)
        # Re-running the same ingest completes the rest, without duplicates.
        done = subprocess.run(
            CLI + ["ingest", str(folder), "--db", str(db), "--run", "r", "-q"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        state = _committed(db)
        assert sorted(state) == sorted(str(p.resolve()) for p in paths)
        assert all(kept == visible and kept > 0 for kept, visible in state.values())
        con = store.open_db(db)
        assert con.execute("SELECT count(*) FROM sources WHERE run = 'r'").fetchone()[0] == len(paths)
        con.close()


HOLD = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _hold_lock(db: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(db), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_writer_waits_then_fails_clearly(tmp_path, many_files):
    folder, paths = many_files
    db = tmp_path / "busy.duckdb"
    store.open_db(db).close()
    holder = _hold_lock(db, 30)
    try:
        env = {**os.environ, "SLOWCARD_LOCK_WAIT": "1"}
        t0 = time.monotonic()
        res = subprocess.run(
            CLI + ["ingest", str(paths[0]), "--db", str(db)], capture_output=True, text=True, env=env, timeout=120
        )
        waited = time.monotonic() - t0
        assert res.returncode == 2
        assert "locked by another process" in res.stderr and str(db) in res.stderr
        assert "Traceback" not in res.stderr
        assert waited >= 1.0
        q = subprocess.run(
            CLI + ["query", "ep-slow-rank", "--db", str(db)], capture_output=True, text=True, env=env, timeout=120
        )
        assert q.returncode == 2 and "locked by another process" in q.stderr
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # The lock is gone: the same ingest now works and the database is intact.
    res = subprocess.run(CLI + ["ingest", str(paths[0]), "--db", str(db), "-q"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_writer_that_frees_the_lock_in_time_is_waited_for(tmp_path, many_files):
    _, paths = many_files
    db = tmp_path / "wait.duckdb"
    store.open_db(db).close()
    holder = _hold_lock(db, 1.5)
    try:
        t0 = time.monotonic()
        con = store.connect(db, wait_s=30)
        waited = time.monotonic() - t0
        # it got the database only once the holder had let go: the holder has exited by now
        # (the lock goes with its process), and the connect waited for it rather than failing
        assert holder.wait(timeout=10) == 0
        assert waited >= 1.0, waited
        assert con.execute("SELECT count(*) FROM sources").fetchone()[0] == 0
        con.close()
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
        holder.stdout.close()
    with pytest.raises(DatabaseBusy):
        h2 = _hold_lock(db, 10)
        try:
            store.connect(db, wait_s=0.5)
        finally:
            h2.kill()
            h2.wait()
            h2.stdout.close()


def _limit_file_size(limit: int):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_disk_full_gives_a_clear_message_and_keeps_the_database(tmp_path, many_files):
    _, paths = many_files
    # The next files must not fit in the room the limit leaves, WAL included (the WAL is a file of
    # its own under the same limit: new rows that fit there are durable, and an ingest that wrote
    # them is a success): an 8-rank run about 3x the first database's size.
    folder = tmp_path / "big"
    synth_kineto.write_ep_run(folder, ranks=8, steps=18, layers=6, gz=False)
    db = tmp_path / "full.duckdb"
    first = subprocess.run(
        CLI + ["ingest", str(paths[0]), "--db", str(db), "--run", "r", "-q"], capture_output=True, text=True
    )
    assert first.returncode == 0, first.stderr
    before = _committed(db)
    size = db.stat().st_size
    # Allow the file to grow only a little: the next files cannot be written.
    res = subprocess.run(
        CLI + ["ingest", str(folder), "--db", str(db), "--run", "r", "-q"],
        capture_output=True,
        text=True,
        preexec_fn=_limit_file_size(size + (64 << 10)),
        timeout=300,
    )
    assert res.returncode in (1, 2)
    assert "Traceback" not in res.stderr
    assert res.stderr.strip(), "a full disk must be reported"
    after = _committed(db)
    for path, counts in before.items():
        assert after.get(path) == counts
    for _path, (kept, visible) in after.items():
        assert kept == visible
