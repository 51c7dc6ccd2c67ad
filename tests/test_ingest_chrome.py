"""Chrome-trace ingest: the three dialects, exact timestamps, args kept whole, salvage of cut
files, wrong boundary cuts, reconciliation of counts, atomic and idempotent commits, real files."""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import random
import re
import shutil
import subprocess
import threading
import zlib
from decimal import Decimal
from pathlib import Path

import duckdb
import orjson
import pytest
from conftest import duckdb_cli, trace_text, write_trace

from slowcard import store
from slowcard.ingest import chrome, chrome_exact, chrome_parts, ingest_paths, read_head
from slowcard.ingest.base import Context, IngestOptions

BASE_NS = 1711964646000000000
CHROME_FORMATS = {"kineto", "ascend_trace", "service_trace", "chrome_array"}


# -- helpers ------------------------------------------------------------------------------------
def ro(db: Path) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(str(db), read_only=True)


def ts_ns(ts, base: int = 0) -> int | None:
    """Exact ns of a ts as written in the file (floats are written by json.dumps as their repr)."""
    if ts is None:
        return None
    text = repr(ts) if isinstance(ts, float) else str(ts)
    return int((Decimal(text.strip()) * 1000).to_integral_value()) + base


def expected_rows(events, base: int = 0) -> collections.Counter:
    return collections.Counter((e.get("name"), ts_ns(e.get("ts"), base)) for e in events)


def stored_rows(con, path: Path) -> collections.Counter:
    return collections.Counter(
        con.execute(
            "SELECT e.name, e.ts_ns FROM event_rows e JOIN sources s USING (source_id) WHERE s.path = ?",
            [str(path.resolve())],
        ).fetchall()
    )


def source(con, path: Path) -> dict:
    cur = con.execute("SELECT * FROM sources WHERE path = ?", [str(path.resolve())])
    cols = [d[0] for d in cur.description]
    rows = cur.fetchall()
    assert len(rows) == 1, f"{path}: expected one sources row, found {len(rows)}"
    return dict(zip(cols, rows[0]))


def assert_reconciled(con, sid: int) -> None:
    """seen = kept + dropped; every dropped row has a reason in source_drops; kept rows exist."""
    seen, kept, dropped, fmt = con.execute(
        "SELECT rows_seen, rows_kept, rows_dropped, format FROM sources WHERE source_id = ?", [sid]
    ).fetchone()
    assert seen == kept + dropped
    drops = con.execute("SELECT reason, position, n_rows FROM source_drops WHERE source_id = ?", [sid]).fetchall()
    assert sum(n for _, _, n in drops) == dropped
    assert all(reason and position and n > 0 for reason, position, n in drops), drops
    if fmt in CHROME_FORMATS:
        assert con.execute("SELECT count(*) FROM event_rows WHERE source_id = ?", [sid]).fetchone()[0] == kept


def read_direct(con, path: Path, **opts):
    """Run the Chrome reader alone, without the commit (whose cost grows with the number of
    distinct names): (Outcome, rows written under its source id). The rows stay pending."""
    sid = store.new_source_id(con)
    fmt = chrome.READER.sniff(path, read_head(path))
    out = chrome.READER.ingest(Context(path, fmt, sid, "t", con, IngestOptions(**opts)))
    n = con.execute("SELECT count(*) FROM event_rows WHERE source_id = ?", [sid]).fetchone()[0]
    return out, n


def phase_events() -> list[dict]:
    """One trace's worth of every phase: X, B/E, i/I, C, s/t/f flows, M metadata."""
    return [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "main"}},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": 7,
            "ts": 4458676624388.731,
            "dur": 10.5,
            "args": {"External id": 1},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "gemm",
            "pid": 0,
            "tid": 20,
            "ts": 4458676624390.001,
            "dur": 3.25,
            "args": {"correlation": 1},
        },
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy HtoD",
            "pid": 0,
            "tid": 20,
            "ts": 4458676624395.5,
            "dur": 1.0,
            "args": {"bytes": 4096},
        },
        {"ph": "B", "cat": "user", "name": "region", "pid": 1, "tid": 7, "ts": 4458676624388.0},
        {"ph": "E", "cat": "user", "name": "region", "pid": 1, "tid": 7, "ts": 4458676624399.999},
        {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "mark", "pid": 1, "tid": 7, "ts": 4458676624389.25},
        {
            "ph": "i",
            "s": "t",
            "cat": "[memory]",
            "name": "[memory]",
            "pid": 1,
            "tid": 7,
            "ts": 4458676624389.5,
            "args": {"Bytes": 512, "Addr": 140234567890123},
        },
        {"ph": "I", "name": "global mark", "pid": 1, "tid": 7, "ts": 4458676624389.75},
        {"ph": "C", "name": "mem", "pid": 1, "ts": 4458676624390.0, "args": {"allocated": 10}},
        {"ph": "C", "name": "mem", "pid": 1, "ts": 4458676624391.0, "args": {"allocated": 12}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 1, "tid": 7, "ts": 4458676624388.9},
        {"ph": "t", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 1, "tid": 7, "ts": 4458676624389.9},
        {"ph": "f", "bp": "e", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 0, "tid": 20, "ts": 4458676624390.001},
    ]


PHASES = {"M": 2, "X": 3, "B": 1, "E": 1, "i": 2, "I": 1, "C": 2, "s": 1, "t": 1, "f": 1}

# name -> (indent, suffix, bom)
LAYOUTS = {
    "one_line": (None, ".json", False),
    "pretty": (2, ".json", False),
    "one_line_gz": (None, ".json.gz", False),
    "pretty_gz": (2, ".json.gz", False),
    "bom": (None, ".json", True),
    "bom_pretty": (2, ".json", True),
}


@pytest.fixture(scope="module")
def kineto_layouts(tmp_path_factory, _template_db):
    """Every layout of one Kineto trace, header keys before AND distributedInfo after the events,
    ingested in one run."""
    d = tmp_path_factory.mktemp("layouts")
    db = d / "t.duckdb"
    shutil.copyfile(_template_db, db)
    header = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "GPU"}], "baseTimeNanoseconds": BASE_NS}
    trailer = {"distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 4}, "traceName": "x.pt.trace.json"}
    paths = {
        name: write_trace(d / f"{name}{suffix}", phase_events(), header, trailer, indent=indent, bom=bom)
        for name, (indent, suffix, bom) in LAYOUTS.items()
    }
    report = ingest_paths(db, list(paths.values()), run="layouts")
    return db, paths, report


# -- dialects -----------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_kineto_layouts_keep_every_phase_rank_and_exact_ts(kineto_layouts, layout):
    db, paths, report = kineto_layouts
    path = paths[layout]
    res = {f.path: f for f in report.files}[str(path.resolve())]
    assert (res.status, res.format, res.rows_kept, res.rows_dropped) == ("ok", "kineto", 15, 0), res.message
    with ro(db) as con:
        src = source(con, path)
        # distributedInfo comes AFTER traceEvents here: the trailer parse must still find it.
        assert (src["rank"], src["rank_source"], src["world_size"]) == (3, "distributedInfo", 4)
        assert src["base_time_ns"] == BASE_NS
        assert json.loads(src["metadata"])["traceName"] == "x.pt.trace.json"
        phases = dict(
            con.execute(
                "SELECT ph, count(*) FROM event_rows WHERE source_id = ? GROUP BY ph", [src["source_id"]]
            ).fetchall()
        )
        assert phases == PHASES
        # absolute ns = baseTimeNanoseconds + ts * 1000, exactly (4458676624388.731 is a real
        # Kineto value that DuckDB's DOUBLE->DECIMAL cast turns into ...388.732)
        assert stored_rows(con, path) == expected_rows(phase_events(), BASE_NS)
        flow = con.execute(
            "SELECT id, tid, pid FROM event_rows WHERE source_id = ? AND ph = 'f'", [src["source_id"]]
        ).fetchone()
        assert flow == ("1", "20", "0")
        assert_reconciled(con, src["source_id"])


def test_ascend_trace_view_array_with_string_ts(tmp_db, tmp_path, make_trace):
    events = [
        {
            "ph": "X",
            "name": "aten::empty",
            "pid": 437675,
            "tid": 437675,
            "ts": "1704161511420306.491",
            "dur": 13.08,
            "cat": "cpu_op",
            "args": {"Sequence number": -1},
        },
        {
            "ph": "s",
            "bp": "e",
            "name": "enqueue_to_dequeue",
            "id": 148,
            "pid": 437675,
            "tid": 437675,
            "ts": "1704161511422856.936",
            "cat": "async_task_queue",
        },
        {
            "ph": "f",
            "bp": "e",
            "name": "enqueue_to_dequeue",
            "id": 148,
            "pid": 2,
            "tid": 3,
            "ts": "1704161511422857.5",
            "cat": "async_task_queue",
        },
        {"ph": "X", "name": "odd", "pid": 1, "tid": 1, "ts": " 17.25 ", "dur": 1},
        {"ph": "M", "name": "process_name", "pid": 437675, "args": {"name": "Python"}},
    ]
    path = make_trace(tmp_path / "PROF_x_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json", events, array=True)
    report = ingest_paths(tmp_db, [path], run="ascend")
    f = report.files[0]
    assert (f.format, f.status, f.rows_kept) == ("ascend_trace", "ok", 5)
    with ro(tmp_db) as con:
        assert stored_rows(con, path) == expected_rows(events)
        assert con.execute("SELECT ts_ns FROM events WHERE name = 'aten::empty'").fetchone()[0] == 1704161511420306491
        assert con.execute("SELECT dur_ns, ts_us FROM events WHERE name = 'aten::empty'").fetchone() == (
            13080,
            1704161511420306.491,
        )


def test_service_trace_dialect(tmp_db, tmp_path, make_trace):
    pid = 201337
    events = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": str(pid)}},
        {"name": "process_labels", "ph": "M", "pid": pid, "args": {"labels": "node-7,dp1"}},
        {
            "name": "batchFrameworkProcessing",
            "ph": "X",
            "ts": 1773992798123456.0,
            "dur": 1556.0,
            "pid": pid,
            "tid": f"Schedule({pid})",
            "args": {"batch_type": "Prefill", "batch_size": "2", "res_list": [{"rid": "cmpl-0", "iter": 0}]},
        },
        {
            "name": "modelExec",
            "ph": "X",
            "ts": 1773992798125012.5,
            "dur": 900.25,
            "pid": pid,
            "tid": f"Execute({pid})",
            "args": {},
        },
        {
            "name": "Schedule.KVCache-dp1",
            "ph": "C",
            "ts": 1773992798125012.0,
            "pid": pid,
            "tid": "Schedule.KVCache",
            "args": {"Device Block": 6910},
        },
        {
            "name": "WaitingQueue",
            "ph": "C",
            "ts": 1773992798125013.0,
            "pid": pid,
            "tid": "Queue",
            "args": {"Queue Size": 3},
        },
        {
            "name": "flow_cmpl-0",
            "ph": "s",
            "ts": 1773992798123456.0,
            "id": "cmpl-0",
            "cat": "cmpl-0",
            "pid": pid,
            "tid": "Request",
        },
        {
            "name": "flow_cmpl-0",
            "ph": "f",
            "ts": 1773992798126000.0,
            "id": "cmpl-0",
            "cat": "cmpl-0",
            "pid": pid,
            "tid": "Request",
        },
    ]
    path = make_trace(
        tmp_path / "chrome_tracing.json",
        events,
        text="[\n" + ",\n".join(json.dumps(e, separators=(",", ":")) for e in events) + "\n]\n",
    )
    report = ingest_paths(tmp_db, [path], run="svc")
    f = report.files[0]
    assert (f.format, f.status, f.rows_kept) == ("service_trace", "ok", 8), f.message
    with ro(tmp_db) as con:
        assert stored_rows(con, path) == expected_rows(events)
        assert dict(con.execute("SELECT ph, count(*) FROM events GROUP BY ph").fetchall()) == {
            "M": 2,
            "X": 2,
            "C": 2,
            "s": 1,
            "f": 1,
        }
        assert (
            con.execute("SELECT args->>'$.labels' FROM events WHERE name = 'process_labels'").fetchone()[0]
            == "node-7,dp1"
        )
        assert sorted(
            r[0] for r in con.execute("SELECT DISTINCT tid FROM events WHERE tid IS NOT NULL").fetchall()
        ) == ["Execute(201337)", "Queue", "Request", "Schedule(201337)", "Schedule.KVCache"]
        assert con.execute("SELECT id FROM events WHERE ph = 's'").fetchone()[0] == "cmpl-0"


# -- exact timestamps ---------------------------------------------------------------------------
# Each value is the JSON token as written in the file (numbers unquoted, strings quoted).
TS_CASES = {
    # beyond a double (0.25 µs steps at epoch scale): only the original text is exact
    "epoch_numbers_with_ns": ["1704161511420306.491", "1704161511420306.4", "1704161511420307.999"],
    # doubles that DuckDB's DECIMAL cast gets wrong (.5 -> .512, .25 -> .256)
    "epoch_numbers_representable": ["1773992798123456.5", "1773992798123456.25", "1773992798123456.0"],
    # relative (Kineto) first, then absolute integer epoch in the same file: nothing may overflow
    "relative_then_absolute": ["12.5", "0.001", "1682725898236567", "5367150393171.791", "-3.5"],
    # decimal strings and numbers mixed in one part
    "strings_and_numbers": ['"1704161511420306.491"', "12.25", '"-3.5"', "1682725898236567", '" 7.125 "'],
}


@pytest.mark.parametrize("case", sorted(TS_CASES))
def test_timestamps_exact_to_the_nanosecond(tmp_db, tmp_path, case):
    tokens = TS_CASES[case]
    body = ",\n".join(
        f'{{"ph": "X", "name": "e{i}", "pid": 1, "tid": 1, "ts": {t}, "dur": 1}}' for i, t in enumerate(tokens)
    )
    path = write_trace(tmp_path / f"{case}.json", text="[" + body + "]")
    report = ingest_paths(tmp_db, [path], run="ts")
    assert (report.files[0].status, report.files[0].rows_kept) == ("ok", len(tokens)), report.files[0].message
    with ro(tmp_db) as con:
        got = dict(con.execute("SELECT name, ts_ns FROM event_rows").fetchall())
    want = {f"e{i}": int((Decimal(t.strip('"').strip()) * 1000).to_integral_value()) for i, t in enumerate(tokens)}
    assert got == want


def test_base_time_after_the_events_rebases(tmp_db, tmp_path, make_trace):
    """On-demand Kineto writes baseTimeNanoseconds and distributedInfo after traceEvents."""
    events = [{"ph": "X", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 1000.5 + i, "dur": 1} for i in range(5)]
    path = make_trace(
        tmp_path / "ondemand.json",
        events,
        {"schemaVersion": 1},
        {"baseTimeNanoseconds": BASE_NS, "distributedInfo": {"rank": 1, "world_size": 2}},
    )
    ingest_paths(tmp_db, [path], run="od")
    with ro(tmp_db) as con:
        assert stored_rows(con, path) == expected_rows(events, BASE_NS)
        assert (source(con, path)["base_time_ns"], source(con, path)["rank"]) == (BASE_NS, 1)


# -- args ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("path_taken", ["duckdb", "exact_fallback"])
def test_args_kept_whole(tmp_db, tmp_path, path_taken):
    events = [
        '{"ph": "X", "name": "memcpy", "pid": 1, "tid": 1, "ts": 1, "dur": 1, '
        '"args": {"bytes": 4096, "Bytes": 8192, "hash": 1180591620717411303425, '
        '"u64": 18446744073709551615, "nested": {"list": [{"a": 1}, {"b": [2, 3]}]}, "uni": "\u4e2d\u6587 \U0001f600"}}'
    ]
    if path_taken == "exact_fallback":
        # one bad event in the same part sends the whole part through the exact Python path
        events.append('{"ph": "X", "name": "bad", "pid": 1, "tid": 1, "ts": "abc", "dur": 1}')
    path = write_trace(tmp_path / "args.json", text="[" + ",\n".join(events) + "]")
    report = ingest_paths(tmp_db, [path], run="args")
    assert report.files[0].rows_kept == 1
    assert report.files[0].rows_dropped == (1 if path_taken == "exact_fallback" else 0)
    with ro(tmp_db) as con:
        row = con.execute(
            """SELECT json_extract(args, '$.bytes')::VARCHAR, json_extract(args, '$.Bytes')::VARCHAR,
                      json_extract(args, '$.hash')::VARCHAR, json_extract(args, '$.u64')::VARCHAR,
                      json_extract(args, '$.nested.list[1].b[1]')::VARCHAR, args->>'$.uni', json_keys(args)
               FROM events WHERE name = 'memcpy'"""
        ).fetchone()
    assert row == (
        "4096",
        "8192",
        "1180591620717411303425",
        "18446744073709551615",
        "3",
        "\u4e2d\u6587 \U0001f600",
        ["bytes", "Bytes", "hash", "u64", "nested", "uni"],
    )


# -- truncation salvage -------------------------------------------------------------------------
def _salvage_trace(n: int = 200):
    """(text, [(start, end) of each event]) of an object-form trace with a trailer; some names
    carry '}, {' so that wrong cuts happen too."""
    head = '{"schemaVersion": 1, "traceEvents": [\n'
    spans, bodies, pos = [], [], len(head)
    for i in range(n):
        name = f"op{i % 10}" + ("}, {x" if i % 7 == 0 else "")
        body = json.dumps(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": name,
                "pid": 1,
                "tid": 1,
                "ts": 1000 + i,
                "dur": 0.5,
                "args": {"l": [{"a": i}, {"b": "s" * (i % 13)}]},
            }
        )
        bodies.append(body)
        spans.append((pos, pos + len(body)))
        pos += len(body) + 2
    text = head + ",\n".join(bodies) + '\n], "traceName": "t", "distributedInfo": {"rank": 0}}\n'
    return text, spans


def _cut_positions(text: str, spans, k: int = 40) -> list[int]:
    rng = random.Random(7)
    end_events = text.rindex("]")
    picks = {
        spans[3][1] + 1,
        spans[10][1] + 2,
        spans[-1][1] + 1,  # right after '},' / after ', \n'
        spans[0][0] + 1,
        spans[5][0] + 12,
        spans[7][0] + 30,  # inside an event, mid-string
        spans[-1][1],
        end_events,
        end_events + 1,
        end_events + 5,  # before ']}', after ']'
        len(text.rstrip()) - 1,
    }  # only the final '}' missing
    while len(picks) < k:
        picks.add(rng.randrange(spans[0][0], len(text.rstrip())))
    return sorted(picks)


def test_truncated_trace_keeps_every_complete_event(tmp_db, tmp_path):
    text, spans = _salvage_trace()
    positions = _cut_positions(text, spans)
    assert len(positions) == 40
    con = store.open_db(tmp_db)
    try:
        for c in positions:
            path = tmp_path / f"cut{c}.json"
            path.write_text(text[:c])
            complete = sum(1 for _, e in spans if e <= c)
            partial = any(s < c < e for s, e in spans)
            out, n = read_direct(con, path, part_bytes=4096)
            where = f"cut at byte {c} ({text[max(0, c - 15) : c]!r}|{text[c : c + 10]!r})"
            assert out.status == "truncated", where
            assert (out.rows_kept, n, out.rows_dropped) == (complete, complete, int(partial)), where
            assert out.rows_seen == out.rows_kept + out.rows_dropped
            assert f"kept {complete} events" in out.message and "cut" in out.message, (where, out.message)
    finally:
        con.close()


def test_truncated_gzip_salvages_what_decompressed(tmp_db, tmp_path):
    text, spans = _salvage_trace(400)
    gz = gzip.compress(text.encode(), mtime=0)
    con = store.open_db(tmp_db)
    try:
        for frac in (0.3, 0.5, 0.8, 0.97):
            cut = gz[: int(len(gz) * frac)]
            prefix = zlib.decompressobj(31).decompress(cut)  # what any reader can recover
            complete = sum(1 for _, e in spans if e <= len(prefix))
            path = tmp_path / f"cut{frac}.json.gz"
            path.write_bytes(cut)
            out, n = read_direct(con, path, part_bytes=2048)
            assert out.status == "truncated"
            assert (out.rows_kept, n) == (complete, complete), frac
            assert complete > 0 and "cut" in out.message and f"kept {complete} events" in out.message
        # a gzip whose end marker alone is missing: every event is there, still flagged
        path = tmp_path / "no_trailer.json.gz"
        path.write_bytes(gz[:-8])
        out, n = read_direct(con, path)
        assert (out.status, out.rows_kept, n) == ("truncated", 400, 400)
    finally:
        con.close()


def test_array_without_closing_bracket_is_valid(tmp_db, tmp_path):
    """The Chrome trace format makes the closing ']' of the array form optional."""
    events = [{"ph": "X", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(6)]
    path = write_trace(tmp_path / "open.json", text=json.dumps(events)[:-1] + ",\n")
    con = store.open_db(tmp_db)
    try:
        out, n = read_direct(con, path)
    finally:
        con.close()
    assert (out.status, out.rows_kept, n, out.rows_dropped) == ("ok", 6, 6, 0)
    assert "no closing ']'" in out.message


# -- wrong boundary cuts ------------------------------------------------------------------------
def _adversarial_events(n: int):
    events = []
    for i in range(n):
        name = f"op{i % 10}" + ("}, {weird" if i % 3 == 0 else "") + ('"}, {"x": 1' if i % 5 == 0 else "")
        events.append(
            {
                "ph": "X",
                "name": name,
                "pid": 1,
                "tid": 1,
                "ts": 1000 + i * 0.5,
                "dur": 1,
                "args": {"list": [{"a": i}, {"b": [i, {"c": "}, {"}]}], "pad": "x" * (i % 40)},
            }
        )
    return events


@pytest.mark.parametrize("suffix,threads", [(".json", 2), (".json.gz", 1)])
def test_wrong_boundary_cuts_lose_and_duplicate_nothing(tmp_db, tmp_path, monkeypatch, suffix, threads):
    events = _adversarial_events(1500)
    path = write_trace(tmp_path / f"adv{suffix}", events, {"schemaVersion": 1}, {"distributedInfo": {"rank": 5}})
    repaired = []
    orig = chrome._Ingest._fallback

    def spy(self, raw):
        repaired.append(len(raw))
        return orig(self, raw)

    monkeypatch.setattr(chrome._Ingest, "_fallback", spy)
    report = ingest_paths(tmp_db, [path], run="adv", options=IngestOptions(part_bytes=4096, threads=threads))
    f = report.files[0]
    assert (f.status, f.rows_kept, f.rows_dropped, f.rank) == ("ok", 1500, 0, 5), f.message
    # the 4 KB parts really were cut inside strings / nested objects, and repaired
    assert len(repaired) >= 10
    with ro(tmp_db) as con:
        got = stored_rows(con, path)
    want = expected_rows(json.loads(trace_text(events))["traceEvents"])

    def digest(c):
        return hashlib.sha256(repr(sorted(c.items())).encode()).hexdigest()

    assert digest(got) == digest(want)


def test_long_trailer_with_object_lists_after_the_events(tmp_db, tmp_path):
    """On-demand Kineto writes distributedInfo (pg_config: a list of objects, large in big jobs)
    after the events; with parts smaller than that trailer, a '}, {' inside it is taken for an
    event boundary. The trailer must still be read, and nothing counted as a bad event."""
    events = [{"ph": "X", "name": f"op{i % 10}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(500)]
    pg = [{"pg_name": str(i), "pg_desc": "default_pg", "ranks": list(range(50))} for i in range(60)]
    path = write_trace(
        tmp_path / "ondemand.json",
        events,
        {"schemaVersion": 1},
        {"distributedInfo": {"rank": 5, "world_size": 8, "pg_config": pg}, "traceName": "t"},
    )
    report = ingest_paths(tmp_db, [path], run="t", options=IngestOptions(part_bytes=4096))
    f = report.files[0]
    assert (f.status, f.rows_kept, f.rows_dropped, f.rank) == ("ok", 500, 0, 5), f.message
    with ro(tmp_db) as con:
        meta = json.loads(source(con, path)["metadata"])
    assert len(meta["distributedInfo"]["pg_config"]) == 60 and meta["traceName"] == "t"


def test_garbage_between_events_is_skipped_not_looped_on(tmp_db, tmp_path):
    path = write_trace(
        tmp_path / "g.json",
        text='[{"ph": "X", "name": "a", "ts": 1}, }}} , '
        '{"ph": "X", "name": "b", "ts": 2}, abc, {"name": "c", "ts": 3}]',
    )
    con = store.open_db(tmp_db)
    try:
        out, n = read_direct(con, path)
    finally:
        con.close()
    assert (out.status, out.rows_kept, n) == ("salvaged", 3, 3)
    assert out.rows_dropped >= 2 and out.rows_seen == out.rows_kept + out.rows_dropped
    assert all(r == "event is not valid JSON" for r, _, _ in out.drops)


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_part_size_is_honoured(tmp_db, tmp_path, monkeypatch, suffix):
    """IngestOptions.part_bytes below the read size still gives parts of about that size (the
    wrong-cut test above depends on it), on both the plain-file and the decompressing path."""
    events = [{"ph": "X", "name": f"op{i % 10}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(3000)]
    path = write_trace(tmp_path / f"p{suffix}", events)
    sizes = []
    if suffix == ".json":
        orig_plan = chrome._Ingest._plain_parts

        def spy_plan(self, *a):
            parts, tail_at = orig_plan(self, *a)
            sizes.extend(length + 2 for _, length, _, _ in parts)
            return parts, tail_at

        monkeypatch.setattr(chrome._Ingest, "_plain_parts", spy_plan)
    else:
        orig = chrome_parts._feed_part_file

        def spy(part, pipe):
            sizes.append(Path(part).stat().st_size)
            return orig(part, pipe)

        monkeypatch.setattr(chrome_parts, "_feed_part_file", spy)
    report = ingest_paths(tmp_db, [path], run="p", options=IngestOptions(part_bytes=8192))
    assert report.files[0].rows_kept == 3000
    assert len(sizes) > 10 and max(sizes) <= 8192 + 2


def test_plain_cuts_do_not_depend_on_the_first_window(tmp_path, monkeypatch):
    """The cuts of an uncompressed file are looked for in a small window first (FIRST_WINDOW),
    then in BOUNDARY_WINDOW: the parts must be the very ones the wide window alone finds, also
    where an event is larger than the small window or a boundary straddles its start."""
    rng = random.Random(7)
    pads = [rng.choice([0, 40, 300, 900]) for _ in range(2000)]
    events = [
        {"ph": "X", "name": "op", "pid": 1, "tid": 1, "ts": i, "args": {"pad": "x" * n}} for i, n in enumerate(pads)
    ]
    path = write_trace(tmp_path / "w.json", events)

    def cuts(first_window):
        monkeypatch.setattr(chrome_parts, "FIRST_WINDOW", first_window)
        ing = chrome._Ingest(Context(path, "kineto", 1, "w", None, IngestOptions(part_bytes=8192)))
        s = chrome_parts._Stream(path)
        try:
            fd = s.f.fileno()
            return ing._plain_parts(fd, s.base + ing._find_events(s), path.stat().st_size)
        finally:
            s.close()

    wide = cuts(chrome_parts.BOUNDARY_WINDOW)
    assert len(wide[0]) > 20
    for first in (256, 700, 1000, 4096):
        assert cuts(first) == wide, first


def _ingest_leaving_nothing_behind(db, tmp_path, path):
    """Ingest one trace in 8 KB parts; assert no thread and no pipe or part file outlives it."""
    import threading

    before = threading.active_count()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    report = ingest_paths(db, [path], run="p", options=IngestOptions(part_bytes=8192, tmp_dir=scratch))
    assert threading.active_count() == before
    assert not list(scratch.iterdir())
    return report.files[0]


@pytest.mark.parametrize("bad_at", [None, 10, 2500])
def test_plain_file_goes_through_pipes_in_one_statement(tmp_db, tmp_path, monkeypatch, bad_at):
    """An uncompressed multi-part file is inserted by ONE statement over named pipes. When DuckDB
    rejects a part (a bad event near the start or the end), nothing of that statement stays, the
    parts go again through part files, every good event is kept once, and no feeder thread or
    pipe is left behind."""
    events = [{"ph": "X", "name": f"op{i % 10}", "pid": 1, "tid": 1, "ts": i + 0.25, "dur": 1} for i in range(3000)]
    text = trace_text(events, {"schemaVersion": 1})
    if bad_at is not None:
        # a dur DuckDB cannot read as a number (ts stays numeric: every part reads ts one way)
        text = text.replace(f'"ts": {bad_at}.25, "dur": 1', f'"ts": {bad_at}.25, "dur": "1x"', 1)
        assert '"1x"' in text
    path = write_trace(tmp_path / "piped.json", text=text)
    calls = []
    orig = chrome._Ingest._insert_through_pipes

    def spy(self, fd, parts):
        ok = orig(self, fd, parts)
        calls.append((len(parts), ok))
        return ok

    monkeypatch.setattr(chrome._Ingest, "_insert_through_pipes", spy)
    f = _ingest_leaving_nothing_behind(tmp_db, tmp_path, path)
    assert len(calls) == 1 and calls[0][0] > 10
    assert calls[0][1] is (bad_at is None)
    if bad_at is None:
        assert (f.status, f.rows_kept, f.rows_dropped) == ("ok", 3000, 0)
    else:
        assert (f.status, f.rows_kept, f.rows_dropped) == ("salvaged", 2999, 1), f.message
        assert f"first at event {bad_at}" in f.message
    with ro(tmp_db) as con:
        want = expected_rows([e for i, e in enumerate(events) if i != bad_at])
        assert stored_rows(con, path) == want


@pytest.mark.parametrize("case", ["clean", "bad_early", "bad_late", "short_estimate", "ts_turns_string", "stall"])
def test_gz_file_goes_through_pipes_in_one_statement(tmp_db, tmp_path, monkeypatch, case):
    """A .json.gz is inserted by ONE statement over named pipes fed as it decompresses (every
    extra statement makes DuckDB rewrite row groups at checkpoint). When the size estimate from the
    gzip trailer is short, the parts beyond the pipes go in waves after it; when DuckDB rejects the
    statement (a bad event, a part whose ts is read another way) nothing of it stays, the file is
    decompressed again and goes in waves: every good event is kept once, exactly, and no thread,
    pipe or part file is left behind."""
    events = [{"ph": "X", "name": f"op{i % 10}", "pid": 1, "tid": 1, "ts": i + 0.25, "dur": 1} for i in range(3000)]
    bad_at = {"bad_early": 10, "bad_late": 2500}.get(case)
    text = trace_text(events, {"schemaVersion": 1})
    if bad_at is not None:
        text = text.replace(f'"ts": {bad_at}.25, "dur": 1', f'"ts": {bad_at}.25, "dur": "1x"', 1)
        assert '"1x"' in text
    if case == "ts_turns_string":
        # from event 2000 on, ts are strings: those parts are read as VARCHAR, the first as DOUBLE
        for i in range(2000, 3000):
            text = text.replace(f'"ts": {i}.25,', f'"ts": "{i}.250",', 1)
    if case == "short_estimate":
        monkeypatch.setattr(chrome_parts, "_gz_content_size", lambda path: 40_000)
    if case == "stall":
        # DuckDB does not read the first part in time (as if it opened the pipes out of order):
        # the dispatcher must give up rather than wait forever, and the file go in waves
        # the dispatcher must give up rather than wait forever, and the file go in waves.
        # No timed sleep: the first part is held back until the dispatcher has given up (it
        # then fails the statement by feeding "[!" into the pipes it has not fed).
        monkeypatch.setattr(chrome_parts, "PIPE_STALL_S", 0.2)
        feed_part, feed_pipe = chrome_parts._feed_part_file, chrome_parts._feed_pipe
        gave_up, first = threading.Event(), threading.Lock()
        held = []

        def watching(fd, offset, length, pipe, head=b"[", end=b"]", done=None):
            if head == b"[!":
                gave_up.set()
            return feed_pipe(fd, offset, length, pipe, head, end, done)

        def held_first(part, pipe):
            if first.acquire(blocking=False):  # the first part only, once
                held.append(gave_up.wait(60))
            return feed_part(part, pipe)

        monkeypatch.setattr(chrome_parts, "_feed_pipe", watching)
        monkeypatch.setattr(chrome_parts, "_feed_part_file", held_first)
    path = write_trace(tmp_path / "piped.json.gz", text=text)
    statements = []
    orig = chrome._Ingest._insert_files
    monkeypatch.setattr(
        chrome._Ingest, "_insert_files", lambda self, files, ts: statements.append(len(files)) or orig(self, files, ts)
    )
    f = _ingest_leaving_nothing_behind(tmp_db, tmp_path, path)
    if case == "short_estimate":
        assert statements[0] == 40_000 // 8192 + 2  # the pipes the estimate asked for ...
        assert len(statements) > 2  # ... then the rest in waves
    else:
        assert statements[0] > 10  # one statement reads every part
    if case == "clean":
        assert statements[1:] in ([], [1])  # (the last events, after the tail scan)
    elif case != "short_estimate":
        assert len(statements) > 3  # rejected: again, in waves
    if case == "stall":
        assert held == [True]  # the first part waited for the give-up
    if bad_at is None:
        assert (f.status, f.rows_kept, f.rows_dropped) == ("ok", 3000, 0), f.message
    else:
        assert (f.status, f.rows_kept, f.rows_dropped) == ("salvaged", 2999, 1), f.message
        assert f"first at event {bad_at}" in f.message
    with ro(tmp_db) as con:
        assert stored_rows(con, path) == expected_rows([e for i, e in enumerate(events) if i != bad_at])


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_clean_file_never_takes_the_per_event_python_path(tmp_db, tmp_path, monkeypatch, suffix):
    """Speed contract: every event of a clean trace, the last ones before ']' included, is parsed
    by DuckDB; the exact Python path (~20 µs an event) only sees bad or cut input."""
    events = [{"ph": "X", "name": f"op{i % 10}", "pid": 1, "tid": 1, "ts": i + 0.5, "dur": 1} for i in range(3000)]
    path = write_trace(tmp_path / f"clean{suffix}", events, {"schemaVersion": 1}, {"traceName": "t"})
    normalised = []
    orig = chrome_exact._normalise
    monkeypatch.setattr(chrome_exact, "_normalise", lambda ev, *a: normalised.append(ev) or orig(ev, *a))
    report = ingest_paths(tmp_db, [path], run="c", options=IngestOptions(part_bytes=16384))
    f = report.files[0]
    assert (f.status, f.rows_kept) == ("ok", 3000), f.message
    assert normalised == []
    with ro(tmp_db) as con:
        assert stored_rows(con, path) == expected_rows(events)
        assert json.loads(source(con, path)["metadata"])["traceName"] == "t"


def test_header_values_larger_than_the_decode_window(tmp_db, tmp_path):
    """Header keys are decoded from a 64 KB window that grows: a 300 KB deviceProperties list
    before the events is read whole, and the events after it are all there."""
    props = [{"id": i, "name": "dev" * 50, "totalGlobalMem": 85899345920 + i} for i in range(1500)]
    events = [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(50)]
    path = write_trace(
        tmp_path / "bighead.json",
        events,
        {"schemaVersion": 1, "deviceProperties": props, "baseTimeNanoseconds": BASE_NS},
    )
    assert path.stat().st_size > 300_000
    report = ingest_paths(tmp_db, [path], run="h")
    assert (report.files[0].status, report.files[0].rows_kept) == ("ok", 50)
    with ro(tmp_db) as con:
        meta = json.loads(source(con, path)["metadata"])
        assert meta["deviceProperties"] == props
        assert stored_rows(con, path) == expected_rows(events, BASE_NS)


# -- bad events, deep nesting, odd bytes --------------------------------------------------------
def test_bad_events_are_dropped_with_reasons(tmp_db, tmp_path):
    lines = [
        '{"ph": "X", "name": "good0", "pid": 1, "tid": 1, "ts": 1, "dur": 1}',
        '{"ph": "X", "name": "bad_ts_str", "pid": 1, "tid": 1, "ts": "abc", "dur": 1}',
        '{"ph": "X", "name": "bad_ts_bool", "pid": 1, "tid": 1, "ts": true, "dur": 1}',
        '{"ph": "X", "name": "bad_ts_nan", "pid": 1, "tid": 1, "ts": NaN, "dur": 1}',
        '{"ph": "X", "name": "bad_ts_huge", "pid": 1, "tid": 1, "ts": 1e30, "dur": 1}',
        '{"ph": "X", "name": "bad_ts_bigint", "pid": 1, "tid": 1, "ts": 50000000000000000, "dur": 1}',
        '{"ph": "X", "name": "bad_dur", "pid": 1, "tid": 1, "ts": 2, "dur": "long"}',
        '{"ph": "X", "name": "neg_dur", "pid": 1, "tid": 1, "ts": 3, "dur": -5}',
        '{"ph": "M", "name": "null_ts", "pid": 1, "ts": null, "args": {"name": "x"}}',
        '{"ph": "X", "name": "args_list", "pid": 1, "tid": 1, "ts": 4, "dur": 1, "args": [1, 2]}',
        '{"ph": "X", "name": "deep", "pid": 1, "tid": 1, "ts": 5, "dur": 1, "args": {"d": '
        + "[" * 3000
        + "]" * 3000
        + "}}",
        "42",
        '{"ph": "X", "name": "broken" "pid": 1}',
        '{"ph": "X", "name": "good1", "pid": 1, "tid": 1, "ts": 6, "dur": 1}',
    ]
    path = write_trace(tmp_path / "bad.json", text="[" + ",\n".join(lines) + "]")
    report = ingest_paths(tmp_db, [path], run="bad")
    f = report.files[0]
    assert f.status == "salvaged" and report.exit_code == 1
    with ro(tmp_db) as con:
        kept = {r[0] for r in con.execute("SELECT name FROM events").fetchall()}
        sid = source(con, path)["source_id"]
        drops = dict(con.execute("SELECT reason, n_rows FROM source_drops WHERE source_id = ?", [sid]).fetchall())
        assert_reconciled(con, sid)
        neg = con.execute("SELECT dur_ns FROM events WHERE name = 'neg_dur'").fetchone()[0]
    assert kept == {"good0", "good1", "neg_dur", "null_ts", "args_list"}
    assert neg == -5000  # kept as written: the value is the profiler's, not ours to fix
    assert drops == {
        "ts is not a number": 2,
        "ts is out of range": 3,
        "dur is not a number": 1,
        "event nested too deeply": 1,
        "event is not an object": 1,
        "event is not valid JSON": 1,
    }
    assert f.message.startswith("kept 5 events, dropped 9:")


def test_invalid_utf8_and_surrogates_are_replaced_and_reported(tmp_db, tmp_path):
    path = tmp_path / "utf.json"
    path.write_bytes(
        b'[{"ph": "X", "name": "bad\xff\xfename", "pid": 1, "tid": 1, "ts": 1, "dur": 1},\n'
        b' {"ph": "X", "name": "cut\\ud800", "pid": 1, "tid": 1, "ts": 2, "dur": 1},\n'
        b' {"ph": "X", "name": "good", "pid": 1, "tid": 1, "ts": 3, "dur": 1}]'
    )
    report = ingest_paths(tmp_db, [path], run="utf")
    f = report.files[0]
    assert (f.status, f.rows_kept) == ("ok", 3)
    assert "invalid UTF-8" in f.message and "surrogate" in f.message
    with ro(tmp_db) as con:
        names = sorted(r[0] for r in con.execute("SELECT name FROM events").fetchall())
    assert names == ["bad\ufffd\ufffdname", "cut?", "good"]


# -- commits: idempotent, atomic, crash-safe ----------------------------------------------------
def _fingerprint(con, path: Path, run: str) -> tuple[int, str]:
    """(row count, hash of every column) of one file's events in one run."""
    rows = sorted(
        con.execute(
            """SELECT e.ph, e.name, e.pid, e.tid, e.ts_ns, e.dur_ns, e.id, CAST(e.args AS VARCHAR)
           FROM event_rows e JOIN sources s USING (source_id) WHERE s.path = ? AND s.run = ?""",
            [str(path.resolve()), run],
        ).fetchall(),
        key=repr,
    )
    return len(rows), hashlib.sha256(repr(rows).encode()).hexdigest()


def test_reingest_replaces_never_duplicates(tmp_db, tmp_path, make_trace):
    events = [{"ph": "X", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1, "args": {"i": i}} for i in range(50)]
    path = make_trace(tmp_path / "rank0.json", events, {"distributedInfo": {"rank": 0}})
    ingest_paths(tmp_db, [path], run="a")
    with ro(tmp_db) as con:
        first = _fingerprint(con, path, "a")
        sid_first = source(con, path)["source_id"]
    assert first[0] == 50

    report = ingest_paths(tmp_db, [path], run="a")  # same run: replaced, not duplicated
    assert not report.warnings  # no "duplicate rank" from itself
    with ro(tmp_db) as con:
        assert con.execute("SELECT count(*) FROM sources WHERE run = 'a'").fetchone()[0] == 1
        assert _fingerprint(con, path, "a") == first
        assert source(con, path)["source_id"] != sid_first  # the new commit replaced the old one
        assert con.execute("SELECT count(*) FROM event_rows").fetchone()[0] == 50

    ingest_paths(tmp_db, [path], run="b")  # another run: both present
    with ro(tmp_db) as con:
        assert con.execute("SELECT run, count(*) FROM events GROUP BY run ORDER BY run").fetchall() == [
            ("a", 50),
            ("b", 50),
        ]
        assert _fingerprint(con, path, "b") == first


@pytest.mark.parametrize("bad", ["corrupt_gzip", "not_a_list", "empty"])
def test_failed_reingest_leaves_old_rows_exactly(tmp_db, tmp_path, make_trace, bad):
    events = [
        {"ph": "X", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i + 0.5, "dur": 1, "args": {"k": [i]}}
        for i in range(40)
    ]
    path = make_trace(tmp_path / "t.json", events)
    ingest_paths(tmp_db, [path], run="r")
    with ro(tmp_db) as con:
        before = _fingerprint(con, path, "r")
        src_before = source(con, path)
    assert before[0] == 40
    path.write_bytes(
        {
            "corrupt_gzip": b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage, not deflate" * 3,
            "not_a_list": b'{"schemaVersion": 1, "traceEvents": {"not": "a list"}}',
            "empty": b"",
        }[bad]
    )
    report = ingest_paths(tmp_db, [path], run="r")
    assert report.files[0].status == "failed" and report.exit_code == 1
    assert str(path.resolve()) in report.files[0].message
    with ro(tmp_db) as con:
        assert _fingerprint(con, path, "r") == before
        assert source(con, path) == src_before
        assert con.execute("SELECT count(*) FROM pending_sources").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM event_rows").fetchone()[0] == 40


def test_killed_ingest_leaves_no_visible_rows(tmp_db, tmp_path, make_trace):
    events = [{"ph": "X", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(20)]
    path = make_trace(tmp_path / "t.json", events)
    con = store.open_db(tmp_db)
    sid = store.new_source_id(con)
    out = chrome.READER.ingest(Context(path, "kineto", sid, "r", con, IngestOptions()))
    assert out.rows_kept == 20
    assert con.execute("SELECT count(*) FROM event_rows WHERE source_id = ?", [sid]).fetchone()[0] == 20
    con.close()  # "killed": no commit_source
    with ro(tmp_db) as con:
        assert con.execute("SELECT count(*) FROM events").fetchone()[0] == 0  # views join sources
    con = store.open_db(tmp_db)  # the next write-open cleans up
    try:
        assert con.execute("SELECT count(*) FROM event_rows").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM pending_sources").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM sources").fetchone()[0] == 0
    finally:
        con.close()


# -- real files ---------------------------------------------------------------------------------
def _json_load(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f, parse_float=Decimal)


def _events_of(doc):
    return doc.get("traceEvents") if isinstance(doc, dict) else doc


@pytest.fixture(scope="session")
def real_db(realdata, tmp_path_factory, _template_db):
    """All of ../shared/realdata, one run per top-level folder (whatever folders it holds)."""
    db = tmp_path_factory.mktemp("real") / "real.duckdb"
    shutil.copyfile(_template_db, db)
    reports = {d.name: ingest_paths(db, [d]) for d in sorted(realdata.iterdir()) if d.is_dir()}
    return db, reports


def _real_traces(realdata: Path) -> list[Path]:
    """Every Chrome trace under realdata (recognised by content, as the ingest does)."""
    return [p for p in sorted(realdata.rglob("*.json*")) if chrome.READER.sniff(p, read_head(p))]


def test_real_files_all_ingest_and_reconcile(real_db, realdata):
    db, reports = real_db
    files = [f for r in reports.values() for f in r.files]
    assert files
    assert not [f for f in files if f.status == "failed"], [(f.path, f.message) for f in files if f.status == "failed"]
    # The exit code contract (README): 1 exactly when some file was salvaged, truncated or failed.
    for r in reports.values():
        partial = [f for f in r.files if f.status in ("salvaged", "truncated", "failed")]
        assert r.exit_code == (1 if partial else 0), (r.run, [(f.path, f.status) for f in partial])
        # a partial file always says what was kept and what was lost
        assert all(f.message for f in partial), [(f.path, f.status) for f in partial if not f.message]
    with ro(db) as con:
        sids = [r[0] for r in con.execute("SELECT source_id FROM sources").fetchall()]
        for sid in sids:
            assert_reconciled(con, sid)
        fmts = con.execute("SELECT regexp_extract(path, '[^/]+$'), format FROM sources").fetchall()
    # the tools' fixed file names are recognised as their formats, wherever they sit
    for name, fmt in fmts:
        if name == "trace_view.json":
            assert fmt == "ascend_trace", name
        if name == "kernel_details.csv":
            assert fmt == "kernel_details", name
        if name.endswith(".pt.trace.json.gz") or name.endswith(".pt.trace.json"):
            assert fmt == "kineto", name


_TS_TOKEN = re.compile(rb'"ts"\s*:\s*"?\s*(-?[0-9][0-9.]*)')


def _ns_of_text(t: bytes) -> int:
    """Exact ns of a decimal µs text with at most 3 decimals, in integer arithmetic."""
    neg = t.startswith(b"-")
    whole, _, frac = t.lstrip(b"-").partition(b".")
    assert len(frac) <= 3, t
    v = int(whole or b"0") * 1000 + int((frac + b"000")[:3])
    return -v if neg else v


def test_real_traces_counts_and_timestamps_exact(real_db, realdata):
    """Every event json.load sees is stored (same names), and every ts_ns equals
    base + ts * 1000 computed exactly from the ts text in the file."""
    db, _ = real_db
    traces = _real_traces(realdata)
    assert traces
    with ro(db) as con:
        for p in traces:
            raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
            doc = orjson.loads(raw)
            evs = _events_of(doc)
            base = int(doc.get("baseTimeNanoseconds", 0)) if isinstance(doc, dict) else 0
            src = source(con, p)
            assert (src["rows_kept"], src["rows_dropped"]) == (len(evs), 0), p.name
            sid = src["source_id"]
            names = collections.Counter(
                r[0] for r in con.execute("SELECT name FROM event_rows WHERE source_id = ?", [sid]).fetchall()
            )
            assert names == collections.Counter(e.get("name") for e in evs), p.name
            # the ts texts as written (real traces have no "ts" key inside args)
            want = sorted(_ns_of_text(t) + base for t in _TS_TOKEN.findall(raw))
            assert len(want) == sum(1 for e in evs if e.get("ts") is not None), p.name
            got = [
                r[0]
                for r in con.execute(
                    "SELECT ts_ns FROM event_rows WHERE source_id = ? AND ts_ns IS NOT NULL ORDER BY ts_ns", [sid]
                ).fetchall()
            ]
            assert got == want, p.name


def test_real_ascend_trace_view(real_db, realdata):
    db, _ = real_db
    with ro(db) as con:
        src = source(con, realdata / "ascend" / "trace_view.json")
        assert (src["rows_kept"], src["format"], src["rank"]) == (3670, "ascend_trace", None)
        ts = {
            r[0] for r in con.execute("SELECT ts_ns FROM event_rows WHERE source_id = ?", [src["source_id"]]).fetchall()
        }
    assert 1704161511420306491 in ts


def test_real_kineto_ranks(real_db, realdata):
    db, reports = real_db
    want = {
        "sampled_rank-0.json.gz": 0,
        "sampled_rank-1.json.gz": 1,
        "nccl_data.json.gz": 0,
        "df_index_resolver.json.gz": 1,
        "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": 34,
    }
    with ro(db) as con:
        for name, rank in want.items():
            src = source(con, realdata / "kineto" / name)
            assert (src["rank"], src["rank_source"]) == (rank, "distributedInfo"), name
        for name in ("rank_not_found.json.gz", "mi250_minitoy_train_ROCm6_2_kineto.json.gz"):
            assert source(con, realdata / "kineto" / name)["rank"] is None, name
    by_name = {Path(f.path).name: f for f in reports["kineto"].files}
    for name in ("rank_not_found.json.gz", "mi250_minitoy_train_ROCm6_2_kineto.json.gz"):
        assert by_name[name].rank is None and "no rank" in by_name[name].message
    assert any("have no rank" in w for w in reports["kineto"].warnings)
    # two ranks claimed twice (sampled_rank-0 / nccl_data, sampled_rank-1 / df_index_resolver)
    assert any("rank 0 appears in 2" in w for w in reports["kineto"].warnings)


def test_real_ep4_run_has_ranks_0_to_3(real_db, realdata):
    db, reports = real_db
    rep = reports["kineto_cpu_ep4_hot1"]
    assert rep.run == "kineto_cpu_ep4_hot1" and rep.exit_code == 0 and not rep.warnings
    with ro(db) as con:
        got = con.execute(
            "SELECT rank, count(*) FROM events WHERE run = 'kineto_cpu_ep4_hot1' GROUP BY rank ORDER BY rank"
        ).fetchall()
        assert con.execute("SELECT world_size FROM runs WHERE run = 'kineto_cpu_ep4_hot1'").fetchone()[0] == 4
    assert got == [(0, 1315), (1, 3187), (2, 1315), (3, 1315)]


def test_duckdb_cli_reads_the_database(real_db):
    exe = duckdb_cli()
    if exe is None:
        pytest.skip("the duckdb CLI (PyPI duckdb-cli, in the dev extra) is not installed")
    db, _ = real_db
    sql = "SELECT rank, count(*) AS n FROM events WHERE run = 'kineto_cpu_ep4_hot1' GROUP BY rank ORDER BY rank"
    out = subprocess.run([exe, "-readonly", "-csv", str(db), "-c", sql], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["rank,n", "0,1315", "1,3187", "2,1315", "3,1315"]


def _db_size_after(db: Path, paths, runs: int) -> list[int]:
    sizes = []
    for _ in range(runs):
        report = ingest_paths(db, paths, run="big")
        assert all(f.status == "ok" for f in report.files), [f.message for f in report.files]
        sizes.append(db.stat().st_size)
    return sizes


def test_database_file_stays_compact_over_many_statements_and_reingests(tmp_path):
    """Each file is its own INSERT; with DuckDB's checkpoint vacuum on, the next checkpoint
    rewrites every partly filled row group they leave (a 1.9x larger file and +50% time measured
    on 8 files). Off (store.connect), N files take about N times the space of one, and
    re-ingesting the same files again and again keeps the file bounded (replaced row groups are
    dropped whole)."""
    events = [
        {
            "ph": "X",
            "name": f"op{i % 50}",
            "pid": 1,
            "tid": i % 4,
            "ts": i * 3 + 0.5,
            "dur": 2,
            "args": {"External id": i, "seq": i % 1000},
        }
        for i in range(140_000)
    ]
    text = trace_text(events, {"schemaVersion": 1})
    paths = [
        write_trace(
            tmp_path / f"rank{r}.json",
            text=text.replace(
                '"schemaVersion": 1', f'"schemaVersion": 1, "distributedInfo": {{"rank": {r}, "world_size": 4}}'
            ),
        )
        for r in range(4)
    ]
    tiny = write_trace(tmp_path / "tiny.json", events[:1])
    base = _db_size_after(tmp_path / "base.duckdb", [tiny], 1)[0]  # schema, views, catalog
    one = _db_size_after(tmp_path / "one.duckdb", paths[:1], 1)[0] - base
    sizes = _db_size_after(tmp_path / "four.duckdb", paths, 4)
    with duckdb.connect(str(tmp_path / "four.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM event_rows").fetchone()[0] == 4 * 140_000
    assert sizes[0] - base <= 4 * one * 1.2, (base, one, sizes)
    assert max(sizes[1:]) <= 2.3 * sizes[0], sizes


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_progress_moves_within_one_large_file(tmp_db, tmp_path, suffix):
    """The progress callback sees a file's bytes part by part, not only when the file is done,
    and the bytes add up to the file's size exactly (compressed size for .gz)."""
    rnd = random.Random(7)  # incompressible padding: the .gz spans many 256 KB reads
    events = [
        {
            "ph": "X",
            "name": f"op{i % 10}",
            "pid": 1,
            "tid": 1,
            "ts": i + 0.5,
            "dur": 1,
            "args": {"pad": f"{rnd.getrandbits(128):032x}"},
        }
        for i in range(60_000)
    ]
    path = write_trace(tmp_path / f"big{suffix}", events, {"schemaVersion": 1})
    states = []
    report = ingest_paths(tmp_db, [path], run="p", options=IngestOptions(part_bytes=64 << 10), progress=states.append)
    assert report.files[0].status == "ok"
    size = path.stat().st_size
    within = [s["bytes_done"] for s in states if s["files_done"] == 0 and 0 < s["bytes_done"] < size]
    assert len(within) >= 3, [s["bytes_done"] for s in states]
    assert within == sorted(within)
    assert states[-1]["bytes_done"] == size and states[-1]["files_done"] == 1
    assert states[-1]["events"] == 60_000
