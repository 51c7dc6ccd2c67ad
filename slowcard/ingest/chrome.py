"""Chrome-trace JSON (Kineto object form, Ascend trace_view.json, msServiceProfiler chrome_tracing.json).

Python never parses the bulk of the events. It finds where the ``traceEvents`` array starts (parsing
the header keys exactly), cuts the array at event boundaries into parts of up to ~64 MB and lets
DuckDB's JSON reader parse them in parallel, in ONE ``INSERT ... FROM read_json([pipes])`` per file
(see ../shared/docs/ingest_perf.md): each part reaches DuckDB as ``[`` + bytes + ``]`` through a
named pipe, fed from the file by sendfile (uncompressed) or from the part files a decompressing
producer thread writes (.gz). The last few events, the closing bracket and the trailing keys
(on-demand Kineto writes ``distributedInfo`` AFTER the events) are found by an exact scan in Python,
which is also how a truncated file is salvaged. When DuckDB rejects the statement (a boundary cut
inside a string, invalid UTF-8, a value of the wrong type), the parts go again in small batches and
a part DuckDB still rejects is re-parsed event by event in Python: good events are kept, bad ones
are counted with their event index and reason.

Memory stays bounded by a few parts in flight, whatever the file size.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import shutil
import tempfile
import threading
import zlib
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path

import duckdb

from .. import store, tempspace
from ..errors import InputError
from ..store import scalar
from .base import GZIP_MAGIC, Context, Outcome, is_gzip, strip_bom

READ_BYTES = 8 << 20
HEADER_LIMIT = 64 << 20  # header keys before traceEvents larger than this are not a trace
TAIL_BYTES = 1 << 20  # at most this much after the last part is left to the tail parser
BOUNDARY_WINDOW = 4 << 20  # how far back from a part's target end an event boundary is looked for
# Parts are sized so that a file splits into groups of 2 x threads parts of about this many bytes,
# the batches of the fallback path. Every INSERT after the first makes DuckDB 1.5 rewrite partly
# filled row groups at checkpoint (4 statements on 300 MB: +0.55 s, a 90% larger file), hence one
# statement per file wherever the input allows.
BATCH_BYTES = 256 << 20
MAX_PIPES = 512  # more parts than this go through part files in batches instead
PIPE_STALL_S = 120.0  # a .gz part DuckDB has not read by then: give up the one-statement path
SAMPLE_BYTES = 1 << 16  # head of each part inspected to choose how its ts is read
_WS = b" \t\r\n"


class _Num(float):
    """A JSON number with a fraction that remembers its text: ``ts`` keeps digits a double cannot
    hold (1704161511420306.491). Serialised again it is a plain float."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str):
        self = super().__new__(cls, text)
        self.text = text
        return self


_DECODER = json.JSONDecoder(parse_float=_Num)

# The columns DuckDB reads from every event; anything else in an event is ignored.
# ts must end up as exact integer nanoseconds. Two DuckDB 1.5 traps decide how it is read:
# - its JSON reader parses every JSON number as a double first; read as DECIMAL, the double is
#   then multiplied by 1000 in double arithmetic: 1704161511420306.5 becomes ...306.512 and the
#   real Kineto value 4458676624388.731 becomes ...388.732;
# - a string cast to a DECIMAL wider than 18 digits (needed for epoch µs with 3 decimals) costs
#   ~200 µs per value (DECIMAL(18,3) is fast but holds only 15 integer digits).
# So each part is read one of three ways, chosen from a sample of its ts texts (_ts_mode):
# - 'DOUBLE' (numbers only): ns = trunc(ts) * 1000 + round(fraction * 1000), on the exact integer
#   and fraction of the double: exact for every ts text a double holds to the ns (relative Kineto
#   ts, integer epoch µs, epoch µs ending in .0/.25/.5/.75);
# - 'VARCHAR' (some strings, e.g. Ascend "1704161511420306.491"): integer arithmetic on the text
#   (a number in a VARCHAR column arrives as its shortest round-trip text); anything that is not a
#   plain decimal ("1.5e3", "abc", true) fails the part, and the exact path judges each event;
# - 'exact': numbers with more digits than a double holds (1704161511420306.491 unquoted): parsed
#   event by event in Python from the original text (slower, exact).
_COLUMNS = (
    "{{ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'VARCHAR', tid: 'VARCHAR', "
    "ts: '{ts_type}', dur: 'DOUBLE', id: 'VARCHAR', args: 'JSON'}}"
)
_TS_NS = {
    "DOUBLE": "CAST(trunc(ts) AS BIGINT) * 1000 + CAST(round((ts - trunc(ts)) * 1000) AS BIGINT)",
    "VARCHAR": (
        "CASE WHEN ts IS NULL THEN NULL "
        # the common case, exactly 3 decimals ("1704161511420306.491", and every _normalise output)
        "WHEN strpos(ts, '.') = length(ts) - 3 AND right(ts, 1) BETWEEN '0' AND '9' "
        "THEN CAST(replace(ts, '.', '') AS BIGINT) "
        "WHEN regexp_full_match(ts, '\\s*-?[0-9]+(\\.[0-9]*)?\\s*') THEN "
        "CAST(split_part(trim(ts), '.', 1) AS BIGINT) * 1000 "
        "+ (CASE WHEN starts_with(trim(ts), '-') THEN -1 ELSE 1 END) "
        "* CAST(CAST('0.' || split_part(trim(ts), '.', 2) AS DECIMAL(18,3)) * 1000 AS BIGINT) "
        "ELSE error('ts is not a decimal number: ' || ts) END"
    ),
}
_INSERT = (
    "INSERT INTO event_rows SELECT $sid, ph, cat, name, pid, tid, {ts_ns} + $base_ns, "
    "CAST(round(dur * 1000) AS BIGINT), id, args "
    "FROM read_json($files, format = 'array', columns = {columns}, maximum_object_size = 16777216)"
)
_TS_TEXT = re.compile(rb'"ts"\s*:\s*("?)\s*(-?[0-9][0-9.eE+-]*)')
_BOOL_TIME = re.compile(rb'"(?:ts|dur)"\s*:\s*(?:true|false)')


def _insert_sql(ts_type: str) -> str:
    return _INSERT.format(ts_ns=_TS_NS[ts_type], columns=_COLUMNS.format(ts_type=ts_type))


def _double_exact(text: str) -> bool:
    """True when the DOUBLE route gives this numeric ts text its exact nanoseconds."""
    try:
        exact = Decimal(text)
        f = float(text)
    except (InvalidOperation, ValueError):
        return False
    if not math.isfinite(f) or abs(f) >= 1e17:
        return True  # out of range either way: DuckDB fails the part, the exact path drops it
    return (exact * 1000).quantize(_ONE, ROUND_HALF_UP) == (Decimal(f) * 1000).quantize(_ONE, ROUND_HALF_UP)


def _ts_mode(sample: bytes) -> str:
    """How to read ts in a part whose first bytes are ``sample``: 'DOUBLE', 'VARCHAR' or 'exact'
    (see _COLUMNS)."""
    if _BOOL_TIME.search(sample):
        return "exact"  # DuckDB would read true/false as 1/0 µs; the exact path drops them
    strings = False
    for m in _TS_TEXT.finditer(sample):
        if m.group(1):
            strings = True
            continue
        text = m.group(2)
        if text.strip(b"-0123456789") and not _double_exact(text.decode("ascii")):
            return "exact"  # a fraction or exponent a double cannot hold
    return "VARCHAR" if strings else "DOUBLE"


_KINETO_KEYS = (b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"')
# msServiceProfiler: its thread names (current "Schedule(123)" / "KVCache"; the 2024 output's
# "BatchSchedule", "ReqState", "modelExec", "httpReq", "deviceKvCache"), its batch events, and
# process labels "<host>,dp<N>".
_SERVICE_MARKERS = re.compile(
    rb'"tid"\s*:\s*"(?:Schedule|Request|Execute|KVCache|BatchSchedule|ReqState|ReqEnQueue|ReqDeQueue|modelExec'
    rb"|httpReq|httpRes|deviceKvCache|hostKvCache)"
    rb'|KVCache|batchFrameworkProcessing|"labels"\s*:\s*"[^"]*,\s*dp[0-9]+"'
)
# Ascend PyTorch Profiler / msprof trace_view.json: string ts, its process names, "NPU" labels.
_ASCEND_MARKERS = re.compile(
    rb'"ts"\s*:\s*"|"name"\s*:\s*"(?:Ascend Hardware|CANN|AscendCL|Overlap Analysis|AI Core Freq|HBM|LLC'
    rb'|Stars Soc Info|Acc PMU|NPU MEM)"|"labels"\s*:\s*"NPU(?:\s+[0-9]+)?"'
)


def _dialect(head: bytes) -> str | None:
    """ascend_trace / service_trace from the markers in the head of an event list; None if neither."""
    if _ASCEND_MARKERS.search(head):
        return "ascend_trace"
    if _SERVICE_MARKERS.search(head):
        return "service_trace"
    return None


class ChromeReader:
    """Reader for the three Chrome-trace dialects."""

    name = "chrome"

    def sniff(self, path: Path, head: bytes) -> str | None:
        h = strip_bom(head).lstrip(_WS)
        if h.startswith(b"{"):
            if any(k in head for k in _KINETO_KEYS):
                return "kineto"
            if b'"traceEvents"' in head or b'"displayTimeUnit"' in head:
                # {"traceEvents": [...]} without Kineto's header keys: msServiceProfiler's early
                # chrome_tracing.json and Ascend exports write this form too.
                return _dialect(head) or "kineto"
            return None
        if h.startswith(b"["):
            body = h[1:].lstrip(_WS)
            if not (body.startswith(b"{") or body.startswith(b"]") or not body):
                return None
            if b'"ph"' not in head and body and not body.startswith(b"]"):
                return None
            return _dialect(head) or "chrome_array"
        return None

    def guess_note(self, path: Path, head: bytes, fmt: str) -> str | None:
        """The per-file table says when the dialect is a default, not recognised from markers."""
        h = strip_bom(head).lstrip(_WS)
        if fmt == "kineto" and not any(k in head for k in _KINETO_KEYS):
            return (
                'format guessed: a {"traceEvents": [...]} trace without Kineto\'s header keys '
                "(schemaVersion, deviceProperties, distributedInfo) nor Ascend / msServiceProfiler "
                "markers in its first 64 KiB; read as a generic Kineto trace"
            )
        if fmt == "chrome_array" and h[1:].lstrip(_WS)[:1] == b"{":
            return (
                "format guessed: a JSON array of trace events without Ascend / msServiceProfiler markers "
                "in its first 64 KiB; read as a generic Chrome trace"
            )
        return None

    def ingest(self, ctx: Context) -> Outcome:
        return _Ingest(ctx).run()


READER = ChromeReader()


class _Stream:
    """A byte window over the (decompressed) file: ``buf`` holds bytes from offset ``base``.

    gzip is decompressed here with zlib (not the gzip module) so that a cut or corrupt stream
    still yields every byte that decompressed before the damage: the salvage keeps those events.
    """

    def __init__(self, path: Path):
        self.path = path
        try:
            self.f = open(path, "rb")
            self.gz = self.f.read(2) == GZIP_MAGIC
            self.f.seek(0)
        except OSError as exc:
            raise InputError(path, f"cannot open the file ({exc})") from None
        self.z = zlib.decompressobj(31) if self.gz else None
        self.buf = bytearray()  # appended to in place: no copy of the whole window per read
        self.base = 0
        self.eof = False
        self.error: str | None = None

    def _read_gz(self, n: int) -> bytes:
        out = bytearray()
        try:
            while len(out) < n:
                z = self.z
                assert z is not None  # only called for gzip files (self.gz)
                if z.unconsumed_tail:
                    data = z.unconsumed_tail
                else:
                    data = z.unused_data if z.eof else b""
                    if not data:
                        data = self.f.read(1 << 18)
                    if not data:
                        if not z.eof:
                            self.error = "the compressed stream ends before its end marker (the tail was cut)"
                        break
                    if z.eof:  # another gzip member follows (or padding)
                        if not data.strip(b"\x00"):
                            break
                        z = self.z = zlib.decompressobj(31)
                out += z.decompress(data, n - len(out))
        except (zlib.error, OSError) as exc:
            self.error = f"corrupt compressed data ({exc})"
        return bytes(out)

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


def _skip_ws(buf: bytes | bytearray, i: int) -> int:
    n = len(buf)
    while i < n and buf[i] in _WS:
        i += 1
    return i


def _decode_at(stream: _Stream, i: int):
    """Decode one JSON value starting at byte i of the buffer, reading more as needed.

    Returns (value, end_index). Raises ValueError when the bytes there are not JSON.
    """
    span = 1 << 16  # decode a window, not the whole buffer, for every header key
    while True:
        avail = len(stream.buf) - i
        # surrogateescape keeps one character per undecodable byte, so the end offset maps back
        # to the right byte (with errors="replace" it would drift by 2 bytes per bad byte).
        text = stream.buf[i : i + span].decode("utf-8", errors="surrogateescape")
        try:
            value, end = _DECODER.raw_decode(text)
            # a number cut by the window edge decodes too: only trust a value that ends inside
            if end < len(text) or span >= avail:
                return value, i + len(text[:end].encode("utf-8", errors="surrogateescape"))
        except (json.JSONDecodeError, RecursionError):
            pass
        if span < avail:
            span *= 4
        elif avail > HEADER_LIMIT or not stream.more():
            raise ValueError("not a JSON value") from None


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


def _feed_pipe(fd: int, offset: int, length: int, pipe: str, head: bytes = b"[", end: bytes = b"]", done=None) -> None:
    """Write head + the file's bytes + end into a named pipe (blocks until DuckDB opens it);
    then ``done(length)``."""
    try:
        out = os.open(pipe, os.O_WRONLY)
    except OSError:
        return
    try:
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


def _feed_part_file(part: str, pipe: str) -> None:
    """Feed a part file (already bracketed) into a named pipe, then delete it."""
    try:
        with open(part, "rb") as f:
            _feed_pipe(f.fileno(), 0, os.fstat(f.fileno()).st_size, pipe, b"", b"")
    finally:
        os.unlink(part)


def _gz_content_size(path: Path) -> int:
    """Estimated uncompressed size of a gzip file: the trailer's ISIZE (size mod 2**32 of the last
    member), unwrapped to at least twice the compressed size (trace JSON compresses 5-20x) and
    capped at 50x. Only sizes parts and pipes; a wrong guess costs speed, never rows."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            f.seek(max(0, size - 4))
            est = int.from_bytes(f.read(4), "little")
    except OSError:
        return size * 10
    while est < 2 * size:
        est += 1 << 32
    return min(est, 50 * size)


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


def _tmp_root(ctx: Context) -> str:
    if ctx.options.tmp_dir:
        return str(ctx.options.tmp_dir)
    shm = "/dev/shm"
    try:
        # at most two batches of parts (one being inserted, one being cut) exist at a time
        if os.path.isdir(shm) and shutil.disk_usage(shm).free > 4 * BATCH_BYTES:
            return shm
    except OSError:
        pass
    return tempfile.gettempdir()


class _Ingest:
    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.path = ctx.path
        self.header: dict = {}
        self.trailer: dict = {}
        self.kept = 0
        self.seen = 0
        self.drops: dict[str, list] = {}  # reason -> [first event index, count]
        self.status = "ok"
        self.notes: list[str] = []
        self.base_ns = 0
        self.carry = ""  # unparsed text after a failed part (a split event)
        self.carry_index = 0
        self.part_info: dict[str, tuple[bytes, str]] = {}  # part file -> (stripped separator, ts mode)
        self.max_abs_us = Decimal((1 << 63) - 1) / 1000
        self.oversize: int | None = None  # byte where an event over options.max_event_bytes starts

    # -- bookkeeping -------------------------------------------------------------------------
    def _drop(self, reason: str, index: int, n: int = 1) -> None:
        entry = self.drops.setdefault(reason, [index, 0])
        entry[1] += n
        self.seen += n

    # -- phase 1: header -----------------------------------------------------------------------
    def _find_events(self, s: _Stream) -> int:
        """Parse header keys; return the buffer index just after the '[' of the events array."""
        s.more(1 << 20)  # a first look; more comes as the header needs it
        if not s.buf:
            if s.error:
                raise InputError(
                    self.path, f"cannot read the compressed stream ({s.error})", hint="re-copy or re-compress the file"
                )
            raise InputError(
                self.path,
                "the file is empty; expected a Chrome trace (JSON object with 'traceEvents' or a JSON array of events)",
            )
        i = 3 if s.buf.startswith(b"\xef\xbb\xbf") else 0
        i = _skip_ws(s.buf, i)
        if i >= len(s.buf):
            raise InputError(self.path, "the file holds only whitespace; expected a Chrome trace")
        first = s.buf[i : i + 1]
        if first == b"[":
            return i + 1
        if first != b"{":
            raise InputError(
                self.path,
                f"expected a JSON object with 'traceEvents' or a JSON array of events, found {s.buf[i : i + 20]!r}",
                position="byte 0",
            )
        i += 1
        while True:
            i = _skip_ws(s.buf, i)
            while i >= len(s.buf) and s.more():
                i = _skip_ws(s.buf, i)
            c = s.buf[i : i + 1]
            if c == b"}" or not c:
                raise InputError(
                    self.path, "the JSON object has no 'traceEvents' list", hint="is this a Chrome/Kineto trace?"
                )
            if c == b",":
                i += 1
                continue
            try:
                key, i = _decode_at(s, i)
            except ValueError:
                key = None
            if not isinstance(key, str):
                raise InputError(self.path, "malformed header: expected a key string", position=f"byte {s.base + i}")
            i = _skip_ws(s.buf, i)
            if s.buf[i : i + 1] != b":":
                raise InputError(
                    self.path, f"malformed header after key {key!r}: expected ':'", position=f"byte {s.base + i}"
                )
            i = _skip_ws(s.buf, i + 1)
            while i >= len(s.buf) and s.more():
                i = _skip_ws(s.buf, i)
            if key == "traceEvents":
                if i >= len(s.buf):
                    raise InputError(
                        self.path,
                        "the file ends right after 'traceEvents' (file cut before any event)",
                        position=f"byte {s.base + i}",
                    )
                if s.buf[i : i + 1] != b"[":
                    raise InputError(self.path, "'traceEvents' is not a list", position=f"byte {s.base + i}")
                return i + 1
            try:
                value, i = _decode_at(s, i)
            except ValueError:
                raise InputError(
                    self.path, f"malformed header value for key {key!r}", position=f"byte {s.base + i}"
                ) from None
            self.header[key] = _clean(value)

    # -- phase 2: parts ---------------------------------------------------------------------------
    def _produce(self, s: _Stream, start: int, tmpdir: str, out: queue.Queue, stop: threading.Event) -> None:
        """Producer thread: cut the events array into part files of about the target size; put
        (path, (separator, ts_mode)) per part, then (None, tail_bytes) with the bytes after the
        last part; (None, exc) on error. ``separator`` is what was stripped from the end of the
        part (', ' and whitespace): when the cut was wrong (inside a string) the exact fallback
        needs those bytes back to rebuild the event split across two parts. Returns without a
        last item once ``stop`` is set."""
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
                with memoryview(buf) as mv, open(part, "wb") as f:
                    f.write(b"[")
                    f.write(mv[:end])
                    f.write(b"]")
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
            lo = max(0, hi - BOUNDARY_WINDOW)
            window = os.pread(fd, hi - lo, pos + lo) if hi else b""
            cut = _last_boundary(window, 0) if window else -1
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

    def _insert_plain(self, fd: int, parts: list[tuple[int, int, bytes, str]]) -> None:
        """Insert the parts of an uncompressed file: in ONE statement through named pipes when
        they can share one (no copy on disk, no per-statement cost), else as part files in
        batches, each batch (then each part) falling back to the exact path on its own."""
        modes = {p[3] for p in parts}
        if (
            1 < len(parts) <= MAX_PIPES
            and len(modes) == 1
            and "exact" not in modes
            and hasattr(os, "mkfifo")
            and self._insert_through_pipes(fd, parts)
        ):
            return
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

    def _insert_through_pipes(self, fd: int, parts: list[tuple[int, int, bytes, str]]) -> bool:
        """One INSERT over one named pipe per part, each fed from the file by its own thread
        (sendfile, in the kernel). False when DuckDB rejects some part: nothing was inserted."""
        pipes: list[str] = []
        feeders: list[threading.Thread] = []
        try:
            for i, (offset, length, _sep, _mode) in enumerate(parts):
                pipe = os.path.join(self.tmpdir, f"pipe{i:05d}.json")
                os.mkfifo(pipe)
                pipes.append(pipe)
                t = threading.Thread(
                    target=_feed_pipe,
                    args=(fd, offset, length, pipe),
                    kwargs={"done": self.ctx.read_bytes},
                    daemon=True,
                )
                t.start()
                feeders.append(t)
            try:
                n = self._insert_files(pipes, parts[0][3])
            except duckdb.Error:
                return False
            self.kept += n
            self.seen += n
            return True
        finally:
            for pipe, t in zip(pipes, feeders):
                _release_feeder(pipe, t)
            for pipe in pipes:
                os.unlink(pipe)

    def _insert_stream(self, s: _Stream, start: int, pipes: bool = True) -> bytes:
        """Insert a compressed file; returns the tail bytes after the last part.

        A producer thread decompresses and cuts part files while DuckDB inserts. The parts go in
        ONE INSERT over named pipes, each fed its part as the producer makes it: every further
        statement costs a rewrite of the table's row groups at checkpoint (4 statements on 300 MB:
        +0.55 s and a 90% larger database file). Parts beyond the pipes (the size estimate was
        short) go in waves after it. If DuckDB rejects the one statement, the file is decompressed
        again and inserted in waves, where each part falls back on its own."""
        cap = self._batch_parts()
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
            # Stop and reap the producer whatever happened here; drop the parts it left.
            stop.set()
            while producer.is_alive() or not parts.empty():
                try:
                    left, _info = parts.get(timeout=0.1)
                except queue.Empty:
                    continue
                if left is not None:
                    os.unlink(left)
            producer.join()
        if restart:
            again = _Stream(self.path)
            try:
                tail = self._insert_stream(again, self._find_events(again), pipes=False)
                s.error = again.error  # the first pass may have stopped before the damage
                return tail
            finally:
                again.close()
        assert end is not None  # set by the pipes or the waves when not restarting
        tail = end[1]
        if isinstance(tail, BaseException):
            raise tail
        return tail or b""

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

    def _part_target(self) -> int:
        """Part size: the configured maximum, but such that the file splits into statements of
        `_batch_parts()` parts of about BATCH_BYTES each: every DuckDB thread gets parts of its
        own (one part is parsed by one thread) and no statement ends with one thread idle."""
        opts = self.ctx.options
        size = self.path.stat().st_size
        if is_gzip(self.path):
            size = _gz_content_size(self.path)
        batches = max(1, -(-size // BATCH_BYTES))
        even = -(-size // (batches * self._batch_parts()))
        return max(1, max(min(opts.part_bytes, 4 << 20), min(opts.part_bytes, even)))

    def _batch_parts(self) -> int:
        return 2 * max(1, self.ctx.options.threads)

    def _insert_files(self, files: list[str], ts_type: str) -> int:
        params = {"sid": self.ctx.source_id, "base_ns": self.base_ns, "files": files}
        return scalar(self.ctx.con, _insert_sql(ts_type), params)

    def _insert_wave(self, files: list[str]) -> None:
        # Each INSERT is its own statement: a failed one leaves nothing behind (the file's rows
        # only become visible when the driver commits its `sources` row).
        modes = {f: self.part_info[f][1] for f in files}
        if not self.carry and len(set(modes.values())) == 1 and files and modes[files[0]] != "exact":
            try:
                n = self._insert_files(files, modes[files[0]])
                self.kept += n
                self.seen += n
                return
            except duckdb.Error:
                pass  # some part is bad: go part by part below; DuckDB rolled the statement back
        for f in files:
            if not self.carry and modes[f] != "exact":
                try:
                    n = self._insert_files([f], modes[f])
                    self.kept += n
                    self.seen += n
                    continue
                except duckdb.Error:
                    pass
            with open(f, "rb") as fh:
                raw = fh.read()[1:-1] + self.part_info[f][0]  # drop our '[' ']', restore ', '
            self._fallback(raw)

    # -- exact per-event path -------------------------------------------------------------------
    def _text(self, raw: bytes) -> str:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            if "invalid UTF-8 replaced by U+FFFD" not in self.notes:
                self.notes.append("invalid UTF-8 replaced by U+FFFD")
        if self.carry:
            text = self.carry + text
            self.carry = ""
        return text

    def _parse_events(self, text: str, final: bool) -> tuple[int, bool]:
        """Parse events one by one (stdlib json: NaN, big ints, exact ts text), insert the good
        ones and count the bad ones with a reason. A value that is still open where the text
        ends is carried to the next piece (not final) or is the truncated tail (final).
        Returns (index after the last consumed value, whether the array's ']' was found)."""
        good: list[str] = []
        i, n = 0, len(text)
        index = self.seen
        closed = False
        while True:
            while i < n and text[i] in " \t\r\n,":
                i += 1
            if i >= n:
                break
            if text[i] == "]":
                if final:
                    closed = True
                    i += 1
                    break
                # The array ends inside a part: a trailer so long that a '}, {' inside it was
                # taken for an event boundary. The rest is the trailer: parse it with the tail.
                self.carry = text[i:]
                self.carry_index = index
                i = n
                break
            try:
                ev, end = _DECODER.raw_decode(text, i)
                reason = None
            except json.JSONDecodeError:
                ev, reason = None, "event is not valid JSON"
            except RecursionError:
                ev, reason = None, "event nested too deeply"
            if reason is not None:
                end = _value_end(text, i)
                if end < 0:
                    # Still open at the end of the text: the first half of an event split by a
                    # wrong cut (the next part completes it), or the truncated tail.
                    if final:
                        self.status = "truncated"
                        self._drop("truncated tail (incomplete last event)", index)
                        i = n
                    else:
                        self.carry = text[i:]
                        self.carry_index = index
                        i = n
                    break
                self._drop(reason, index)
                index += 1
                i = max(end, i + 1)  # always move on, whatever the bytes are
                continue
            i = end
            row, why = _normalise(ev, self.max_abs_us)
            if row is None:
                self._drop(why, index)
            else:
                if why and why not in self.notes:
                    self.notes.append(why)
                good.append(row)
                self.seen += 1
            index += 1
        if good:
            fd, tmp = tempfile.mkstemp(suffix=".json", dir=self.tmpdir)
            with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
                f.write("[")
                f.write(",".join(good))
                f.write("]")
            self.kept += self._insert_files([tmp], "VARCHAR")  # _normalise writes ts as exact text
            os.unlink(tmp)
        return i, closed

    def _fallback(self, raw: bytes) -> None:
        """A part DuckDB rejected (or whose ts needs the exact path), event by event."""
        self._parse_events(self._text(raw), final=False)

    def _tail(self, tail: bytes, object_form: bool) -> None:
        """Parse the bytes after the last part: last events, ']', trailing keys, '}'."""
        had_carry = bool(self.carry)
        text = self._text(tail)
        k = 0 if had_carry else _complete_events_end(text)
        if k:
            # The complete events before the array's end go to DuckDB like a part (the exact
            # per-event path costs ~20 µs an event); what is left is the last event, ']', trailer.
            part = os.path.join(self.tmpdir, "tail.json")
            with open(part, "wb") as f:
                f.write(b"[")
                f.write(text[:k].encode("utf-8"))
                f.write(b"]")
            self.part_info[part] = (b"", _ts_mode(text[:SAMPLE_BYTES].encode("utf-8")))
            self._insert_wave([part])
            os.unlink(part)
            del self.part_info[part]
            text = text[k:]
        i, closed = self._parse_events(text, final=True)
        if not closed:
            if object_form:
                self.status = "truncated"
                self.notes.append("the tail was cut: the events array has no closing ']'")
            elif self.status != "truncated":
                self.notes.append("no closing ']' (allowed by the Chrome trace format)")
            return
        if object_form:
            self._trailer(text, i)

    def _trailer(self, text: str, i: int) -> None:
        n = len(text)
        while True:
            while i < n and text[i] in " \t\r\n,":
                i += 1
            if i >= n:
                self.notes.append("the tail was cut: the top-level object has no closing '}' (cut after the events)")
                if self.status == "ok":
                    self.status = "truncated"
                return
            if text[i] == "}":
                rest = text[i + 1 :].strip(" \t\r\n\x00")
                if rest:
                    # JSON allows nothing after the top-level value: say so instead of ignoring it
                    self.notes.append(
                        f"{len(rest.encode('utf-8'))} bytes after the closing '}}' "
                        f"ignored (starting {rest[:20]!r}): not part of the trace"
                    )
                return
            try:
                key, i = _DECODER.raw_decode(text, i)
                while i < n and text[i] in " \t\r\n":
                    i += 1
                if text[i : i + 1] != ":" or not isinstance(key, str):
                    raise json.JSONDecodeError("expected a key and ':'", text, i)
                i += 1
                while i < n and text[i] in " \t\r\n":
                    i += 1
                value, i = _DECODER.raw_decode(text, i)
            except (json.JSONDecodeError, RecursionError):
                self.notes.append("the tail was cut: trailing keys after the events are cut or malformed")
                if self.status == "ok":
                    self.status = "truncated"
                return
            if key == "traceEvents":
                # A second events list: JSON readers keep the last value of a repeated key, this
                # reader streamed the first. Neither is right to assume: count its events as dropped.
                lost = len(value) if isinstance(value, list) else 1
                self._drop("events of a second 'traceEvents' key (the first list was kept)", self.seen, lost)
                continue
            self.trailer[key] = _clean(value)

    # -- driver ----------------------------------------------------------------------------------
    def run(self) -> Outcome:
        ctx = self.ctx
        s = _Stream(self.path)
        self.tmpdir = str(tempspace.make_dir("part", _tmp_root(ctx)))
        try:
            start = self._find_events(s)
            object_form = s.buf[_skip_ws(s.buf, 3 if s.buf.startswith(b"\xef\xbb\xbf") else 0)] == 0x7B
            self.base_ns = _base_ns(self.header)
            # ts_ns = base + ts * 1000 must fit a BIGINT; larger ts are dropped as out of range.
            self.max_abs_us = Decimal((1 << 63) - 1 - abs(self.base_ns)) / 1000
            ctx.con.execute(f"SET threads = {max(1, ctx.options.threads)}")
            ctx.con.execute("SET preserve_insertion_order = false")
            # DuckDB keeps the blocks it writes cached up to its memory limit (80% of RAM by
            # default): without a cap a 2 GB trace peaked at 1.1 GB RSS, with 512 MB at ~0.65 GB.
            ctx.con.execute(f"SET memory_limit = '{ctx.options.memory_limit}'")
            if s.gz:
                tail = self._insert_stream(s, start)
            else:
                fd = s.f.fileno()
                size = os.fstat(fd).st_size
                plain_parts, tail_at = self._plain_parts(fd, s.base + start, size)
                self._insert_plain(fd, plain_parts)
                tail = os.pread(fd, size - tail_at, tail_at) if self.oversize is None else b""
            store.fault_point("parts")  # crash tests: the temp folder exists here
            # Trailer keys can change the time base only if they come after the events
            # (on-demand Kineto): re-base what was inserted.
            if self.oversize is None:
                self._tail(tail or b"", object_form)
            else:
                self.carry = ""
                self.status = "truncated"
                self.notes.append(
                    f"no event boundary within {self.ctx.options.max_event_bytes >> 20} MB after byte "
                    f"{self.oversize} (one event or value that large, or a run of padding): the file "
                    "was read up to there; SLOWCARD_MAX_EVENT_MB raises the limit"
                )
            if s.error:
                self.status = "truncated"
                self.notes.append(f"{s.error}; kept what decompressed")
            new_base = _base_ns({**self.header, **self.trailer})
            if new_base != self.base_ns:
                ctx.con.execute(
                    "UPDATE event_rows SET ts_ns = ts_ns + $d WHERE source_id = $sid",
                    {"d": new_base - self.base_ns, "sid": ctx.source_id},
                )
                self.base_ns = new_base
        finally:
            s.close()
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        if self.carry:
            self._drop("truncated tail (incomplete last event)", self.carry_index)
            self.status = "truncated"
            self.carry = ""
        if self.seen == 0 and self.kept == 0 and self.status == "ok":
            self.notes.append("the trace holds no events")
        dropped = sum(c for _, c in self.drops.values())
        if dropped and self.status == "ok":
            self.status = "salvaged"
        meta = {**self.header, **self.trailer}
        msg_parts = list(self.notes)
        if dropped or self.status != "ok":
            # Whatever went wrong, say first how many events made it (a truncated file may have
            # lost no complete event and still must say how many it kept).
            head = f"kept {self.kept} events"
            if dropped:
                reasons = ", ".join(f"{c} {r} (first at event {i})" for r, (i, c) in self.drops.items())
                head += f", dropped {dropped}: {reasons}"
            msg_parts.insert(0, head)
        return Outcome(
            rows_seen=self.kept + dropped,
            rows_kept=self.kept,
            rows_dropped=dropped,
            status=self.status,
            message="; ".join(msg_parts),
            drops=[(r, f"event {i}", c) for r, (i, c) in self.drops.items()],
            metadata=meta,
            rank_hints=_rank_hints(meta),
            base_time_ns=self.base_ns,
        )


_BOUNDARY = re.compile(r"\}\s*,\s*\{")
_SEPARATOR = re.compile(r"[ \t\r\n,]*")
_SCANNER = json.JSONDecoder()


def _complete_events_end(text: str) -> int:
    """Index just after the last of the leading events of ``text`` (the tail of the events array)
    that are valid JSON objects followed by more events; 0 when there are none. Only finds where
    values end: the events themselves are judged by DuckDB (or the exact path)."""
    i = last = 0
    n = len(text)
    while True:
        sep = _SEPARATOR.match(text, i)
        assert sep is not None  # the pattern matches the empty string
        i = sep.end()
        if i >= n or text[i] != "{":
            return last
        try:
            _, end = _SCANNER.raw_decode(text, i)
        except (json.JSONDecodeError, RecursionError):
            return last
        i = last = end


def _next_boundary(text: str, i: int) -> int:
    m = _BOUNDARY.search(text, i)
    return m.end() - 1 if m else -1


def _base_ns(meta: dict) -> int:
    v = meta.get("baseTimeNanoseconds")
    try:
        base = int(v) if v is not None else 0
    except (TypeError, ValueError, OverflowError):  # Infinity, NaN, a string, a list
        return 0
    # Outside int64 it cannot be stored nor added to a ts: treated like any other unusable value.
    return base if -(1 << 63) <= base < (1 << 63) else 0


def _rank_hints(meta: dict) -> dict:
    hints: dict = {}
    di = meta.get("distributedInfo")
    if isinstance(di, dict):
        # type() not isinstance(): JSON true is a Python int, and must not become rank 1 (issue 16);
        # values outside INTEGER would fail the file's commit instead of being ignored.
        if type(di.get("rank")) is int and 0 <= di["rank"] < (1 << 31):
            hints["rank"] = di["rank"]
        if type(di.get("world_size")) is int and 0 < di["world_size"] < (1 << 31):
            hints["world_size"] = di["world_size"]
    if isinstance(meta.get("host_name"), str):
        hints["host"] = meta["host_name"]
    return hints


_ONE = Decimal(1)
_ENC = json.JSONEncoder(ensure_ascii=False, allow_nan=False)  # built once: json.dumps(**kw) is slow
_ENC_NAN = json.JSONEncoder(ensure_ascii=False)
_SURROGATE_NOTE = "lone UTF-16 surrogate escapes replaced by '?'"
_MS = Decimal("0.001")

# Tokens that decide where a JSON value ends: whole strings (an unterminated one is a lone '"'),
# brackets and top-level commas.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|["{}\[\],]')
_CLOSE = {"}": "{", "]": "["}


def _value_end(text: str, i: int) -> int:
    """Index just after the JSON value that starts at text[i], found by matching brackets and
    strings only (the value itself may be invalid JSON); -1 when the text ends inside it.

    This is what makes the exact path safe against wrong cuts: an event split inside a string or
    a nested object is recognised as unfinished (carried to the next part), never resynchronised
    on a '}, {' that lies inside it."""
    stack: list[str] = []
    for m in _TOKEN.finditer(text, i):
        tok = m.group()
        if tok == '"':
            return -1  # a string that never closes
        c = tok[0]
        if c == '"':
            continue
        if c in "{[":
            stack.append(c)
        elif c == ",":
            if not stack:
                return m.start()  # end of a bare scalar / garbage value
        else:
            if not stack or stack[-1] != _CLOSE[c]:
                # Mismatched brackets: the value is broken; resume at the next event boundary.
                nxt = _next_boundary(text, m.start())
                return nxt if nxt >= 0 else (-1 if stack else m.start())
            stack.pop()
            if not stack:
                return m.end()
    return -1


def _clean(v):
    """Header values as plain text: undecodable bytes and lone surrogates become U+FFFD / '?'."""
    if isinstance(v, str):
        return v.encode("utf-8", errors="replace").decode("utf-8", errors="replace")
    if isinstance(v, dict):
        return {_clean(k): _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def _normalise(ev, max_abs_us: Decimal = Decimal(9223372036854775)) -> tuple[str | None, str]:
    """One event as clean JSON text for DuckDB, or (None, reason) when it cannot be kept."""
    if not isinstance(ev, dict):
        return None, "event is not an object"
    out: dict[str, object] = {}
    for key in ("ph", "cat", "name", "pid", "tid", "id"):
        v = ev.get(key)
        if v is not None:
            # as DuckDB's VARCHAR column shows a non-string value: its JSON text
            out[key] = v if isinstance(v, str) else (str(v) if type(v) is int else _ENC_NAN.encode(v))
    ts = ev.get("ts")
    if ts is not None:
        if isinstance(ts, bool):
            return None, "ts is not a number"
        try:
            # A fractional number keeps its original text (_Num): no double rounding here.
            d = Decimal(ts.text if isinstance(ts, _Num) else str(ts).strip())
        except InvalidOperation:
            return None, "ts is not a number"
        if not d.is_finite() or abs(d) > max_abs_us:
            return None, "ts is out of range"
        # Same rounding as DuckDB (half away from zero) for digits beyond the nanosecond.
        out["ts"] = str(d.quantize(_MS, ROUND_HALF_UP))
    dur = ev.get("dur")
    if dur is not None:
        try:
            f = float(dur) if not isinstance(dur, bool) else math.nan
        except (TypeError, ValueError):
            return None, "dur is not a number"
        if not math.isfinite(f) or abs(f) > 1e15:
            return None, "dur is not a finite number"
        out["dur"] = f
    if "args" in ev:
        out["args"] = ev["args"]
    try:
        try:
            text = _ENC.encode(out)
        except ValueError:
            text = _ENC.encode(_no_nan(out))
    except RecursionError:
        return None, "event nested too deeply"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (from "\ud800" escapes) cannot be written as UTF-8: replace them.
        return text.encode("utf-8", errors="replace").decode("utf-8"), _SURROGATE_NOTE
    return text, ""


def _no_nan(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _no_nan(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_no_nan(x) for x in v]
    return v
