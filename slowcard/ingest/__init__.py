"""Finding files, recognising their format by content, and ingesting them one commit per file.

Owns: walking paths (files, folders, globs), the format registry (every module in this package
that exposes ``READER``), rank resolution through ``slowcard.ranks``, the commit point of each
file (``store.commit_sources``; a batch's files that succeeded share one), parallel files
(``jobs``), batches of small traces that share one INSERT (``_shared``) and the end-of-run checks
(duplicate and missing ranks). It parses no format itself and never prints: progress goes to a
callback.
"""

from __future__ import annotations

import errno
import glob as globlib
import importlib
import os
import pkgutil
import stat
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import duckdb

from .. import devices as devices_mod
from .. import ranks as ranks_mod
from .. import store
from ..errors import InputError, UsageError, is_interrupt
from . import _known
from ._gz import Members
from ._shared import SharedBatch, plan_batches
from .base import GZIP_MAGIC, Context, IngestOptions, Outcome, Reader

# Formats whose files belong to one rank; a file of these without a rank is reported.
RANKED_FORMATS = {
    "kineto",
    "ascend_trace",
    "chrome_array",
    "kernel_details",
    "op_summary",
    "step_trace",
    "communication",
    "comm_matrix",
}
# Companion files that carry metadata for other files and are not ingested themselves.
COMPANION = _known.COMPANION


# Format modules loaded so far: module name -> its READER (None: a module without one).
_LOADED: dict[str, Reader | None] = {}
_MODULE_NAMES: list[str] = []


def _reader_modules() -> list[str]:
    """The format modules of this package, in module-name order (a new format = a new module)."""
    if not _MODULE_NAMES:
        names = sorted(m.name for m in pkgutil.iter_modules(__path__))
        _MODULE_NAMES[:] = [n for n in names if not n.startswith("_") and n != "base"]
    return _MODULE_NAMES


def _iter_readers():
    """Every format module's READER in module-name order, each module imported only when the
    ones before it did not claim the file: recognising a trace (the first module) no longer
    imports every reader (~35 ms per process)."""
    for name in _reader_modules():
        if name not in _LOADED:
            module = importlib.import_module(f"{__name__}.{name}")
            _LOADED[name] = getattr(module, "READER", None)
        reader = _LOADED[name]
        if reader is not None:
            yield reader


def readers() -> list:
    """Every format module's READER, in module-name order (a new format = a new module)."""
    return list(_iter_readers())


def read_head(path: Path, n: int = 1 << 16) -> bytes:
    """First n bytes of the (decompressed) content, every gzip member read in turn. A gzip stream
    cut short (a profiler killed while compressing) still gives the bytes before the cut, so that
    the file is recognised and its complete events salvaged; raises OSError / EOFError when
    nothing decodes."""
    with open(path, "rb") as f:
        if f.read(2) != GZIP_MAGIC:
            f.seek(0)
            return f.read(n)
        f.seek(0)
        gz = Members(f)
        head = gz.read(n)
        if not head and gz.error:
            raise EOFError(gz.error)
        return head


# Leading bytes of what a file may really be when no reader claims it (a .gz that is not gzip).
_OTHER_CONTENT = (
    (b"BZh", "bzip2-compressed: decompress it with bunzip2"),
    (b"\xfd7zXZ\x00", "xz-compressed: decompress it with unxz"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed: decompress it with unzstd"),
    (b"PK\x03\x04", "a zip archive: unzip it"),
    (b"\xff\xfe", "UTF-16 text: convert it with iconv -f UTF-16 -t UTF-8"),
    (b"\xfe\xff", "UTF-16 text: convert it with iconv -f UTF-16 -t UTF-8"),
)


def content_hint(path: Path) -> str:
    """What the file looks like when no reader claims it, with what to do ('' when nothing)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return ""
    for magic, what in _OTHER_CONTENT:
        if head.startswith(magic):
            return f"the file is {what}"
    if head[8:12] == b"DUCK":
        return (
            "the file is a DuckDB database, not profiler output: to read it, give it as the database "
            f"(slowcard diagnose --db {path.name}, slowcard query NAME --db {path.name})"
        )
    if len(head) >= 2 and head[0] == 0x78 and (head[0] << 8 | head[1]) % 31 == 0:
        return "the file is raw zlib data (no gzip header): decompress it with pigz -dz or zlib.decompress in Python"
    if len(head) >= 8 and (head[1::2].count(0) >= len(head) // 4 or head[0::2].count(0) >= len(head) // 4):
        return "the file looks like UTF-16 text: convert it with iconv -f UTF-16 -t UTF-8"
    return ""


def detect(path: Path) -> tuple[object | None, str | None]:
    """(reader, format name) for a file, by its content; (None, None) when nothing claims it.

    Raises InputError when the file cannot be read at all (empty, corrupt gzip, unreadable).
    """
    reader, fmt, _head = _detect(path)
    return reader, fmt


def _detect(path: Path) -> tuple[Reader | None, str | None, bytes]:
    """detect() and the head it looked at."""
    try:
        head = read_head(path)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(
            path,
            f"cannot read the file ({exc})",
            hint="if it is gzip, the archive is corrupt: re-copy or re-compress it",
        ) from None
    if not head.strip():
        raise InputError(
            path,
            "the file is empty; expected a Chrome trace JSON, an operator CSV or "
            "another supported format (see README, Input formats)",
        )
    for reader in _iter_readers():
        fmt = reader.sniff(path, head)
        if fmt:
            return reader, fmt, head
    return None, None, head


def companion(path: Path, head: bytes) -> str | None:
    """Why a file that no reader claims is still known (a companion of other files, or a tool
    output slowcard does not need), or None; see ``_known``."""
    return _known.known(path, head)


@dataclass
class FileResult:
    """One line of the ingest summary."""

    path: str
    format: str | None
    status: str  # ok | salvaged | truncated | failed | skipped
    rank: int | None = None
    rank_source: str | None = None
    rows_kept: int = 0
    rows_dropped: int = 0
    size_bytes: int = 0
    seconds: float = 0.0
    message: str = ""


@dataclass
class IngestReport:
    run: str
    db_path: str
    files: list[FileResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # facts of the run that are not problems (unknown devices)

    @property
    def failed(self) -> list[FileResult]:
        return [f for f in self.files if f.status == "failed"]

    @property
    def exit_code(self) -> int:
        """0 all ingested, 1 some files failed or were salvaged/truncated (README contract)."""
        return 1 if any(f.status in ("failed", "salvaged", "truncated") for f in self.files) else 0


class Walked(str):
    """A file path that was found by walking a folder the user named (not named itself): an
    unknown format there is skipped, not failed. ``run_batches`` hands root files on this way."""


def run_batches(
    paths: list[str | Path], run: str | None, per_folder: bool
) -> tuple[list[tuple[str | None, list]], list[str]]:
    """((run name, paths) batches, notes) for ``ingest``: one batch, or with ``per_folder`` one
    per sub-folder of each root, named after it. Files at a root itself (beside the run folders)
    are not dropped: they make a run of their own, named after the root (a note says so)."""
    if not per_folder:
        return [(run, list(paths))], []
    batches: list[tuple[str | None, list]] = []
    notes: list[str] = []
    for raw in paths:
        root = Path(raw)
        if not root.is_dir():
            raise UsageError(f"{raw}: --run-per-folder needs folders whose sub-folders are runs")
        entries = sorted(p for p in root.iterdir() if not p.name.startswith("."))
        subs = [p for p in entries if p.is_dir()]
        files = [p for p in entries if p.is_file()]
        if not subs and not files:
            raise UsageError(f"{raw}: has no sub-folders to take as runs")
        batches += [(sub.name, [sub]) for sub in subs]
        if files:
            name = root.resolve().name or "root"
            if name in {s.name for s in subs}:
                name = f"{name} (root files)"
            batches.append((name, [Walked(f) for f in files]))
            notes.append(
                f"{raw}: {len(files)} file(s) at the top level, beside the run folders, are ingested as run {name!r}"
            )
    return batches, notes


def _resolve(p: Path) -> Path:
    """The real path, or the path as named when it leads nowhere (a dangling link, a link loop):
    then ingest_file reports the link itself, not a target that does not exist."""
    if not os.path.exists(p):
        return Path(os.path.abspath(p))
    try:
        return p.resolve()
    except (RuntimeError, OSError):
        return Path(os.path.abspath(p))


def expand_paths(paths: list[str | Path]) -> list[tuple[Path, bool]]:
    """Files to ingest, each with whether the user named it explicitly (True) or it was found by
    walking a folder or a glob (False: unknown formats there are skipped, not failed)."""
    out: list[tuple[Path, bool]] = []
    seen: set[Path] = set()

    def add(p: Path, explicit: bool):
        rp = _resolve(p)
        if rp not in seen:
            seen.add(rp)
            out.append((rp, explicit))

    for raw in paths:
        p = Path(raw)
        if p.is_file():
            add(p, not isinstance(raw, Walked))
        elif p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(files):
                    if not name.startswith("."):
                        add(Path(root) / name, False)
        elif any(ch in str(raw) for ch in "*?["):
            matches = sorted(globlib.glob(str(raw), recursive=True))
            if not matches:
                raise UsageError(f"{raw}: the pattern matches no file")
            for m in matches:
                mp = Path(m)
                if mp.is_file():
                    add(mp, False)
                elif mp.is_dir():
                    for x in expand_paths([mp]):
                        if x[0] not in seen:
                            seen.add(x[0])
                            out.append(x)
        elif os.path.lexists(p):
            add(p, True)  # a FIFO, device, dangling link or loop: ingest_file says which
        else:
            raise UsageError(f"{raw}: no such file or folder")
    return out


def file_problem(path: Path) -> str | None:
    """Why a path cannot be ingested as a file (None when it is a regular, readable file).

    Checked before the file is opened: opening a FIFO waits for a writer forever, a device such as
    /dev/zero never ends, and a dangling link or a link loop would be a traceback."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return f"a dangling symbolic link (its target {os.readlink(path)!r} does not exist)"
        return "no such file (removed while the ingest ran?)"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop (the link points back to itself)"
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISREG(st.st_mode):
        if not os.access(path, os.R_OK):
            return "cannot be read (permission denied)"
        return None
    kind = (
        "a named pipe (FIFO)"
        if stat.S_ISFIFO(st.st_mode)
        else "a device"
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
        else "a socket"
        if stat.S_ISSOCK(st.st_mode)
        else "not a file"
    )
    return f"{kind}, not a regular file; copy its content to a file and ingest that"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size if file_problem(path) is None else 0
    except OSError:
        return 0


def default_run_name(paths: list[str | Path]) -> str:
    p = _resolve(Path(paths[0]))
    if any(ch in str(paths[0]) for ch in "*?["):
        p = _resolve(Path(str(paths[0]).split("*")[0]))
    return (p if p.is_dir() else p.parent).name or "run"


ProgressFn = Callable[[dict], None]


class _Progress:
    def __init__(self, fn: ProgressFn | None, total_files: int, total_bytes: int):
        self.fn = fn
        self.lock = threading.Lock()
        self.state = {
            "files_done": 0,
            "files_total": total_files,
            "bytes_done": 0,
            "bytes_total": total_bytes,
            "events": 0,
            "current": None,
        }

    def update(self, **kw):
        if not self.fn:
            return
        with self.lock:
            for k, v in kw.items():
                if k in ("files_done", "bytes_done", "events"):
                    self.state[k] += v
                else:
                    self.state[k] = v
            self.fn(dict(self.state))


def prepare_batch(paths, run, rank_pattern, rank_map):
    """Validate what a batch of files needs before any work: (files, run name, rank map).

    Shared by the local and the Dask path, so both refuse the same bad arguments the same way.
    """
    if not paths:
        raise UsageError("give at least one file, folder or glob to ingest")
    files = expand_paths(paths)
    # a run name is a name: stored as text, whatever bytes the folder or --run gave (store.db_text)
    run = store.db_text(run or default_run_name(paths))
    rmap = ranks_mod.load_rank_map(rank_map) if rank_map else None
    if rank_pattern:
        import re

        try:
            re.compile(rank_pattern)
        except re.error as exc:
            raise UsageError(f"--rank-pattern {rank_pattern!r} is not a valid regular expression: {exc}") from None
    return files, run, rmap


# --jobs when not given: files at once while every file is small enough for its fixed cost (~60 ms
# of planning and bookkeeping, single-threaded: ~15 MB of JSON at DuckDB's speed) to matter. On
# 2 cores, 8 real rank files of 1.3 MB: 0.85 s at 2 jobs against 1.0-1.06 s at 1; 6 ranks 0.8 vs
# 0.92 s; 128 small files 1.46x (bench/README.md). Larger files keep one at a time: DuckDB
# already parses each with every thread (8 x 90 MB: 3.5-3.8 s at 2 jobs against 3.6-4.0 s).
AUTO_JOBS_MAX_FILE_BYTES = 32 << 20
AUTO_JOBS_MAX = 8


def auto_jobs(sizes: Sequence[int]) -> int:
    """Files ingested at once when --jobs is not given: one per core (at most AUTO_JOBS_MAX) when
    there are several files and none is over AUTO_JOBS_MAX_FILE_BYTES on disk, else 1."""
    if len(sizes) < 2 or max(sizes) > AUTO_JOBS_MAX_FILE_BYTES:
        return 1
    return max(1, min(os.cpu_count() or 1, len(sizes), AUTO_JOBS_MAX))


def ingest_paths(
    db_path: str | Path,
    paths: Sequence[str | Path],
    run: str | None = None,
    jobs: int | None = None,
    rank_pattern: str | None = None,
    rank_map: str | Path | None = None,
    options: IngestOptions | None = None,
    progress: ProgressFn | None = None,
    con: duckdb.DuckDBPyConnection | None = None,
    device_map: str | Path | None = None,
) -> IngestReport:
    """Ingest files, folders or globs into one database under one run name.

    Each file is one commit: it appears whole or not at all; ingesting the same path into the
    same run again replaces its rows. Files that fail are reported and the others go on.
    ``jobs``: files at once (None: ``auto_jobs`` of the files' sizes). Unless it is 1, plain trace
    files up to 256 MB go in batches (ingest/_shared.py): all of a batch at once, their parts in
    one INSERT, the members that succeeded committed in one transaction (a member that fails
    leaves nothing and the others are committed without it).
    """
    files, run, rmap = prepare_batch(paths, run, rank_pattern, rank_map)
    dmap = devices_mod.load_device_map(device_map) if device_map else None
    opts = options or IngestOptions()
    own = con is None
    con = con or store.open_db(db_path)
    report = IngestReport(run=run, db_path=str(db_path))
    try:
        store.ensure_run(con, run, str(_resolve(Path(paths[0]))))
        sizes = {p: _size(p) for p, _ in files}
        prog = _Progress(progress, len(files), sum(sizes.values()))
        stopping = threading.Event()
        work = [(p, explicit, sizes[p]) for p, explicit in files]
        # --jobs 1 means one file at a time, each in its own statements: no batch
        batching = jobs is None or jobs > 1
        if jobs is None:
            jobs = auto_jobs([size for _, _, size in work])

        cursors: set = set()  # of the files being ingested, to interrupt on Ctrl-C

        def one(item, shared: SharedBatch | None = None):
            p, explicit, size = item
            if stopping.is_set():
                raise KeyboardInterrupt
            cur = con.cursor()
            cursors.add(cur)
            cur.execute("SET enable_progress_bar = false")  # a cursor has its own settings; stdout is ours
            seen = [0]  # bytes of this file already reported by its reader's threads
            seen_lock = threading.Lock()

            def on_bytes(n: int) -> None:
                with seen_lock:
                    n = min(n, size - seen[0])
                    seen[0] += n
                prog.update(bytes_done=n)

            try:
                prog.update(current=str(p))
                if shared is not None:
                    shared.start_prework(p)  # a few members at a time before the INSERT
                res = ingest_file(cur, p, run, explicit, size, opts, rank_pattern, rmap, on_bytes, stopping, shared)
            finally:
                if shared is not None:
                    shared.leave(p)  # the other files of its batch never wait for it
                cursors.discard(cur)
                cur.close()
            prog.update(files_done=1, bytes_done=size - seen[0], events=res.rows_kept)
            return res

        def in_threads(fn: Callable[[int], FileResult], indices: list[int], workers: int) -> None:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(fn, i): i for i in indices}
                try:
                    # wait in short steps: os.kill / a terminal may deliver SIGINT to any thread,
                    # and a main thread blocked in one long wait handled it only once a whole
                    # file had finished (a Ctrl-C then let the other files commit as well)
                    pending = set(futures)
                    while pending:
                        done, pending = futures_wait(pending, timeout=0.1, return_when=FIRST_EXCEPTION)
                        for f in done:
                            exc = f.exception()
                            if exc is not None:
                                raise exc
                    for f, i in futures.items():
                        results[i] = f.result()
                except KeyboardInterrupt:
                    # Ctrl-C reaches the main thread only: stop the workers' statements too,
                    # instead of waiting for every queued file to finish.
                    stopping.set()
                    while cursors:
                        for c in list(cursors):
                            try:
                                c.interrupt()
                            except duckdb.Error:
                                pass
                        time.sleep(0.05)
                    raise

        results: dict[int, FileResult] = {}
        # Small plain traces go in batches: one thread per file, one INSERT for all their parts
        # (ingest/_shared.py); the other files as before, `jobs` at a time.
        batches = plan_batches([(i, str(p), size) for i, (p, _explicit, size) in enumerate(work)]) if batching else []
        for batch in batches:
            shared = SharedBatch(len(batch), stopping)
            try:
                in_threads(partial(_in_batch, one, work, shared), batch, len(batch))
            finally:
                shared.close()
                try:
                    shared.release_ids(con)  # ids of members skipped or failed before they took one
                except duckdb.Error:
                    pass  # left pending: the next open removes them (store.clean_pending)
        batched = {i for batch in batches for i in batch}
        rest = [i for i in range(len(work)) if i not in batched]
        if jobs > 1 and len(rest) > 1:
            # Each worker thread has its own cursor; DuckDB runs the parsing off the GIL. Every
            # file keeps all DuckDB threads (`threads` is one setting for the whole database):
            # with threads split between jobs, 8 files of 90 MB took 4.3 s at --jobs 2 against
            # 3.6 s at --jobs 1; shared, 3.5-3.8 s, and 64 small files 3.0 s against 4.4 s.
            in_threads(lambda i: one(work[i]), rest, jobs)
        else:
            for i in rest:
                results[i] = one(work[i])
        report.files = [results[i] for i in range(len(work))]
        report.warnings = run_checks(con, run)
        report.notes, extra = devices_mod.identify(con, run, dmap)
        report.notes += written_twice(con, run)
        report.warnings += extra
        # The stored cross-rank views (store.MATERIALIZED) follow the new files now, so that the
        # duckdb shell reads the same rows as slowcard's queries right after an ingest.
        try:
            store.refresh_materialized(con)
        except duckdb.Error as exc:
            # the files are committed; a refresh that cannot be written (disk full) is redone by
            # the next slowcard command that opens the database (store.ensure_fresh)
            report.warnings.append(
                f"the stored views were not brought up to date ({str(exc).splitlines()[0]}); the files "
                "above are committed, and the next slowcard command on this database updates them"
            )
    finally:
        if own:
            con.close()
    return report


@contextmanager
def _duckdb_readable(path: Path):
    """The path as DuckDB can open it: itself, or for a name that is not UTF-8 (DuckDB takes
    UTF-8 names only; the OS gives bytes) the file opened here, as /proc/self/fd/N."""
    name = str(path)
    if store.db_text(name) == name or not os.path.isdir("/proc/self/fd"):
        yield name
        return
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _carries_groups(path: Path) -> bool:
    """A companion that is also data: torch_npu's profiler_metadata.json with parallel_group_info
    (read by ingest/parallel_groups.py); the other companions are only read for rank identity."""
    from . import parallel_groups

    try:
        return parallel_groups.READER.sniff(path, read_head(path)) == "ascend_parallel_groups"
    except (OSError, EOFError, zlib.error):
        return False


def ingest_file(
    con,
    path: Path,
    run: str,
    explicit: bool,
    size: int,
    opts: IngestOptions,
    rank_pattern: str | None = None,
    rank_map=None,
    on_bytes=None,
    stopping: threading.Event | None = None,
    shared: SharedBatch | None = None,
) -> FileResult:
    """Ingest one file; never raises for bad input (the FileResult says what happened).
    ``stopping``: set when the batch was interrupted (Ctrl-C); a file whose rows are in but not yet
    committed is then left out (its transaction rolled back), never committed after the Ctrl-C.
    ``shared``: the batch of files this one goes in with (ingest/_shared.py); the caller makes
    the file leave the batch's meeting points it did not reach (SharedBatch.leave), whatever
    happened here."""
    t0 = time.perf_counter()
    result = FileResult(path=str(path), format=None, status="failed", size_bytes=size)
    if path.name.startswith(COMPANION) and path.suffix == ".json" and not _carries_groups(path):
        result.status, result.message = "skipped", companion(path, b"") or ""
        return result
    problem = file_problem(path)
    if problem:
        result.status = "failed" if explicit else "skipped"
        result.message = f"{path}: {problem}"
        return result
    try:
        reader, fmt, head = _detect(path)
    except InputError as exc:
        result.message = str(exc)
        return result
    note = companion(path, head) if reader is None else None
    if note:
        result.status, result.message = "skipped", note
        return result
    if reader is None:
        msg = (
            f"{path}: unknown format; expected a Chrome trace JSON (.json/.json.gz), an Ascend "
            "kernel_details/op_summary CSV, an msServiceProfiler CSV, an msprof-analyze cluster "
            "output, an Ascend step_trace_time.csv / communication(_matrix).json or expert-load data "
            "(README, Input formats)"
        )
        hint = content_hint(path)
        result.status = "failed" if explicit else "skipped"
        result.message = f"{msg}; {hint}" if hint else msg
        return result
    assert fmt is not None  # a reader that claims a file names its format
    result.format = fmt
    guess = getattr(reader, "guess_note", None)
    guess = guess(path, head, fmt) if guess else None
    # A batch hashes its members in a thread of its own while they read their headers (hashed
    # after the rows, 64 files held up the batch's commit by 0.09 s); the hash is of the file
    # whose size was taken above.
    hashed = shared.fingerprint(path, size) if shared is not None else None
    sid = shared.source_id(con) if shared is not None else store.new_source_id(con)
    try:
        with store.discard_on_error(con, sid):
            with _duckdb_readable(path) as db_path:
                outcome: Outcome = reader.ingest(Context(path, fmt, sid, run, con, opts, on_bytes, db_path, shared))
            if guess:
                outcome.message = f"{outcome.message}; {guess}" if outcome.message else guess
            info = ranks_mod.resolve(path, outcome.rank_hints, rank_pattern, rank_map)
            rec = store.SourceRecord(
                format=fmt,
                rows_seen=outcome.rows_seen,
                rows_kept=outcome.rows_kept,
                rows_dropped=outcome.rows_dropped,
                status=outcome.status,
                message=outcome.message,
                metadata=outcome.metadata,
                base_time_ns=outcome.base_time_ns,
                rank=info.rank,
                rank_source=info.source,
                dp_rank=info.dp_rank,
                tp_rank=info.tp_rank,
                pp_rank=info.pp_rank,
                ep_rank=info.ep_rank,
                world_size=info.world_size,
                host=info.host,
            )
            if stopping is not None and stopping.is_set():
                raise KeyboardInterrupt  # Ctrl-C came while this file's rows went in: not committed
            commit = store.Commit(
                sid,
                run,
                str(path),
                size,
                hashed.result() if hashed is not None else store.fingerprint_file(path, size),
                rec,
                outcome.drops,
                outcome.cell_drops,
            )
            # a batch commits the files that got here in one transaction; if that fails, each alone
            if shared is None or not shared.commit(path, con, commit):
                if stopping is not None and stopping.is_set():
                    raise KeyboardInterrupt  # the batch's commit was stopped by Ctrl-C: not alone either
                store.commit_sources(con, [commit])
    except InputError as exc:
        result.message = str(exc)
        return result
    except duckdb.InterruptException:
        raise KeyboardInterrupt from None  # Ctrl-C inside DuckDB: stop the batch, not this file
    except duckdb.Error as exc:
        result.message = f"{path}: the database refused the rows ({str(exc).splitlines()[0]})"
        return result
    except Exception as exc:
        if is_interrupt(exc):
            raise KeyboardInterrupt from None  # how DuckDB reports a Ctrl-C that reached it
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            # the temp folder filled while this file alone was decompressed into it (a batch's
            # member goes alone first, chrome_parts._alone): a place to fix, not a bug to report
            where = f" ({os.path.dirname(os.path.dirname(exc.filename))})" if exc.filename else ""
            result.message = (
                f"{path}: the temp folder{where} is full ({exc.strerror}); the other files were "
                "ingested: free space there or point SLOWCARD_TMP_DIR at a folder with more room, "
                "then ingest this file again"
            )
            return result
        # A reader bug or an input nobody foresaw: fail this file, name it, and go on with the
        # others (never a traceback that loses the whole run).
        result.message = (
            f"{path}: could not be read ({type(exc).__name__}: {exc}); "
            "the other files were ingested; please report this file"
        )
        return result
    result.status = outcome.status
    result.rank, result.rank_source = info.rank, info.source
    result.rows_kept, result.rows_dropped = outcome.rows_kept, outcome.rows_dropped
    result.message = outcome.message
    if info.rank is None and fmt in RANKED_FORMATS:
        note = (
            "no rank: no distributedInfo.rank, profiler_info, vLLM folder name, --rank-pattern "
            "or --rank-map entry names it; stored with rank NULL"
        )
        result.message = f"{result.message}; {note}" if result.message else note
    result.seconds = time.perf_counter() - t0
    return result


def _in_batch(one: Callable, work: list, shared: SharedBatch, i: int) -> FileResult:
    """File ``i`` of ``work`` ingested by ``one`` as a member of batch ``shared``."""
    return one(work[i], shared)


def written_twice(con, run: str) -> list[str]:
    """A note for ranks whose operators came in twice, as an operator table (kernel_details.csv /
    op_summary) and a timeline (trace_view.json): torch_npu writes both into one output folder.
    Not a conflict: the queries read a rank's collectives from one of them
    (views/30_collectives.sql); the note says why a rank has two files."""
    ranks = [
        r[0]
        for r in con.execute(
            """SELECT rank FROM sources WHERE run = ? AND rank IS NOT NULL AND status <> 'failed'
               GROUP BY rank
               HAVING bool_or(format = 'ascend_trace') AND bool_or(format IN ('kernel_details', 'op_summary'))
               ORDER BY rank""",
            [run],
        ).fetchall()
    ]
    if not ranks:
        return []
    return [
        f"operators written twice: {len(ranks)} rank(s) ({devices_mod.shown_ranks(ranks)}) have an operator table and a timeline "
        "(trace_view.json) each, as torch_npu writes them; the queries read a rank's collectives from one "
        "of them, never both"
    ]


def run_checks(con, run: str) -> list[str]:
    """Duplicate ranks and missing ranks (when world_size is known) in one run, and parallel groups
    not used as written."""
    warnings = []
    fmts = ", ".join(f"'{f}'" for f in sorted(RANKED_FORMATS))
    for fmt, rank, n in con.execute(
        f"""SELECT format, rank, count(*) FROM sources WHERE run = ? AND rank IS NOT NULL
            AND format IN ({fmts}) GROUP BY ALL HAVING count(*) > 1 ORDER BY 1, 2""",
        [run],
    ).fetchall():
        warnings.append(f"run {run!r}: rank {rank} appears in {n} {fmt} files (duplicate rank)")
    for fmt, ws, have in con.execute(
        f"""SELECT format, max(world_size), list(DISTINCT rank ORDER BY rank) FROM sources
            WHERE run = ? AND format IN ({fmts}) AND rank IS NOT NULL GROUP BY format""",
        [run],
    ).fetchall():
        if ws and len(have) < ws:
            # Never build the set of all ranks: a header saying world_size 1e9 would take GBs.
            present = set(have)
            n_missing = ws - sum(1 for r in present if 0 <= r < ws)
            first: list[int] = []
            r = 0
            while len(first) < 21 and r < ws:
                if r not in present:
                    first.append(r)
                r += 1
            shown = ", ".join(map(str, first[:20])) + (" …" if n_missing > 20 else "")
            warnings.append(f"run {run!r}: {fmt} world_size is {ws} but {n_missing} ranks are missing ({shown})")
    n_null = con.execute(
        f"SELECT count(*) FROM sources WHERE run = ? AND rank IS NULL AND format IN ({fmts})", [run]
    ).fetchone()[0]
    if n_null:
        warnings.append(f"run {run!r}: {n_null} file(s) have no rank (rank NULL)")
    ws = con.execute("SELECT max(world_size) FROM sources WHERE run = ?", [run]).fetchone()[0]
    if ws:
        con.execute("UPDATE runs SET world_size = ? WHERE run = ?", [ws, run])
    from . import parallel_groups  # groups that name ranks the run does not have, or contradict

    return warnings + parallel_groups.run_warnings(con, run)
