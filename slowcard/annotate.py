"""One Chrome-trace JSON for a whole run: every rank on one timeline, with the findings marked.

Opens in Perfetto UI (ui.perfetto.dev) and chrome://tracing:

- one process per rank (``process_name`` "rank N", ``process_sort_index`` N); the threads of every
  file of the rank are kept, each as its own thread of that process (named after the original
  process / thread names); a file without a rank gets a process of its own;
- clock offsets between hosts (view ``clock_offsets``) are subtracted, so the ranks line up;
  ``ts`` is in µs since the run's first event with the nanoseconds kept exactly (3 decimals);
- where a slow rank arrives last at a collective (``collective_waits``, with a clear skew as in
  rank-waits): a process-wide instant event on that rank, and a flow arrow from its collective to
  the same collective of every rank that waited for it. The slow ranks are the slow cards
  (``findings.slow_cards``) of the verdicts whose header says ``shows: annotate``;
- a process "slowcard verdicts" with one track per query and one X event spanning the run per
  verdict (name ``query@vN STATUS``, args: summary, rule, first rows).

Perfetto drops X events that overlap on one thread without nesting, so every X event is checked
against the open events of its thread and moved, when it only partly overlaps them, to an extra
thread of the same process (named "… (overlap N)").

Events are streamed: DuckDB sorts them by corrected time and writes each event's JSON text except
its thread id; Python only places X events on a thread and writes the text batch by batch.
Metadata events (M) carry no ``ts``; every other event is written in ``ts`` order.
"""

from __future__ import annotations

import heapq
import math
import os
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import orjson

from . import findings as findings_mod
from . import queries as queries_mod
from .errors import UsageError
from .outfile import atomic_output
from .verdict import Status, severity

VERDICT_PID = 999_999  # the "slowcard verdicts" process
RANK_PID_BASE = 100  # rank r -> pid 100 + r (pid 0 is the idle process in Perfetto)
UNRANKED_PID_BASE = 500_000  # a file without a rank -> its own process, 500000 + source_id
THREADS_PER_PROCESS = 1000  # tid = pid * 1000 + k: thread ids unique across processes
FLOW_ID_BASE = 1 << 52  # ids of our flow arrows (original ids are source_id * 1e9 + id)
BATCH_ROWS = 50_000

# Phases copied from the sources. M metadata is rewritten; B/E are kept on their thread as they are.
_KEEP_PHASES = ("X", "B", "E", "i", "I", "C", "s", "t", "f", "b", "e", "n", "P", "O", "N", "D")


@dataclass
class AnnotateStats:
    """What ``write_annotated`` wrote."""

    path: Path
    run: str
    events: int = 0  # trace events copied from the sources
    processes: int = 0  # rank processes (and unranked files)
    ranks: list = field(default_factory=list)
    threads: int = 0  # threads of those processes, overlap threads included
    moved_events: int = 0  # X events moved to an overlap thread
    overlap_threads: int = 0
    slow_ranks: list = field(default_factory=list)  # the slow cards that are ranks, marked
    slow_cards: list = field(default_factory=list)  # every slow card of the run ("DP domain 1")
    markers: int = 0  # instant events "rank N arrives last"
    flows: int = 0  # flow arrows (s/f pairs)
    verdicts: int = 0
    clock_offsets_ns: dict = field(default_factory=dict)  # host -> offset subtracted
    t0_ns: int = 0  # corrected time of the first event (ts 0)
    span_us: float = 0.0


def _us(ns: int) -> float:
    """Integer nanoseconds as µs with the nanoseconds (3 decimals)."""
    return round(ns / 1000.0, 3)


def _jsonable(v):
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def slow_ranks(results: dict) -> dict[int, str]:
    """rank -> why (``query@vN: cause``): the slow cards that are ranks, from the verdicts that
    show in the merged trace (``shows: annotate``)."""
    return {rank: f"{f.ref}: {f.cause or 'slow'}" for rank, f in findings_mod.slow_ranks(results, "annotate").items()}


class _Threads:
    """Output pid / tid of each original thread (source, pid, tid) = tkey, and its lanes: the
    thread itself plus the overlap threads created for X events that do not nest."""

    def __init__(self) -> None:
        self.key: dict[tuple, int] = {}  # (source_id, pid, tid) -> tkey
        self.pid: list[int] = []  # tkey -> output pid
        self.tid: list[int] = []  # tkey -> output tid
        self.name: list[str] = []
        self.lanes: list[list] = []  # tkey -> [[tid, stack of open end_ns], ...]
        self.next_k: dict[int, int] = {}  # pid -> next thread index
        self.late_meta: list[dict] = []  # thread_name of the overlap threads
        self.moved = 0

    def _new_tid(self, pid: int) -> int:
        k = self.next_k.get(pid, 1)
        self.next_k[pid] = k + 1
        return pid * THREADS_PER_PROCESS + k

    def add(self, key: tuple, pid: int, name: str) -> int:
        tkey = len(self.pid)
        tid = self._new_tid(pid)
        self.key[key] = tkey
        self.pid.append(pid)
        self.tid.append(tid)
        self.name.append(name)
        self.lanes.append([[tid, []]])
        return tkey

    def place(self, tkey: int, t_ns: int, end_ns: int) -> int:
        """The tid for an X event [t_ns, end_ns] of thread tkey: the first lane where it nests
        inside the open events (or starts after them); a new overlap thread when none fits."""
        lanes = self.lanes[tkey]
        for i, lane in enumerate(lanes):
            stack = lane[1]
            while stack and stack[-1] <= t_ns:
                stack.pop()
            if not stack or end_ns <= stack[-1]:
                stack.append(end_ns)
                if i:
                    self.moved += 1
                return lane[0]
        pid = self.pid[tkey]
        tid = self._new_tid(pid)
        lanes.append([tid, [end_ns]])
        self.moved += 1
        self.late_meta += [
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": tid,
                "args": {"name": f"{self.name[tkey]} (overlap {len(lanes) - 1})"},
            },
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": tid % THREADS_PER_PROCESS},
            },
        ]
        return tid


class _Writer:
    """Comma-separated events into the open traceEvents array, written per batch."""

    def __init__(self, f) -> None:
        self.f = f
        self.buf: list[bytes] = []
        self.first = True

    def raw(self, b: bytes):
        self.flush()
        self.f.write(b)

    def event(self, ev: dict):
        self.buf.append(orjson.dumps(ev))

    def text(self, parts: list[str]):
        if parts:
            self.buf.append(",\n".join(parts).encode("utf-8"))

    def flush(self):
        if not self.buf:
            return
        data = b",\n".join(self.buf)
        self.f.write(data if self.first else b",\n" + data)
        self.first = False
        self.buf.clear()


class _Marks:
    """The finding events, written on the thread where their collective slice went."""

    def __init__(self, threads: _Threads):
        self.threads = threads
        self.anchors: dict[int, tuple[int, int]] = {}  # anchor id -> (pid, tid) of its X event
        self.anchor_ids: dict[tuple, int] = {}  # (source_id, ts_ns, name) -> anchor id
        self.dropped: set[int] = set()
        self.instants = 0
        self.flows = 0

    def anchor_id(self, key: tuple) -> int:
        return self.anchor_ids.setdefault(key, len(self.anchor_ids) + 1)

    def emit(self, w: _Writer, m: dict):
        pos = self.anchors.get(m["anchor"])
        if m["ph"] == "i":
            if pos is None and m["thread"] in self.threads.key:
                k = self.threads.key[m["thread"]]
                pos = (self.threads.pid[k], self.threads.tid[k])
            if pos is not None:
                w.event(
                    {
                        "ph": "i",
                        "s": "p",
                        "name": m["name"],
                        "cat": "slowcard",
                        "pid": pos[0],
                        "tid": pos[1],
                        "ts": _us(m["t"]),
                        "args": m["args"],
                    }
                )
                self.instants += 1
            return
        if pos is None or m["id"] in self.dropped:
            self.dropped.add(m["id"])  # an arrow end without its slice is left out
            return
        ev = {
            "ph": m["ph"],
            "id": m["id"],
            "name": m["name"],
            "cat": "slowcard",
            "pid": pos[0],
            "tid": pos[1],
            "ts": _us(m["t"]),
        }
        if m["ph"] == "f":
            ev["bp"] = "e"  # bind to the enclosing slice (the waiting collective)
            self.flows += 1
        w.event(ev)


def _relation_exists(con, name: str) -> bool:
    return bool(
        con.execute(
            "SELECT 1 FROM information_schema.tables WHERE table_name = ? AND table_schema = 'main'", [name]
        ).fetchall()
    )


def _markers(con, run: str, slow: dict, src_off: dict, t0: int, marks: _Marks) -> list[tuple]:
    """Heap items (t_ns, seq, marker) for the collectives where a slow rank arrived last with a
    clear skew: an instant event on it, and a flow arrow to every rank that waited for it."""
    ranks = ", ".join(str(int(r)) for r in slow)
    rows = con.execute(
        f"""
        WITH c AS (
            SELECT c.*, o.pid, o.tid
            FROM collective_waits c
            JOIN (SELECT DISTINCT source_id, ts_ns, name, pid, tid FROM op_classes
                  WHERE op_class = 'collective' AND origin = 'trace') o USING (source_id, ts_ns, name)
            WHERE c.run = $run
        ),
        last AS (
            SELECT * FROM c
            WHERE arrived_last AND rank IN ({ranks}) AND arrival_skew_ns > 0.05 * median_dur_ns
        )
        SELECT l.source_id, l.ts_ns, l.name, l.pid, l.tid, l.rank, l.pg, l.coll_kind, l.instance,
               l.arrival_skew_ns,
               list({{'source_id': w.source_id, 'ts_ns': w.ts_ns, 'name': w.name, 'pid': w.pid,
                     'tid': w.tid, 'rank': w.rank, 'dur_ns': w.dur_ns,
                     'arrival_lag_ns': w.arrival_lag_ns}} ORDER BY w.rank)
                   FILTER (WHERE w.rank IS NOT NULL) AS waiters
        FROM last l
        LEFT JOIN c w ON w.pg = l.pg AND w.coll_kind = l.coll_kind AND w.instance = l.instance
                     AND w.rank <> l.rank AND w.arrival_lag_ns > 0
        GROUP BY ALL
        ORDER BY l.ts_ns
    """,
        {"run": run},
    ).fetchall()
    out: list[tuple] = []
    seq = 0
    flow_id = FLOW_ID_BASE
    for sid, ts_ns, name, pid, tid, rank, pg, kind, inst, skew, waiters in rows:
        if sid not in src_off:
            continue
        t = ts_ns - src_off[sid] - t0
        anchor = marks.anchor_id((sid, ts_ns, name))
        waiters = [wr for wr in (waiters or []) if wr["source_id"] in src_off]
        seq += 1
        out.append(
            (
                t,
                seq,
                {
                    "ph": "i",
                    "t": t,
                    "anchor": anchor,
                    "thread": (sid, pid, tid),
                    "name": f"rank {rank} arrives last: {kind} #{inst}",
                    "args": {
                        "slow_rank": rank,
                        "why": slow.get(rank, ""),
                        "process_group": pg,
                        "collective": kind,
                        "instance": inst,
                        "arrival_skew_us": _us(skew),
                        "others_waited_us": {str(wr["rank"]): _us(wr["arrival_lag_ns"]) for wr in waiters},
                    },
                },
            )
        )
        for wr in waiters:
            flow_id += 1
            wsid = wr["source_id"]
            w_start = wr["ts_ns"] - src_off[wsid] - t0
            w_end = w_start + max(wr["dur_ns"] or 0, 0)
            # on the waiting rank's collective, at the moment the slow rank arrived (inside it)
            t_f = min(max(t, w_start), max(w_start, w_end - 1))
            label = f"rank {wr['rank']} waits for rank {rank}"
            seq += 1
            out.append(
                (t, seq, {"ph": "s", "t": t, "id": flow_id, "name": label, "anchor": anchor, "thread": (sid, pid, tid)})
            )
            seq += 1
            out.append(
                (
                    t_f,
                    seq,
                    {
                        "ph": "f",
                        "t": t_f,
                        "id": flow_id,
                        "name": label,
                        "anchor": marks.anchor_id((wsid, wr["ts_ns"], wr["name"])),
                        "thread": (wsid, wr["pid"], wr["tid"]),
                    },
                )
            )
    return out


def _write_metadata(w: _Writer, srcs, threads: _Threads, src_pid: dict, src_host: dict):
    hosts: dict[int, set] = {}
    for sid, pid in src_pid.items():
        hosts.setdefault(pid, set()).add(src_host[sid])
    seen = set()
    for sid, rank, _host, path in srcs:
        pid = src_pid[sid]
        if pid in seen:
            continue
        seen.add(pid)
        pname = f"rank {int(rank)}" if rank is not None else f"unranked: {os.path.basename(path)}"
        w.event({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": pname}})
        w.event(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": pid,
                "tid": 0,
                "args": {"sort_index": int(rank) if rank is not None else 1_000_000 + sid},
            }
        )
        named = sorted(h for h in hosts[pid] if h)
        if named:
            w.event(
                {
                    "ph": "M",
                    "name": "process_labels",
                    "pid": pid,
                    "tid": 0,
                    "args": {"labels": "host " + ", ".join(named)},
                }
            )
    for k in range(len(threads.pid)):
        pid, tid = threads.pid[k], threads.tid[k]
        w.event({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": threads.name[k]}})
        w.event(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": tid % THREADS_PER_PROCESS},
            }
        )


def _write_verdicts(w: _Writer, results: dict, span_ns: int) -> int:
    """The "slowcard verdicts" process: one thread per query, one X event spanning the run."""
    shown = [r for r in results.values() if r.status != Status.SKIP]
    shown.sort(key=lambda r: (severity(r.status), r.query))
    w.event({"ph": "M", "name": "process_name", "pid": VERDICT_PID, "tid": 0, "args": {"name": "slowcard verdicts"}})
    w.event({"ph": "M", "name": "process_sort_index", "pid": VERDICT_PID, "tid": 0, "args": {"sort_index": -1}})
    for i, r in enumerate(shown, start=1):
        tid = VERDICT_PID * THREADS_PER_PROCESS + i
        w.event({"ph": "M", "name": "thread_name", "pid": VERDICT_PID, "tid": tid, "args": {"name": r.query}})
        w.event({"ph": "M", "name": "thread_sort_index", "pid": VERDICT_PID, "tid": tid, "args": {"sort_index": i}})
    for i, r in enumerate(shown, start=1):
        w.event(
            {
                "ph": "X",
                "name": f"{r.query}@v{r.version} {r.status}",
                "cat": "slowcard",
                "pid": VERDICT_PID,
                "tid": VERDICT_PID * THREADS_PER_PROCESS + i,
                "ts": 0.0,
                "dur": _us(max(span_ns, 1)),
                "args": {"summary": r.summary, "rule": r.rule, "rows": _jsonable(r.rows[:5]), "n_rows": len(r.rows)},
            }
        )
    return len(shown)


def _needed_results(con, run: str, results: dict | None, catalog=None) -> dict:
    """``results`` plus what the markers need; every catalog query when ``results`` is None."""
    catalog = catalog or queries_mod.load_catalog()
    out = queries_mod.with_specs(dict(results or {}), catalog)
    for q in sorted(catalog.values(), key=lambda q: (q.order, q.name)):
        # the verdicts that may name the slow card decide what is marked; the rest only when
        # no results were given (the verdict track then shows every query)
        if q.name not in out and (results is None or (q.is_verdict and q.priority is not None)):
            out[q.name] = queries_mod.run_query(con, q, run)
    return out


def write_annotated(
    con, run: str, out: str | Path, results: dict | None = None, *, catalog=None, batch_rows: int = BATCH_ROWS
) -> AnnotateStats:
    """Write the merged, annotated Chrome trace of ``run`` to ``out`` (a temporary file renamed
    at the end, so a reader never sees half a trace).

    ``results`` maps query name -> Result (e.g. ``Diagnosis.results``); when None every query of
    the catalog is run, so the verdict track shows them all. Works on a read-only connection
    (it only creates temporary tables). Raises UsageError when the run is unknown or has no
    Chrome-trace events.
    """
    out = Path(out)
    known = queries_mod.runs(con)
    if run not in known:
        raise UsageError(f"no run named {run!r}; runs in the database: {', '.join(known) or 'none'}")
    results = _needed_results(con, run, results, catalog)
    stats = AnnotateStats(path=out, run=run)

    offsets: dict[str, int] = {}
    if _relation_exists(con, "clock_offsets"):
        offsets = {
            h: int(o)
            for h, o in con.execute("SELECT host, offset_ns FROM clock_offsets WHERE run = ?", [run]).fetchall()
            if o is not None
        }
    srcs = con.execute(
        """
        SELECT s.source_id, s.rank, coalesce(s.host, '') AS host, s.path
        FROM sources s
        WHERE s.run = ? AND s.source_id IN (SELECT DISTINCT source_id FROM event_rows_all WHERE ph <> 'M')
        ORDER BY s.rank NULLS LAST, s.source_id""",
        [run],
    ).fetchall()
    if not srcs:
        raise UsageError(
            f"run {run!r} has no Chrome-trace events to merge (annotate needs trace files, "
            "e.g. *.pt.trace.json or trace_view.json)"
        )
    src_pid = {
        sid: (RANK_PID_BASE + int(rank) if rank is not None else UNRANKED_PID_BASE + sid) for sid, rank, _h, _p in srcs
    }
    src_host = {sid: host for sid, _r, host, _p in srcs}
    src_off = {sid: offsets.get(host, 0) for sid, _r, host, _p in srcs}
    stats.clock_offsets_ns = {h: offsets.get(h, 0) for h in sorted(set(src_host.values()))}
    stats.ranks = sorted({int(s[1]) for s in srcs if s[1] is not None})
    stats.processes = len(set(src_pid.values()))

    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _ann_src (source_id INTEGER, off_ns BIGINT, out_pid BIGINT)")
        con.executemany("INSERT INTO _ann_src VALUES (?, ?, ?)", [(s, src_off[s], src_pid[s]) for s in src_pid])
        t0, t1 = con.execute("""
            SELECT min(e.ts_ns - a.off_ns), max(e.ts_ns + greatest(coalesce(e.dur_ns, 0), 0) - a.off_ns)
            FROM event_rows_all e JOIN _ann_src a USING (source_id)
            WHERE e.ph <> 'M' AND e.ts_ns IS NOT NULL""").fetchone()
        stats.t0_ns, stats.span_us = t0, _us(t1 - t0)
        threads = _thread_table(con, srcs)

        slow = slow_ranks(results)
        stats.slow_ranks = sorted(slow)
        stats.slow_cards = list(dict.fromkeys(f.label for f in findings_mod.slow_cards(results)))
        marks = _Marks(threads)
        markers = (
            _markers(con, run, slow, src_off, t0, marks) if slow and _relation_exists(con, "collective_waits") else []
        )
        heapq.heapify(markers)
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _ann_anchor (source_id INTEGER, ts_ns BIGINT, name VARCHAR, aid INTEGER)"
        )
        if marks.anchor_ids:
            con.executemany(
                "INSERT INTO _ann_anchor VALUES (?, ?, ?, ?)", [(*k, a) for k, a in marks.anchor_ids.items()]
            )

        with atomic_output(out) as f:
            w = _Writer(f)
            w.raw(b'{"displayTimeUnit":"ms","traceEvents":[\n')
            _write_metadata(w, srcs, threads, src_pid, src_host)
            stats.verdicts = _write_verdicts(w, results, t1 - t0)
            stats.events = _write_events(con, w, t0, threads, markers, marks, batch_rows)
            while markers:
                marks.emit(w, heapq.heappop(markers)[2])
            for m in threads.late_meta:
                w.event(m)
            other = {
                "slowcard": {
                    "run": run,
                    "t0_ns": t0,
                    "clock_offsets_ns": stats.clock_offsets_ns,
                    "slow_ranks": {str(k): v for k, v in slow.items()},
                }
            }
            w.raw(b'\n],\n"otherData":' + orjson.dumps(other) + b"}\n")
    finally:
        con.execute("DROP TABLE IF EXISTS _ann_src")
        con.execute("DROP TABLE IF EXISTS _ann_threads")
        con.execute("DROP TABLE IF EXISTS _ann_anchor")
    stats.markers, stats.flows = marks.instants, marks.flows
    stats.moved_events = threads.moved
    stats.overlap_threads = len(threads.late_meta) // 2
    stats.threads = len(threads.pid) + stats.overlap_threads
    return stats


def _thread_table(con, srcs) -> _Threads:
    """One output thread per original (source, pid, tid), named after the original names; also
    written to the temp table _ann_threads for the event query."""
    threads = _Threads()
    rows = con.execute("""
        WITH t AS (
            SELECT source_id, pid, tid FROM event_rows_all
            WHERE source_id IN (SELECT source_id FROM _ann_src) AND ph <> 'M' AND ts_ns IS NOT NULL
            GROUP BY ALL
        ),
        pn AS (SELECT source_id, pid, min(args ->> 'name') AS pname FROM event_rows_all
               WHERE ph = 'M' AND name = 'process_name' GROUP BY ALL),
        tn AS (SELECT source_id, pid, tid,
                      min(args ->> 'name') FILTER (WHERE name = 'thread_name') AS tname,
                      min(TRY_CAST(args ->> 'sort_index' AS BIGINT)) FILTER (WHERE name = 'thread_sort_index') AS sidx
               FROM event_rows_all WHERE ph = 'M' AND name IN ('thread_name', 'thread_sort_index') GROUP BY ALL)
        SELECT t.source_id, t.pid, t.tid, pn.pname, tn.tname, a.out_pid
        FROM t JOIN _ann_src a USING (source_id)
        LEFT JOIN pn ON pn.source_id = t.source_id AND pn.pid IS NOT DISTINCT FROM t.pid
        LEFT JOIN tn ON tn.source_id = t.source_id AND tn.pid IS NOT DISTINCT FROM t.pid
                    AND tn.tid IS NOT DISTINCT FROM t.tid
        ORDER BY a.out_pid, t.source_id, TRY_CAST(t.pid AS BIGINT) NULLS LAST, t.pid,
                 tn.sidx NULLS LAST, TRY_CAST(t.tid AS BIGINT) NULLS LAST, t.tid""").fetchall()
    groups: dict[int, set] = {}
    sources: dict[int, set] = {}
    for sid, pid, _tid, _pn, _tn, opid in rows:
        groups.setdefault(opid, set()).add((sid, pid))
        sources.setdefault(opid, set()).add(sid)
    path = {s[0]: s[3] for s in srcs}
    for sid, pid, tid, pname, tname, opid in rows:
        name = tname or (f"tid {tid}" if tid else "(no tid)")
        if len(groups[opid]) > 1:  # several original processes in this rank
            name = f"{pname or (f'pid {pid}' if pid else '(no pid)')} / {name}"
        if len(sources[opid]) > 1:  # several files of this rank
            name = f"[{os.path.basename(path[sid])}] {name}"
        threads.add((sid, pid, tid), opid, name)
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _ann_threads (source_id INTEGER, pid VARCHAR, tid VARCHAR, "
        "tkey INTEGER, out_pid BIGINT, out_tid BIGINT)"
    )
    con.executemany(
        "INSERT INTO _ann_threads VALUES (?, ?, ?, ?, ?, ?)",
        [(*key, k, threads.pid[k], threads.tid[k]) for key, k in threads.key.items()],
    )
    return threads


# µs with exactly three decimals from integer ns (x >= 0): no floating-point rounding at all
_US = "(({x}) // 1000)::VARCHAR || '.' || lpad((({x}) % 1000)::VARCHAR, 3, '0')"


def _write_events(con, w: _Writer, t0: int, threads: _Threads, markers: list, marks: _Marks, batch_rows: int) -> int:
    """Stream the run's events sorted by corrected time (a parent before its children: longer
    first at equal ts). DuckDB writes each event's JSON around its tid; X events get their tid
    from the lane placement."""
    phases = ", ".join(f"'{p}'" for p in _KEEP_PHASES)
    sql = f"""
        WITH e AS (
            SELECT e.*, e.ts_ns - a.off_ns - $t0 AS t_ns, greatest(coalesce(e.dur_ns, 0), 0) AS d_ns,
                   th.tkey, th.out_pid, th.out_tid
            FROM event_rows_all e
            JOIN _ann_src a USING (source_id)
            JOIN _ann_threads th ON th.source_id = e.source_id AND th.pid IS NOT DISTINCT FROM e.pid
                                AND th.tid IS NOT DISTINCT FROM e.tid
            WHERE e.ph IN ({phases}) AND e.ts_ns IS NOT NULL
        )
        SELECT e.tkey, e.ph = 'X' AS is_x, e.t_ns, e.t_ns + e.d_ns AS end_ns, an.aid,
               '{{"ph":' || to_json(e.ph) || ',"name":' || to_json(coalesce(e.name, ''))
                 || coalesce(',"cat":' || to_json(e.cat), '')
                 || ',"pid":' || e.out_pid || ',"tid":' AS head,
               e.out_tid,
               ',"ts":' || {_US.format(x="e.t_ns")}
                 || CASE WHEN e.ph = 'X' THEN ',"dur":' || {_US.format(x="e.d_ns")} ELSE '' END
                 || CASE WHEN e.id IS NULL THEN ''
                         ELSE ',"id":' || (CAST(e.source_id AS BIGINT) * 1000000000
                                + coalesce(TRY_CAST(e.id AS BIGINT) % 1000000000,
                                           CAST(hash(e.id) % 1000000000 AS BIGINT)))::VARCHAR END
                 || CASE WHEN e.ph = 'f' THEN ',"bp":"e"'
                         WHEN e.ph IN ('i', 'I') THEN ',"s":"t"' ELSE '' END
                 || coalesce(',"args":' || CAST(e.args AS VARCHAR), '') || '}}' AS tail
        FROM e
        LEFT JOIN _ann_anchor an ON an.source_id = e.source_id AND an.ts_ns = e.ts_ns AND an.name = e.name
                                AND e.ph = 'X'
        ORDER BY e.t_ns, e.d_ns DESC, e.source_id, e.pid, e.tid
    """
    n = 0
    place = threads.place
    anchors = marks.anchors
    reader = con.execute(sql, {"t0": t0}).to_arrow_reader(batch_rows)
    for batch in reader:
        c = batch.to_pydict()
        parts: list[str] = []
        for tkey, is_x, t_ns, end_ns, aid, head, out_tid, tail in zip(
            c["tkey"], c["is_x"], c["t_ns"], c["end_ns"], c["aid"], c["head"], c["out_tid"], c["tail"]
        ):
            if markers and markers[0][0] < t_ns:
                w.text(parts)
                parts = []
                while markers and markers[0][0] < t_ns:
                    marks.emit(w, heapq.heappop(markers)[2])
            if is_x:
                out_tid = place(tkey, t_ns, end_ns)
                if aid is not None:
                    anchors[aid] = (threads.pid[tkey], out_tid)
            parts.append(f"{head}{out_tid}{tail}")
        n += len(c["tkey"])
        w.text(parts)
        w.flush()
    return n
