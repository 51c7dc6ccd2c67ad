"""Outputs of Huawei's own tools as a user has them on disk (issue 15): the Ascend PyTorch
Profiler's per-rank step_trace_time.csv / communication.json / communication_matrix.json,
msprof-analyze's cluster files with a "p2p" group, communication_group.json, MindIE expert
hot-spot dumps, an Ascend trace_view with only metadata, msServiceProfiler's early output, and
--run-per-folder with files at the root. Each real-file test names its file in
../shared/realdata/thirdparty and skips when it is absent; the synthetic tests pin the rules."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

import slowcard
from slowcard.cli import app
from slowcard.ingest import chrome, experts, ingest_paths, read_head, run_batches

THIRDPARTY = Path(__file__).resolve().parents[1].parent / "shared" / "realdata" / "thirdparty"
MSI = THIRDPARTY / "msinsight" / "test_data"
CLUSTER = MSI / "cluster_analysis_output"


def real(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"real file {path} is absent (../shared/realdata/thirdparty not beside the checkout)")
    return path


def rows(db, sql, params=()):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


def by_name(report) -> dict:
    return {Path(f.path).name: f for f in report.files}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def stage_groups(csv_path: Path) -> dict[str, set[int]]:
    """{stage index as written: its ranks} from the stage rows of a cluster_step_trace_time.csv."""
    with open(csv_path, newline="") as f:
        return {
            r["Index"]: {int(x) for x in re.findall(r"[0-9]+", r["Index"])}
            for r in csv.DictReader(f)
            if r["Type"] == "stage"
        }


# -- 1. msprof-analyze cluster output with a "p2p" group --------------------------------------------


@pytest.mark.realdata
def test_real_cluster_communication_with_p2p_group(tmp_db):
    p = real(CLUSTER / "cluster_communication.json")
    doc = json.loads(p.read_text())
    rep = ingest_paths(tmp_db, [p], run="c")
    f = rep.files[0]
    leaves = sum(len(ranks) for steps in doc.values() for ops in steps.values() for ranks in ops.values())
    assert (f.format, f.status, f.rows_kept, f.rows_dropped) == ("cluster_communication", "ok", leaves, 0)
    got = dict(rows(tmp_db, "SELECT rank_set, count(*) FROM comm_summary GROUP BY 1"))
    assert got == {k: sum(len(r) for ops in v.values() for r in ops.values()) for k, v in doc.items()}
    # the "p2p" group holds point-to-point ops; a rank-set key is a collective domain
    assert rows(tmp_db, "SELECT DISTINCT comm_type FROM comm_summary WHERE rank_set = 'p2p'") == [("p2p",)]
    assert rows(tmp_db, "SELECT count(*) FROM comm_summary WHERE rank_set <> 'p2p' AND comm_type <> 'collective'") == [
        (0,)
    ]


@pytest.mark.realdata
def test_real_cluster_matrix_and_groups(tmp_db):
    m, g = real(CLUSTER / "cluster_communication_matrix.json"), real(CLUSTER / "communication_group.json")
    rep = by_name(ingest_paths(tmp_db, [m, g], run="c"))
    mdoc, gdoc = json.loads(m.read_text()), json.loads(g.read_text())
    links = sum(len(ls) for steps in mdoc.values() for ops in steps.values() for ls in ops.values())
    assert (rep[m.name].format, rep[m.name].status, rep[m.name].rows_kept) == ("cluster_comm_matrix", "ok", links)
    assert rows(
        tmp_db, "SELECT count(*) FROM comm_matrix WHERE src_rank IS NULL OR dst_rank IS NULL OR transport_type IS NULL"
    ) == [(0,)]
    assert (rep[g.name].format, rep[g.name].status) == ("communication_group", "ok")
    want = sorted(
        (t, i, lst)
        for t, groups in gdoc.items()
        if isinstance(groups, list)
        for i, lst in enumerate(groups)
        if isinstance(lst, list)
    )
    assert sorted(rows(tmp_db, "SELECT group_type, group_idx, ranks FROM comm_groups")) == want


# -- 2. cluster-step-skew within a pipeline stage ----------------------------------------------------


@pytest.mark.realdata
def test_real_two_stage_run_never_pairs_ranks_of_different_stages(tmp_db):
    p = real(CLUSTER / "cluster_step_trace_time.csv")
    groups = stage_groups(p)
    ingest_paths(tmp_db, [p], run="pp")
    res = slowcard.query(tmp_db, "cluster-step-skew", run="pp")
    assert res.status in ("PASS", "FAIL")
    for r in res.rows:
        assert any({r["max_rank"], r["min_rank"]} <= ranks for ranks in groups.values()), r
        assert r["stage_source"] == "stage row" and r["receive_excluded"]


def _per_rank_step(
    root: Path, rank: int, computing: float, comm_excl: float, free: float, bubble: float, folder: str | None = None
) -> Path:
    d = root / (folder or f"node_{rank}_ascend_pt")
    write(d / f"profiler_info_{rank}.json", json.dumps({"rank_id": rank}))
    comm = comm_excl + bubble
    return write(
        d / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv",
        "Device_id,Step,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,"
        "Bubble,Communication(Not Overlapped and Exclude Receive),Preparing\n"
        f"{rank},3,{computing},{comm},5.0,{comm + 5},{free},{computing + comm_excl + free},{bubble},"
        f"{comm_excl},1.0\n",
    )


def test_per_rank_step_traces_form_one_summary_split_by_bubble(tmp_db, tmp_path):
    # ranks 0-1 first stage (no receive), 2-3 second stage (a 500 us receive bubble): without any
    # stage statement the receiving ranks are never compared with the others; within the second
    # stage rank 3 computes 20% longer.
    paths = [
        _per_rank_step(tmp_path, 0, 1000.0, 300.0, 50.0, 0.0),
        _per_rank_step(tmp_path, 1, 1000.0, 310.0, 50.0, 0.0),
        _per_rank_step(tmp_path, 2, 800.0, 100.0, 50.0, 500.0),
        _per_rank_step(tmp_path, 3, 960.0, 100.0, 50.0, 520.0),
    ]
    rep = ingest_paths(tmp_db, [tmp_path], run="r")
    assert {(Path(f.path).parts[-3], f.format, f.rank) for f in rep.files if f.format} == {
        (p.parts[-3], "step_trace", i) for i, p in enumerate(paths)
    }
    assert rows(
        tmp_db, "SELECT rank, device_id, summary_id, comm_not_overlapped_excl_receive_us FROM step_trace ORDER BY rank"
    ) == [(0, 0, 0, 300.0), (1, 1, 0, 310.0), (2, 2, 0, 100.0), (3, 3, 0, 100.0)]
    res = slowcard.query(tmp_db, "cluster-step-skew", run="r")
    assert res.status == "FAIL"
    assert [(r["stage"], r["dimension"], r["max_rank"], r["min_rank"], r["stage_source"]) for r in res.rows] == [
        ("receiving ranks", "computing", 3, 2, "Bubble")
    ]


def test_stage_from_pp_index_and_from_vllm_folders(tmp_db, tmp_path):
    # PP Index says the stages: rank 1 (stage 0) vs rank 2 (stage 1) differ a lot, but only the
    # gap inside stage 1 (ranks 2 and 3) is a finding.
    head = (
        "Step,Type,Index,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,"
        "Communication(Not Overlapped and Exclude Receive),Preparing,DP Index,PP Index,TP Index\n"
    )
    body = "".join(
        f"1,rank,{r},{c},200,1,201,10,0,0,200,0,0,{pp},0\n"
        for r, c, pp in ((0, 1000, 0), (1, 1000, 0), (2, 2000, 1), (3, 2400, 1))
    )
    ingest_paths(tmp_db, [write(tmp_path / "c" / "cluster_step_trace_time.csv", head + body)], run="pp")
    res = slowcard.query(tmp_db, "cluster-step-skew", run="pp")
    assert [(r["stage"], r["max_rank"], r["min_rank"], r["stage_source"]) for r in res.rows] == [
        ("pp 1", 3, 2, "PP Index")
    ]
    # vLLM worker folders name the pp coordinate of per-rank files
    for rank, pp, c in ((0, 0, 1000.0), (1, 0, 1010.0), (2, 1, 2000.0), (3, 1, 2600.0)):
        _per_rank_step(
            tmp_path / "v",
            rank,
            c,
            100.0,
            10.0,
            0.0,
            folder=f"dp0_pp{pp}_tp{rank % 2}_dcp0_ep0_rank{rank}_1_20260101_ascend_pt",
        )
    ingest_paths(tmp_db, [tmp_path / "v"], run="vllm")
    res = slowcard.query(tmp_db, "cluster-step-skew", run="vllm")
    assert [(r["stage"], r["max_rank"], r["min_rank"], r["stage_source"]) for r in res.rows] == [
        ("pp 1", 3, 2, "folder name")
    ]


def test_stage_from_communication_group_p2p_groups(tmp_db, tmp_path):
    # msprof-analyze builds its stage rows from the p2p groups; per-rank files with the groups file
    # beside them are split the same way (no Bubble here to tell the stages apart).
    for rank, c in ((0, 1000.0), (1, 1010.0), (2, 2000.0), (3, 2500.0)):
        _per_rank_step(tmp_path / "prof", rank, c, 100.0, 10.0, 0.0)
    write(
        tmp_path / "cluster_analysis_output" / "communication_group.json",
        json.dumps({"collective": [[0, 1, 2, 3]], "p2p": [[0, 1], [2, 3]]}),
    )
    ingest_paths(tmp_db, [tmp_path], run="r")
    res = slowcard.query(tmp_db, "cluster-step-skew", run="r")
    assert [(r["stage"], r["max_rank"], r["min_rank"], r["stage_source"]) for r in res.rows] == [
        ("p2p group [2, 3]", 3, 2, "p2p group")
    ]


# -- 3. expert deployment map: see test_experts_ingest.test_real_deployment_map_keeps_every_layer ----

# -- 4. per-rank Ascend outputs beside profiler_info_N.json --------------------------------------------


@pytest.mark.realdata
@pytest.mark.parametrize("rank", [0, 1])
def test_real_rank_folders_get_their_rank_and_every_table(tmp_db, rank):
    root = real(MSI / f"test_rank_{rank}")
    want = json.loads(real(root / f"profiler_info_{rank}.json").read_text())["rank_id"]
    rep = by_name(ingest_paths(tmp_db, [root], run="r"))
    out = root / "ASCEND_PROFILER_OUTPUT"
    for name, fmt in (
        ("kernel_details.csv", "kernel_details"),
        ("step_trace_time.csv", "step_trace"),
        ("communication.json", "communication"),
        ("communication_matrix.json", "comm_matrix"),
    ):
        if (out / name).exists():
            assert (rep[name].format, rep[name].rank, rep[name].rank_source) == (fmt, want, "profiler_info"), name
            assert rep[name].status in ("ok", "salvaged"), rep[name].message
    with open(out / "step_trace_time.csv", newline="") as f:
        n_steps = len(list(csv.DictReader(f)))
    assert rows(tmp_db, "SELECT count(*), min(rank), max(rank) FROM step_trace") == [(n_steps, want, want)]
    comm = json.loads((out / "communication.json").read_text())
    leaves = sum(len(ops) for groups in comm.values() for ops in groups.values())
    assert rows(tmp_db, "SELECT count(*), min(rank), max(rank) FROM comm_summary") == [(leaves, want, want)]
    # bandwidth is size / time (the profiler leaves it out of "Total Op Info": computed there)
    for size, ms, gbps in rows(
        tmp_db,
        "SELECT rdma_transit_mb, rdma_transit_ms, rdma_bandwidth_gbps FROM comm_summary WHERE rdma_transit_ms > 0",
    ):
        assert gbps == pytest.approx(size / ms, rel=1e-3, abs=5e-5)  # written with 4 decimals
    assert rows(tmp_db, "SELECT count(DISTINCT file_rank), min(file_rank) FROM comm_matrix") == [(1, want)]


def test_communication_json_per_rank_shape_and_bad_leaf(tmp_db, tmp_path):
    leaf = {
        "Communication Time Info": {"Elapse Time(ms)": 2.0, "Transit Time(ms)": 0.5, "Wait Time(ms)": 1.5},
        "Communication Bandwidth Info": {"HCCS": {"Transit Size(MB)": 8.0, "Transit Time(ms)": 0.5}},
    }
    doc = {
        "step7": {
            "collective": {
                "hcom_allReduce__1_0@g1": leaf,
                "Total Op Info": leaf,
                "hcom_bad__2@g1": {"Communication Time Info": {"Wait Time(ms)": "x"}},
            },
            "p2p": {"hcom_send__3_0@g2": leaf},
        }
    }
    root = tmp_path / "w_1_2_ascend_pt"
    write(root / "profiler_info_5.json", '{"rank_id": 5}')
    p = write(root / "ASCEND_PROFILER_OUTPUT" / "communication.json", json.dumps(doc))
    f = ingest_paths(tmp_db, [p], run="r").files[0]
    assert (f.format, f.rank, f.status, f.rows_kept, f.rows_dropped) == ("communication", 5, "salvaged", 3, 1)
    assert "step7 / collective / hcom_bad__2@g1" in f.message
    assert rows(
        tmp_db,
        "SELECT comm_type, op_name, group_name, rank, step_id, wait_ms, hccs_bandwidth_gbps, is_total "
        "FROM comm_summary ORDER BY 1, 2",
    ) == [
        ("collective", "Total Op Info", None, 5, 7, 1.5, 16.0, True),
        ("collective", "hcom_allReduce__1_0", "g1", 5, 7, 1.5, 16.0, False),
        ("p2p", "hcom_send__3_0", "g2", 5, 7, 1.5, 16.0, False),
    ]


def test_matrix_bad_link_dropped_and_group_records(tmp_db, tmp_path):
    m = {
        "step1": {
            "p2p": {
                "hcom_send__1@g": {
                    "0-8": {
                        "Transport Type": "RDMA",
                        "Transit Size(MB)": 2.0,
                        "Transit Time(ms)": 1.0,
                        "Bandwidth(GB/s)": 2.0,
                    },
                    "zero": {"Transport Type": "RDMA"},
                }
            }
        }
    }
    write(tmp_path / "w_ascend_pt" / "profiler_info_0.json", '{"rank_id": 0}')
    p = write(tmp_path / "w_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "communication_matrix.json", json.dumps(m))
    f = ingest_paths(tmp_db, [p], run="r").files[0]
    assert (f.format, f.status, f.rows_kept, f.rows_dropped, f.rank) == ("comm_matrix", "salvaged", 1, 1, 0)
    assert 'is not "<src rank>-<dst rank>"' in f.message
    g = {
        "collective": [[0, 1]],
        "p2p": [[0], [1]],
        "comm_group_parallel_info": [
            {"rank_set": "(0, 1)", "group_name": "h1", "group_id": "1", "pg_name": "dp"},
            {"rank_set": "oops"},
        ],
    }
    f = ingest_paths(
        tmp_db, [write(tmp_path / "cluster_analysis_output" / "communication_group.json", json.dumps(g))], run="g"
    ).files[0]
    assert (f.format, f.status, f.rows_kept, f.rows_dropped) == ("communication_group", "salvaged", 4, 1)
    assert rows(tmp_db, "SELECT ranks, group_name, pg_name FROM comm_groups WHERE pg_name IS NOT NULL") == [
        ([0, 1], "h1", "dp")
    ]


# -- 5. metadata-only Ascend trace_view ---------------------------------------------------------------


@pytest.mark.realdata
def test_real_metadata_only_trace_view_is_ascend(tmp_db):
    p = real(THIRDPARTY / "msinsight" / "fuzz" / "test_data" / "trace_view_tiny.json")
    assert chrome.READER.sniff(p, read_head(p)) == "ascend_trace"
    f = ingest_paths(tmp_db, [p], run="t").files[0]
    assert (f.format, f.status, f.rows_kept) == ("ascend_trace", "ok", len(json.loads(p.read_text())))


@pytest.mark.parametrize(
    "text, want, guessed",
    [
        ('[{"name": "process_name", "ph": "M", "pid": 3, "args": {"name": "Ascend Hardware"}}]', "ascend_trace", False),
        ('[{"name": "process_labels", "ph": "M", "pid": 3, "args": {"labels": "NPU 2"}}]', "ascend_trace", False),
        ('[{"name": "process_labels", "ph": "M", "pid": 3, "args": {"labels": "node0,dp1"}}]', "service_trace", False),
        ('[{"name": "process_labels", "ph": "M", "pid": 3, "args": {"labels": "GPU 0"}}]', "chrome_array", True),
        (
            '{"traceEvents": [{"name": "x", "ph": "X", "pid": 1, "tid": "ReqState", "ts": 1, "dur": 1}]}',
            "service_trace",
            False,
        ),
        ('{"traceEvents": [{"name": "x", "ph": "X", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]}', "kineto", True),
        (
            '{"schemaVersion": 1, "traceEvents": [{"name": "x", "ph": "X", "pid": 1, "tid": "ReqState", "ts": 1}]}',
            "kineto",
            False,
        ),
    ],
)
def test_trace_dialect_markers_and_weak_guesses(tmp_db, tmp_path, text, want, guessed):
    p = write(tmp_path / "t.json", text)
    assert chrome.READER.sniff(p, read_head(p)) == want
    f = ingest_paths(tmp_db, [p], run="r").files[0]
    assert f.format == want and f.status == "ok"
    assert ("format guessed" in f.message) == guessed, f.message
    assert ("format guessed" in rows(tmp_db, "SELECT message FROM sources")[0][0]) == guessed


# -- 6. MindIE expert hot-spot dumps --------------------------------------------------------------------


@pytest.mark.realdata
def test_real_hotspot_dumps_fill_expert_load(tmp_db):
    d = real(MSI / "expert_hotspot")
    dumps = sorted(p for p in d.glob("*.csv"))
    assert dumps
    rep = by_name(ingest_paths(tmp_db, [d], run="h"))
    assert (
        rep["model_gen_config.json"].status == "skipped" and "model_gen_config" in rep["model_gen_config.json"].message
    )
    for p in dumps:
        lines = [ln.split(",") for ln in p.read_text().split()]
        f = rep[p.name]
        assert (f.format, f.status, f.rows_kept) == ("expert_hotspot", "ok", sum(len(x) for x in lines)), f.message
        assert "format guessed" in f.message
        stage, rank = re.match(r"([a-z]+)_([0-9]+)", p.stem).groups()
        got = rows(
            tmp_db,
            """SELECT count(DISTINCT layer), max(local_slot) + 1, min(l.ep_rank), max(l.ep_rank), sum(tokens)
                              FROM expert_load l JOIN sources s USING (source_id) WHERE s.path = ?""",
            [str(p.resolve())],  # sources keep the resolved path (../shared may be a symlink)
        )
        assert got == [(len(lines), len(lines[0]), int(rank), int(rank), float(sum(int(v) for x in lines for v in x)))]
    # one series per stage: prefill and decode are never one tensor
    assert rows(tmp_db, "SELECT count(DISTINCT series) FROM expert_load") == [
        (len({p.stem.split("_")[0] for p in dumps}),)
    ]


def test_hotspot_rank_files_of_one_stage_are_one_tensor(tmp_db, tmp_path):
    # two ranks x 2 slots x 3 lines; the config says 2 MoE layers: the first line is not one
    write(tmp_path / "hs" / "model_gen_config.json", '{"num_moe_layers": 2, "num_of_experts": 4}')
    write(tmp_path / "hs" / "decode_0.csv", "9,9\n10,30\n10,10\n")
    write(tmp_path / "hs" / "decode_1.csv", "9,9\n10,10\n10,10\n")
    write(tmp_path / "hs" / "prefill_0.csv", "5,5\n5,5\n5,5\n")
    rep = by_name(ingest_paths(tmp_db, [tmp_path / "hs"], run="r"))
    assert (rep["decode_0.csv"].status, rep["decode_0.csv"].rows_kept, rep["decode_0.csv"].rows_dropped) == (
        "salvaged",
        4,
        2,
    )
    assert "num_moe_layers=2" in rep["decode_0.csv"].message
    # decode ranks 0 and 1 share one window; prefill is another
    assert rows(tmp_db, "SELECT count(DISTINCT wseq) FROM _expert_windows") == [(2,)]
    assert rows(
        tmp_db,
        """SELECT layer, n_ranks, CASE WHEN par > 1 THEN peak_rank END, round(par, 3)
                           FROM _expert_layer_balance b
                           JOIN (SELECT DISTINCT wseq FROM _expert_windows w JOIN expert_load l USING (source_id)
                                 WHERE l.series LIKE 'decode@%') USING (wseq) ORDER BY layer""",
    ) == [(0, 2, 0, round(40 / 30, 3)), (1, 2, None, 1.0)]


def test_hotspot_shape_alone_is_not_enough(tmp_path):
    # a header-less integer CSV with neither a hot-spot name nor a model_gen_config.json beside it
    p = write(tmp_path / "numbers.csv", "1,2,3\n4,5,6\n")
    assert experts.READER.sniff(p, read_head(p)) is None
    q = write(tmp_path / "decode_3.csv", "1,2,x\n")
    assert experts.READER.sniff(q, read_head(q)) is None


# -- 7. msServiceProfiler early output -------------------------------------------------------------------


@pytest.mark.realdata
def test_real_early_service_output(tmp_db):
    d = real(THIRDPARTY / "msserviceprofiler_early_output" / "output")
    rep = by_name(ingest_paths(tmp_db, [d], run="s"))
    trace = rep["chrome_tracing.json"]
    n = len(json.loads((d / "chrome_tracing.json").read_text())["traceEvents"])
    assert (trace.format, trace.status, trace.rows_kept) == ("service_trace", "ok", n)
    notes = [p.name for p in d.glob("*.txt") if re.fullmatch(r"\s*\w+\s*:\s*[0-9.]+\s*", p.read_text())]
    assert notes
    for name in notes:
        assert (rep[name].format, rep[name].status) == (None, "skipped")
        assert "key: value" in rep[name].message
    assert rows(tmp_db, "SELECT count(*) FROM sources WHERE format = 'prometheus_text'") == [(0,)]


def test_key_value_note_is_not_prometheus_but_colon_metrics_are(tmp_path):
    kv = write(tmp_path / "cpu_frequency.txt", "cpu_frequency: 100000000.0\n")
    assert experts.READER.sniff(kv, read_head(kv)) is None
    prom = write(tmp_path / "m.txt", 'vllm:num_requests_running{engine="0"} 3\n')
    assert experts.READER.sniff(prom, read_head(prom)) == "prometheus_text"


# -- 8. --run-per-folder and files at the root ---------------------------------------------------------


@pytest.mark.realdata
def test_real_run_per_folder_keeps_the_root_file(tmp_path):
    root = real(THIRDPARTY / "tracelens_vllm_decode")
    top = sorted(p.name for p in root.iterdir() if p.is_file() and not p.name.startswith("."))
    assert top
    db = tmp_path / "r.duckdb"
    res = CliRunner().invoke(app, ["ingest", str(root), "--run-per-folder", "--db", str(db)])
    assert res.exit_code in (0, 1), res.output
    assert f"{len(top)} file(s) at the top level" in res.stderr
    # every top-level file is in the per-file table, and what was ingested is in the root's run
    for name in top:
        assert name in res.stdout
    ingested = rows(db, "SELECT run, regexp_extract(path, '[^/]+$') FROM sources")
    assert {name for _, name in ingested} & set(top)
    assert all(run == root.name for run, name in ingested if name in top)


def test_run_batches_root_files(tmp_path):
    write(tmp_path / "a" / "x.json", "[]")
    write(tmp_path / "top.json", "[]")
    write(tmp_path / ".hidden", "")
    batches, notes = run_batches([tmp_path], None, True)
    assert [(r, [Path(p).name for p in ps]) for r, ps in batches] == [("a", ["a"]), (tmp_path.name, ["top.json"])]
    assert len(notes) == 1 and "1 file(s)" in notes[0]
    # a sub-folder named like the root: the root files' run is told apart
    write(tmp_path / tmp_path.name / "y.json", "[]")
    batches, _ = run_batches([tmp_path], None, True)
    assert batches[-1][0] == f"{tmp_path.name} (root files)"
    # only files: they are the run
    only = tmp_path / "only"
    write(only / "z.json", "[]")
    assert run_batches([only], None, True)[0] == [("only", [str(only / "z.json")])]
    # an unknown file found at the root is skipped like any walked file, not failed
    write(tmp_path / "notes.bin", "\x00\x01")
    db = tmp_path / "d.duckdb"
    batch = [b for b in run_batches([tmp_path], None, True)[0] if b[0].endswith("(root files)")][0]
    rep = ingest_paths(db, batch[1], run=batch[0])
    assert {Path(f.path).name: f.status for f in rep.files}["notes.bin"] == "skipped"


# -- beyond the numbered items: a hand-edited op_summary header ------------------------------------------


@pytest.mark.realdata
def test_real_mixed_op_summary_header_is_read_and_flagged(tmp_db):
    p = real(MSI / "test_kernel_parse" / "op_summary_1.csv")
    f = ingest_paths(tmp_db, [p], run="k").files[0]
    assert f.format == "op_summary" and f.status in ("ok", "salvaged"), f.message
    assert "format guessed" in f.message
    with open(p, newline="") as fh:
        assert f.rows_kept + f.rows_dropped == sum(1 for _ in csv.reader(fh)) - 1


def test_mixed_header_needs_a_task_column(tmp_path):
    from slowcard.ingest import op_csv

    plain = write(tmp_path / "a.csv", "Op Name,Start Time(us),Task Duration(us)\nx,1,2\n")
    assert op_csv.READER.sniff(plain, read_head(plain)) is None
    mixed = write(tmp_path / "b.csv", "Op Name,Task Type,Start Time(us),Task Duration(us)\nx,AI_CORE,1,2\n")
    assert op_csv.READER.sniff(mixed, read_head(mixed)) == "op_summary"


def test_known_tool_outputs_are_named_not_unknown(tmp_db, tmp_path):
    files = {
        "memory_record.csv": "Component,Timestamp(us),Total Allocated(MB),Total Reserved(MB),Total Active(MB),Stream Ptr,Device Type\nAPP,1,,2,,,NPU:1\n",
        "tx_data_df.csv": "pid,tid,event_type,start_time,end_time,mark_id,message,domain,rid,name\n1,2,start/end,1,2,3,x,http,0,httpReq\n",
        "cpu_frequency.txt": "cpu_frequency: 100000000.0\n",
        "model_gen_config.json": '{"num_moe_layers": 3, "num_of_experts": 8}',
        "other.csv": "a,b\n1,2\n",
    }
    for name, text in files.items():
        write(tmp_path / "out" / name, text)
    rep = by_name(ingest_paths(tmp_db, [tmp_path / "out"], run="k"))
    assert {n: f.status for n, f in rep.items()} == dict.fromkeys(files, "skipped")
    assert "memory_record.csv" in rep["memory_record.csv"].message
    assert "tx_data_df.csv" in rep["tx_data_df.csv"].message
    assert "key: value" in rep["cpu_frequency.txt"].message
    assert "num_moe_layers" in rep["model_gen_config.json"].message
    assert "unknown format" in rep["other.csv"].message
    assert rows(tmp_db, "SELECT count(*) FROM sources") == [(0,)]
