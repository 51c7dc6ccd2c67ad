"""Phase 1 of a trace's ingest: the header keys before ``traceEvents`` (parsed exactly, read as
needed), where the events array starts, and the trailing keys after it (on-demand Kineto writes
``distributedInfo`` after the events); the time base and rank hints they give. Part of the
Chrome-trace reader (slowcard/ingest/chrome.py)."""

from __future__ import annotations

import json

from ..errors import InputError
from .chrome_pipes import _WS, _Stream
from .chrome_state import _IngestState
from .chrome_ts import _DECODER

HEADER_LIMIT = 64 << 20  # header keys before traceEvents larger than this are not a trace


def _skip_ws(buf: bytes | bytearray, i: int) -> int:
    n = len(buf)
    while i < n and buf[i] in _WS:
        i += 1
    return i


def _decode_at(stream: _Stream, i: int):
    """Decode one JSON value starting at byte i of the buffer, reading more as needed.

    Returns (value, end_index). Raises ValueError when the bytes there are not JSON.
    """
    # decode a window, not the whole buffer, for every header key; most keys and values are a few
    # bytes, and a small first window keeps a small file's header cheap (it grows 4x per retry)
    span = 1 << 12
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


def _clean(v):
    """Header values as plain text: undecodable bytes and lone surrogates become U+FFFD / '?'."""
    if isinstance(v, str):
        return v.encode("utf-8", errors="replace").decode("utf-8", errors="replace")
    if isinstance(v, dict):
        return {_clean(k): _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


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


class _HeaderPhase(_IngestState):
    """Header and trailer keys of the file."""

    def _find_events(self, s: _Stream) -> int:
        """Parse header keys; return the buffer index just after the '[' of the events array."""
        s.more(1 << 16)  # a first look; more comes as the header needs it
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
