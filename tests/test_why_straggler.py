"""why-straggler (issue 42): a straggler's lateness traced to what it runs between collectives.

Runs from tests/synth_straggler.py (lock-step Kineto CPU traces, exact timings plus a 2 % seeded
jitter): rank 1 slow in attention (MoE normal), sleeping before its all-to-all send, or slow in
one CPU op; a mix of two causes; balanced runs; near misses at 1.05x. GPU runs from
tests/real_gpu_ep.py (the device lane): a host late before its MoE launches.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import synth_straggler  # noqa: E402
from conftest import ingest_ok, run_builtin  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.cli import app  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

CATALOG = queries.load_catalog()
runner = CliRunner()

# run -> write_run kwargs
RUNS = {
    "slow_attention": {"scenario": "slow_attention"},
    "host_sleep": {"scenario": "host_sleep"},
    "slow_op": {"scenario": "slow_op"},
    "mixed": {"scenario": "mixed"},
    "attention_105": {"scenario": "slow_attention", "factor": 1.05},
    "op_105": {"scenario": "slow_op", "factor": 1.05},
    "sleep_20us": {"scenario": "host_sleep", "sleep_us": 20.0},
    **{f"balanced_{s}": {"scenario": "balanced", "seed": s} for s in range(3)},
}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    d = tmp_path_factory.mktemp("straggler")
    path = d / "s.duckdb"
    for run, kw in RUNS.items():
        synth_straggler.write_run(d / run, **kw)
        ingest_ok(path, [d / run], run)
    return path


def rows(db, run, **params):
    return run_builtin(db, "why-straggler", run, params).rows


def first(db, run):
    rs = rows(db, run)
    assert rs, f"no late rank on {run}"
    assert {r["rank"] for r in rs} == {1}, rs
    return rs[0]


def test_slow_attention_is_named_with_its_ratio_and_share(db):
    r = first(db, "slow_attention")
    assert (r["item"], r["item_kind"]) == ("SelfAttention", "module")  # not its ops, not MoE_0
    assert 1.5 <= r["ratio"] <= 1.65
    assert r["share_pct"] >= 80 and r["cause"] == "SelfAttention"
    assert "attention" in r["reading"]
    # the rank's MoE work is normal: the MoE module carries none of its lateness
    assert not any(x["item"] == "MoE" for x in rows(db, "slow_attention", top_n=20))


def test_cost_is_the_lead_at_the_collectives_it_arrived_last_at(db):
    r = first(db, "slow_attention")
    # 12 all-to-alls, each reached 0.57 x 400 us late (+-2 % jitter); the all-reduces add at most jitter
    lead_ms = 12 * 0.57 * synth_straggler.ATTN_US / 1e3
    assert 0.9 * lead_ms <= r["cost_ms"] <= 1.15 * lead_ms
    assert r["others_wait_ms"] == pytest.approx(3 * r["cost_ms"], rel=0.01)
    assert r["last_collectives"] >= 12


def test_host_sleep_before_the_send_is_a_host_gap(db):
    r = first(db, "host_sleep")
    assert r["item_kind"] == "gap" and r["item"].startswith("host gaps")
    assert r["cause"] == r["item"] and r["share_pct"] >= 80
    assert "sleep" in r["reading"]
    # 11 segments of 150 us
    assert r["excess_us"] == pytest.approx(11 * 150, rel=0.1)


def test_slow_cpu_op_between_collectives(db):
    r = first(db, "slow_op")
    assert (r["item"], r["item_kind"]) == ("aten::_unique2", "op")
    assert 2.7 <= r["ratio"] <= 3.3 and r["cause"] == "aten::_unique2"


def test_two_causes_name_none_and_show_the_coverage(db):
    r = first(db, "mixed")
    # attention 228 us + sleep 150 us per segment: neither reaches 80 % of the lateness
    assert r["cause"] == "straggler"
    assert r["item"] == "SelfAttention" and 50 <= r["share_pct"] < 80
    assert "SelfAttention" in r["coverage"] and "host gaps" in r["coverage"]


@pytest.mark.parametrize("run", ["balanced_0", "balanced_1", "balanced_2"])
def test_nothing_is_named_on_a_balanced_run(db, run):
    assert rows(db, run) == []


@pytest.mark.parametrize("run", ["attention_105", "op_105", "sleep_20us"])
def test_near_misses_name_nothing(db, run):
    # 1.05x attention is ~1 % of the segments; 1.05x the op and a 20 us sleep less still
    assert rows(db, run) == []


def test_a_lower_lateness_bar_reaches_the_near_miss_but_names_no_cause_without_ratio(db):
    # with the lateness bar at 0.5 % the 1.05x attention rank is reported, and SelfAttention
    # carries its lateness, but at 1.05x (< min_ratio 1.1) it is not named as the cause
    rs = rows(db, "attention_105", min_late_pct=0.5)
    assert rs and rs[0]["rank"] == 1 and rs[0]["item"] == "SelfAttention"
    assert 1.02 <= rs[0]["ratio"] <= 1.08 and rs[0]["cause"] == "straggler"
    assert rows(db, "attention_105", min_late_pct=0.5, min_ratio=1.02)[0]["cause"] == "SelfAttention"


def test_diagnose_shows_the_item_on_the_straggler_card(db):
    res = runner.invoke(app, ["diagnose", "--db", str(db), "--run", "slow_attention"], env={"COLUMNS": "300"})
    assert res.exit_code in (0, 1), res.output
    card = res.output.split("rank 1 — straggler", 2)[2]
    # the card's why lines (one per why query with rows about it): why-op-diff v5's attention row
    # outside the MoE layers comes first (diagnosis order), then why-straggler's item
    why = card[card.index("why") : card.index("next")]
    assert "nn.Module: SelfAttention_0" in why.splitlines()[0] and ", outside MoE layers, " in why.splitlines()[0]
    assert re.search(
        r"\n +SelfAttention \(module\) 1\.(5[0-9]|6[0-5])x the peers' median, (8[0-9]|9[0-9]|1[0-9][0-9]) % of rank 1's lateness, cause: SelfAttention",
        why,
    ), why
    nxt = card[card.index("next") :]
    # the next step points at the query that answers, and not at ep-slow-rank, which PASSes here
    assert "why-straggler" in nxt and "attention kernels" in nxt
    assert "ep-slow-rank" not in nxt.split("\n\n")[0], nxt


def test_a_next_step_drops_a_pointer_only_to_a_query_that_passed():
    """The rule behind the card's next step: a clause ending by naming a query that PASSed goes;
    the same clause stays when that query FAILs, SKIPs or did not run, and a query named in
    brackets (part of its sentence) stays whatever its status."""
    from types import SimpleNamespace

    from slowcard.diagnosis import next_without_passed
    from slowcard.verdict import Status

    text = "read why-straggler's item (attention kernels, host / launch); inside its MoE layers, ep-slow-rank"

    def results(status):
        return {"ep-slow-rank": SimpleNamespace(status=status)}

    assert (
        next_without_passed(text, results(Status.PASS))
        == "read why-straggler's item (attention kernels, host / launch)"
    )
    for status in (Status.FAIL, Status.WARN, Status.SKIP, Status.ERROR):
        assert next_without_passed(text, results(status)) == text, status
    assert next_without_passed(text, {}) == text
    bracketed = "find the hot experts; rebalance or add redundant experts (ep-slow-rank)"
    assert next_without_passed(bracketed, results(Status.PASS)) == bracketed
    # a next step made only of such a clause is kept whole rather than emptied
    assert next_without_passed("see, ep-slow-rank", results(Status.PASS)) == "see, ep-slow-rank"


def test_a_rank_rarely_last_is_not_reported(db):
    # rank 1 arrives last at 15 of its 24 collectives (the all-to-alls, and some all-reduces by jitter)
    assert rows(db, "slow_attention", min_last_share=0.5)
    assert rows(db, "slow_attention", min_last_share=0.9) == []


@pytest.fixture(scope="module")
def gpu_db(tmp_path_factory):
    """GPU runs from the real vLLM decode step (tests/real_gpu_ep.py: real kernels per rank,
    DeepEP low-latency kernels around the expert GEMMs), 4 ranks, 2 steps: rank 2's host late by
    1 ms before each MoE dispatch launch, and the same run (same noise) without it."""
    import real_gpu_ep as rg

    d = tmp_path_factory.mktemp("straggler_gpu")
    path = d / "g.duckdb"
    for run, effects in (("late", {2: rg.Effect(late_us=1000)}), ("even", {})):
        rg.write_run(d / run, ranks=4, steps=2, seed=1, effects=effects)
        rep = ingest_paths(path, [d / run], run=run)
        assert all(f.status == "ok" for f in rep.files), run
    return path


def test_gpu_a_late_host_is_the_device_idle_gap_of_its_segments(gpu_db):
    """On a device trace the segments are the device lane's (the union of its streams): rank 2's
    device idles waiting for its host's launches, so the named item is the device gap, with the
    advice to look at the host, and the kernels themselves are at the peers' pace (ratio ~1)."""
    rs = rows(gpu_db, "late")
    assert {r["rank"] for r in rs} == {2}, rs
    top = rs[0]
    assert (top["item_kind"], top["item"]) == ("gap", "device idle (no kernel on any stream)")
    assert top["cause"] == top["item"] and top["ratio"] > 10
    assert "waits for its host" in top["reading"]
    # v4: the streams' own gaps follow (the host starves the whole device: both streams idle with it,
    # at lower ratios), then the kernels, at the peers' pace
    assert {r["item"] for r in rs[1:3]} == {"stream 7 idle", "stream 20 idle"}, rs
    assert all(r["ratio"] < top["ratio"] for r in rs[1:3])
    kernels = [r for r in rows(gpu_db, "late", top_n=20) if r["item_kind"] == "kernel"]
    assert kernels and all(0.9 < r["ratio"] < 1.1 for r in kernels), kernels
    assert top["cost_ms"] > 10


def test_guard_gpu_the_same_run_without_the_late_host_names_nothing(gpu_db):
    assert rows(gpu_db, "even") == []


def test_items_say_what_the_trace_could_be_read_from(db, gpu_db):
    """With nn.Module ranges (the CPU runs) the items list them; the GPU trace has none, and the
    rows say the reading falls back to kernels and gaps, and how to record modules."""
    cpu = first(db, "slow_attention")
    assert cpu["items_from"].startswith("items: module, "), cpu["items_from"]
    gpu = rows(gpu_db, "late")[0]
    assert gpu["items_from"].startswith("no nn.Module ranges in this trace: items are kernel, gap"), gpu["items_from"]
    assert "with_modules=True" in gpu["items_from"]


def test_the_straggler_card_carries_what_its_fix_saves(db, gpu_db):
    """straggler-rank v4 (issue 42 item 2): the card's cost is its lead at the collectives it
    arrived last at, the number why-straggler reports as what a fix saves, and on the GPU run the
    saving ep-slow-rank's replay finds for the same host-bound rank (within 2 %)."""
    con = queries.open_readonly(db)
    try:
        (card,) = queries.run_query(con, CATALOG["straggler-rank"], "slow_attention").rows
    finally:
        con.close()
    assert card["rank"] == 1 and card["cost_ms"] == first(db, "slow_attention")["cost_ms"] > 0
    assert 0 < card["cost_pct"] < 100 and card["others_wait_ms"] == pytest.approx(3 * card["cost_ms"], rel=1e-3)
    con = queries.open_readonly(gpu_db)
    try:
        (gcard,) = queries.run_query(con, CATALOG["straggler-rank"], "late").rows
        (ep,) = queries.run_query(con, CATALOG["ep-slow-rank"], "late").rows
    finally:
        con.close()
    assert (gcard["rank"], ep["rank"], ep["cause"]) == (2, 2, "host-bound")
    assert gcard["cost_ms"] == pytest.approx(ep["cost_ms"], rel=0.02)
