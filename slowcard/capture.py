"""Capture on alert: from a live alert to the profiled slow card (issue 29).

When a watched verdict turns FAIL (or on demand), a *capture* starts the service's profiler,
keeps it running for a window, stops it, waits until the files it wrote are complete, ingests
them as a new run, diagnoses that run and keeps the outcome in the ``captures`` table beside the
alert that caused it. Three backends:

- ``VllmBackend``: vLLM's (and vLLM-Ascend's) HTTP ``POST /start_profile`` / ``/stop_profile``;
  the server writes torch / torch_npu profiler output into the directory it was started with
  (``--profiler-config``'s ``torch_profiler_dir``, formerly ``VLLM_TORCH_PROFILER_DIR``), which
  the user names (``--capture-dir``): the capture takes the files that appeared or changed there.
- ``MsServiceProfilerBackend``: msServiceProfiler's dynamic switch, ``"enable": 1`` / ``0`` in the
  JSON named by ``SERVICE_PROF_CONFIG_PATH``; output lands under its ``prof_dir``; when the
  ``msserviceprofiler`` executable is on PATH its ``parse`` step runs on the new files first.
- ``ExecBackend``: user commands for start and stop (any other stack), output in a given folder.

Limits: one capture at a time, a cool-down between two, a size cap on what is ingested; a
capture that fails or times out is recorded with its reason and never stops the watch (it runs
in a thread of its own; the database is shared with the watcher through ``db_lock``).

Library code: never prints or exits; the CLI (slowcard/cli_watch.py) prints what it returns.
"""

from __future__ import annotations

import gzip
import json
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import store

BACKENDS = ("vllm", "msserviceprofiler", "exec")
STATUSES = ("running", "ok", "failed", "timeout", "too-large", "interrupted")
DEFAULT_SECONDS = 10.0
DEFAULT_COOLDOWN_S = 300.0
DEFAULT_WAIT_S = 120.0  # after the stop: how long the files may take to appear and complete
DEFAULT_MAX_BYTES = 2 << 30
SETTLE_S = 1.0  # a file set whose sizes did not change for this long (and parses whole) is complete
MAX_SCAN_FILES = 200_000  # files looked at in an output directory (a home directory by mistake stays bounded)
COMMAND_TIMEOUT_S = 120.0  # an exec start/stop command or msserviceprofiler parse
STOPPING_LOCK_WAIT_S = 10.0  # a capture being stopped waits this long for the watcher's database lock
# a JSON document up to this size (plain or decompressed) is parsed whole to call it complete; a
# larger one must close its document: parsing 250 MB whole took 3 GB and 10 s, on every poll
FULL_PARSE_BYTES = 16 << 20
TAIL_BYTES = 64  # the last bytes read of a file to tell whether its document or line ends


class CaptureError(Exception):
    """A capture step failed; the message is the reason recorded in ``captures.reason``.
    ``reached``: False only when a start certainly never reached the profiler (connection
    refused, the command could not be launched, nothing written): every other failed start may
    have turned it on, and is followed by a stop."""

    def __init__(self, message: str, reached: bool = True):
        super().__init__(message)
        self.reached = reached


@dataclass
class Alert:
    """What caused a capture: a watched verdict that turned FAIL (or a user's on-demand request)."""

    query: str
    subject: str | None  # "DP domain 2", "expert 5, layer 0", or None
    cause: str | None
    summary: str
    ts_ns: int
    watch_run: str | None = None
    dp_rank: int | None = None  # the alerted DP domain, when the subject is one

    @classmethod
    def from_result(cls, name: str, res, ts_ns: int, watch_run: str | None) -> Alert:
        """The alert of a FAIL result: its first (costliest) finding names the subject."""
        from .findings import findings

        found = findings(res)
        first = found[0] if found else None
        dp = None
        if first is not None and first.subject and first.subject[0][0] == "dp_rank":
            try:
                dp = int(first.subject[0][1])
            except (TypeError, ValueError):
                dp = None
        return cls(
            query=name,
            subject=first.label if first else None,
            cause=first.cause if first else None,
            summary=res.summary,
            ts_ns=ts_ns,
            watch_run=watch_run,
            dp_rank=dp,
        )

    @classmethod
    def on_demand(cls, subject: str | None = None, dp_rank: int | None = None) -> Alert:
        label = subject or (f"DP domain {dp_rank}" if dp_rank is not None else None)
        return cls("on-demand", label, None, "capture asked for on the command line", time.time_ns(), None, dp_rank)


@dataclass
class Capture:
    """One capture and its outcome (a row of ``captures``)."""

    capture_id: int | None
    alert: Alert
    backend: str
    status: str = "running"
    reason: str | None = None
    started_ns: int | None = None
    stopped_ns: int | None = None
    window_s: float | None = None
    folder: str | None = None
    files: int = 0
    size_bytes: int = 0
    run: str | None = None
    verdict_status: str | None = None
    slow_card: str | None = None
    cause: str | None = None
    verdict_query: str | None = None
    headline: str | None = None
    next_step: str | None = None
    matches_alert: bool | None = None  # the slow card is the alerted DP domain (see match_alert)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        a = self.alert
        return {
            "capture_id": self.capture_id,
            "alert": {"query": a.query, "subject": a.subject, "cause": a.cause, "summary": a.summary, "ts_ns": a.ts_ns},
            "backend": self.backend,
            "status": self.status,
            "reason": self.reason,
            "window_s": self.window_s,
            "folder": self.folder,
            "files": self.files,
            "size_bytes": self.size_bytes,
            "run": self.run,
            "verdict": {
                "status": self.verdict_status,
                "slow_card": self.slow_card,
                "cause": self.cause,
                "query": self.verdict_query,
                "headline": self.headline,
                "next_step": self.next_step,
                "matches_alert": self.matches_alert,
            },
            "notes": self.notes,
        }


# --- output files ---------------------------------------------------------------------------
def _not_taken(path: Path, st: os.stat_result, root: Path) -> str:
    """What a directory entry that is not a regular file is, as a note says it."""
    if stat.S_ISLNK(st.st_mode):
        try:
            target = path.resolve(strict=True)
        except (OSError, RuntimeError):
            return "a dangling link"
        if not target.is_relative_to(root):
            return "a link to a path outside the folder"
        return "a link (what it points to in the folder is taken itself)"
    if stat.S_ISFIFO(st.st_mode):
        return "a FIFO"
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return "a device"
    if stat.S_ISSOCK(st.st_mode):
        return "a socket"
    return "not a regular file"


def scan(folder: Path, skipped: dict[Path, str] | None = None) -> dict[Path, tuple[int, int]]:
    """path -> (size, mtime_ns) of every regular file under ``folder`` (none when it does not
    exist). Links (to files or folders), FIFOs, devices and sockets are never taken, nor
    followed: a FIFO blocks its reader, /dev/zero never ends, a link may name another job's
    trace; each goes into ``skipped`` (path -> what it is) when given."""
    out: dict[Path, tuple[int, int]] = {}
    if not folder.is_dir():
        return out
    try:
        root = folder.resolve(strict=True)
    except (OSError, RuntimeError):
        return out
    for top, dirs, names in os.walk(folder):  # links to folders are listed in dirs, never entered
        for n in [*names, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]:
            p = Path(top) / n
            try:
                st = p.lstat()
            except OSError:
                continue  # vanished meanwhile
            if stat.S_ISREG(st.st_mode):
                out[p] = (st.st_size, st.st_mtime_ns)
                if len(out) >= MAX_SCAN_FILES:
                    return out
            elif skipped is not None and len(skipped) < MAX_SCAN_FILES:
                skipped[p] = _not_taken(p, st, root)
    return out


def new_files(before: dict[Path, tuple[int, int]], now: dict[Path, tuple[int, int]]) -> dict[Path, int]:
    """Files that appeared or changed since ``before``: path -> size."""
    return {p: s for p, (s, m) in now.items() if before.get(p) != (s, m)}


@dataclass(frozen=True)
class FileCheck:
    """A written file as the capture judges it: ``why`` it is not whole yet (None: whole, or
    over ``limit`` and so refused by the size cap anyway) and its content's size in bytes,
    decompressed for a ``.gz`` (what the ingest will read; past ``limit`` the count stops, so
    ``content_bytes`` > limit only says "over")."""

    why: str | None
    content_bytes: int


def _json_why(data: bytes, whole: bool) -> str | None:
    """Why ``data`` (a file's whole content when ``whole``, else its last bytes) is not a whole
    JSON document."""
    if whole:
        import orjson

        try:
            orjson.loads(data)
        except orjson.JSONDecodeError:
            return "it is not a whole JSON document"
        return None
    stripped = data.rstrip()
    if not stripped or stripped[-1:] not in (b"}", b"]"):
        return "its JSON document is not closed"
    return None


def check_file(path: Path, limit: int = DEFAULT_MAX_BYTES) -> FileCheck:
    """Judge one written file with bounded memory (FileCheck). A ``.gz`` is read through every
    member (as ``gzip -dc``: the trailers' CRC and size checked), at most ``limit`` decompressed
    bytes, in chunks; a JSON document of up to FULL_PARSE_BYTES (plain or decompressed) must
    parse, a larger one must close its document (its last bytes: never parsed whole); a CSV must
    end its last line; other files only need a stable size (the caller's check). Only a regular
    file is opened (never a link, a FIFO or a device, even one swapped in after the scan)."""
    name = path.name.lower()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        return FileCheck(f"unreadable ({type(exc).__name__}: {str(exc)[:80]})", 0)
    with os.fdopen(fd, "rb") as raw:
        st = os.fstat(raw.fileno())
        if not stat.S_ISREG(st.st_mode):
            return FileCheck("not a regular file", 0)
        try:
            if name.endswith(".gz"):
                return _check_gz(raw, name[:-3], limit)
            size = st.st_size
            if name.endswith(".json") and size <= FULL_PARSE_BYTES:
                return FileCheck(_json_why(raw.read(FULL_PARSE_BYTES + 1), whole=True), size)
            raw.seek(max(0, size - TAIL_BYTES))
            tail = raw.read(TAIL_BYTES)
        except OSError as exc:
            return FileCheck(f"unreadable ({type(exc).__name__}: {str(exc)[:80]})", st.st_size)
    if name.endswith(".json"):
        return FileCheck(_json_why(tail, whole=False), size)
    if name.endswith(".csv") and tail and not tail.endswith(b"\n"):
        return FileCheck("its last CSV line is cut", size)
    return FileCheck(None, size)


def _check_gz(raw, inner: str, limit: int) -> FileCheck:
    head = bytearray()  # the first FULL_PARSE_BYTES + 1 decompressed bytes (a small JSON is parsed whole)
    tail = b""
    n = 0
    try:
        with gzip.GzipFile(fileobj=raw, mode="rb") as g:
            while chunk := g.read(1 << 20):
                n += len(chunk)
                if len(head) <= FULL_PARSE_BYTES:
                    head += chunk[: FULL_PARSE_BYTES + 1 - len(head)]
                tail = (tail + chunk)[-TAIL_BYTES:]
                if n > limit:
                    return FileCheck(None, n)  # over the size cap: refused whole, never inflated further
    except EOFError:
        return FileCheck("its gzip stream is cut short", n)
    except (OSError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError (a bad CRC, not gzip at all)
        return FileCheck(f"unreadable ({type(exc).__name__}: {str(exc)[:80]})", n)
    if inner.endswith(".json"):
        small = n <= FULL_PARSE_BYTES
        return FileCheck(_json_why(bytes(head) if small else tail, whole=small), n)
    if inner.endswith(".csv") and tail and not tail.endswith(b"\n"):
        return FileCheck("its last CSV line is cut", n)
    return FileCheck(None, n)


def incomplete(path: Path, limit: int = DEFAULT_MAX_BYTES) -> str | None:
    """Why a written file is not whole yet (None when it is): ``check_file(path).why``."""
    return check_file(path, limit).why


def _listing(entries: dict[Path, str], folder: Path, most: int = 5) -> str:
    """``a.json (a FIFO), b.json (a device) (+3 more)``: names relative to ``folder``."""

    def rel(p: Path) -> str:
        try:
            return str(p.relative_to(folder))
        except ValueError:
            return str(p)

    shown = [f"{rel(p)} ({what})" for p, what in sorted(entries.items())[:most]]
    return ", ".join(shown) + (f" (+{len(entries) - most} more)" if len(entries) > most else "")


def wait_for_files(
    folder: Path,
    before: dict[Path, tuple[int, int]],
    wait_s: float,
    stop: threading.Event,
    settle_s: float = SETTLE_S,
    poll_s: float = 0.2,
    *,
    limit: int = DEFAULT_MAX_BYTES,
    skipped: dict[Path, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] | None = None,
) -> dict[Path, int]:
    """The regular files that appeared in ``folder`` since ``before``, once they are complete:
    the same set with the same sizes for ``settle_s`` and every one whole (``check_file``, each
    state of a file judged once): path -> content bytes (decompressed; over ``limit`` the count
    stops). Entries that are not regular files go into ``skipped``. Raises CaptureError naming
    what was missing or cut when ``wait_s`` passes, or when ``stop`` is set. ``clock`` and
    ``sleep`` (default ``stop.wait``) let a test drive time."""
    pause = sleep if sleep is not None else stop.wait
    deadline = clock() + wait_s
    last: dict[Path, tuple[int, int]] | None = None
    stable_since = clock()
    judged: dict[tuple[Path, int, int], FileCheck] = {}

    def check(got: dict[Path, tuple[int, int]]) -> dict[Path, FileCheck]:
        out = {}
        for p, (size, mtime) in got.items():
            key = (p, size, mtime)
            if key not in judged:
                judged[key] = check_file(p, limit)
            out[p] = judged[key]
        return out

    while True:
        seen: dict[Path, str] = {}
        now_files = scan(folder, seen)
        got = {p: v for p, v in now_files.items() if before.get(p) != v}
        now = clock()
        if skipped is not None:
            skipped.clear()
            skipped.update(seen)
        if got != last:
            last, stable_since = got, now
        elif got and now - stable_since >= settle_s:
            checks = check(got)
            if not any(c.why for c in checks.values()):
                return {p: c.content_bytes for p, c in checks.items()}
        if stop.is_set():
            raise CaptureError(
                f"stopped while waiting for the files in {folder} (Ctrl-C, SIGTERM or the watch ending); nothing was ingested"
            )
        if now >= deadline:
            if not got:
                raise CaptureError(f"no new file in {folder} within {wait_s:g} s after the stop")
            bad = {p: c.why for p, c in check(got).items() if c.why}
            if bad:
                p, why = next(iter(bad.items()))
                more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
                raise CaptureError(f"{p}: still incomplete after {wait_s:g} s: {why}{more}")
            raise CaptureError(f"the files in {folder} were still growing after {wait_s:g} s")
        pause(poll_s)


# --- backends -------------------------------------------------------------------------------
class VllmBackend:
    """vLLM / vLLM-Ascend: POST ``/start_profile`` and ``/stop_profile`` on the API server; the
    profiler output lands in the server's configured directory (``capture_dir``)."""

    name = "vllm"

    def __init__(self, base_url: str, capture_dir: str | Path, timeout_s: float = 30.0):
        self.base = base_url.rstrip("/")
        for suffix in ("/metrics", "/v1"):
            if self.base.endswith(suffix):
                self.base = self.base[: -len(suffix)]
        self.dir = Path(capture_dir)
        self.timeout_s = timeout_s
        self.notes: list[str] = []

    def output_dir(self) -> Path:
        return self.dir

    def _post(self, what: str) -> None:
        from .watch import http_request

        url = f"{self.base}/{what}"
        status, _body, error = http_request(url, self.timeout_s, 1 << 20, data=b"", headers={})
        if error is not None or status is None or not 200 <= status < 300:
            hint = (
                " (the server was started without a profiler directory? vLLM serves it only with "
                "--profiler-config / VLLM_TORCH_PROFILER_DIR)"
                if status == 404
                else ""
            )
            # only a request that never got through, or a path the server does not serve, left
            # the profiler as it was: a timeout or an error answer may come after it turned on
            never = status == 404 or (error or "").startswith(("connection refused", "unreachable"))
            raise CaptureError(f"POST {url}: {error or f'HTTP {status}'}{hint}", reached=not never)

    def start(self, stop: threading.Event | None = None) -> None:
        self._post("start_profile")

    def stop(self) -> None:
        self._post("stop_profile")

    def post_process(self, files: list[Path], stop: threading.Event, label: str) -> tuple[list[Path], list[str]]:
        return files, []


MAX_CONFIG_BYTES = 1 << 20  # an msServiceProfiler config is a few hundred bytes
_WS = " \t\n\r"  # JSON's whitespace


def _skip_ws(text: str, i: int) -> int:
    while text[i : i + 1] and text[i] in _WS:
        i += 1
    return i


def _enable_spans(text: str, where: Path) -> list[tuple[int, int]]:
    """(start, end) character offsets of the value of each top-level ``"enable"`` key of the
    JSON object ``text``: the one value the capture edits, every other byte left as written
    (a re-serialisation wrote 1e999 back as Infinity, which is not JSON)."""
    dec = json.JSONDecoder()
    spans: list[tuple[int, int]] = []
    i = _skip_ws(text, 0)
    if text[i : i + 1] != "{":
        raise CaptureError(f'{where}: expected a JSON object with an "enable" field')
    i = _skip_ws(text, i + 1)
    if text[i : i + 1] == "}":
        return spans
    while True:
        if text[i : i + 1] != '"':
            raise CaptureError(f"{where}: not a readable JSON config (a key expected at character {i})")
        key, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
        i = _skip_ws(text, i)
        if text[i : i + 1] != ":":
            raise CaptureError(f"{where}: not a readable JSON config (':' expected at character {i})")
        i = _skip_ws(text, i + 1)
        _value, end = dec.raw_decode(text, i)
        if key == "enable":
            spans.append((i, end))
        i = _skip_ws(text, end)
        if text[i : i + 1] == ",":
            i = _skip_ws(text, i + 1)
            continue
        if text[i : i + 1] == "}":
            return spans
        raise CaptureError(f"{where}: not a readable JSON config (',' or '}}' expected at character {i})")


def _write_in_place(fd: int, old: bytes, new: bytes) -> None:
    """Turn the file open as ``fd`` (holding ``old``) into ``new`` in place: the same inode, so
    a link stays a link, mode and owner stay, and no folder needs to be writable. The same
    length: only the changed bytes are written, one write (a one-byte ``enable`` switch); a
    longer one in one write from the start; a shorter one first padded with spaces to the old
    length (still JSON for a reader meanwhile), then cut."""
    if new == old:
        return

    def pwrite_all(data: bytes, offset: int) -> None:
        while data:
            n = os.pwrite(fd, data, offset)
            data, offset = data[n:], offset + n

    if len(new) == len(old):
        first = next(i for i in range(len(new)) if new[i] != old[i])
        last = len(new) - next(i for i in range(len(new)) if new[-1 - i] != old[-1 - i])
        pwrite_all(new[first:last], first)
    elif len(new) > len(old):
        pwrite_all(new, 0)
    else:
        pwrite_all(new + b" " * (len(old) - len(new)), 0)
        os.ftruncate(fd, len(new))
    os.fsync(fd)


class MsServiceProfilerBackend:
    """msServiceProfiler: ``"enable": 1`` / ``0`` in its JSON config (the service polls it);
    output under ``prof_dir`` (relative paths are taken from the config file's folder; default
    ``~/.ms_server_profiler``). ``msserviceprofiler parse`` runs on the new files when present.

    The config is edited in place, through a link to it: only the ``enable`` value's bytes are
    written (padded with spaces to the old value's length, so the file keeps its size and a
    reader never sees half of it); mode, owner and every other byte stay as written; the stop
    writes back the value ``enable`` had before the start (an ``enable`` already 1 stays 1)."""

    name = "msserviceprofiler"

    def __init__(self, config_path: str | Path, parse_exe: str | None = "auto"):
        self.config = Path(config_path)
        self.parse_exe = shutil.which("msserviceprofiler") if parse_exe == "auto" else parse_exe
        self.timeout_s = COMMAND_TIMEOUT_S
        self.notes: list[str] = []
        self._before: bytes | None = None  # the config's bytes before the start
        self._written: bytes | None = None  # what the start wrote
        self._old_value: bytes | None = None  # the first enable value before the start (None: absent)
        doc = self._read()
        prof = doc.get("prof_dir")
        if prof is not None and not isinstance(prof, str):
            raise CaptureError(f"{self.config}: prof_dir must be a path (text), not {type(prof).__name__}")
        base = Path(prof).expanduser() if prof else Path.home() / ".ms_server_profiler"
        self.dir = base if base.is_absolute() else self.config.parent / base

    def _read(self) -> dict:
        try:
            doc = json.loads(self.config.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CaptureError(
                f"{self.config}: no such file (SERVICE_PROF_CONFIG_PATH / --capture-config names "
                "msServiceProfiler's JSON config; the service creates it at its first start)"
            ) from None
        except (OSError, ValueError) as exc:
            raise CaptureError(f"{self.config}: not a readable JSON config ({str(exc)[:120]})") from None
        if not isinstance(doc, dict):
            raise CaptureError(f'{self.config}: expected a JSON object with an "enable" field')
        return doc

    def _open_rw(self) -> tuple[int, int | None]:
        """The config (a link's target) open for writing, and its mode to put back when it was
        read-only for its owner (this user) and made writable meanwhile."""
        try:
            return os.open(self.config, os.O_RDWR), None
        except PermissionError:
            try:
                st = os.stat(self.config)
                if st.st_uid != os.geteuid():
                    raise
                os.chmod(self.config, stat.S_IMODE(st.st_mode) | stat.S_IWUSR)
                try:
                    return os.open(self.config, os.O_RDWR), stat.S_IMODE(st.st_mode)
                except OSError:
                    os.chmod(self.config, stat.S_IMODE(st.st_mode))
                    raise
            except OSError as exc:
                raise CaptureError(
                    f"{self.config}: cannot write the enable switch ({exc.strerror or exc}): nothing was changed",
                    reached=False,
                ) from None
        except OSError as exc:
            raise CaptureError(
                f"{self.config}: cannot write the enable switch ({exc.strerror or exc}): nothing was changed",
                reached=False,
            ) from None

    def _edit(self, data: bytes, value: bytes | None) -> bytes:
        """``data`` with every top-level ``enable`` value set to ``value`` (padded with spaces
        to the old value's length when shorter); a missing ``enable`` is added first in the
        object. ``value`` None removes nothing and adds nothing (the key was absent)."""
        try:
            text = data.decode("utf-8")
            json.loads(text)
        except ValueError as exc:
            raise CaptureError(f"{self.config}: not a readable JSON config ({str(exc)[:120]})") from None
        spans = _enable_spans(text, self.config)
        out = text
        for start, end in reversed(spans):
            token = value.decode() if value is not None else "0"
            out = out[:start] + token.ljust(end - start) + out[end:]
        if not spans and value is not None:
            brace = text.index("{") + 1
            rest = text[brace:].lstrip(" \t\r\n")
            sep = "" if rest.startswith("}") else ", "
            out = text[:brace] + f'"enable": {value.decode()}{sep}' + text[brace:]
        return out.encode("utf-8")

    def _update(self, make: Callable[[bytes], bytes]) -> None:
        """Write ``make(current bytes)`` in place. A CaptureError before the write says
        ``reached`` False (the config is as it was); one during the write, True."""
        fd, mode = self._open_rw()
        try:
            try:
                data = os.pread(fd, MAX_CONFIG_BYTES + 1, 0)
            except OSError as exc:
                raise CaptureError(f"{self.config}: cannot read it ({exc})", reached=False) from None
            if len(data) > MAX_CONFIG_BYTES:
                raise CaptureError(
                    f"{self.config}: over {MAX_CONFIG_BYTES >> 20} MB: not an msServiceProfiler config", reached=False
                )
            try:
                new = make(data)
            except CaptureError as exc:
                raise CaptureError(str(exc), reached=False) from None
            try:
                _write_in_place(fd, data, new)
            except OSError as exc:
                raise CaptureError(f"{self.config}: cannot write the enable switch ({exc})") from None
        finally:
            if mode is not None:
                os.fchmod(fd, mode)
            os.close(fd)

    def output_dir(self) -> Path:
        return self.dir

    def start(self, stop: threading.Event | None = None) -> None:
        self.notes = []

        def switch_on(data: bytes) -> bytes:
            new = self._edit(data, b"1")  # first: it says what is wrong with a config that is not JSON
            text = data.decode("utf-8")
            spans = _enable_spans(text, self.config)
            self._old_value = text[spans[0][0] : spans[0][1]].encode() if spans else None
            if self._old_value is not None and self._old_value.strip() not in (b"0", b"false", b"0.0"):
                self.notes.append(
                    f'{self.config}: "enable" was already {self._old_value.decode()[:20]} before the capture: '
                    "left so at the end (the profiler stays on as it was)"
                )
            self._before, self._written = data, new
            return new

        self._update(switch_on)

    def stop(self) -> None:
        def switch_back(data: bytes) -> bytes:
            if self._before is not None and data == self._written:
                return self._before  # untouched since the start: exactly as it was
            # changed meanwhile (by hand?): only the value goes back
            return self._edit(data, self._old_value if self._before is not None else b"0")

        self._update(switch_back)

    def post_process(self, files: list[Path], stop: threading.Event, label: str) -> tuple[list[Path], list[str]]:
        folder = Path(os.path.commonpath([str(p.parent) for p in files]))
        if not self.parse_exe:
            return files, [
                "msserviceprofiler is not on PATH: its parse step was not run; the files were ingested "
                f"as written (to get request.csv / batch.csv: msserviceprofiler parse --input-path={folder} "
                "--output-path=OUT, then slowcard ingest OUT)"
            ]
        # a folder of this capture's own: the parse output of earlier captures is never taken
        out = folder / "slowcard_parsed" / label
        before = scan(out)
        cmd = [self.parse_exe, "parse", f"--input-path={folder}", f"--output-path={out}"]
        run_command(cmd, "msserviceprofiler parse", COMMAND_TIMEOUT_S, stop=stop)
        parsed = sorted(new_files(before, scan(out)))
        if not parsed:
            raise CaptureError(f"{shlex.join(cmd)} wrote nothing into {out}")
        return parsed, [f"parsed with {shlex.join(cmd)}"]


def run_command(cmd: str | list[str], label: str, timeout_s: float, stop: threading.Event | None = None, **kw) -> None:
    """Run a profiler command to its end; CaptureError (with ``label``, the exit code and the
    tail of its stderr) when it cannot start (``reached`` False), outlives ``timeout_s``, is
    stopped by ``stop`` or exits non-zero. Only the command itself is waited for, never its
    output: stdout goes to /dev/null and stderr to a file, so a process it leaves in the
    background holding them (a profiler daemon) does not hold the capture. It runs in a
    session of its own: a Ctrl-C on the terminal reaches slowcard, which ends it in order."""
    shown = cmd if isinstance(cmd, str) else shlex.join(cmd)
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, **kw
            )
        except OSError as exc:
            raise CaptureError(f"{label} failed: {exc}", reached=False) from None
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    rc = proc.wait(min(0.2, max(0.0, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= deadline:
                        raise CaptureError(f"{label} killed after {timeout_s:g} s: {shown}") from None
                    if stop is not None and stop.is_set():
                        raise CaptureError(
                            f"{label} killed: stopped (Ctrl-C, SIGTERM or the watch ending): {shown}"
                        ) from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if rc != 0:
            size = err.seek(0, os.SEEK_END)
            err.seek(max(0, size - 800))
            text = err.read().decode(errors="replace").strip()[-200:]
            raise CaptureError(f"{label} exited {rc}: {shown}" + (f": {text}" if text else ""))


class ExecBackend:
    """Any other stack: a shell command starts the profiler, another stops it; the output lands
    in ``capture_dir``. The stop command runs whenever the start command was launched, even
    when it failed or was killed (it may have started the profiler first)."""

    name = "exec"

    def __init__(self, start_cmd: str, stop_cmd: str, capture_dir: str | Path, timeout_s: float = COMMAND_TIMEOUT_S):
        self.start_cmd, self.stop_cmd = start_cmd, stop_cmd
        self.dir = Path(capture_dir)
        self.timeout_s = timeout_s
        self.notes: list[str] = []

    def output_dir(self) -> Path:
        return self.dir

    def _run(self, cmd: str, what: str, stop: threading.Event | None) -> None:
        env = dict(os.environ, SLOWCARD_CAPTURE_DIR=str(self.dir))
        run_command(cmd, f"{what} command", self.timeout_s, stop=stop, shell=True, env=env)

    def start(self, stop: threading.Event | None = None) -> None:
        self._run(self.start_cmd, "start", stop)

    def stop(self) -> None:
        self._run(self.stop_cmd, "stop", None)  # never cut short: it turns the profiler off

    def post_process(self, files: list[Path], stop: threading.Event, label: str) -> tuple[list[Path], list[str]]:
        return files, []


# --- linking the verdict to the alert ---------------------------------------------------------
def match_alert(alert: Alert, card, n_ranks: int | None, n_domains: int | None) -> bool | None:
    """Whether the capture's slow card is the alerted DP domain: the same DP domain, or the
    rank of that number when the trace has one rank per DP domain (vLLM data parallel with
    expert parallelism and TP 1: DP engine r is rank r). None when it cannot be told."""
    if alert.dp_rank is None or card is None or not card.subject:
        return None
    kind, value = card.subject[0]
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    if kind == "dp_rank":
        return number == alert.dp_rank
    if kind in ("rank", "ep_rank") and n_ranks is not None and n_ranks == n_domains:
        return number == alert.dp_rank
    return None


# --- the capture driver ---------------------------------------------------------------------
Backend = VllmBackend | MsServiceProfilerBackend | ExecBackend


class Capturer:
    """Runs captures into ``db``: one at a time, ``cooldown_s`` between the end of one and the
    start of the next (a failed one too), at most ``max_bytes`` ingested (decompressed). ``trigger``
    starts one in a thread (the watch goes on), ``run`` does one in the caller's thread (`slowcard
    capture`). ``clock`` (monotonic seconds) lets a test drive the cool-down and the file wait.

    A capture is a transaction with the profiler: once a start may have taken effect (a request
    sent, even one that timed out or failed; a start command launched) a stop is sent, whatever
    happens next (a failure, Ctrl-C, SIGTERM through the CLI), and the ``captures`` row ends in a
    final state whose reason says when the profiler may still be on."""

    def __init__(
        self,
        db: str | Path,
        backend: Backend,
        seconds: float = DEFAULT_SECONDS,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
        wait_s: float = DEFAULT_WAIT_S,
        settle_s: float = SETTLE_S,
        sql_dirs=None,
        db_lock: threading.Lock | None = None,
        n_domains: Callable[[], int | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.db = Path(db)
        self.backend = backend
        self.seconds = seconds
        self.cooldown_s = cooldown_s
        self.max_bytes = max_bytes
        self.wait_s = wait_s
        self.settle_s = settle_s
        self.sql_dirs = sql_dirs
        self.db_lock = db_lock or threading.Lock()
        self.n_domains = n_domains
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ended_at: float | None = None  # clock() at the end of the last capture (cool-down)
        self._done: list[Capture] = []
        self._done_lock = threading.Lock()
        self._running = False
        self._current: Capture | None = None  # the capture whose row says 'running'
        # what the running capture does: starting | profiling | stopping | collecting | ingesting | idle | ...
        self.phase = "idle"
        # set while no capture runs: waited on instead of Thread.join, which a Ctrl-C landing in
        # it (Python < 3.13) can leave believing the thread has ended
        self._idle = threading.Event()
        self._idle.set()

    # --- in the background (watch) ---------------------------------------------------------
    def busy(self) -> bool:
        """A capture is running (its outcome not handed to ``finished`` yet)."""
        return self._running

    def trigger(self, alert: Alert) -> str:
        """Start a capture for ``alert`` in a thread; what happened, as text."""
        if self._stop.is_set():
            return "not started: the watch is ending"
        if self.busy():
            return f"not started for {alert.query}: another capture is running (one at a time)"
        if self._ended_at is not None:
            left = self.cooldown_s - (self.clock() - self._ended_at)
            if left > 0:
                return f"not started for {alert.query}: cool-down, {left:.0f} s left (--capture-cooldown)"

        def work():
            cap = None
            try:
                cap = self.run(alert)
            finally:
                with self._done_lock:  # done and not running in one step: a caller never sees neither
                    if cap is not None:
                        self._done.append(cap)
                    self._running = False
                self._idle.set()

        self._running = True
        self._idle.clear()
        self._thread = threading.Thread(target=work, name="slowcard-capture", daemon=True)
        self._thread.start()
        return f"started ({self.backend.name}, {self.seconds:g} s) for {alert.query}" + (
            f": {alert.subject}" if alert.subject else ""
        )

    def finished(self) -> list[Capture]:
        """Captures that ended since the last call."""
        with self._done_lock:
            out, self._done = self._done, []
        return out

    def wait(self, timeout_s: float | None = None) -> bool:
        """Let a running capture finish (the watch's --duration ended); True when none runs."""
        return self._idle.wait(timeout_s)

    def stop_bound_s(self) -> float:
        """How long a running capture may still take once stopped: a start request or command
        that is under way, the stop, the file wait ending, the row written."""
        return 2 * float(getattr(self.backend, "timeout_s", COMMAND_TIMEOUT_S)) + 30.0

    def request_stop(self) -> None:
        """Stop a running capture (Ctrl-C, SIGTERM): its profiler is stopped and the capture is
        recorded as interrupted; no new capture starts. Returns at once."""
        self._stop.set()

    def shutdown(self, timeout_s: float | None = None) -> bool:
        """``request_stop`` and wait for the capture to end (at most ``timeout_s``, default
        ``stop_bound_s``); False when it did not, and its row was marked by ``abandon``."""
        self._stop.set()
        if self._idle.wait(self.stop_bound_s() if timeout_s is None else timeout_s):
            return True
        self.abandon()
        return False

    def abandon(self) -> None:
        """Slowcard ends while a capture has not: its row, still ``running``, becomes
        ``interrupted`` saying the profiler may still be on."""
        cap = self._current
        if cap is None or cap.capture_id is None:
            return
        reason = (
            "slowcard ended before the capture did (its stop not confirmed): the profiler may still be on: "
            f"stop it by hand ({self.backend.name})"
        )
        try:
            con = store.open_db(self.db)
            try:
                con.execute(
                    "UPDATE captures SET status = 'interrupted', reason = ? WHERE capture_id = ? AND status = 'running'",
                    [reason, cap.capture_id],
                )
            finally:
                con.close()
        except Exception:  # noqa: BLE001 (the database is held by the capture itself: its row says running)
            pass

    @contextmanager
    def _locked(self, what: str) -> Iterator[None]:
        """The database lock shared with the watcher, while the capture does ``what`` (its
        ``phase`` meanwhile). Once the capture is being stopped, a lock still taken after
        STOPPING_LOCK_WAIT_S is not waited for further: the watch's main thread, interrupted,
        writes nothing more (a Ctrl-C landing between its acquire and its ``try`` can leave the
        lock taken for good), and the row must still reach its final state."""
        self.phase = f"{what}: waiting for the database"
        waited = 0.0
        while not (got := self.db_lock.acquire(timeout=0.5)):
            waited += 0.5
            if self._stop.is_set() and waited >= STOPPING_LOCK_WAIT_S:
                break
        self.phase = what
        try:
            yield
        finally:
            if got:
                self.db_lock.release()

    # --- one capture -----------------------------------------------------------------------
    def run(self, alert: Alert) -> Capture:
        """Start, keep, stop, wait for the files, ingest, diagnose, record. Never raises for a
        capture that goes wrong: the returned Capture says how and why."""
        cap = Capture(None, alert, self.backend.name)
        self.phase = "starting"
        try:
            self._record_start(cap)
        except Exception as exc:  # noqa: BLE001 (the database is busy or broken: say so, go on)
            cap.status, cap.reason = "failed", f"{self.db}: cannot record the capture: {str(exc)[:200]}"
            self._ended_at = self.clock()
            self.phase = "idle"
            return cap
        self._current = cap
        self.phase = "starting"
        try:
            self._capture(cap)
        except CaptureError as exc:
            if cap.status == "running":
                cap.status = "failed"
            cap.reason = str(exc)
        except Exception as exc:  # noqa: BLE001 (a bug or a broken file must not end the watch)
            cap.status, cap.reason = "failed", f"{type(exc).__name__}: {str(exc)[:300]}"
        finally:
            self._ended_at = self.clock()  # the cool-down follows a failed capture too
            cap.notes = list(getattr(self.backend, "notes", [])) + cap.notes
            try:
                self._record_end(cap)
            except Exception as exc:  # noqa: BLE001
                cap.notes.append(f"{self.db}: the capture's outcome was not recorded: {str(exc)[:200]}")
            self._current = None
            self.phase = "idle"
        return cap

    def _send_stop(self) -> str | None:
        """Stop the profiler; None when done, else why not (never raises)."""
        try:
            self.backend.stop()
        except CaptureError as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 (a bug must not skip the stop's report)
            return f"{type(exc).__name__}: {str(exc)[:200]}"
        return None

    def _capture(self, cap: Capture) -> None:
        folder = self.backend.output_dir()
        skipped_before: dict[Path, str] = {}
        before = scan(folder, skipped_before)
        if self._stop.is_set():
            cap.status = "interrupted"
            raise CaptureError("stopped before the profiler was started (Ctrl-C, SIGTERM or the watch ending)")
        t0 = self.clock()
        try:
            self.backend.start(self._stop)
        except Exception as exc:  # noqa: BLE001 (whatever went wrong, a start under way may have turned it on)
            why = str(exc) if isinstance(exc, CaptureError) else f"{type(exc).__name__}: {str(exc)[:200]}"
            if self._stop.is_set():
                cap.status = "interrupted"
            if isinstance(exc, CaptureError) and not exc.reached:
                raise CaptureError(why) from None
            failed_stop = self._send_stop()
            cap.stopped_ns = time.time_ns()
            if failed_stop is None:
                raise CaptureError(
                    f"{why}; the start may have taken effect: the profiler was stopped again, nothing was captured"
                ) from None
            raise CaptureError(
                f"{why}; the start may have taken effect and the stop failed too ({failed_stop}): "
                "the profiler may still be on: stop it by hand"
            ) from None
        self.phase = "profiling"
        cap.started_ns = time.time_ns()
        stopped_early = self._stop.wait(self.seconds)
        self.phase = "stopping"
        failed_stop = self._send_stop()
        cap.stopped_ns = time.time_ns()
        cap.window_s = round(self.clock() - t0, 3)
        if failed_stop is not None:
            cap.status = "failed"
            raise CaptureError(f"{failed_stop} (the profiler may still be running: stop it by hand)")
        self.phase = "collecting"
        if stopped_early:
            cap.status = "interrupted"
            raise CaptureError(
                f"stopped {cap.window_s:g} s into the {self.seconds:g} s window (Ctrl-C, SIGTERM or the watch ending): "
                f"the profiler was stopped and nothing was ingested (its output, if any, is in {folder})"
            )
        skipped: dict[Path, str] = {}
        try:
            got = wait_for_files(
                folder,
                before,
                self.wait_s,
                self._stop,
                self.settle_s,
                limit=self.max_bytes,
                skipped=skipped,
                clock=self.clock,
            )
        except CaptureError as exc:
            cap.status = "interrupted" if self._stop.is_set() else "timeout"
            fresh = {p: w for p, w in skipped.items() if skipped_before.get(p) != w}
            extra = f" (not taken: {_listing(fresh, folder)})" if fresh else ""
            raise CaptureError(f"{exc}{extra}") from None
        fresh = {p: w for p, w in skipped.items() if skipped_before.get(p) != w}
        if fresh:
            cap.notes.append(
                f"{len(fresh)} entr{'y' if len(fresh) == 1 else 'ies'} in {folder} not taken (only regular files "
                f"inside the folder are): {_listing(fresh, folder)}"
            )
        files = sorted(got)
        cap.files, cap.size_bytes = len(files), sum(got.values())
        cap.folder = str(Path(os.path.commonpath([str(p.parent) for p in files])))
        if cap.size_bytes > self.max_bytes:
            cap.status = "too-large"
            over = any(n > self.max_bytes for n in got.values())  # a count that stopped at the cap
            raise CaptureError(
                f"{'over ' if over else ''}{cap.size_bytes / 1e6:.1f} MB of content (decompressed) in {cap.files} "
                f"file(s), over the cap of {self.max_bytes / 1e6:g} MB (--capture-max-mb): not ingested; "
                f"ingest {cap.folder} by hand if it is wanted"
            )
        paths, notes = self.backend.post_process(files, self._stop, f"capture-{cap.capture_id}")
        cap.notes += notes
        self._ingest_and_diagnose(cap, paths)

    def _ingest_and_diagnose(self, cap: Capture, paths: list[Path]) -> None:
        from . import findings as findings_mod
        from .diagnosis import diagnose
        from .ingest import ingest_paths
        from .queries import load_catalog

        cap.run = f"capture-{cap.capture_id}"
        catalog = load_catalog(self.sql_dirs)
        with self._locked("ingesting"):
            con = store.open_db(self.db)
            try:
                report = ingest_paths(self.db, paths, run=cap.run, con=con, jobs=1)
                bad = [f for f in report.files if f.status == "failed"]
                kept = [f for f in report.files if f.status != "failed"]
                if not kept:
                    raise CaptureError(
                        "no file could be ingested" + (f": {bad[0].path}: {bad[0].message[:200]}" if bad else "")
                    )
                if bad:
                    cap.notes.append(f"{len(bad)} file(s) failed to ingest, e.g. {bad[0].path}: {bad[0].message[:120]}")
                diag = diagnose(con, cap.run, catalog)
                n_ranks = con.execute(
                    "SELECT count(DISTINCT rank) FROM sources WHERE run = ? AND rank IS NOT NULL", [cap.run]
                ).fetchone()[0]
            finally:
                con.close()
        concl = diag.conclusion
        cap.status = "ok"
        cap.verdict_status = concl.get("status")
        cap.headline = concl.get("headline")
        cap.cause = concl.get("cause")
        cap.verdict_query = concl.get("query")
        cap.next_step = concl.get("next_step")
        cards = findings_mod.slow_cards(diag.results)
        card = cards[0] if cards else None
        cap.slow_card = card.label if card else None
        n_dom = self.n_domains() if self.n_domains else None
        cap.matches_alert = match_alert(cap.alert, card, n_ranks or None, n_dom)

    # --- the captures table ----------------------------------------------------------------
    def _record_start(self, cap: Capture) -> None:
        a = cap.alert
        with self._locked("recording the capture"):
            con = store.open_db(self.db)
            try:
                con.execute("BEGIN")
                cid = con.execute(
                    "SELECT greatest(nextval('capture_id_seq'), (SELECT coalesce(max(capture_id), 0) + 1 FROM captures))"
                ).fetchone()[0]
                con.execute(
                    """INSERT INTO captures (capture_id, watch_run, alert_ts_ns, query, subject, alert_cause,
                           alert_summary, backend, status, created_at)
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', now())""",
                    [
                        cid,
                        None if a.watch_run is None else store.db_text(a.watch_run),
                        a.ts_ns,
                        a.query,
                        a.subject,
                        a.cause,
                        (a.summary or "")[:2000],
                        cap.backend,
                    ],
                )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
            finally:
                con.close()
        cap.capture_id = int(cid)

    def _record_end(self, cap: Capture) -> None:
        with self._locked("recording the outcome"):
            con = store.open_db(self.db)
            try:
                con.execute(
                    """UPDATE captures SET status = ?, reason = ?, started_ns = ?, stopped_ns = ?, window_s = ?,
                           folder = ?, files = ?, size_bytes = ?, run = ?, verdict_status = ?, slow_card = ?,
                           cause = ?, verdict_query = ?, headline = ?, next_step = ?, matches_alert = ?,
                           notes = ?
                       WHERE capture_id = ?""",
                    [
                        cap.status,
                        cap.reason,
                        cap.started_ns,
                        cap.stopped_ns,
                        cap.window_s,
                        None if cap.folder is None else store.db_text(cap.folder),
                        cap.files,
                        cap.size_bytes,
                        cap.run,
                        cap.verdict_status,
                        cap.slow_card,
                        cap.cause,
                        cap.verdict_query,
                        cap.headline,
                        cap.next_step,
                        cap.matches_alert,
                        "; ".join(cap.notes) or None,
                        cap.capture_id,
                    ],
                )
            finally:
                con.close()


WEBHOOK_TIMEOUT_S = 10.0


def post_capture(webhook: str, cap: Capture, watch_run: str | None) -> str:
    """POST a finished capture (beside its alert) as JSON to ``webhook``; the outcome as text."""
    from .render import to_json
    from .watch import http_request

    data = to_json({"run": watch_run, "event": "capture", "capture": cap.to_dict()}, indent=None).encode("utf-8")
    status, _body, error = http_request(
        webhook, WEBHOOK_TIMEOUT_S, 1 << 20, data=data, headers={"Content-Type": "application/json"}
    )
    return f"capture webhook HTTP {status}" if error is None else f"capture webhook failed: {error}"


def make_backend(
    kind: str,
    *,
    url: str | None = None,
    capture_dir: str | Path | None = None,
    config: str | Path | None = None,
    start_cmd: str | None = None,
    stop_cmd: str | None = None,
    timeout_s: float = 30.0,
) -> Backend:
    """A backend from the command line's options; CaptureError (a usage problem) names what is
    missing."""
    if kind == "vllm":
        if not url:
            raise CaptureError("--capture vllm needs the server's URL (--capture-url, default: the first --scrape)")
        if not capture_dir:
            raise CaptureError(
                "--capture vllm needs --capture-dir: the directory the server writes its profiler output to "
                "(its --profiler-config torch_profiler_dir, or VLLM_TORCH_PROFILER_DIR)"
            )
        return VllmBackend(url, capture_dir, timeout_s)
    if kind == "msserviceprofiler":
        path = config or os.environ.get("SERVICE_PROF_CONFIG_PATH")
        if not path:
            raise CaptureError(
                "--capture msserviceprofiler needs --capture-config or SERVICE_PROF_CONFIG_PATH "
                "(msServiceProfiler's JSON config, the one the service was started with)"
            )
        return MsServiceProfilerBackend(path)
    if kind == "exec":
        if not (start_cmd and stop_cmd and capture_dir):
            raise CaptureError("--capture exec needs --capture-start CMD, --capture-stop CMD and --capture-dir DIR")
        return ExecBackend(start_cmd, stop_cmd, capture_dir)
    raise CaptureError(f"--capture {kind!r}: expected one of {', '.join(BACKENDS)}")
