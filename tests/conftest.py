"""Shared fixtures: the real-data folder (skips cleanly when absent), a fresh database per test,
and a writer of small Chrome traces in every layout the readers must accept."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest

from slowcard import store


def pytest_configure(config):
    """The schema template cache (store.schema_template) in a folder of this test session, never
    the user's ~/.cache; CLI subprocesses inherit it."""
    import os
    import tempfile

    if "SLOWCARD_CACHE_DIR" not in os.environ:
        config._slowcard_cache = tempfile.mkdtemp(prefix="slowcard-test-cache-")
        os.environ["SLOWCARD_CACHE_DIR"] = config._slowcard_cache


def pytest_unconfigure(config):
    import os

    folder = getattr(config, "_slowcard_cache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop("SLOWCARD_CACHE_DIR", None)


# ../shared/realdata beside the checkout (read-only, never copied into the repo).
REALDATA = Path(__file__).resolve().parents[1].parent / "shared" / "realdata"


@pytest.fixture(scope="session")
def realdata() -> Path:
    """The real profiler outputs; the test is skipped with a reason when they are not there."""
    if not REALDATA.is_dir():
        pytest.skip(f"real profiler data not found at {REALDATA} (shared/ is not beside the checkout)")
    return REALDATA


def duckdb_cli() -> str | None:
    """The `duckdb` shell of the PyPI duckdb-cli package: beside this interpreter's scripts (a venv
    that is not activated is not on PATH), else on PATH."""
    import sysconfig

    for scripts in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        exe = Path(scripts) / "duckdb"
        if exe.is_file():
            return str(exe)
    return shutil.which("duckdb")


def ingest_ok(db, paths, run, skipped_ok: bool = False):
    """Ingest paths into db under run and assert every file went in cleanly (``skipped_ok``: or
    was skipped, a companion file such as profiler_info_N.json, with at least one file in);
    returns the ingest report."""
    from slowcard.ingest import ingest_paths

    con = store.open_db(db)
    try:
        rep = ingest_paths(db, [str(p) for p in paths], run=run, con=con)
    finally:
        con.close()
    fine = ("ok", "skipped") if skipped_ok else ("ok",)
    assert all(f.status in fine for f in rep.files), [(f.path, f.status, f.message) for f in rep.files]
    assert any(f.status == "ok" for f in rep.files), run
    return rep


def run_builtin(db, name, run, params=None):
    """The result of the built-in query ``name`` on ``run`` of the database ``db`` (read-only)."""
    from slowcard import queries

    con = queries.open_readonly(db)
    try:
        return queries.run_query(con, queries.load_catalog()[name], run, params or None)
    finally:
        con.close()


REAL_EP_RUN = "kineto_cpu_ep4_hot1"


@pytest.fixture(scope="session")
def real_ep_db(realdata, tmp_path_factory) -> Path:
    """The real EP run ingested once per test session (the report and annotate tests read it)."""
    db = tmp_path_factory.mktemp("shared_real_ep") / "ep.duckdb"
    ingest_ok(db, [realdata / REAL_EP_RUN], REAL_EP_RUN)
    return db


@pytest.fixture(scope="module")
def app():
    """A typer app with only the view commands (report, annotate, ...) registered."""
    import typer

    from slowcard import cli_views
    from slowcard.cli_common import Commands

    a = typer.Typer(cls=Commands)  # the CLI's error boundary: library errors -> exit 2

    @a.callback()
    def _main():
        """test app"""

    cli_views.register(a)
    return a


# `python -c PEAK_RSS_CHILD ARGS...` runs `slowcard ARGS...` and writes its peak resident memory
# to stderr as "maxrss_kb=N". The peak is VmHWM, the high-water mark of the process's own address
# space: ru_maxrss also counts the pages it shared with its parent before exec, so a child of a
# pytest worker that had grown to 2 GB (a full CI run) read 2 GB whatever it used itself.
PEAK_RSS_CHILD = """
import resource, runpy, sys
sys.argv = ["slowcard"] + sys.argv[1:]
try:
    runpy.run_module("slowcard", run_name="__main__")
finally:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        with open("/proc/self/status") as fh:
            kb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        pass
    sys.stderr.write("maxrss_kb=%d\\n" % kb)
"""


@pytest.fixture(scope="module")
def cluster():
    """An external two-worker Dask LocalCluster on loopback (test_distributed*.py), closed even when
    a test fails; its HTTP ports are 0: another suite's cluster may run beside it."""
    import logging

    pytest.importorskip("distributed", reason="dask.distributed is an optional extra: pip install -e .[dask]")
    from dask.distributed import LocalCluster

    import slowcard.distributed

    c = LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        silence_logs=logging.ERROR,
        **slowcard.distributed.LOCAL_CLUSTER_HTTP,
    )
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="session")
def _template_db(tmp_path_factory) -> Path:
    """One database with the schema applied; copying it is much cheaper than applying the DDL."""
    path = tmp_path_factory.mktemp("template") / "template.duckdb"
    store.open_db(path).close()
    return path


@pytest.fixture
def tmp_db(tmp_path, _template_db) -> Path:
    """Path of a fresh, empty slowcard database (schema applied) for this test."""
    path = tmp_path / "t.duckdb"
    shutil.copyfile(_template_db, path)
    return path


def trace_text(
    events, header: dict | None = None, trailer: dict | None = None, *, array: bool = False, indent: int | None = None
) -> str:
    """A Chrome trace as text: the Kineto object form with header keys before and trailer keys
    after ``traceEvents`` (or a bare array), one line (indent None) or pretty-printed."""
    if array:
        return json.dumps(events, indent=indent)
    sep = ",\n" if indent else ", "
    parts = [f"{json.dumps(k)}: {json.dumps(v, indent=indent)}" for k, v in (header or {}).items()]
    parts.append('"traceEvents": ' + json.dumps(events, indent=indent))
    parts += [f"{json.dumps(k)}: {json.dumps(v, indent=indent)}" for k, v in (trailer or {}).items()]
    return "{" + sep.join(parts) + "}\n"


def write_trace(
    path: Path,
    events=None,
    header=None,
    trailer=None,
    *,
    text: str | None = None,
    array: bool = False,
    indent: int | None = None,
    bom: bool = False,
) -> Path:
    """Write a trace (``.gz`` suffix: gzip, mtime 0) and return its path."""
    if text is None:
        text = trace_text(events, header, trailer, array=array, indent=indent)
    data = (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    return path


@pytest.fixture
def make_trace():
    """``make_trace(path, events, header, trailer, array=, indent=, bom=, text=)`` -> path."""
    return write_trace


def pytest_terminal_summary(terminalreporter):
    """Print how many fuzz cases each reader was given (tests/test_fuzz.py counts them)."""
    fuzz = sys.modules.get("test_fuzz")
    counts = getattr(fuzz, "FUZZ_COUNTS", None)
    if counts:
        terminalreporter.write_line(
            "fuzz cases tried per reader: "
            + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
            + f"; seed {fuzz.SEED} (replay: SLOWCARD_FUZZ_SEED={fuzz.SEED})"
        )
