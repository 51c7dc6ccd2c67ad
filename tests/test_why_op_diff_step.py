"""why-op-diff v5 (issue 42 item 3): the whole step, not only the MoE layers.

Runs from tests/synth_straggler.py (lock-step Kineto CPU traces with MoE layers, 2 % seeded
jitter): rank 1's SelfAttention, OUTSIDE its MoE layers, takes 1.5x (and 1.05x, the near miss);
its MoE work is normal. The same runs with a container around each layer (an
``nn.Module: DecoderLayer_0`` enclosing attention and the MoE layer, as a real model has) and
with the MoE modules renamed (no MoE layers: the steps alone).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_straggler  # noqa: E402
from conftest import ingest_ok, run_builtin  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

CATALOG = queries.load_catalog()
OUTSIDE = "outside MoE layers"
ATTN = "nn.Module: SelfAttention_0"


def _wrap_layers(folder: Path) -> None:
    """Each SelfAttention ... MoE_0 stretch of a rank's main thread inside one DecoderLayer range."""
    for path in folder.glob("rank*.pt.trace.json"):
        doc = json.loads(path.read_text())
        evs = doc["traceEvents"]
        attn = sorted((e for e in evs if e["name"] == ATTN), key=lambda e: e["ts"])
        moe = sorted((e for e in evs if e["name"] == "nn.Module: MoE_0"), key=lambda e: e["ts"])
        assert len(attn) == len(moe)
        for a, m in zip(attn, moe, strict=True):
            start, end = a["ts"] - 1, m["ts"] + m["dur"] + 0.5
            evs.append({**a, "name": "nn.Module: DecoderLayer_0", "ts": start, "dur": round(end - start, 3)})
        path.write_text(json.dumps(doc))


def _copy_into_layer(folder: Path) -> None:
    """An aten::copy_ that starts 1.5 us before each MoE layer and runs into it: 10 us, 25 us on
    rank 1 (its time outside the layer, 1.5 us, is the same on every rank)."""
    for path in folder.glob("rank*.pt.trace.json"):
        doc = json.loads(path.read_text())
        slow = doc["distributedInfo"]["rank"] == 1
        for m in [e for e in doc["traceEvents"] if e["name"] == "nn.Module: MoE_0"]:
            doc["traceEvents"].append(
                {
                    **m,
                    "name": "aten::copy_",
                    "cat": "cpu_op",
                    "ts": round(m["ts"] - 1.5, 3),
                    "dur": 25.0 if slow else 10.0,
                }
            )
        path.write_text(json.dumps(doc))


def _no_moe(folder: Path) -> None:
    """The MoE module renamed: a dense model, no MoE layer in the trace."""
    for path in folder.glob("rank*.pt.trace.json"):
        path.write_text(path.read_text().replace("nn.Module: MoE_0", "nn.Module: FeedForward_0"))


# run -> (write_run kwargs, post-processing)
RUNS = {
    "attn_150": ({"scenario": "slow_attention", "factor": 1.5}, None),
    "attn_105": ({"scenario": "slow_attention", "factor": 1.05}, None),
    "balanced": ({"scenario": "balanced"}, None),
    "attn_150_decoder": ({"scenario": "slow_attention", "factor": 1.5}, _wrap_layers),
    "attn_150_dense": ({"scenario": "slow_attention", "factor": 1.5}, _no_moe),
    "attn_150_copy": ({"scenario": "slow_attention", "factor": 1.5}, _copy_into_layer),
}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    d = tmp_path_factory.mktemp("op_diff_step")
    path = d / "s.duckdb"
    for run, (kw, post) in RUNS.items():
        synth_straggler.write_run(d / run, **kw)
        if post is not None:
            post(d / run)
        ingest_ok(path, [d / run], run)
    return path


def rows(db, run, **params):
    res = run_builtin(db, "why-op-diff", run, params)
    assert res.status == "INFO", res.summary
    return res.rows


def moe_rows(rs):
    return [r for r in rs if r["scope"] == "MoE layers"]


def test_slow_attention_outside_the_moe_layers_is_named_with_its_scope_and_ratio(db):
    rs = rows(db, "attn_150")
    top = [r for r in rs if r["rank"] == 1][0]  # rank 1's first row: its largest excess
    assert (top["name"], top["scope"], top["unit"]) == (ATTN, OUTSIDE, "step")
    assert 1.45 <= top["ratio"] <= 1.56
    # 4 layers x 0.5 x 400 us per step, 3 steps (+-2 % jitter): 2,400 us
    assert top["excess_us"] == pytest.approx(3 * 4 * 0.5 * synth_straggler.ATTN_US, rel=0.08)
    assert top["instances"] == 3 and top["excess_share_pct"] > 90
    # the ops inside it are its subtree, not rows of their own (outermost per thread); the MoE
    # work is in the MoE scope only
    assert not any(r["name"] in ("aten::bmm", "aten::softmax", "aten::mm") for r in rs if r["scope"] == OUTSIDE)
    # the summary diagnose shows says where it was compared
    con = queries.open_readonly(db)
    try:
        res = queries.run_query(con, CATALOG["why-op-diff"], "attn_150")
    finally:
        con.close()
    assert f"rank 1: {ATTN} (other) +" in res.summary and "steps [outside MoE layers]" in res.summary


def test_near_miss_at_105x_names_nothing_outside(db):
    assert [r for r in rows(db, "attn_105") if r["scope"] == OUTSIDE] == []
    assert [r for r in rows(db, "balanced") if r["scope"] == OUTSIDE] == []


def test_the_near_miss_is_held_back_by_min_step_ratio(db):
    # the guard that keeps 1.05x quiet is the ratio, not a lack of excess: at 1.02 it shows
    low = [r for r in rows(db, "attn_105", min_step_ratio=1.02) if r["rank"] == 1 and r["scope"] == OUTSIDE]
    assert low and low[0]["name"] == ATTN and 1.02 <= low[0]["ratio"] <= 1.08


def test_moe_rows_are_what_they_were_without_the_outside_scope(db):
    """The MoE-layer rows keep their numbers: with the outside scope shut off (no operator
    reaches min_step_ratio) they are v4's, and with outside rows present only their share of
    the rank's excess changes, which is then over both scopes."""
    for run in ("attn_150", "attn_105", "balanced"):
        on = moe_rows(rows(db, run))
        off = moe_rows(rows(db, run, min_step_ratio=1e9))
        assert on == off, run  # no outside row on these ranks passes: the same rows, shares included
        assert off, run  # not vacuous: jitter leaves a MoE excess (rank 2's aten::mm)
    # the outside rows every operator above the median rank in (min_step_ratio 1.0): a rank then
    # has rows in both scopes, and the MoE rows keep every number but their share
    both = rows(db, "balanced", min_step_ratio=1.0)
    off = {(r["rank"], r["name"]): r for r in moe_rows(rows(db, "balanced", min_step_ratio=1e9))}
    mixed_ranks = set()
    for r in moe_rows(both):
        ref = off[(r["rank"], r["name"])]
        assert {k: v for k, v in r.items() if k != "excess_share_pct"} == {
            k: v for k, v in ref.items() if k != "excess_share_pct"
        }
        outside = [x for x in both if x["rank"] == r["rank"] and x["scope"] == OUTSIDE]
        if outside:
            mixed_ranks.add(r["rank"])
            assert r["excess_share_pct"] < ref["excess_share_pct"]
    assert mixed_ranks  # not vacuous: some rank has rows in both scopes


def test_shares_are_over_the_excess_of_both_scopes(db):
    rs = rows(db, "balanced", min_step_ratio=1.0, min_share_pct=0.0, top_n=100)
    for rank in {r["rank"] for r in rs}:
        mine = [r for r in rs if r["rank"] == rank]
        assert sum(r["excess_share_pct"] for r in mine) == pytest.approx(100, abs=0.5 + 0.05 * len(mine))
        total = sum(r["excess_us"] for r in mine)
        for r in mine:
            assert r["excess_share_pct"] == pytest.approx(100 * r["excess_us"] / total, abs=0.2)
    # ranked by excess across scopes
    for rank in {r["rank"] for r in rs}:
        ex = [r["excess_us"] for r in rs if r["rank"] == rank]
        assert ex == sorted(ex, reverse=True)


def test_top_n_holds_per_scope(db):
    rs = rows(db, "balanced", min_step_ratio=1.0, min_share_pct=0.0, top_n=1)
    per = {}
    for r in rs:
        per.setdefault((r["rank"], r["scope"]), []).append(r)
    assert all(len(v) == 1 for v in per.values())
    assert {s for _, s in per} == {"MoE layers", OUTSIDE}


def test_a_container_around_the_moe_layer_is_not_an_operator(db):
    """A DecoderLayer range enclosing attention and the MoE layer is the model's structure, like
    the step: its time minus the layer's would name it instead of the attention inside it."""
    rs = rows(db, "attn_150_decoder")
    assert not any("DecoderLayer" in r["name"] for r in rs), rs
    top = [r for r in rs if r["rank"] == 1][0]
    assert (top["name"], top["scope"]) == (ATTN, OUTSIDE) and 1.45 <= top["ratio"] <= 1.56
    # the MoE readings are the same as without the container
    assert moe_rows(rs) == moe_rows(rows(db, "attn_150"))


def test_an_operation_running_into_a_layer_counts_up_to_the_layer_start(db):
    """Its time inside the layer is the layer's: cut there, rank 1's longer copy_ (2.5x whole) is
    1.5 us like everyone's, so it is not a row; the attention still is."""
    rs = rows(db, "attn_150_copy")
    assert not any(r["name"] == "aten::copy_" for r in rs), rs
    top = [r for r in rs if r["rank"] == 1][0]
    assert (top["name"], top["scope"]) == (ATTN, OUTSIDE)


def test_without_moe_layers_the_whole_step_is_compared(db):
    rs = rows(db, "attn_150_dense")
    assert rs and {r["scope"] for r in rs} == {"whole step"} and {r["unit"] for r in rs} == {"step"}
    top = [r for r in rs if r["rank"] == 1][0]
    assert top["name"] == ATTN and 1.45 <= top["ratio"] <= 1.56


# ---------------------------------------------------------------- GPU: kernels by their launch


def _slow_attention_kernels(folder: Path, rank: int, factor: float) -> None:
    """One rank's attention kernels (kernel_unified_attention_*) ``factor`` x longer, in place
    (they then overlap the next kernel on the stream: each kernel stays an operator)."""
    path = folder / f"rank{rank}.pt.trace.json.gz"
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    n = 0
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and "unified_attention" in e["name"]:
            e["dur"] = round(e["dur"] * factor, 3)
            n += 1
    assert n
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)


@pytest.fixture(scope="module")
def gpu_db(tmp_path_factory):
    """tests/real_gpu_ep.py (a real vLLM decode step's kernels, DeepEP MoE layers on the device),
    4 ranks, 2 steps, seed 1: unchanged, and rank 1's attention kernels 1.5x / 1.05x."""
    import real_gpu_ep as rg

    d = tmp_path_factory.mktemp("op_diff_step_gpu")
    path = d / "g.duckdb"
    for run, factor in (("even", None), ("attn_150", 1.5), ("attn_105", 1.05)):
        rg.write_run(d / run, ranks=4, steps=2, seed=1)
        if factor is not None:
            _slow_attention_kernels(d / run, 1, factor)
        rep = ingest_paths(path, [d / run], run=run)
        assert all(f.status == "ok" for f in rep.files), run
    return path


def test_gpu_slow_attention_kernels_outside_the_moe_layers(gpu_db):
    rs = rows(gpu_db, "attn_150")
    mine = [r for r in rs if r["rank"] == 1 and r["scope"] == OUTSIDE]
    assert mine and all("unified_attention" in r["name"] for r in mine), mine
    assert all(1.45 <= r["ratio"] <= 1.55 and r["shapes"] == "shapes unknown" for r in mine)
    assert [r for r in rs if r["rank"] == 1][0]["scope"] == OUTSIDE  # its largest excess
    assert not [r for r in rs if r["rank"] != 1 and r["scope"] == OUTSIDE]


def test_gpu_near_miss_and_the_unchanged_run_name_nothing_outside(gpu_db):
    """At 1.05x nothing outside; on the unchanged run neither: kernels that start a nanosecond
    before the previous one on their stream ends (rounded timestamps) are not swallowed as its
    children (which made a GEMM kernel 1.97x the median rank on rank 2 of this run)."""
    assert [r for r in rows(gpu_db, "attn_105") if r["scope"] == OUTSIDE] == []
    assert [r for r in rows(gpu_db, "even") if r["scope"] == OUTSIDE] == []
    # the guard is the ratio: at 1.02 rank 1's attention kernels show (beside kernels the noise
    # puts 2-5 % above the median rank)
    low = [r for r in rows(gpu_db, "attn_105", min_step_ratio=1.02) if r["scope"] == OUTSIDE and r["rank"] == 1]
    attn = [r for r in low if "unified_attention" in r["name"]]
    assert attn and all(1.03 <= r["ratio"] <= 1.07 for r in attn), low
