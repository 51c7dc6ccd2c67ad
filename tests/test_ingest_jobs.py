"""Files at once when --jobs is not given (ingest.auto_jobs): several small files go in parallel,
a large one keeps the ingest to one file at a time, and the result is the same database either
way (same rows per file, same verdict, reports in the order the files were given)."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest

from slowcard import store
from slowcard.ingest import AUTO_JOBS_MAX, AUTO_JOBS_MAX_FILE_BYTES, auto_jobs, ingest_paths
from slowcard.queries import load_catalog, run_query

MB = 1 << 20


@pytest.mark.parametrize(
    "sizes, cores, expected",
    [
        ([], 2, 1),
        ([5 * MB], 2, 1),  # one file: nothing to run beside it
        ([1 * MB] * 8, 2, 2),
        ([1 * MB] * 3, 16, 3),  # never more jobs than files
        ([1 * MB] * 100, 64, AUTO_JOBS_MAX),
        ([1 * MB] * 7 + [AUTO_JOBS_MAX_FILE_BYTES], 2, 2),  # at the limit: still small
        ([1 * MB] * 7 + [AUTO_JOBS_MAX_FILE_BYTES + 1], 2, 1),  # one large file: one at a time
        ([1 * MB] * 4, None, 1),  # cpu_count unknown
    ],
)
def test_auto_jobs(monkeypatch, sizes, cores, expected):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert auto_jobs(sizes) == expected


def _snapshot(db):
    con = duckdb.connect(str(db), read_only=True)
    try:
        per_file = con.execute(
            "SELECT s.path, s.rank, s.rows_kept, count(e.source_id), "
            "(SELECT count(*) FROM op_class_rows o WHERE o.source_id = s.source_id) "
            "FROM sources s LEFT JOIN event_rows e USING (source_id) GROUP BY ALL ORDER BY s.path"
        ).fetchall()
        return per_file
    finally:
        con.close()


def test_the_default_ingests_small_files_in_parallel_into_the_same_database(tmp_path, realdata, monkeypatch):
    """The 4 ranks of a real EP run (each under a MB, .json.gz): with --jobs left out they go in
    one batch (ingest/_shared.py), a thread per file; the database and the verdict equal those of
    --jobs 1 (one thread)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    files = sorted((realdata / "kineto_cpu_ep4_hot1").glob("*.json*"))
    assert len(files) >= 4 and auto_jobs([f.stat().st_size for f in files]) == 2
    seen_threads = set()
    import slowcard.ingest as ingest_mod

    real = ingest_mod.ingest_file

    def spy(*args, **kwargs):
        import threading

        seen_threads.add(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(ingest_mod, "ingest_file", spy)
    verdicts = {}
    for name, jobs in (("auto", None), ("serial", 1)):
        db = tmp_path / f"{name}.duckdb"
        seen_threads.clear()
        rep = ingest_paths(db, [str(f) for f in files], run="r", jobs=jobs)
        # the order given (paths compared resolved: ../shared may be reached through a symlink)
        assert [Path(f.path).resolve() for f in rep.files] == [f.resolve() for f in files]
        assert all(f.status == "ok" for f in rep.files)
        assert len(seen_threads) == (len(files) if jobs is None else 1)
        con = store.open_db(db, read_only=True)
        try:
            res = run_query(con, load_catalog()["ep-slow-rank"], run="r")
            verdicts[name] = (res.status, [(r.get("rank"), r.get("cause")) for r in res.rows if r.get("level")])
        finally:
            con.close()
        verdicts[name + "_rows"] = _snapshot(db)
    assert verdicts["auto_rows"] == verdicts["serial_rows"]
    assert verdicts["auto"] == verdicts["serial"] and verdicts["auto"][0] in ("FAIL", "WARN")


def test_service_csvs_fit_beside_each_other_in_the_ingest_memory_limit(tmp_path):
    """DuckDB's CSV buffer defaulted to 16 x max_line_size: one 256 MB block per msServiceProfiler
    CSV, however small, out of the 512 MB the ingest allows, so two CSVs at once (--jobs 2, or the
    default on small files) failed with "could not allocate block of size 256.0 MiB". Under a
    200 MB limit a single small CSV could not go in at all; now it takes one 32 MB buffer."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    import synth_service as ss

    folder = tmp_path / "svc"
    ss.write_run(folder, ss.config_for("balanced", duration_s=20.0))
    db = tmp_path / "svc.duckdb"
    con = store.open_db(db)
    try:
        con.execute("SET memory_limit = '200MB'")
        rep = ingest_paths(db, [str(folder / "request.csv")], run="tight", con=con)
    finally:
        con.close()
    assert [f.status for f in rep.files] == ["ok"], [f.message for f in rep.files]
    rep = ingest_paths(db, [str(folder)], run="both", jobs=2)
    assert rep.files and all(f.status == "ok" for f in rep.files), [(f.path, f.message) for f in rep.files]
