"""expert-hotspots, eplb-effect and eplb-whatif: the verdict on every synthetic scenario."""

from __future__ import annotations

import pytest
import synth_experts as se

from slowcard import queries, store

QUERIES = ("expert-hotspots", "eplb-effect", "eplb-whatif")

# scenario -> expected status per query
EXPECTED = {
    "concentrated": {"expert-hotspots": "FAIL", "eplb-effect": "PASS", "eplb-whatif": "WARN"},
    "spread": {"expert-hotspots": "WARN", "eplb-effect": "PASS", "eplb-whatif": "PASS"},
    "spike": {"expert-hotspots": "PASS", "eplb-effect": "PASS", "eplb-whatif": "PASS"},
    # EPLB's swap spread the hot pair over two ranks: no re-placement gains more, but replicas of
    # the two hot experts would cut the peak by about 19 % (eplb-whatif v2 models replicas)
    "eplb_works": {"expert-hotspots": "WARN", "eplb-effect": "PASS", "eplb-whatif": "WARN"},
    "eplb_fails": {"expert-hotspots": "FAIL", "eplb-effect": "FAIL", "eplb-whatif": "WARN"},
    "slow_device": {"expert-hotspots": "PASS", "eplb-effect": "PASS", "eplb-whatif": "PASS"},
}

# extra runs: (run name, scenario, write_scenario options, the queries whose verdict the form can change)
VARIANTS = [
    ("eplb_works_csv", "eplb_works", {"load_format": "csv"}, ("eplb-effect",)),
    ("eplb_fails_csv", "eplb_fails", {"load_format": "csv"}, ("eplb-effect",)),
    ("eplb_works_npy", "eplb_works", {"load_format": "npy", "metrics": False}, QUERIES),
    ("eplb_fails_npy", "eplb_fails", {"load_format": "npy", "metrics": False}, QUERIES),
    (
        "eplb_fails_epoch_field",
        "eplb_fails",
        {"explicit_epoch": True, "map_ts": False, "metrics": False},
        ("eplb-effect",),
    ),
    (
        "eplb_works_epoch_field",
        "eplb_works",
        {"explicit_epoch": True, "map_ts": False, "metrics": False},
        ("eplb-effect",),
    ),
    ("concentrated_nomap", "concentrated", {"maps": False, "metrics": False}, ("expert-hotspots",)),
    ("spread_nomap", "spread", {"maps": False, "metrics": False}, ("expert-hotspots",)),
    ("spike_npy", "spike", {"load_format": "npy", "metrics": False}, ("expert-hotspots",)),
]


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    root = tmp_path_factory.mktemp("experts")
    db = root / "q.duckdb"
    runs = [(name, name, {}) for name in (*se.SCENARIOS, "one_hot")] + [v[:3] for v in VARIANTS]
    w = store.open_db(db)
    try:
        for run, name, opts in runs:
            rep = se.ingest(db, se.write_scenario(name, root / run, **opts), run=run, con=w)
            assert all(f.status == "ok" for f in rep.files), [(f.path, f.message) for f in rep.files]
    finally:
        w.close()
    c = store.open_db(db, read_only=True)
    yield c
    c.close()


@pytest.fixture(scope="module")
def catalog():
    return queries.load_catalog()


_RESULTS: dict = {}


def run(con, catalog, name, run_name, **params):
    """run_query, once per (connection, query, run, params): several tests read the same result."""
    key = (id(con), name, run_name, tuple(sorted(params.items())))
    if key not in _RESULTS:
        res = queries.run_query(con, catalog[name], run_name, params or None)
        assert res.status != "ERROR", res.summary
        _RESULTS[key] = res
    return _RESULTS[key]


def test_queries_parse_with_their_headers(catalog):
    for name in QUERIES:
        q = catalog[name]
        assert q.requires == ["expert_load"]
        assert q.version >= 1 and q.rule is not None and q.summary and q.pass_text


@pytest.mark.parametrize("scenario", list(EXPECTED))
@pytest.mark.parametrize("query", QUERIES)
def test_verdict_per_scenario(con, catalog, scenario, query):
    res = run(con, catalog, query, scenario)
    assert res.status == EXPECTED[scenario][query], res.summary


@pytest.mark.parametrize("run_name, scenario, _opts, qs", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_same_verdict_whatever_the_input_form(con, catalog, run_name, scenario, _opts, qs):
    """CSV, .npy per epoch, epochs given per window without map times, no expert map: same verdicts."""
    for query in qs:
        assert run(con, catalog, query, run_name).status == EXPECTED[scenario][query], query


def test_skip_without_expert_load(con, catalog):
    for q in QUERIES:
        assert run(con, catalog, q, "no_such_run").status == "SKIP"


# ------------------------------------------------------------------ expert-hotspots
def test_hotspots_names_layer_rank_and_expert_when_concentrated(con, catalog):
    res = run(con, catalog, "expert-hotspots", "concentrated")
    flagged = [r for r in res.rows if r["concentrated_hot_spot"]]
    assert {(r["layer"], r["expert"]) for r in flagged} == {(l, e) for l in range(se.LAYERS) for e in (4, 5)}
    assert all(
        r["ep_rank"] == 1
        and r["layer_hot_ranks"] == 1
        and r["rank_hot_layers"] == se.LAYERS
        and r["hot_windows"] == se.WINDOWS
        for r in flagged
    )
    assert "rank 1" in res.summary and "concentrated" in res.summary
    # the same without a map (default numbering rank * slots + slot gives the same ids)
    nomap = run(con, catalog, "expert-hotspots", "concentrated_nomap")
    assert [(r["layer"], r["expert"], r["ep_rank"]) for r in nomap.rows] == [
        (r["layer"], r["expert"], r["ep_rank"]) for r in res.rows
    ]


def test_hotspots_spread_and_spike(con, catalog):
    spread = run(con, catalog, "expert-hotspots", "spread")
    assert {r["expert"] for r in spread.rows} == {1, 5, 9, 13}
    assert all(
        r["persistent"] and not r["concentrated_hot_spot"] and r["layer_hot_ranks"] == se.RANKS for r in spread.rows
    )
    spike = run(con, catalog, "expert-hotspots", "spike")
    assert spike.rows and all(r["hot_windows"] == 1 and not r["persistent"] for r in spike.rows)
    assert {r["first_window"] for r in spike.rows} == {4}  # window 3 is the 4th of the run
    assert all("spike" in r["cause"] for r in spike.rows)


def test_hotspots_after_working_eplb_is_spread_now(con, catalog):
    res = run(con, catalog, "expert-hotspots", "eplb_works")
    by = {(r["layer"], r["expert"]): r for r in res.rows}
    r5 = by[(0, 5)]
    assert r5["ep_ranks_seen"] == "0,1" and r5["ep_rank"] == 0  # moved from rank 1 to rank 0
    assert r5["concentrated_windows"] == 3 and not r5["concentrated_hot_spot"]


def test_hotspots_top_n_and_thresholds(con, catalog):
    assert len(run(con, catalog, "expert-hotspots", "concentrated", top_n=3).rows) == 3
    # a higher hot ratio than any expert reaches: nothing is hot
    res = run(con, catalog, "expert-hotspots", "concentrated", hot_ratio=5.0)
    assert res.status == "PASS" and res.rows == [] and "5" in res.summary


# ------------------------------------------------------------------ eplb-effect
def test_eplb_effect_rows(con, catalog):
    works = run(con, catalog, "eplb-effect", "eplb_works")
    overall = works.rows[0]
    assert overall["scope"] == "overall" and overall["update"] == "epoch 0 -> 1"
    assert overall["par_before"] > 1.7 and overall["par_after"] < 1.35 and not overall["not_reduced"]
    assert overall["windows_before"] == 3 and overall["windows_after"] == 3
    assert overall["update_cost_ms"] == pytest.approx(se.UPDATE_COST_S * 1000)
    assert overall["still_hot_experts"] == " ".join(f"{l}:4,5" for l in range(se.LAYERS))
    assert len([r for r in works.rows if r["scope"] == "layer"]) == se.LAYERS

    fails = run(con, catalog, "eplb-effect", "eplb_fails")
    overall = fails.rows[0]
    assert overall["not_reduced"] and overall["still_hot_ranks"] == "1"
    assert "did not reduce" in overall["cause"] and "same ranks stay hot" in overall["cause"]
    # without metrics the cost is unknown, not zero
    npy = run(con, catalog, "eplb-effect", "eplb_fails_npy")
    assert npy.rows[0]["update_cost_ms"] is None and "unknown" in npy.rows[0]["update_cost_txt"]


def test_eplb_effect_par_matches_the_generator(con, catalog):
    sc = se.scenario("eplb_works")
    res = run(con, catalog, "eplb-effect", "eplb_works")
    for r in (r for r in res.rows if r["scope"] == "layer"):
        for epoch, col in ((0, "par_before"), (1, "par_after")):
            ws = [w for w in range(se.WINDOWS) if sc.epoch_of(w) == epoch]
            loads = [sum(sum(se.load_tensor(sc, w)[r["layer"]][rank]) for w in ws) for rank in range(se.RANKS)]
            assert r[col] == pytest.approx(max(loads) / (sum(loads) / len(loads)), abs=1e-3)


# ------------------------------------------------------------------ eplb-whatif
def greedy_max(loads: list[float], ranks: int, cap: int) -> float:
    """Reference greedy: heaviest first onto the least-loaded rank with a free slot."""
    rank_load, used = [0.0] * ranks, [0] * ranks
    for w in sorted(loads, reverse=True):
        r = min((i for i in range(ranks) if used[i] < cap), key=lambda i: (rank_load[i], i))
        rank_load[r] += w
        used[r] += 1
    return max(rank_load)


@pytest.mark.parametrize("scenario", ["concentrated", "spike", "eplb_fails"])
def test_whatif_matches_a_reference_greedy(con, catalog, scenario):
    sc = se.scenario(scenario)
    last_epoch = sc.epoch_of(se.WINDOWS - 1)
    ws = [w for w in range(se.WINDOWS) if sc.epoch_of(w) == last_epoch]
    res = run(con, catalog, "eplb-whatif", scenario)
    res = Result([r for r in res.rows if r["option"] == "re-place"])
    total_cur = total_new = 0.0
    for layer in range(se.LAYERS):
        expert = [sum(se.logical_tokens(sc, w, layer, e) for w in ws) for e in range(se.EXPERTS)]
        place = se.placement(sc, last_epoch)[layer]
        cur = max(sum(expert[e] for e in place[r]) for r in range(se.RANKS))
        new = min(greedy_max(expert, se.RANKS, se.SLOTS), cur)
        row = next(r for r in res.rows if r["layer"] == layer)
        assert row["saved_share"] == pytest.approx(1 - new / cur, abs=1e-4)
        total_cur += cur
        total_new += new
    overall = res.rows[0]
    assert overall["scope"] == "overall" and overall["windows"] == len(ws)
    assert overall["saved_share"] == pytest.approx(1 - total_new / total_cur, abs=1e-4)


def test_whatif_threshold_param(con, catalog):
    spike = run(con, catalog, "eplb-whatif", "spike")
    assert spike.rows[0]["option"] == "re-place"
    saved = spike.rows[0]["saved_share"]
    assert 0.05 < saved < 0.10
    assert run(con, catalog, "eplb-whatif", "spike", min_saving=0.05).status == "WARN"
    conc = run(con, catalog, "eplb-whatif", "concentrated")
    assert conc.rows[0]["saved_share"] == pytest.approx(0.3, abs=0.01) and conc.rows[0]["worth_rebalancing"]


class Result:
    def __init__(self, rows):
        self.rows = rows


def replicate_max(expert: list[float], place: list[list[int]], per_rank: int) -> tuple[float, dict[int, int]]:
    """Reference replication (eplb-whatif's 'replicate' option) on one layer: each redundant slot
    goes to the expert with the largest load per replica that a rank with a free redundant slot
    does not hold yet; the replica lands on the least-loaded such rank and the expert's load is
    split evenly among its replicas. Returns (busiest rank load, {expert: replicas} of the
    replicated experts)."""
    ranks = len(place)
    order = sorted(range(len(expert)), key=lambda e: (-expert[e], e))
    holders = {e: {r for r in range(ranks) if e in place[r]} for e in order}
    used = [0] * ranks

    def loads() -> list[float]:
        return [sum(expert[e] / len(h) for e, h in holders.items() if r in h) for r in range(ranks)]

    for _ in range(per_rank * ranks):
        free = {e: [r for r in range(ranks) if used[r] < per_rank and r not in holders[e]] for e in order}
        cand = [e for e in order if free[e] and expert[e] > 0]
        if not cand:
            break
        best = max(cand, key=lambda e: (expert[e] / len(holders[e]), -order.index(e)))
        load = loads()
        r = min(free[best], key=lambda i: (load[i], i))
        holders[best].add(r)
        used[r] += 1
    return max(loads()), {e: len(h) for e, h in holders.items() if len(h) > 1}


@pytest.mark.parametrize("scenario", ["concentrated", "spike", "eplb_works", "one_hot", "spread"])
def test_whatif_replicas_match_a_reference(con, catalog, scenario):
    sc = se.scenario(scenario)
    last_epoch = sc.epoch_of(se.WINDOWS - 1)
    ws = [w for w in range(se.WINDOWS) if sc.epoch_of(w) == last_epoch]
    res = run(con, catalog, "eplb-whatif", scenario)
    total_cur = total_new = 0.0
    for layer in range(se.LAYERS):
        expert = [float(sum(se.logical_tokens(sc, w, layer, e) for w in ws)) for e in range(se.EXPERTS)]
        place = se.placement(sc, last_epoch)[layer]
        cur = max(sum(expert[e] for e in place[r]) for r in range(se.RANKS))
        rep_max, reps = replicate_max(expert, place, 1)
        new = min(rep_max, cur)
        row = next(r for r in res.rows if r["layer"] == layer and r["option"] == "replicate")
        assert row["saved_share"] == pytest.approx(1 - new / cur, abs=1e-4)
        assert row["redundant_slots"] == sum(n - 1 for n in reps.values()) == se.RANKS
        assert {
            int(t.split("/E")[1].split(" x")[0]): int(t.split(" x")[1]) for t in row["replicas"].split(", ")
        } == reps
        total_cur += cur
        total_new += new
    overall = next(r for r in res.rows if r["scope"] == "overall" and r["option"] == "replicate")
    assert overall["saved_share"] == pytest.approx(1 - total_new / total_cur, abs=1e-4)
    assert overall["redundant_slots"] == se.RANKS  # per layer, as num_redundant_experts counts them


def test_whatif_one_hot_expert_needs_replicas_not_moves(con, catalog):
    """Issue 13: one expert at 5.6x the mean load outweighs a rank's fair share; re-placement
    saves almost nothing and says so, replicas of that expert cut the peak and the query WARNs."""
    hot = run(con, catalog, "expert-hotspots", "one_hot")
    assert hot.rows[0]["expert"] == 13 and hot.rows[0]["mean_hotness"] == pytest.approx(5.6, abs=0.15)
    res = run(con, catalog, "eplb-whatif", "one_hot")
    assert res.status == "WARN"
    by = {r["option"]: r for r in res.rows if r["scope"] == "overall"}
    assert not by["re-place"]["worth_rebalancing"] and by["re-place"]["saved_share"] < 0.05
    assert "cannot" in by["re-place"]["cause"] and "replicate" in by["re-place"]["next_step"]
    rep = by["replicate"]
    assert rep["worth_rebalancing"] and rep["saved_share"] >= 0.25
    assert rep["peak_rank"] == 3 and rep["after_par"] < by["re-place"]["after_par"] - 0.3
    # every layer gives expert 13 one replica per rank (4 = the rank count caps it)
    layers = [r for r in res.rows if r["scope"] == "layer" and r["option"] == "replicate"]
    assert len(layers) == se.LAYERS and all(r["replicas"].startswith(f"L{r['layer']}/E13 x4") for r in layers)
    assert "num_redundant_experts" in rep["next_step"]
    assert "replicate" in res.summary and "E13" in res.summary
    # without redundant slots the replicate option saves nothing and the verdict is PASS
    off = run(con, catalog, "eplb-whatif", "one_hot", redundant_per_rank=0)
    assert off.status == "PASS"
    assert all(r["saved_share"] < 0.05 and not r["replicas"] for r in off.rows if r["option"] == "replicate")


def test_whatif_moving_suffices_when_hot_experts_fit(con, catalog):
    """Two 4x experts on one rank: each fits in a rank's fair share, so a re-placement alone pays."""
    res = run(con, catalog, "eplb-whatif", "concentrated")
    by = {r["option"]: r for r in res.rows if r["scope"] == "overall"}
    assert by["re-place"]["worth_rebalancing"] and "re-balancing pays" in by["re-place"]["cause"]
    assert by["re-place"]["peak_rank"] == 1
    assert res.rows[0]["option"] == "re-place"  # the summary leads with the move
