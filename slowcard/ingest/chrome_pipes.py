"""Transport of a trace's bytes: the buffered (gz or plain) stream the header and cuts read, the
event-boundary finder, and the named pipes DuckDB reads parts from (fed by sendfile or from part
files). Part of the Chrome-trace reader (slowcard/ingest/chrome.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

try:
    import fcntl
except ImportError:  # not on Windows; named pipes are not used there either
    fcntl = None  # type: ignore[assignment]

from .. import store
from ..errors import InputError
from ._gz import GZIP_MAGIC, Members, content_size

READ_BYTES = 8 << 20

PIPE_STALL_S = 120.0  # a .gz part DuckDB has not read by then: give up the one-statement path

_WS = b" \t\r\n"


class _Stream:
    """A byte window over the (decompressed) file: ``buf`` holds bytes from offset ``base``.

    gzip is decompressed by ``_gz.Members``: every member, and a cut or corrupt stream still
    yields every byte that decompressed before the damage (the salvage keeps those events).
    """

    def __init__(self, path: Path):
        self.path = path
        try:
            self.f = open(path, "rb")
            self.gz = self.f.read(2) == GZIP_MAGIC
            self.f.seek(0)
        except OSError as exc:
            raise InputError(path, f"cannot open the file ({exc})") from None
        self.z = Members(self.f) if self.gz else None
        self.buf = bytearray()  # appended to in place: no copy of the whole window per read
        self.base = 0
        self.eof = False
        self.error: str | None = None

    def _read_gz(self, n: int) -> bytes:
        assert self.z is not None  # only called for gzip files (self.gz)
        data = self.z.read(n)
        self.error = self.z.error
        return data

    def more(self, n: int = READ_BYTES) -> bool:
        """Append up to n bytes; False at end of file (or where a compressed stream breaks)."""
        if self.eof:
            return False
        try:
            data = self._read_gz(n) if self.gz else self.f.read(n)
        except OSError as exc:
            data, self.error = b"", str(exc) or type(exc).__name__
        if not data:
            self.eof = True
            return False
        if self.error:
            self.eof = True  # keep what decompressed; nothing more will come
        self.buf += data
        return True

    def drop(self, upto: int) -> None:
        """Forget buffered bytes before index ``upto``."""
        del self.buf[:upto]
        self.base += upto

    def close(self):
        self.f.close()


def _last_boundary(buf: bytes | bytearray, lo: int, hi: int | None = None) -> int:
    """Index of the '{' that starts the last event in buf[lo:hi] preceded by '}' ',' (with
    whitespace between), or -1. A cut found here may fall inside a string; DuckDB then rejects
    the part and the exact fallback repairs it."""
    j = len(buf) if hi is None else hi
    while True:
        j = buf.rfind(b"{", lo, j)
        if j <= lo:
            return -1
        k = j - 1
        while k > lo and buf[k] in _WS:
            k -= 1
        if buf[k] == 0x2C:  # ','
            k -= 1
            while k > lo and buf[k] in _WS:
                k -= 1
            if buf[k] == 0x7D:  # '}'
                return j


def _separator_start(buf, cut: int) -> int:
    """Index where the ', ' (with whitespace) before the event starting at ``cut`` begins: a part
    ends there, without copying the buffer."""
    end = cut
    while end > 0 and buf[end - 1] in _WS:
        end -= 1
    while end > 0 and buf[end - 1] == 0x2C:
        end -= 1
    while end > 0 and buf[end - 1] in _WS:
        end -= 1
    return end


def _copy_range(src: int, dst: int, offset: int, count: int) -> None:
    """Append count bytes of src from offset to dst, in the kernel when it can."""
    while count > 0:
        try:
            n = os.sendfile(dst, src, offset, min(count, 1 << 30))
        except OSError:
            data = os.pread(src, min(count, READ_BYTES), offset)
            n = os.write(dst, data) if data else 0
        if n <= 0:
            raise OSError(f"could not copy bytes at offset {offset} (the file shrank while read?)")
        offset += n
        count -= n


# A pipe's buffer while a part goes through it: Linux's default of 64 KiB wakes DuckDB's reader
# and the feeder once per 64 KiB; with 1 MiB (the usual /proc/sys/fs/pipe-max-size) the INSERT of
# 64 rank files of 4.7 MB took 1.39-1.51 s against 1.48-1.70 s in paired runs (bench/README "Many
# small rank files", round 4). Where the system refuses it (a lower maximum) the default stays. Pipe buffers count
# against a per-user quota (fs/pipe-user-pages-soft, 64 MiB): past it, every new pipe of the user,
# in any process, gets 8 KiB. So at most WIDE_PIPES pipes of this process are widened at once
# (DuckDB reads a couple at a time; the others wait for their reader with the default).
PIPE_BYTES = 1 << 20
WIDE_PIPES = 8
_WIDE = threading.BoundedSemaphore(WIDE_PIPES)


def _widen(fd: int) -> bool:
    """Give a pipe PIPE_BYTES of buffer where the system allows it and fewer than WIDE_PIPES are
    wide (Linux only); True when it took one of those places (``_WIDE.release()`` once closed)."""
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl is not None else None
    if setsize is None or not _WIDE.acquire(blocking=False):
        return False
    try:
        fcntl.fcntl(fd, setsize, PIPE_BYTES)
    except OSError:
        _WIDE.release()
        return False
    return True


def _feed_pipe(fd: int, offset: int, length: int, pipe: str, head: bytes = b"[", end: bytes = b"]", done=None) -> None:
    """Write head + the file's bytes + end into a named pipe (blocks until DuckDB opens it);
    then ``done(length)``."""
    try:
        out = os.open(pipe, os.O_WRONLY)
    except OSError:
        return
    wide = False
    try:
        wide = _widen(out)
        store.fault_point("feed")  # crash tests: DuckDB is reading the pipes here
        os.write(out, head)
        _copy_range(fd, out, offset, length)
        if end:
            os.write(out, end)
        if done:
            done(length)
    except OSError:
        pass  # DuckDB stopped reading (the statement failed): the fallback re-reads the file
    finally:
        os.close(out)
        if wide:
            _WIDE.release()


def _feed_part_file(part: str, pipe: str) -> None:
    """Feed a part file (already bracketed) into a named pipe, then delete it."""
    try:
        with open(part, "rb") as f:
            _feed_pipe(f.fileno(), 0, os.fstat(f.fileno()).st_size, pipe, b"", b"")
    finally:
        os.unlink(part)


# The ratio taken for a .gz whose trailer cannot be its size (a cut file, zero padding): trace
# JSON gzips 5-100x. It only sizes one file's parts and pipes: too short, the parts beyond the
# pipes go in waves; too long, idle pipes (one thread each) read ``[]``.
UNKNOWN_RATIO = 20


def _gz_content_size(path: Path) -> int:
    """Estimated decompressed size of a .gz trace, to size its parts and pipes (_gz.content_size;
    a wrong guess costs speed, never rows)."""
    return content_size(path, UNKNOWN_RATIO)


def _release_feeder(pipe: str, feeder: threading.Thread) -> None:
    """Let a feeder thread finish whatever DuckDB did with its pipe: one still waiting for a
    reader (the statement failed before opening it) is read to its end and discarded."""
    if not feeder.is_alive():
        return
    rfd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while feeder.is_alive():
            try:
                if not os.read(rfd, 1 << 20):
                    feeder.join(0.001)
            except BlockingIOError:
                feeder.join(0.001)
    finally:
        os.close(rfd)
    feeder.join()


class _piped:
    """``with _piped(folder, prefix, ranges) as pipes``: one named pipe per (fd, offset, length,
    done) range in ``folder``, each fed (``[`` + the bytes + ``]``) by its own thread once DuckDB
    opens it. On exit every feeder is released (a pipe DuckDB never opened is drained) and the
    pipes are removed.

    A class, not a generator: a Ctrl-C whose KeyboardInterrupt fires on entering ``__exit__``
    (it is pending while DuckDB runs the statement and fires at the next Python call) skips the
    cleanup either way, and the part folder is removed by the reader after it; a generator left
    suspended was then closed at interpreter exit, after that folder was gone, and printed an
    "Exception ignored" traceback under the one-line Ctrl-C message."""

    def __init__(self, folder: str, prefix: str, ranges: Sequence[tuple[int, int, int, Callable[[int], None] | None]]):
        self.folder, self.prefix, self.ranges = folder, prefix, ranges
        self.pipes: list[str] = []
        self.feeders: list[threading.Thread] = []

    def __enter__(self) -> list[str]:
        try:
            for fd, offset, length, done in self.ranges:
                pipe = os.path.join(self.folder, f"{self.prefix}{len(self.pipes):05d}.json")
                os.mkfifo(pipe)
                self.pipes.append(pipe)
                t = threading.Thread(
                    target=_feed_pipe, args=(fd, offset, length, pipe), kwargs={"done": done}, daemon=True
                )
                t.start()
                self.feeders.append(t)
        except BaseException:
            self.__exit__()
            raise
        return self.pipes

    def __exit__(self, *exc: object) -> None:
        try:
            for pipe, t in zip(self.pipes, self.feeders):
                _release_feeder(pipe, t)
        finally:
            for pipe in self.pipes:
                os.unlink(pipe)
