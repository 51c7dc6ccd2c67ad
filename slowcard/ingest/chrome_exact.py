"""The exact per-event path: a part DuckDB rejected (a cut inside a string, invalid UTF-8, a value
of the wrong type), the tail after the last part, and ts texts a double cannot hold are parsed
event by event in Python; good events are inserted, bad ones counted with their index and reason.
Part of the Chrome-trace reader (slowcard/ingest/chrome.py)."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

import duckdb

from .chrome_header import _HeaderPhase
from .chrome_ts import _DECODER, SAMPLE_BYTES, _Num, _ts_mode

_BOUNDARY = re.compile(r"\}\s*,\s*\{")

_SEPARATOR = re.compile(r"[ \t\r\n,]*")

_SCANNER = json.JSONDecoder()

_ENC = json.JSONEncoder(ensure_ascii=False, allow_nan=False)  # built once: json.dumps(**kw) is slow

_ENC_NAN = json.JSONEncoder(ensure_ascii=False)

_SURROGATE_NOTE = "lone UTF-16 surrogate escapes replaced by '?'"

_MS = Decimal("0.001")

# Tokens that decide where a JSON value ends: whole strings (an unterminated one is a lone '"'),
# brackets and top-level commas.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|["{}\[\],]')

_CLOSE = {"}": "{", "]": "["}


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


class _ExactPhase(_HeaderPhase):
    """Parts inserted in waves, each falling back to the exact per-event path on its own; the tail."""

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
