"""Ascend operator CSVs (kernel_details.csv, msprof op_summary_*.csv): sniffing, header variants,
value cleaning, exact ns, gmm_tokens, salvage with line numbers, refusals."""

from __future__ import annotations

import csv
import gzip
import io
import random
import shutil
from decimal import Decimal
from pathlib import Path

import pytest

from slowcard import store
from slowcard.errors import InputError
from slowcard.ingest import base
from slowcard.ingest.op_csv import READER

ROOT = Path(__file__).resolve().parents[1]
OPS = ROOT / "testdata" / "ops"
BAD = ROOT / "testdata" / "bad"
REALDATA = Path(__file__).resolve().parents[1].parent / "shared" / "realdata"
ASCEND = REALDATA / "ascend"


def real(name: str) -> Path:
    p = ASCEND / name
    if not p.exists():
        pytest.skip(f"real sample {p} is absent (../shared/realdata not checked out beside the repo)")
    return p


@pytest.fixture(scope="module")
def template_db(tmp_path_factory):
    """An empty database with the schema, created once (copying it is much cheaper)."""
    path = tmp_path_factory.mktemp("template") / "empty.duckdb"
    store.open_db(path).close()
    return path


@pytest.fixture
def con(tmp_path, template_db):
    path = tmp_path / "t.duckdb"
    shutil.copyfile(template_db, path)
    c = store.open_db(path)
    yield c
    c.close()


def ingest(con, path: Path, run: str = "r") -> tuple[int, base.Outcome]:
    """Ingest one file the way the driver does: one transaction, a claimed source id."""
    path = Path(path)
    fmt = READER.sniff(path, base.read_head(path))
    con.execute("BEGIN")
    try:
        store.ensure_run(con, run, None)
        sid = store.claim_source(con, run, str(path), path.stat().st_size, "fp")
        out = READER.ingest(base.Context(path, fmt or "kernel_details", sid, run, con, base.IngestOptions()))
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    assert out.rows_seen == out.rows_kept + out.rows_dropped
    assert sum(n for _, _, n in out.drops) == out.rows_dropped
    return sid, out


def ops(con, sid, cols="*"):
    return con.execute(f"SELECT {cols} FROM ops WHERE source_id = ? ORDER BY line_no", [sid]).fetchall()


def csv_rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        return list(csv.DictReader(f))


def us_to_ns(text: str) -> int:
    return int((Decimal(text.strip()) * 1000).to_integral_value())


# -- sniff ---------------------------------------------------------------------------------------


def test_sniff_by_header_content(tmp_path):
    for name, want in [
        ("kernel_details_block_num.csv", "kernel_details"),
        ("kernel_details_block_dim.csv", "kernel_details"),
        ("kernel_details_level0.csv", "kernel_details"),
        ("op_summary_unquoted_tab.csv", "op_summary"),
    ]:
        p = OPS / name
        assert READER.sniff(p, base.read_head(p)) == want, name
    # The file name plays no part: an op_summary named like kernel_details is still op_summary.
    renamed = tmp_path / "kernel_details.csv"
    shutil.copyfile(OPS / "op_summary_unquoted_tab.csv", renamed)
    assert READER.sniff(renamed, base.read_head(renamed)) == "op_summary"
    # A UTF-8 BOM before the header.
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + (OPS / "kernel_details_block_dim.csv").read_bytes())
    assert READER.sniff(bom, base.read_head(bom)) == "kernel_details"


def test_sniff_refuses_json_and_unrelated_csv(tmp_path):
    js = tmp_path / "kernel_details.json"
    js.write_text('[{"name": "Name,Start Time(us),Duration(us)", "ph": "X", "ts": "1"}]')
    assert READER.sniff(js, base.read_head(js)) is None
    other = tmp_path / "op_summary_0.csv"
    other.write_text("Step,Computing,Communication(Not Overlapped),Free\n1,10,2,3\n")
    assert READER.sniff(other, base.read_head(other)) is None
    # Name and Start Time(us) without Duration(us) is not claimed as kernel_details.
    half = tmp_path / "half.csv"
    half.write_text("Name,Start Time(us)\nop,1\n")
    assert READER.sniff(half, base.read_head(half)) is None
    trace = ASCEND / "trace_view.json"
    if trace.exists():
        assert READER.sniff(trace, base.read_head(trace)) is None
    step = ASCEND / "cluster_step_trace_time.csv"
    if step.exists():
        assert READER.sniff(step, base.read_head(step)) is None


# -- real samples --------------------------------------------------------------------------------


@pytest.mark.realdata
def test_real_kernel_details(con):
    p = real("kernel_details.csv")
    expect = csv_rows(p)
    sid, out = ingest(con, p)
    assert (out.rows_seen, out.rows_kept, out.status) == (len(expect), len(expect), "ok")
    got = ops(
        con,
        sid,
        "line_no, name, op_type, ts_ns, dur_ns, wait_ns, block_num, step_id, "
        "input_shapes, extra->>'HF32 Eligible', extra->>'cube_utilization(%)'",
    )
    assert len(got) == len(expect)
    first = got[0]
    assert first[0] == 2
    # "1736413971558972.912\t" in the file: exact ns, tab stripped.
    assert first[3] == 1736413971558972912
    assert (first[1], first[2], first[4], first[5], first[6], first[7]) == (
        "aclnnMatmul_MatMulCommon_MatMulV2",
        "MatMulV2",
        185504,
        1087,
        16,
        19,
    )
    assert first[8] == "81920,4096;8192,512"  # the literal quotes are gone
    assert (first[9], first[10]) == ("NO", "79.295")
    # Every row's ns equal the exact decimal value of its text.
    assert [r[3] for r in got] == [us_to_ns(r["Start Time(us)"]) for r in expect]
    assert [r[4] for r in got] == [us_to_ns(r["Duration(us)"]) for r in expect]
    assert out.metadata["block_column"] == "Block Dim" and out.metadata["has_step_id"]
    assert not out.metadata["has_device_id"] and out.rank_hints == {}


@pytest.mark.realdata
def test_real_kernel_details_with_hccl(con):
    p = real("kernel_details_with_hccl.csv")
    expect = csv_rows(p)
    sid, out = ingest(con, p)
    assert out.rows_kept == len(expect) == out.rows_seen and out.rows_dropped == 0
    n_hccl = sum(r["Accelerator Core"] == "HCCL" for r in expect)
    assert n_hccl > 0
    hccl = con.execute(
        "SELECT name, op_type, task_id, stream_id, block_num, input_shapes, ts_ns, dur_ns, "
        "extra->>'aicore_time(us)' FROM ops WHERE source_id = ? AND accelerator_core = 'HCCL' "
        "ORDER BY line_no",
        [sid],
    ).fetchall()
    assert len(hccl) == n_hccl
    # hcom_broadcast__445_0: N/A task/stream ids and shapes are NULL; times exact.
    assert hccl[0][:6] == ("hcom_broadcast__445_0", "hcom_broadcast_", None, None, 0, None)
    assert (hccl[0][6], hccl[0][7], hccl[0][8]) == (1699529622793969500, 308926680, None)
    assert ops(con, sid, "ts_ns")[0][0] == us_to_ns(expect[0]["Start Time(us)"]) == 1699529622790614800
    assert {r[0] for r in ops(con, sid, "line_no")} == set(range(2, len(expect) + 2))


# -- header variants -----------------------------------------------------------------------------


def test_block_num_header_gmm_tokens_and_na(con):
    sid, out = ingest(con, OPS / "kernel_details_block_num.csv")
    assert (out.rows_kept, out.status) == (4, "ok")
    rows = ops(
        con,
        sid,
        "name, step_id, device_id, model_id, task_id, block_num, mix_block_num, "
        "op_state, accelerator_core, ts_ns, dur_ns, wait_ns, end_ns, input_shapes, "
        "output_shapes, gmm_tokens, extra->>'Context ID', extra->>'HF32 Eligible'",
    )
    gmm, mm, hccl, swiglu = rows
    assert gmm[:9] == (
        "aclnnGroupedMatmulV4_GroupedMatmul_GroupedMatmul",
        3,
        2,
        4294967295,
        "101",
        24,
        48,
        "dynamic",
        "MIX_AIC",
    )
    assert (gmm[9], gmm[10], gmm[11], gmm[12]) == (1780676244313289125, 812500, 1250, 1780676244313289125 + 812500)
    assert gmm[13] == "1024,7168;256,7168,4096;256;256" and gmm[14] == "1024,4096"
    # ep_load_balance rule: first dims of all shapes but the last two: 1024 + 256.
    assert gmm[15] == 1280
    assert gmm[16] is None and gmm[17] == "NO"  # N/A in extra -> null
    assert mm[15] is None and mm[10] == 100002
    # The HCCL row: N/A everywhere except name / type / times.
    assert hccl[4:9] == (None, None, None, None, "HCCL")
    assert (hccl[9], hccl[10], hccl[11]) == (1780676244314400500, 1500750, 99999)
    assert hccl[13] is None and hccl[15] is None
    # The fused GroupedMatmulSwiglu is not counted by the rule (its inputs are not x lists).
    assert swiglu[15] is None
    assert out.metadata["block_column"] == "Block Num"
    assert out.metadata["has_step_id"] and out.metadata["has_device_id"] and not out.metadata["level0"]
    assert out.metadata["extra_columns"] == ["HF32 Eligible", "Context ID", "aicore_time(us)", "aic_mac_ratio"]
    assert out.rank_hints == {"device_id": 2}
    # The view's units.
    ts_us, dur_us, wait_us = con.execute(
        "SELECT ts_us, dur_us, wait_us FROM ops WHERE source_id = ? AND line_no = 2", [sid]
    ).fetchone()
    assert (dur_us, wait_us) == (812.5, 1.25) and abs(ts_us - 1780676244313289.125) < 0.5


def test_block_dim_header_without_step_and_device(con):
    sid, out = ingest(con, OPS / "kernel_details_block_dim.csv")
    assert out.rows_kept == 2
    rows = ops(
        con,
        sid,
        "step_id, device_id, op_state, task_id, block_num, mix_block_num, ts_ns, "
        "dur_ns, wait_ns, input_shapes, extra->>'aiv_time(us)'",
    )
    assert rows[0] == (None, None, None, "7", 48, 0, 1699529622790614800, 607980, 0, "544404480", "587.05")
    # An unquoted start time without a tab, no decimals.
    assert rows[1][6] == 1699529622791300000 and rows[1][8] == 77220
    assert out.metadata["block_column"] == "Block Dim"
    assert not out.metadata["has_step_id"] and not out.metadata["has_device_id"]
    assert out.rank_hints == {}


def test_level0_header(con):
    sid, out = ingest(con, OPS / "kernel_details_level0.csv")
    assert out.rows_kept == 2 and out.metadata["level0"]
    rows = ops(
        con, sid, "device_id, task_id, stream_id, op_type, block_num, mix_block_num, ts_ns, dur_ns, gmm_tokens, extra"
    )
    assert rows[0][:9] == (5, None, None, "GroupedMatmul", 24, None, 1780676244400000000, 400000, 512 + 256)
    assert rows[1][6:9] == (1780676244400500250, 35500, None)
    assert rows[0][9] == "{}"  # every column of the Level0 header is mapped
    assert out.rank_hints == {"device_id": 5}


def test_op_summary_unquoted_tab(con):
    sid, out = ingest(con, OPS / "op_summary_unquoted_tab.csv")
    assert out.metadata["header_variant"] == "op_summary" and out.rows_kept == 3
    rows = ops(
        con,
        sid,
        "device_id, name, op_type, accelerator_core, ts_ns, dur_ns, wait_ns, "
        "block_num, input_shapes, output_shapes, extra->>'Model Name', extra->>'Infer ID'",
    )
    assert rows[0] == (
        0,
        "aclnnAdd_AddAiCore_Add",
        "Add",
        "AI_VECTOR_CORE",
        1780676244313289000,
        3200,
        0,
        8,
        "4096;4096",
        "4096",
        None,
        None,
    )
    assert rows[1][:8] == (
        0,
        "hcom_allReduce__360_0_1",
        "hcom_allReduce_",
        "COMMUNICATION",
        1780676244313300040,
        250500,
        7790,
        None,
    )
    assert rows[2][0] == 1 and rows[2][4] == 1780676244313290500
    # Two devices in one file: no single device hint, both listed.
    assert out.rank_hints == {} and out.metadata["device_ids"] == [0, 1]


def test_bom_crlf_and_gzip(con, tmp_path):
    src = (OPS / "kernel_details_block_num.csv").read_bytes()
    variant = tmp_path / "bom_crlf.csv"
    variant.write_bytes(b"\xef\xbb\xbf" + src.replace(b"\n", b"\r\n"))
    gz = tmp_path / "kernel_details.csv.gz"
    gz.write_bytes(gzip.compress(src))
    plain_sid, _ = ingest(con, OPS / "kernel_details_block_num.csv")
    want = ops(con, plain_sid, "line_no, name, step_id, ts_ns, dur_ns, wait_ns, input_shapes, extra")
    for p in (variant, gz):
        sid, out = ingest(con, p)
        assert out.status == "ok" and out.metadata["line_no_exact"]
        assert ops(con, sid, "line_no, name, step_id, ts_ns, dur_ns, wait_ns, input_shapes, extra") == want


# -- salvage and refusals --------------------------------------------------------------------------


def test_ragged_rows_salvaged_with_line_numbers(con):
    sid, out = ingest(con, BAD / "ops_ragged.csv")
    assert (out.rows_seen, out.rows_kept, out.rows_dropped, out.status) == (8, 4, 4, "salvaged")
    assert [r[0] for r in ops(con, sid, "line_no")] == [2, 3, 5, 8]
    assert [r[0] for r in ops(con, sid, "name")] == ["op_a", "op_b", "op_d", "op_g"]
    drops = {pos: reason for reason, pos, _ in out.drops}
    assert set(drops) == {"line 4", "line 6", "line 7", "line 9"}
    assert "fewer columns" in drops["line 4"] and "more columns" in drops["line 6"]
    assert drops["line 7"] == "bad Start Time(us) value abc" and drops["line 9"] == "missing Name"
    assert "4 of 8 rows dropped" in out.message and "line 4" in out.message
    # Nothing of the bad rows stays in the table, and no temp table is left behind.
    assert con.execute("SELECT count(*) FROM op_rows WHERE source_id = ?", [sid]).fetchone()[0] == 4
    assert con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE '_op_csv%'").fetchone()[0] == 0


def test_blank_line_and_multiline_field_line_numbers(con, tmp_path):
    for p in (BAD / "ops_blank_multiline.csv", tmp_path / "ml.csv.gz"):
        if p.suffix == ".gz":
            p.write_bytes(gzip.compress((BAD / "ops_blank_multiline.csv").read_bytes()))
        sid, out = ingest(con, p)
        assert out.metadata["line_no_exact"]
        assert ops(con, sid, "line_no, name, op_type, ts_ns") == [
            (2, "op_a", "Add", 2000000),
            (4, "op_b", "Add\nFused", 2001500),
            (7, "op_d", "Add", 2004250),
        ]
        assert [(pos, n) for _, pos, n in out.drops] == [("line 6", 1)]
        assert out.rows_seen == 4


def test_invalid_utf8_row_with_blank_line(con, tmp_path):
    """A non-UTF-8 row is dropped with its line; with a blank line the line numbers still come
    out exact, and the caller's transaction stays usable (the ingest helper commits)."""
    p = tmp_path / "latin.csv"
    p.write_bytes(b"Name,Type,Start Time(us),Duration(us)\nop_a,Add,1,1\n\nop_\xe9\xff,Add,2,1\nop_c,Add,3,1\n")
    sid, out = ingest(con, p)
    assert ops(con, sid, "line_no, name") == [(2, "op_a"), (5, "op_c")]
    [(reason, pos, n)] = out.drops
    assert reason.startswith("not UTF-8 text") and (pos, n) == ("line 4", 1)
    assert out.metadata["line_no_exact"]


def test_unusual_numbers(con, tmp_path):
    """Times that are not `digits.ddd`: exponent, more decimals (rounded to the ns), negative,
    blanks around; an out-of-range one is a dropped row, never an aborted ingest."""
    p = tmp_path / "numbers.csv"
    p.write_text(
        "Name,Type,Start Time(us),Duration(us),Wait Time(us)\n"
        "huge,T,99999999999999999999999999999,1,0\n"
        "exp,T,1.5e3,1,0\n"
        "many,T,1.23456,-2.5,0.0005\n"
        'blank,T," 7 \t",N/A,x\n'
        'int,T,"1736413971558972\t",3,0\n'
    )
    sid, out = ingest(con, p)
    assert ops(con, sid, "line_no, name, ts_ns, dur_ns, wait_ns") == [
        (3, "exp", 1500000, 1000, 0),
        (4, "many", 1235, -2500, 1),
        (6, "int", 1736413971558972000, 3000, 0),
    ]
    assert out.drops == [
        ("bad Start Time(us) value 99999999999999999999999999999", "line 2", 1),
        ("missing Duration(us)", "line 5", 1),
    ]


def test_missing_required_column(con):
    p = BAD / "ops_missing_duration.csv"
    assert READER.sniff(p, base.read_head(p)) == "op_summary"
    with pytest.raises(InputError) as ei:
        ingest(con, p)
    msg = str(ei.value)
    assert str(p) in msg and "Task Duration(us)" in msg and "Duration(us)" in msg
    assert "Device_id,Model ID,Task ID,Stream ID,Op Name,OP Type" in msg  # the header found
    assert ei.value.position == "line 1"


def test_empty_file_refused(con, tmp_path):
    with pytest.raises(InputError) as ei:
        ingest(con, BAD / "ops_empty.csv")
    assert "empty file" in str(ei.value) and "ops_empty.csv" in str(ei.value)
    blank_first = tmp_path / "blank.csv"
    blank_first.write_text("\nName,Start Time(us),Duration(us)\nop,1,2\n")
    with pytest.raises(InputError, match="empty first line"):
        ingest(con, blank_first)


def test_header_only_and_rollback(con, tmp_path):
    p = tmp_path / "header_only.csv"
    p.write_text("Name,Type,Start Time(us),Duration(us)\n")
    sid, out = ingest(con, p)
    assert (out.rows_seen, out.rows_kept, out.status) == (0, 0, "ok") and "no operator rows" in out.message
    # The reader writes inside the caller's transaction: a rollback leaves nothing.
    con.execute("BEGIN")
    sid2 = store.claim_source(con, "r", str(OPS / "kernel_details_level0.csv"), 1, "fp")
    READER.ingest(
        base.Context(OPS / "kernel_details_level0.csv", "kernel_details", sid2, "r", con, base.IngestOptions())
    )
    assert con.execute("SELECT count(*) FROM op_rows WHERE source_id = ?", [sid2]).fetchone()[0] == 2
    con.execute("ROLLBACK")
    assert con.execute("SELECT count(*) FROM op_rows WHERE source_id = ?", [sid2]).fetchone()[0] == 0


# -- line accounting against Python's csv module on generated files --------------------------------

_HDR = ["Name", "Type", "Start Time(us)", "Duration(us)", "Input Shapes"]


def _generated(rng: random.Random) -> str:
    lines = [",".join(_HDR)]
    for i in range(rng.randint(1, 40)):
        r = rng.random()
        if r < 0.08:
            lines.append("")
        elif r < 0.14:
            lines.append(f"op{i},T,{i}.5,1")  # short
        elif r < 0.18:
            lines.append(f"op{i},T,{i}.5,1,x,y")  # long
        elif r < 0.24:
            lines.append(f'op{i},"multi\nline",{i}.5,1,"""1,2"""')  # field over 2 lines
        elif r < 0.28:
            lines.append(f"op{i},T,abc,1,x")  # bad start time
        elif r < 0.31:
            lines.append(f"N/A,T,{i},1,x")  # no name
        elif r < 0.34:
            lines.append(f'op{i},"a\n\nb",{i},1,x')  # blank line inside quotes
        else:
            lines.append(f'op{i},T,"{1736413971558972 + i}.123\t",2.5,"""4,5;6"""')
    nl = rng.choice(["\n", "\r\n"])
    return nl.join(line.replace("\n", nl) for line in lines) + rng.choice([nl, "", nl + nl])


def _reference(text: str) -> tuple[list[int], list[int]]:
    """(lines of kept rows, lines of dropped rows) by Python's csv module."""
    rd = csv.reader(io.StringIO(text, newline=""))
    prev, kept, dropped = 0, [], []
    for n, rec in enumerate(rd):
        start, prev = prev + 1, rd.line_num
        if n == 0 or rec == []:
            continue
        if len(rec) != len(_HDR):
            dropped.append(start)
            continue
        try:
            float(rec[2])
            ok = rec[0] != "N/A"
        except ValueError:
            ok = False
        (kept if ok else dropped).append(start)
    return kept, dropped


def test_line_numbers_match_csv_module(con, tmp_path):
    rng = random.Random(20260603)
    for i in range(15):
        text = _generated(rng)
        p = tmp_path / f"g{i}.csv"
        p.write_bytes(text.encode())
        sid, out = ingest(con, p)
        kept, dropped = _reference(text)
        assert [r[0] for r in ops(con, sid, "line_no")] == kept, text
        assert sorted(int(pos.split()[1]) for _, pos, _ in out.drops) == dropped, text
        assert out.metadata["line_no_exact"]
        assert out.status == ("salvaged" if dropped else "ok")


def test_many_drops_are_summed_after_the_first_hundred(con, tmp_path):
    p = tmp_path / "many_bad.csv"
    lines = ["Name,Start Time(us),Duration(us)"]
    for i in range(160):
        lines.append(f"op{i},{i},1" if i % 4 == 0 else f"op{i},{i}")  # 120 short rows
    p.write_text("\n".join(lines) + "\n")
    sid, out = ingest(con, p)
    assert (out.rows_kept, out.rows_dropped) == (40, 120)
    singles, summed = out.drops[:100], out.drops[100:]
    assert all(n == 1 for _, _, n in singles) and singles[0][1] == "line 3"
    # The 101st short row is row i=134 (line 136); the last is i=159 (line 161).
    assert [(pos, n) for _, pos, n in summed] == [("lines 136-161 (20 rows)", 20)]
    assert [r[0] for r in ops(con, sid, "line_no")] == list(range(2, 162, 4))
