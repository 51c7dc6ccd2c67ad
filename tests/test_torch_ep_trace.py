"""bench/torch_ep_trace.py writes real torch.profiler traces that slowcard reads as an EP run.

Needs torch (the optional `bench` extra, never a CI dependency): skipped without it.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (optional: pip install -e '.[bench]')")

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import torch_ep_trace  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402


def test_token_skew_run_is_read_as_token_skew_on_the_slow_rank(tmp_path):
    out = tmp_path / "run"
    # 10 steps x 3 layers = 30 layer instances: the sign test needs the rank's GroupedMatmul above
    # the median in 23 of them (77 %) at alpha 0.01 / 3 ranks. With 18 it needed 16 (89 %), and on
    # CPU processes beside a busy test suite rank 2 was above in 15 (83 %): a PASS on a real skew.
    steps, layers = 10, 3
    cost = torch_ep_trace.generate(
        out, world=3, scenario="token_skew", effect=0.6, slow_rank=2, steps=steps, layers=layers
    )
    files = sorted(out.glob("rank*.pt.trace.json.gz"))
    assert [f.name for f in files] == [f"rank{r}.pt.trace.json.gz" for r in range(3)]
    assert cost is not None and cost > 0
    # the real profiler wrote the regions of the built-in taxonomy and real all-to-alls
    with gzip.open(files[0], "rb") as fh:
        doc = json.load(fh)
    names = {e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert {"MoeGatingTopK", "MoeDistributeDispatch", "GroupedMatmul", "MoeDistributeCombine"} <= names
    assert {"moe_layer_0", "decode_step_2", "gloo:all_to_all"} <= names
    assert doc["distributedInfo"]["world_size"] == 3 and doc["distributedInfo"]["backend"] == "gloo"

    db = tmp_path / "t.duckdb"
    rep = ingest_paths(db, [out], run="r")
    assert all(f.status == "ok" for f in rep.files), [(f.path, f.message) for f in rep.files]
    con = queries.open_readonly(db)
    try:
        res = queries.run_query(con, queries.load_catalog()["ep-slow-rank"], "r")
        tokens = dict(
            con.execute("SELECT rank, sum(tokens) FROM moe_layer_facts WHERE run = 'r' GROUP BY rank").fetchall()
        )
    finally:
        con.close()
    # every rank routes 256 tokens per layer instance; 60 % of them pinned to rank 2's experts
    assert sum(tokens.values()) == 3 * 256 * (steps * layers)  # 3 ranks x 256 tokens x layer instances
    assert tokens[2] > 1.8 * max(tokens[0], tokens[1])
    assert res.status in ("FAIL", "WARN"), res.summary
    assert (res.rows[0]["rank"], res.rows[0]["cause"]) == (2, "token-skew")


def test_bad_knobs_are_refused(tmp_path):
    with pytest.raises(ValueError, match="scenario"):
        torch_ep_trace.generate(tmp_path, scenario="nope")
    with pytest.raises(ValueError, match="slow_rank"):
        torch_ep_trace.generate(tmp_path, world=2, slow_rank=2)
    with pytest.raises(ValueError, match="share of tokens"):
        torch_ep_trace.generate(tmp_path, scenario="token_skew", effect=1.5)
