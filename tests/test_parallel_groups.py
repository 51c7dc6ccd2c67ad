"""Parallel groups (issue 30, item 2): the groups each input carries (groups files, torch_npu
profiler_metadata.json, msprof-analyze communication_group.json, Kineto distributedInfo) in one
view, and cluster-step-skew comparing a rank with its peers inside its group and stage, naming
the peers it compared with. Real files are read from ../shared/realdata (skipped when absent)."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

import slowcard
from slowcard.cli import app
from slowcard.ingest import ingest_paths

REALDATA = Path(__file__).resolve().parents[1].parent / "shared" / "realdata"
MSI = REALDATA / "thirdparty" / "msinsight" / "test_data"
CLUSTER = MSI / "cluster_analysis_output"
RANK34 = REALDATA / "kineto" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"

HEADER = (
    "Step,Type,Index,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,"
    "Stage,Bubble,Communication(Not Overlapped and Exclude Receive)"
)


def real(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"real file {path} is absent (../shared/realdata not beside the checkout)")
    return path


def rows(db, sql, params=()):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def groups_json(path: Path, groups: list[tuple[str, list[int]]]) -> Path:
    return write(path, json.dumps({"parallel_groups": [{"kind": k, "ranks": r} for k, r in groups]}))


def step_csv(path: Path, computing: dict[int, float], comm: float = 200.0, free: float = 50.0) -> Path:
    """A cluster_step_trace_time.csv of one step, rank rows only (no stage statement)."""
    lines = [
        f"1,rank,{r},{c},{comm},1.5,{comm + 1.5},{free},{c + comm + free},0.0,{comm}" for r, c in computing.items()
    ]
    return write(path, "\n".join([HEADER, *lines]) + "\n")


def groups_of(db, run):
    return rows(
        db,
        "SELECT source, kind, group_id, list(rank ORDER BY rank) FROM parallel_groups WHERE run = ? "
        "GROUP BY ALL ORDER BY ALL",
        [run],
    )


# -- reading the groups ----------------------------------------------------------------------------


def test_groups_file_json_and_csv(tmp_db, tmp_path):
    j = groups_json(tmp_path / "g.json", [("tp", [1, 0]), ("TP", [2, 3]), ("dp", [0, 2]), ("pp", [0, 4])])
    c = write(tmp_path / "g.csv", "kind,ranks,name\nep,0-3,moe\nstage,4;5;6 7,\n")
    rep = ingest_paths(tmp_db, [j, c], run="r")
    assert {Path(f.path).name: (f.format, f.status, f.rows_kept) for f in rep.files} == {
        "g.json": ("parallel_groups", "ok", 4),
        "g.csv": ("parallel_groups", "ok", 2),
    }
    assert groups_of(tmp_db, "r") == [
        ("parallel_groups", "dp", "dp 0,2", [0, 2]),
        ("parallel_groups", "ep", "ep 0-3", [0, 1, 2, 3]),
        ("parallel_groups", "pp", "pp 0,4", [0, 4]),
        ("parallel_groups", "stage", "stage 4-7", [4, 5, 6, 7]),
        ("parallel_groups", "tp", "tp 0-1", [0, 1]),
        ("parallel_groups", "tp", "tp 2-3", [2, 3]),
    ]
    assert rows(tmp_db, "SELECT DISTINCT group_name FROM parallel_groups WHERE kind = 'ep'") == [("moe",)]


def test_groups_file_bad_group_dropped_with_position_and_no_group_fails(tmp_db, tmp_path):
    j = write(
        tmp_path / "g.json",
        json.dumps({"parallel_groups": [{"kind": "tp", "ranks": [0, 1]}, {"kind": "tensor", "ranks": [2, 3]}]}),
    )
    c = write(tmp_path / "g.csv", "kind,ranks\ntp,0-1\ndp,zero one\n")
    rep = ingest_paths(tmp_db, [j, c], run="r")
    got = {Path(f.path).name: f for f in rep.files}
    assert (got["g.json"].status, got["g.json"].rows_kept, got["g.json"].rows_dropped) == ("salvaged", 1, 1)
    assert "kind 'tensor' is not one of tp, pp, dp, ep, cp, stage, world, other" in got["g.json"].message
    assert (got["g.csv"].status, got["g.csv"].rows_dropped) == ("salvaged", 1)
    assert rows(
        tmp_db,
        "SELECT reason, position FROM source_drops d JOIN sources s USING (source_id) WHERE s.path LIKE '%g.csv'",
    ) == [("ranks 'zero one': 'zero' is not a rank or a range a-b", "line 3")]
    bad = write(tmp_path / "bad.json", json.dumps({"parallel_groups": [{"kind": "tp", "ranks": []}]}))
    rep = ingest_paths(tmp_db, [bad], run="r2")
    f = rep.files[0]
    assert f.status == "failed" and "bad.json" in f.message and "no usable parallel group" in f.message
    assert "parallel_groups[0]" in f.message


def test_groups_option_checks_the_file_first(tmp_path):
    db = tmp_path / "x.duckdb"
    data = step_csv(tmp_path / "c" / "cluster_step_trace_time.csv", {0: 1000.0, 1: 1000.0})
    res = CliRunner().invoke(app, ["ingest", str(data), "--db", str(db), "--groups", str(data)])
    assert res.exit_code == 2
    assert "--groups" in res.output and "not a parallel-groups file (read as cluster_step)" in res.output
    assert not db.exists()  # nothing written before the usage error
    g = groups_json(tmp_path / "tp.json", [("tp", [0, 1])])
    res = CliRunner().invoke(app, ["ingest", str(tmp_path / "c"), "--db", str(db), "--run", "r", "--groups", str(g)])
    assert res.exit_code == 0, res.output
    assert groups_of(db, "r") == [("parallel_groups", "tp", "tp 0-1", [0, 1])]


def test_group_names_to_kinds(tmp_db):
    with duckdb.connect(str(tmp_db)) as con:
        got = dict(
            con.execute(
                "SELECT n, _group_kind(n) FROM unnest(['tp', 'TENSOR_MODEL_PARALLEL_GROUP', 'pp_new_stream', "
                "'PIPELINE_MODEL_PARALLEL_GROUP', 'dp', 'DATA_PARALLEL_GROUP', 'exp', 'EXPERT_MODEL_PARALLEL_GROUP', "
                "'cp', 'default_pg', 'default_group', 'tp_dp', 'dp_cp', 'mp', 'embd', 'dp_modulo_exp', 'undefined', "
                "'DATA_PARALLEL_GROUP_WITH_CP']) t(n)"
            ).fetchall()
        )
    assert got == {
        "tp": "tp",
        "TENSOR_MODEL_PARALLEL_GROUP": "tp",
        "pp_new_stream": "pp",
        "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
        "dp": "dp",
        "DATA_PARALLEL_GROUP": "dp",
        "exp": "ep",
        "EXPERT_MODEL_PARALLEL_GROUP": "ep",
        "cp": "cp",
        "default_pg": "world",
        "default_group": "world",
        # mixed dimensions: their members do different work
        "tp_dp": "other",
        "dp_cp": "other",
        "mp": "other",
        "embd": "other",
        "dp_modulo_exp": "other",
        "undefined": "other",
        "DATA_PARALLEL_GROUP_WITH_CP": "other",
    }


def test_kineto_distributed_info_groups(tmp_db, tmp_path, make_trace):
    pg = [
        {"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
        {"pg_name": "1", "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP", "ranks": [0, 1]},
        {"pg_name": "2", "pg_desc": "DATA_PARALLEL_GROUP", "ranks": [0, 2]},
        {"pg_name": "3", "pg_desc": "undefined", "ranks": "not a list"},  # left out
    ]
    events = [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]
    for rank in (0, 1):
        make_trace(
            tmp_path / f"rank{rank}.json",
            events,
            {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 4, "pg_config": pg}},
        )
    ingest_paths(tmp_db, [tmp_path], run="k")
    # each rank's trace lists the groups; one group each
    assert groups_of(tmp_db, "k") == [
        ("kineto", "dp", "dp 0,2", [0, 2]),
        ("kineto", "tp", "tp 0-1", [0, 1]),
        ("kineto", "world", "world 0-3", [0, 1, 2, 3]),
    ]


@pytest.mark.realdata
def test_real_kineto_rank34_eleven_process_groups(tmp_db):
    p = real(RANK34)
    ingest_paths(tmp_db, [p], run="k")
    got = rows(tmp_db, "SELECT kind, group_name, group_size FROM parallel_groups WHERE rank = 34 ORDER BY group_name")
    # pg 0 is torch's default_pg; the other ten are 'undefined' (no group_desc): 'other'
    assert len(got) == 11
    assert ("world", "0", 300) in got
    assert sorted(k for k, _, _ in got) == ["other"] * 10 + ["world"]
    assert all(size == 300 for _, _, size in got)


@pytest.mark.realdata
def test_real_profiler_metadata_parallel_group_info(tmp_db):
    p = real(MSI / "metadata" / "profiler_metadata.json")
    rep = ingest_paths(tmp_db, [p], run="m")
    assert (rep.files[0].format, rep.files[0].status, rep.files[0].rows_kept) == ("ascend_parallel_groups", "ok", 21)
    by_kind = {}
    for kind, gid, names in rows(
        tmp_db,
        "SELECT kind, group_id, string_agg(DISTINCT group_name, ' ' ORDER BY group_name) FROM parallel_groups "
        "WHERE rank = 0 GROUP BY ALL ORDER BY ALL",
    ):
        by_kind.setdefault(kind, []).append((gid, names))
    # distributed_args: TP 2, PP 2, DP 2 of 8 ranks; rank 0's groups as torch_npu wrote them
    assert by_kind["tp"] == [("tp 0-1", "tp")]
    assert by_kind["dp"] == [("dp 0,2", "dp")]
    assert by_kind["pp"] == [("pp 0,4", "pp pp_new_stream")]
    assert by_kind["ep"] == [("ep 0", "exp")]
    assert by_kind["world"] == [("world 0-7", "default_group")]
    assert ("other 0-3", "tp_dp tp_dp_cp") in by_kind["other"]
    # the other companions stay metadata for the rank resolution
    rep = ingest_paths(tmp_db, [real(MSI / "test_rank_0" / "profiler_info_0.json")], run="m2")
    assert rep.files[0].status == "skipped"


# -- cluster-step-skew inside a group --------------------------------------------------------------


def _tp_case(tmp_path: Path, slow_rank3_us: float) -> list[Path]:
    # 8 ranks, no pipeline stages: TP group 0-3 computes ~1000 us, TP group 4-7 (other DP domain,
    # another batch) 1150 us. Rank 3 computes slow_rank3_us: below the cluster's maximum.
    computing = {0: 1000.0, 1: 1000.0, 2: 1000.0, 3: slow_rank3_us, 4: 1150.0, 5: 1150.0, 6: 1150.0, 7: 1150.0}
    d = tmp_path / f"case{slow_rank3_us:g}"
    return [step_csv(d / "cluster_step_trace_time.csv", computing)]


def test_rank_slow_within_its_tp_group_found_only_with_groups(tmp_db, tmp_path):
    data = _tp_case(tmp_path, 1080.0)
    ingest_paths(tmp_db, data, run="plain")
    res = slowcard.query(tmp_db, "cluster-step-skew", run="plain")
    # without groups: one stage of 8 ranks; the 1150 us group sets the spread, rank 4 is named
    assert [(r["peer_group"], r["peers"], r["suspect_rank"], r["min_rank"]) for r in res.rows] == [
        ("stage", "0-7", 4, 0)
    ]
    assert 3 not in {r["suspect_rank"] for r in res.rows}
    # the mean step: (3 * 1000 + 1080 + 4 * 1150) / 8 + 250 = 1335 us; the gap 150 / 1335
    assert res.rows[0]["gap_share"] == round(150 / 1335, 4)

    g = groups_json(tmp_path / "tp.json", [("tp", [0, 1, 2, 3]), ("tp", [4, 5, 6, 7])])
    ingest_paths(tmp_db, [*data, g], run="tp")
    res = slowcard.query(tmp_db, "cluster-step-skew", run="tp")
    got = [(r["peer_group"], r["peers"], r["dimension"], r["suspect_rank"], r["n_ranks"]) for r in res.rows]
    assert got == [("stage", "0-7", "computing", 4, 8), ("tp 0-3", "0-3", "computing", 3, 4)]
    tp = res.rows[1]
    # within tp 0-3: mean step (3 * 1000 + 1080) / 4 + 250 = 1270 us; gap 80 us = 6.3 % > 5 %
    assert (tp["max_us"], tp["min_us"], tp["mean_step_us"], tp["gap_share"]) == (
        1080.0,
        1000.0,
        1270.0,
        round(80 / 1270, 4),
    )
    assert "tp 0-3: ranks 0-3" in res.summary and "likely slow: rank 3" in res.summary
    # the CLI's headline shows whom the rank was compared with
    out = (
        CliRunner()
        .invoke(
            app, ["query", "cluster-step-skew", "--db", str(tmp_db), "--run", "tp", "--format", "markdown", "--wide"]
        )
        .output
    )
    assert "tp 0-3" in out and "0-3" in out


def test_near_miss_within_the_tp_group_stays_quiet(tmp_db, tmp_path):
    # rank 3 at 1060 us: 60 / 1265 = 4.7 % of its group's mean step, under the 5 % threshold
    data = _tp_case(tmp_path, 1060.0)
    g = groups_json(tmp_path / "tp.json", [("tp", [0, 1, 2, 3]), ("tp", [4, 5, 6, 7])])
    ingest_paths(tmp_db, [*data, g], run="tp")
    res = slowcard.query(tmp_db, "cluster-step-skew", run="tp")
    assert [(r["peer_group"], r["suspect_rank"]) for r in res.rows] == [("stage", 4)]
    # a lower threshold lets it through: the group comparison was made
    res = slowcard.query(tmp_db, "cluster-step-skew", run="tp", params={"min_gap_share": 0.04})
    assert ("tp 0-3", 3) in [(r["peer_group"], r["suspect_rank"]) for r in res.rows]


def test_group_row_that_repeats_the_stage_finding_is_left_out(tmp_db, tmp_path):
    # rank 3 slowest of all: the stage names it; its TP group would say the same thing again
    data = _tp_case(tmp_path, 1300.0)
    g = groups_json(tmp_path / "tp.json", [("tp", [0, 1, 2, 3]), ("tp", [4, 5, 6, 7])])
    ingest_paths(tmp_db, [*data, g], run="tp")
    res = slowcard.query(tmp_db, "cluster-step-skew", run="tp")
    assert [(r["peer_group"], r["suspect_rank"]) for r in res.rows] == [("stage", 3)]


def test_stage_from_pp_groups(tmp_db, tmp_path):
    # PP groups [0, 2] and [1, 3]: ranks 0, 1 are the first stage, 2, 3 the second (no other
    # stage statement); 2 vs 3 is the only comparison that counts
    data = step_csv(tmp_path / "c" / "cluster_step_trace_time.csv", {0: 1000.0, 1: 1000.0, 2: 2000.0, 3: 2400.0})
    g = groups_json(tmp_path / "pp.json", [("pp", [0, 2]), ("pp", [1, 3])])
    ingest_paths(tmp_db, [data, g], run="pp")
    res = slowcard.query(tmp_db, "cluster-step-skew", run="pp")
    assert [(r["stage"], r["stage_source"], r["peers"], r["max_rank"], r["min_rank"]) for r in res.rows] == [
        ("pp stage 1", "pp group", "2-3", 3, 2)
    ]


@pytest.mark.realdata
def test_real_16_rank_two_stage_run_compares_within_stage_and_group(tmp_db, tmp_path):
    """msprof-analyze's 16-rank, 2-stage output: the stages come from the file (stage rows; the
    p2p groups of communication_group.json say the same), every finding names the 8 ranks of its
    stage as its peers. With TP groups of 4 declared (--groups), each group is also compared
    within itself; the findings equal a hand computation over the CSV."""
    step = real(CLUSTER / "cluster_step_trace_time.csv")
    real(CLUSTER / "communication_group.json")
    ingest_paths(tmp_db, [CLUSTER], run="pp")
    assert [(k, gid) for _s, k, gid, _r in groups_of(tmp_db, "pp") if k == "stage"] == [
        ("stage", "stage 0-7"),
        ("stage", "stage 8-15"),
    ]
    res = slowcard.query(tmp_db, "cluster-step-skew", run="pp")
    assert res.status == "FAIL" and res.rows
    stage_of = {r: ("0-7" if r < 8 else "8-15") for r in range(16)}
    for r in res.rows:
        assert r["peer_group"] == "stage" and r["n_ranks"] == 8
        assert r["peers"] == stage_of[r["max_rank"]] == stage_of[r["min_rank"]] == stage_of[r["suspect_rank"]]
    assert "stage: ranks 0-7" in res.summary or "stage: ranks 8-15" in res.summary

    # TP groups of 4 inside each stage (declared, as a user would with --groups)
    tp = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    g = groups_json(tmp_path / "tp.json", [("tp", t) for t in tp])
    ingest_paths(tmp_db, [CLUSTER, g], run="tp")
    res = slowcard.query(tmp_db, "cluster-step-skew", run="tp")
    stage_rows = {(r["dimension"], r["suspect_rank"]) for r in res.rows if r["peer_group"] == "stage"}
    got = {(r["peer_group"], r["dimension"], r["suspect_rank"]) for r in res.rows if r["peer_group"] != "stage"}

    # by hand from the CSV: per TP group, (max - min) / mean step per dimension, > 5 %
    with open(step, newline="") as f:
        ranks = {int(r["Index"]): r for r in csv.DictReader(f) if r["Type"] == "rank"}

    def dims(r):
        comm = r["Communication(Not Overlapped and Exclude Receive)"] or r["Communication(Not Overlapped)"]
        return {
            "computing": float(r["Computing"]),
            "communication_not_overlapped": float(comm),
            "free": float(r["Free"]),
        }

    want = set()
    for members in tp:
        vals = {m: dims(ranks[m]) for m in members}
        mean_step = sum(sum(v.values()) for v in vals.values()) / len(members)
        for d in ("computing", "communication_not_overlapped", "free"):
            by = {m: v[d] for m, v in vals.items()}
            if (max(by.values()) - min(by.values())) / mean_step > 0.05:
                pick = min if d == "communication_not_overlapped" else max
                suspect = sorted(m for m in by if by[m] == pick(by.values()))[0]
                if (d, suspect) not in stage_rows:
                    want.add((f"tp {members[0]}-{members[-1]}", d, suspect))
    assert got == want
    assert got, "the declared TP groups add at least one comparison the stage did not make"
    for r in res.rows:
        lo, hi = (int(x) for x in re.findall(r"[0-9]+", r["peers"])[:2])
        assert lo <= r["suspect_rank"] <= hi and stage_of[lo] == stage_of[hi]


# -- straggler-rank names the process groups it compared in ----------------------------------------


def _tp_pairs_run(out: Path, late_rank3_us: float, n: int = 6) -> list[Path]:
    """4 ranks in two TP process groups (pg "1": ranks 0-1, pg "2": ranks 2-3), n all-reduces
    each on the device; rank 3 reaches each of its group's all-reduces late_rank3_us late."""
    pg = [
        {"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
        {"pg_name": "1", "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP", "ranks": [0, 1]},
        {"pg_name": "2", "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP", "ranks": [2, 3]},
    ]
    paths = []
    for rank in range(4):
        group = "1" if rank < 2 else "2"
        events = []
        for i in range(n):
            t0 = 1000.0 * (i + 1)
            arrive = t0 + (late_rank3_us if rank == 3 else 0.0)
            end = t0 + late_rank3_us * (group == "2") + 100.0  # everyone leaves together
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                    "pid": 0,
                    "tid": 7,
                    "ts": arrive,
                    "dur": end - arrive,
                    "args": {"Process Group Name": group, "device": 0},
                }
            )
        doc = {
            "schemaVersion": 1,
            "distributedInfo": {"rank": rank, "world_size": 4, "pg_config": pg},
            "traceEvents": events,
        }
        paths.append(write(out / f"rank{rank}.json", json.dumps(doc)))
    return paths


def test_straggler_rank_names_its_process_group_and_peers(tmp_db, tmp_path):
    ingest_paths(tmp_db, _tp_pairs_run(tmp_path / "late", 30.0), run="late")
    res = slowcard.query(tmp_db, "straggler-rank", run="late")
    assert res.status == "WARN"
    assert [(r["rank"], r["last_pct"], r["peers"], r["groups"]) for r in res.rows] == [(3, 100.0, "2-3", "pg 2 (tp)")]
    assert "with ranks 2-3 in pg 2 (tp)" in res.summary
    # near miss: 3 us late is under 5 % of the all-reduce's median duration, a tie
    ingest_paths(tmp_db, _tp_pairs_run(tmp_path / "tie", 3.0), run="tie")
    assert slowcard.query(tmp_db, "straggler-rank", run="tie").status == "PASS"


# -- ep-slow-rank: the median rank of the rank's own EP group ---------------------------------------


def _two_ep_groups(out: Path, slow_in=lambda s, layer: True) -> list[Path]:
    """8 ranks, EP groups 0-3 and 4-7. Group 4-7 does other work: GroupedMatmul 1300 us on every
    rank. In group 0-3 ranks 0-2 take 1000 us, rank 3 1150 us in the instances where
    slow_in(step, layer), else 1000 us: below the cluster's median rank (1225 us) always."""
    sys.path.insert(0, str(Path(__file__).parent))
    import ep_lockstep as ls

    def cells(rank, s, layer):
        if rank >= 4:
            return ls.Cell(gmm_us=1300.0)
        return ls.Cell(gmm_us=1150.0 if rank == 3 and slow_in(s, layer) else 1000.0)

    return ls.write_run(out, cells, ranks=8)


def test_ep_slow_rank_compares_within_the_ep_group(tmp_db, tmp_path):
    paths = _two_ep_groups(tmp_path / "ep")
    ingest_paths(tmp_db, paths, run="cluster")
    # cluster-wide: the median rank is 1225 us; the four ranks of the other group sit above it in
    # every instance and are named, rank 3 (1150 us) is not
    wide = slowcard.query(tmp_db, "ep-slow-rank", run="cluster")
    assert {r["rank"] for r in wide.rows} == {4, 5, 6, 7}
    assert {(r["peer_group"], r["peers"]) for r in wide.rows} == {("all ranks", None)}

    g = groups_json(tmp_path / "ep.json", [("ep", [0, 1, 2, 3]), ("ep", [4, 5, 6, 7])])
    ingest_paths(tmp_db, [*paths, g], run="groups")
    res = slowcard.query(tmp_db, "ep-slow-rank", run="groups")
    assert [(r["rank"], r["cause"], r["peer_group"], r["peers"]) for r in res.rows] == [
        (3, "slow-compute", "ep 0-3", "0-3")
    ]
    r = res.rows[0]
    # against the median of ranks 0-3 (1000 us), not of the cluster
    assert (r["gmm_us_per_layer"], r["median_rank_gmm_us"], r["layer_instances"], r["above_pct"]) == (
        1150.0,
        1000.0,
        16,
        100.0,
    )
    from slowcard.queries import load_catalog
    from slowcard.view import phrase

    spec = load_catalog()["ep-slow-rank"]
    assert any("median of ranks 0-3" in (phrase(e, r) or "") for e in spec.headline)


def test_ep_slow_rank_near_miss_within_the_group_stays_quiet(tmp_db, tmp_path):
    # rank 3 slow in 3 of 16 instances: how much, p = 2 P(Z >= sqrt(3 x 3)) = 0.0027, and how
    # often, P(Bin(16, 1/2) >= 3) = 0.998, both above alpha / 8 ranks (v7's near miss, 13 of 16,
    # is named by v8: above by 15 % in 13 of 16 instances is a slow card)
    paths = _two_ep_groups(tmp_path / "ep", slow_in=lambda s, layer: (s, layer) in {(0, 0), (1, 1), (2, 2)})
    g = groups_json(tmp_path / "ep.json", [("ep", [0, 1, 2, 3]), ("ep", [4, 5, 6, 7])])
    ingest_paths(tmp_db, [*paths, g], run="groups")
    res = slowcard.query(tmp_db, "ep-slow-rank", run="groups")
    assert (res.status, res.rows) == ("PASS", [])


def test_ep_slow_rank_skips_when_every_ep_group_is_too_small(tmp_db, tmp_path):
    paths = _two_ep_groups(tmp_path / "ep")
    g = groups_json(tmp_path / "ep.json", [("ep", [0, 1]), ("ep", [2, 3]), ("ep", [4, 5]), ("ep", [6, 7])])
    ingest_paths(tmp_db, [*paths, g], run="pairs")
    res = slowcard.query(tmp_db, "ep-slow-rank", run="pairs")
    assert res.status == "SKIP" and "EP groups of at most 2 rank(s)" in res.summary


def test_why_op_diff_explains_against_the_ep_groups_median(tmp_db, tmp_path):
    paths = _two_ep_groups(tmp_path / "ep")
    ingest_paths(tmp_db, paths, run="cluster")
    wide = slowcard.query(tmp_db, "why-op-diff", run="cluster")
    # cluster-wide, rank 3's GroupedMatmul (1150 us) is under the median rank's (1225 us)
    assert not [r for r in wide.rows if r["rank"] == 3 and r["name"] == "GroupedMatmul"]
    g = groups_json(tmp_path / "ep.json", [("ep", [0, 1, 2, 3]), ("ep", [4, 5, 6, 7])])
    ingest_paths(tmp_db, [*paths, g], run="groups")
    res = slowcard.query(tmp_db, "why-op-diff", run="groups")
    gmm = [r for r in res.rows if r["rank"] == 3 and r["name"] == "GroupedMatmul"]
    assert [(r["us_per_instance"], r["median_rank_us_per_instance"], r["peer_group"], r["peers"]) for r in gmm] == [
        (1150.0, 1000.0, "ep 0-3", "0-3")
    ]
    # the other group's ranks do the same work as each other: nothing to explain there
    assert not [r for r in res.rows if r["rank"] is not None and r["rank"] >= 4 and r["name"] == "GroupedMatmul"]
