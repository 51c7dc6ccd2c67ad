"""gzip files of several members (issue 46, finding 1) and compressed traces in batches (finding 14).

A gzip file may be several members back to back (``cat a.gz b.gz``, appending writers, pigz
--independent, bgzip): ``gzip -dc`` reads them all, and so must every path that reads a ``.gz``.
The reader once fed a finished member's leftover to its decompressor forever (memory growing),
so the ingests that could hang run in a child process, under a memory limit and a timeout that
only a hang reaches.

Batches: a .json.gz is sized by its trailer (its last member's size mod 4 GiB), whatever its
ratio; a batch counts the parts it really decompresses against its temp budget, and a member
without room (the budget, or a temp folder that fills) goes alone after the batch's statement,
never failing for it.
"""

from __future__ import annotations

import builtins
import errno
import gzip
import io
import json
import os
import random
import resource
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from conftest import trace_text

from slowcard.ingest import _gz, _shared, chrome_parts, detect, ingest_paths, read_head
from slowcard.ingest._gz import Members, content_size
from slowcard.ingest.base import IngestOptions

TESTS = Path(__file__).resolve().parent
HANG_GUARD_S = 300  # a child that is still running by then is in the old endless loop
CHILD_MEMORY = 4 << 30  # the endless loop grows memory: the child fails on it instead of the machine


def members(data: bytes, k: int, level: int = 6) -> bytes:
    """``data`` as k concatenated gzip members, as ``cat a.gz b.gz ...`` writes."""
    step = max(1, -(-len(data) // k))
    return b"".join(gzip.compress(data[i : i + step], level, mtime=0) for i in range(0, len(data), step))


def kernels(n: int, name: str = "k", offset: float = 0.0) -> list[dict]:
    return [
        {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": i + offset, "dur": 1} for i in range(n)
    ]


def rank_trace(rank: int, world: int, events: list[dict]) -> bytes:
    header = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world}}
    return trace_text(events, header).encode()


# A kernel name as long as cutlass's: traces of it compress ~250x, past the 50x the planner once assumed.
LONG_NAME = "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_" + "x" * 1400 + ">"


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def in_child(fn: str, *args) -> object:
    """``child_<fn>(*args)`` of this module run in a child process; its JSON result."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import test_gz_members as t; "
        "print('RESULT ' + json.dumps(getattr(t, 'child_' + sys.argv[2])(*json.loads(sys.argv[3]))))"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, str(TESTS), fn, json.dumps(args, default=str)],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
            preexec_fn=_limit_memory,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{fn}: still running after {HANG_GUARD_S} s (the gzip reader loops)")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _files(report) -> list[list]:
    return [[Path(f.path).name, f.status, f.rows_kept, f.message] for f in report.files]


def _count_statements() -> list[int]:
    """From now on in this (child) process, the number of files of each batch INSERT statement."""
    statements: list[int] = []
    real = _shared._insert_statement

    def spy(con, tmpdir, mode, group):
        got = real(con, tmpdir, mode, group)
        statements.append(len(got))
        return got

    _shared._insert_statement = spy
    return statements


def child_ingest(db: str, paths: list[str], jobs, part_bytes: int = 64 << 20) -> dict:
    """Ingest in this (child) process; the per-file results and the batch statements' sizes."""
    statements = _count_statements()
    report = ingest_paths(db, paths, run="r", jobs=jobs, options=IngestOptions(part_bytes=part_bytes))
    return {"files": _files(report), "statements": statements}


def child_stream(path: str, window: int) -> dict:
    """Read a .gz through the trace reader's stream (chrome_pipes._Stream), window by window."""
    from slowcard.ingest.chrome_pipes import _Stream

    s = _Stream(Path(path))
    digest, n = zlib.crc32(b""), 0
    while s.more(window):
        digest = zlib.crc32(s.buf, digest)
        n += len(s.buf)
        s.drop(len(s.buf))
    s.close()
    return {"bytes": n, "crc": digest, "error": s.error}


# --- the reader --------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 7, 40])
@pytest.mark.parametrize("chunk", [7, 1000, 1 << 18])
def test_every_member_is_read_as_gzip_does(k, chunk):
    """Any number of members, read in any window, with compressed reads of any size: the bytes
    ``gzip.decompress`` gives, no error; zero padding after the last member is skipped."""
    rng = random.Random(k * 1000 + chunk)
    data = b"".join(b'{"ts": %d, "name": "op%d"}, ' % (i, rng.randrange(50)) for i in range(20000))
    raw = members(data, k) + b"\x00" * 1000
    assert gzip.decompress(raw) == data
    gz = Members(io.BytesIO(raw), chunk=chunk)
    out = bytearray()
    while piece := gz.read(rng.choice([1, 100, 65536, 1 << 20])):
        out += piece
    assert out == data and gz.error is None and gz.members == k


def test_a_cut_last_member_keeps_what_decompressed():
    """The last of three members cut in its middle: the first two whole, the third up to the
    cut, and the error says the tail was cut (the salvage keeps those events)."""
    data = bytes(range(256)) * 4000
    raw = members(data, 3)
    cut = raw[: len(raw) - len(gzip.compress(data[-(len(data) // 3) :])) // 2]
    gz = Members(io.BytesIO(cut))
    out = gz.read(len(data))
    assert len(out) > 2 * len(data) // 3 and data.startswith(out)
    assert gz.error == _gz.CUT and gz.members == 2


@pytest.mark.parametrize("after", [b"garbage!", b"\x1f", b"\x00\x00\x01"])
def test_bytes_after_a_member_that_are_not_gzip_end_the_read_with_a_reason(after):
    data = b"x" * 100_000
    gz = Members(io.BytesIO(members(data, 2) + after))
    assert gz.read(1 << 20) == data
    assert gz.error and "not gzip" in gz.error and gz.read(10) == b""


def test_a_corrupt_member_keeps_what_came_before():
    data = b"".join(b"line %d\n" % i for i in range(50_000))
    raw = bytearray(members(data, 2))
    raw[len(raw) - 40] ^= 0xFF  # inside the second member's deflate data
    gz = Members(io.BytesIO(bytes(raw)))
    out = gz.read(len(data) * 2)
    assert data.startswith(out) and len(out) >= len(data) // 2
    assert gz.error and gz.error.startswith("corrupt compressed data")


# --- every path that reads a .gz ---------------------------------------------------------------


def test_the_trace_stream_reads_every_member(tmp_path):
    """The reader behind both the one-file and the batch ingest: 8 members, 8 MB windows."""
    data = rank_trace(0, 1, kernels(150_000))
    path = tmp_path / "m.pt.trace.json.gz"
    path.write_bytes(members(data, 8))
    got = in_child("stream", path, 8 << 20)
    assert got == {"bytes": len(data), "crc": zlib.crc32(data), "error": None}


def test_one_file_ingest_reads_every_member(tmp_path):
    """--jobs 1 on a multi-member trace (8 members, zero padding after the last) never
    returned; now every event of every member is in, and the file is ok."""
    path = tmp_path / "rank0.pt.trace.json.gz"
    path.write_bytes(members(rank_trace(0, 1, kernels(60_000)), 8) + b"\x00" * 512)
    got = in_child("ingest", tmp_path / "db.duckdb", [path], 1, 256 << 10)
    assert got["files"] == [["rank0.pt.trace.json.gz", "ok", 60_000, ""]]


def test_a_cut_multi_member_file_is_salvaged(tmp_path):
    """The last member cut short: every event of the members before it and of its decompressed
    start is kept, the file is truncated with the reason (as a cut single member is)."""
    data = rank_trace(0, 1, kernels(40_000))
    raw = members(data, 4)
    path = tmp_path / "rank0.pt.trace.json.gz"
    path.write_bytes(raw[: len(raw) - 3000])
    got = in_child("ingest", tmp_path / "db.duckdb", [path], 1, 256 << 10)
    ((name, status, kept, message),) = got["files"]
    assert status == "truncated" and 30_000 <= kept < 40_000
    assert "before its end marker" in message and "kept what decompressed" in message


def test_a_batch_reads_every_member(tmp_path):
    """Three multi-member rank files in a batch (the default --jobs): one statement over all
    three, every event of every member in."""
    folder = tmp_path / "run"
    folder.mkdir()
    for r in range(3):
        (folder / f"rank{r}.pt.trace.json.gz").write_bytes(members(rank_trace(r, 3, kernels(20_000 + r)), 5))
    got = in_child("ingest", tmp_path / "db.duckdb", [folder], None, 256 << 10)
    assert got["statements"] == [3]
    assert [f[:3] for f in got["files"]] == [[f"rank{r}.pt.trace.json.gz", "ok", 20_000 + r] for r in range(3)]


def test_detection_reads_past_a_first_member_shorter_than_the_head(tmp_path):
    """An appending writer's first member holds only ``{`` and a newline: the head detection
    reads (64 KiB) comes from the members after it too, and the trace is recognised."""
    data = rank_trace(3, 4, kernels(2000))
    path = tmp_path / "rank3.pt.trace.json.gz"
    path.write_bytes(gzip.compress(data[:1]) + gzip.compress(data[1:5]) + members(data[5:], 3))
    assert read_head(path) == data[: 1 << 16]
    assert detect(path)[1] == "kineto"


def test_a_csv_gz_of_several_members_is_read_whole(tmp_path):
    """An operator CSV gzipped in members (the first ends inside the header line): recognised,
    and every row of every member ingested (DuckDB's and the stdlib's gzip read them all)."""
    src = Path(__file__).resolve().parents[1] / "testdata" / "ops" / "kernel_details_level0.csv"
    header, rows = src.read_bytes().split(b"\n", 1)
    body = rows * 400  # the rows again and again: several members of many rows
    text = header + b"\n" + body
    path = tmp_path / "kernel_details.csv.gz"
    path.write_bytes(gzip.compress(text[:12]) + members(text[12:], 4))
    plain = tmp_path / "plain" / "kernel_details.csv"
    plain.parent.mkdir()
    plain.write_bytes(text)
    got = ingest_paths(tmp_path / "db.duckdb", [path], run="gz", jobs=1)
    want = ingest_paths(tmp_path / "plain.duckdb", [plain], run="plain", jobs=1)
    assert got.files[0].status == "ok", got.files[0].message
    assert got.files[0].rows_kept == want.files[0].rows_kept > 0
    assert got.files[0].format == want.files[0].format == "kernel_details"


# --- sizes from the trailer --------------------------------------------------------------------


def test_the_trailer_is_trusted_whatever_the_ratio(tmp_path):
    """One member under 4 GiB: its exact size, at 250x as at 3x (the estimate once stopped at 50x)."""
    rng = random.Random(1)
    for name, data in (
        ("high", rank_trace(0, 1, kernels(3000, LONG_NAME))),
        ("low", bytes(rng.choice(b"abcdef") for _ in range(200_000))),
    ):
        path = tmp_path / f"{name}.json.gz"
        path.write_bytes(gzip.compress(data))
        ratio = len(data) / path.stat().st_size
        assert (name == "high") == (ratio > 200), ratio
        assert content_size(path) == len(data)


@pytest.mark.parametrize(
    "size, isize, expected",
    [
        # a trailer below what a gzip of that size must hold: the size wrapped past 4 GiB
        (10 << 20, 1000, (1 << 32) + 1000),
        (10 << 20, 200 << 20, 200 << 20),  # possible as it is: taken (a ~20x file)
        # a trailer no gzip of this size can hold (more than 1032x): not believed either
        (1 << 20, 0xFFFFFFF0, 1032 << 20),
        (1 << 20, 5, 1032 << 20),  # below the compressed size, and a wrap impossible
        (100, 20, 20),  # tiny files: their headers are most of them
    ],
)
def test_the_trailer_size_unwraps_past_4_gib_and_is_bounded(tmp_path, size, isize, expected):
    path = tmp_path / "t.json.gz"
    with open(path, "wb") as f:
        f.truncate(size - 4)
        f.seek(size - 4)
        f.write(isize.to_bytes(4, "little"))
    assert content_size(path) == expected


def test_the_planner_keeps_high_ratio_files_under_the_temp_cap(tmp_path, monkeypatch):
    """Four files of 250x: sized by their trailers, at most the cap of decompressed bytes per
    batch (assuming 50x put all four in one batch, far over it)."""
    sizes, true = [], {}
    for r in range(4):
        data = rank_trace(r, 4, kernels(2000, LONG_NAME))
        path = tmp_path / f"rank{r}.pt.trace.json.gz"
        path.write_bytes(gzip.compress(data))
        sizes.append((r, str(path), path.stat().st_size))
        true[r] = len(data)
    cap = 2 * max(true.values()) + 1000
    monkeypatch.setattr(_shared, "SHARED_MAX_GZ_BYTES", cap)
    batches = _shared.plan_batches(sizes)
    assert batches == [[0, 1], [2, 3]]
    assert all(sum(true[i] for i in b) <= cap for b in batches)


# --- a batch's temp folder ---------------------------------------------------------------------


class SmallDisk:
    """A temp folder of ``capacity`` bytes, as far as chrome_parts writes into it: a write that
    would pass it raises ENOSPC, as a full filesystem does. Records the most bytes of part files
    present at once (``peak``) and how often it was full."""

    def __init__(self, root: Path, capacity: int):
        self.root, self.capacity = root, capacity
        self.peak = self.full = 0

    def used(self) -> int:
        total = 0
        for d, _dirs, files in os.walk(self.root):
            for f in files:
                try:
                    total += os.lstat(os.path.join(d, f)).st_size if f.endswith(".json") else 0
                except FileNotFoundError:
                    pass  # deleted meanwhile by another file's thread
        return total

    def open(self, path, mode="r", *args, **kwargs):
        f = builtins.open(path, mode, *args, **kwargs)
        return _Limited(f, self) if "w" in mode and str(path).startswith(str(self.root)) else f


class _Limited:
    def __init__(self, f, disk: SmallDisk):
        self.f, self.disk = f, disk

    def write(self, data) -> int:
        used = self.disk.used()
        if used + len(data) > self.disk.capacity:
            self.disk.full += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.f.name)
        n = self.f.write(data)
        self.f.flush()
        self.disk.peak = max(self.disk.peak, used + len(data))
        return n

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def _high_ratio_run(folder: Path, n: int, events: int, k: int = 1) -> dict[str, int]:
    """n rank files of LONG_NAME kernels (~250x) in k members each; {name: events}."""
    folder.mkdir(parents=True)
    out = {}
    for r in range(n):
        name = f"rank{r}.pt.trace.json.gz"
        (folder / name).write_bytes(members(rank_trace(r, n, kernels(events + r, LONG_NAME)), k))
        out[name] = events + r
    return out


def child_small_disk(db: str, folder: str, scratch: str, capacity: int, cap: int) -> dict:
    """Batched ingest with the temp folder a SmallDisk of ``capacity`` and a batch temp budget
    of ``cap``: the results, what the planner batched, and what the disk saw."""
    disk = SmallDisk(Path(scratch), capacity)
    chrome_parts.open = disk.open  # the module's writes of part files (the reads pass through)
    _shared.SHARED_MAX_GZ_BYTES = cap
    import slowcard.ingest as ingest

    planned: list = []
    real_plan = ingest.plan_batches

    def plan(sizes):
        got = real_plan(sizes)
        planned.extend([[Path(sizes[i][1]).name for i in b] for b in got])
        return got

    ingest.plan_batches = plan
    statements = _count_statements()
    opts = IngestOptions(part_bytes=64 << 10, tmp_dir=Path(scratch))
    report = ingest_paths(db, [folder], run="r", options=opts)
    return {
        "files": _files(report),
        "planned": planned,
        "statements": statements,
        "peak": disk.peak,
        "full": disk.full,
        "left": sorted(str(p) for p in Path(scratch).rglob("*.json")),
    }


def test_a_temp_folder_that_fills_sends_members_alone_instead_of_failing_them(tmp_path):
    """Four rank files of ~250x, honest trailers; a temp folder with room for one file's parts
    but not the two a batch holds: the member that finds it full goes alone after the batch's
    statement. Every file ok, every event in; no 'No space left', nothing left behind."""
    want = _high_ratio_run(tmp_path / "run", 4, 600)
    one = max(content_size(p) for p in (tmp_path / "run").iterdir())
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    got = in_child("small_disk", tmp_path / "db.duckdb", tmp_path / "run", scratch, one * 3 // 2, 3 * one)
    assert got["full"] >= 1  # the folder did fill during a batch
    assert [f[:3] for f in got["files"]] == [[name, "ok", n] for name, n in want.items()]
    assert not any("space" in f[3] or "report" in f[3] for f in got["files"]), got["files"]
    assert got["planned"] == [[f"rank{r}.pt.trace.json.gz" for r in range(3)]]
    assert got["left"] == []


def test_members_under_sized_by_their_trailer_keep_the_batch_under_its_cap(tmp_path):
    """Multi-member files: the trailer counts the last member only (an eighth of each file), so
    the planner puts all four in one batch. The batch counts the parts it really writes: at no
    time more than its cap of parts in the temp folder; the files past it go alone after the
    statement, and every event of every file is in."""
    want = _high_ratio_run(tmp_path / "run", 4, 1200, k=8)
    paths = sorted((tmp_path / "run").iterdir())
    true = max(len(gzip.decompress(p.read_bytes())) for p in paths)
    assert all(content_size(p) < true // 4 for p in paths)  # the trailer is far short
    cap = 2 * true + true // 2  # room for two and a half files
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    got = in_child("small_disk", tmp_path / "db.duckdb", tmp_path / "run", scratch, 1 << 40, cap)
    assert got["planned"] == [sorted(want)]  # one batch, as the trailers say
    assert 0 < got["peak"] <= cap, (got["peak"], cap)
    assert got["statements"] and got["statements"][0] in (1, 2)  # the others went alone
    assert [f[:3] for f in got["files"]] == [[name, "ok", n] for name, n in want.items()]
    assert got["full"] == 0 and got["left"] == []
