"""The ingest's work around its one INSERT (issue 30, item 4): the tail's complete events go in
the parts' statement, format detection imports only the readers it tries, the derived rows are
the same as the rules say (all-to-all splits in one scan, kernel launches from the flows of the
classified kernels only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from conftest import trace_text, write_trace

from slowcard.ingest import chrome_state, ingest_paths
from slowcard.ingest.base import IngestOptions


def _events(n: int) -> list[dict]:
    return [{"ph": "X", "name": f"op{i % 10}", "pid": 1, "tid": 1, "ts": i + 0.25, "dur": 1} for i in range(n)]


def _ingest_counting_statements(db, tmp_path, path, monkeypatch):
    """Ingest in 8 KB parts (the tail is then up to 8 KB of events); returns (file result, the
    number of files each INSERT statement read). No part, pipe or tail file is left behind."""
    calls: list[int] = []
    orig = chrome_state._IngestState._insert_files

    def spy(self, files, ts_type):
        calls.append(len(files))
        return orig(self, files, ts_type)

    monkeypatch.setattr(chrome_state._IngestState, "_insert_files", spy)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    report = ingest_paths(db, [path], run="t", options=IngestOptions(part_bytes=8192, tmp_dir=scratch))
    assert not list(scratch.iterdir())
    return report.files[0], calls


def _stored(db) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT name, ts_ns FROM event_rows ORDER BY ts_ns").fetchall()


def _want(events) -> list[tuple]:
    return sorted(((e["name"], int(round(e["ts"] * 1000))) for e in events), key=lambda r: r[1])


def test_bad_event_in_the_tail_loses_nothing_else(tmp_db, tmp_path, monkeypatch):
    """A bad event among the tail's events (after the last part): every good event is kept once
    and the bad one is counted with its index."""
    events = _events(3000)
    text = trace_text(events, {"schemaVersion": 1})
    text = text.replace('"ts": 2995.25, "dur": 1', '"ts": 2995.25, "dur": "1x"', 1)
    assert '"1x"' in text
    path = write_trace(tmp_path / "bad_tail.json", text=text)
    f, calls = _ingest_counting_statements(tmp_db, tmp_path, path, monkeypatch)
    assert (f.status, f.rows_kept, f.rows_dropped) == ("salvaged", 2999, 1), f.message
    assert "first at event 2995" in f.message
    assert len(calls) > 1
    assert _stored(tmp_db) == _want([e for i, e in enumerate(events) if i != 2995])


def test_truncated_file_keeps_its_complete_tail_events(tmp_db, tmp_path, monkeypatch):
    """A file cut inside its last event: the complete events before the cut are kept, the cut
    one is dropped as the truncated tail (README: a failed ingest loses nothing that was
    complete)."""
    events = _events(3000)
    text = trace_text(events, {"schemaVersion": 1})
    cut = text.index('"ts": 2999.25')
    path = write_trace(tmp_path / "cut.json", text=text[:cut])
    f, calls = _ingest_counting_statements(tmp_db, tmp_path, path, monkeypatch)
    assert (f.status, f.rows_kept) == ("truncated", 2999), f.message
    assert _stored(tmp_db) == _want(events[:2999])


def _imported_readers(path: Path) -> list[str]:
    code = (
        "import sys; from pathlib import Path; from slowcard.ingest import detect;"
        f"r, fmt = detect(Path({str(path)!r})); print(fmt);"
        "print(sorted(m for m in sys.modules if m.startswith('slowcard.ingest.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    fmt, mods = out.strip().splitlines()
    return [fmt, *json.loads(mods.replace("'", '"'))]


def test_detecting_a_trace_imports_no_other_reader(tmp_path):
    """Recognising a Kineto trace imports the Chrome reader only (the first module), not every
    format module (~35 ms of every ingest process); a CSV still reaches the reader that claims it."""
    trace = write_trace(tmp_path / "t.json", _events(3), {"schemaVersion": 1})
    fmt, *mods = _imported_readers(trace)
    assert fmt == "kineto"
    assert "slowcard.ingest.chrome" in mods
    assert not {"slowcard.ingest.op_csv", "slowcard.ingest.service_csv", "slowcard.ingest.expert_load"} & set(mods)
    csv = tmp_path / "kernel_details.csv"
    csv.write_text("Step Id,Name,Type,Accelerator Core,Start Time(us),Duration(us)\n0,MatMul,MatMul,AI_CORE,1.0,2.0\n")
    fmt, *mods = _imported_readers(csv)
    assert fmt == "kernel_details"
    assert "slowcard.ingest.op_csv" in mods


def _derived(db) -> tuple[list, list]:
    with duckdb.connect(str(db), read_only=True) as con:
        splits = con.execute("SELECT ts_ns, recv_tokens FROM a2a_split_rows ORDER BY ts_ns").fetchall()
        launches = con.execute(
            "SELECT name, ts_ns, launch_ns FROM op_class_rows WHERE cat = 'kernel' ORDER BY ts_ns"
        ).fetchall()
    return splits, launches


def test_all_to_all_splits_in_one_scan_follow_the_rules(tmp_db, tmp_path):
    """The splits of the one-scan macro, checked by hand: a record_param_comms CPU op with "Out
    split size"; an alltoall_base_ with only "Concrete Inputs" (its 4th entry); a kernel carrying
    "Out split size"; and the near misses that give no row: a kernel without the key, a CPU op of
    another name with the key, an event without a name carrying it."""
    ev = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "record_param_comms",
            "pid": 1,
            "tid": 1,
            "ts": 10,
            "dur": 5,
            "args": {"Out split size": [1, 2, 3]},
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "c10d::alltoall_base_",
            "pid": 1,
            "tid": 1,
            "ts": 20,
            "dur": 5,
            "args": {"Concrete Inputs": ["", "", "", "[4, 5]"]},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclDevKernel_SendRecv",
            "pid": 0,
            "tid": 7,
            "ts": 30,
            "dur": 5,
            "args": {"Out split size": [7, 8]},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclDevKernel_SendRecv",
            "pid": 0,
            "tid": 7,
            "ts": 40,
            "dur": 5,
            "args": {"In split size": [9]},
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": 1,
            "ts": 50,
            "dur": 5,
            "args": {"Out split size": [100]},
        },
        {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "ts": 60, "dur": 5, "args": {"Out split size": [100]}},
    ]
    path = write_trace(tmp_path / "a2a.json", ev, {"schemaVersion": 1})
    assert ingest_paths(tmp_db, [path], run="t").files[0].status == "ok"
    splits, _ = _derived(tmp_db)
    assert splits == [(10_000, 6), (20_000, 9), (30_000, 15)]


@pytest.mark.parametrize("flows", ["matching", "other_ids", "none"])
def test_kernel_launch_times_from_flows_or_runtime(tmp_db, tmp_path, flows):
    """launch_ns of a classified kernel: its ac2g flow's start; a trace with flows never falls
    back to the runtime call (other_ids: flows exist but none for this kernel, so no launch
    time); a trace without flows takes the runtime call with the same correlation."""
    ev = [
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 100,
            "dur": 2,
            "args": {"correlation": 42},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "pid": 0,
            "tid": 7,
            "ts": 200,
            "dur": 50,
            "args": {"correlation": 42, "Collective name": "allreduce"},
        },
    ]
    if flows == "matching":
        ev.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 42, "pid": 1, "tid": 1, "ts": 101})
    elif flows == "other_ids":
        ev.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 7, "pid": 1, "tid": 1, "ts": 90})
    path = write_trace(tmp_path / f"{flows}.json", ev, {"schemaVersion": 1})
    assert ingest_paths(tmp_db, [path], run="t").files[0].status == "ok"
    _, launches = _derived(tmp_db)
    want = {"matching": 101_000, "other_ids": None, "none": 100_000}[flows]
    assert launches == [("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 200_000, want)]
