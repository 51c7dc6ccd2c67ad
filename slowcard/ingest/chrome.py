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

One module per phase, each a layer of the one ingest object (``_Ingest`` below is the driver):
``chrome_state`` (what a file's ingest holds, the INSERT every path uses) < ``chrome_header`` (header
and trailer keys) < ``chrome_exact`` (the exact per-event path, waves with per-part fallback, the
tail) < ``chrome_parts`` (cutting the array into parts, one statement over pipes); with the plain
helpers ``chrome_pipes`` (the byte stream, boundaries, named pipes) and ``chrome_ts`` (how ts and
dur are read exactly).
"""

from __future__ import annotations

import os
import re
import shutil
from decimal import Decimal
from pathlib import Path

from .. import store, tempspace
from .base import Context, Outcome, strip_bom
from .chrome_header import _base_ns, _rank_hints, _skip_ws
from .chrome_parts import _PartsPhase, _tmp_root
from .chrome_pipes import _WS, _Stream

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


class _Ingest(_PartsPhase):
    """One trace file's ingest: header, parts, exact path, trailer (the phases, one module each)."""

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
            if ctx.shared is None or ctx.shared.configure():  # global settings: once per batch
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
                s.drop(len(s.buf))  # the header's window: not held while the parts go in
                tail = os.pread(fd, size - tail_at, tail_at) if self.oversize is None else b""
                tail = self._insert_plain(fd, plain_parts, tail_at, tail)
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
