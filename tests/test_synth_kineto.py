"""Tests for the synthetic Kineto generators (tests/synth_kineto.py, bench/gen_kineto.py)."""

from __future__ import annotations

import collections
import gzip
import importlib.util
import json
import re
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synth_kineto as sk  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
REALDATA = Path(__file__).resolve().parents[1].parent / "shared" / "realdata"
REAL_EP = REALDATA / "kineto_cpu_ep4_hot1"

KEY_ORDER = [
    "schemaVersion",
    "deviceProperties",
    "trace_id",
    "record_shapes",
    "distributedInfo",
    "host_name",
    "displayTimeUnit",
    "baseTimeNanoseconds",
    "traceEvents",
    "traceName",
]
REGIONS = {"MoeGatingTopK", "MoeDistributeDispatch", "GroupedMatmul", "MoeDistributeCombine"}


def load(p: Path) -> dict:
    data = p.read_bytes()
    if p.name.endswith(".gz"):
        data = gzip.decompress(data)
    return json.loads(data.decode("utf-8-sig"))


def xs(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def by_name(doc: dict, name: str) -> list[dict]:
    return sorted((e for e in xs(doc) if e["name"] == name), key=lambda e: e["ts"])


def gmm_rows(doc: dict) -> int:
    """Rows seen by GroupedMatmul: sum of the first dim of its aten::mm inputs / 2 (two mm per expert)."""
    out = 0
    for g in by_name(doc, "GroupedMatmul"):
        for e in by_name(doc, "aten::mm"):
            if g["ts"] <= e["ts"] and e["ts"] + e["dur"] <= g["ts"] + g["dur"]:
                out += e["args"]["Input Dims"][0][0]
    return out // 2


def collectives(doc: dict, style: str = "gloo") -> list[dict]:
    if style == "gloo":
        return by_name(doc, "gloo:all_to_all")
    return sorted((e for e in xs(doc) if e["cat"] == "kernel" and "SendRecv" in e["name"]), key=lambda e: e["ts"])


@pytest.fixture(scope="module")
def skew_run(tmp_path_factory) -> list[dict]:
    d = tmp_path_factory.mktemp("skew")
    return [load(p) for p in sk.write_ep_run(d, scenario="token_skew", steps=2, layers=3)]


# ---------------------------------------------------------------------------------------------
# layout


def test_gloo_files_parse_with_kineto_layout(skew_run, tmp_path):
    for r, doc in enumerate(skew_run):
        assert list(doc) == KEY_ORDER
        di = doc["distributedInfo"]
        assert (di["backend"], di["rank"], di["world_size"], di["pg_count"]) == ("gloo", r, 4, 1)
        assert di["pg_config"] == [
            {
                "pg_name": "0",
                "pg_desc": "default_pg",
                "backend_config": "cpu:gloo,cuda:gloo",
                "pg_size": 4,
                "ranks": [0, 1, 2, 3],
            }
        ]
        assert doc["baseTimeNanoseconds"] == sk.BASE_TIME_NS
        assert doc["traceName"] == f"rank{r}.pt.trace.json"
    # uncompressed variant: every ts / dur is written with exactly 3 decimals, µs since the base
    p = sk.write_ep_run(tmp_path, ranks=2, steps=1, layers=1, gz=False)[0]
    text = p.read_text()
    ts = re.findall(r'"(ts|dur)": ([0-9.]+)', text)
    assert ts and all(re.fullmatch(r"\d+\.\d{3}", v) for _, v in ts)
    assert text.startswith(' {\n    "schemaVersion": 1,') and text.endswith('"traceName": "rank0.pt.trace.json" }')


def test_region_nesting_and_split_sizes(skew_run):
    H = sk.HIDDEN
    for _r, doc in enumerate(skew_run):
        main = [e for e in xs(doc) if e["tid"] == doc["traceEvents"][0]["pid"]]
        steps = [e for e in main if e["name"].startswith("decode_step_")]
        layers = [e for e in main if e["name"].startswith("moe_layer_")]
        assert [e["name"] for e in steps] == ["decode_step_0", "decode_step_1"]
        assert len(layers) == 6
        for lay in layers:
            assert any(s["ts"] <= lay["ts"] and lay["ts"] + lay["dur"] <= s["ts"] + s["dur"] for s in steps)
            inside = [e for e in main if lay["ts"] < e["ts"] and e["ts"] + e["dur"] <= lay["ts"] + lay["dur"]]
            regions = [e for e in inside if e["name"] in REGIONS]
            assert [e["name"] for e in sorted(regions, key=lambda e: e["ts"])] == [
                "MoeGatingTopK",
                "MoeDistributeDispatch",
                "GroupedMatmul",
                "MoeDistributeCombine",
            ]
            disp = next(e for e in regions if e["name"] == "MoeDistributeDispatch")
            comb = next(e for e in regions if e["name"] == "MoeDistributeCombine")
            gmm = next(e for e in regions if e["name"] == "GroupedMatmul")

            def within(reg, name):
                return sorted(
                    (
                        e
                        for e in inside  # noqa: B023 (called in this iteration)
                        if e["name"] == name and reg["ts"] <= e["ts"] and e["ts"] + e["dur"] <= reg["ts"] + reg["dur"]
                    ),
                    key=lambda e: e["ts"],
                )

            count_x, data_x = within(disp, "c10d::alltoall_base_")
            assert count_x["args"]["Concrete Inputs"][3:5] == ["[]", "[]"]
            out_s = json.loads(data_x["args"]["Concrete Inputs"][3])
            in_s = json.loads(data_x["args"]["Concrete Inputs"][4])
            assert sum(in_s) == 256 and len(out_s) == len(in_s) == 4
            assert data_x["args"]["Input Dims"][:2] == [[sum(out_s), H], [sum(in_s), H]]
            (comb_x,) = within(comb, "c10d::alltoall_base_")
            assert comb_x["args"]["Concrete Inputs"][3:5] == [json.dumps(in_s), json.dumps(out_s)]
            mms = within(gmm, "aten::mm")
            assert all(m["args"]["Input Dims"][1] == [H, H] for m in mms)
            assert sum(m["args"]["Input Dims"][0][0] for m in mms) == 2 * sum(out_s)
        # every gloo collective runs on one of the two gloo threads, never on the main thread
        g = by_name(doc, "gloo:all_to_all")
        assert len(g) == 3 * 6 and len({e["tid"] for e in g}) == 2
        assert doc["traceEvents"][0]["pid"] not in {e["tid"] for e in g}


def test_event_counts_match_docstring(tmp_path):
    for style in ("gloo", "nccl"):
        docs = [load(p) for p in sk.write_ep_run(tmp_path / style, ranks=3, steps=2, layers=2, style=style)]
        for doc in docs:
            ph = collections.Counter(e["ph"] for e in doc["traceEvents"])
            a = len([e for e in by_name(doc, "aten::mm") if e["args"]["Input Dims"][1] == [256, 256]]) // 2
            per = sk.ep_event_counts(style, 4)
            assert a == 2 * 2 * 4  # every expert got rows, 4 blocks
            n_blocks = 4
            x = 1 + 2 + n_blocks * (per["main_X"] + per["gloo_X"] + per["kernel_X"])
            assert ph["X"] == x
            assert ph["M"] == (12 if style == "gloo" else 13) and ph["i"] == 2
            assert ph.get("s", 0) == ph.get("f", 0) == n_blocks * per["s"]


def test_deterministic_bytes(tmp_path):
    kw = dict(ranks=2, steps=2, layers=2, scenario="noisy", noise=0.1)
    a = [p.read_bytes() for p in sk.write_ep_run(tmp_path / "a", seed=7, **kw)]
    b = [p.read_bytes() for p in sk.write_ep_run(tmp_path / "b", seed=7, **kw)]
    c = [p.read_bytes() for p in sk.write_ep_run(tmp_path / "c", seed=8, **kw)]
    assert a == b and a != c
    u1 = [p.read_bytes() for p in sk.write_ep_run(tmp_path / "u1", gz=False, style="nccl", **kw)]
    u2 = [p.read_bytes() for p in sk.write_ep_run(tmp_path / "u2", gz=False, style="nccl", **kw)]
    assert u1 == u2


def test_bad_arguments_raise(tmp_path):
    with pytest.raises(ValueError, match="scenario"):
        sk.write_ep_run(tmp_path, scenario="nope")
    with pytest.raises(ValueError, match="slow_rank"):
        sk.write_ep_run(tmp_path, ranks=2, slow_rank=2)
    with pytest.raises(ValueError, match="clock_offsets_us"):
        sk.write_ep_run(tmp_path, ranks=2, clock_offsets_us={5: 1.0})


# ---------------------------------------------------------------------------------------------
# time model


def test_collectives_are_synchronous(skew_run):
    colls = [collectives(d) for d in skew_run]
    assert len({len(c) for c in colls}) == 1
    for k in range(len(colls[0])):
        starts = [c[k]["ts"] for c in colls]
        ends = [c[k]["ts"] + c[k]["dur"] for c in colls]
        last = max(starts)
        # everyone leaves after the last arrival by its own transfer time only (20-400 µs here),
        # so a fast rank's duration = its wait + its transfer
        assert all(20.0 <= e - last <= 400.0 for e in ends), (k, [e - last for e in ends])
        waits = [c[k]["dur"] - (e - last) for c, e in zip(colls, ends)]
        assert all(abs(w - (last - s)) < 1e-3 for w, s in zip(waits, starts))


def test_token_skew_slow_rank_has_most_rows_and_shortest_combine(skew_run):
    rows = [gmm_rows(d) for d in skew_run]
    assert max(range(4), key=rows.__getitem__) == 1
    others = statistics.mean(rows[r] for r in (0, 2, 3))
    assert 3.0 <= rows[1] / statistics.mean(rows) <= 4.0 and rows[1] > 10 * others
    comb = [[c for i, c in enumerate(collectives(d)) if i % 3 == 2] for d in skew_run]
    mean_dur = [statistics.mean(e["dur"] for e in c) for c in comb]
    assert min(range(4), key=mean_dur.__getitem__) == 1
    assert all(mean_dur[r] > 5 * mean_dur[1] for r in (0, 2, 3))
    for k in range(len(comb[0])):  # rank 1 arrives last at every combine
        assert max(range(4), key=lambda r: comb[r][k]["ts"]) == 1


@pytest.mark.parametrize("scenario", ["balanced", "slow_compute", "slow_link", "noisy", "spike"])
def test_scenario_signatures(tmp_path, scenario):
    steps, layers = 3, 3
    docs = [
        load(p) for p in sk.write_ep_run(tmp_path, scenario=scenario, steps=steps, layers=layers, slow_rank=2, seed=1)
    ]
    rows = [gmm_rows(d) for d in docs]
    assert max(rows) < 1.1 * min(rows)  # routing is even in all of these
    gmm = [[e["dur"] for e in by_name(d, "GroupedMatmul")] for d in docs]
    mean_gmm = [statistics.mean(g) for g in gmm]
    others = [r for r in range(4) if r != 2]
    disp = [statistics.mean(e["dur"] for i, e in enumerate(collectives(d)) if i % 3 == 1) for d in docs]
    comb = [statistics.mean(e["dur"] for i, e in enumerate(collectives(d)) if i % 3 == 2) for d in docs]
    if scenario == "slow_compute":
        assert all(2.5 < mean_gmm[2] / mean_gmm[r] < 3.5 for r in others)
        assert all(comb[2] * 5 < comb[r] for r in others)
    elif scenario == "slow_link":
        assert max(mean_gmm) < 1.1 * min(mean_gmm)
        assert all(disp[2] > 2 * disp[r] for r in others)
        # the slow rank is never waited on for compute: its GMM ends are not late, its transfer is
        assert max(comb) < 1.3 * min(comb)
    elif scenario == "spike":
        s, l = sk.spike_position(steps, layers)
        med = statistics.median(gmm[2])
        big = [i for i, d in enumerate(gmm[2]) if d > 3 * med]
        assert big == [s * layers + l]
        assert all(max(gmm[r]) < 1.3 * statistics.median(gmm[r]) for r in others)
    else:  # balanced / noisy: no persistent anomaly
        assert max(mean_gmm) < 1.15 * min(mean_gmm)
        assert max(comb) < 3 * min(comb)
        spread = [max(g) / min(g) for g in gmm]
        if scenario == "noisy":
            assert max(spread) > 1.08
        else:
            assert max(spread) < 1.1


def test_clock_offsets_shift_every_ts(tmp_path):
    kw = dict(scenario="slow_compute", steps=1, layers=2, gz=False)
    base = sk.write_ep_run(tmp_path / "a", **kw)
    shifted = sk.write_ep_run(tmp_path / "b", clock_offsets_us={2: 40_000, 3: 40_000}, **kw)
    for r in (0, 1):
        assert base[r].read_bytes() == shifted[r].read_bytes()
    for r in (2, 3):
        a, b = load(base[r]), load(shifted[r])
        assert a["host_name"] == "node0" and b["host_name"] == "node1"
        pairs = list(zip(a["traceEvents"], b["traceEvents"]))
        assert len(pairs) == len(a["traceEvents"]) == len(b["traceEvents"])
        for ea, eb in pairs:
            assert round(eb["ts"] - ea["ts"], 3) == 40_000.0
            assert ea.get("dur") == eb.get("dur")


def test_nccl_style_has_collective_args(tmp_path):
    docs = [load(p) for p in sk.write_ep_run(tmp_path, style="nccl", scenario="token_skew", steps=1, layers=2)]
    for r, doc in enumerate(docs):
        assert doc["distributedInfo"]["backend"] == "nccl"
        assert len(doc["deviceProperties"]) == 4
        ks = collectives(doc, "nccl")
        assert len(ks) == 6
        for i, k in enumerate(ks):
            a = k["args"]
            assert k["name"] == "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
            assert k["pid"] == r and k["tid"] == 20 and a["device"] == r
            assert a["Process Group Name"] == "0" and a["Process Group Ranks"] == "[0, 1, 2, 3]"
            assert a["Group size"] == 4 and a["Seq"] == i + 1
            if i % 3 == 0:
                assert (a["Collective name"], a["In split size"], a["Out split size"]) == ("all_to_all", "[]", "[]")
            else:
                assert a["Collective name"] == "all_to_allv"
                ins, outs = json.loads(a["In split size"]), json.loads(a["Out split size"])
                assert len(ins) == len(outs) == 4
                assert a["In msg nelems"] == sum(ins) * sk.HIDDEN
        rpc = by_name(doc, "record_param_comms")
        assert len(rpc) == 6
        for k, c in zip(ks, rpc):
            assert k["args"]["External id"] == c["args"]["External id"]
            for key in ("Collective name", "In split size", "Out split size", "Seq", "Process Group Ranks"):
                assert k["args"][key] == c["args"][key]
        flows_s = {e["id"] for e in doc["traceEvents"] if e["ph"] == "s"}
        flows_f = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f"}
        assert flows_s == set(flows_f) and all(e["bp"] == "e" for e in flows_f.values())
    rows = [gmm_rows(d) for d in docs]
    comb = [statistics.mean(e["dur"] for i, e in enumerate(collectives(d, "nccl")) if i % 3 == 2) for d in docs]
    assert max(range(4), key=rows.__getitem__) == 1 and min(range(4), key=comb.__getitem__) == 1


def test_events_per_rank_padding(tmp_path):
    docs = [load(p) for p in sk.write_ep_run(tmp_path, ranks=2, steps=1, layers=2, events_per_rank=3000)]
    for doc in docs:
        n = len(doc["traceEvents"])
        assert 3000 <= n <= 3000 + 2
        fill = [
            e
            for e in xs(doc)
            if e["name"] in sk.FILLER_NAMES and e["args"]["Input Dims"] == [[256, 256], [256, 256], []]
        ]
        assert len(fill) > 2500
        layers = by_name(doc, "moe_layer_0") + by_name(doc, "moe_layer_1")
        assert all(any(l["ts"] < f["ts"] and f["ts"] + f["dur"] < l["ts"] + l["dur"] for l in layers) for f in fill)
        ids = [e["args"]["External id"] for e in xs(doc) if e["cat"] in ("cpu_op", "user_annotation")]
        assert len(ids) == len(set(ids))


# ---------------------------------------------------------------------------------------------
# header variants


def test_header_variants(tmp_path):
    files = sk.write_kineto_header_variants(tmp_path)
    assert set(files) == set(sk.HEADER_VARIANTS)
    for name, p in files.items():
        spec = sk.HEADER_VARIANTS[name]
        raw = p.read_bytes()
        assert (raw[:2] == b"\x1f\x8b") == spec["gz"]
        body = gzip.decompress(raw) if spec["gz"] else raw
        assert body.startswith(b"\xef\xbb\xbf") == spec["bom"]
        doc = json.loads(body.decode("utf-8-sig"))
        keys = list(doc)
        assert keys[-1] == "traceName"
        ti, di = keys.index("traceEvents"), keys.index("distributedInfo")
        assert (di > ti) == (spec["dist_position"] == "after")
        assert ("baseTimeNanoseconds" in doc) == spec["base_time"]
        dist = doc["distributedInfo"]
        assert (dist["rank"], dist["world_size"]) == (sk.VARIANT_RANK, sk.VARIANT_WORLD)
        if spec["dist_position"] == "after":
            assert dist["pg_config"][0]["ranks"] == "[0, 1]" and "nccl_version" in dist
        ev = doc["traceEvents"]
        assert dict(collections.Counter(e["ph"] for e in ev)) == sk.VARIANT_PH_COUNTS
        assert {e["name"] for e in ev if e["ph"] == "X"} == set(sk.VARIANT_NAMES)
        first = next(e for e in ev if e["ph"] == "X")
        assert first["name"] == "decode_step_0"
        if spec["base_time"]:
            assert doc["baseTimeNanoseconds"] + round(first["ts"] * 1000) == sk.VARIANT_FIRST_X_NS
        else:
            assert first["ts"] * 1000 == sk.VARIANT_FIRST_X_NS // 1000 * 1000
        mem = next(e for e in ev if e.get("name") == "[memory]")
        cpy = next(e for e in ev if e.get("cat") == "gpu_memcpy")
        assert mem["args"]["Bytes"] == 4096 and cpy["args"]["bytes"] == 1048576
        assert mem["args"]["Addr"] > 2**64
        assert by_name(doc, "record_param_comms")[0]["args"]["Comms Id"] > 2**64
        pids = {e.get("pid") for e in ev}
        assert {"Spans", "Traces", ""} <= pids
        f = next(e for e in ev if e["ph"] == "f")
        assert f["bp"] == "e"
    assert b"\n" not in files["compact.json"].read_bytes().strip()
    assert gzip.decompress(files["indented.json.gz"].read_bytes()).count(b"\n") > 200


# ---------------------------------------------------------------------------------------------
# against the real run


@pytest.mark.realdata
def test_mirrors_the_real_ep_run(skew_run):
    if not REAL_EP.is_dir():
        pytest.skip(f"real data not found at {REAL_EP}")
    real = load(REAL_EP / "rank1.pt.trace.json.gz")
    syn = skew_run[1]
    assert list(real) == list(syn)
    assert real["baseTimeNanoseconds"] == syn["baseTimeNanoseconds"]
    rdi, sdi = real["distributedInfo"], syn["distributedInfo"]
    assert list(rdi) == list(sdi) and list(rdi["pg_config"][0]) == list(sdi["pg_config"][0])

    def shape(doc):
        ev = doc["traceEvents"]
        return {
            "M": collections.Counter(e["name"] for e in ev if e["ph"] == "M"),
            "i": sorted(e["name"] for e in ev if e["ph"] == "i"),
            "ua": {re.sub(r"\d+$", "N", e["name"]) for e in xs(doc) if e["cat"] == "user_annotation"},
            "a2a_keys": [list(e["args"]) for e in by_name(doc, "c10d::alltoall_base_")[:1]],
            "gloo_keys": [list(e["args"]) for e in by_name(doc, "gloo:all_to_all")[:1]],
            "ua_keys": [list(e["args"]) for e in by_name(doc, "GroupedMatmul")[:1]],
            "a2a_per_layer": len(by_name(doc, "c10d::alltoall_base_"))
            / len([e for e in xs(doc) if e["name"].startswith("moe_layer_")]),
            "spans": [(e["pid"], e["tid"]) for e in ev if e.get("cat") == "Trace"],
        }

    rs, ss = shape(real), shape(syn)
    assert rs == ss
    # the real rank 1 is the hot rank too: its GroupedMatmul rows dominate, as in token_skew
    assert gmm_rows(real) > 3 * gmm_rows(load(REAL_EP / "rank0.pt.trace.json.gz"))


# ---------------------------------------------------------------------------------------------
# bench generator


def _bench():
    spec = importlib.util.spec_from_file_location("gen_kineto", REPO / "bench" / "gen_kineto.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_generator_single_file(tmp_path, capsys):
    g = _bench()
    out = tmp_path / "big.pt.trace.json"
    assert g.main(["--out", str(out), "--mb", "1", "--gz", "--world", "4", "--seed", "3"]) == 0
    p = tmp_path / "big.pt.trace.json.gz"
    raw = gzip.decompress(p.read_bytes())
    assert 0.9e6 < len(raw) < 2.5e6
    doc = json.loads(raw)
    assert list(doc)[0] == "schemaVersion" and list(doc)[-1] == "traceName"
    assert doc["distributedInfo"]["rank"] == 0 and doc["distributedInfo"]["world_size"] == 4
    ev = doc["traceEvents"]
    assert 200 < len(raw) / len(ev) < 400  # ~300 B/event
    cats = collections.Counter(e.get("cat") for e in ev)
    for c in (
        "python_function",
        "cpu_op",
        "cuda_runtime",
        "kernel",
        "gpu_memcpy",
        "ac2g",
        "cpu_instant_event",
        "user_annotation",
    ):
        assert cats[c] > 0, c
    assert {e["name"] for e in xs(doc)} >= REGIONS | {"record_param_comms", "moe_layer_0", "decode_step_0"}
    assert any(ord(ch) > 127 for e in ev for ch in e.get("name", ""))
    rpc = by_name(doc, "record_param_comms")[0]["args"]
    assert 2**61 <= rpc["Comms Id"] < 2**62 and rpc["Collective name"] == "all_to_allv"
    assert any(e.get("name") == "[memory]" and "Bytes" in e["args"] for e in ev)
    assert raw.startswith(b'\n  {\n    "schemaVersion": 1,') and b'\n  {\n    "ph": "X", "cat": ' in raw
    # deterministic
    out2 = tmp_path / "again.pt.trace.json"
    g.main(["--out", str(out2), "--mb", "1", "--world", "4", "--seed", "3"])
    assert out2.read_bytes().replace(b"again.pt", b"big.pt") == raw


def test_bench_generator_multi_rank(tmp_path, capsys):
    g = _bench()
    assert g.main(["--ranks", "3", "--events-per-rank", "4000", "--out-dir", str(tmp_path)]) == 0
    docs = [load(tmp_path / f"rank{r}.pt.trace.json") for r in range(3)]
    for r, doc in enumerate(docs):
        assert doc["distributedInfo"]["rank"] == r
        assert 2500 < len(doc["traceEvents"]) < 5500
    ks = [collectives(d, "nccl") for d in docs]
    comb = [[k for i, k in enumerate(x) if i % 2 == 1] for x in ks]
    for i in range(len(comb[0])):  # token_skew: rank 1 arrives last
        assert max(range(3), key=lambda r: comb[r][i]["ts"]) == 1
        assert {c[i]["args"]["Seq"] for c in comb} == {comb[0][i]["args"]["Seq"]}
