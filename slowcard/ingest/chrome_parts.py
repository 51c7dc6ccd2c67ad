"""Phase 2 of a trace's ingest: the events array cut at event boundaries into parts of about the
target size, inserted by DuckDB's JSON reader in one statement over named pipes (plain files:
sendfile from the file; .gz: part files a decompressing producer thread writes), in waves when
that is not possible. Part of the Chrome-trace reader (slowcard/ingest/chrome.py)."""

from __future__ import annotations

import errno
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable

import duckdb

from .. import tempspace
from ._shared import SHARED_MAX_FILE_BYTES
from .base import Context, is_gzip
from .chrome_exact import _complete_events_end, _ExactPhase
from .chrome_pipes import (
    PIPE_STALL_S,
    READ_BYTES,
    _copy_range,
    _feed_part_file,
    _feed_pipe,
    _gz_content_size,
    _last_boundary,
    _piped,
    _release_feeder,
    _separator_start,
    _Stream,
)
from .chrome_ts import SAMPLE_BYTES, _ts_mode

TAIL_BYTES = 1 << 20  # at most this much after the last part is left to the tail parser

BOUNDARY_WINDOW = 4 << 20  # how far back from a part's target end an event boundary is looked for

# An uncompressed file's cut is looked for in this much first (an event is rarely larger), then in
# BOUNDARY_WINDOW: the same cut (the last boundary before the target), without reading 4 MiB per
# part (32 MiB of a 300 MB file: ~25 ms).
FIRST_WINDOW = 64 << 10

# Parts are sized so that a file splits into groups of 2 x threads parts of about this many bytes,
# the batches of the fallback path. Every INSERT after the first makes DuckDB 1.5 rewrite partly
# filled row groups at checkpoint (4 statements on 300 MB: +0.55 s, a 90% larger file), hence one
# statement per file wherever the input allows.
BATCH_BYTES = 256 << 20

MAX_PIPES = 512  # more parts than this go through part files in batches instead

# A compressed file of a batch is decompressed whole before the batch's statement. A batch takes
# files of at most SHARED_MAX_FILE_BYTES by their trailer's estimate; a file whose parts pass twice
# that (the estimate was wrong), or the batch's temp budget (SHARED_MAX_GZ_BYTES, counted on the
# bytes really decompressed), or that finds the temp folder full, leaves the batch and goes the
# one-file path after the batch's statement (ingest/_shared.py).
BATCH_GZ_LIMIT = 2 * SHARED_MAX_FILE_BYTES

# What stops a batch member's decompression for want of room (the file then goes alone).
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


class _BatchFull(Exception):
    """A part would take a batch member past BATCH_GZ_LIMIT or the batch past its temp budget."""


def _no_room(exc: object) -> bool:
    """The producer of a batch member stopped for want of room: its budget or the temp folder."""
    return isinstance(exc, _BatchFull) or (isinstance(exc, OSError) and exc.errno in _NO_ROOM)


def _write_part(path: str, data: memoryview) -> None:
    """``[`` + data + ``]`` into a new part file; nothing is left behind when it cannot be
    written (the temp folder is full)."""
    try:
        with open(path, "wb") as f:
            f.write(b"[")
            f.write(data)
            f.write(b"]")
    except BaseException:
        try:
            os.unlink(path)
        except OSError:
            pass
        raise


def _reap(producer: threading.Thread, parts: queue.Queue, stop: threading.Event) -> None:
    """Stop the producer thread of a compressed file whatever happened, and delete the part files
    it left in the queue (drained while it runs: it may be blocked putting one more)."""
    stop.set()
    while producer.is_alive() or not parts.empty():
        try:
            left, _info = parts.get(timeout=0.1)
        except queue.Empty:
            continue
        if left is not None:
            os.unlink(left)
    producer.join()


def _tail_of(end: tuple) -> bytes:
    """The producer's last item (None, tail bytes or the exception that stopped it): the tail, or
    the exception raised."""
    tail = end[1]
    if isinstance(tail, BaseException):
        raise tail
    return tail or b""


def _tmp_root(ctx: Context) -> str:
    if ctx.options.tmp_dir:
        return str(ctx.options.tmp_dir)
    chosen = tempspace.chosen_root()
    if chosen is not None:
        return str(chosen)
    shm = "/dev/shm"
    try:
        # at most two batches of parts (one being inserted, one being cut) exist at a time
        if os.path.isdir(shm) and shutil.disk_usage(shm).free > 4 * BATCH_BYTES:
            return shm
    except OSError:
        pass
    return tempfile.gettempdir()


class _PartsPhase(_ExactPhase):
    """Cutting the events array into parts and inserting them."""

    # A member of a batch that left it for want of room: from then on it is ingested as a file of
    # its own (ctx.shared stays: the derive stage still counts on it).
    alone = False

    def _in_batch(self) -> bool:
        return self.ctx.shared is not None and not self.alone

    def _part_target(self) -> int:
        """Part size: the configured maximum, but such that the file splits into statements of
        `_batch_parts()` parts of about BATCH_BYTES each: every DuckDB thread gets parts of its
        own (one part is parsed by one thread) and no statement ends with one thread idle."""
        opts = self.ctx.options
        size = self.path.stat().st_size
        if is_gzip(self.path):
            size = _gz_content_size(self.path)
        if self._in_batch():
            # a file of a batch (ingest/_shared.py): DuckDB's threads share the batch's files, so
            # one part per file (up to part_bytes) is enough; small parts cost ~0.1 s per 16 files
            return max(1, min(opts.part_bytes, size))
        batches = max(1, -(-size // BATCH_BYTES))
        even = -(-size // (batches * self._batch_parts()))
        return max(1, max(min(opts.part_bytes, 4 << 20), min(opts.part_bytes, even)))

    def _batch_parts(self) -> int:
        return 2 * max(1, self.ctx.options.threads)

    def _produce(
        self,
        s: _Stream,
        start: int,
        tmpdir: str,
        out: queue.Queue,
        stop: threading.Event,
        take: Callable[[int], bool] | None = None,
    ) -> None:
        """Producer thread: cut the events array into part files of about the target size; put
        (path, (separator, ts_mode)) per part, then (None, tail_bytes) with the bytes after the
        last part; (None, exc) on error. ``separator`` is what was stripped from the end of the
        part (', ' and whitespace): when the cut was wrong (inside a string) the exact fallback
        needs those bytes back to rebuild the event split across two parts. Returns without a
        last item once ``stop`` is set. ``take(n)``: asked before a part of n bytes is written
        (a batch's temp budget); False ends the production with (None, _BatchFull())."""
        try:
            s.drop(start)
            target = self._part_target()
            keep = min(TAIL_BYTES, target)
            want = target
            n = reported = 0
            while not stop.is_set():
                # read what this part needs (at least 1 MB): progress then moves part by part
                while len(s.buf) < want and s.more(min(READ_BYTES, max(1 << 20, want - len(s.buf)))):
                    pass
                hi = min(len(s.buf), want)
                lo = max(0, hi - BOUNDARY_WINDOW)
                cut = _last_boundary(s.buf, lo, hi) if hi else -1
                if cut < 0 and lo > 0:
                    cut = _last_boundary(s.buf, 0, hi)
                if cut <= 0:
                    if s.eof and hi >= len(s.buf):
                        break
                    if want - target >= self.ctx.options.max_event_bytes:
                        self.oversize = s.base  # stop here: memory stays bounded
                        s.drop(len(s.buf))
                        break
                    want += target  # no boundary before the target (one huge event): take more
                    continue
                want = target
                buf = s.buf
                end = _separator_start(buf, cut)
                part = os.path.join(tmpdir, f"part{n:05d}.json")
                if take is not None and not take(end + 2):
                    raise _BatchFull(f"part {n} of {end + 2} bytes")
                with memoryview(buf) as mv:
                    _write_part(part, mv[:end])
                info = (bytes(buf[end:cut]), _ts_mode(bytes(buf[: min(end, SAMPLE_BYTES)])))
                n += 1
                del buf
                s.drop(cut)
                read = s.f.tell()  # compressed bytes consumed so far
                self.ctx.read_bytes(read - reported)
                reported = read
                out.put((part, info))
                if s.eof and len(s.buf) < keep:
                    break
            out.put((None, bytes(s.buf)))
        except BaseException as exc:  # handed to the consumer, which re-raises it
            out.put((None, exc))

    def _plain_parts(self, fd: int, pos: int, size: int) -> tuple[list[tuple[int, int, bytes, str]], int]:
        """The cuts of an uncompressed file, as _produce makes them, found by reading only a
        window before each target offset: [(offset, length, separator, ts mode)] per part, and
        the offset where the tail starts."""
        target = self._part_target()
        keep = min(TAIL_BYTES, target)
        want = target
        parts = []
        while True:
            hi = min(size - pos, want)
            cut = -1
            for back in (FIRST_WINDOW, BOUNDARY_WINDOW):
                lo = max(0, hi - back)
                window = os.pread(fd, hi - lo, pos + lo) if hi else b""
                cut = _last_boundary(window, 0) if window else -1
                # a boundary right at the window's start may lack the bytes before it: look wider
                if cut > 64 or lo == 0:
                    break
            if cut < 0 and lo > 0:  # one event larger than the window
                lo, window = 0, os.pread(fd, hi, pos)
                cut = _last_boundary(window, 0)
            if cut + lo <= 0:
                if hi >= size - pos:
                    break
                if want - target >= self.ctx.options.max_event_bytes:
                    self.oversize = pos  # stop here: memory stays bounded
                    break
                want += target  # no boundary before the target (one huge event): take more
                continue
            want = target
            end = _separator_start(window, cut)
            mode = _ts_mode(os.pread(fd, min(lo + end, SAMPLE_BYTES), pos))
            parts.append((pos, lo + end, window[end:cut], mode))
            pos += lo + cut
            if size - pos < keep:
                break
        return parts, pos

    def _insert_plain(self, fd: int, parts: list[tuple[int, int, bytes, str]], tail_at: int, tail: bytes) -> bytes:
        """Insert the parts of an uncompressed file: in ONE statement through named pipes when
        they can share one (no copy on disk, no per-statement cost), else as part files in
        batches, each batch (then each part) falling back to the exact path on its own. ``tail``:
        the bytes from ``tail_at`` to the end; returns what of them is left for the tail parser
        (a batch member's last complete events join the batch's statement, see _tail_events)."""
        modes = {p[3] for p in parts}
        shared = self.ctx.shared
        if shared is not None:
            n = None
            kb = 0
            if parts and len(modes) == 1 and "exact" not in modes and hasattr(os, "mkfifo"):
                spans, kb = self._with_tail_events(parts, tail_at, tail)
                n = shared.insert(self.ctx.path, self, fd, spans)  # waits for the batch's other files
            shared.leave_insert(self.ctx.path)
            if n is not None:
                self.kept += n
                self.seen += n
                return tail[kb:]
        if (
            1 < len(parts) <= MAX_PIPES
            and len(modes) == 1
            and "exact" not in modes
            and hasattr(os, "mkfifo")
            and self._insert_through_pipes(fd, parts)
        ):
            return tail
        cap = self._batch_parts()
        for b in range(0, len(parts), cap):
            files = []
            for offset, length, sep, mode in parts[b : b + cap]:
                part = os.path.join(self.tmpdir, f"part{offset:015d}.json")
                with open(part, "wb") as f:
                    f.write(b"[")
                    f.flush()
                    _copy_range(fd, f.fileno(), offset, length)
                    f.write(b"]")
                self.part_info[part] = (sep, mode)
                files.append(part)
            try:
                self._insert_wave(files)
            finally:
                for part in files:
                    os.unlink(part)
                    del self.part_info[part]
            self.ctx.read_bytes(sum(length for _, length, _, _ in parts[b : b + cap]))
        return tail

    def _with_tail_events(
        self, parts: list[tuple[int, int, bytes, str]], tail_at: int, tail: bytes
    ) -> tuple[list[tuple[int, int, bytes, str]], int]:
        """``parts`` (non-empty) with the last one running on over its separator and the tail's
        complete events (_tail_events), and the bytes of ``tail`` that took (0: parts unchanged)."""
        kb = self._tail_events(tail, parts[0][3])
        if not kb:
            return parts, 0
        offset, _length, sep, mode = parts[-1]
        return parts[:-1] + [(offset, tail_at + kb - offset, sep, mode)], kb

    def _tail_events(self, tail: bytes, mode: str) -> int:
        """Bytes at the start of ``tail`` that are complete events the tail parser would insert in
        a statement of their own (chrome_exact._tail), read the ``mode`` way like the parts: a
        batch member sends them with its parts, so that the batch does not pay one small INSERT
        (a WAL flush) per file. 0 when they cannot go (no such events, invalid UTF-8, another ts
        type, text carried from a failed part): the tail parser then does as before."""
        if self.carry or not tail:
            return 0
        try:
            text = tail.decode("utf-8")
        except UnicodeDecodeError:
            return 0
        k = _complete_events_end(text)
        if not k:
            return 0
        events = text[:k].encode("utf-8")
        return len(events) if _ts_mode(events[:SAMPLE_BYTES]) == mode else 0

    def _insert_through_pipes(self, fd: int, parts: list[tuple[int, int, bytes, str]]) -> bool:
        """One INSERT over one named pipe per part, each fed from the file by its own thread
        (sendfile, in the kernel). False when DuckDB rejects some part: nothing was inserted."""
        ranges = [(fd, offset, length, self.ctx.read_bytes) for offset, length, _sep, _mode in parts]
        with _piped(self.tmpdir, "pipe", ranges) as pipes:
            try:
                n = self._insert_files(pipes, parts[0][3])
            except duckdb.Error:
                return False
        self.kept += n
        self.seen += n
        return True

    def _insert_stream(self, s: _Stream, start: int, pipes: bool = True) -> bytes:
        """Insert a compressed file; returns the tail bytes after the last part.

        A producer thread decompresses and cuts part files while DuckDB inserts. The parts go in
        ONE INSERT over named pipes, each fed its part as the producer makes it: every further
        statement costs a rewrite of the table's row groups at checkpoint (4 statements on 300 MB:
        +0.55 s and a 90% larger database file). Parts beyond the pipes (the size estimate was
        short) go in waves after it. If DuckDB rejects the one statement, the file is decompressed
        again and inserted in waves, where each part falls back on its own."""
        cap = self._batch_parts()
        if self._in_batch():
            return self._stream_in_batch(s, start, cap)
        parts: queue.Queue = queue.Queue(maxsize=cap)
        stop = threading.Event()
        producer = threading.Thread(target=self._produce, args=(s, start, self.tmpdir, parts, stop), daemon=True)
        producer.start()
        end = None
        restart = False
        try:
            first = parts.get()
            pending = [first]
            if pipes and first[0] is not None and first[1][1] != "exact" and hasattr(os, "mkfifo"):
                inserted, end = self._stream_through_pipes(parts, first, cap)
                # rejected: nothing of it stays; decompress again and go in waves (below)
                restart, pending = not inserted, []
            if end is None and not restart:
                end = self._insert_waves(parts, cap, pending)
        finally:
            _reap(producer, parts, stop)
        if restart:
            again = _Stream(self.path)
            try:
                tail = self._insert_stream(again, self._find_events(again), pipes=False)
                s.error = again.error  # the first pass may have stopped before the damage
                return tail
            finally:
                again.close()
        assert end is not None  # set by the pipes or the waves when not restarting
        return _tail_of(end)

    def _stream_in_batch(self, s: _Stream, start: int, cap: int) -> bytes:
        """Insert a compressed file of a batch (ingest/_shared.py); returns the tail bytes.

        The file is decompressed and cut whole into part files first: the batch's files
        decompress side by side, UNPACK_THREADS at a time (zlib lets go of the GIL; _shared.py), each
        in a producer thread of its own. Then it arrives at the
        batch's ONE INSERT with them. When the batch cannot take them (another ts type, the
        producer failed, DuckDB rejected the statement), they go in waves as before, each part
        falling back on its own.

        Every part is counted against the batch's temp budget before it is written: the trailer's
        size the batch was planned with is a guess (the last member's size mod 4 GiB). A file
        that would pass the budget or BATCH_GZ_LIMIT, or finds the temp folder full, deletes its
        parts, leaves the batch and, once the batch's statement has run (its parts are gone from
        the temp folder), is ingested alone as --jobs 1 does (``_alone``): it never fails for the
        batch's want of room."""
        shared = self.ctx.shared
        assert shared is not None
        items: queue.Queue = queue.Queue(maxsize=cap)
        stop = threading.Event()
        taken = [0]  # bytes of this file's parts counted against the batch's budget

        def take(n: int) -> bool:  # in the producer thread
            if taken[0] + n > BATCH_GZ_LIMIT or not shared.take_gz(n):
                return False
            taken[0] += n
            return True

        producer = threading.Thread(target=self._produce, args=(s, start, self.tmpdir, items, stop, take), daemon=True)
        made: list = []
        alone = False
        try:
            shared.start_unpack(self.ctx.path)  # two members decompress at once, beside the others' headers
            try:
                producer.start()
                while not made or made[-1][0] is not None:
                    made.append(items.get())
            finally:
                shared.end_unpack(self.ctx.path)
            end = made.pop()
            alone = _no_room(end[1])
            modes = {info[1] for _part, info in made}
            n = None
            whole = not isinstance(end[1], BaseException)
            if whole and made and len(modes) == 1 and "exact" not in modes:
                mode = modes.pop()
                files = [part for part, _info in made]
                kb = self._tail_events(end[1] or b"", mode)
                if kb:  # the tail's complete events join the batch's statement (_tail_events)
                    tail_part = os.path.join(self.tmpdir, "batch_tail.json")
                    with memoryview(end[1]) as mv:
                        _write_part(tail_part, mv[:kb])
                    files.append(tail_part)
                n = shared.insert_files(self.ctx.path, self, files, mode)
                if kb:
                    os.unlink(tail_part)
                    if n is not None:
                        end = (None, end[1][kb:])
            shared.leave_insert(self.ctx.path)
            if n is not None:
                self.kept += n
                self.seen += n
            elif not alone:
                pending, made = made + [end], []
                end = self._insert_waves(items, cap, pending)  # deletes the parts it inserts
        finally:
            for part, _info in made:
                if part is not None and os.path.exists(part):
                    os.unlink(part)
            _reap(producer, items, stop)
            shared.give_gz(taken[0])  # every part of this file is deleted by now
        if alone:
            return self._alone(s)
        return _tail_of(end)

    def _alone(self, s: _Stream) -> bytes:
        """A batch member that had no room in the batch, ingested as a file of its own once the
        batch's statement has run and its parts are deleted: decompressed again from the start
        (nothing of it was inserted) on the one-file path; returns the tail bytes."""
        shared = self.ctx.shared
        assert shared is not None
        shared.wait_for_room()
        self.alone = True
        again = _Stream(self.path)
        try:
            tail = self._insert_stream(again, self._find_events(again))
            s.error = again.error
            return tail
        finally:
            again.close()

    def _stream_through_pipes(self, parts: queue.Queue, first, cap: int):
        """One INSERT over named pipes fed part by part from the producer's queue. DuckDB opens
        the files of a list in order, at most `threads` at a time, so at most `cap` parts wait on
        disk. Returns (inserted, end): end is the producer's last item (None, tail) when the file
        ended within the pipes, None when parts remain in the queue; pipes left over read `[]`."""
        mode = first[1][1]
        n_pipes = max(2, min(MAX_PIPES, -(-_gz_content_size(self.path) // self._part_target()) + 1))
        names = []
        for i in range(n_pipes):
            names.append(os.path.join(self.tmpdir, f"gzpipe{i:05d}.json"))
            os.mkfifo(names[-1])
        feeders: list[tuple[str, threading.Thread]] = []
        state: dict = {"end": None, "bad": False}
        abort = threading.Event()

        def feed(pipe: str, target, *args) -> threading.Thread:
            t = threading.Thread(target=target, args=args, daemon=True)
            t.start()
            feeders.append((pipe, t))
            return t

        def dispatch() -> None:
            live: list[threading.Thread] = []
            item, fed = first, 0
            try:
                for pipe in names:
                    if abort.is_set():
                        return
                    if state["end"] is None and item is None:
                        while len(live) >= cap:
                            live[0].join(PIPE_STALL_S)
                            if live[0].is_alive():
                                # DuckDB has not read the oldest waiting part in all that time:
                                # should it ever open the pipes out of order, this would wait
                                # forever. Fail the statement (the finally below); go in waves.
                                state["bad"] = True
                                return
                            live.pop(0)
                        item = parts.get()
                        if item[0] is None:
                            state["end"], item = item, None
                    if state["end"] is not None:
                        feed(pipe, _feed_pipe, -1, 0, 0, pipe, b"[]", b"")
                    elif item[1][1] != mode:
                        # another ts type: this statement cannot read it; fail it, go in waves
                        state["bad"] = True
                        os.unlink(item[0])
                        item = None
                        feed(pipe, _feed_pipe, -1, 0, 0, pipe, b"[!", b"")
                    else:
                        live.append(feed(pipe, _feed_part_file, item[0], pipe))
                        item = None
                    fed += 1
            finally:
                # never leave DuckDB waiting on a pipe nobody will open: fail the statement
                for pipe in names[fed:]:
                    if not abort.is_set():
                        state["bad"] = True
                        feed(pipe, _feed_pipe, -1, 0, 0, pipe, b"[!", b"")

        dispatcher = threading.Thread(target=dispatch, daemon=True)
        dispatcher.start()
        n = None
        try:
            n = self._insert_files(names, mode)
        except duckdb.Error:
            pass
        finally:
            abort.set()
            while dispatcher.is_alive():
                for pipe, t in list(feeders):
                    _release_feeder(pipe, t)
                dispatcher.join(0.01)
            for pipe, t in feeders:
                _release_feeder(pipe, t)
            for pipe in names:
                os.unlink(pipe)
        if n is None or state["bad"]:
            return False, None
        self.kept += n
        self.seen += n
        return True, state["end"]

    def _insert_waves(self, parts: queue.Queue, cap: int, pending: list) -> tuple:
        """Insert the producer's parts in statements of up to `cap` parts; returns its last item."""
        need = max(1, self.ctx.options.threads)
        while True:
            wave: list[str] = []
            end = None
            while end is None and len(wave) < cap:
                if pending:
                    item = pending.pop(0)
                else:
                    try:
                        # parts come as fast as they decompress: insert what is ready once every
                        # thread has one
                        item = parts.get(block=len(wave) < need)
                    except queue.Empty:
                        break
                if item[0] is None:
                    end = item
                else:
                    wave.append(item[0])
                    self.part_info[item[0]] = item[1]
            if wave:
                try:
                    self._insert_wave(wave)
                finally:
                    for p in wave:
                        os.unlink(p)
                        del self.part_info[p]
            if end is not None:
                return end
