"""The named pipes parts reach DuckDB through: wide buffers for a few at a time, and every place
given back once the parts are in (chrome_pipes._widen)."""

from __future__ import annotations

import os

import pytest
from conftest import write_trace

from slowcard.ingest import chrome_pipes, ingest_paths

fcntl = pytest.importorskip("fcntl")
if not hasattr(fcntl, "F_SETPIPE_SZ"):
    pytest.skip("no F_SETPIPE_SZ here (not Linux)", allow_module_level=True)


def _size(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)


def test_only_a_few_pipes_are_widened_at_once():
    pipes = [os.pipe() for _ in range(chrome_pipes.WIDE_PIPES + 2)]
    try:
        default = _size(pipes[0][1])
        took = [chrome_pipes._widen(w) for _r, w in pipes]
        assert took == [True] * chrome_pipes.WIDE_PIPES + [False, False]
        sizes = [_size(w) for _r, w in pipes]
        # the system may allow less than PIPE_BYTES (a lower pipe-max-size): then nothing widens
        assert set(sizes[: chrome_pipes.WIDE_PIPES]) <= {chrome_pipes.PIPE_BYTES, default}
        assert sizes[chrome_pipes.WIDE_PIPES :] == [default, default]
        chrome_pipes._WIDE.release()  # one widened pipe is closed: the next one may widen
        assert chrome_pipes._widen(pipes[-1][1])
    finally:
        for _ in range(chrome_pipes.WIDE_PIPES):
            chrome_pipes._WIDE.release()
        for r, w in pipes:
            os.close(r)
            os.close(w)


def _events(n: int) -> list[dict]:
    return [
        {"ph": "X", "cat": "kernel", "name": f"k{i % 7}", "pid": 0, "tid": 7, "ts": 10.0 + i, "dur": 0.5}
        for i in range(n)
    ]


def test_an_ingest_through_pipes_gives_every_wide_place_back(tmp_path, monkeypatch):
    calls: list[bool] = []
    widen = chrome_pipes._widen

    def spy(fd: int) -> bool:
        took = widen(fd)
        calls.append(took)
        return took

    monkeypatch.setattr(chrome_pipes, "_widen", spy)
    folder = tmp_path / "run"
    folder.mkdir()
    for r in range(12):  # a batch of 12 files: 12 pipes in one statement, more than WIDE_PIPES
        write_trace(folder / f"rank{r}.json", _events(3000), {"schemaVersion": 1, "distributedInfo": {"rank": r}})
    rep = ingest_paths(tmp_path / "p.duckdb", [str(folder)], run="r")
    assert [f.status for f in rep.files] == ["ok"] * 12
    assert sum(f.rows_kept for f in rep.files) == 12 * 3000
    assert len(calls) >= 12 and any(calls)  # every part went through a pipe, some widened
    # every place taken during the statement was given back
    assert chrome_pipes._WIDE._value == chrome_pipes.WIDE_PIPES  # type: ignore[attr-defined]
