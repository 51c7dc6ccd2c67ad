"""Files ingested together: the parts of every trace of a batch go into ONE INSERT, and the
batch's derived rows are written by one statement per table.

Why: DuckDB 1.5 pays a fixed cost per INSERT that does not fill whole row groups on every thread
(the rows go through the write-ahead log and are compressed again at checkpoint, one thread):
16 Kineto rank files of 19 MB took 4.2 s as 16 statements against 1.5 s as one statement over
the same parts (bench/README.md, "Many rank files"). A run of small rank files is the common case.

How, without changing what a file's ingest means: every file of a batch runs in its own thread
as it always does (ingest_file: detection, header, cuts, tail, trailer, commit). Two meeting
points (stages) join them:
- ``insert``: a Chrome trace whose parts are all read the same way arrives with its parts and
  waits: a plain file's as spans of the file (each goes through a named pipe), a compressed
  file's as part files, decompressed whole first (members decompress side by side, a thread
  each). Every other file leaves this stage (an ineligible file, one that failed earlier, a
  format that is not a trace). When every member has arrived or left, one arrival (the leader)
  runs ONE INSERT over every arrival's parts, each row tagged with its file's pending source id
  and time base, and hands each file its row count. If DuckDB rejects the statement nothing of
  it stays, and every arrival inserts its own parts as before (per-part fallback, salvage).
- ``commit``: each file arrives with its commit (pending source id, `sources` row, drop ledger);
  the leader classifies the batch's new names and writes the derived rows and the `sources` rows
  of all of them in ONE transaction (store.commit_sources): one WAL flush for the batch instead of
  one per file. A member that failed before it (bad input) never arrives: it has left, its own
  rows are discarded in its thread, and the others commit without it. If the one transaction
  fails, nothing of it stays and every file commits alone, deriving its own rows, as before.
Besides the stages, a batch hands out its members' pending source ids from one statement
(store.new_source_ids), sets the connection's ingest settings once, hashes its members in a
thread of its own, and lets at most PREWORK_THREADS members at a time do their per-file work
before the INSERT (detection, header, cuts): the members' threads otherwise all contend for the
GIL and the one database at once.
Rows stay under pending source ids until the batch's commit (or each file's own): a file still
appears whole or not at all, and a killed batch leaves only pending rows (cleaned at the next
open).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb

from .. import store
from ._gz import content_size as _gz_content_size
from .chrome_pipes import _piped
from .chrome_ts import SHARED_PART_COLUMNS, _shared_insert_sql

# Files larger than this go alone: their INSERT fills row groups on every thread anyway.
SHARED_MAX_FILE_BYTES = 256 << 20
SHARED_MAX_BATCH_BYTES = 2 << 30  # one statement at most this much JSON (a failure redoes it all)
# A compressed member is decompressed whole into part files (in the temp folder, /dev/shm when it
# has 1 GB free) before the statement: at most this much of a batch waits there. The plan sizes
# files by their gzip trailer (_gz.content_size); the batch counts the parts really written
# (SharedBatch.take_gz), and a file that would pass it goes alone after the batch's statement.
SHARED_MAX_GZ_BYTES = 512 << 20
SHARED_MAX_FILES = 64  # one thread per member waits at the meeting points
# Members doing their work before the INSERT at once (detection, header, cuts, the tail's scan):
# Python work under the GIL plus a few short calls that leave it. One at a time: with two, each
# call that leaves the GIL waited for the other member to give it back (up to the interpreter's
# 5 ms switch interval), and 64 members' work took as long as with one, or longer; the hashing
# (SharedBatch.fingerprint) takes the second core (bench/README "Many small rank files").
PREWORK_THREADS = 1
# Compressed members decompressing at once (their work before the INSERT leaves its prework place
# first): zlib leaves the GIL, so one per core. With one, 64 .json.gz members started their
# INSERT 0.4 s later.
UNPACK_THREADS = 2
WAIT_STEP_S = 0.1  # how often a waiting member looks at the batch's Ctrl-C flag


class _Stage:
    """A meeting point of the batch's members: each arrives (with a payload) or leaves; once all
    are accounted for, one arrival runs ``action`` over the payloads and all arrivals get its
    result (None: it failed or could not run)."""

    def __init__(self, members: int, stopping: threading.Event | None):
        self._cond = threading.Condition()
        self._members = members
        self._stopping = stopping
        self._arrived: dict[Hashable, Any] = {}
        self._left: set[Hashable] = set()
        self._started = False
        self._finished = False
        self._result: Any = None

    def _complete(self) -> bool:
        return len(self._arrived) + len(self._left) >= self._members

    def leave(self, key: Hashable) -> None:
        """This member will not arrive (idempotent; nothing once it has arrived)."""
        with self._cond:
            if key in self._arrived or key in self._left:
                return
            self._left.add(key)
            self._cond.notify_all()

    def arrive(self, key: Hashable, payload: Any, action: Callable[[list[Any]], Any]) -> Any:
        """Wait until every member has arrived or left; the first arrival to see that runs
        ``action(payloads)`` (in its own thread, on its own cursor); return its result."""
        with self._cond:
            self._arrived[key] = payload
            self._cond.notify_all()
            while not self._complete():
                self._wait()
            lead = not self._started
            self._started = True
            # the leader's own payload first: the action runs on its cursor, in its folder
            payloads = [payload] + [p for k, p in self._arrived.items() if k != key]
        if lead:
            result = None
            try:
                result = action(payloads)
            finally:
                with self._cond:
                    self._result, self._finished = result, True
                    self._cond.notify_all()
            return result
        with self._cond:
            while not self._finished:
                self._wait()
            return self._result

    def wait_done(self) -> None:
        """Wait until this stage is over: every member arrived or left, and the action (if any
        member arrived) has run. For a member that left it."""
        with self._cond:
            while not (self._complete() and (self._finished or not self._arrived)):
                self._wait()

    def _wait(self) -> None:
        self._cond.wait(WAIT_STEP_S)
        if self._stopping is not None and self._stopping.is_set():
            raise KeyboardInterrupt  # Ctrl-C: the batch stops; pending rows are discarded


class SharedBatch:
    """The meeting points of one batch of files (see the module docstring)."""

    def __init__(self, members: int, stopping: threading.Event | None = None):
        self.insert_stage = _Stage(members, stopping)
        self.commit_stage = _Stage(members, stopping)
        self._stopping = stopping
        self._members = members
        self._ids: list[int] | None = None  # the batch's pending source ids, not yet handed out
        self._ids_lock = threading.Lock()
        self._configured = False
        self._prework = threading.BoundedSemaphore(PREWORK_THREADS)
        self._in_prework: set[Hashable] = set()
        self._unpack = threading.BoundedSemaphore(UNPACK_THREADS)
        self._unpacking: set[Hashable] = set()
        self._gz_cond = threading.Condition()
        self._gz_budget = SHARED_MAX_GZ_BYTES  # for the parts of its compressed members
        self._gz_free = self._gz_budget
        self._hasher: ThreadPoolExecutor | None = None
        self._hasher_lock = threading.Lock()

    def fingerprint(self, path: Path, size: int) -> Future:
        """The file's fingerprint (store.fingerprint_file), computed in the batch's own thread while
        the members do their work before the INSERT one after the other: hashing leaves the GIL,
        so it takes the second core, where in the member's thread each file's hash lengthened
        that serial work (64 files: 0.13 s of its 0.28 s). ``close`` stops the thread."""
        with self._hasher_lock:
            if self._hasher is None:
                self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slowcard-fingerprint")
            return self._hasher.submit(store.fingerprint_file, path, size)

    def close(self) -> None:
        """The batch is over: its fingerprint thread goes (what it still hashes is not waited for)."""
        with self._hasher_lock:
            if self._hasher is not None:
                self._hasher.shutdown(wait=False, cancel_futures=True)
                self._hasher = None

    def take_gz(self, n: int) -> bool:
        """Count n bytes of a compressed member's part against the batch's temp budget (before
        the part is written); False when they do not fit (the member then goes alone)."""
        with self._gz_cond:
            if n > self._gz_free:
                return False
            self._gz_free -= n
            return True

    def give_gz(self, n: int) -> None:
        """n bytes of parts counted by take_gz are deleted."""
        with self._gz_cond:
            self._gz_free += n
            self._gz_cond.notify_all()

    def wait_for_room(self) -> None:
        """For a member that left the batch for want of room (chrome_parts._alone): wait until
        the batch's statement has run and every part of its compressed members is deleted, so
        that the member's own parts never share the temp folder with them."""
        self.insert_stage.wait_done()
        with self._gz_cond:
            while self._gz_free < self._gz_budget:
                self._gz_cond.wait(WAIT_STEP_S)
                if self._stopping is not None and self._stopping.is_set():
                    raise KeyboardInterrupt  # Ctrl-C: the batch stops

    def source_id(self, con) -> int:
        """A pending source id for a member: the batch registers ids for all its members in one
        statement the first time one asks (store.new_source_ids)."""
        with self._ids_lock:
            if self._ids is None:
                self._ids = store.new_source_ids(con, self._members)
            sid = self._ids.pop(0) if self._ids else None
        if sid is None:
            return store.new_source_id(con)  # (never: one id per member)
        store.fault_point("pending")  # as new_source_id: crash tests kill a member here
        return sid

    def release_ids(self, con) -> None:
        """Ids no member used (a file skipped or failed before it wrote rows) are unregistered."""
        with self._ids_lock:
            left, self._ids = self._ids or [], []
        store.release_source_ids(con, left)

    def configure(self) -> bool:
        """True for the first member only: it sets the connection's ingest settings (threads,
        memory limit; global to the database) for the whole batch."""
        with self._ids_lock:
            first, self._configured = not self._configured, True
            return first

    def start_prework(self, key: Hashable) -> None:
        """Wait for a place among the PREWORK_THREADS members doing their work before the INSERT;
        ``end_prework`` (idempotent) gives it back."""
        self._take(self._prework, self._in_prework, key)

    def end_prework(self, key: Hashable) -> None:
        self._give(self._prework, self._in_prework, key)

    def start_unpack(self, key: Hashable) -> None:
        """A compressed member is about to decompress its parts: it gives back its prework place
        and waits for one of the UNPACK_THREADS places; ``end_unpack`` (idempotent) gives it back."""
        self.end_prework(key)
        self._take(self._unpack, self._unpacking, key)

    def end_unpack(self, key: Hashable) -> None:
        self._give(self._unpack, self._unpacking, key)

    def _take(self, places: threading.BoundedSemaphore, holders: set[Hashable], key: Hashable) -> None:
        while not places.acquire(timeout=WAIT_STEP_S):
            if self._stopping is not None and self._stopping.is_set():
                raise KeyboardInterrupt
        with self._ids_lock:
            holders.add(key)

    def _give(self, places: threading.BoundedSemaphore, holders: set[Hashable], key: Hashable) -> None:
        with self._ids_lock:
            if key not in holders:
                return
            holders.discard(key)
        places.release()

    def leave_insert(self, key: Hashable) -> None:
        """A member is past the insert stage (arrived, or never will): its prework place is free."""
        self.end_prework(key)
        self.insert_stage.leave(key)

    def leave(self, key: Hashable) -> None:
        """A member is done (or failed) before some stage: it arrives at neither any more."""
        self.end_prework(key)
        self.end_unpack(key)
        self.insert_stage.leave(key)
        self.commit_stage.leave(key)

    def insert(self, key: Hashable, ing, fd: int, parts: list[tuple[int, int, bytes, str]]) -> int | None:
        """Arrive at the insert stage with a plain file's parts (all read the same way: ts mode
        ``parts[0][3]``); the rows of this file that the one statement inserted, or None when
        the file must insert its parts itself."""
        spans = [(fd, offset, length) for offset, length, _sep, _mode in parts]
        return self._arrive(key, ing, spans, [], parts[0][3])

    def insert_files(self, key: Hashable, ing, files: list[str], mode: str) -> int | None:
        """The same for a compressed file, decompressed into part files (each bracketed, ts read
        the ``mode`` way); the part files are the caller's to delete."""
        return self._arrive(key, ing, [], files, mode)

    def _arrive(self, key: Hashable, ing, spans: list, files: list[str], mode: str) -> int | None:
        self.end_prework(key)
        result = self.insert_stage.arrive(key, (ing, spans, files, mode), _insert_all)
        return None if result is None else result.get(ing.ctx.source_id)

    def commit(self, key: Hashable, con, commit: store.Commit) -> bool:
        """Arrive at the commit stage (a member here is past the insert stage: one whose format
        never reached it leaves it now); True when this file is committed, with the batch's
        other arrivals, in one transaction; False: it must commit alone."""
        self.leave_insert(key)
        result = self.commit_stage.arrive(key, (con, commit), _commit_all)
        return bool(result) and commit.sid in result


# An arrival at the insert stage: (the file's _Ingest, its plain parts as (fd, offset, length)
# spans of the file, its part files (a compressed file, decompressed), the ts mode of them all).
_Arrival = tuple[Any, list[tuple[int, int, int]], list[str], str]


def _insert_all(arrivals: list[_Arrival]) -> dict[int, int]:
    """The leader's INSERTs: one statement over the parts of every arrival whose ts is read the
    same way (nearly always all of them). {source id: rows} of the files inserted; a file of a
    statement DuckDB rejected is absent (nothing of that statement stays; it goes alone)."""
    lead = arrivals[0][0]
    by_mode: dict[str, list[_Arrival]] = {}
    for arrival in arrivals:
        by_mode.setdefault(arrival[3], []).append(arrival)
    rows: dict[int, int] = {}
    for mode, group in by_mode.items():
        rows.update(_insert_statement(lead.ctx.con, lead.tmpdir, mode, group))
    return rows


def _insert_statement(con, tmpdir: str, mode: str, group: list[_Arrival]) -> dict[int, int]:
    """ONE INSERT over the parts of ``group``'s files: a plain file's spans each through a named
    pipe fed by its own thread (as chrome_parts does for one file), a compressed file's part
    files read as they are; {} when DuckDB rejects it."""
    ranges, sids, bases = [], [], []
    files, file_sids, file_bases = [], [], []
    for ing, spans, part_files, _mode in group:
        for fd, offset, length in spans:
            ranges.append((fd, offset, length, ing.ctx.read_bytes))
            sids.append(ing.ctx.source_id)
            bases.append(ing.base_ns)
        files += part_files
        file_sids += [ing.ctx.source_id] * len(part_files)
        file_bases += [ing.base_ns] * len(part_files)
    with _piped(tmpdir, "shared", ranges) as pipes:
        # which file each part is of, as one JSON text (store.json_rows: 64 files' lists of
        # source ids and time bases took ~9 ms to bind as list parameters)
        parts, table = store.json_rows(
            SHARED_PART_COLUMNS, list(zip(pipes + files, sids + file_sids, bases + file_bases)), "$parts"
        )
        try:
            con.execute(_shared_insert_sql(mode, parts), {"files": pipes + files, "parts": table})
        except duckdb.InterruptException:
            raise  # Ctrl-C: the batch stops, no file goes alone
        except duckdb.Error:
            return {}
    every = sorted({ing.ctx.source_id for ing, _spans, _files, _mode in group})
    rows = dict.fromkeys(every, 0)
    rows.update(
        con.execute(
            f"SELECT source_id, count(*) FROM event_rows WHERE _in_files(source_id, {store._sids_literal(every)}) "
            "GROUP BY source_id"
        ).fetchall()
    )
    return rows


def _commit_all(arrivals: list[tuple[Any, store.Commit]]) -> set[int] | None:
    """The leader commits every arrival, derived rows included, in one transaction: the source ids
    committed, None if it failed (nothing of it stays; each file then commits on its own)."""
    con = arrivals[0][0]
    commits = sorted((c for _con, c in arrivals), key=lambda c: c.sid)
    try:
        store.commit_sources(con, commits)
    except duckdb.InterruptException:
        raise  # Ctrl-C: the batch stops, no file commits alone
    except duckdb.Error:
        return None
    return {c.sid for c in commits}


def plan_batches(sizes: list[tuple[int, str, int]]) -> list[list[int]]:
    """Which files (index, name, size on disk) share a batch: ``.json`` and ``.json.gz`` files of
    up to SHARED_MAX_FILE_BYTES of JSON (a .gz file's from its trailer, whatever its ratio: see
    _gz.content_size), in their order, at most SHARED_MAX_FILES and SHARED_MAX_BATCH_BYTES of
    JSON per batch, of which at most SHARED_MAX_GZ_BYTES decompressed; only batches of two or
    more. Detection still decides in each file's thread. A trailer short of the truth (several
    gzip members, 4 GiB or more) cannot take a batch past SHARED_MAX_GZ_BYTES: the batch counts
    what it decompresses (SharedBatch.take_gz)."""
    batches: list[list[int]] = []
    cur: list[int] = []
    total = unpacked = 0
    for index, name, size in sizes:
        gz = name.endswith(".json.gz")
        if not (gz or name.endswith(".json")):
            continue
        try:
            content = _gz_content_size(Path(name)) if gz else size
        except OSError:
            continue  # gone or unreadable: it goes alone, and its own ingest says why
        if content > SHARED_MAX_FILE_BYTES:
            continue
        if cur and (
            len(cur) >= SHARED_MAX_FILES
            or total + content > SHARED_MAX_BATCH_BYTES
            or (gz and unpacked + content > SHARED_MAX_GZ_BYTES)
        ):
            batches.append(cur)
            cur, total, unpacked = [], 0, 0
        cur.append(index)
        total += content
        unpacked += content if gz else 0
    if cur:
        batches.append(cur)
    return [b for b in batches if len(b) > 1]
