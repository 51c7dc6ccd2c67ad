"""expert-hotspots, ep-hot-chain, eplb-effect and eplb-whatif stay quiet (or at WARN) when one of
their guards is missed (issue 33).

Each run is an expert-load tensor written with every number chosen (4 layers x 4 EP ranks x 4
slots, logical expert e on rank e // 4, 100 tokens a window with a small wobble unless the case
says otherwise), plus for ep-hot-chain a lock-step trace (tests/ep_lockstep.py) with each rank's
GroupedMatmul time given. Each test is named after the condition that keeps the verdict quiet;
the same run with only that guard loosened (or the one number that misses it changed) flags it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import ep_lockstep as ls  # noqa: E402
import synth_experts as se  # noqa: E402

from slowcard import queries, store  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

CATALOG = queries.load_catalog()
RANK1 = range(4, 8)  # the logical experts on EP rank 1


def base(w: int, layer: int, e: int) -> int:
    return 100 + (w * 7 + layer * 13 + e * 5) % 11 - 5


def hot(experts, factor: float = 4.0, windows=None):
    """Tokens: ``factor`` x base for ``experts`` in ``windows`` (default all), base elsewhere."""

    def tokens(w, layer, e):
        on = e in experts and (windows is None or w in windows)
        return int(round(base(w, layer, e) * factor)) if on else base(w, layer, e)

    return tokens


def _write_load(out: Path, tokens, windows: int = 6, epochs: list[int] | None = None) -> list[Path]:
    """expert_load.json of ``tokens(window, layer, expert)``, and the (default) expert map: one
    map from the start, or with ``epochs`` one map per epoch and each window's epoch in the load."""
    out.mkdir(parents=True, exist_ok=True)
    place = se.default_placement()
    tensors = [
        [[[tokens(w, layer, e) for e in place[layer][r]] for r in range(se.RANKS)] for layer in range(se.LAYERS)]
        for w in range(windows)
    ]
    paths = [se.write_load_json(out / "expert_load.json", tensors, [se.window_ts(w) for w in range(windows)], epochs)]
    if epochs is None:
        paths.append(se.write_json(out / "expert_map_epoch0.json", se.map_doc(place, ts_ns=se.T0_NS)))
    else:
        for e in sorted(set(epochs)):
            paths.append(se.write_json(out / f"expert_map_epoch{e}.json", se.map_doc(place)))
    return paths


def _trace(out: Path, gmm_us) -> list[Path]:
    """A 4-rank lock-step trace (4 steps x 4 layers); ``gmm_us(rank, step, layer)``."""
    return ls.write_run(out, lambda r, s, layer: ls.Cell(gmm_us=gmm_us(r, s, layer)))


def _slow_rank1(factor: float, where=lambda s, layer: True):
    return lambda r, s, layer: ls.GMM_US * (factor if r == 1 and where(s, layer) else 1.0)


def _par(x: float) -> int:
    """Tokens of each of rank 1's experts (the others 100) that give the layer peak/avg ``x``:
    4t / ((4t + 1200) / 4) = x."""
    return round(1200 * x / (16 - 4 * x))


def _epochs_load(before: dict, after: dict):
    """eplb-effect runs: windows 0-2 in epoch 0, 3-5 in epoch 1; rank 1's experts at the tokens
    giving ``before[layer]`` / ``after[layer]`` peak/avg, every other expert at exactly 100."""

    def tokens(w, layer, e):
        return _par((before if w < 3 else after)[layer]) if e in RANK1 else 100

    return tokens


CASES = {
    # expert-hotspots
    "hot_2_of_4": (hot({4, 5}, windows={2, 3}), 4, None, None),
    "hot_3_of_8": (hot({4, 5}, windows={5, 6, 7}), 8, None, None),
    "hot_3_of_6": (hot({4, 5}, windows={3, 4, 5}), 6, None, None),
    "hot_on_2_ranks": (hot({4, 9}), 6, None, None),
    # expert 4 at 2.5x, its rank-mates at half: a hot expert on a rank of average load
    "hot_on_a_cold_rank": (
        lambda w, layer, e: int(base(w, layer, e) * (2.5 if e == 4 else 0.5 if e in RANK1 else 1)),
        6,
        None,
        None,
    ),
    # 4 and 5 hot throughout, expert 9 (rank 2) too in windows 0-3: concentrated in 2 windows only
    "concentrated_late": (lambda w, layer, e: hot({4, 5} | ({9} if w < 4 else set()))(w, layer, e), 6, None, None),
    # concentrated in windows 0-3, spread over two ranks in window 4, 5 (or only 4)
    "spread_now": (lambda w, layer, e: hot({4, 5} | ({9} if w >= 4 else set()))(w, layer, e), 6, None, None),
    "spread_once": (lambda w, layer, e: hot({4, 5} | ({9} if w == 4 else set()))(w, layer, e), 6, None, None),
    # ep-hot-chain: load + trace
    "chain_hot_2_of_6": (hot({4, 5}, windows={0, 1}), 6, None, _slow_rank1(2.0)),
    "chain_slow_once": (hot({4, 5}), 6, None, _slow_rank1(2.0, lambda s, layer: (s, layer) == (2, 1))),
    "chain_gmm_125": (hot({4, 5}), 6, None, _slow_rank1(1.25)),
    "chain_spread_2_of_6": (hot({1, 5, 9, 13}, windows={0, 1}), 6, None, _slow_rank1(1.0)),
    # eplb-whatif: rank 1's experts 112 tokens, the others 100 (re-placing saves 8 %)
    "whatif_8pct": (lambda w, layer, e: 112 if e in RANK1 else 100, 6, None, None),
    # eplb-effect
    "eplb_16_to_15": (_epochs_load({k: 1.6 for k in range(4)}, {k: 1.5 for k in range(4)}), 6, "epochs", None),
    "eplb_layer_up_4pct": (
        _epochs_load({0: 1.5, 1: 1.6, 2: 1.6, 3: 1.6}, {0: 1.56, 1: 1.2, 2: 1.2, 3: 1.2}),
        6,
        "epochs",
        None,
    ),
}


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    d = tmp_path_factory.mktemp("restraint_experts")
    path = d / "ep.duckdb"
    w = store.open_db(path)
    try:
        for name, (tokens, windows, epochs, gmm) in CASES.items():
            paths = _write_load(d / name / "experts", tokens, windows, [0, 0, 0, 1, 1, 1] if epochs else None)
            if gmm is not None:
                paths += _trace(d / name / "trace", gmm)
            rep = ingest_paths(path, [str(p) for p in paths], run=name, con=w)
            assert all(f.status == "ok" for f in rep.files), [(f.path, f.message) for f in rep.files]
    finally:
        w.close()
    return path


def judge(db, query, case, **params):
    con = store.open_db(db, read_only=True)
    try:
        res = queries.run_query(con, CATALOG[query], case, params)
    finally:
        con.close()
    assert res.status != "ERROR", res.summary
    return res


def hotspots(db, case, **params):
    res = judge(db, "expert-hotspots", case, **params)
    return res.status, sorted((r["layer"], r["expert"]) for r in res.rows if r["concentrated_hot_spot"])


ALL_LAYERS_4_5 = [(layer, e) for layer in range(4) for e in (4, 5)]

# ------------------------------------------------------------------------- expert-hotspots


def test_hot_spot_persistence_needs_min_windows(db):
    # hot in 2 of 4 windows (half of them) on rank 1: a spike, not persistent
    assert hotspots(db, "hot_2_of_4") == ("PASS", [])
    assert hotspots(db, "hot_2_of_4", min_windows=2) == ("FAIL", ALL_LAYERS_4_5)


def test_hot_spot_persistence_needs_half_of_the_windows(db):
    # hot in 3 windows (min_windows), but 3 of 8; the same 3 windows of a 6-window run are half
    assert hotspots(db, "hot_3_of_8") == ("PASS", [])
    assert hotspots(db, "hot_3_of_6") == ("FAIL", ALL_LAYERS_4_5)


def test_concentration_needs_few_ranks(db):
    # experts 4 (rank 1) and 9 (rank 2) hot: persistent, but on 2 of 4 ranks (> 0.25 x 4)
    status, concentrated = hotspots(db, "hot_on_2_ranks")
    assert (status, concentrated) == ("WARN", [])
    status, concentrated = hotspots(db, "hot_on_2_ranks", few_ranks_share=0.5)
    assert status == "FAIL" and concentrated == [(layer, e) for layer in range(4) for e in (4, 9)]


def test_concentration_needs_the_holding_rank_to_be_hot(db):
    # expert 4 is 2.5x its layer's mean expert, but its rank-mates are at half: rank 1 carries its share
    res = judge(db, "expert-hotspots", "hot_on_a_cold_rank")
    assert res.status == "WARN" and {(r["expert"], r["persistent"]) for r in res.rows} == {(4, True)}
    assert hotspots(db, "hot_on_a_cold_rank", rank_hot_ratio=0.9) == ("FAIL", [(layer, 4) for layer in range(4)])


def test_fail_needs_min_windows_concentrated(db):
    # persistent throughout, concentrated only in the last 2 windows (spread over 2 ranks before)
    assert hotspots(db, "concentrated_late") == ("WARN", [])
    assert hotspots(db, "concentrated_late", min_windows=2) == ("FAIL", ALL_LAYERS_4_5)


def test_fail_needs_the_spot_still_concentrated_in_its_latest_window(db):
    """Concentrated in windows 0-3, spread over two ranks in 4-5 (an update that worked): WARN.
    Spread only in window 4 and concentrated again in 5: FAIL."""
    res = judge(db, "expert-hotspots", "spread_now")
    assert res.status == "WARN" and not any(r["concentrated_hot_spot"] for r in res.rows)
    assert {r["cause"] for r in res.rows if r["expert"] in (4, 5)} == {
        "persistent hot expert, no longer concentrated (spread over ranks now)"
    }
    assert hotspots(db, "spread_once") == ("FAIL", ALL_LAYERS_4_5)


# ------------------------------------------------------------------------- ep-hot-chain


def chain(db, case, **params):
    res = judge(db, "ep-hot-chain", case, **params)
    return res.status, [(r["rank"], r["finding"]) for r in res.rows]


def test_chain_hot_rank_needs_min_share_of_the_windows(db):
    # rank 1 is 2x slow in every layer instance, but its experts are hot in 2 of 6 windows only
    assert chain(db, "chain_hot_2_of_6") == ("WARN", [(1, "device-anomaly")])
    assert chain(db, "chain_hot_2_of_6", min_share=0.3) == ("FAIL", [(1, "ep-imbalance")])


def test_chain_slow_operator_needs_min_share_of_the_layer_instances(db):
    # rank 1 is hot throughout, but its GroupedMatmul is slow in 1 of 16 layer instances
    assert chain(db, "chain_slow_once") == ("WARN", [(1, "hot-rank-not-slow")])
    assert chain(db, "chain_slow_once", min_share=0.05) == ("FAIL", [(1, "ep-imbalance")])


def test_chain_slow_operator_needs_min_op_ratio(db):
    # rank 1 is hot throughout and its GroupedMatmul 1.25x the median rank's in every instance
    assert chain(db, "chain_gmm_125") == ("WARN", [(1, "hot-rank-not-slow")])
    assert chain(db, "chain_gmm_125", min_op_ratio=1.2) == ("FAIL", [(1, "ep-imbalance")])


def test_chain_spread_hot_experts_need_min_share_of_the_windows(db):
    # one hot expert per rank (no rank hotter), in 2 of 6 windows: not a persistent spread
    assert chain(db, "chain_spread_2_of_6") == ("PASS", [])
    status, rows = chain(db, "chain_spread_2_of_6", min_share=0.3)
    assert status == "WARN" and [f for _, f in rows] == ["hot-experts-spread"]


# ------------------------------------------------------------------------- eplb-whatif / eplb-effect


def test_whatif_warns_only_at_min_saving(db):
    res = judge(db, "eplb-whatif", "whatif_8pct")
    overall = {r["option"]: r for r in res.rows if r["scope"] == "overall"}
    assert res.status == "PASS" and overall["re-place"]["saved_pct"] == 8.0
    assert max(r["saved_pct"] for r in overall.values()) < 10
    loose = judge(db, "eplb-whatif", "whatif_8pct", min_saving=0.05)
    assert loose.status == "WARN" and [r["option"] for r in loose.rows if r["worth_rebalancing"]] == ["re-place"]


def test_an_update_counts_as_reducing_from_min_gain(db):
    # peak/avg 1.6 -> 1.5 in every layer: 6.25 % lower, more than min_gain (5 %)
    res = judge(db, "eplb-effect", "eplb_16_to_15")
    overall = next(r for r in res.rows if r["scope"] == "overall")
    assert res.status == "PASS" and (overall["par_before"], overall["par_after"]) == (1.6, 1.5)
    assert judge(db, "eplb-effect", "eplb_16_to_15", min_gain=0.1).status == "FAIL"


def test_a_layer_counts_as_worse_only_beyond_min_gain(db):
    # the update helps overall (1.575 -> 1.29); layer 0 goes 1.5 -> 1.56, 4 % up
    res = judge(db, "eplb-effect", "eplb_layer_up_4pct")
    layer0 = next(r for r in res.rows if r["layer"] == 0)
    assert res.status == "PASS" and (layer0["par_before"], layer0["par_after"]) == (1.5, 1.561)
    loose = judge(db, "eplb-effect", "eplb_layer_up_4pct", min_gain=0.03)
    assert loose.status == "WARN" and [r["layer"] for r in loose.rows if r["layer_worse"]] == [0]
