"""Ingest of expert-load tensors (JSON, CSV, .npy), expert maps and Prometheus scrapes."""

from __future__ import annotations

import gzip
import json
import shutil
import struct
import sys
from pathlib import Path

import pytest
import synth_experts as se

from slowcard import store
from slowcard.errors import InputError
from slowcard.ingest import detect
from slowcard.ingest.base import Context, IngestOptions
from slowcard.ingest.experts import READER


@pytest.fixture(scope="module")
def template_db(tmp_path_factory):
    """An empty database with the schema applied, created once: creating the schema costs
    seconds, copying the file milliseconds."""
    path = tmp_path_factory.mktemp("template") / "empty.duckdb"
    store.open_db(path).close()
    return path


@pytest.fixture
def db(tmp_path, template_db):
    path = tmp_path / "t.duckdb"
    shutil.copyfile(template_db, path)
    return path


def bare_context(path, fmt):
    """A Context without a database, for inputs refused before any row is written."""
    return Context(Path(path), fmt, 1, "r", None, IngestOptions())


def ingest_one(db, path, run="r"):
    rep = se.ingest(db, [path], run)
    assert len(rep.files) == 1
    return rep.files[0]


def rows(db, sql, params=None):
    con = store.open_db(db, read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def source_counts(db, path):
    return rows(
        db,
        "SELECT rows_seen, rows_kept, rows_dropped, status, message FROM sources WHERE path = ?",
        [str(Path(path).resolve())],
    )[0]


def drops(db, path):
    return rows(
        db,
        """SELECT reason, position, n_rows FROM source_drops JOIN sources USING (source_id)
                       WHERE path = ? ORDER BY position""",
        [str(Path(path).resolve())],
    )


def tensors(name="concentrated"):
    sc = se.scenario(name)
    return [se.load_tensor(sc, w) for w in range(se.WINDOWS)]


def stored_cells(db, run="r"):
    return {
        (w, l, r, s): t
        for w, l, r, s, t in rows(
            db, "SELECT window_idx, layer, ep_rank, local_slot, tokens FROM expert_load WHERE run = ?", [run]
        )
    }


def expected_cells(ts):
    return {
        (w, l, r, s): float(v)
        for w, t in enumerate(ts)
        for l, layer in enumerate(t)
        for r, slots in enumerate(layer)
        for s, v in enumerate(slots)
    }


# ------------------------------------------------------------------ sniffing
@pytest.mark.parametrize(
    "content, fmt",
    [
        (b'{"kind": "expert_load", "windows": []}', "expert_load_json"),
        (b"\xef\xbb\xbf  [[[1, 2], [3, 4]]]", "expert_load_json"),
        (b"[[[[1]]]]", "expert_load_json"),
        (b'{"moe_layer_count": 2, "layer_list": [{"layer_id": 0, "device_list": []}]}', "expert_map"),
        (b"window,layer,rank,local_expert,tokens\n0,0,0,0,5\n", "expert_load_csv"),
        (b"layer\tep_rank\tlocal_slot\tload\n0\t0\t0\t5\n", "expert_load_csv"),
        (b"\x93NUMPY\x01\x00", "expert_load_npy"),
        (b"# HELP x y\n# TYPE x gauge\nx 1\n", "prometheus_text"),
        (b"# scrape_ts=1700000000\nfoo 1\n", "prometheus_text"),
        (b'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_waiting{engine="0"} 0\n', "prometheus_text"),
    ],
)
def test_sniff_recognises_each_format(content, fmt):
    assert READER.sniff(Path("x"), content) == fmt


@pytest.mark.parametrize(
    "content",
    [
        b'{"traceEvents": []}',
        b'[{"ph": "X", "ts": 1}]',
        b"[[1, 2], [3, 4]]",  # 2-D: not an expert tensor
        b'{"kind": "something_else"}',
        b"Name,Type,Start Time(us),Duration(us)\nMatMul,MatMul,1,2\n",
        b"INFO: server started 5\nWARNING: slow 7\n",
        b"",
    ],
)
def test_sniff_leaves_other_files_alone(content):
    assert READER.sniff(Path("x"), content) is None


def test_driver_routes_every_written_file_to_this_reader(tmp_path):
    for fmt in ("json", "csv", "npy"):
        for p in se.write_scenario("eplb_works", tmp_path / fmt, load_format=fmt):
            reader, _ = detect(p)
            assert reader is READER, p


# ------------------------------------------------------------------ load tensors
def test_json_csv_npy_store_the_same_cells(tmp_path, db):
    ts = tensors()
    expected = expected_cells(ts)
    got = {}
    for fmt, writer in (("json", se.write_load_json), ("csv", se.write_load_csv), ("npy", se.write_load_npy)):
        path = writer(tmp_path / f"load.{fmt}", ts)
        res = ingest_one(db, path, run=fmt)
        assert (res.format, res.status, res.rows_kept, res.rows_dropped) == (
            f"expert_load_{fmt}",
            "ok",
            len(expected),
            0,
        )
        got[fmt] = stored_cells(db, run=fmt)
    assert got["json"] == expected
    assert got["csv"] == expected
    assert got["npy"] == expected


def test_json_window_fields_and_single_window_forms(tmp_path, db):
    ts = tensors()
    p = se.write_load_json(tmp_path / "a.json", ts[:2], ts=[111, 222], epochs=[7, None])
    ingest_one(db, p)
    assert rows(db, "SELECT DISTINCT window_idx, ts_ns, epoch FROM expert_load ORDER BY 1") == [
        (0, 111, 7),
        (1, 222, None),
    ]
    # a bare 3-D list is one window; its index and epoch come from the file name
    p3 = se.write_json(tmp_path / "moe_load_epoch2_step40.json", ts[3])
    ingest_one(db, p3, run="bare")
    assert rows(db, "SELECT DISTINCT window_idx, epoch FROM expert_load WHERE run = 'bare'") == [(40, 2)]
    # {"kind": "expert_load", "load": ...} is one window too
    p1 = se.write_json(tmp_path / "one.json", {"kind": "expert_load", "epoch": 1, "ts_ns": 5, "load": ts[0]})
    ingest_one(db, p1, run="one")
    assert rows(db, "SELECT DISTINCT window_idx, ts_ns, epoch FROM expert_load WHERE run = 'one'") == [(0, 5, 1)]
    assert rows(db, "SELECT count(*) FROM expert_load WHERE run = 'one'")[0][0] == se.LAYERS * se.RANKS * se.SLOTS


def test_gzip_json_and_csv_loads(tmp_path, db):
    p = tmp_path / "load.json.gz"
    p.write_bytes(
        gzip.compress(json.dumps({"kind": "expert_load", "windows": [{"load": tensors()[0]}]}).encode(), mtime=0)
    )
    res = ingest_one(db, p)
    assert res.status == "ok" and res.rows_kept == se.LAYERS * se.RANKS * se.SLOTS
    c = se.write_load_csv(tmp_path / "load.csv", tensors()[:2])
    gz = tmp_path / "load_csv_gz"  # gzip without the .gz suffix: found by content
    gz.write_bytes(gzip.compress(c.read_bytes(), mtime=0))
    res = ingest_one(db, gz, run="csvgz")
    assert (res.format, res.status, res.rows_kept) == ("expert_load_csv", "ok", 2 * se.LAYERS * se.RANKS * se.SLOTS)


def test_cut_single_window_tensor_is_refused(tmp_path):
    p = se.write_json(tmp_path / "load.json", tensors()[0])
    p.write_text(p.read_text()[:100])
    with pytest.raises(InputError) as err:
        READER.ingest(bare_context(p, "expert_load_json"))
    assert "cannot be salvaged" in str(err.value)


def test_json_bad_windows_are_dropped_and_the_rest_kept(tmp_path, db):
    ts = tensors()
    ragged = json.loads(json.dumps(ts[2]))
    ragged[1][2] = ragged[1][2][:3]  # layer 1 rank 2 has 3 slots
    bad_rank = ts[3][0]  # a 2-D tensor
    p = se.write_json(
        tmp_path / "load.json",
        {
            "kind": "expert_load",
            "windows": [
                {"load": ts[0]},
                {"load": ts[1]},
                {"load": ragged},
                {"load": bad_rank},
                {"load": ts[4]},
                {"load": [[[1, -3]] * 4] * 4},
            ],
        },
    )  # other shape than window 0
    res = ingest_one(db, p)
    n = se.LAYERS * se.RANKS * se.SLOTS
    assert res.status == "salvaged"
    assert res.rows_kept == 3 * n
    assert sorted(r[0] for r in rows(db, "SELECT DISTINCT window_idx FROM expert_load")) == [0, 1, 4]
    d = {pos: (reason, k) for reason, pos, k in drops(db, p)}
    assert "ragged" in d["windows[2]"][0] and "layer 1 rank 2 has 3" in d["windows[2]"][0]
    assert d["windows[2]"][1] == n - 1
    assert "wrong rank" in d["windows[3]"][0] and d["windows[3]"][1] == se.RANKS * se.SLOTS
    assert "differs from the first window" in d["windows[5]"][0]
    seen, kept, dropped, status, msg = source_counts(db, p)
    assert seen == kept + dropped and dropped == sum(k for _, k in d.values())
    assert "windows[2]" in msg


def test_json_wrong_rank_everywhere_is_an_input_error(tmp_path, db):
    p = se.write_json(tmp_path / "load.json", {"kind": "expert_load", "load": [[1, 2], [3, 4]]})
    res = ingest_one(db, p)
    assert res.status == "failed"
    assert str(p.resolve()) in res.message and "wrong rank" in res.message and "(load)" in res.message
    p5 = tmp_path / "five.json"
    p5.write_text("[[[[[1]]]]]")
    res = ingest_one(db, p5)
    assert res.status == "failed" and "5 dimensions" in res.message
    assert rows(db, "SELECT count(*) FROM expert_load_rows")[0][0] == 0


def test_truncated_json_keeps_complete_windows(tmp_path, db):
    ts = tensors()
    p = se.write_load_json(tmp_path / "load.json", ts)
    text = p.read_text()
    cut = text.index('{"window":4')
    p.write_text(text[: cut + 40])
    res = ingest_one(db, p)
    assert res.status == "truncated"
    assert sorted(r[0] for r in rows(db, "SELECT DISTINCT window_idx FROM expert_load")) == [0, 1, 2, 3]
    ((reason, pos, _),) = drops(db, p)
    assert "unparsable JSON tail" in reason and "after 4 complete windows" in pos


def test_negative_and_nan_counts_are_dropped(tmp_path, db):
    vals = [1.0, -2.0, float("nan"), 4.0, float("inf"), 6.0, 7.0, 8.0]
    p = tmp_path / "load.npy"
    p.write_bytes(se.npy_bytes(vals, (2, 2, 2), "<f8"))
    res = ingest_one(db, p)
    assert (res.status, res.rows_kept, res.rows_dropped) == ("salvaged", 5, 3)
    assert sorted(r[0] for r in rows(db, "SELECT tokens FROM expert_load")) == [1, 4, 6, 7, 8]
    assert drops(db, p)[0][0] == "negative, NaN or infinite token count"


@pytest.mark.parametrize("descr, version", [("<i4", 1), ("<i8", 2), ("<f4", 1), ("<f8", 1)])
def test_npy_dtypes_and_versions(tmp_path, db, descr, version):
    t = tensors()[1]
    p = tmp_path / "w_window5.npy"
    p.write_bytes(se.npy_bytes(se.flatten(t), (se.LAYERS, se.RANKS, se.SLOTS), descr, version=version))
    res = ingest_one(db, p)
    assert res.status == "ok"
    assert stored_cells(db) == {(5, *k[1:]): v for k, v in expected_cells([t]).items()}


@pytest.mark.parametrize(
    "descr, shape, fortran, expect",
    [
        ("<i8", (4, 4), False, "2 dimensions"),
        ("<i8", (1, 2, 2, 2, 2), False, "5 dimensions"),
        (">i8", (2, 2, 2), False, "big-endian"),
        ("<i8", (2, 2, 2), True, "Fortran"),
        ("<i2", (2, 2, 2), False, "unsupported .npy dtype"),
    ],
)
def test_npy_refusals_name_the_problem(tmp_path, descr, shape, fortran, expect):
    n = 1
    for d in shape:
        n *= d
    raw = se.npy_bytes([1] * n, shape, descr if descr != "<i2" else "<i4", fortran=fortran)
    if descr == "<i2":
        raw = raw.replace(b"'<i4'", b"'<i2'")
    p = tmp_path / "bad.npy"
    p.write_bytes(raw)
    with pytest.raises(InputError) as err:  # refused before any row is written
        READER.ingest(bare_context(p, "expert_load_npy"))
    assert expect in str(err.value) and str(p) in str(err.value)


def test_truncated_npy_keeps_complete_layer_blocks(tmp_path, db):
    ts = tensors()
    raw = se.npy_bytes(se.flatten(ts), (se.WINDOWS, se.LAYERS, se.RANKS, se.SLOTS), "<i8")
    block = se.RANKS * se.SLOTS * 8
    per_window = se.LAYERS * block
    data_start = len(raw) - se.WINDOWS * per_window
    p = tmp_path / "load.npy"
    p.write_bytes(raw[: data_start + 2 * per_window + 2 * block + 13])  # 2 windows + 2 layers + a bit
    res = ingest_one(db, p)
    total = se.WINDOWS * se.LAYERS * se.RANKS * se.SLOTS
    assert res.status == "truncated"
    assert res.rows_kept == (2 * se.LAYERS + 2) * se.RANKS * se.SLOTS
    assert res.rows_dropped == total - res.rows_kept
    assert rows(db, "SELECT window_idx, count(DISTINCT layer) FROM expert_load GROUP BY 1 ORDER BY 1") == [
        (0, se.LAYERS),
        (1, se.LAYERS),
        (2, 2),
    ]


def test_csv_bad_lines_are_dropped_with_line_numbers(tmp_path, db):
    ts = tensors()
    p = se.write_load_csv(tmp_path / "load.csv", ts[:1], ts=[99])
    lines = p.read_text().splitlines()
    lines[3] = "0,0,0"  # missing fields
    lines[5] = lines[5] + ",7"  # too many
    lines[8] = "0,1,x,1,5,99"  # rank not an integer
    lines[9] = "0,1,2,1,abc,99"  # tokens not a number
    lines[10] = "0,1,2,2,-4,99"  # negative
    lines.insert(12, "")  # blank line: ignored
    p.write_text("\n".join(lines) + "\n")
    res = ingest_one(db, p)
    assert res.status == "salvaged"
    assert res.rows_kept == se.LAYERS * se.RANKS * se.SLOTS - 5 and res.rows_dropped == 5
    got = {pos: reason for reason, pos, _ in drops(db, p)}
    assert got == {
        "line 4": "missing fields (expected 6)",
        "line 6": "too many fields (expected 6)",
        "line 9": "window, layer, rank or local_expert is not an integer",
        "line 10": "tokens is not a number",
        "line 11": "negative, NaN or infinite token count",
    }
    assert rows(db, "SELECT DISTINCT ts_ns FROM expert_load") == [(99,)]


def test_csv_aliases_tab_delimiter_and_epoch_column(tmp_path, db):
    p = tmp_path / "load_epoch3.tsv"
    p.write_text("layer\tep_rank\tlocal_slot\tload\n0\t0\t0\t5\n0\t1\t0\t7\t\n")
    res = ingest_one(db, p)
    assert res.status == "ok"
    assert rows(db, "SELECT window_idx, epoch, ep_rank, tokens FROM expert_load ORDER BY 3") == [
        (0, 3, 0, 5.0),
        (0, 3, 1, 7.0),
    ]
    q = tmp_path / "b.csv"
    q.write_text("window,layer,rank,local_expert,tokens,epoch\n0,0,0,0,1,4\n")
    ingest_one(db, q, run="b")
    assert rows(db, "SELECT epoch FROM expert_load WHERE run = 'b'") == [(4,)]


def test_reingest_replaces_rows(tmp_path, db):
    p = se.write_load_json(tmp_path / "load.json", tensors()[:2])
    ingest_one(db, p)
    ingest_one(db, p)
    assert rows(db, "SELECT count(*) FROM expert_load")[0][0] == 2 * se.LAYERS * se.RANKS * se.SLOTS


# ------------------------------------------------------------------ expert maps
def test_map_epoch_from_name_field_and_ts(tmp_path, db):
    place = se.default_placement()
    p1 = se.write_json(tmp_path / "expert_map_epoch3.json", se.map_doc(place))
    p2 = se.write_json(tmp_path / "map.json", se.map_doc(place, epoch=5, ts_ns=123))
    p3 = se.write_json(tmp_path / "plain.json", se.map_doc(place))
    for p, run in ((p1, "a"), (p2, "b"), (p3, "c")):
        res = ingest_one(db, p, run)
        assert (res.format, res.status, res.rows_kept) == ("expert_map", "ok", se.LAYERS * se.EXPERTS)
    assert rows(db, "SELECT run, min(epoch), max(epoch), min(ts_ns) FROM expert_map GROUP BY run ORDER BY run") == [
        ("a", 3, 3, None),
        ("b", 5, 5, 123),
        ("c", 0, 0, None),
    ]
    assert rows(
        db, "SELECT expert FROM expert_map WHERE run = 'a' AND layer = 2 AND ep_rank = 3 AND local_slot = 1"
    ) == [(13,)]


def test_map_layer_not_covering_experts_is_dropped(tmp_path, db):
    place = se.default_placement()
    place[1][2][3] = 0  # layer 1: expert 11 missing, expert 0 twice (on ranks 0 and 2)
    doc = se.map_doc(place)
    doc["layer_list"][3]["device_count"] = 7
    p = se.write_json(tmp_path / "expert_map_epoch1.json", doc)
    res = ingest_one(db, p)
    assert res.status == "salvaged"
    assert res.rows_kept == 2 * se.EXPERTS and res.rows_dropped == 2 * se.EXPERTS
    assert rows(db, "SELECT DISTINCT layer FROM expert_map ORDER BY 1") == [(0,), (2,)]
    d = {pos: reason for reason, pos, _ in drops(db, p)}
    assert "logical experts [11] are not placed" in d["layer_list[1]"]
    assert "device_count 7" in d["layer_list[3]"]
    assert "layer_list[1]" in res.message


def test_map_same_expert_twice_on_one_device_is_two_replicas(tmp_path, db):
    # MindIE deployment maps place one logical expert in two slots of one device: both slots are
    # replicas, the layer is kept whole.
    place = se.default_placement()
    place[2][0].append(place[2][0][1])  # layer 2, device 0: its slot-1 expert again in a new slot
    p = se.write_json(tmp_path / "expert_map_epoch1.json", se.map_doc(place))
    res = ingest_one(db, p)
    assert res.status == "ok" and res.rows_dropped == 0
    assert res.rows_kept == se.LAYERS * se.EXPERTS + 1
    assert "1 extra slot(s) in 1 layer(s)" in res.message
    e = place[2][0][1]
    assert rows(
        db, f"SELECT local_slot FROM expert_map WHERE layer = 2 AND ep_rank = 0 AND expert = {e} ORDER BY 1"
    ) == [(1,), (len(place[2][0]) - 1,)]
    assert rows(db, "SELECT count(DISTINCT layer) FROM expert_map") == [(se.LAYERS,)]


@pytest.mark.realdata
def test_real_deployment_map_keeps_every_layer(realdata, tmp_path):
    """MindStudio Insight's prefill_global_deployment.json (58 layers x 64 devices, some experts
    twice on one device): every layer and every slot is kept."""
    import json

    p = realdata / "thirdparty/msinsight/test_data/expert_deployment/prefill_global_deployment.json"
    if not p.exists():
        pytest.skip(f"{p} is absent")
    doc = json.loads(p.read_text())
    slots = sum(len(d["device_expert"]) for layer in doc["layer_list"] for d in layer["device_list"])
    db = tmp_path / "x.duckdb"
    res = ingest_one(db, p)
    assert (res.format, res.status, res.rows_dropped, res.rows_kept) == ("expert_map", "ok", 0, slots)
    assert rows(db, "SELECT count(DISTINCT layer) FROM expert_map") == [(len(doc["layer_list"]),)]
    # a replica on the same device is two rows of one (layer, device, expert)
    assert rows(
        db, "SELECT count(*) > 0 FROM (SELECT 1 FROM expert_map GROUP BY layer, ep_rank, expert HAVING count(*) > 1)"
    ) == [(True,)]


def test_map_with_redundant_experts_sums_replicas(tmp_path, db):
    # 4 ranks x 5 slots: the 16 experts plus replicas of experts 4, 5, 8, 12
    place = [[[r * 4 + s for s in range(4)] for r in range(4)]]
    place[0][2].append(4)
    place[0][3].append(5)
    place[0][0].append(8)
    place[0][1].append(12)
    m = se.write_json(tmp_path / "expert_map_epoch0.json", se.map_doc(place))
    load = [[[10] * 5 for _ in range(4)]]
    load[0][1][0] = 30  # expert 4 on rank 1
    load[0][2][4] = 50  # expert 4 replica on rank 2
    l = se.write_json(tmp_path / "load.json", {"kind": "expert_load", "load": load})
    assert ingest_one(db, m).status == "ok"
    assert ingest_one(db, l).status == "ok"
    got = rows(db, "SELECT tokens, replicas, main_rank FROM _expert_logical_load WHERE expert = 4")
    assert got == [(80.0, 2, 2)]
    assert rows(db, "SELECT count(*) FROM _expert_logical_load")[0][0] == 16


def test_map_that_is_not_json_fails_clearly(tmp_path, db):
    p = tmp_path / "expert_map.json"
    p.write_text('{"moe_layer_count": 1, "layer_list": [{"layer_id": 0, "device_list": [')
    res = ingest_one(db, p)
    assert res.status == "failed" and "not valid JSON" in res.message


def test_default_expert_numbering_without_map(tmp_path, db):
    t = tensors()[0]
    ingest_one(db, se.write_json(tmp_path / "load.json", t))
    # rank 2, slot 3 -> expert 2 * SLOTS + 3
    assert rows(
        db, "SELECT expert, mapped FROM _expert_slot_load WHERE ep_rank = 2 AND local_slot = 3 AND layer = 0"
    ) == [(2 * se.SLOTS + 3, False)]


# ------------------------------------------------------------------ Prometheus
def test_prometheus_scrapes_types_and_labels(tmp_path, db):
    sc = se.scenario("eplb_works")
    ts = [se.load_tensor(sc, w) for w in range(se.WINDOWS)]
    p = tmp_path / "metrics.prom"
    p.write_text(se.prometheus_text(sc, ts))
    res = ingest_one(db, p)
    assert res.status == "ok"
    assert rows(db, "SELECT count(DISTINCT scrape), min(ts_ns), max(ts_ns) FROM metric_samples") == [
        (se.WINDOWS, se.window_ts(0) + 10**9, se.window_ts(se.WINDOWS - 1) + 10**9)
    ]
    got = rows(
        db,
        """SELECT type, value, dp, layer, phase, label_rank FROM metric_samples
                      WHERE metric = 'eplb:expert_hotness:imbalance' AND scrape = 0 AND layer = 2""",
    )
    assert got == [("gauge", round(se.par(ts[0][2]), 4), 0, 2, "current", 0)]
    assert rows(db, "SELECT DISTINCT type FROM metric_samples WHERE name LIKE '%weight_update:duration_sum'") == [
        ("histogram",)
    ]
    assert rows(
        db, "SELECT value FROM metric_samples WHERE metric = 'waiting_batch_size' AND dp = 1 AND scrape = 5"
    ) == [(2.0,)]


def test_prometheus_per_sample_timestamps_and_counters(tmp_path, db):
    p = tmp_path / "scrape.txt"
    p.write_text('# TYPE req_total counter\nreq_total{dp="0"} 5 1700000000123\nplain 2.5\n')
    ingest_one(db, p)
    assert rows(db, "SELECT name, type, value, ts_ns FROM metric_samples ORDER BY name") == [
        ("plain", "unknown", 2.5, None),
        ("req_total", "counter", 5.0, 1700000000123000000),
    ]


def test_prometheus_bad_lines_are_dropped_and_the_rest_kept(tmp_path, db):
    text = (
        "\n".join(
            [
                "# scrape_ts=1700000000",
                "# TYPE h histogram",
                'h_bucket{le="1.0"} 1',
                'h_bucket{le="+Inf"} oops',  # line 4: bad value
                "h_sum 0.5",
                "h_count 1",
                'g{dp="0" 3',  # line 7: unclosed labels
                'g{dp="1"} 4',
                "# scrape_ts=1700000060",
                'g{dp="0"} 5',
            ]
        )
        + "\n"
    )
    p = tmp_path / "m.prom"
    p.write_text(text)
    res = ingest_one(db, p)
    assert res.status == "salvaged" and res.rows_kept == 5 and res.rows_dropped == 2
    assert [pos for _, pos, _ in drops(db, p)] == ["line 4", "line 7"]
    assert all("does not parse" in r for r, _, _ in drops(db, p))
    assert rows(db, "SELECT scrape, name, type, ts_ns FROM metric_samples ORDER BY scrape, name") == [
        (0, "g", "unknown", 1700000000 * 10**9),
        (0, "h_bucket", "histogram", 1700000000 * 10**9),
        (0, "h_count", "histogram", 1700000000 * 10**9),
        (0, "h_sum", "histogram", 1700000000 * 10**9),
        (1, "g", "unknown", 1700000060 * 10**9),
    ]


def test_prometheus_nothing_parses_is_an_input_error(tmp_path, db):
    p = tmp_path / "m.prom"
    p.write_text('# TYPE g gauge\ng{x="1"} abc\n9bad 2\n')
    res = ingest_one(db, p)
    assert res.status == "failed" and "no Prometheus sample line parses" in res.message and "line 2" in res.message


def test_prometheus_without_prometheus_client_says_what_to_install(tmp_path, monkeypatch):
    p = tmp_path / "m.prom"
    p.write_text("# TYPE g gauge\ng 1\n")
    monkeypatch.setitem(sys.modules, "prometheus_client.parser", None)
    with pytest.raises(InputError) as err:
        READER.ingest(bare_context(p, "prometheus_text"))
    assert "pip install -e .[metrics]" in str(err.value) and str(p) in str(err.value)


def test_counts_reconcile_for_every_scenario_file(tmp_path, db):
    for fmt in ("json", "csv", "npy"):
        se.ingest(db, se.write_scenario("eplb_fails", tmp_path / fmt, load_format=fmt), run=fmt)
    bad = rows(db, "SELECT path FROM sources WHERE rows_seen <> rows_kept + rows_dropped OR status <> 'ok'")
    assert bad == []
    assert rows(db, "SELECT count(*) FROM sources")[0][0] == 3 * 4 + 1  # npy: one load file per epoch


def test_npy_header_parser_reads_v3(tmp_path, db):
    raw = se.npy_bytes([1, 2, 3, 4, 5, 6, 7, 8], (2, 2, 2), "<i4", version=2)
    p = tmp_path / "v3.npy"
    p.write_bytes(raw[:6] + b"\x03" + raw[7:])
    assert ingest_one(db, p).rows_kept == 8
    # the header length field is little-endian uint32 in v2/v3
    assert struct.unpack("<I", raw[8:12])[0] + 12 == len(raw) - 8 * 4


REALDATA = Path(__file__).resolve().parents[1].parent / "shared" / "realdata"


@pytest.mark.realdata
def test_sniff_claims_no_real_trace_or_operator_table(tmp_path):
    """The expert readers claim only expert data: no real Chrome trace or operator / service CSV
    is ever taken for expert load or an expert map, and every real file they do claim ingests
    into the expert tables with rows (whatever real files realdata holds)."""
    if not REALDATA.is_dir():
        pytest.skip(f"{REALDATA} is absent")
    from slowcard.ingest import chrome, op_csv, service_csv
    from slowcard.ingest.base import read_head

    files = [p for p in REALDATA.rglob("*") if p.is_file() and p.suffix != ".md"]
    assert files
    claimed = []
    for p in files:
        head = read_head(p)
        fmt = READER.sniff(p, head)
        if fmt is None:
            continue
        others = [r for r in (chrome.READER, op_csv.READER, service_csv.READER) if r.sniff(p, head)]
        assert not others, (p, fmt, others)
        claimed.append(p)
    db = tmp_path / "x.duckdb"
    for p in claimed:
        res = ingest_one(db, p)
        assert res.status in ("ok", "salvaged"), (p, res.status, res.message)
        assert res.rows_kept > 0, (p, res.message)
