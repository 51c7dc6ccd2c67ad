"""Ingest of msServiceProfiler CSVs: batch.csv, request.csv, kvcache.csv (both shapes), forward.csv."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
import synth_service as ss  # noqa: E402

from slowcard import store  # noqa: E402
from slowcard.errors import InputError  # noqa: E402
from slowcard.ingest import base, detect, ingest_paths  # noqa: E402
from slowcard.ingest.service_csv import READER, ResListError, epoch_unit, parse_res_list  # noqa: E402

BATCH_HEADER = (
    "name,res_list,start_datetime,end_datetime,during_time(ms),batch_type,prof_id,batch_size,"
    "prefill_batch_size,decode_batch_size,prefill_scheduled_tokens,decode_scheduled_tokens,"
    "total_scheduled_tokens,dp_rank,start_time(ms),end_time(ms)\n"
)


def batch_line(res_list: str, dp: str = "0", start_us: int = 1773992798123456, name="batchFrameworkProcessing") -> str:
    cell = '"' + res_list.replace('"', '""') + '"'
    return (
        f"{name},{cell},2026-03-20 15:46:38:123456,2026-03-20 15:46:38:125012,1.556,Prefill,"
        f"ms_service_n0-11,1.0,1,0,812,0,812,{dp},{start_us}.0,{start_us + 1556}.0\n"
    )


@pytest.fixture(scope="module")
def template_db(tmp_path_factory):
    """An empty database with the schema applied once (creating the schema costs seconds)."""
    db = tmp_path_factory.mktemp("template") / "empty.duckdb"
    store.open_db(db).close()
    return db


@pytest.fixture(autouse=True)
def _template(template_db):
    global TEMPLATE
    TEMPLATE = template_db


TEMPLATE: Path | None = None


def ingest_one(db: Path, path: Path, run: str = "r"):
    if not db.exists() and TEMPLATE is not None:
        shutil.copy(TEMPLATE, db)
    rep = ingest_paths(db, [path], run=run)
    assert len(rep.files) == 1
    return rep.files[0]


def con_of(db: Path):
    return store.open_db(db, read_only=True)


@pytest.fixture(scope="module")
def gen_run(tmp_path_factory, template_db):
    """One generated 4-DP run (request skew) ingested whole; returns (folder, db, counts)."""
    d = tmp_path_factory.mktemp("svc")
    cfg = ss.config_for("request_skew", duration_s=12.0, spec_columns=True)
    counts = ss.write_run(d / "run", cfg)
    db = d / "t.duckdb"
    shutil.copy(template_db, db)
    rep = ingest_paths(db, [d / "run"], run="gen")
    return d / "run", db, counts, rep


# ----------------------------------------------------------------------------- recognition


def test_each_file_is_recognised_by_its_header_not_its_name(gen_run, tmp_path):
    folder, *_ = gen_run
    expected = {
        "batch.csv": "service_batch",
        "request.csv": "service_request",
        "kvcache.csv": "service_kvcache",
        "forward.csv": "service_forward",
    }
    for name, fmt in expected.items():
        renamed = tmp_path / f"data_{fmt}.txt"
        shutil.copy(folder / name, renamed)
        reader, got = detect(renamed)
        assert reader is READER and got == fmt
    (tmp_path / "old_kv.csv").write_text("rid,name,start_time,device_kvcache_left,kvcache_usage_rate\n")
    assert detect(tmp_path / "old_kv.csv")[1] == "service_kvcache"
    (tmp_path / "other.csv").write_text("a,b,c\n1,2,3\n")
    assert READER.sniff(tmp_path / "other.csv", b"a,b,c\n1,2,3\n") is None
    assert READER.sniff(tmp_path / "x.json", b'[{"name": "res_list", "ph": "X"}]') is None


def test_generated_run_ingests_every_file_whole(gen_run):
    _, db, counts, rep = gen_run
    by_fmt = {f.format: f for f in rep.files}
    assert set(by_fmt) >= {"service_batch", "service_request", "service_kvcache", "service_forward"}
    for f in rep.files:
        assert f.status == "ok", f
    assert by_fmt["service_batch"].rows_kept == counts["batch_rows"]
    assert by_fmt["service_request"].rows_kept == counts["requests"]
    con = con_of(db)
    meta = json.loads(con.execute("SELECT metadata FROM sources WHERE format = 'service_batch'").fetchone()[0])
    assert meta["start_time(ms) unit"] == "us"
    assert meta["speculative columns"] is True and meta["kv columns"] is True
    assert meta["dp_ranks"] == 4


# ----------------------------------------------------------------------------- batch.csv


def test_batch_rows_phases_times_and_columns(gen_run):
    folder, db, *_ = gen_run
    con = con_of(db)
    phases = dict(con.execute("SELECT phase, count(*) FROM batches WHERE run = 'gen' GROUP BY 1").fetchall())
    n_batching = phases["batching"]
    spec = con.execute("SELECT count(*) FROM batches WHERE name = 'specDecoding'").fetchone()[0]
    assert phases["execution"] == n_batching + spec and spec > 0
    # line 2 is the first data row: its times are exact to the microsecond, in ns
    first = (folder / "batch.csv").read_text().splitlines()[1]
    start_us = int(first.split(",")[-2].split(".")[0])
    end_us = int(first.split(",")[-1].split(".")[0])
    row = con.execute(
        "SELECT start_ns, end_ns, during_ms, dp_rank, prof_id, batch_type, total_blocks, "
        "kvcache_usage_rate, accepted_ratio FROM batches WHERE line_no = 2"
    ).fetchone()
    assert row[0] == start_us * 1000 and row[1] == end_us * 1000
    assert row[2] == pytest.approx((end_us - start_us) / 1000, abs=0.002)
    assert row[3] in range(4) and row[4].startswith("ms_service_node0-")
    assert row[6] == 96 and 0 <= row[7] <= 1 and row[8] is None
    acc = con.execute(
        "SELECT accepted_ratio, accepted_ratio_per_pos FROM batches WHERE name = 'specDecoding' LIMIT 1"
    ).fetchone()
    assert acc[0] == pytest.approx(0.8125) and json.loads(acc[1]) == {"0": 0.9, "1": 0.725}


def test_res_list_expands_to_one_row_per_batch_and_request(gen_run):
    _, db, *_ = gen_run
    con = con_of(db)
    # every batch row's item count equals its request rows, and the batching rows' scheduled
    # tokens equal the sum over their res_list items (what the exporter computed)
    bad = con.execute("""
        SELECT count(*) FROM batches b
        LEFT JOIN (SELECT source_id, line_no, count(*) n, sum(num_scheduled_tokens) tok
                   FROM batch_requests GROUP BY ALL) r USING (source_id, line_no)
        WHERE coalesce(r.n, 0) <> b.res_list_items
           OR (b.phase = 'batching' AND r.tok <> b.total_scheduled_tokens)""").fetchone()[0]
    assert bad == 0
    row = con.execute("""SELECT r.rid, r.iter, r.req_type, r.num_prompt_tokens, r.num_computed_tokens, r.item_no
                         FROM batch_requests r JOIN batches b USING (source_id, line_no)
                         WHERE b.phase = 'batching' AND r.req_type = 1 LIMIT 1""").fetchone()
    assert row[0].startswith("cmpl-") and row[1] >= 1 and row[4] == row[3] + row[1] - 1 and row[5] >= 1
    # a request is served by exactly one DP domain
    assert con.execute("SELECT bool_or(several_dp) FROM _dp_request_facts").fetchone()[0] is False


def test_res_list_cells_that_do_not_parse_are_counted_with_their_lines(tmp_path):
    good = "[{'rid': 'a', 'iter': 0, 'type': 0, 'num_scheduled_tokens': 5, 'num_prompt_tokens': 5, 'num_computed_tokens': 0}]"
    lines = [
        batch_line(good),  # line 2: DuckDB path
        batch_line("[{'rid': 'b', 'iter': 0"),  # line 3: unterminated
        batch_line("[{'rid': \"it's\", 'iter': 2, 'type': 1}]"),  # line 4: Python path, parses
        batch_line("{'rid': 'c'}"),  # line 5: not a list
        batch_line("[{'iter': 3}, {'rid': 'd'}]"),  # line 6: item without rid
        batch_line("[{'rid': 'e', 'iter': None, 'type': True}]"),  # line 7: Python path, parses
        batch_line("[1, 2]"),  # line 8: JSON-valid, not dicts
        batch_line("__import__('os').system('echo pwned')"),  # line 9: never evaluated
        batch_line("", name="modelExec"),  # line 10: empty cell = no requests
        batch_line("N/A"),  # line 11: the profiler's missing value: requests unknown, not a bad cell
        batch_line("N/A+1"),  # line 12: not a literal; the reason names no memory address
    ]
    p = tmp_path / "batch.csv"
    p.write_text(BATCH_HEADER + "".join(lines))
    res = ingest_one(tmp_path / "t.duckdb", p)
    assert res.status == "salvaged" and res.rows_kept == 11 and res.rows_dropped == 0
    assert "did not parse" in res.message and "line 3" in res.message
    con = con_of(tmp_path / "t.duckdb")
    items = dict(con.execute("SELECT line_no, res_list_items FROM batches ORDER BY 1").fetchall())
    assert items == {2: 1, 3: None, 4: 1, 5: None, 6: None, 7: 1, 8: None, 9: None, 10: 0, 11: None, 12: None}
    # the rows stay: every drop is a 'cell' drop, and none adds to rows_dropped
    assert con.execute("SELECT DISTINCT scope FROM source_drops").fetchall() == [("cell",)]
    assert not con.execute("SELECT 1 FROM source_drops WHERE position LIKE '%11%'").fetchall()
    (reason12,) = con.execute("SELECT reason FROM source_drops WHERE position = 'line 12'").fetchone()
    assert "BinOp" in reason12 and "0x" not in reason12, reason12
    reqs = con.execute("SELECT line_no, rid, iter, req_type FROM batch_requests ORDER BY 1").fetchall()
    assert reqs == [(2, "a", 0, 0), (4, "it's", 2, 1), (7, "e", None, None)]
    drops = con.execute("SELECT reason, position, n_rows FROM source_drops ORDER BY position").fetchall()
    positions = {pos: reason for reason, pos, _ in drops}
    assert "line 3" in positions and "not a Python literal" in positions["line 3"]
    assert "expected a list" in positions["line 5"]
    assert any("item 1" in r and ("6" in p and "8" in p) for r, p, _ in drops), drops
    assert "line 9" in positions
    assert sum(n for *_, n in drops) == 6


def test_csv_rows_the_reader_cannot_split_are_dropped_and_later_lines_keep_their_numbers(tmp_path):
    good = "[{'rid': 'a', 'iter': 0}]"
    p = tmp_path / "batch.csv"
    p.write_text(
        BATCH_HEADER
        + batch_line(good)
        + "batchFrameworkProcessing,too,few\n"
        + batch_line(good, dp="1")
        + batch_line(good, dp="<NA>")
        + batch_line(good, dp="")
    )
    res = ingest_one(tmp_path / "t.duckdb", p)
    assert res.status == "salvaged" and res.rows_kept == 4 and res.rows_dropped == 1
    assert "line 3" in res.message and "2 row(s) without dp_rank at lines 5, 6" in res.message
    con = con_of(tmp_path / "t.duckdb")
    assert con.execute("SELECT position FROM source_drops").fetchone()[0] == "line 3"
    got = con.execute("SELECT line_no, dp_rank FROM batches ORDER BY line_no").fetchall()
    assert got == [(2, 0), (4, 1), (5, None), (6, None)]
    assert con.execute("SELECT rows_seen FROM sources").fetchone()[0] == 5


def test_dp_rank_na_float_and_missing_column(tmp_path):
    p = tmp_path / "batch.csv"
    good = "[{'rid': 'a'}]"
    p.write_text(BATCH_HEADER + batch_line(good, dp="<NA>") + batch_line(good, dp="3.0") + batch_line(good, dp="nan"))
    ingest_one(tmp_path / "t.duckdb", p)
    con = con_of(tmp_path / "t.duckdb")
    assert [r[0] for r in con.execute("SELECT dp_rank FROM batches ORDER BY line_no").fetchall()] == [None, 3, None]
    con.close()
    # no dp_rank column at all: rows load with dp_rank NULL and the message says what that means
    q = tmp_path / "nodp" / "batch.csv"
    q.parent.mkdir()
    q.write_text(BATCH_HEADER.replace("dp_rank,", "") + batch_line(good).replace(",0,1773", ",1773"))
    res = ingest_one(tmp_path / "t2.duckdb", q)
    assert res.status == "ok" and "no dp_rank" in res.message


def test_batch_end_from_during_time_when_the_file_has_no_end_columns(tmp_path):
    """Without end_time(ms) / end_datetime a batch ends during_time(ms) after its start: 1.556 ms
    is 1,556,000 ns (the unit of a duration column is ms whatever unit start_time has)."""
    header = BATCH_HEADER.replace("end_datetime,", "").replace(",end_time(ms)", "")
    good = "[{'rid': 'a'}]"
    rows = []
    for _k, start_us in enumerate((1773992798123456, 1773992798223456)):
        line = batch_line(good, start_us=start_us).replace(",2026-03-20 15:46:38:125012", "")
        rows.append(line.rsplit(",", 1)[0] + "\n")
    p = tmp_path / "batch.csv"
    p.write_text(header + "".join(rows))
    res = ingest_one(tmp_path / "t.duckdb", p)
    assert res.status == "ok", res.message
    con = con_of(tmp_path / "t.duckdb")
    got = con.execute("SELECT start_ns, end_ns, during_ms FROM batches ORDER BY line_no").fetchall()
    con.close()
    assert [(e - s, d) for s, e, d in got] == [(1_556_000, 1.556)] * 2
    assert got[0][0] == 1773992798123456 * 1000


def test_microseconds_and_milliseconds_are_told_apart_by_magnitude(tmp_path):
    dirs = {}
    for unit in ("us", "ms"):
        cfg = ss.config_for("balanced", duration_s=3.0, time_unit=unit)
        ss.write_run(tmp_path / unit, cfg)
        dirs[unit] = tmp_path / unit / "batch.csv"
    # the same rows without any numeric time: only the Asia/Shanghai datetime strings
    text = dirs["us"].read_text().splitlines()
    cut = [line.rsplit(",", 2)[0] for line in text]
    (tmp_path / "dt").mkdir()
    (tmp_path / "dt" / "batch.csv").write_text("\n".join(cut) + "\n")
    dirs["dt"] = tmp_path / "dt" / "batch.csv"
    starts = {}
    for key, path in dirs.items():
        db = tmp_path / f"{key}.duckdb"
        res = ingest_one(db, path, run=key)
        assert res.status == "ok"
        con = con_of(db)
        meta = json.loads(con.execute("SELECT metadata FROM sources").fetchone()[0])
        if key != "dt":
            assert meta["start_time(ms) unit"] == key
            assert meta["start_time(ms) minus start_datetime (Asia/Shanghai), first row"] == "+0.000 s"
        else:
            assert "start_time(ms) unit" not in meta and res.message.startswith("times from start_datetime")
        starts[key] = con.execute(
            "SELECT list(start_ns ORDER BY line_no), list(end_ns ORDER BY line_no) FROM batches"
        ).fetchone()
        con.close()
    assert starts["us"] == starts["ms"] == starts["dt"]
    assert starts["us"][0][0] % 1000 == 0 and starts["us"][0][0] > 1.7e18


def test_epoch_unit_by_magnitude():
    assert epoch_unit([1.773992798123456e15]) == ("us", 1000)
    assert epoch_unit([1773992798123.456]) == ("ms", 1_000_000)
    assert epoch_unit([1.773992798e18]) == ("ns", 1)
    assert epoch_unit([1773992798.5]) == ("s", 1_000_000_000)
    assert epoch_unit([12.5, 40.0]) is None and epoch_unit([]) is None


def test_missing_required_column_names_file_and_column(tmp_path):
    p = tmp_path / "batch.csv"
    p.write_text(BATCH_HEADER.replace("during_time(ms),", "") + "x\n")
    res = ingest_one(tmp_path / "t.duckdb", p)
    assert res.status == "failed"
    assert str(p) in res.message and "during_time(ms)" in res.message and "line 1" in res.message
    q = tmp_path / "request.csv"
    q.write_text("http_rid,start_datetime,reply_token_size\nr1,2026-03-20 15:46:38:000001,3\n")
    shutil.copy(TEMPLATE, tmp_path / "u.duckdb")
    with pytest.raises(InputError, match="recv_token_size"):
        con = store.open_db(tmp_path / "u.duckdb")
        READER.ingest(base.Context(q, "service_request", 1, "r", con, base.IngestOptions()))
    # nothing half-written stays visible
    assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 0


# ----------------------------------------------------------------------------- other files


def test_request_csv(gen_run):
    folder, db, counts, _ = gen_run
    con = con_of(db)
    n, na, mx = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE cache_hit_rate IS NULL), max(queue_wait_ms) FROM requests"
    ).fetchone()
    assert n == counts["requests"] and na == n and mx > 0
    first = (folder / "request.csv").read_text().splitlines()[1].split(",")
    row = con.execute("SELECT rid, start_ns, input_tokens, output_tokens FROM requests WHERE line_no = 2").fetchone()
    assert row == (first[0], int(first[-1]) * 1_000_000, int(first[2]), int(first[3]))


def test_forward_csv(gen_run):
    _, db, *_ = gen_run
    con = con_of(db)
    rows = con.execute("""SELECT prof_id, count(*), min(forward_iter), max(forward_iter),
                                 count(*) FILTER (WHERE bubble_ms IS NULL), count(DISTINCT dp_rank)
                          FROM forwards GROUP BY prof_id""").fetchall()
    assert len(rows) == 4
    for _prof, n, lo, hi, no_bubble, n_dp in rows:
        assert (lo, hi, no_bubble, n_dp) == (1, n, 1, 1)
    # the last forward of each process has no bubble; the others' bubble = next start - end
    assert (
        con.execute("""SELECT count(*) FROM (
        SELECT bubble_ms, (lead(start_ns) OVER (PARTITION BY prof_id ORDER BY forward_iter) - end_ns) / 1e6 AS gap
        FROM forwards) WHERE abs(bubble_ms - gap) > 0.002""").fetchone()[0]
        == 0
    )


@pytest.mark.parametrize("shape", ["blocks", "device"])
def test_kvcache_csv_both_shapes(tmp_path, shape):
    cfg = ss.config_for("balanced", duration_s=3.0, kvcache_shape=shape)
    ss.write_run(tmp_path / "run", cfg)
    res = ingest_one(tmp_path / "t.duckdb", tmp_path / "run" / "kvcache.csv")
    assert res.status == "ok" and shape in res.message
    con = con_of(tmp_path / "t.duckdb")
    n_lines = len((tmp_path / "run" / "kvcache.csv").read_text().splitlines()) - 1
    got = con.execute(
        "SELECT count(*), min(shape), max(shape), count(free_blocks), count(total_blocks), "
        "min(ts_ns) > 1.7e18, max(kvcache_usage_rate) <= 1 FROM kvcache"
    ).fetchone()
    assert got[:4] == (n_lines, shape, shape, n_lines)
    assert got[4] == (n_lines if shape == "blocks" else 0) and got[5] and got[6]
    if shape == "device":
        assert con.execute("SELECT count(rid) FROM kvcache").fetchone()[0] == n_lines
    con.close()
    # the same file gzip-compressed, under a name that says nothing
    gz = tmp_path / "kv_dump.bin"
    gz.write_bytes(gzip.compress((tmp_path / "run" / "kvcache.csv").read_bytes()))
    res = ingest_one(tmp_path / "t.duckdb", gz)
    assert res.format == "service_kvcache" and res.rows_kept == n_lines


# ----------------------------------------------------------------------------- res_list parsing


def test_parse_res_list_is_safe_and_strict():
    assert parse_res_list("[{'rid': 'x', 'iter': 3, 'type': 1, 'num_scheduled_tokens': 1}]") == [
        ("x", 3, 1, 1, None, None)
    ]
    assert parse_res_list("[]") == []
    for bad, why in [
        ("[{'rid': 'x'", "not a Python literal"),
        ("{'rid': 1}", "expected a list"),
        ("[{'iter': 1}]", "no 'rid'"),
        ("[5]", "is a int"),
        ("print('x')", "not a Python literal"),
        ("[" * 100000, "not a Python literal"),
    ]:
        with pytest.raises(ResListError, match=why):
            parse_res_list(bad)


_rid = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=12
)
_item = st.fixed_dictionaries(
    {
        "rid": _rid,
        "iter": st.integers(0, 10_000),
        "type": st.sampled_from([0, 1]),
        "num_scheduled_tokens": st.integers(0, 2**40),
    }
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cells=st.lists(st.lists(_item, max_size=4), min_size=1, max_size=12))
def test_duckdb_and_python_paths_agree_with_the_python_literal(tmp_path_factory, cells):
    """Whatever the rids hold (quotes, backslashes, unicode), rows equal what Python's own
    repr -> literal_eval round trip gives, whichever path (DuckDB or Python) parsed the cell."""
    d = tmp_path_factory.mktemp("prop")
    p = d / "batch.csv"
    p.write_text(BATCH_HEADER + "".join(batch_line(repr(c)) for c in cells), encoding="utf-8")
    res = ingest_one(d / "t.duckdb", p)
    assert res.status == "ok", res.message
    con = con_of(d / "t.duckdb")
    got = con.execute(
        "SELECT line_no, item_no, rid, iter, req_type, num_scheduled_tokens "
        "FROM batch_requests ORDER BY line_no, item_no"
    ).fetchall()
    want = [
        (i + 2, k + 1, it["rid"], it["iter"], it["type"], it["num_scheduled_tokens"])
        for i, c in enumerate(cells)
        for k, it in enumerate(c)
    ]
    assert got == want
    con.close()
