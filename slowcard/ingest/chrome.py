"""Chrome-trace JSON (Kineto object form, Ascend trace_view.json, msServiceProfiler chrome_tracing.json).

Python never parses the bulk of the events. It finds where the ``traceEvents`` array starts (parsing
the header keys exactly), cuts the array at event boundaries into parts of ~64 MB, writes each part
as ``[`` + bytes + ``]`` to a temporary file and lets DuckDB's JSON reader parse waves of parts in
parallel (see ../shared/docs/ingest_perf.md). The last few events, the closing bracket and the
trailing keys (on-demand Kineto writes ``distributedInfo`` AFTER the events) are parsed exactly in
Python, which is also how a truncated file is salvaged. A part that DuckDB rejects (a boundary cut
inside a string, invalid UTF-8, a value of the wrong type) is re-parsed event by event in Python:
good events are kept, bad ones are counted with their event index and reason.

Memory stays bounded by (threads + 2) parts, whatever the file size.
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
from decimal import Decimal, InvalidOperation
from pathlib import Path

import duckdb

from ..errors import InputError
from .base import Context, Outcome, open_bytes, strip_bom

READ_BYTES = 8 << 20
HEADER_LIMIT = 64 << 20      # header keys before traceEvents larger than this are not a trace
_WS = b" \t\r\n"
_DECODER = json.JSONDecoder()

# The columns DuckDB reads from every event; anything else in an event is ignored.
# ts is parsed as DECIMAL, never DOUBLE: at epoch scale (~1.7e15 us) a DOUBLE has 0.25 us steps.
# DECIMAL(18,3) (int64 inside) parses as fast as DOUBLE and holds |ts| < 1e15 us, which covers
# Kineto's ts relative to baseTimeNanoseconds; absolute epoch ts and Ascend's string ts need
# DECIMAL(20,3) (about 40 % slower). The first event decides; a wave that overflows is retried wide.
_COLUMNS = (
    "{{ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'VARCHAR', tid: 'VARCHAR', "
    "ts: '{ts_type}', dur: 'DOUBLE', id: 'VARCHAR', args: 'JSON'}}"
)
_TS_NS = {
    "DECIMAL(18,3)": "CAST(trunc(ts) AS BIGINT) * 1000 + CAST((ts - trunc(ts)) * 1000 AS BIGINT)",
    "DECIMAL(20,3)": "CAST(ts * 1000 AS BIGINT)",
}
_INSERT = (
    "INSERT INTO event_rows SELECT $sid, ph, cat, name, pid, tid, {ts_ns} + $base_ns, "
    "CAST(round(dur * 1000) AS BIGINT), id, args "
    "FROM read_json($files, format = 'array', columns = {columns}, maximum_object_size = 268435456)"
)
_FIRST_TS = re.compile(rb'"ts"\s*:\s*("?)(-?[0-9][0-9.eE+-]*)')


def _insert_sql(ts_type: str) -> str:
    return _INSERT.format(ts_ns=_TS_NS[ts_type], columns=_COLUMNS.format(ts_type=ts_type))


def _choose_ts_type(sample: bytes) -> str:
    m = _FIRST_TS.search(sample)
    if not m or m.group(1):
        return "DECIMAL(20,3)"
    try:
        return "DECIMAL(18,3)" if abs(float(m.group(2))) < 9e14 else "DECIMAL(20,3)"
    except ValueError:
        return "DECIMAL(20,3)"


class ChromeReader:
    """Reader for the three Chrome-trace dialects."""

    name = "chrome"

    def sniff(self, path: Path, head: bytes) -> str | None:
        h = strip_bom(head).lstrip(_WS)
        if h.startswith(b"{"):
            if any(k in head for k in (b'"traceEvents"', b'"schemaVersion"', b'"displayTimeUnit"',
                                       b'"deviceProperties"', b'"distributedInfo"')):
                return "kineto"
            return None
        if h.startswith(b"["):
            body = h[1:].lstrip(_WS)
            if not (body.startswith(b"{") or body.startswith(b"]") or not body):
                return None
            if b'"ph"' not in head and body and not body.startswith(b"]"):
                return None
            if re.search(rb'"ts"\s*:\s*"', head):
                return "ascend_trace"
            if (b'"process_labels"' in head or b"KVCache" in head or b"batchFrameworkProcessing" in head
                    or re.search(rb'"tid"\s*:\s*"(Schedule|Request|Execute|KVCache)', head)):
                return "service_trace"
            return "chrome_array"
        return None

    def ingest(self, ctx: Context) -> Outcome:
        return _Ingest(ctx).run()


READER = ChromeReader()


class _Stream:
    """A byte window over the (decompressed) file: ``buf`` holds bytes from offset ``base``."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.f = open_bytes(path)
        except OSError as exc:
            raise InputError(path, f"cannot open the file ({exc})") from None
        self.buf = b""
        self.base = 0
        self.eof = False

    def more(self, n: int = READ_BYTES) -> bool:
        """Append up to n bytes; False at end of file."""
        if self.eof:
            return False
        try:
            data = self.f.read(n)
        except (OSError, EOFError) as exc:
            # A corrupt or cut gzip stream: keep what was decompressed and treat it as the end.
            self.eof = True
            self.error = str(exc) or type(exc).__name__
            return False
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def drop(self, upto: int) -> None:
        """Forget buffered bytes before index ``upto``."""
        self.buf = self.buf[upto:]
        self.base += upto

    def close(self):
        self.f.close()

    error: str | None = None


def _skip_ws(buf: bytes, i: int) -> int:
    n = len(buf)
    while i < n and buf[i] in _WS:
        i += 1
    return i


def _decode_at(stream: _Stream, i: int):
    """Decode one JSON value starting at byte i of the buffer, reading more as needed.

    Returns (value, end_index). Raises ValueError when the bytes there are not JSON.
    """
    while True:
        text = stream.buf[i:].decode("utf-8", errors="replace")
        try:
            value, end = _DECODER.raw_decode(text)
            return value, i + len(text[:end].encode("utf-8"))
        except json.JSONDecodeError:
            if len(stream.buf) - i > HEADER_LIMIT or not stream.more():
                raise ValueError("not a JSON value") from None


def _last_boundary(buf: bytes, lo: int) -> int:
    """Index of the '{' that starts the last event in buf[lo:] preceded by '}' ',' (with
    whitespace between), or -1. A cut found here may fall inside a string; DuckDB then rejects
    the part and the exact fallback repairs it."""
    j = len(buf)
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


def _tmp_root(ctx: Context) -> str:
    if ctx.options.tmp_dir:
        return str(ctx.options.tmp_dir)
    shm = "/dev/shm"
    try:
        if os.path.isdir(shm) and shutil.disk_usage(shm).free > 4 * ctx.options.part_bytes * (ctx.options.threads + 2):
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
        self.drops: dict[str, list] = {}     # reason -> [first event index, count]
        self.status = "ok"
        self.notes: list[str] = []
        self.base_ns = 0
        self.carry = ""                       # unparsed text after a failed part (a split event)
        self.carry_index = 0
        self.ts_type: str | None = None

    # -- bookkeeping -------------------------------------------------------------------------
    def _drop(self, reason: str, index: int, n: int = 1) -> None:
        entry = self.drops.setdefault(reason, [index, 0])
        entry[1] += n
        self.seen += n

    # -- phase 1: header -----------------------------------------------------------------------
    def _find_events(self, s: _Stream) -> int:
        """Parse header keys; return the buffer index just after the '[' of the events array."""
        s.more()
        if not s.buf:
            if s.error:
                raise InputError(self.path, f"cannot read the compressed stream ({s.error})",
                                 hint="re-copy or re-compress the file")
            raise InputError(self.path, "the file is empty; expected a Chrome trace (JSON object with "
                             "'traceEvents' or a JSON array of events)")
        i = 3 if s.buf.startswith(b"\xef\xbb\xbf") else 0
        i = _skip_ws(s.buf, i)
        if i >= len(s.buf):
            raise InputError(self.path, "the file holds only whitespace; expected a Chrome trace")
        first = s.buf[i:i + 1]
        if first == b"[":
            return i + 1
        if first != b"{":
            raise InputError(self.path, "expected a JSON object with 'traceEvents' or a JSON array of "
                             f"events, found {s.buf[i:i + 20]!r}", position="byte 0")
        i += 1
        while True:
            i = _skip_ws(s.buf, i)
            while i >= len(s.buf) and s.more():
                i = _skip_ws(s.buf, i)
            c = s.buf[i:i + 1]
            if c == b"}" or not c:
                raise InputError(self.path, "the JSON object has no 'traceEvents' list",
                                 hint="is this a Chrome/Kineto trace?")
            if c == b",":
                i += 1
                continue
            try:
                key, i = _decode_at(s, i)
            except ValueError:
                raise InputError(self.path, "malformed header: expected a key string",
                                 position=f"byte {s.base + i}") from None
            i = _skip_ws(s.buf, i)
            if s.buf[i:i + 1] != b":":
                raise InputError(self.path, f"malformed header after key {key!r}: expected ':'",
                                 position=f"byte {s.base + i}")
            i = _skip_ws(s.buf, i + 1)
            while i >= len(s.buf) and s.more():
                i = _skip_ws(s.buf, i)
            if key == "traceEvents":
                if s.buf[i:i + 1] != b"[":
                    raise InputError(self.path, "'traceEvents' is not a list", position=f"byte {s.base + i}")
                return i + 1
            try:
                value, i = _decode_at(s, i)
            except ValueError:
                raise InputError(self.path, f"malformed header value for key {key!r}",
                                 position=f"byte {s.base + i}") from None
            self.header[key] = value

    # -- phase 2: parts ---------------------------------------------------------------------------
    def _produce(self, s: _Stream, start: int, tmpdir: str, out: queue.Queue) -> None:
        """Producer thread: cut the events array into part files; put (path, None) per part,
        then (None, tail_bytes) with the bytes after the last boundary; (None, exc) on error."""
        try:
            s.drop(start)
            target = self._part_target()
            n = 0
            while True:
                while len(s.buf) < target and s.more():
                    pass
                cut = _last_boundary(s.buf, max(0, len(s.buf) - (4 << 20))) if s.buf else -1
                if cut < 0 and len(s.buf) > (4 << 20):
                    cut = _last_boundary(s.buf, 0)
                if cut <= 0:
                    if s.eof:
                        break
                    target += self.ctx.options.part_bytes     # one huge event: read further
                    continue
                part = os.path.join(tmpdir, f"part{n:05d}.json")
                with open(part, "wb") as f:
                    f.write(b"[")
                    f.write(memoryview(s.buf)[:cut].tobytes().rstrip(_WS).rstrip(b",").rstrip(_WS))
                    f.write(b"]")
                n += 1
                s.drop(cut)
                out.put((part, None))
                if s.eof and len(s.buf) < (4 << 20):
                    break
            out.put((None, s.buf))
        except BaseException as exc:  # handed to the consumer, which re-raises it
            out.put((None, exc))

    def _part_target(self) -> int:
        """Part size: the configured maximum, but small enough that a mid-size file still gives
        every DuckDB thread a part of its own (one part is parsed by one thread)."""
        opts = self.ctx.options
        size = self.path.stat().st_size
        if self.path.suffix == ".gz":
            size *= 10          # typical compression ratio of trace JSON
        per_thread = size // (2 * max(1, opts.threads))
        return max(min(opts.part_bytes, 4 << 20), min(opts.part_bytes, per_thread))

    def _insert_files(self, files: list[str]) -> int:
        if self.ts_type is None:
            with open(files[0], "rb") as f:
                self.ts_type = _choose_ts_type(f.read(1 << 16))
        params = {"sid": self.ctx.source_id, "base_ns": self.base_ns, "files": files}
        try:
            return self.ctx.con.execute(_insert_sql(self.ts_type), params).fetchone()[0]
        except duckdb.Error:
            if self.ts_type == "DECIMAL(20,3)":
                raise
            # Maybe a ts beyond the narrow type (or a string ts) later in the file: widen for good.
            self.ts_type = "DECIMAL(20,3)"
            return self.ctx.con.execute(_insert_sql(self.ts_type), params).fetchone()[0]

    def _insert_wave(self, files: list[str]) -> None:
        # Each INSERT is its own statement: a failed one leaves nothing behind (the file's rows
        # only become visible when the driver commits its `sources` row).
        if not self.carry:
            try:
                n = self._insert_files(files)
                self.kept += n
                self.seen += n
                return
            except duckdb.Error:
                pass   # some part is bad: go part by part below; DuckDB rolled the statement back
        for f in files:
            if not self.carry:
                try:
                    n = self._insert_files([f])
                    self.kept += n
                    self.seen += n
                    continue
                except duckdb.Error:
                    pass
            with open(f, "rb") as fh:
                raw = fh.read()[1:-1]          # drop the '[' and ']' we added
            self._fallback(raw, final=False)

    # -- exact per-event path -------------------------------------------------------------------
    def _fallback(self, raw: bytes, final: bool) -> tuple[int, str]:
        """Parse events one by one (stdlib json: NaN, big ints and bad UTF-8 survive), keep the
        good ones, count the bad ones. Returns (index after last consumed char, text)."""
        text = raw.decode("utf-8", errors="replace")
        if "\ufffd" in text and "invalid UTF-8 replaced" not in self.notes:
            self.notes.append("invalid UTF-8 replaced")
        if self.carry:
            text = self.carry + text
            self.carry = ""
        good: list[str] = []
        i, n = 0, len(text)
        index = self.seen
        while True:
            while i < n and text[i] in " \t\r\n,":
                i += 1
            if i >= n or text[i] == "]":
                break
            try:
                ev, end = _DECODER.raw_decode(text, i)
            except json.JSONDecodeError:
                nxt = _next_boundary(text, i + 1)
                if nxt < 0:
                    # The rest does not parse: either the first half of an event split by a bad
                    # cut (the next part completes it) or a truncated tail.
                    self.carry = text[i:]
                    self.carry_index = index
                    break
                self._drop("event is not valid JSON", index)
                index += 1
                i = nxt
                continue
            i = end
            row, reason = _normalise(ev)
            if row is None:
                self._drop(reason, index)
            else:
                good.append(row)
                self.seen += 1
            index += 1
        if good:
            fd, tmp = tempfile.mkstemp(suffix=".json", dir=self.tmpdir)
            with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
                f.write("[")
                f.write(",".join(good))
                f.write("]")
            n_ins = self._insert_files([tmp])
            self.kept += n_ins
            os.unlink(tmp)
        return i, text

    def _tail(self, tail: bytes, object_form: bool) -> None:
        """Parse the bytes after the last part: last events, ']', trailing keys, '}'."""
        text = tail.decode("utf-8", errors="replace")
        if self.carry:
            text = self.carry + text
            self.carry = ""
        good = []
        i, n = 0, len(text)
        index = self.seen
        closed = False
        while True:
            while i < n and text[i] in " \t\r\n,":
                i += 1
            if i >= n:
                break
            if text[i] == "]":
                closed = True
                i += 1
                break
            try:
                ev, end = _DECODER.raw_decode(text, i)
            except json.JSONDecodeError:
                nxt = _next_boundary(text, i + 1)
                if nxt < 0:
                    self.status = "truncated"
                    self._drop("truncated tail (incomplete last event)", index)
                    i = n
                    break
                self._drop("event is not valid JSON", index)
                index += 1
                i = nxt
                continue
            i = end
            row, reason = _normalise(ev)
            if row is None:
                self._drop(reason, index)
            else:
                good.append(row)
                self.seen += 1
            index += 1
        if good:
            fd, tmp = tempfile.mkstemp(suffix=".json", dir=self.tmpdir)
            with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
                f.write("[" + ",".join(good) + "]")
            self.kept += self._insert_files([tmp])
            os.unlink(tmp)
        if not closed:
            if object_form:
                self.status = "truncated"
                self.notes.append("the events array has no closing ']' (file cut)")
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
                self.notes.append("the top-level object has no closing '}' (file cut after the events)")
                if self.status == "ok":
                    self.status = "truncated"
                return
            if text[i] == "}":
                return
            try:
                key, i = _DECODER.raw_decode(text, i)
                while i < n and text[i] in " \t\r\n":
                    i += 1
                if text[i:i + 1] != ":":
                    raise json.JSONDecodeError("expected ':'", text, i)
                i += 1
                while i < n and text[i] in " \t\r\n":
                    i += 1
                value, i = _DECODER.raw_decode(text, i)
            except json.JSONDecodeError:
                self.notes.append("trailing keys after the events are cut or malformed")
                if self.status == "ok":
                    self.status = "truncated"
                return
            self.trailer[key] = value

    # -- driver ----------------------------------------------------------------------------------
    def run(self) -> Outcome:
        ctx = self.ctx
        s = _Stream(self.path)
        self.tmpdir = tempfile.mkdtemp(prefix="slowcard-", dir=_tmp_root(ctx))
        try:
            start = self._find_events(s)
            object_form = s.buf[_skip_ws(s.buf, 3 if s.buf.startswith(b"\xef\xbb\xbf") else 0)] == 0x7B
            self.base_ns = _base_ns(self.header)
            ctx.con.execute(f"SET threads = {max(1, ctx.options.threads)}")
            ctx.con.execute("SET preserve_insertion_order = false")
            parts: queue.Queue = queue.Queue(maxsize=max(1, ctx.options.threads))
            producer = threading.Thread(target=self._produce, args=(s, start, self.tmpdir, parts),
                                        daemon=True)
            producer.start()
            wave: list[str] = []
            tail: bytes | BaseException | None = None
            try:
                while True:
                    path, payload = parts.get()
                    if path is None:
                        tail = payload
                        break
                    wave.append(path)
                    if len(wave) >= max(1, ctx.options.threads):
                        self._insert_wave(wave)
                        for p in wave:
                            os.unlink(p)
                        wave = []
                if wave:
                    self._insert_wave(wave)
                    for p in wave:
                        os.unlink(p)
            finally:
                # Unblock and reap the producer whatever happened here.
                while producer.is_alive():
                    try:
                        parts.get(timeout=0.1)
                    except queue.Empty:
                        pass
                producer.join()
            if isinstance(tail, BaseException):
                raise tail
            # Trailer keys can change the time base only if they come after the events
            # (on-demand Kineto): re-base what was inserted.
            self._tail(tail or b"", object_form)
            if s.error:
                self.status = "truncated"
                self.notes.append(f"compressed stream is cut or corrupt ({s.error}); kept what decompressed")
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
        if dropped:
            reasons = ", ".join(f"{c} {r} (first at event {i})" for r, (i, c) in self.drops.items())
            msg_parts.insert(0, f"kept {self.kept} events, dropped {dropped}: {reasons}")
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


def _next_boundary(text: str, i: int) -> int:
    m = _BOUNDARY.search(text, i)
    return m.end() - 1 if m else -1


def _base_ns(meta: dict) -> int:
    v = meta.get("baseTimeNanoseconds")
    try:
        return int(v) if v is not None else 0
    except (TypeError, ValueError):
        return 0


def _rank_hints(meta: dict) -> dict:
    hints: dict = {}
    di = meta.get("distributedInfo")
    if isinstance(di, dict):
        if isinstance(di.get("rank"), int):
            hints["rank"] = di["rank"]
        if isinstance(di.get("world_size"), int):
            hints["world_size"] = di["world_size"]
    if isinstance(meta.get("host_name"), str):
        hints["host"] = meta["host_name"]
    return hints


_MAX_TS_US = Decimal("99999999999999999")   # DECIMAL(20,3) holds 17 integer digits


def _normalise(ev) -> tuple[str | None, str]:
    """One event as clean JSON text for DuckDB, or (None, reason) when it cannot be kept."""
    if not isinstance(ev, dict):
        return None, "event is not an object"
    out = {}
    for key in ("ph", "cat", "name", "pid", "tid", "id"):
        v = ev.get(key)
        if v is not None:
            out[key] = v if isinstance(v, str) else json.dumps(v)
    ts = ev.get("ts")
    if ts is not None:
        if isinstance(ts, bool):
            return None, "ts is not a number"
        try:
            d = Decimal(str(ts).strip())
        except InvalidOperation:
            return None, "ts is not a number"
        if not d.is_finite() or abs(d) > _MAX_TS_US:
            return None, "ts is out of range"
        out["ts"] = str(d.quantize(Decimal("0.001")))
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
        text = json.dumps(out, ensure_ascii=False, allow_nan=False)
    except ValueError:
        text = json.dumps(_no_nan(out), ensure_ascii=False)
    # Lone surrogates (from "\ud800" escapes) cannot be written as UTF-8: replace them.
    return text.encode("utf-8", errors="replace").decode("utf-8"), ""


def _no_nan(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _no_nan(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_no_nan(x) for x in v]
    return v
