"""`slowcard watch`: collect live service metrics into the database and re-judge the metrics
verdicts after every interval.

Two sources (one per watch):

- ``ScrapeSource``: GET each ``/metrics`` endpoint (one per DP engine or one per instance);
  the DP rank is the endpoint's ``URL=DP`` mapping, else the sample's ``engine`` label, else the
  endpoint's position in the list.
- ``PrometheusSource``: range queries on a Prometheus server's HTTP API (``/api/v1/query_range``,
  raw series of the mapped metrics, one step per interval): a backfill of the last hours in
  bounded chunks, then the new steps at each interval.

Both yield snapshots (slowcard/metrics.py); consecutive snapshots make windows, written with
the expert-load slots and the per-endpoint outcome in ONE transaction per collection (a Ctrl-C
or a crash leaves whole windows only). Only the previous snapshot is kept in memory, responses
are read up to a byte cap and samples up to a series cap, and windows older than the retention
are deleted, so a watch of days stays bounded.

Never prints: events go to the caller's callback (the CLI prints them).
"""

from __future__ import annotations

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import metrics as mx
from . import queries as queries_mod
from . import store
from .errors import UsageError

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
BACKFILL_CHUNK_STEPS = 120  # range-query steps per request during backfill (bounds memory)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@dataclass
class Fetch:
    """The outcome of one request: the body, or why there is none."""

    body: str | None
    error: str | None = None


def http_get(url: str, timeout_s: float, max_bytes: int = MAX_BYTES) -> Fetch:
    """GET with a timeout and a size cap; every failure becomes a short reason, never an exception."""
    try:
        req = urllib.request.Request(url, headers={"Accept": "text/plain, application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            data = resp.read(max_bytes + 1)
        if len(data) > max_bytes:
            return Fetch(None, f"response over {max_bytes >> 20} MB")
        return Fetch(data.decode("utf-8", errors="replace"))
    except urllib.error.HTTPError as exc:
        return Fetch(None, f"HTTP {exc.code}")
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return Fetch(None, "timeout")
        if isinstance(reason, ConnectionRefusedError):
            return Fetch(None, "connection refused")
        return Fetch(None, f"unreachable ({reason})")
    except TimeoutError:
        return Fetch(None, "timeout")
    except (ConnectionError, OSError, ValueError) as exc:  # reset mid-body, bad URL, …
        return Fetch(None, f"{type(exc).__name__}: {str(exc)[:80]}")


@dataclass
class TargetStatus:
    target: str
    ok: bool
    samples: int = 0
    dropped: int = 0
    error: str | None = None


def _families(wanted: dict) -> set[str]:
    """Family names of the wanted samples (for keeping their # TYPE lines)."""
    out = set()
    for n in wanted:
        out.add(n)
        out.add(re.sub(r"_(bucket|sum|count|total)$", "", n))
    return out


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
    """Add one endpoint's /metrics text to a snapshot: only the mapped families are parsed."""
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
    samples, drops = parse_exposition(keep) if keep else ([], [])
    kept = dropped = 0
    for _fam, _typ, s in samples:
        if kept >= max_series:
            dropped += 1
            continue
        if mx.add_sample(snap, mapping, wanted, target, default_dp, s.name, s.labels, s.value, forced_dp):
            kept += 1
    dropped += sum(n for _, _, n in drops)
    if kept == 0:
        why = (
            ("no vLLM metric in the answer" if content else "empty answer") if not drops else f"garbage: {drops[0][0]}"
        )
        return TargetStatus(target, False, 0, dropped, why)
    return TargetStatus(target, True, kept, dropped, None)


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
        self.targets = targets
        self.mapping = mapping
        self.wanted = mapping.wanted()
        self.timeout_s = timeout_s
        self.max_series = max_series
        self.path = " ".join(u for u, _ in targets)

    def collect(self, since_ns: int | None) -> tuple[list[mx.Snapshot], list[TargetStatus]]:
        """One snapshot of every endpoint now (``since_ns`` is for API sources)."""
        snap = mx.Snapshot(ts_ns=time.time_ns())
        statuses = []
        for pos, (url, dp) in enumerate(self.targets):
            got = http_get(url, self.timeout_s)
            if got.body is None:
                statuses.append(TargetStatus(url, False, error=got.error))
                continue
            statuses.append(parse_scrape(got.body, snap, self.mapping, self.wanted, url, pos, dp, self.max_series))
        return [snap], statuses


class PrometheusSource:
    """Range queries on a Prometheus server: backfill, then the steps since the last one."""

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
        self.step_s = max(step_s, 0.001)
        self.backfill_s = backfill_s
        self.dp_map = dict(dp_map or {})
        self.timeout_s = timeout_s
        self.max_series = max_series
        self.path = self.base
        self._instances: dict[str, int] = {}
        self.selector = '{__name__=~"' + "|".join(re.escape(n) for n in sorted(self.wanted)) + '"}'

    def _range(self, start_s: float, end_s: float) -> tuple[dict[float, mx.Snapshot], TargetStatus]:
        q = urllib.parse.urlencode(
            {"query": self.selector, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": f"{self.step_s:g}"}
        )
        got = http_get(f"{self.base}/api/v1/query_range?{q}", self.timeout_s)
        if got.body is None:
            return {}, TargetStatus(self.base, False, error=got.error)
        try:
            doc = json.loads(got.body)
            if doc.get("status") != "success":
                return {}, TargetStatus(self.base, False, error=f"API error: {str(doc.get('error'))[:120]}")
            result = doc["data"]["result"]
        except (ValueError, KeyError, TypeError, AttributeError):
            return {}, TargetStatus(self.base, False, error="garbage: not a Prometheus API answer")
        snaps: dict[float, mx.Snapshot] = {}
        kept = dropped = 0
        for series in result if isinstance(result, list) else []:
            try:
                labels = dict(series["metric"])
                name = labels.pop("__name__")
                values = series["values"]
            except (KeyError, TypeError, ValueError):
                dropped += 1
                continue
            inst = labels.get("instance", "?")
            target = f"{labels.get('job', '')}/{inst}"
            if inst not in self._instances:
                self._instances[inst] = len(self._instances)
            for pair in values:
                try:
                    ts, v = float(pair[0]), float(pair[1])
                except (TypeError, ValueError, IndexError):
                    dropped += 1
                    continue
                snap = snaps.get(ts)
                if snap is None:
                    snap = snaps[ts] = mx.Snapshot(ts_ns=int(round(ts * 1e3)) * 1_000_000)
                if kept >= self.max_series * max(1, len(snaps)):
                    dropped += 1
                    continue
                if mx.add_sample(
                    snap,
                    self.mapping,
                    self.wanted,
                    target,
                    self._instances[inst],
                    name,
                    labels,
                    v,
                    self.dp_map.get(inst),
                ):
                    kept += 1
        return snaps, TargetStatus(self.base, True, kept, dropped, None)

    def collect(self, since_ns: int | None) -> tuple[list[mx.Snapshot], list[TargetStatus]]:
        """Snapshots from the step at ``since_ns`` (else now - backfill) up to now, oldest first."""
        now = time.time()
        end = math.floor(now / self.step_s) * self.step_s
        start = (since_ns / 1e9) if since_ns else end - max(self.backfill_s, self.step_s)
        start = max(start, end - max(self.backfill_s, self.step_s))
        out: list[mx.Snapshot] = []
        statuses: list[TargetStatus] = []
        chunk = self.step_s * BACKFILL_CHUNK_STEPS
        t = start
        while t <= end:
            t_end = min(end, t + chunk)
            snaps, st = self._range(t, t_end)
            statuses.append(st)
            out += [snaps[k] for k in sorted(snaps)]
            t = t_end + self.step_s
        return out, statuses


@dataclass
class Step:
    """What one collection did (handed to the callback as the status line's facts)."""

    ts_ns: int
    windows: list[dict] = field(default_factory=list)  # rows written (last window's rows last)
    statuses: list[TargetStatus] = field(default_factory=list)
    results: dict = field(default_factory=dict)  # query -> Result
    changes: list[tuple[str, str, str]] = field(default_factory=list)  # (query, before, after)
    expert_slots: int = 0
    actions: list[str] = field(default_factory=list)  # outcome of --exec / webhook


class Watcher:
    """Collect into ``db`` under ``run`` and judge the watched queries after each collection."""

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
    ):
        self.db = Path(db)
        self.run = run
        self.source = source
        self.retention_ns = int(retention_s * 1e9)
        self.exec_cmd = exec_cmd
        self.webhook = webhook
        self.exec_timeout_s = exec_timeout_s
        catalog = queries_mod.load_catalog(sql_dirs)
        self.queries = watched_queries(catalog)
        self.prev: mx.Snapshot | None = None
        self.sid: int | None = None
        self._stored_ts: int | None = None  # the latest window stored before this process

    # --- database ------------------------------------------------------------
    def _source_id(self, con) -> int:
        row = con.execute(
            "SELECT source_id FROM sources WHERE run = ? AND path = ? AND format = ?",
            [self.run, self.source.path, self.source.format],
        ).fetchone()
        if row:
            return row[0]
        store.ensure_run(con, self.run, self.source.path)
        sid = con.execute("""SELECT greatest(nextval('source_id_seq'),
                                 (SELECT coalesce(max(source_id), 0) + 1 FROM sources),
                                 (SELECT coalesce(max(source_id), 0) + 1 FROM pending_sources))""").fetchone()[0]
        con.execute(
            """INSERT INTO sources (source_id, run, path, size_bytes, fingerprint, format, rows_seen,
                           rows_kept, rows_dropped, status, message, metadata, ingested_at)
                       VALUES (?, ?, ?, 0, '', ?, 0, 0, 0, 'ok', '', ?, now())""",
            [sid, self.run, self.source.path, self.source.format, json.dumps({"watch": self.source.path})],
        )
        return sid

    def _last_ts(self, con, sid: int) -> int | None:
        return con.execute("SELECT max(ts_ns) FROM metric_window_rows WHERE source_id = ?", [sid]).fetchone()[0]

    def _write(
        self, con, sid: int, now_ns: int, rows: list[dict], experts: list[tuple], statuses: list[TargetStatus]
    ) -> None:
        con.execute("BEGIN")
        try:
            if rows:
                con.executemany(
                    f"INSERT INTO metric_window_rows VALUES ({', '.join('?' * (len(mx.WINDOW_COLUMNS) + 1))})",
                    [[sid] + [r[c] for c in mx.WINDOW_COLUMNS] for r in rows],
                )
            if experts:
                base = con.execute(
                    "SELECT coalesce(max(window_idx), -1) + 1 FROM expert_load_rows WHERE source_id = ?", [sid]
                ).fetchone()[0]
                con.executemany(
                    "INSERT INTO expert_load_rows (source_id, window_idx, ts_ns, epoch, layer, ep_rank, "
                    "local_slot, tokens) VALUES (?, ?, ?, NULL, ?, ?, ?, ?)",
                    [(sid, base + w, ts, layer, rank, slot, tok) for w, ts, layer, rank, slot, tok in experts],
                )
            con.executemany(
                "INSERT INTO metric_scrape_rows VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(sid, now_ns, s.target, s.ok, s.samples, s.dropped, s.error) for s in statuses],
            )
            cutoff = now_ns - self.retention_ns
            for table in ("metric_window_rows", "metric_scrape_rows", "metric_verdict_rows", "expert_load_rows"):
                con.execute(f"DELETE FROM {table} WHERE source_id = ? AND ts_ns < ?", [sid, cutoff])
            con.execute(
                """UPDATE sources SET rows_kept = (SELECT count(*) FROM metric_window_rows WHERE source_id = ?),
                               rows_seen = rows_seen + ?, rows_dropped = rows_dropped + ?, ingested_at = now()
                           WHERE source_id = ?""",
                [sid, len(rows), sum(s.dropped for s in statuses), sid],
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    # --- one interval --------------------------------------------------------
    def step(self) -> Step:
        """Collect once, write the new windows, judge the watched queries, act on changes."""
        if self.sid is None:
            con = store.open_db(self.db)
            try:
                con.execute("BEGIN")
                self.sid = self._source_id(con)
                con.execute("COMMIT")
                self._stored_ts = self._last_ts(con, self.sid)
            finally:
                con.close()
        # collect with the database closed: readers (slowcard query) are not locked out meanwhile
        last_ts = self._stored_ts
        snaps, statuses = self.source.collect(last_ts if self.prev is None else self.prev.ts_ns)
        now_ns = time.time_ns()
        con = store.open_db(self.db)
        try:
            sid = self.sid
            rows: list[dict] = []
            experts: list[tuple] = []
            for snap in snaps:
                if self.prev is not None and snap.ts_ns > self.prev.ts_ns and (last_ts is None or snap.ts_ns > last_ts):
                    new = mx.window_rows(self.prev, snap, self.source.mapping)
                    rows += new
                    slots = mx.expert_rows(self.prev, snap)
                    if slots:
                        w = len({e[0] for e in experts})
                        experts += [(w, snap.ts_ns, *s) for s in slots]
                if self.prev is None or snap.ts_ns > self.prev.ts_ns:
                    # a snapshot without any target answering keeps the older one as the base
                    if snap.targets or snap.experts:
                        self.prev = snap
            self._write(con, sid, now_ns, rows, experts, statuses)
            step = Step(now_ns, rows, statuses, expert_slots=len(experts))
            before = dict(
                con.execute(
                    """SELECT query, arg_max(status, ts_ns) FROM metric_verdict_rows WHERE source_id = ?
                   GROUP BY query""",
                    [sid],
                ).fetchall()
            )
            for q in self.queries:
                res = queries_mod.run_query(con, q, self.run)
                step.results[q.name] = res
                old = before.get(q.name)
                if old is not None and old != res.status and "FAIL" in (old, res.status):
                    step.changes.append((q.name, old, res.status))
            con.execute("BEGIN")
            con.executemany(
                "INSERT INTO metric_verdict_rows VALUES (?, ?, ?, ?, ?)",
                [(sid, now_ns, r.query, r.status, r.summary[:2000]) for r in step.results.values()],
            )
            con.execute("COMMIT")
        finally:
            con.close()
        for name, was, now in step.changes:
            step.actions += self._act(name, was, now, step.results[name])
        return step

    def _act(self, name: str, old: str, new: str, res) -> list[str]:
        """Run --exec and POST the webhook for one change; their outcome as text."""
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
            env = dict(
                os.environ,
                SLOWCARD_RUN=self.run,
                SLOWCARD_QUERY=name,
                SLOWCARD_BEFORE=old,
                SLOWCARD_STATUS=new,
                SLOWCARD_SUMMARY=res.summary,
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
            except OSError as exc:
                out.append(f"--exec failed: {exc}")
        if self.webhook:
            data = json.dumps(payload, default=str).encode()
            req = urllib.request.Request(self.webhook, data=data, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    out.append(f"webhook HTTP {resp.status}")
            except (urllib.error.URLError, OSError, ValueError) as exc:
                out.append(f"webhook failed: {getattr(exc, 'reason', exc)}")
        return out

    def run_loop(
        self,
        interval_s: float,
        duration_s: float | None = None,
        once: bool = False,
        on_step: Callable[[Step], None] | None = None,
        sleep=time.sleep,
    ) -> Step | None:
        """Collect every ``interval_s`` until ``duration_s`` has passed (None: until interrupted).

        ``once``: one window and exit (for cron): a scrape source scrapes twice ``interval_s``
        apart unless the database already holds its previous windows; a Prometheus source
        fetches the steps since its last stored window (else the backfill).
        """
        t0 = time.monotonic()
        last: Step | None = None
        second = False
        while True:
            started = time.monotonic()
            last = self.step()
            if on_step:
                on_step(last)
            if once:
                # a scrape needs a second snapshot for its first window in this process
                if second or last.windows or self.prev is None or not isinstance(self.source, ScrapeSource):
                    return last
                second = True
            elif duration_s is not None and time.monotonic() - t0 + interval_s > duration_s + 1e-6:
                return last
            sleep(max(0.0, interval_s - (time.monotonic() - started)))
