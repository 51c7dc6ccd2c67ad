"""`slowcard annotate`: the merged Chrome trace of a run. Valid JSON, one process per rank, the
slow rank marked (instant events, flow arrows to the ranks that wait), events sorted by ts, no
partial overlaps on a thread, exact nanoseconds, clock offsets applied, and the CLI."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import synth_kineto  # noqa: E402
from conftest import REAL_EP_RUN as REAL_RUN  # noqa: E402
from conftest import ingest_ok

from slowcard import annotate, queries  # noqa: E402
from slowcard.errors import UsageError  # noqa: E402

CATALOG = queries.load_catalog()


def _results(con, run, names=("ep-slow-rank", "rank-waits", "straggler-rank")):
    return {n: queries.run_query(con, CATALOG[n], run) for n in names}


def _load(path):
    """The trace with exact numbers (Decimal), like a strict viewer would read it."""
    return json.loads(Path(path).read_text(encoding="utf-8"), parse_float=Decimal)


def _processes(doc):
    return {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}


def _check_viewer_rules(doc):
    """What Perfetto and chrome://tracing need: ts in order, X events on a thread nested or apart."""
    evs = doc["traceEvents"]
    ts = [e["ts"] for e in evs if "ts" in e]
    assert all(e["ph"] == "M" for e in evs if "ts" not in e)
    assert ts == sorted(ts), "events are not sorted by ts"
    per_thread = defaultdict(list)
    for e in evs:
        if e["ph"] == "X":
            per_thread[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for key, spans in per_thread.items():
        stack = []
        for s, end in sorted(spans, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or end <= stack[-1], f"partial overlap on {key} at ts {s}"
            stack.append(end)
    return per_thread


@pytest.fixture(scope="module")
def real(tmp_path_factory, real_ep_db):
    d = tmp_path_factory.mktemp("real")
    db = real_ep_db
    con = queries.open_readonly(db)
    try:
        stats = annotate.write_annotated(con, REAL_RUN, d / "merged.json", _results(con, REAL_RUN))
        # what the database says, to compare with: every kept event with its corrected time
        db_events = con.execute(
            """
            SELECT rank, name, ts_ns, dur_ns FROM events
            WHERE run = ? AND ph = 'X' AND ts_ns IS NOT NULL""",
            [REAL_RUN],
        ).fetchall()
    finally:
        con.close()
    return {"db": db, "stats": stats, "doc": _load(d / "merged.json"), "db_events": db_events}


def test_real_merge_has_one_process_per_rank_and_the_verdicts(real):
    doc, stats = real["doc"], real["stats"]
    procs = _processes(doc)
    ranks = {pid: name for pid, name in procs.items() if name.startswith("rank ")}
    assert sorted(ranks.values()) == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert stats.ranks == [0, 1, 2, 3] and stats.processes == 4
    verdict_pid = next(pid for pid, name in procs.items() if name == "slowcard verdicts")
    names = {e["name"] for e in doc["traceEvents"] if e["pid"] == verdict_pid and e["ph"] == "X"}
    ep = f"ep-slow-rank@v{CATALOG['ep-slow-rank'].version} FAIL"
    assert {ep, f"straggler-rank@v{CATALOG['straggler-rank'].version} WARN", "rank-waits@v2 INFO"} <= names
    slow = next(e for e in doc["traceEvents"] if e.get("name") == ep)
    assert "rank 1 token-skew" in slow["args"]["summary"] and slow["args"]["rows"][0]["rank"] == 1
    # threads keep their original names, inside their rank's process
    tnames = {
        (e["pid"], e["args"]["name"]) for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"
    }
    rank1 = next(pid for pid, n in ranks.items() if n == "rank 1")
    assert (rank1, "python / thread 15077 (pt_gloo_runloop)") in tnames


def test_real_merge_marks_rank1(real):
    doc, stats = real["doc"], real["stats"]
    procs = _processes(doc)
    rank_of = {pid: int(n.split()[1]) for pid, n in procs.items() if n.startswith("rank ")}
    evs = doc["traceEvents"]
    instants = [e for e in evs if e["ph"] == "i" and e.get("cat") == "slowcard"]
    assert stats.slow_ranks == [1]
    assert len(instants) == stats.markers >= 30  # rank 1 arrives last at ~79% of 48 collectives
    assert all(
        rank_of[e["pid"]] == 1 and e["s"] == "p" and e["name"].startswith("rank 1 arrives last") for e in instants
    )
    starts = {e["id"]: e for e in evs if e["ph"] == "s" and e.get("cat") == "slowcard"}
    ends = {e["id"]: e for e in evs if e["ph"] == "f" and e.get("cat") == "slowcard"}
    assert set(starts) == set(ends) and len(ends) == stats.flows >= len(instants)
    assert all(rank_of[e["pid"]] == 1 for e in starts.values())
    assert {rank_of[e["pid"]] for e in ends.values()} == {0, 2, 3}
    assert all(e["bp"] == "e" for e in ends.values())
    # each arrow starts on rank 1's collective slice and ends inside the waiting rank's slice
    per_thread = _check_viewer_rules(doc)
    for e in [*starts.values(), *ends.values()]:
        assert any(s <= e["ts"] <= end for s, end in per_thread[(e["pid"], e["tid"])]), e
    # an instant sits where rank 1's collective starts (it arrives last there)
    for e in instants:
        assert any(s == e["ts"] for s, _ in per_thread[(e["pid"], e["tid"])])


def test_real_merge_keeps_every_event_to_the_nanosecond(real):
    """Every X event of the database is in the trace once, at (ts_ns - first ts) exactly."""
    doc = real["doc"]
    procs = _processes(doc)
    t0 = min(ts for _r, _n, ts, _d in real["db_events"])
    want = sorted((r, n, ts - t0, d) for r, n, ts, d in real["db_events"])
    got = sorted(
        (int(procs[e["pid"]].split()[1]), e["name"], int(e["ts"] * 1000), int(e["dur"] * 1000))
        for e in doc["traceEvents"]
        if e["ph"] == "X" and procs[e["pid"]].startswith("rank ")
    )
    assert got == want
    assert all(
        isinstance(e["ts"], Decimal) and -e["ts"].as_tuple().exponent <= 3 for e in doc["traceEvents"] if "ts" in e
    )
    assert real["stats"].events == sum(1 for e in doc["traceEvents"] if e.get("cat") != "slowcard" and e["ph"] != "M")


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """Ranks 2 and 3 on a second host whose clock is 40 ms ahead."""
    d = tmp_path_factory.mktemp("hosts")
    synth_kineto.write_ep_run(
        d / "trace", scenario="token_skew", steps=2, layers=2, clock_offsets_us={2: 40_000, 3: 40_000}
    )
    db = d / "run.duckdb"
    ingest_ok(db, [d / "trace"], "hosts")
    con = queries.open_readonly(db)
    try:
        stats = annotate.write_annotated(con, "hosts", d / "merged.json", _results(con, "hosts"), batch_rows=500)
    finally:
        con.close()
    return {"db": db, "stats": stats, "doc": _load(d / "merged.json")}


def test_clock_offsets_line_up_the_hosts(two_hosts):
    doc, stats = two_hosts["doc"], two_hosts["stats"]
    assert stats.clock_offsets_ns["node0"] == 0
    assert abs(stats.clock_offsets_ns["node1"] - 40_000_000) < 1_000_000
    procs = _processes(doc)
    ends = defaultdict(list)  # rank -> end of its k-th collective
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["name"] == "gloo:all_to_all":
            ends[int(procs[e["pid"]].split()[1])].append(e["ts"] + e["dur"])
    assert sorted(ends) == [0, 1, 2, 3]
    lists = [sorted(v) for _, v in sorted(ends.items())]
    assert len({len(v) for v in lists}) == 1 and len(lists[0]) == 3 * 2 * 2
    for k in range(len(lists[0])):
        matched = [v[k] for v in lists]
        assert max(matched) - min(matched) < 1000, (k, matched)  # within 1 ms (µs units)
        # without the correction the second host would be 40 ms off
        raw = [v[k] + (40_000 if r >= 2 else 0) for r, v in enumerate(lists)]
        assert max(raw) - min(raw) > 30_000
    _check_viewer_rules(doc)
    assert stats.slow_ranks == [1] and stats.markers > 0 and stats.flows > 0


def _hand_trace(dirpath: Path) -> Path:
    """One rank, one thread: A [0,10] and B [5,15] overlap without nesting; C [6,8] nests; D after."""
    evs = [
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 7, "args": {"name": "main"}},
        {"ph": "X", "cat": "cpu_op", "name": "A", "pid": 7, "tid": 7, "ts": 100.0, "dur": 10.0},
        {"ph": "X", "cat": "cpu_op", "name": 'B "q" \\ \n é </script>', "pid": 7, "tid": 7, "ts": 105.0, "dur": 10.0},
        {"ph": "X", "cat": "cpu_op", "name": "C", "pid": 7, "tid": 7, "ts": 106.0, "dur": 2.0},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "D",
            "pid": 7,
            "tid": 7,
            "ts": 112.001,
            "dur": 8.0,
            "args": {"Input Dims": [[1, 2]], "note": "<b>"},
        },
        {"ph": "i", "s": "t", "name": "mark", "pid": 7, "tid": 7, "ts": 113.0},
    ]
    dirpath.mkdir(parents=True, exist_ok=True)
    (dirpath / "rank0.pt.trace.json").write_text(
        json.dumps(
            {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 1}, "traceEvents": evs}
        )
    )
    return dirpath


@pytest.fixture(scope="module")
def hand_db(tmp_path_factory):
    d = tmp_path_factory.mktemp("hand")
    db = d / "hand.duckdb"
    ingest_ok(db, [_hand_trace(d / "trace")], "hand")
    return db


def test_partial_overlaps_move_to_an_extra_thread(hand_db, tmp_path):
    con = queries.open_readonly(hand_db)
    try:
        stats = annotate.write_annotated(con, "hand", tmp_path / "m.json", {})
    finally:
        con.close()
    doc = _load(tmp_path / "m.json")
    _check_viewer_rules(doc)
    xs = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    assert set(xs) == {"A", 'B "q" \\ \n é </script>', "C", "D"}  # names round-trip exactly
    b = xs['B "q" \\ \n é </script>']
    assert xs["A"]["tid"] == xs["C"]["tid"] == xs["D"]["tid"] != b["tid"] and xs["A"]["pid"] == b["pid"]
    assert stats.moved_events == 1 and stats.overlap_threads == 1
    tnames = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert tnames[b["tid"]] == "main (overlap 1)" and tnames[xs["A"]["tid"]] == "main"
    assert xs["D"]["ts"] == Decimal("12.001") and xs["D"]["args"] == {"Input Dims": [[1, 2]], "note": "<b>"}
    assert [e["name"] for e in doc["traceEvents"] if e["ph"] == "i"] == ["mark"]
    assert stats.slow_ranks == [] and stats.markers == 0 and stats.verdicts == 0


def test_unknown_run_is_a_usage_error(hand_db, tmp_path):
    con = queries.open_readonly(hand_db)
    try:
        with pytest.raises(UsageError, match="no run named 'nope'"):
            annotate.write_annotated(con, "nope", tmp_path / "m.json", {})
    finally:
        con.close()
    assert not (tmp_path / "m.json").exists()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), min_size=1, max_size=40))
def test_lane_placement_never_leaves_a_partial_overlap(spans):
    """Events in viewer order (ts, longer first): each lane stays properly nested, events that
    nest stay on the thread itself, and each event lands on exactly one lane."""
    th = annotate._Threads()
    k = th.add((1, "p", "t"), 100, "main")
    lanes = defaultdict(list)
    for s, d in sorted(spans, key=lambda x: (x[0], -x[1])):
        lanes[th.place(k, s, s + d)].append((s, s + d))
    assert sum(len(v) for v in lanes.values()) == len(spans)
    for spans_of_lane in lanes.values():
        stack = []
        for s, e in spans_of_lane:
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or e <= stack[-1]
            stack.append(e)
    # properly nested input never leaves the base thread
    th2 = annotate._Threads()
    k2 = th2.add((1, "p", "t"), 100, "main")
    nested = [(i, 100 - 2 * i) for i in range(10)]
    assert {th2.place(k2, s, s + d) for s, d in nested} == {100 * 1000 + 1}


def test_cli_annotate(hand_db, app, tmp_path):
    runner = CliRunner()
    out = tmp_path / "o" / "merged.json"
    res = runner.invoke(app, ["annotate", "--db", str(hand_db), "--run", "hand", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and "5 events" in res.output and "moved" in res.output
    doc = _load(out)
    assert "rank 0" in _processes(doc).values()
    res = runner.invoke(app, ["annotate", "--db", str(hand_db), "--run", "nope", "--out", str(out)])
    assert res.exit_code == 2 and "no run named 'nope'" in res.output
    res = runner.invoke(app, ["annotate", "--db", str(tmp_path / "none.duckdb"), "--out", str(out)])
    assert res.exit_code == 2 and "no such database" in res.output
