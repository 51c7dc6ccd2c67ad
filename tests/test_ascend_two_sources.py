"""torch_npu writes a rank's operators twice, side by side in ASCEND_PROFILER_OUTPUT:
kernel_details.csv (its HCCL rows) and trace_view.json (its hcom_* ops). Ingested together, a
rank's collectives are read from one of them (views/30_collectives.sql, `picked`): the readings
are those of either file alone, not doubled; a rank that has only a timeline keeps it."""

from __future__ import annotations

import shutil

import pytest
import synth_device_straggler as sd
from conftest import ingest_ok, run_builtin

RUNS = ("csv", "timeline", "both", "mixed")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    d = tmp_path_factory.mktemp("ascend_two_sources")
    path = d / "a.duckdb"
    same = {"ranks": 4, "slow_rank": 1, "factor": 1.6, "seed": 3}
    sd.write_ascend_run(d / "csv", **same)
    sd.write_ascend_run(d / "timeline", timeline=True, **same)
    sd.write_ascend_run(d / "both", **same)  # the same ranks written both ways, as torch_npu does
    sd.write_ascend_run(d / "both", timeline=True, **same)
    # the near miss: ranks 2 and 3 have only their timeline (their operator table is gone)
    sd.write_ascend_run(d / "mixed", timeline=True, **same)
    sd.write_ascend_run(d / "mixed", **same)
    for r in (2, 3):
        (d / "mixed" / f"rank{r}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv").unlink()
    notes = {}
    for run in RUNS:
        rep = ingest_ok(path, [d / run], run, skipped_ok=True)
        notes[run] = [n for n in rep.notes if n.startswith("operators written twice")]
    # the ingest says which ranks came in twice, and only those
    assert notes["both"] == [
        "operators written twice: 4 rank(s) (0, 1, 2, 3) have an operator table and a timeline "
        "(trace_view.json) each, as torch_npu writes them; the queries read a rank's collectives from one "
        "of them, never both"
    ]
    assert notes["mixed"] and "2 rank(s) (0, 1)" in notes["mixed"][0]
    assert notes["csv"] == notes["timeline"] == []
    shutil.rmtree(d / "both")  # the database holds what the queries read
    return path


def _collectives_per_rank(db, run) -> dict:
    from slowcard import queries

    con = queries.open_readonly(db)
    try:
        return dict(
            con.execute(
                "SELECT rank, count(*) FROM collective_waits WHERE run = ? GROUP BY rank ORDER BY rank", [run]
            ).fetchall()
        )
    finally:
        con.close()


def test_a_rank_written_twice_is_read_once(db):
    # 12 all-reduces per rank, as in either file alone (24 when both were read)
    for run in RUNS:
        assert _collectives_per_rank(db, run) == {0: 12, 1: 12, 2: 12, 3: 12}, run
    straggler = {run: run_builtin(db, "straggler-rank", run).rows for run in RUNS}
    csv_row = straggler["csv"][0]
    assert [r["rank"] for r in straggler["csv"]] == [1]
    for run in ("timeline", "both", "mixed"):
        (row,) = straggler[run]
        assert row["rank"] == 1 and row["collectives"] == 12
        assert row["cost_ms"] == pytest.approx(csv_row["cost_ms"], rel=0.01), run  # not doubled


def test_queries_that_failed_on_the_double_rank_answer(db):
    # sync-gaps failed with "Map keys must be unique" on a rank read twice
    res = run_builtin(db, "sync-gaps", "both")
    assert res.status != "ERROR", res.error
    assert res.status == run_builtin(db, "sync-gaps", "csv").status
    # why-straggler answers as on the operator table alone (it SKIPped on the double rank)
    rows = {run: run_builtin(db, "why-straggler", run).rows for run in ("csv", "both")}
    assert [(r["rank"], r["item"]) for r in rows["both"]][:1] == [(1, "MatMulV2")]
    assert [(r["rank"], r["item"], r["items_from"]) for r in rows["both"]] == [
        (r["rank"], r["item"], r["items_from"]) for r in rows["csv"]
    ]
