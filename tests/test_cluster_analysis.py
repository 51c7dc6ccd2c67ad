"""msprof-analyze cluster outputs (cluster_step_trace_time.csv, cluster_communication.json) and the
cluster-step-skew query: recognition by content, header variants, drops with line numbers, wrong
shapes, the real samples in ../shared/realdata/ascend, and the Advisor slow-rank rule."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

import slowcard
from slowcard.cli import app
from slowcard.ingest import RANKED_FORMATS, chrome, experts, ingest_paths, op_csv, read_head, service_csv
from slowcard.ingest.cluster_analysis import READER

REALDATA = Path(__file__).resolve().parents[1].parent / "shared" / "realdata"
ASCEND = REALDATA / "ascend"
BASE_HEADER = (
    "Step,Type,Index,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,"
    "Stage,Bubble,Communication(Not Overlapped and Exclude Receive)"
)
STEP_COLS = (
    "line_no, step, step_id, type, index, rank, computing_us, communication_not_overlapped_us, "
    "overlapped_us, communication_us, free_us, stage_us, bubble_us, "
    "comm_not_overlapped_excl_receive_us, preparing_us, dp_index, pp_index, tp_index"
)


def real(name: str) -> Path:
    p = ASCEND / name
    if not p.exists():
        pytest.skip(f"real sample {p} is absent (../shared/realdata not checked out beside the repo)")
    return p


def ro(db):
    return duckdb.connect(str(db), read_only=True)


def ingest_one(db, path, run="r"):
    rep = ingest_paths(db, [path], run=run)
    assert len(rep.files) == 1
    return rep, rep.files[0]


def rows(db, sql, params=()):
    with ro(db) as con:
        return con.execute(sql, list(params)).fetchall()


def step_row(step, typ, index, computing, comm, free, *, extra=()):
    """A cluster_step_trace_time row: Overlapped/Communication/Stage/Bubble/Excl derived from the inputs."""
    nums = all(isinstance(v, float) for v in (computing, comm, free))
    stage = computing + comm + free if nums else 1.0
    cells = [step, typ, index, computing, comm, 1.5, comm + 1.5 if nums else 1.0, free, stage, 0.0, comm]
    return ",".join(str(c) for c in cells + list(extra))


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# -- recognition ---------------------------------------------------------------------------------


def test_sniff_by_content_not_name(tmp_path):
    csv_path = write(tmp_path / "whatever.txt", BASE_HEADER + "\n" + step_row("", "rank", 0, 1.0, 2.0, 3.0) + "\n")
    assert READER.sniff(csv_path, read_head(csv_path)) == "cluster_step"
    js = write(tmp_path / "data.json", json.dumps(comm_doc()))
    assert READER.sniff(js, read_head(js)) == "cluster_communication"
    # pretty-printed with a BOM still counts
    pretty = tmp_path / "pretty.json"
    pretty.write_bytes(b"\xef\xbb\xbf" + json.dumps(comm_doc(), indent=2).encode())
    assert READER.sniff(pretty, read_head(pretty)) == "cluster_communication"
    # named like ours, but not ours
    not_csv = write(tmp_path / "cluster_step_trace_time.csv", "Name,Type,Start Time(us),Duration(us)\nop,MatMul,1,2\n")
    assert READER.sniff(not_csv, read_head(not_csv)) is None
    # cluster_communication_matrix.json is keyed the same way but has no time info
    matrix = write(
        tmp_path / "cluster_communication.json",
        json.dumps(
            {"(0, 1)": {"step": {"hcom_broadcast__1@g": {"0->1": {"Transport Type": "HCCS", "Transit Size(MB)": 1.0}}}}}
        ),
    )
    assert READER.sniff(matrix, read_head(matrix)) is None
    kineto = write(tmp_path / "t.json", json.dumps({"traceEvents": [], "Communication Time Info": 1}))
    assert READER.sniff(kineto, read_head(kineto)) is None


def test_other_readers_do_not_claim_cluster_files(tmp_path):
    files = [
        write(tmp_path / "s.csv", BASE_HEADER + ",Preparing,DP Index,PP Index,TP Index\n"),
        write(tmp_path / "c.json", json.dumps(comm_doc())),
    ]
    files += [p for p in (ASCEND / "cluster_step_trace_time.csv", ASCEND / "cluster_communication.json") if p.exists()]
    for p in files:
        head = read_head(p)
        for other in (chrome.READER, experts.READER, op_csv.READER, service_csv.READER):
            assert other.sniff(p, head) is None, (other.name, p.name)


def test_does_not_claim_other_readers_files(tmp_path):
    samples = [
        write(
            tmp_path / "k.csv",
            "Step Id,Name,Type,Accelerator Core,Start Time(us),Duration(us),Wait Time(us)\n"
            "1,op,MatMul,AI_CORE,1.0,2.0,0\n",
        ),
        write(tmp_path / "b.csv", "name,res_list,start_time(ms),end_time(ms),batch_size,batch_type,dp_rank\n"),
        write(tmp_path / "e.csv", "layer,rank,local_expert,tokens\n0,0,0,5\n"),
        write(tmp_path / "m.json", json.dumps({"moe_layer_count": 1, "layer_list": []})),
        write(tmp_path / "t.json", json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}]})),
    ]
    samples += [p for p in sorted(ASCEND.glob("*")) if p.name.startswith(("kernel_details", "trace_view"))]
    for p in samples:
        assert READER.sniff(p, read_head(p)) is None, p.name


def test_cluster_formats_are_not_ranked():
    """Cluster-wide files have no rank of their own: never reported as rank-less."""
    assert not {"cluster_step", "cluster_communication"} & RANKED_FORMATS


# -- cluster_step_trace_time.csv -----------------------------------------------------------------


@pytest.mark.parametrize("variant", ["base", "preparing", "parallel"])
def test_step_trace_header_variants(tmp_db, tmp_path, variant):
    header = (
        BASE_HEADER
        + {"base": "", "preparing": ",Preparing", "parallel": ",Preparing,DP Index,PP Index,TP Index"}[variant]
    )
    extra = {"base": (), "preparing": (12.5,), "parallel": (12.5, 1, 0, 3)}[variant]
    text = (
        "\n".join(
            [
                header,
                step_row(7, "rank", 0, 100.25, 20.0, 5.0, extra=extra),
                step_row(7, "rank", 1, 110.0, 10.0, 4.0, extra=extra),
                step_row(7, "stage", '"(0, 1)"', 110.0, 20.0, 5.0, extra=extra),
            ]
        )
        + "\n"
    )
    rep, f = ingest_one(tmp_db, write(tmp_path / "cluster_step_trace_time.csv", text))
    assert (f.format, f.status, f.rows_kept, f.rows_dropped, f.rank) == ("cluster_step", "ok", 3, 0, None)
    assert "no rank" not in f.message and not any("no rank" in w for w in rep.warnings)
    got = rows(tmp_db, f"SELECT {STEP_COLS} FROM step_trace WHERE run = 'r' ORDER BY line_no")
    prep = 12.5 if variant != "base" else None
    par = (1, 0, 3) if variant == "parallel" else (None, None, None)
    assert got[0] == (2, "7", 7, "rank", "0", 0, 100.25, 20.0, 1.5, 21.5, 5.0, 125.25, 0.0, 20.0, prep, *par)
    assert got[1][5] == 1
    assert got[2][3:6] == ("stage", "(0, 1)", None)


def test_step_trace_bad_rows_dropped_with_lines(tmp_db, tmp_path):
    lines = [
        BASE_HEADER,
        step_row("", "rank", 0, 100.0, 20.0, 5.0),  # line 2 ok
        step_row("", "rank", 1, "abc", 20.0, 5.0),  # line 3: Computing not a number
        "",  # line 4 blank: not a row
        step_row("", "rank", 2, 100.0, 20.0, ""),  # line 5: Free missing
        "," + "rank,3,1.0",  # line 6: ragged
        step_row("", "rank", "x", 100.0, 20.0, 5.0),  # line 7: rank id not an integer
        step_row("", "rank", 4, 100.0, "1e999", 5.0),  # line 8: overflows to inf
        step_row("", "rank", 5, "1e2", 2e1, 5.0),
    ]  # line 9 ok (exponent form)
    rep, f = ingest_one(tmp_db, write(tmp_path / "s.csv", "\n".join(lines) + "\n"))
    assert (f.status, f.rows_kept, f.rows_dropped) == ("salvaged", 2, 5)
    assert "line 3" in f.message and "Computing" in f.message
    assert rep.exit_code == 1
    got = rows(tmp_db, "SELECT rank, computing_us FROM step_trace ORDER BY line_no")
    assert got == [(0, 100.0), (5, 100.0)]
    drops = dict(rows(tmp_db, "SELECT position, reason FROM source_drops ORDER BY position"))
    assert set(drops) == {"line 3", "line 5", "line 6", "line 7", "line 8"}
    assert "'abc' is not a number" in drops["line 3"]
    assert "missing Free" in drops["line 5"]
    assert "ragged" in drops["line 6"]
    assert "not an integer" in drops["line 7"]
    assert "finite" in drops["line 8"]
    seen, kept, dropped = rows(tmp_db, "SELECT rows_seen, rows_kept, rows_dropped FROM sources")[0]
    assert seen == kept + dropped == 7


def test_step_trace_many_drops_are_summed_past_100(tmp_db, tmp_path):
    lines = [BASE_HEADER] + [step_row("", "rank", i, "x", 1.0, 1.0) for i in range(150)]
    lines.append(step_row("", "rank", 150, 1.0, 1.0, 1.0))
    _, f = ingest_one(tmp_db, write(tmp_path / "s.csv", "\n".join(lines) + "\n"))
    assert (f.rows_kept, f.rows_dropped) == (1, 150)
    drops = rows(tmp_db, "SELECT position, n_rows FROM source_drops ORDER BY n_rows DESC, position")
    assert len(drops) == 101 and drops[0] == ("lines 102-151 (50 rows)", 50)
    assert sum(n for _, n in drops) == 150


def test_step_trace_gzip_and_reingest_replaces_rows(tmp_db, tmp_path):
    import gzip

    text = BASE_HEADER + "\n" + step_row(1, "rank", 0, 1.0, 2.0, 3.0) + "\n"
    p = tmp_path / "cluster_step_trace_time.csv.gz"
    p.write_bytes(gzip.compress(text.encode(), mtime=0))
    for _ in range(2):
        _, f = ingest_one(tmp_db, p)
        assert (f.format, f.status, f.rows_kept) == ("cluster_step", "ok", 1)
    assert rows(tmp_db, "SELECT count(*) FROM step_trace") == [(1,)]


def test_step_trace_missing_required_column_fails_the_file(tmp_db, tmp_path):
    header = BASE_HEADER.replace(",Free", "")
    p = write(tmp_path / "cluster_step_trace_time.csv", header + "\n,rank,0,1,2,3,4,5,6,7\n")
    rep, f = ingest_one(tmp_db, p)
    assert f.status == "failed" and f.format == "cluster_step"
    assert str(p) in f.message and "`Free`" in f.message and "line 1" in f.message
    assert rows(tmp_db, "SELECT count(*) FROM step_trace_rows") == [(0,)]
    assert rows(tmp_db, "SELECT count(*) FROM sources") == [(0,)]


def test_step_trace_crlf_quoted_tab_and_header_only(tmp_db, tmp_path):
    text = BASE_HEADER + "\r\n" + '3,rank,0,"100.5\t",20,1,21,5,125.5,0,20' + "\r\n"
    _, f = ingest_one(tmp_db, write(tmp_path / "a.csv", text))
    assert (f.status, f.rows_kept) == ("ok", 1)
    assert rows(tmp_db, "SELECT step_id, computing_us FROM step_trace") == [(3, 100.5)]
    _, g = ingest_one(tmp_db, write(tmp_path / "b.csv", BASE_HEADER + "\n"), run="empty")
    assert (g.status, g.rows_kept, g.message) == ("ok", 0, "header only: no step trace rows")


# -- cluster_communication.json ------------------------------------------------------------------


def leaf(elapse, wait, transit, *, rdma_bw=0.0, hccs_bw=2.5, extra_links=None):
    links = {
        "RDMA": {
            "Transit Size(MB)": 0,
            "Transit Time(ms)": 0,
            "Bandwidth(GB/s)": rdma_bw,
            "Large Packet Ratio": 0,
            "Size Distribution": {},
        },
        "HCCS": {
            "Transit Size(MB)": 0.5,
            "Transit Time(ms)": transit,
            "Bandwidth(GB/s)": hccs_bw,
            "Large Packet Ratio": 0.25,
            "Size Distribution": {"0.003072": [18, 0.02]},
        },
        "PCIE": {
            "Transit Size(MB)": 0,
            "Transit Time(ms)": 0,
            "Bandwidth(GB/s)": 0,
            "Large Packet Ratio": 0,
            "Size Distribution": {},
        },
        "SDMA": {
            "Transit Size(MB)": 0.5,
            "Transit Time(ms)": transit,
            "Bandwidth(GB/s)": hccs_bw,
            "Large Packet Ratio": 0,
            "Size Distribution": {},
        },
    }
    links.update(extra_links or {})
    return {
        "Communication Time Info": {
            "Start Timestamp(us)": 1695054582608213.0,
            "Elapse Time(ms)": elapse,
            "Transit Time(ms)": transit,
            "Wait Time(ms)": wait,
            "Synchronization Time(ms)": wait / 2,
            "Idle Time(ms)": 0.5,
            "Wait Time Ratio": 0.9,
            "Synchronization Time Ratio": 0.8,
        },
        "Communication Bandwidth Info": links,
    }


def comm_doc():
    return {
        "(0, 1)": {
            "step1": {
                "hcom_allReduce__1_0@g1": {"0": leaf(10.0, 8.0, 2.0), "1": leaf(2.5, 0.5, 2.0)},
                "Total Op Info": {"0": leaf(10.0, 8.0, 2.0), "1": leaf(2.5, 0.5, 2.0)},
            },
            "step2": {"hcom_allReduce__1_1@g1": {"0": leaf(4.0, 1.0, 3.0, extra_links={"UB": {"Bandwidth(GB/s)": 9}})}},
        },
        "(2, 3)": {"step1": {"hcom_send": {"2": leaf(1.0, 0.0, 1.0)}}},
    }


def test_communication_rows(tmp_db, tmp_path):
    rep, f = ingest_one(tmp_db, write(tmp_path / "cc.json", json.dumps(comm_doc())))
    assert (f.format, f.status, f.rows_kept, f.rows_dropped, f.rank) == ("cluster_communication", "ok", 6, 0, None)
    assert not any("no rank" in w for w in rep.warnings)
    got = rows(
        tmp_db,
        """SELECT rank_set, step, step_id, op_name, group_name, rank, is_total, elapse_ms, wait_ms,
                                 sync_ms, transit_ms, hccs_bandwidth_gbps, hccs_large_packet_ratio, rdma_transit_mb,
                                 other_links, size_distribution
                          FROM comm_summary ORDER BY rank_set, step, op_name, rank""",
    )
    assert [r[:7] for r in got] == [
        ("(0, 1)", "step1", 1, "Total Op Info", None, 0, True),
        ("(0, 1)", "step1", 1, "Total Op Info", None, 1, True),
        ("(0, 1)", "step1", 1, "hcom_allReduce__1_0", "g1", 0, False),
        ("(0, 1)", "step1", 1, "hcom_allReduce__1_0", "g1", 1, False),
        ("(0, 1)", "step2", 2, "hcom_allReduce__1_1", "g1", 0, False),
        ("(2, 3)", "step1", 1, "hcom_send", None, 2, False),
    ]
    assert got[2][7:14] == (10.0, 8.0, 4.0, 2.0, 2.5, 0.25, 0.0)
    assert got[2][14] is None and json.loads(got[2][15]) == {"HCCS": {"0.003072": [18, 0.02]}}
    assert json.loads(got[4][14]) == {"UB": {"Bandwidth(GB/s)": 9}}


def test_communication_nan_and_bad_leaves(tmp_db, tmp_path):
    doc = comm_doc()
    doc["(0, 1)"]["step1"]["hcom_allReduce__1_0@g1"]["1"]["Communication Time Info"]["Wait Time(ms)"] = "slow"
    doc["(0, 1)"]["step2"]["hcom_allReduce__1_1@g1"]["x"] = leaf(1.0, 1.0, 1.0)
    text = json.dumps(doc).replace('"Idle Time(ms)": 0.5', '"Idle Time(ms)": NaN', 1)
    _, f = ingest_one(tmp_db, write(tmp_path / "cc.json", text))
    assert (f.status, f.rows_kept, f.rows_dropped) == ("salvaged", 5, 2)
    assert "NaN" in f.message
    drops = dict(rows(tmp_db, "SELECT position, reason FROM source_drops"))
    assert "not a number" in drops["key (0, 1) / step1 / hcom_allReduce__1_0@g1 / 1"]
    assert "rank key" in drops["key (0, 1) / step2 / hcom_allReduce__1_1@g1 / x"]
    assert rows(tmp_db, "SELECT count(*) FROM comm_summary WHERE idle_ms IS NULL") == [(1,)]


@pytest.mark.parametrize(
    "text, where, words",
    [
        (
            '{"(0, 1)": {"step": ["Communication Time Info"]}}',
            "(key (0, 1) / step)",
            "an object keyed by communication op",
        ),
        (
            '{"(0, 1)": {"step": {"op@g": {"0": {"Communication Time Info": {}}, "1": 5}}}}',
            "(key (0, 1) / step / op@g / 1)",
            "found a number",
        ),
        (
            '{"(0, 1)": {"step": {"op@g": {"0": {"Communication Time Info": {}}}}}, "rank0": {}}',
            "document",
            "not a rank set",
        ),
        ('{"(0, 1)": "Communication Time Info"}', "(key (0, 1))", "an object keyed by step"),
        (
            '{"(0, 1)": {"step": {"op@g": {"0": {"Communication Time Info": {"Elapse Time(ms)": 1',
            "byte",
            "not valid JSON",
        ),
        (
            '{"(0, 1)": {"step": {"op@g": {"0": {"Communication Time Info": 7}}}}}',
            "(key (0, 1) / step / op@g / 0)",
            "no usable communication entry",
        ),
    ],
)
def test_communication_wrong_shape_names_the_file(tmp_db, tmp_path, text, where, words):
    p = write(tmp_path / "cluster_communication.json", text)
    assert READER.sniff(p, read_head(p)) == "cluster_communication"
    rep, f = ingest_one(tmp_db, p)
    assert f.status == "failed" and rep.exit_code == 1
    assert f.message.startswith(str(p)) and where in f.message and words in f.message, f.message
    assert rows(tmp_db, "SELECT count(*) FROM comm_summary_rows") == [(0,)]


# -- real samples --------------------------------------------------------------------------------


@pytest.mark.realdata
def test_real_step_trace(tmp_db):
    p = real("cluster_step_trace_time.csv")
    with open(p, newline="") as fh:
        expect = list(csv.DictReader(fh))
    _, f = ingest_one(tmp_db, p)
    assert (f.format, f.status, f.rows_kept, f.rows_dropped, f.rank) == ("cluster_step", "ok", 9, 0, None)
    got = rows(tmp_db, f"SELECT {STEP_COLS} FROM step_trace ORDER BY line_no")
    assert [r[3] for r in got] == ["rank"] * 8 + ["stage"]
    assert [r[5] for r in got] == list(range(8)) + [None]
    assert got[8][4] == "(0, 1, 2, 3, 4, 5, 6, 7)"
    # rank 5, line 7, exactly as written
    assert got[5] == (
        7,
        None,
        None,
        "rank",
        "5",
        5,
        81367.62001562494,
        756374.86,
        7225.910000000033,
        763600.77,
        892836.8999843737,
        1730579.25,
        0.0,
        756374.86,
        None,
        None,
        None,
        None,
    )
    # every row equals float() of the file's text
    for row, e in zip(got, expect):
        assert row[6:8] == (float(e["Computing"]), float(e["Communication(Not Overlapped)"]))
        assert row[10] == float(e["Free"])


@pytest.mark.realdata
def test_real_communication(tmp_db):
    p = real("cluster_communication.json")
    doc = json.loads(p.read_text())
    leaves = [
        (rs, st, op, rk, v)
        for rs, steps in doc.items()
        for st, ops in steps.items()
        for op, ranks in ops.items()
        for rk, v in ranks.items()
    ]
    _, f = ingest_one(tmp_db, p)
    assert (f.format, f.status, f.rows_kept, f.rows_dropped) == ("cluster_communication", "ok", len(leaves), 0)
    assert len(leaves) == 4
    got = {
        (r[0], r[1]): r[2:]
        for r in rows(
            tmp_db,
            "SELECT op_name || '@' || group_name, rank, start_us, elapse_ms, wait_ms, hccs_bandwidth_gbps, "
            "sdma_transit_mb FROM comm_summary",
        )
    }
    for _rs, _st, op, rk, v in leaves:
        t, bw = v["Communication Time Info"], v["Communication Bandwidth Info"]
        assert got[(op, int(rk))] == (
            t["Start Timestamp(us)"],
            t["Elapse Time(ms)"],
            t["Wait Time(ms)"],
            bw["HCCS"]["Bandwidth(GB/s)"],
            bw["SDMA"]["Transit Size(MB)"],
        )
    assert got[("hcom_broadcast__501_0@6297232067196334501", 0)][1] == 121.73694384375


@pytest.mark.realdata
def test_real_ascend_folder_ingests_every_file(tmp_db):
    if not ASCEND.is_dir():
        pytest.skip(f"{ASCEND} is absent")
    rep = ingest_paths(tmp_db, [ASCEND], run="ascend")
    by_name = {Path(f.path).name: f for f in rep.files}
    assert {n: f.status for n, f in by_name.items() if f.status != "ok"} == {}
    assert by_name["cluster_step_trace_time.csv"].format == "cluster_step"
    assert by_name["cluster_communication.json"].format == "cluster_communication"
    for name in ("cluster_step_trace_time.csv", "cluster_communication.json"):
        assert "no rank" not in by_name[name].message
    # only the per-rank files (kernel_details x2, trace_view) are reported rank-less
    assert any("3 file(s) have no rank" in w for w in rep.warnings), rep.warnings


# -- the cluster-step-skew query -----------------------------------------------------------------


def skew_db(db, tmp_path, lines, run="r"):
    p = write(tmp_path / f"{run}.csv", "\n".join([BASE_HEADER, *lines]) + "\n")
    rep = ingest_paths(db, [p], run=run)
    assert rep.exit_code == 0, rep.files[0].message


def test_query_flags_slow_compute_rank_per_step(tmp_db, tmp_path):
    # step 1: rank 2 computes 30% longer, the others wait for it in communication; step 2 balanced.
    skew_db(
        tmp_db,
        tmp_path,
        [
            step_row(1, "rank", 0, 1000.0, 400.0, 50.0),
            step_row(1, "rank", 1, 1000.0, 400.0, 50.0),
            step_row(1, "rank", 2, 1300.0, 100.0, 50.0),
            step_row(1, "rank", 3, 1000.0, 400.0, 50.0),
            step_row(1, "stage", '"(0, 1, 2, 3)"', 1.0, 1.0, 99999.0),  # never compared with ranks
            step_row(2, "rank", 0, 1000.0, 100.0, 50.0),
            step_row(2, "rank", 1, 1010.0, 95.0, 45.0),
            step_row(2, "rank", 2, 1005.0, 100.0, 45.0),
            step_row(2, "rank", 3, 1000.0, 100.0, 50.0),
        ],
    )
    res = slowcard.query(tmp_db, "cluster-step-skew", run="r")
    assert res.status == "FAIL"
    got = {r["dimension"]: r for r in res.rows}
    assert set(got) == {"computing", "communication_not_overlapped"}
    assert all(r["step"] == "1" for r in res.rows)
    c = got["computing"]
    assert (c["cause"], c["suspect_rank"], c["max_rank"], c["min_rank"]) == ("compute-skew", 2, 2, 0)
    assert (c["max_us"], c["min_us"], c["mean_us"], c["mean_step_us"], c["n_ranks"]) == (
        1300.0,
        1000.0,
        1075.0,
        1450.0,
        4,
    )
    assert c["gap_share"] == round(300 / 1450, 4)
    m = got["communication_not_overlapped"]
    assert (m["cause"], m["suspect_rank"], m["max_rank"], m["min_rank"]) == ("comm-skew", 2, 0, 2)
    assert "rank 2" in res.summary
    # a higher threshold: nothing flagged
    res = slowcard.query(tmp_db, "cluster-step-skew", run="r", params={"min_gap_share": 0.25})
    assert (res.status, res.rows) == ("PASS", [])
    assert "0.25" in res.summary


def test_query_skips_without_step_trace(tmp_db, tmp_path):
    # a run holding only a cluster_communication.json: step_trace has no rows for it
    ingest_paths(tmp_db, [write(tmp_path / "cc.json", json.dumps(comm_doc()))], run="comm_only")
    res = slowcard.query(tmp_db, "cluster-step-skew", run="comm_only")
    assert res.status == "SKIP" and "step_trace" in res.summary


@pytest.mark.realdata
def test_query_on_real_step_trace_cli(tmp_db):
    p = real("cluster_step_trace_time.csv")
    ingest_paths(tmp_db, [p], run="ascend")
    res = CliRunner().invoke(app, ["query", "cluster-step-skew", "--db", str(tmp_db), "--format", "json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert [(d["query"], d["version"], d["run"], d["status"]) for d in doc] == [
        ("cluster-step-skew", 3, "ascend", "FAIL")
    ]
    got = {r["dimension"]: r for r in doc[0]["rows"]}
    # Computing differs by ~1.6 ms of a ~1.7 s step: not flagged. Communication(Not Overlapped)
    # and Free swap between ranks 1 and 5: rank 5 waits most, rank 1 idles most and waits least.
    assert set(got) == {"communication_not_overlapped", "free"}
    comm, free = got["communication_not_overlapped"], got["free"]
    assert (comm["max_rank"], comm["min_rank"], comm["suspect_rank"]) == (5, 1, 1)
    assert (free["max_rank"], free["min_rank"], free["suspect_rank"]) == (1, 5, 1)
    assert (comm["max_us"], comm["min_us"], comm["n_ranks"], comm["step"]) == (756374.9, 133386.0, 8, "all")
    assert 0.36 < comm["gap_share"] < 0.37 and 0.34 < free["gap_share"] < 0.35
    assert doc[0]["rows"][0]["dimension"] == "communication_not_overlapped"  # largest gap first
