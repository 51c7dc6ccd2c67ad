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
import subprocess
import threading
import time
import zlib
from collections.abc import Callable
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
FULL_PARSE_BYTES = 256 << 20  # a plain JSON file up to this size is parsed whole to call it complete


class CaptureError(Exception):
    """A capture step failed; the message is the reason recorded in ``captures.reason``."""


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
def scan(folder: Path) -> dict[Path, tuple[int, int]]:
    """path -> (size, mtime_ns) of every file under ``folder`` (none when it does not exist)."""
    out: dict[Path, tuple[int, int]] = {}
    if not folder.is_dir():
        return out
    for root, _dirs, names in os.walk(folder):
        for n in names:
            p = Path(root) / n
            try:
                st = p.stat()
            except OSError:
                continue  # vanished meanwhile
            out[p] = (st.st_size, st.st_mtime_ns)
            if len(out) >= MAX_SCAN_FILES:
                return out
    return out


def new_files(before: dict[Path, tuple[int, int]], now: dict[Path, tuple[int, int]]) -> dict[Path, int]:
    """Files that appeared or changed since ``before``: path -> size."""
    return {p: s for p, (s, m) in now.items() if before.get(p) != (s, m)}


def incomplete(path: Path) -> str | None:
    """Why a written file is not whole yet (None when it is): a ``.gz`` must have its whole stream
    (end marker and CRC), a JSON file must parse (up to FULL_PARSE_BYTES; a larger one, and the
    JSON inside a ``.gz``, must at least close its document), a CSV must end its last line; other
    files only need a stable size (the caller's check)."""
    name = path.name.lower()
    try:
        if name.endswith(".gz"):
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            tail = b""
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    out = d.decompress(chunk)
                    if out:
                        tail = (tail + out)[-64:]
            if not d.eof:
                return "its gzip stream is cut short"
            text_tail = tail
            inner = name[:-3]
        else:
            with path.open("rb") as f:
                f.seek(max(0, path.stat().st_size - 64))
                text_tail = f.read()
            inner = name
    except (OSError, zlib.error, EOFError, gzip.BadGzipFile) as exc:
        return f"unreadable ({type(exc).__name__}: {str(exc)[:80]})"
    stripped = text_tail.rstrip()
    if inner == name and name.endswith(".json") and path.stat().st_size <= FULL_PARSE_BYTES:
        import orjson

        try:
            orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError:
            return "it is not a whole JSON document"
    elif inner.endswith(".json"):
        if not stripped or stripped[-1:] not in (b"}", b"]"):
            return "its JSON document is not closed"
    elif inner.endswith(".csv"):
        if text_tail and not text_tail.endswith(b"\n"):
            return "its last CSV line is cut"
    return None


def wait_for_files(
    folder: Path,
    before: dict[Path, tuple[int, int]],
    wait_s: float,
    stop: threading.Event,
    settle_s: float = SETTLE_S,
    poll_s: float = 0.2,
) -> dict[Path, int]:
    """The files that appeared in ``folder`` since ``before``, once they are complete: the same
    set with the same sizes for ``settle_s`` and every one whole (``incomplete``). Raises
    CaptureError naming what was missing or cut when ``wait_s`` passes, or when ``stop`` is set."""
    deadline = time.monotonic() + wait_s
    last: dict[Path, int] | None = None
    stable_since = time.monotonic()
    while True:
        got = new_files(before, scan(folder))
        now = time.monotonic()
        if got != last:
            last, stable_since = got, now
        elif got and now - stable_since >= settle_s:
            bad = {p: why for p in got if (why := incomplete(p))}
            if not bad:
                return got
        if stop.is_set():
            raise CaptureError(
                f"stopped while waiting for the files in {folder} (Ctrl-C or the watch ending); nothing was ingested"
            )
        if now >= deadline:
            if not got:
                raise CaptureError(f"no new file in {folder} within {wait_s:g} s after the stop")
            bad = {p: why for p in got if (why := incomplete(p))}
            if bad:
                p, why = next(iter(bad.items()))
                more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
                raise CaptureError(f"{p}: still incomplete after {wait_s:g} s: {why}{more}")
            raise CaptureError(f"the files in {folder} were still growing after {wait_s:g} s")
        stop.wait(poll_s)


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
            raise CaptureError(f"POST {url}: {error or f'HTTP {status}'}{hint}")

    def start(self) -> None:
        self._post("start_profile")

    def stop(self) -> None:
        self._post("stop_profile")

    def post_process(self, files: list[Path], stop: threading.Event) -> tuple[list[Path], list[str]]:
        return files, []


class MsServiceProfilerBackend:
    """msServiceProfiler: ``"enable": 1`` / ``0`` in its JSON config (the service polls it);
    output under ``prof_dir`` (relative paths are taken from the config file's folder; default
    ``~/.ms_server_profiler``). ``msserviceprofiler parse`` runs on the new files when present."""

    name = "msserviceprofiler"

    def __init__(self, config_path: str | Path, parse_exe: str | None = "auto"):
        self.config = Path(config_path)
        self.parse_exe = shutil.which("msserviceprofiler") if parse_exe == "auto" else parse_exe
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

    def _set(self, enable: int) -> None:
        doc = self._read()
        doc["enable"] = enable
        tmp = self.config.with_name(self.config.name + ".slowcard-tmp")
        try:
            tmp.write_text(json.dumps(doc, indent=4) + "\n", encoding="utf-8")
            os.replace(tmp, self.config)  # the poller never reads a half-written config
        except OSError as exc:
            raise CaptureError(f'{self.config}: cannot write "enable": {enable} ({exc})') from None

    def output_dir(self) -> Path:
        return self.dir

    def start(self) -> None:
        self._set(1)

    def stop(self) -> None:
        self._set(0)

    def post_process(self, files: list[Path], stop: threading.Event) -> tuple[list[Path], list[str]]:
        folder = Path(os.path.commonpath([str(p.parent) for p in files]))
        if not self.parse_exe:
            return files, [
                "msserviceprofiler is not on PATH: its parse step was not run; the files were ingested "
                f"as written (to get request.csv / batch.csv: msserviceprofiler parse --input-path={folder} "
                "--output-path=OUT, then slowcard ingest OUT)"
            ]
        out = folder / "slowcard_parsed"
        cmd = [self.parse_exe, "parse", f"--input-path={folder}", f"--output-path={out}"]
        run_command(cmd, "msserviceprofiler parse", COMMAND_TIMEOUT_S)
        parsed = sorted(p for p in scan(out))
        if not parsed:
            raise CaptureError(f"{shlex.join(cmd)} wrote nothing into {out}")
        return parsed, [f"parsed with {shlex.join(cmd)}"]


def run_command(cmd: str | list[str], label: str, timeout_s: float, **kw) -> None:
    """Run a profiler command to its end; CaptureError (with ``label``, the exit code and the
    tail of its stderr) when it cannot start, outlives ``timeout_s`` or exits non-zero."""
    shown = cmd if isinstance(cmd, str) else shlex.join(cmd)
    try:
        cp = subprocess.run(cmd, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL, **kw)
    except subprocess.TimeoutExpired:
        raise CaptureError(f"{label} killed after {timeout_s:g} s: {shown}") from None
    except OSError as exc:
        raise CaptureError(f"{label} failed: {exc}") from None
    if cp.returncode != 0:
        err = cp.stderr.decode(errors="replace").strip()[-200:]
        raise CaptureError(f"{label} exited {cp.returncode}: {shown}" + (f": {err}" if err else ""))


class ExecBackend:
    """Any other stack: a shell command starts the profiler, another stops it; the output lands
    in ``capture_dir``."""

    name = "exec"

    def __init__(self, start_cmd: str, stop_cmd: str, capture_dir: str | Path, timeout_s: float = COMMAND_TIMEOUT_S):
        self.start_cmd, self.stop_cmd = start_cmd, stop_cmd
        self.dir = Path(capture_dir)
        self.timeout_s = timeout_s

    def output_dir(self) -> Path:
        return self.dir

    def _run(self, cmd: str, what: str) -> None:
        env = dict(os.environ, SLOWCARD_CAPTURE_DIR=str(self.dir))
        run_command(cmd, f"{what} command", self.timeout_s, shell=True, env=env)

    def start(self) -> None:
        self._run(self.start_cmd, "start")

    def stop(self) -> None:
        self._run(self.stop_cmd, "stop")

    def post_process(self, files: list[Path], stop: threading.Event) -> tuple[list[Path], list[str]]:
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
    start of the next, at most ``max_bytes`` ingested. ``trigger`` starts one in a thread (the
    watch goes on), ``run`` does one in the caller's thread (`slowcard capture`)."""

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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ended_at: float | None = None  # monotonic end of the last capture (cool-down)
        self._done: list[Capture] = []
        self._done_lock = threading.Lock()
        self._running = False
        self.phase = "idle"  # what the running capture does: starting | profiling | collecting | idle
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
            left = self.cooldown_s - (time.monotonic() - self._ended_at)
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

    def wait(self, timeout_s: float | None = None) -> None:
        """Let a running capture finish (the watch's --duration ended)."""
        self._idle.wait(timeout_s)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop a running capture now (Ctrl-C): its profiler is stopped and the capture is
        recorded as interrupted; no new capture starts."""
        self._stop.set()
        self._idle.wait(timeout_s)

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
            self._ended_at = time.monotonic()
            self.phase = "idle"
            return cap
        try:
            self._capture(cap)
        except CaptureError as exc:
            if cap.status == "running":
                cap.status = "failed"
            cap.reason = str(exc)
        except Exception as exc:  # noqa: BLE001 (a bug or a broken file must not end the watch)
            cap.status, cap.reason = "failed", f"{type(exc).__name__}: {str(exc)[:300]}"
        finally:
            self._ended_at = time.monotonic()
            try:
                self._record_end(cap)
            except Exception as exc:  # noqa: BLE001
                cap.notes.append(f"{self.db}: the capture's outcome was not recorded: {str(exc)[:200]}")
            self.phase = "idle"
        return cap

    def _capture(self, cap: Capture) -> None:
        folder = self.backend.output_dir()
        before = scan(folder)
        if self._stop.is_set():
            cap.status = "interrupted"
            raise CaptureError("stopped before the profiler was started (Ctrl-C or the watch ending)")
        self.backend.start()
        self.phase = "profiling"
        cap.started_ns = time.time_ns()
        t0 = time.monotonic()
        stopped_early = self._stop.wait(self.seconds)
        try:
            self.backend.stop()
        except CaptureError as exc:
            cap.status = "failed"
            raise CaptureError(f"{exc} (the profiler may still be running: stop it by hand)") from None
        finally:
            cap.stopped_ns = time.time_ns()
            cap.window_s = round(time.monotonic() - t0, 3)
        self.phase = "collecting"
        if stopped_early:
            cap.status = "interrupted"
            raise CaptureError(
                f"stopped {cap.window_s:g} s into the {self.seconds:g} s window (Ctrl-C or the watch ending): "
                f"the profiler was stopped and nothing was ingested (its output, if any, is in {folder})"
            )
        try:
            got = wait_for_files(folder, before, self.wait_s, self._stop, self.settle_s)
        except CaptureError as exc:
            cap.status = "interrupted" if self._stop.is_set() else "timeout"
            raise CaptureError(str(exc)) from None
        files = sorted(got)
        cap.files, cap.size_bytes = len(files), sum(got.values())
        cap.folder = str(Path(os.path.commonpath([str(p.parent) for p in files])))
        if cap.size_bytes > self.max_bytes:
            cap.status = "too-large"
            raise CaptureError(
                f"{cap.size_bytes / 1e6:.1f} MB in {cap.files} file(s), over the cap of {self.max_bytes / 1e6:.0f} MB "
                f"(--capture-max-mb): not ingested; ingest {cap.folder} by hand if it is wanted"
            )
        paths, notes = self.backend.post_process(files, self._stop)
        cap.notes += notes
        self._ingest_and_diagnose(cap, paths)

    def _ingest_and_diagnose(self, cap: Capture, paths: list[Path]) -> None:
        from . import findings as findings_mod
        from .diagnosis import diagnose
        from .ingest import ingest_paths
        from .queries import load_catalog

        cap.run = f"capture-{cap.capture_id}"
        catalog = load_catalog(self.sql_dirs)
        with self.db_lock:
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
        with self.db_lock:
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
        with self.db_lock:
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
