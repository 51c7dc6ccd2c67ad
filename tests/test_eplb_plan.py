"""`slowcard plan eplb` (issue 44): a new expert placement from the measured loads, written as
the expert map vLLM-Ascend / MindIE load, validated, replayed, and read back by `ingest`."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import synth_eplb  # noqa: E402
import synth_experts as se  # noqa: E402

from slowcard import eplb_plan as ep  # noqa: E402
from slowcard import queries  # noqa: E402
from slowcard.cli import app  # noqa: E402
from slowcard.errors import UsageError  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENT = "thirdparty/msinsight/test_data/expert_deployment/prefill_global_deployment.json"
HOTSPOT = "thirdparty/msinsight/test_data/expert_hotspot"

# 4 ranks x 5 slots, 16 experts: experts r*4..r*4+3 on rank r plus one redundant copy each
SMALL = [[r * 4 + s for s in range(4)] + [(r * 4 + 5) % 16] for r in range(4)]


def make_run(tmp_path: Path, place: list, weights: list, name: str = "r") -> Path:
    db = tmp_path / f"{name}.duckdb"
    paths = synth_eplb.write_run(tmp_path / name, place, weights)
    rep = ingest_paths(db, [str(p) for p in paths], run=name)
    assert all(f.status == "ok" for f in rep.files), [f.message for f in rep.files]
    return db


def loads_of(db: Path, run: str) -> ep.Loads:
    con = queries.open_readonly(db)
    try:
        return ep.read_loads(con, run)
    finally:
        con.close()


def map_rows(db: Path) -> list:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT layer, ep_rank, local_slot, expert FROM expert_map ORDER BY ALL").fetchall()


def plan_rows(doc: dict) -> list:
    return sorted(
        (ly["layer_id"], d["device_id"], s, e)
        for ly in doc["layer_list"]
        for d in ly["device_list"]
        for s, e in enumerate(d["device_expert"])
    )


@pytest.fixture
def small(tmp_path):
    """Three layers on SMALL: two skewed (a hot expert beside another heavy one on rank 0), one even."""
    w = [[100] * 16 for _ in range(3)]
    w[0][0], w[0][1] = 2000, 900
    w[1][5], w[1][6], w[1][7] = 1500, 800, 700
    db = make_run(tmp_path, [SMALL] * 3, w)
    return db, loads_of(db, "r")


# ------------------------------------------------------------------ planning and the map
def test_plan_cuts_the_peak_writes_a_sound_map_and_leaves_the_even_layer(small):
    db, loads = small
    assert (loads.n_experts, loads.slots_per_device, len(loads.layers)) == (16, 5, 3)
    p = ep.plan(loads)
    doc = ep.to_expert_map(p)
    assert ep.validate(doc, loads) == []
    by = {lp.layer: lp for lp in p.layers}
    for layer in (0, 1):
        assert by[layer].new_par < by[layer].current_par * 0.8, (layer, by[layer])
        assert not by[layer].kept and by[layer].moves > 0
    # the even layer cannot improve: left as it is, nothing moved
    assert by[2].kept and by[2].after == SMALL and by[2].moves == 0
    # the hot expert of layer 0 gets more copies
    assert 0 in by[0].replicas_added
    reps = {r.layer: r for r in ep.replay(doc, loads)}
    assert [round(reps[k].new_par, 6) for k in (0, 1, 2)] == [round(by[k].new_par, 6) for k in (0, 1, 2)]
    assert 0 < p.saved_share < 1


def test_replace_mode_keeps_the_copy_counts_and_replicate_mode_keeps_them_elsewhere(small):
    _, loads = small
    before = [sorted(e for d in lp for e in d) for lp in [SMALL] * 3]
    rep = ep.plan(loads, "replace")
    for lp, b in zip(rep.layers, before):
        assert sorted(e for d in lp.after for e in d) == b  # the same experts, the same number of copies
    repl = ep.plan(loads, "replicate")
    lp0 = repl.layers[0]
    assert sorted(e for d in lp0.after for e in d) != before[0]  # copies changed hands
    assert lp0.after[0][:4] == SMALL[0][:4]  # the hot rank keeps its own experts: only copies move
    assert ep.validate(ep.to_expert_map(repl), loads) == []


def test_move_cap_is_kept_per_layer_and_moves_fewer(small):
    _, loads = small
    free = ep.plan(loads)
    capped = ep.plan(loads, max_moves=2)
    assert max(lp.moves for lp in capped.layers) <= 2 < max(lp.moves for lp in free.layers)
    for lp in capped.layers[:2]:
        assert lp.new_max < lp.current_max  # still better than now
    assert ep.validate(ep.to_expert_map(capped), loads) == []
    # a cap smaller than the new slots --redundant-per-rank adds: refused, clearly
    with pytest.raises(UsageError, match="new slots"):
        ep.plan(loads, redundant_per_rank=2, max_moves=3)


def test_search_counts_its_moves_as_the_map_shows_them(small):
    # the budget is spent on real moves: a copy counted twice once left half a cap unused
    _, loads = small
    for ly in loads.layers[:2]:
        w = ly.expert_tokens(16)
        for budget in (1, 3, 6):
            st = ep._State(ly.placement, w, ly.placement)
            ep._search(st, True, True, budget, sum(w) / 20)
            assert st.moves == ep.moves_between(ly.placement, st.place) <= budget
        assert st.moves > 3  # the cap of 6 was used beyond 3


def test_more_redundant_slots_grow_every_device(small):
    _, loads = small
    p = ep.plan(loads, redundant_per_rank=2)
    assert p.slots_per_device == 6
    assert all(len(d) == 6 for lp in p.layers for d in lp.after)
    assert ep.validate(ep.to_expert_map(p), loads, 6) == []
    with pytest.raises(UsageError, match="keeps the 5 slots"):
        ep.plan(loads, "replace", redundant_per_rank=2)


# ------------------------------------------------------------------ the validator
def _problems(doc, loads, **kw):
    return ep.validate(doc, loads, **kw)


def test_validator_rejects_each_broken_invariant_and_only_that_one(small):
    _, loads = small
    p = ep.plan(loads)
    good = ep.to_expert_map(p)
    assert _problems(good, loads) == []
    lp0 = p.layers[0]
    w = loads.layers[0].expert_tokens(16)
    counts = {e: sum(e in d for d in lp0.after) for e in range(16)}
    dev0 = good["layer_list"][0]["device_list"]

    # expert lost: a single-copy expert's slot overwritten with an expert that device lacks
    lost = copy.deepcopy(good)
    devs = lost["layer_list"][0]["device_list"]
    d, s, e = next((i, s, e) for i, dv in enumerate(dev0) for s, e in enumerate(dv["device_expert"]) if counts[e] == 1)
    other = next(x for x in range(16) if x not in devs[d]["device_expert"] and counts[x] >= 1 and x != e)
    devs[d]["device_expert"][s] = other
    got = _problems(lost, loads)
    assert any(f"logical experts [{e}] are not placed" in m for m in got), got

    # slot overflow: one device with a sixth slot
    over = copy.deepcopy(good)
    dv = over["layer_list"][0]["device_list"][1]
    dv["device_expert"].append(next(x for x in range(16) if x not in dv["device_expert"]))
    got = _problems(over, loads)
    assert got and all("6 slots, expected 5" in m or "cold expert" in m for m in got), got
    assert any("6 slots, expected 5" in m for m in got)

    # duplicate on one device
    dup = copy.deepcopy(good)
    dv = dup["layer_list"][0]["device_list"][2]
    victim = dv["device_expert"][1]
    dv["device_expert"][1] = dv["device_expert"][0]
    got = _problems(dup, loads)
    assert any("twice on one device" in m for m in got), got
    assert counts[victim] > 1 or any("not placed" in m for m in got)

    # replica of a cold expert: a copy of a hot expert handed to the coldest expert instead
    cold = copy.deepcopy(good)
    coldest = min(range(16), key=lambda x: (w[x], x))
    devs = cold["layer_list"][0]["device_list"]
    hot = max((x for x in range(16) if counts[x] >= 2), key=lambda x: w[x])
    d = next(i for i, dv in enumerate(devs) if hot in dv["device_expert"] and coldest not in dv["device_expert"])
    devs[d]["device_expert"][devs[d]["device_expert"].index(hot)] = coldest
    got = _problems(cold, loads)
    assert len(got) == 1 and f"expert {coldest} gets 1 more" in got[0] and "cold expert" in got[0], got
    # near miss: the same slot handed to an expert heavier than a slot's share is no cold replica
    warm = copy.deepcopy(good)
    per_slot = sum(w) / 20
    devs = warm["layer_list"][0]["device_list"]
    heavy = next(
        x
        for x in sorted(range(16), key=lambda x: -w[x])
        if x != hot and x not in devs[d]["device_expert"] and w[x] / counts[x] >= per_slot
    )
    devs[d]["device_expert"][devs[d]["device_expert"].index(hot)] = heavy
    assert _problems(warm, loads) == []

    # devices: one missing, and a layer missing
    short = copy.deepcopy(good)
    short["layer_list"][0]["device_list"].pop()
    assert any("are not the 4 EP ranks" in m for m in _problems(short, loads))
    gone = copy.deepcopy(good)
    gone["layer_list"].pop()
    assert any("missing from layer_list" in m for m in _problems(gone, loads))


# ------------------------------------------------------------------ CLI and the round trip
def test_cli_writes_a_map_that_ingests_back_to_the_same_rows(small, tmp_path):
    db, _ = small
    out = tmp_path / "expert_map.json"
    res = CliRunner().invoke(app, ["plan", "eplb", "--db", str(db), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"wrote {out}: valid" in res.output and "% of MoE time saved" in res.output
    doc = json.loads(out.read_text())
    assert doc["moe_layer_count"] == 3 and {"layer_id", "device_count", "device_list"} <= set(doc["layer_list"][0])
    back = tmp_path / "back.duckdb"
    rep = ingest_paths(back, [str(out)], run="plan")
    assert (rep.files[0].format, rep.files[0].status) == ("expert_map", "ok")
    assert map_rows(back) == plan_rows(doc)
    # --check replays it: the same planned peak/avg
    chk = CliRunner().invoke(app, ["plan", "eplb", "--db", str(db), "--check", str(out), "--format", "json"])
    assert chk.exit_code == 0, chk.output
    wrote = CliRunner().invoke(
        app, ["plan", "eplb", "--db", str(db), "--out", str(tmp_path / "again.json"), "--format", "json"]
    )
    assert json.loads(chk.output)["peak_avg_planned"] == json.loads(wrote.output)["peak_avg_planned"]


def test_cli_check_rejects_a_broken_map_and_errors_are_clear(small, tmp_path):
    db, _ = small
    bad = se.write_json(tmp_path / "bad.json", se.map_doc([[[0, 0, 1, 2, 3]] + SMALL[1:]] * 3))
    res = CliRunner().invoke(app, ["plan", "eplb", "--db", str(db), "--check", str(bad)])
    assert res.exit_code == 1
    assert "twice on one device" in res.stderr and "problem(s)" in res.stderr
    res = CliRunner().invoke(app, ["plan", "eplb", "--db", str(db)])
    assert res.exit_code == 2 and "--out FILE" in res.stderr
    res = CliRunner().invoke(
        app,
        [
            "plan",
            "eplb",
            "--db",
            str(db),
            "--out",
            str(tmp_path / "x.json"),
            "--max-moves",
            "1",
            "--redundant-per-rank",
            "2",
        ],
    )
    assert res.exit_code == 2 and "--max-moves 1" in res.stderr and not (tmp_path / "x.json").exists()


def test_run_without_expert_loads_is_a_clear_error(tmp_db):
    with pytest.raises(UsageError, match="no expert-load windows"):
        ep.read_loads(queries.open_readonly(tmp_db), "nothing")


# ------------------------------------------------------------------ against DeepSeek EPLB
def test_at_least_as_good_as_deepseek_eplb_and_fewer_moves_under_a_cap(realdata):
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_eplb

    path = realdata / DEPLOYMENT
    if not path.exists():
        pytest.skip(f"{path} is absent")
    place = synth_eplb.placement_of(json.loads(path.read_text()))[:12]
    w = synth_eplb.expert_weights(len(place), 256, seed=7)
    res = bench_eplb.compare(place, w, 8, 8, 8)["rows"]
    glob = bench_eplb.compare(place, w, 1, 1, 8)["rows"]
    for r, g in zip(res, glob):
        assert r["ours"] <= min(r["deepseek"], g["deepseek"]) + 1e-9, (r, g)
        assert r["moves_capped"] <= 8 < r["moves_deepseek"]
        assert r["ours_capped"] < r["now"]


# ------------------------------------------------------------------ the real deployment
@pytest.fixture(scope="module")
def real_plan(tmp_path_factory):
    from conftest import REALDATA

    path = REALDATA / DEPLOYMENT
    if not path.exists():
        pytest.skip(f"{path} is absent (../shared/realdata not beside the checkout)")
    tmp = tmp_path_factory.mktemp("real44")
    place = synth_eplb.placement_of(json.loads(path.read_text()))
    db = make_run(tmp, place, synth_eplb.expert_weights(len(place), 256, seed=1), "deploy")
    out = tmp / "expert_map.json"
    res = CliRunner().invoke(app, ["plan", "eplb", "--db", str(db), "--out", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    return db, out, json.loads(res.output)


@pytest.mark.realdata
def test_real_deployment_map_loads_back_and_beats_every_layer_whatif_marks(real_plan, tmp_path):
    db, out, summary = real_plan
    assert (summary["layers"], summary["devices"], summary["slots_per_device"]) == (58, 64, 5)
    doc = json.loads(out.read_text())
    back = tmp_path / "back.duckdb"
    rep = ingest_paths(back, [str(out)], run="plan")
    assert rep.files[0].status == "ok", rep.files[0].message
    assert map_rows(back) == plan_rows(doc)
    con = queries.open_readonly(db)
    try:
        whatif = queries.run_query(con, queries.load_catalog()["eplb-whatif"], "deploy")
        loads = ep.read_loads(con, "deploy")
    finally:
        con.close()
    marked = {r["layer"] for r in whatif.rows if r["scope"] == "layer" and r["saved_share"] >= 0.10}
    assert len(marked) > 40
    reps = {r.layer: r for r in ep.replay(doc, loads)}
    assert all(reps[layer].new_par < reps[layer].current_par for layer in marked)
    # and at least as far as the better of whatif's two options on each of them
    best = {}
    for r in whatif.rows:
        if r["scope"] == "layer":
            best[r["layer"]] = min(best.get(r["layer"], 1e9), r["after_par"])
    assert all(reps[layer].new_par <= best[layer] + 1e-3 for layer in marked)


@pytest.mark.realdata
def test_real_hotspot_dumps_of_one_rank_leave_every_layer_as_it_is(realdata, tmp_db, tmp_path):
    d = realdata / HOTSPOT
    if not d.exists():
        pytest.skip(f"{d} is absent")
    ingest_paths(tmp_db, [d / "decode_0.csv", d / "model_gen_config.json"], run="hs")
    out = tmp_path / "m.json"
    res = CliRunner().invoke(app, ["plan", "eplb", "--db", str(tmp_db), "--out", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    # one rank (the dumps hold rank 0 only): nothing to balance, nothing moved
    assert (s["devices"], s["experts_moved"], s["moe_time_saved_pct"]) == (1, 0, 0.0)
    assert s["layers_kept"] == s["layers"] == len((d / "decode_0.csv").read_text().split())


@pytest.mark.realdata
def test_loads_of_one_rank_under_the_64_device_map_are_refused(realdata, tmp_db):
    # the real hot-spot dumps hold rank 0 (4 slots); the real deployment map places 64 devices x 5
    dep, hs = realdata / DEPLOYMENT, realdata / HOTSPOT
    if not dep.exists() or not hs.exists():
        pytest.skip(f"{dep} or {hs} is absent")
    ingest_paths(tmp_db, [dep, hs / "decode_0.csv", hs / "model_gen_config.json"], run="mixed")
    with pytest.raises(UsageError, match=r"no load for EP ranks \[1, 2, 3"):
        loads_of(tmp_db, "mixed")


def test_load_slots_the_map_lacks_are_refused(tmp_path):
    # loads of 4 ranks x 5 slots under a map of 4 ranks x 4 slots
    paths = synth_eplb.write_run(tmp_path / "x", [SMALL], [[100] * 16])
    se.write_json(paths[0], se.map_doc([[[r * 4 + s for s in range(4)] for r in range(4)]]))
    db = tmp_path / "x.duckdb"
    ingest_paths(db, [str(p) for p in paths], run="x")
    with pytest.raises(UsageError, match="slot 4, which the expert map in force lacks"):
        loads_of(db, "x")
