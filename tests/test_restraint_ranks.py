"""cluster-step-skew, straggler-rank and why-slow-link stay quiet when one of their guards is
missed (issue 33). Each test is named after the condition; its input satisfies the others, and
the same input with only that guard loosened (or, for a guard without a parameter, with the one
number that misses it changed) names the rank.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import ep_lockstep as ls  # noqa: E402

from slowcard import queries, store  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

CATALOG = queries.load_catalog()


@pytest.fixture
def ingest(tmp_db):
    """``ingest(run, paths)`` into this test's database; returns ``judge(query, run, **params)``."""

    def add(run: str, paths) -> None:
        rep = ingest_paths(tmp_db, [str(p) for p in paths], run=run)
        assert all(f.status == "ok" for f in rep.files), [(f.path, f.message) for f in rep.files]

    def judge(query: str, run: str, **params):
        con = store.open_db(tmp_db, read_only=True)
        try:
            res = queries.run_query(con, CATALOG[query], run, params)
        finally:
            con.close()
        assert res.status != "ERROR", res.summary
        return res

    add.judge = judge
    return add


def _subjects(res, col="rank") -> list:
    return [r[col] for r in res.rows if r.get("level") != "SKIP"]


# ------------------------------------------------------------------------- cluster-step-skew

STEP_HEADER = (
    "Step,Type,Index,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,"
    "Stage,Bubble,Communication(Not Overlapped and Exclude Receive)"
)


def _step_csv(path: Path, computing: dict[int, float], pp: dict[int, int] | None = None) -> Path:
    """cluster_step_trace_time.csv, one step: each rank's Computing, 400 us communication, 50 us
    Free; ``pp``: a PP Index column (rank -> pipeline stage)."""
    lines = [STEP_HEADER + (",PP Index" if pp else "")]
    for rank, comp in computing.items():
        cells = [1, "rank", rank, comp, 400.0, 1.5, 401.5, 50.0, comp + 450.0, 0.0, 400.0]
        lines.append(",".join(str(c) for c in cells) + (f",{pp[rank]}" if pp else ""))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_step_skew_needs_min_gap_share_of_the_step(ingest, tmp_path):
    # rank 2 computes 70 us longer: 4.8 % of the mean step (1,467.5 us), under min_gap_share
    ingest("r", [_step_csv(tmp_path / "s.csv", {0: 1000.0, 1: 1000.0, 2: 1070.0, 3: 1000.0})])
    res = ingest.judge("cluster-step-skew", "r")
    assert (res.status, res.rows) == ("PASS", [])
    loose = ingest.judge("cluster-step-skew", "r", min_gap_share=0.04)
    assert [(r["suspect_rank"], r["cause"], r["gap_pct"]) for r in loose.rows] == [(2, "compute-skew", 4.8)]


def test_step_skew_compares_ranks_within_their_pipeline_stage(ingest, tmp_path):
    """The later pipeline stage computes 30 % longer by its shape: within each stage the ranks are
    equal. Without the PP Index column the same numbers are one group with a 20 % gap."""
    computing = {0: 1000.0, 1: 1000.0, 2: 1300.0, 3: 1300.0}
    (tmp_path / "pp").mkdir()
    (tmp_path / "flat").mkdir()
    ingest("pp", [_step_csv(tmp_path / "pp" / "s.csv", computing, pp={0: 0, 1: 0, 2: 1, 3: 1})])
    ingest("flat", [_step_csv(tmp_path / "flat" / "s.csv", computing)])
    res = ingest.judge("cluster-step-skew", "pp")
    assert (res.status, res.rows) == ("PASS", [])
    flat = ingest.judge("cluster-step-skew", "flat")
    assert flat.status == "FAIL" and {r["stage"] for r in flat.rows} == {"all ranks"}


# ------------------------------------------------------------------------- straggler-rank


def _lockstep(out: Path, late_us: float, late_in=lambda s, layer: True, steps: int = 4, layers: int = 4):
    """Rank 3 arrives ``late_us`` after the others at the dispatch of the layer instances where
    ``late_in(step, layer)``; the combines are reached together (nobody last)."""

    def cells(rank, s, layer):
        return ls.Cell(pre_dispatch_us=late_us if rank == 3 and late_in(s, layer) else 0.0)

    return ls.write_run(out, cells, steps=steps, layers=layers)


def test_straggler_needs_a_clear_arrival_skew(ingest, tmp_path):
    """Rank 3 is the last to arrive at every dispatch (half the collectives), but 3 us late: under
    5 % of the collective's median duration (~103 us) it is a tie, not a straggler; 20 us is one."""
    ingest("hair", _lockstep(tmp_path / "hair", 3.0))
    ingest("clear", _lockstep(tmp_path / "clear", 20.0))
    assert ingest.judge("straggler-rank", "hair").status == "PASS"
    clear = ingest.judge("straggler-rank", "clear")
    assert clear.status == "WARN" and [(r["rank"], r["last_pct"]) for r in clear.rows] == [(3, 50.0)]


def test_straggler_needs_min_last_share_of_the_collectives(ingest, tmp_path):
    # clearly last at 15 of the 16 dispatches: 15 of 32 collectives, under half
    ingest("r", _lockstep(tmp_path / "r", 20.0, late_in=lambda s, layer: (s, layer) != (0, 0)))
    res = ingest.judge("straggler-rank", "r")
    assert (res.status, res.rows) == ("PASS", [])
    loose = ingest.judge("straggler-rank", "r", min_last_share=0.45)
    assert [(r["rank"], r["collectives"], r["last_pct"]) for r in loose.rows] == [(3, 32, 46.9)]


def test_straggler_needs_min_collectives(ingest, tmp_path):
    # one layer instance: clearly last at 1 of its 2 collectives, but 2 are too few to judge
    ingest("r", _lockstep(tmp_path / "r", 20.0, steps=1, layers=1))
    assert ingest.judge("straggler-rank", "r").status == "PASS"
    loose = ingest.judge("straggler-rank", "r", min_collectives=2)
    assert [(r["rank"], r["collectives"]) for r in loose.rows] == [(3, 2)]


# ------------------------------------------------------------------------- why-slow-link


def _hccs(mb: float, ms: float) -> dict:
    return {
        "Communication Time Info": {"Elapse Time(ms)": ms + 0.1, "Transit Time(ms)": ms, "Wait Time(ms)": 0.1},
        "Communication Bandwidth Info": {
            "HCCS": {"Transit Size(MB)": mb, "Transit Time(ms)": ms, "Bandwidth(GB/s)": mb / ms},
        },
    }


def _comm_json(path: Path, slow, ops: int = 10, ranks: int = 4) -> Path:
    """cluster_communication.json: ``ops`` all-reduces of 0.5 MB over HCCS; every rank moves them
    in 0.2 ms (2.5 GB/s) except the last rank, which takes 0.2 ms / ``slow(op)``."""
    doc = {
        "(" + ", ".join(str(r) for r in range(ranks)) + ")": {
            "step1": {
                f"hcom_allReduce__{k}@g": {
                    str(r): _hccs(0.5, 0.2 / (slow(k) if r == ranks - 1 else 1.0)) for r in range(ranks)
                }
                for k in range(ops)
            }
        }
    }
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_slow_link_needs_max_bw_ratio(ingest, tmp_path):
    # rank 3 at 0.7x the median rank's bandwidth in every all-reduce: slower, not slow enough
    ingest("r", [_comm_json(tmp_path / "c.json", lambda k: 0.7)])
    assert ingest.judge("why-slow-link", "r").status == "PASS"
    loose = ingest.judge("why-slow-link", "r", max_bw_ratio=0.75)
    assert [(r["rank"], r["bw_ratio"], r["below_pct"]) for r in loose.rows] == [(3, 0.7, 100.0)]


def test_slow_link_needs_min_below_pct_of_the_transfers(ingest, tmp_path):
    # half speed in 7 of 10 all-reduces, faster than the others in 3: a median of 0.5x, below in 70 %
    ingest("r", [_comm_json(tmp_path / "c.json", lambda k: 0.5 if k < 7 else 1.1)])
    assert ingest.judge("why-slow-link", "r").status == "PASS"
    loose = ingest.judge("why-slow-link", "r", min_below_pct=65.0)
    assert [(r["rank"], r["bw_ratio"], r["below_pct"]) for r in loose.rows] == [(3, 0.5, 70.0)]


def test_slow_link_needs_min_samples(ingest, tmp_path):
    ingest("r", [_comm_json(tmp_path / "c.json", lambda k: 0.5, ops=2)])
    assert ingest.judge("why-slow-link", "r").status == "PASS"
    assert _subjects(ingest.judge("why-slow-link", "r", min_samples=2)) == [3]


def test_slow_link_needs_min_ranks_to_have_a_median_rank(ingest, tmp_path):
    # two ranks per all-reduce: rank 1 at half speed, but the "median rank" would be the mean of the two
    ingest("r", [_comm_json(tmp_path / "c.json", lambda k: 0.5, ranks=2)])
    res = ingest.judge("why-slow-link", "r")
    assert res.status == "SKIP" and "fewer than 3 ranks" in res.summary
    assert _subjects(ingest.judge("why-slow-link", "r", min_ranks=2)) == [1]
