"""Small traces ingested in batches (slowcard/ingest/_shared.py): the parts of all files of a
batch, plain or compressed, go into ONE INSERT and their derived rows are written by one statement
per table, and the database is the one that ingesting the files one at a time (--jobs 1) gives:
same rows per file, same derived rows, same per-file results and verdict; a statement DuckDB
rejects, a file that is not a trace, a compressed trace cut short and a trace read another way all
still come out the same."""

from __future__ import annotations

import gzip
import random
import threading
import time
from pathlib import Path

import duckdb
import pytest
import synth_kineto
from conftest import trace_text, write_trace

from slowcard import store
from slowcard.ingest import _shared, chrome_parts, ingest_paths
from slowcard.ingest.base import IngestOptions
from slowcard.ingest.chrome_pipes import _gz_content_size
from slowcard.queries import load_catalog, run_query


def _snapshot(db) -> dict:
    """Everything a file's ingest leaves, by path (source ids differ between databases)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        files = con.execute(
            "SELECT path, format, rank, status, rows_seen, rows_kept, rows_dropped, message, base_time_ns "
            "FROM sources ORDER BY path"
        ).fetchall()
        # per file of each row table: how many rows and a checksum of their columns
        rows = {
            table: con.execute(
                f"SELECT s.path, count(*), sum(hash({cols})) FROM {table} x JOIN sources s USING (source_id) "
                "GROUP BY ALL ORDER BY 1"
            ).fetchall()
            for table, cols in (
                ("event_rows", "x.ph, x.cat, x.name, x.pid, x.tid, x.ts_ns, x.dur_ns, x.id, x.args"),
                ("op_class_rows", "x.name, x.ts_ns, x.op_class, x.coll_kind, x.pattern, x.launch_ns"),
                ("a2a_split_rows", "x.ts_ns, x.recv_tokens"),
            )
        }
        drops = con.execute(
            "SELECT s.path, d.reason, d.position, d.n_rows FROM source_drops d JOIN sources s USING (source_id) "
            "ORDER BY ALL"
        ).fetchall()
        left = con.execute("SELECT count(*) FROM pending_sources").fetchone()[0]
        return {"files": files, **rows, "drops": drops, "left": left}
    finally:
        con.close()


class _Spy:
    """Counts what the batch meeting points did: statements over how many files, and which failed."""

    def __init__(self, monkeypatch):
        self.inserts: list[tuple[int, bool]] = []  # (files in the statement, inserted)
        self.commits: list[int] = []
        lock = threading.Lock()
        real_insert, real_commit = _shared._insert_statement, _shared._commit_all

        def insert_statement(con, tmpdir, mode, group):
            got = real_insert(con, tmpdir, mode, group)
            with lock:
                self.inserts.append((len(group), bool(got)))
            return got

        def commit_all(arrivals):
            got = real_commit(arrivals)
            with lock:
                self.commits.append(len(arrivals))
            return got

        monkeypatch.setattr(_shared, "_insert_statement", insert_statement)
        monkeypatch.setattr(_shared, "_commit_all", commit_all)


def _both(tmp_path, paths, monkeypatch, **kwargs):
    """Ingest the same files batched (the default) and one at a time (--jobs 1)."""
    spy = _Spy(monkeypatch)
    out = {}
    for name, jobs in (("batched", None), ("serial", 1)):
        db = tmp_path / f"{name}.duckdb"
        rep = ingest_paths(db, [str(p) for p in paths], run="r", jobs=jobs, **kwargs)
        out[name] = (rep, db)
    return out, spy


@pytest.mark.parametrize("gz", [False, True], ids=["json", "json.gz"])
def test_a_batch_of_rank_traces_gives_the_database_of_one_file_at_a_time(tmp_path, monkeypatch, gz):
    folder = tmp_path / "run"
    paths = synth_kineto.write_ep_run(
        folder, ranks=4, steps=4, layers=4, scenario="token_skew", slow_rank=2, gz=gz, events_per_rank=3000
    )
    assert all(str(p).endswith(".json.gz" if gz else ".json") for p in paths)
    out, spy = _both(tmp_path, paths, monkeypatch)
    # the batch went in as one statement over the 4 files and one commit of the 4
    assert spy.inserts == [(4, True)] and spy.commits == [4]
    (batched, db_b), (serial, db_s) = out["batched"], out["serial"]
    assert [f.path for f in batched.files] == [str(p) for p in paths]  # reports in the order given
    assert [(f.status, f.rows_kept) for f in batched.files] == [(f.status, f.rows_kept) for f in serial.files]
    snap_b, snap_s = _snapshot(db_b), _snapshot(db_s)
    assert snap_b == snap_s
    assert snap_b["left"] == 0 and len(snap_b["event_rows"]) == 4 and all(n > 0 for _, n, _ in snap_b["op_class_rows"])
    verdicts = []
    for db in (db_b, db_s):
        con = store.open_db(db, read_only=True)
        try:
            res = run_query(con, load_catalog()["ep-slow-rank"], run="r")
            verdicts.append((res.status, [(r.get("rank"), r.get("cause")) for r in res.rows if r.get("level")]))
        finally:
            con.close()
    assert verdicts[0] == verdicts[1] and verdicts[0][0] == "FAIL" and (2, "token-skew") in verdicts[0][1]


def _events(n: int, offset: float = 0.0) -> list[dict]:
    return [
        {"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": 1, "ts": offset + i * 2.5, "dur": 1.5}
        for i in range(n)
    ]


def test_a_statement_duckdb_rejects_is_redone_file_by_file_with_the_same_salvage(tmp_path, monkeypatch):
    """One file of three has a bad event in the middle of a part: DuckDB rejects the batch's one
    statement, nothing of it stays, and every file goes alone: the good ones whole, the bad one
    salvaged exactly as --jobs 1 salvages it."""
    folder = tmp_path / "run"
    for r in range(3):
        text = trace_text(_events(4000, offset=r * 0.25), {"schemaVersion": 1, "distributedInfo": {"rank": r}})
        if r == 1:
            text = text.replace('"ts": 2500.25, "dur": 1.5', '"ts": 2500.25, "dur": "1.5x"', 1)
            assert '"1.5x"' in text
        write_trace(folder / f"rank{r}.json", text=text)
    opts = IngestOptions(part_bytes=64 << 10)
    out, spy = _both(tmp_path, sorted(folder.glob("*.json")), monkeypatch, options=opts)
    assert spy.inserts == [(3, False)] and spy.commits == [3]
    batched, serial = out["batched"][0], out["serial"][0]
    assert [(f.status, f.rows_kept, f.rows_dropped) for f in batched.files] == [
        ("ok", 4000, 0),
        ("salvaged", 3999, 1),
        ("ok", 4000, 0),
    ]
    assert [(f.status, f.rows_kept, f.message) for f in batched.files] == [
        (f.status, f.rows_kept, f.message) for f in serial.files
    ]
    assert _snapshot(out["batched"][1]) == _snapshot(out["serial"][1])


@pytest.mark.parametrize("bad", ["rank1.json", "rank2.json.gz"])
def test_a_compressed_member_rejected_or_cut_short_goes_alone_with_the_same_salvage(tmp_path, monkeypatch, bad):
    """A batch of plain and compressed traces where one has a bad event (DuckDB rejects the one
    statement: every file goes alone, the bad one salvaged as --jobs 1 salvages it), and a
    compressed trace cut short (its producer stops at the damage: what decompressed goes in)."""
    folder = tmp_path / "run"
    for r, suffix in enumerate([".json", ".json", ".json.gz", ".json.gz"]):
        text = trace_text(_events(4000, offset=r * 0.25), {"schemaVersion": 1, "distributedInfo": {"rank": r}})
        if f"rank{r}{suffix}" == bad:
            text = text.replace(f'"ts": {2500 + r * 0.25}, "dur": 1.5', f'"ts": {2500 + r * 0.25}, "dur": "1.5x"', 1)
            assert '"1.5x"' in text
        write_trace(folder / f"rank{r}{suffix}", text=text)
    whole = gzip.compress(trace_text(_events(3000, offset=0.75), {"schemaVersion": 1}).encode())
    (folder / "rank4.json.gz").write_bytes(whole[: len(whole) * 2 // 3])  # cut short
    opts = IngestOptions(part_bytes=64 << 10)
    out, spy = _both(tmp_path, sorted(folder.iterdir()), monkeypatch, options=opts)
    assert spy.inserts == [(5, False)] and spy.commits == [5]
    batched, serial = out["batched"][0], out["serial"][0]
    got = {f.path.rsplit("/", 1)[1]: (f.status, f.rows_kept, f.rows_dropped) for f in batched.files}
    assert got[bad] == ("salvaged", 3999, 1)
    assert got["rank4.json.gz"][0] == "truncated" and 0 < got["rank4.json.gz"][1] < 3000
    assert all(v == ("ok", 4000, 0) for k, v in got.items() if k not in (bad, "rank4.json.gz"))
    assert [(f.status, f.rows_kept, f.message) for f in batched.files] == [
        (f.status, f.rows_kept, f.message) for f in serial.files
    ]
    assert _snapshot(out["batched"][1]) == _snapshot(out["serial"][1])


def test_compressed_members_share_the_statement_of_plain_ones(tmp_path, monkeypatch):
    """A cut-short compressed trace alone is not rejected: its parts join the statement of the
    plain and whole compressed traces, its tail is salvaged after it, as with --jobs 1."""
    folder = tmp_path / "run"
    write_trace(folder / "a.json", _events(3000), {"schemaVersion": 1})
    write_trace(folder / "b.json.gz", _events(2500, 0.5), {"schemaVersion": 1})
    whole = gzip.compress(trace_text(_events(3000, offset=0.75), {"schemaVersion": 1}).encode())
    (folder / "c.json.gz").write_bytes(whole[: len(whole) * 2 // 3])
    out, spy = _both(tmp_path, [folder], monkeypatch, options=IngestOptions(part_bytes=16 << 10))
    assert spy.inserts == [(3, True)] and spy.commits == [3]
    batched, serial = out["batched"][0], out["serial"][0]
    assert [(f.status, f.rows_kept, f.message) for f in batched.files] == [
        (f.status, f.rows_kept, f.message) for f in serial.files
    ]
    assert [f.status for f in batched.files] == ["ok", "ok", "truncated"]
    assert _snapshot(out["batched"][1]) == _snapshot(out["serial"][1])


def test_a_compressed_member_larger_than_its_guess_goes_in_waves(tmp_path, monkeypatch):
    """A compressed trace whose decompressed parts pass BATCH_GZ_LIMIT (its trailer's size was a
    wrong guess) stops waiting for the batch: it goes in waves, the others share the statement,
    and the database is the one of --jobs 1."""
    folder = tmp_path / "run"
    write_trace(folder / "a.json", _events(3000), {"schemaVersion": 1})
    write_trace(folder / "b.json.gz", _events(500, 0.5), {"schemaVersion": 1})
    write_trace(folder / "c.json.gz", _events(6000, 0.75), {"schemaVersion": 1})
    monkeypatch.setattr(chrome_parts, "BATCH_GZ_LIMIT", 200 << 10)  # c decompresses to ~600 KB
    out, spy = _both(tmp_path, [folder], monkeypatch, options=IngestOptions(part_bytes=32 << 10))
    assert spy.inserts == [(2, True)] and spy.commits == [3]
    batched, serial = out["batched"][0], out["serial"][0]
    assert [(f.status, f.rows_kept) for f in batched.files] == [("ok", 3000), ("ok", 500), ("ok", 6000)]
    assert [(f.status, f.rows_kept, f.message) for f in batched.files] == [
        (f.status, f.rows_kept, f.message) for f in serial.files
    ]
    assert _snapshot(out["batched"][1]) == _snapshot(out["serial"][1])


def test_a_compressed_member_failing_in_waves_stops_its_producer(tmp_path, monkeypatch):
    """A compressed member that goes in waves and fails there, while its producer is still
    cutting parts (blocked on a full queue): the producer is stopped and reaped, its parts are
    deleted, and the ingest returns with that file failed instead of hanging."""
    folder = tmp_path / "run"
    write_trace(folder / "a.json", _events(1000), {"schemaVersion": 1})
    write_trace(folder / "b.json.gz", _events(20000, 0.5), {"schemaVersion": 1})
    monkeypatch.setattr(chrome_parts, "BATCH_GZ_LIMIT", 16 << 10)

    real = chrome_parts._PartsPhase._insert_wave

    def broken(self, files):
        if self.path.name == "b.json.gz":
            time.sleep(0.5)  # meanwhile the producer fills the queue and blocks putting one more
            raise RuntimeError("boom")
        return real(self, files)

    monkeypatch.setattr(chrome_parts._PartsPhase, "_insert_wave", broken)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    got: list = []
    opts = IngestOptions(part_bytes=8 << 10, tmp_dir=scratch)
    t = threading.Thread(
        target=lambda: got.append(ingest_paths(tmp_path / "db.duckdb", [folder], run="r", options=opts))
    )
    t.start()
    t.join(120)
    assert not t.is_alive(), "the ingest hung on the member's producer"
    statuses = {f.path.rsplit("/", 1)[1]: f.status for f in got[0].files}
    assert statuses == {"a.json": "ok", "b.json.gz": "failed"}
    assert not list(scratch.iterdir())


def test_a_batch_with_other_files_among_its_traces(tmp_path, monkeypatch):
    """A folder of plain traces with, among them, a trace whose ts are strings (read another way),
    a compressed trace, an empty trace, a JSON file that is not a trace, and a trace with its time
    base after the events (rebased after the insert): nobody waits forever, the plain and the
    compressed traces share one statement, and the database is the one of --jobs 1."""
    folder = tmp_path / "run"
    write_trace(folder / "a.json", _events(3000), {"schemaVersion": 1, "baseTimeNanoseconds": 1_000_000})
    write_trace(folder / "b.json", _events(2500, 0.5), {"schemaVersion": 1}, {"baseTimeNanoseconds": 7_000_000})
    strings = [{**e, "ts": f"{e['ts']:.3f}"} for e in _events(2000)]
    write_trace(folder / "c.json", strings, {"schemaVersion": 1})
    write_trace(folder / "d.json.gz", _events(1500), {"schemaVersion": 1})
    write_trace(folder / "e.json", [], {"schemaVersion": 1})
    (folder / "f.json").write_text('{"hello": "not a trace"}')
    opts = IngestOptions(part_bytes=32 << 10)
    out, spy = _both(tmp_path, [folder], monkeypatch, options=opts)
    batched, serial = out["batched"][0], out["serial"][0]
    # a, b, d (DOUBLE ts; d decompressed into part files) and c (string ts) arrive; e has no
    # parts, f is skipped: one statement for a, b and d, one for c
    assert sorted(spy.inserts) == [(1, True), (3, True)]
    assert spy.commits == [5]  # a, b, c, d and the empty e reach their commit
    assert [(f.path, f.status, f.rows_kept) for f in batched.files] == [
        (f.path, f.status, f.rows_kept) for f in serial.files
    ]
    assert {f.path.rsplit("/", 1)[1]: f.rows_kept for f in batched.files if f.status == "ok"} == {
        "a.json": 3000,
        "b.json": 2500,
        "c.json": 2000,
        "d.json.gz": 1500,
        "e.json": 0,
    }
    snap = _snapshot(out["batched"][1])
    assert snap == _snapshot(out["serial"][1])
    con = duckdb.connect(str(out["batched"][1]), read_only=True)
    try:
        first_ts = dict(
            con.execute(
                "SELECT split_part(path, '/', -1), min(ts_ns) FROM event_rows JOIN sources USING (source_id) GROUP BY 1"
            ).fetchall()
        )
    finally:
        con.close()
    assert first_ts["a.json"] == 1_000_000 and first_ts["b.json"] == 7_000_500  # each file its own base


@pytest.mark.parametrize(
    "files, expected",
    [
        ([("a.json", 1 << 20), ("b.json", 1 << 20)], [[0, 1]]),
        ([("a.json", 1 << 20)], []),  # alone: nothing to share
        ([("a.json.gz", 1 << 20), ("b.json", 1 << 20), ("c.csv", 10), ("d.json", 1 << 20)], [[1, 3]]),
        ([("a.json", _shared.SHARED_MAX_FILE_BYTES + 1), ("b.json", 5), ("c.json", 5)], [[1, 2]]),
        ([("a.json", _shared.SHARED_MAX_FILE_BYTES), ("b.json", 5)], [[0, 1]]),  # at the limit: shared
    ],
)
def test_which_files_share_a_batch(files, expected):
    # (a.json.gz does not exist: it goes alone, its own ingest says why)
    assert _shared.plan_batches([(i, name, size) for i, (name, size) in enumerate(files)]) == expected


def test_compressed_files_count_decompressed_against_the_caps(tmp_path, monkeypatch):
    """A .json.gz file is sized by its decompressed length (its gzip trailer): against the file
    cap, the batch's byte cap and the cap on what a batch decompresses into the temp folder."""
    sizes = []
    rng = random.Random(3)
    for i, n in enumerate([4000, 4000, 4000, 9000]):
        path = tmp_path / f"r{i}.json.gz"
        # text that compresses about as much as a trace (the estimate trusts 2x-50x)
        path.write_bytes(gzip.compress(bytes(rng.choice(b"ab") for _ in range(n))))
        sizes.append((i, str(path), path.stat().st_size))
        assert _gz_content_size(path) == n
    sizes.append((4, str(tmp_path / "plain.json"), 5000))
    monkeypatch.setattr(_shared, "SHARED_MAX_FILE_BYTES", 8000)  # r3 (9,000 decompressed) goes alone
    monkeypatch.setattr(_shared, "SHARED_MAX_GZ_BYTES", 8000)  # two of 4,000 per batch
    assert _shared.plan_batches(sizes) == [[0, 1], [2, 4]]
    monkeypatch.setattr(_shared, "SHARED_MAX_GZ_BYTES", 1 << 30)
    monkeypatch.setattr(_shared, "SHARED_MAX_BATCH_BYTES", 9000)  # plain and decompressed bytes alike
    assert _shared.plan_batches(sizes) == [[0, 1], [2, 4]]
    monkeypatch.setattr(_shared, "SHARED_MAX_BATCH_BYTES", 1 << 30)
    assert _shared.plan_batches(sizes) == [[0, 1, 2, 4]]


def test_batches_stop_at_their_file_and_byte_caps():
    n = _shared.SHARED_MAX_FILES + 3
    batches = _shared.plan_batches([(i, f"r{i}.json", 10) for i in range(n)])
    assert [len(b) for b in batches] == [_shared.SHARED_MAX_FILES, 3]
    big = _shared.SHARED_MAX_FILE_BYTES
    per = _shared.SHARED_MAX_BATCH_BYTES // big  # files of the largest size one batch holds
    batches = _shared.plan_batches([(i, f"r{i}.json", big) for i in range(per + 1)])
    assert [len(b) for b in batches] == [per] and sum(len(b) for b in batches) == per  # the last one alone


def test_a_meeting_point_completes_when_the_last_member_leaves_and_stops_on_ctrl_c():
    """Two members arrive, the third leaves: the action runs once, in one arrival's thread, over
    both payloads, and both arrivals get its result. With the batch's Ctrl-C flag set, a member
    still waiting raises KeyboardInterrupt instead of waiting forever."""
    stage = _shared._Stage(3, None)
    runs: list[list] = []
    got: dict[str, object] = {}

    def member(key):
        got[key] = stage.arrive(key, key.upper(), lambda payloads: runs.append(sorted(payloads)) or "done")

    threads = [threading.Thread(target=member, args=(k,)) for k in ("a", "b")]
    for t in threads:
        t.start()
    stage.leave("c")
    for t in threads:
        t.join(10)
    assert runs == [["A", "B"]] and got == {"a": "done", "b": "done"}

    stopping = threading.Event()
    waiting = _shared._Stage(2, stopping)
    raised: list[BaseException] = []

    def lonely():
        try:
            waiting.arrive("a", 1, lambda payloads: None)
        except KeyboardInterrupt as exc:
            raised.append(exc)

    t = threading.Thread(target=lonely)
    t.start()
    stopping.set()
    t.join(10)
    assert not t.is_alive() and len(raised) == 1


def _count_commits(monkeypatch, fail_batches: bool = False) -> list[int]:
    """Files per transaction of store.commit_sources (each call is one BEGIN ... COMMIT); with
    ``fail_batches`` a transaction of several files fails as a disk-full COMMIT would."""
    sizes: list[int] = []
    lock = threading.Lock()
    real = store.commit_sources

    def counted(con, commits, derive=True):
        with lock:
            sizes.append(len(commits))
        if fail_batches and len(commits) > 1:
            raise duckdb.IOException("could not write the WAL (simulated)")
        return real(con, commits, derive)

    monkeypatch.setattr(store, "commit_sources", counted)
    return sizes


def _rank_traces(folder, n: int, bad: int | None = None) -> list:
    for r in range(n):
        if r == bad:
            (folder / f"rank{r}.json").write_text('{"schemaVersion": 1, "deviceProperties": []}')  # no events
            continue
        trailer = {"distributedInfo": {"rank": r, "world_size": n}}  # written after the events
        write_trace(folder / f"rank{r}.json", _events(2000, r * 0.25), {"schemaVersion": 1}, trailer)
    return sorted(folder.glob("*.json"))


def test_a_batch_whose_members_all_succeed_commits_in_one_transaction(tmp_path, monkeypatch):
    """Four rank traces: ONE transaction publishes all four (before: one per file), the tails'
    last events go in with the batch's statement (no small INSERT per file), every id handed
    out is used or released, and the database is the one of --jobs 1. If the batch's
    transaction fails, nothing of it stays and every file commits alone (all four still in)."""
    folder = tmp_path / "run"
    folder.mkdir()
    paths = _rank_traces(folder, 4)
    sizes = _count_commits(monkeypatch)
    small = []
    real_files = chrome_parts._PartsPhase._insert_files

    def spy_files(self, files, ts_type):  # the per-file statements (tail, waves, exact path)
        small.append((self.path.name, self.ctx.shared is not None))
        return real_files(self, files, ts_type)

    monkeypatch.setattr(chrome_parts._PartsPhase, "_insert_files", spy_files)
    out, _spy = _both(tmp_path, paths, monkeypatch)
    assert sizes == [4, 1, 1, 1, 1]  # the batch, then --jobs 1's four files
    # --jobs 1: each file's parts, then its tail's last event, in statements of its own; the
    # batch's members none (before: one for each member's tail)
    assert sorted(small) == sorted([(p.name, False) for p in paths] * 2)
    assert [(f.status, f.rank, f.rows_kept) for f in out["batched"][0].files] == [("ok", r, 2000) for r in range(4)]
    assert _snapshot(out["batched"][1]) == _snapshot(out["serial"][1])
    assert _snapshot(out["batched"][1])["left"] == 0

    monkeypatch.undo()
    failing = _count_commits(monkeypatch, fail_batches=True)
    rep = ingest_paths(tmp_path / "fallback.duckdb", [folder], run="r")
    assert failing == [4, 1, 1, 1, 1]  # the batch's transaction failed; each file alone
    assert [(f.status, f.rows_kept) for f in rep.files] == [("ok", 2000)] * 4
    snap = _snapshot(tmp_path / "fallback.duckdb")
    assert snap == _snapshot(out["serial"][1]) and snap["left"] == 0


def test_a_bad_member_leaves_alone_and_the_others_commit_together(tmp_path, monkeypatch):
    """A batch of four with one Kineto file without a traceEvents list: that file fails on its own, with the
    message --jobs 1 gives, and leaves nothing; the three others commit in one transaction; the
    rows of a run ingested before are untouched, and no pending id is left."""
    db = tmp_path / "db.duckdb"
    before_dir = tmp_path / "before"
    before_dir.mkdir()
    first = ingest_paths(db, _rank_traces(before_dir, 2), run="earlier")
    assert [f.status for f in first.files] == ["ok", "ok"]
    earlier = _snapshot(db)
    folder = tmp_path / "run"
    folder.mkdir()
    _rank_traces(folder, 4, bad=2)
    sizes = _count_commits(monkeypatch)
    rep = ingest_paths(db, [folder], run="r")
    assert sizes == [3]
    statuses = {f.path.rsplit("/", 1)[1]: f.status for f in rep.files}
    assert statuses == {"rank0.json": "ok", "rank1.json": "ok", "rank2.json": "failed", "rank3.json": "ok"}
    serial = ingest_paths(tmp_path / "serial.duckdb", [folder], run="r", jobs=1)
    assert [f.message for f in rep.files] == [f.message for f in serial.files]
    after = _snapshot(db)
    assert after["left"] == 0
    for table in ("files", "event_rows", "op_class_rows", "drops"):
        kept = [row for row in after[table] if str(row[0]).startswith(str(before_dir))]
        assert kept == [row for row in earlier[table] if str(row[0]).startswith(str(before_dir))], table
    assert sorted(p for p, *_ in after["files"] if p.startswith(str(folder))) == [
        str(folder / f"rank{r}.json") for r in (0, 1, 3)
    ]


def test_members_work_one_at_a_time_before_the_insert_and_decompress_two_at_a_time(tmp_path, monkeypatch):
    """Before the INSERT a batch lets one member at a time do its header work (with two, each call
    leaving the GIL waited for the other), and two compressed members decompress at once, holding
    no header place while they do; the batch's hashing thread stores the fingerprint
    store.fingerprint_file gives."""
    folder = tmp_path / "run"
    folder.mkdir()
    for r in range(6):
        trailer = {"distributedInfo": {"rank": r, "world_size": 6}}
        path = folder / f"rank{r}.json"
        write_trace(path, _events(1500, r * 0.25), {"schemaVersion": 1}, trailer)
        if r % 2:  # half of them compressed
            (folder / f"rank{r}.json.gz").write_bytes(gzip.compress(path.read_bytes()))
            path.unlink()
    lock = threading.Lock()
    held = {"prework": set(), "unpack": set()}
    most = {"prework": 0, "unpack": 0, "both": 0}

    def spy(kind: str, take: bool, inner):
        def wrapper(self, key):
            if not take:
                with lock:
                    held[kind].discard(key)
            inner(self, key)
            if take:
                with lock:
                    held[kind].add(key)
                    most[kind] = max(most[kind], len(held[kind]))
                    most["both"] = max(most["both"], len(held["prework"] & held["unpack"]))
                # long enough for other members to come in if they may: a decompression outlasts
                # the next compressed members' header work
                time.sleep(0.3 if kind == "unpack" else 0.02)

        return wrapper

    batch = _shared.SharedBatch
    monkeypatch.setattr(batch, "start_prework", spy("prework", True, batch.start_prework))
    monkeypatch.setattr(batch, "end_prework", spy("prework", False, batch.end_prework))
    monkeypatch.setattr(batch, "start_unpack", spy("unpack", True, batch.start_unpack))
    monkeypatch.setattr(batch, "end_unpack", spy("unpack", False, batch.end_unpack))
    spy_meetings = _Spy(monkeypatch)
    rep = ingest_paths(tmp_path / "b.duckdb", [str(folder)], run="r")
    assert [f.status for f in rep.files] == ["ok"] * 6 and spy_meetings.inserts == [(6, True)]
    assert most == {"prework": _shared.PREWORK_THREADS, "unpack": _shared.UNPACK_THREADS, "both": 0}
    assert (_shared.PREWORK_THREADS, _shared.UNPACK_THREADS) == (1, 2)
    con = duckdb.connect(str(tmp_path / "b.duckdb"), read_only=True)
    try:
        stored = dict(con.execute("SELECT path, fingerprint FROM sources").fetchall())
    finally:
        con.close()
    assert stored == {f.path: store.fingerprint_file(Path(f.path), Path(f.path).stat().st_size) for f in rep.files}
