"""`slowcard watch`: collect live service metrics into the database and re-judge the metrics
verdicts after every interval.

Two sources (one per watch):

- ``ScrapeSource``: GET each ``/metrics`` endpoint (one per DP engine or one per instance);
  the DP rank is the endpoint's ``URL=DP`` mapping, else the sample's ``engine`` label, else the
  endpoint's position in the list.
- ``PrometheusSource``: range queries on a Prometheus server's HTTP API (``/api/v1/query_range``,
  raw series of the mapped metrics, one step per interval): a backfill of the last hours in
  bounded chunks, then the new steps at each interval.

Both yield snapshots (slowcard/metrics.py), one request's worth at a time; consecutive
snapshots make windows, written with the expert-load slots and the per-endpoint outcome in ONE
transaction per collection (per 20,000 rows of a long backfill; a Ctrl-C or a crash leaves whole
windows only). What an endpoint says is never trusted (issue 31): every request ends by one
deadline (headers and body), answers are read up to a byte cap, samples up to series caps, and
every number that becomes a key, a time or a duration is checked (finite, in range; a range
query's timestamps on the asked step grid) with the bad sample dropped and counted. Only the
previous snapshot is kept in memory, and windows older than the retention are deleted, so a
watch of days stays bounded. A database busy with a reader holds the windows in memory
(bounded) until the next collection: the watch never ends for it.

Never prints: events go to the caller's callback (the CLI prints them).
"""

from __future__ import annotations

import http.client
import io
import json
import math
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from . import metrics as mx
from . import queries as queries_mod
from . import store
from .errors import DatabaseBusy, UsageError, is_interrupt

# What watch writes: the verdicts re-judged after each interval are those whose every required
# relation is one of these (found from the query headers, never by name).
WATCH_RELATIONS = frozenset({"metric_windows", "metric_scrapes", "expert_load"})


def watched_queries(catalog: dict) -> list:
    """The verdict queries judged from collected metrics alone, in diagnosis order."""
    return sorted(
        (q for q in catalog.values() if q.rule is not None and q.requires and set(q.requires) <= WATCH_RELATIONS),
        key=lambda q: (q.order, q.name),
    )


MAX_BYTES = 32 << 20  # a /metrics body or an API answer larger than this is refused
MAX_SERIES = 50_000  # mapped samples kept per endpoint and snapshot
MAX_API_SAMPLES = 500_000  # samples kept from one range-query answer (all its steps)
MAX_INSTANCES = 10_000  # distinct Prometheus instances remembered (their position is their DP)
BACKFILL_CHUNK_STEPS = 120  # range-query steps per request during backfill (bounds memory)
MAX_BACKFILL_STEPS = 20_000  # steps one backfill may ask for (168 requests at most)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@dataclass
class Fetch:
    """The outcome of one request: the body, or why there is none."""

    body: str | None
    error: str | None = None


class _DeadlineSocket:
    """A connected socket whose every read and write ends by one deadline: a per-read timeout
    never fires on a server that sends a byte a second (of headers or of body), so the whole
    request gets one time budget instead."""

    def __init__(self, sock, deadline: float):
        self._sock = sock
        self._deadline = deadline
        self._readers = 0  # open makefile() readers: the socket closes after the last one (as socket.makefile)
        self._closed = False

    def arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request ran past its deadline")
        self._sock.settimeout(left)

    def sendall(self, data, *args):
        self.arm()
        return self._sock.sendall(data, *args)

    def makefile(self, mode="r", *args, **kwargs):
        if mode != "rb":  # http.client reads its answers through makefile("rb") only
            return self._sock.makefile(mode, *args, **kwargs)
        self._readers += 1
        return io.BufferedReader(_DeadlineReader(self))

    def recv_into(self, buf, *args):
        self.arm()
        return self._sock.recv_into(buf, *args)

    def close(self) -> None:
        # urllib closes the connection's socket once the answer's headers are read, while the
        # body is still to be read through the reader: the socket itself closes after it
        self._closed = True
        if self._readers == 0:
            self._sock.close()

    def reader_closed(self) -> None:
        self._readers -= 1
        if self._closed and self._readers == 0:
            self._sock.close()

    def __getattr__(self, name):
        return getattr(self._sock, name)


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket):
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        return self._sock.recv_into(buf)

    def close(self) -> None:
        if not self.closed:
            super().close()
            self._sock.reader_closed()


def _opener(deadline: float) -> urllib.request.OpenerDirector:
    """A urllib opener (proxies and redirects as usual) whose connections all end by ``deadline``."""

    def with_deadline(base):
        class Connection(base):
            def connect(self):
                self.timeout = max(0.001, deadline - time.monotonic())
                super().connect()
                self.sock = _DeadlineSocket(self.sock, deadline)

        return Connection

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(with_deadline(http.client.HTTPConnection), req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(with_deadline(http.client.HTTPSConnection), req, context=self._context)

    return urllib.request.build_opener(Http, Https)


def _failure(exc: BaseException) -> str:
    """A short reason for a failed request."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        if isinstance(reason, BaseException):
            return _failure(reason)
        return f"unreachable ({str(reason)[:80]})"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, http.client.HTTPException):
        return f"bad HTTP answer ({type(exc).__name__})"
    return f"{type(exc).__name__}: {str(exc)[:80]}"


def http_request(
    url: str, timeout_s: float, max_bytes: int = MAX_BYTES, data: bytes | None = None, headers: dict | None = None
) -> tuple[int | None, bytes | None, str | None]:
    """(status, body, error) of one GET (or POST of ``data``): the whole request, headers and
    body, ends within ``timeout_s``; a body over ``max_bytes`` is refused. Every failure becomes
    a short reason, never an exception."""
    deadline = time.monotonic() + timeout_s
    try:
        req = urllib.request.Request(url, data=data, headers=headers or {})
        with _opener(deadline).open(req) as resp:
            length = resp.headers.get("Content-Length")
            if length and length.strip().isdigit() and int(length) > max_bytes:
                return resp.status, None, f"response over {max_bytes >> 20} MB"
            chunks, got = [], 0
            while got <= max_bytes:
                chunk = resp.read(min(1 << 20, max_bytes + 1 - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
            if got > max_bytes:
                return resp.status, None, f"response over {max_bytes >> 20} MB"
            return resp.status, b"".join(chunks), None
    except Exception as exc:  # noqa: BLE001 (a hostile answer must never end the watch)
        return getattr(exc, "code", None), None, _failure(exc)


def http_get(url: str, timeout_s: float, max_bytes: int = MAX_BYTES) -> Fetch:
    """GET within one deadline and a size cap; every failure becomes a short reason."""
    _status, body, error = http_request(url, timeout_s, max_bytes, headers={"Accept": "text/plain, application/json"})
    if body is None:
        return Fetch(None, error)
    return Fetch(body.decode("utf-8", errors="replace"))


@dataclass
class TargetStatus:
    target: str
    ok: bool
    samples: int = 0
    dropped: int = 0
    error: str | None = None
    note: str | None = None  # why samples were dropped (the first reasons, with counts)


class Drops:
    """Dropped samples: how many, and the first few reasons with their counts."""

    KEPT_REASONS = 3

    def __init__(self):
        self.total = 0
        self.reasons: dict[str, int] = {}

    def add(self, reason: str, n: int = 1) -> None:
        self.total += n
        if reason in self.reasons or len(self.reasons) < self.KEPT_REASONS:
            self.reasons[reason] = self.reasons.get(reason, 0) + n

    def note(self) -> str | None:
        if not self.total:
            return None
        text = "; ".join(f"{n} x {r}" for r, n in self.reasons.items())
        shown = sum(self.reasons.values())
        return text + (f"; {self.total - shown} more" if self.total > shown else "")


def _families(wanted: dict) -> set[str]:
    """Family names of the wanted samples (for keeping their # TYPE lines)."""
    out = set()
    for n in wanted:
        out.add(n)
        out.add(re.sub(r"_(bucket|sum|count|total)$", "", n))
    return out


def exposition_parser():
    """prometheus_client's text parser, or UsageError naming the extra that brings it."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        raise UsageError(
            "watch --scrape reads /metrics with the optional package prometheus_client, which is not "
            "installed: pip install 'slowcard[metrics]' (or pip install prometheus_client); "
            "watch --prometheus does not need it"
        ) from None
    return text_string_to_metric_families


def parse_scrape(
    text: str,
    snap: mx.Snapshot,
    mapping: mx.Mapping,
    wanted: dict,
    target: str,
    default_dp: int | None,
    forced_dp: int | None,
    max_series: int = MAX_SERIES,
) -> TargetStatus:
    """Add one endpoint's /metrics text to a snapshot: only the mapped families are parsed; a
    sample whose rank label, bucket bound or value is not a usable number is dropped and counted
    (with its reason in ``note``), the rest of the scrape is kept."""
    exposition_parser()
    from .ingest.prometheus_text import parse_exposition

    fams = _families(wanted)
    keep: list[str] = []
    content = 0
    for line in text.splitlines():
        st = line.strip()
        if not st:
            continue
        if st.startswith("#"):
            parts = st.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("TYPE", "HELP") and parts[2] in fams:
                keep.append(st)
            continue
        content += 1
        m = _NAME.match(st)
        if m and m.group(0) in wanted:
            keep.append(st)
    samples, bad_lines = parse_exposition(keep) if keep else ([], [])
    kept = 0
    drops = Drops()
    for _fam, _typ, s in samples:
        if kept >= max_series:
            drops.add(f"over the cap of {max_series} series per endpoint")
            continue
        why = mx.add_sample(snap, mapping, wanted, target, default_dp, s.name, s.labels, s.value, forced_dp)
        if why is None:
            kept += 1
        elif why != mx.NOT_MAPPED:
            drops.add(why)
    for reason, _where, n in bad_lines:
        drops.add(reason, n)
    if kept == 0:
        why = (
            ("no vLLM metric in the answer" if content else "empty answer")
            if not bad_lines
            else f"garbage: {bad_lines[0][0]}"
        )
        if not bad_lines and drops.total:
            why = "no usable sample: " + next(iter(drops.reasons))
        return TargetStatus(target, False, 0, drops.total, why, drops.note())
    return TargetStatus(target, True, kept, drops.total, None, drops.note())


# One batch of a collection: the snapshots of one request (oldest first) and the outcome per
# endpoint. A watcher turns each batch into windows before the next one is fetched, so a
# collection holds one batch in memory whatever its step count.
Batch = tuple[list[mx.Snapshot], list[TargetStatus]]


class ScrapeSource:
    """Direct scrapes of /metrics endpoints: ``[(url, dp or None), ...]``."""

    format = "metrics_scrape"

    def __init__(
        self,
        targets: list[tuple[str, int | None]],
        mapping: mx.Mapping,
        timeout_s: float = 5.0,
        max_series: int = MAX_SERIES,
    ):
        if not targets:
            raise UsageError("watch needs at least one --scrape URL or a --prometheus URL")
        exposition_parser()  # a clear message now, not a traceback at the first answer
        for url, dp in targets:
            if dp is not None and not 0 <= dp <= mx.MAX_INDEX:
                raise UsageError(f"--scrape {url}={dp}: the DP rank must be a number from 0 to {mx.MAX_INDEX}")
        self.targets = targets
        self.mapping = mapping
        self.wanted = mapping.wanted()
        self.timeout_s = timeout_s
        self.max_series = max_series
        self.path = " ".join(u for u, _ in targets)

    def collect(self, since_ns: int | None) -> Iterator[Batch]:
        """One snapshot of every endpoint now (``since_ns`` is for API sources)."""
        snap = mx.Snapshot(ts_ns=time.time_ns())
        statuses = []
        for pos, (url, dp) in enumerate(self.targets):
            got = http_get(url, self.timeout_s)
            if got.body is None:
                statuses.append(TargetStatus(url, False, error=got.error))
                continue
            statuses.append(parse_scrape(got.body, snap, self.mapping, self.wanted, url, pos, dp, self.max_series))
        yield [snap], statuses


class PrometheusSource:
    """Range queries on a Prometheus server: backfill, then the steps since the last one.

    Times are whole milliseconds (as Prometheus keeps them): every answer's timestamps must be
    finite, on the asked step grid and inside the asked range, else the value is dropped and
    counted. A step 10 years ahead, one from 1970 or a million distinct timestamps are never
    stored, and each answer makes at most the asked number of snapshots."""

    format = "prometheus_api"

    def __init__(
        self,
        base_url: str,
        mapping: mx.Mapping,
        step_s: float,
        backfill_s: float,
        dp_map: dict[str, int] | None = None,
        timeout_s: float = 10.0,
        max_series: int = MAX_SERIES,
    ):
        self.base = base_url.rstrip("/")
        self.mapping = mapping
        self.wanted = mapping.wanted()
        self.step_ms = max(1, int(round(step_s * 1e3)))
        if backfill_s * 1e3 / self.step_ms > MAX_BACKFILL_STEPS:
            raise UsageError(
                f"--backfill {backfill_s:g} s at --interval {self.step_ms / 1e3:g} s is "
                f"{backfill_s * 1e3 / self.step_ms:.0f} steps; at most {MAX_BACKFILL_STEPS}: "
                "shorten --backfill or lengthen --interval"
            )
        self.backfill_ms = int(round(backfill_s * 1e3))
        for inst, dp in (dp_map or {}).items():
            if not 0 <= dp <= mx.MAX_INDEX:
                raise UsageError(f"--dp-map {inst}={dp}: the DP rank must be a number from 0 to {mx.MAX_INDEX}")
        self.dp_map = dict(dp_map or {})
        self.timeout_s = timeout_s
        self.max_series = max_series
        self.path = self.base
        self._instances: dict[str, int] = {}
        self.chunk_steps = BACKFILL_CHUNK_STEPS  # steps per range request (shrinks on oversized answers)
        self.selector = '{__name__=~"' + "|".join(re.escape(n) for n in sorted(self.wanted)) + '"}'

    def _range(self, start_ms: int, end_ms: int) -> tuple[dict[int, mx.Snapshot], TargetStatus]:
        q = urllib.parse.urlencode(
            {
                "query": self.selector,
                "start": f"{start_ms / 1e3:.3f}",
                "end": f"{end_ms / 1e3:.3f}",
                "step": f"{self.step_ms / 1e3:.3f}",
            }
        )
        _status, body, error = http_request(
            f"{self.base}/api/v1/query_range?{q}", self.timeout_s, headers={"Accept": "application/json"}
        )
        if body is None:
            return {}, TargetStatus(self.base, False, error=error)
        try:
            doc = orjson.loads(body)  # the bytes as they came: no decoded copy of up to MAX_BYTES
            if doc.get("status") != "success":
                return {}, TargetStatus(self.base, False, error=f"API error: {str(doc.get('error'))[:120]}")
            result = doc["data"]["result"]
            if not isinstance(result, list):
                raise TypeError
        except (ValueError, KeyError, TypeError, AttributeError):
            return {}, TargetStatus(self.base, False, error="garbage: not a Prometheus API answer")
        del body, doc
        snaps: dict[int, mx.Snapshot] = {}
        kept = 0
        drops = Drops()
        last_k = (end_ms - start_ms) // self.step_ms
        for series in result:
            try:
                labels = {str(k): str(v) for k, v in dict(series["metric"]).items()}
                name = labels.pop("__name__")
                values = series["values"]
                if not isinstance(values, list):
                    raise TypeError
            except (KeyError, TypeError, ValueError, AttributeError):
                drops.add("a series without metric labels, __name__ or values")
                continue
            inst = labels.get("instance", "?")
            if inst not in self._instances:
                if len(self._instances) >= MAX_INSTANCES:
                    drops.add(f"over the cap of {MAX_INSTANCES} instances", len(values))
                    continue
                self._instances[inst] = len(self._instances)
            target = f"{labels.get('job', '')}/{inst}"
            for pair in values:
                try:
                    ts_ms = float(pair[0]) * 1e3
                    raw = pair[1]
                except (TypeError, ValueError, IndexError, KeyError):
                    drops.add("a value that is not a [timestamp, value] pair")
                    continue
                if not math.isfinite(ts_ms):
                    drops.add(f"timestamp {pair[0]!r} is not a finite number")
                    continue
                k = round((ts_ms - start_ms) / self.step_ms)
                if not 0 <= k <= last_k:
                    drops.add("timestamp outside the asked range (future, ancient or another query's)")
                    continue
                step_ms = start_ms + k * self.step_ms
                if abs(ts_ms - step_ms) > 1.0:
                    drops.add("timestamp off the asked step grid")
                    continue
                if kept >= MAX_API_SAMPLES:
                    drops.add(f"over the cap of {MAX_API_SAMPLES} samples per answer")
                    continue
                snap = snaps.get(step_ms)
                if snap is None:
                    snap = snaps[step_ms] = mx.Snapshot(ts_ns=step_ms * 1_000_000)
                if len(snap.values) >= self.max_series:
                    drops.add(f"over the cap of {self.max_series} series per step")
                    continue
                why = mx.add_sample(
                    snap,
                    self.mapping,
                    self.wanted,
                    target,
                    self._instances[inst],
                    name,
                    labels,
                    raw,
                    self.dp_map.get(inst),
                )
                if why is None:
                    kept += 1
                elif why != mx.NOT_MAPPED:
                    drops.add(why)
        return snaps, TargetStatus(self.base, True, kept, drops.total, None, drops.note())

    def collect(self, since_ns: int | None) -> Iterator[Batch]:
        """Snapshots from the step at ``since_ns`` (else now - backfill) up to now, oldest first,
        one batch per range request (at most ``chunk_steps`` steps each). An answer over
        MAX_BYTES makes the requests 8x shorter (once per range; a single step over it ends the
        collection); any other failed request ends it too: the next collection starts again
        from the last stored step, so a dead server costs one timeout per interval."""
        now_ms = time.time_ns() // 1_000_000
        end = now_ms // self.step_ms * self.step_ms
        first = end - max(self.backfill_ms, self.step_ms)
        start = first if since_ns is None else since_ns // 1_000_000
        start = min(max(start, first), end)  # a stored step from the future must not stop the watch
        t = start
        shrunk = False
        while t <= end:
            t_end = min(end, t + self.step_ms * self.chunk_steps)
            snaps, st = self._range(t, t_end)
            if not st.ok and (st.error or "").startswith("response over") and t_end > t and not shrunk:
                self.chunk_steps = max(1, self.chunk_steps // 8)
                shrunk = True
                continue
            shrunk = False
            yield [snaps[k] for k in sorted(snaps)], [st]
            if not st.ok:
                return
            t = t_end + self.step_ms


# A stored window more than this ahead of the clock is damage (written before timestamps were
# checked, or the clock was stepped back): deleted at the next write instead of blocking every
# later window (a window is stored only when it is newer than the newest one stored).
FUTURE_SLACK_NS = 10 * 60 * 1_000_000_000
MAX_PENDING_ROWS = 200_000  # window rows held in memory while another process holds the database
WRITE_EVERY_ROWS = 20_000  # a long backfill is written as it is fetched, not all at the end
MAX_STEP_ROWS = 20_000  # rows of the newest windows handed to the callback (the status line)


@dataclass
class Step:
    """What one collection did (handed to the callback as the status line's facts)."""

    ts_ns: int
    windows: list[dict] = field(default_factory=list)  # rows of the newest windows (last window's rows last)
    statuses: list[TargetStatus] = field(default_factory=list)
    results: dict = field(default_factory=dict)  # query -> Result (empty while the database is busy)
    changes: list[tuple[str, str, str]] = field(default_factory=list)  # (query, before, after)
    expert_slots: int = 0
    actions: list[str] = field(default_factory=list)  # outcome of --exec / webhook
    n_windows: int = 0  # windows made by this collection (``windows`` may hold only the newest)
    busy: str | None = None  # another process held the database: the windows wait in memory
    held_windows: int = 0  # windows collected but not written yet (database busy)
    lost_windows: int = 0  # windows dropped because the database stayed busy past MAX_PENDING_ROWS


class Watcher:
    """Collect into ``db`` under ``run`` and judge the watched queries after each collection.

    The database is opened only to write and judge, never while fetching, so `slowcard query`
    reads it meanwhile; when a reader holds it past a short wait, the collected windows wait in
    memory (bounded) and are written at the next collection: the watch goes on."""

    def __init__(
        self,
        db: str | Path,
        run: str,
        source,
        retention_s: float = 24 * 3600.0,
        exec_cmd: str | None = None,
        webhook: str | None = None,
        sql_dirs=None,
        exec_timeout_s: float = 30.0,
        busy_wait_s: float | None = None,
        db_lock=None,
    ):
        self.db = Path(db)
        # shared with a capture thread of the same process (slowcard/capture.py): its ingest holds
        # the lock, and a collection that cannot get it within the busy wait holds its windows as
        # for another process's lock (opening the database meanwhile would clean the ingest's
        # pending rows as a killed ingest's)
        self.db_lock = db_lock
        self.run = store.db_text(run)  # a name as the database stores it (bytes that are not UTF-8: \xNN)
        self.source = source
        self.retention_ns = int(retention_s * 1e9)
        self.exec_cmd = exec_cmd
        self.webhook = webhook
        self.exec_timeout_s = exec_timeout_s
        # how long one collection waits for another process's lock before holding its windows
        self.busy_wait_s = min(store.LOCK_WAIT_S, 2.0) if busy_wait_s is None else busy_wait_s
        catalog = queries_mod.load_catalog(sql_dirs)
        self.queries = watched_queries(catalog)
        self.prev: mx.Snapshot | None = None
        self.sid: int | None = None
        self._stored_ts: int | None = None  # the latest window stored before this process
        self._stored_known = False
        self._rows: list[dict] = []  # windows not written yet
        self._experts: list[tuple] = []  # (ts_ns, layer, ep_rank, slot, tokens) not written yet
        self._scrapes: list[tuple[int, TargetStatus]] = []  # (attempt ns, outcome) not written yet
        self._lost = 0

    # --- database ------------------------------------------------------------
    def _open(self, wait_s: float):
        """A write connection, or None while another process holds the database past ``wait_s``."""
        if self.db_lock is not None:
            if not self.db_lock.acquire(timeout=max(wait_s, 0.001)):
                return None
            try:
                return _LockedConnection(store.open_db(self.db, wait_s=wait_s), self.db_lock)
            except DatabaseBusy:
                self.db_lock.release()
                return None
            except BaseException:
                self.db_lock.release()
                raise
        try:
            return store.open_db(self.db, wait_s=wait_s)
        except DatabaseBusy:
            return None

    def _source_id(self, con) -> int:
        path = store.db_text(self.source.path)
        row = con.execute(
            "SELECT source_id FROM sources WHERE run = ? AND path = ? AND format = ?",
            [self.run, path, self.source.format],
        ).fetchone()
        if row:
            return row[0]
        store.ensure_run(con, self.run, path)
        sid = con.execute("""SELECT greatest(nextval('source_id_seq'),
                                 (SELECT coalesce(max(source_id), 0) + 1 FROM sources),
                                 (SELECT coalesce(max(source_id), 0) + 1 FROM pending_sources))""").fetchone()[0]
        con.execute(
            """INSERT INTO sources (source_id, run, path, size_bytes, fingerprint, format, rows_seen,
                           rows_kept, rows_dropped, status, message, metadata, ingested_at)
                       VALUES (?, ?, ?, 0, '', ?, 0, 0, 0, 'ok', '', ?, now())""",
            [sid, self.run, path, self.source.format, json.dumps({"watch": path})],
        )
        return sid

    def _last_ts(self, con, sid: int, now_ns: int) -> int | None:
        """The newest stored window (one from the future does not count: it is deleted at the write)."""
        return con.execute(
            "SELECT max(ts_ns) FROM metric_window_rows WHERE source_id = ? AND ts_ns <= ?",
            [sid, now_ns + FUTURE_SLACK_NS],
        ).fetchone()[0]

    def _attach(self, con) -> None:
        """Register the source (once) and learn its newest stored window."""
        if self.sid is None:
            con.execute("BEGIN")
            try:
                self.sid = self._source_id(con)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        if not self._stored_known:
            self._stored_ts = self._last_ts(con, self.sid, time.time_ns())
            self._stored_known = True

    def _write(self, con, now_ns: int) -> None:
        """Write the held windows, expert slots and outcomes in one transaction; apply retention."""
        self._attach(con)
        sid = self.sid
        assert sid is not None  # set by _attach
        con.execute("BEGIN")
        try:
            cutoff, future = now_ns - self.retention_ns, now_ns + FUTURE_SLACK_NS
            for table in ("metric_window_rows", "metric_scrape_rows", "metric_verdict_rows", "expert_load_rows"):
                con.execute(
                    f"DELETE FROM {table} WHERE source_id = ? AND (ts_ns < ? OR ts_ns > ?)", [sid, cutoff, future]
                )
            last = self._last_ts(con, sid, now_ns)
            rows = [r for r in self._rows if last is None or r["ts_ns"] > last]
            experts = [e for e in self._experts if last is None or e[0] > last]
            if rows:
                _insert_rows(con, sid, rows)
            if experts:
                base = con.execute(
                    "SELECT coalesce(max(window_idx), -1) + 1 FROM expert_load_rows WHERE source_id = ?", [sid]
                ).fetchone()[0]
                index = {ts: base + i for i, ts in enumerate(sorted({e[0] for e in experts}))}
                con.executemany(
                    "INSERT INTO expert_load_rows (source_id, window_idx, ts_ns, epoch, layer, ep_rank, "
                    "local_slot, tokens) VALUES (?, ?, ?, NULL, ?, ?, ?, ?)",
                    [(sid, index[ts], ts, layer, rank, slot, tok) for ts, layer, rank, slot, tok in experts],
                )
            if self._scrapes:
                con.executemany(
                    "INSERT INTO metric_scrape_rows (source_id, ts_ns, target, ok, samples, dropped, error, note) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (sid, ts, store.db_text(s.target), s.ok, s.samples, s.dropped, s.error, s.note)
                        for ts, s in self._scrapes
                    ],
                )
            con.execute(
                """UPDATE sources SET rows_kept = (SELECT count(*) FROM metric_window_rows WHERE source_id = ?),
                               rows_seen = rows_seen + ?, rows_dropped = rows_dropped + ?, ingested_at = now()
                           WHERE source_id = ?""",
                [sid, len(rows), sum(s.dropped for _, s in self._scrapes), sid],
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        if rows:
            self._stored_ts = max(self._stored_ts or 0, max(r["ts_ns"] for r in rows))
        self._rows, self._experts, self._scrapes = [], [], []

    def _hold_bounded(self) -> None:
        """Past MAX_PENDING_ROWS held rows (a reader holding the database for hours), the oldest
        windows go: memory stays bounded, and the step says how many were lost."""
        if len(self._rows) <= MAX_PENDING_ROWS:
            return
        keep_from = self._rows[-MAX_PENDING_ROWS]["ts_ns"]
        before = {r["ts_ns"] for r in self._rows}
        self._rows = [r for r in self._rows if r["ts_ns"] >= keep_from]
        self._experts = [e for e in self._experts if e[0] >= keep_from]
        self._lost += len(before) - len({r["ts_ns"] for r in self._rows})
        self._scrapes = self._scrapes[-10_000:]

    def _windows(self, snaps: list[mx.Snapshot], step: Step, now_ns: int) -> None:
        """Windows of consecutive snapshots (after the newest stored one) into the held rows."""
        for snap in snaps:
            if snap.ts_ns > now_ns + FUTURE_SLACK_NS:
                continue  # the sources refuse these already; a snapshot is never from the future
            newer = self.prev is None or snap.ts_ns > self.prev.ts_ns
            if self.prev is not None and newer and (self._stored_ts is None or snap.ts_ns > self._stored_ts):
                new = mx.window_rows(self.prev, snap, self.source.mapping)
                if new:
                    self._rows += new
                    step.windows += new
                    step.n_windows += 1
                    if len(step.windows) > MAX_STEP_ROWS:
                        step.windows = step.windows[-MAX_STEP_ROWS:]
                slots = mx.expert_rows(self.prev, snap)
                self._experts += [(snap.ts_ns, *s) for s in slots]
                step.expert_slots += len(slots)
            if newer and (snap.targets or snap.experts):
                # a snapshot without any target answering keeps the older one as the base
                self.prev = snap

    # --- one interval --------------------------------------------------------
    def step(self, wait_s: float | None = None) -> Step:
        """Collect once, write the new windows, judge the watched queries, act on changes.

        Another process holding the database past ``wait_s`` (default ``busy_wait_s``) does not
        end the watch: the step reports ``busy`` and its windows are written at the next one."""
        wait = self.busy_wait_s if wait_s is None else wait_s
        if not self._stored_known:
            con = self._open(wait)
            if con is not None:
                try:
                    self._attach(con)
                finally:
                    con.close()
        # collect with the database closed: readers (slowcard query) are not locked out meanwhile
        since = self.prev.ts_ns if self.prev is not None else self._stored_ts
        step = Step(time.time_ns())
        for snaps, statuses in self.source.collect(since):
            now_ns = time.time_ns()
            self._windows(snaps, step, now_ns)
            step.statuses += statuses
            self._scrapes += [(now_ns, s) for s in statuses]
            del snaps
            if len(self._rows) >= WRITE_EVERY_ROWS:  # a long backfill: written as it comes
                con = self._open(wait)
                if con is not None:
                    try:
                        self._write(con, now_ns)
                    finally:
                        con.close()
                self._hold_bounded()
        step.ts_ns = now_ns = time.time_ns()
        con = self._open(wait)
        if con is None:
            self._hold_bounded()
            step.busy = (
                f"{self.db}: another process holds the database; the windows wait and are written when it is free"
            )
            step.held_windows = len({r["ts_ns"] for r in self._rows})
            step.lost_windows = self._lost
            return step
        try:
            self._write(con, now_ns)
            step.lost_windows, self._lost = self._lost, 0
            before = dict(
                con.execute(
                    """SELECT query, arg_max(status, ts_ns) FROM metric_verdict_rows WHERE source_id = ?
                   GROUP BY query""",
                    [self.sid],
                ).fetchall()
            )
            for q in self.queries:
                res = queries_mod.run_query(con, q, self.run)
                step.results[q.name] = res
                old = before.get(q.name)
                if old is not None and old != res.status and "FAIL" in (old, res.status):
                    step.changes.append((q.name, old, res.status))
            if step.results:
                con.execute("BEGIN")
                con.executemany(
                    "INSERT INTO metric_verdict_rows VALUES (?, ?, ?, ?, ?)",
                    [(self.sid, now_ns, r.query, r.status, r.summary[:2000]) for r in step.results.values()],
                )
                con.execute("COMMIT")
        finally:
            con.close()
        for name, was, now in step.changes:
            step.actions += self._act(name, was, now, step.results[name])
        return step

    def pending(self) -> bool:
        """Windows or outcomes collected but not written yet (the database was busy)."""
        return bool(self._rows or self._scrapes)

    def _act(self, name: str, old: str, new: str, res) -> list[str]:
        """Run --exec and POST the webhook for one change; their outcome as text."""
        from .render import to_json

        out = []
        payload = {
            "run": self.run,
            "query": name,
            "before": old,
            "status": new,
            "summary": res.summary,
            "rows": res.rows[:20],
        }
        if self.exec_cmd:
            # an environment value cannot hold NUL (subprocess refuses it); everything else is data
            env = dict(
                os.environ,
                **{
                    k: str(v).replace("\x00", "\\u0000")
                    for k, v in {
                        "SLOWCARD_RUN": self.run,
                        "SLOWCARD_QUERY": name,
                        "SLOWCARD_BEFORE": old,
                        "SLOWCARD_STATUS": new,
                        "SLOWCARD_SUMMARY": res.summary,
                    }.items()
                },
            )
            try:
                cp = subprocess.run(
                    self.exec_cmd,
                    shell=True,
                    env=env,
                    timeout=self.exec_timeout_s,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                out.append(
                    f"--exec exited {cp.returncode}"
                    + (f": {cp.stderr.decode(errors='replace').strip()[:200]}" if cp.returncode else "")
                )
            except subprocess.TimeoutExpired:
                out.append(f"--exec killed after {self.exec_timeout_s:g} s")
            except (OSError, ValueError) as exc:
                out.append(f"--exec failed: {exc}")
        if self.webhook:
            # strict JSON: a non-finite number is null with a "<key>_nonfinite" flag beside it
            data = to_json(payload, indent=None).encode("utf-8")
            status, _body, error = http_request(
                self.webhook, WEBHOOK_TIMEOUT_S, 1 << 20, data=data, headers={"Content-Type": "application/json"}
            )
            out.append(f"webhook HTTP {status}" if error is None else f"webhook failed: {error}")
        return out

    def run_loop(
        self,
        interval_s: float,
        duration_s: float | None = None,
        once: bool = False,
        on_step: Callable[[Step], None] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> Step | None:
        """Collect every ``interval_s`` until ``duration_s`` has passed (None: until interrupted).

        ``once``: one window and exit (for cron): a scrape source scrapes twice ``interval_s``
        apart unless the database already holds its previous windows; a Prometheus source
        fetches the steps since its last stored window (else the backfill).

        A database held by another process never ends the loop; at the end, windows still held
        are written with the usual lock wait (SLOWCARD_LOCK_WAIT), and DatabaseBusy is raised
        only when the database is still held then.
        """
        # the module's clock, looked up at the call (a test's fake clock replaces it whole)
        sleep = time.sleep if sleep is None else sleep
        t0 = time.monotonic()
        last: Step | None = None
        second = False
        while True:
            started = time.monotonic()
            last = _ctrl_c_as_such(self.step)
            if on_step:
                on_step(last)
            if once:
                # a scrape needs a second snapshot for its first window in this process
                if second or last.windows or self.prev is None or not isinstance(self.source, ScrapeSource):
                    break
                second = True
            else:
                # the next collection starts an interval after this one started (or now, when this
                # one took longer): judged from that start, not from the end of this collection,
                # so a slow collection (a loaded machine) does not cost the last one
                next_at = max(started + interval_s, time.monotonic())
                if duration_s is not None and next_at - t0 > duration_s + 1e-6:
                    break
            sleep(max(0.0, interval_s - (time.monotonic() - started)))
        if last is not None and last.busy is not None:
            final = _ctrl_c_as_such(self.flush)
            if on_step:
                on_step(final)
            last = final
        return last

    def flush(self) -> Step:
        """Write what is held and judge, waiting for the lock as any writer does
        (SLOWCARD_LOCK_WAIT); raises DatabaseBusy when the database stays held."""
        saved, self.source = self.source, _NoSource(self.source)
        try:
            step = self.step(wait_s=store.LOCK_WAIT_S)
        finally:
            self.source = saved
        if step.busy is not None:
            raise DatabaseBusy(
                f"{self.db}: the database stayed locked by another process for {store.LOCK_WAIT_S:.0f} s "
                "(SLOWCARD_LOCK_WAIT); the last windows were not written"
            )
        return step


WEBHOOK_TIMEOUT_S = 10.0


def _insert_rows(con, sid: int, rows: list[dict]) -> None:
    """Window rows in one statement through Arrow (executemany runs one INSERT per row: 3,001
    rows of 3,000 DP domains took ~5 s)."""
    import pyarrow as pa

    types = {"ts_ns": pa.int64(), "dp_rank": pa.int32(), "targets": pa.int32(), "reset": pa.bool_()}
    columns = {"source_id": pa.array([sid] * len(rows), pa.int32())}
    for c in mx.WINDOW_COLUMNS:
        columns[c] = pa.array([r[c] for r in rows], types.get(c, pa.float64()))
    name = f"_watch_rows_{sid}"
    con.register(name, pa.table(columns))
    try:
        cols = ", ".join(columns)
        con.execute(f'INSERT INTO metric_window_rows ({cols}) SELECT {cols} FROM "{name}"')
    finally:
        con.unregister(name)


def _ctrl_c_as_such(fn):
    """``fn()``; a Ctrl-C that landed inside one of its DuckDB statements (a COMMIT, typically)
    is raised as the KeyboardInterrupt it was, so the watch ends as on any Ctrl-C (captures
    stopped and summed up) instead of with DuckDB's "Query interrupted" traceback."""
    try:
        return fn()
    except Exception as exc:
        if is_interrupt(exc):
            raise KeyboardInterrupt from exc
        raise


class _LockedConnection:
    """A connection that releases the watcher's database lock when it is closed."""

    def __init__(self, con, lock):
        self._con, self._lock = con, lock

    def close(self) -> None:
        try:
            self._con.close()
        finally:
            if self._lock is not None:
                self._lock, lock = None, self._lock
                lock.release()

    def __getattr__(self, name):
        return getattr(self._con, name)


class _NoSource:
    """A source that collects nothing (flush: write and judge what is held)."""

    def __init__(self, real):
        self.path, self.format, self.mapping = real.path, real.format, real.mapping

    def collect(self, since_ns):
        return iter(())
