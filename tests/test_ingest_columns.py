"""Column-level behaviour of the service-CSV and communication-matrix readers that the count and
non-null checks elsewhere do not pin (issue 33): which items of a res_list are decode iterations
(the request type, else the iteration number), where a forward.csv row ends (its end_time(ms) in
µs or ms, else start + during_time(ms)), and a matrix link's direction and kind (src-dst as
written, p2p as p2p).
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from slowcard.ingest import ingest_paths

START_US = 1_773_992_798_123_456


def rows(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def ingest_ok(db: Path, path: Path, run: str = "r"):
    rep = ingest_paths(db, [path], run=run)
    assert [f.status for f in rep.files] == ["ok"], [(f.path, f.message) for f in rep.files]
    return rep.files[0]


# ------------------------------------------------------------------------- batch.csv res_list


def _batch_csv(path: Path, items_per_row: list[list[dict]]) -> Path:
    """batch.csv with one batching row per res_list (domain 0, 100 ms apart)."""
    lines = ["name,res_list,start_time(ms),end_time(ms),during_time(ms),batch_type,prof_id,batch_size,dp_rank"]
    for i, items in enumerate(items_per_row):
        start = START_US + i * 100_000
        cell = '"' + repr(items).replace('"', '""') + '"'
        lines.append(
            f"batchFrameworkProcessing,{cell},{start}.0,{start + 1000}.0,1.0,Decode,ms_service_n-1,{len(items)}.0,0"
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_decode_iterations_by_request_type_else_by_iteration(tmp_db, tmp_path):
    """A request generates one token at the end of prefill plus one per decode item. The item's
    type decides (1 = decode) when the exporter writes one, even against its iteration (a second
    prefill chunk has iter 1 and type 0); without a type, an item of iteration > 0 is a decode."""
    typed = [{"rid": "typed", "iter": k, "type": 0 if k == 0 else 1, "num_prompt_tokens": 700} for k in range(4)]
    untyped = [{"rid": "untyped", "iter": k, "num_prompt_tokens": 500} for k in range(6)]
    chunked = [
        {"rid": "chunked", "iter": 0, "type": 0, "num_prompt_tokens": 900},
        {"rid": "chunked", "iter": 1, "type": 0, "num_prompt_tokens": 900},  # the prompt's second chunk
        {"rid": "chunked", "iter": 2, "type": 1, "num_prompt_tokens": 900},
    ]
    # one batching row per iteration, each with the items of the requests still running
    per_row = [[r[k] for r in (typed, untyped, chunked) if k < len(r)] for k in range(6)]
    ingest_ok(tmp_db, _batch_csv(tmp_path / "batch.csv", per_row))
    got = dict(rows(tmp_db, "SELECT rid, generated_tokens FROM _dp_request_facts WHERE run = 'r'"))
    assert got == {"typed": 1 + 3, "untyped": 1 + 5, "chunked": 1 + 1}
    # the prompt length comes with it (and no request.csv: the output length is this count)
    req = dict(rows(tmp_db, "SELECT rid, (input_tokens, output_tokens) FROM _dp_requests WHERE run = 'r'"))
    assert req == {"typed": (700, 4), "untyped": (500, 6), "chunked": (900, 2)}


# ------------------------------------------------------------------------- forward.csv


FORWARD_HEADER = "name,relative_start_time(ms),during_time(ms),bubble_time(ms),batch_size,batch_type,forward_iter,dp_rank,prof_id,hostname"


def _forward_csv(path: Path, unit: str | None) -> Path:
    """Three forwards of 40 ms compute that end 2.5 ms after their compute (the end time is the
    row's own, not start + during); times in ``unit`` ("us" as the exporter writes, "ms"), or no
    numeric end column at all (None)."""
    lines = [FORWARD_HEADER + (",start_time(ms),end_time(ms)" if unit else ",start_time(ms)")]
    for k in range(3):
        start_us = START_US + k * 50_000
        end_us = start_us + 42_500
        fmt = (lambda us: f"{us}.0") if unit == "us" else (lambda us: f"{us / 1000:.3f}")
        times = f",{fmt(start_us)},{fmt(end_us)}" if unit else f",{start_us}.0"
        lines.append(f"forward,{k * 50.0},40.0,,8,Decode,{k + 1},0,ms_service_n-1,n{times}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_forward_end_time_in_microseconds_and_milliseconds(tmp_db, tmp_path):
    for unit in ("us", "ms"):
        (tmp_path / unit).mkdir()
        ingest_ok(tmp_db, _forward_csv(tmp_path / unit / "forward.csv", unit), run=unit)
        got = rows(
            tmp_db, f"SELECT start_ns, end_ns, during_ms FROM forwards WHERE run = '{unit}' ORDER BY forward_iter"
        )
        assert got == [
            (1000 * (START_US + k * 50_000), 1000 * (START_US + k * 50_000 + 42_500), 40.0) for k in range(3)
        ]


def test_forward_without_an_end_column_ends_during_time_after_its_start(tmp_db, tmp_path):
    ingest_ok(tmp_db, _forward_csv(tmp_path / "forward.csv", None))
    got = rows(tmp_db, "SELECT start_ns, end_ns - start_ns FROM forwards ORDER BY forward_iter")
    assert got == [(1000 * (START_US + k * 50_000), 40_000_000) for k in range(3)]


# ------------------------------------------------------------------------- communication matrices


def _link(size_mb: float, ms: float, transport: str = "HCCS") -> dict:
    return {
        "Transport Type": transport,
        "Transit Size(MB)": size_mb,
        "Transit Time(ms)": ms,
        "Bandwidth(GB/s)": size_mb / ms,
    }


def test_per_rank_matrix_keeps_link_direction_and_kind(tmp_db, tmp_path):
    doc = {
        "step3": {
            "collective": {"hcom_allReduce__1@group_a": {"0-1": _link(8.0, 2.0), "1-0": _link(8.0, 4.0)}},
            "p2p": {"hcom_send__2@group_pp": {"0-4": _link(2.0, 1.0, "RDMA")}},
        }
    }
    (tmp_path / "w_ascend_pt").mkdir()
    (tmp_path / "w_ascend_pt" / "profiler_info_0.json").write_text('{"rank_id": 0}')
    out = tmp_path / "w_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir()
    (out / "communication_matrix.json").write_text(json.dumps(doc))
    ingest_ok(tmp_db, out / "communication_matrix.json")
    got = rows(
        tmp_db,
        "SELECT comm_type, op_name, group_name, step_id, src_rank, dst_rank, transport_type, transit_ms, file_rank "
        "FROM comm_matrix ORDER BY op_name, src_rank",
    )
    assert got == [
        ("collective", "hcom_allReduce__1", "group_a", 3, 0, 1, "HCCS", 2.0, 0),
        ("collective", "hcom_allReduce__1", "group_a", 3, 1, 0, "HCCS", 4.0, 0),
        ("p2p", "hcom_send__2", "group_pp", 3, 0, 4, "RDMA", 1.0, 0),
    ]


def test_cluster_matrix_p2p_group_is_p2p_and_rank_sets_are_collective(tmp_db, tmp_path):
    doc = {
        "(0, 1)": {"step1": {"hcom_allGather__7@g01": {"1-0": _link(4.0, 1.0)}}},
        "p2p": {"step1": {"hcom_receive__9@gpp": {"3-1": _link(1.0, 0.5, "RDMA")}}},
    }
    (tmp_path / "cluster_analysis_output").mkdir()
    p = tmp_path / "cluster_analysis_output" / "cluster_communication_matrix.json"
    p.write_text(json.dumps(doc))
    assert ingest_ok(tmp_db, p).format == "cluster_comm_matrix"
    got = rows(
        tmp_db,
        "SELECT rank_set, comm_type, op_name, src_rank, dst_rank, bandwidth_gbps FROM comm_matrix ORDER BY rank_set",
    )
    assert got == [
        ("(0, 1)", "collective", "hcom_allGather__7", 1, 0, 4.0),
        ("p2p", "p2p", "hcom_receive__9", 3, 1, 2.0),
    ]
