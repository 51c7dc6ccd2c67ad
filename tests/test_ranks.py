"""Rank identity of a file: distributedInfo, profiler_info_{rank}.json, vLLM folder names,
--rank-pattern, --rank-map (which overrides), and NULL (never 0) when nothing names it; duplicate
and missing ranks reported at the end of an ingest."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from slowcard import ranks
from slowcard.errors import UsageError
from slowcard.ingest import ingest_paths

VLLM = "dp1_pp0_tp0_dcp0_ep9_rank9_123_20260320154638123_ascend_pt"


def _ascend_trace(root: Path) -> Path:
    p = root / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text('[{"ph": "X", "name": "aten::mm", "pid": 1, "tid": 1, "ts": "1704161511420306.491", "dur": 1.5}]')
    return p


def _kineto(path: Path, rank: int | None = None, world_size: int | None = None) -> Path:
    di = {"backend": "nccl"}
    if rank is not None:
        di["rank"] = rank
    if world_size is not None:
        di["world_size"] = world_size
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "schemaVersion": 1,
                "distributedInfo": di,
                "traceEvents": [{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1, "dur": 1}],
            }
        )
    )
    return path


# -- resolve(): each source and the precedence ---------------------------------------------------
def test_distributed_info_rank():
    info = ranks.resolve(Path("/x/trace.json"), {"rank": 7, "world_size": 16, "host": "node3"})
    assert (info.rank, info.source, info.world_size, info.host) == (7, "distributedInfo", 16, "node3")


def test_no_rank_is_null_not_zero():
    info = ranks.resolve(Path("/x/y/trace.json"), {})
    assert (info.rank, info.source) == (None, None)


@pytest.mark.parametrize(
    "content,name,want",
    [
        ({"rank_id": 3}, "profiler_info_3.json", 3),
        ({"rank_id": 5}, "profiler_info_3.json", 5),  # the key is authoritative
        ({"rank_id": -1}, "profiler_info_3.json", 3),  # -1 = not distributed: the name's number
        (None, "profiler_info_4.json", 4),  # unreadable JSON: the name's number
        ({"rank_id": 2}, "profiler_info.json", 2),  # no number in the name: the key
    ],
)
def test_profiler_info_in_ascend_pt_folder(tmp_path, content, name, want):
    root = tmp_path / "node1_12345_20240101_ascend_pt"
    trace = _ascend_trace(root)
    (root / name).write_text("{not json" if content is None else json.dumps(content))
    info = ranks.resolve(trace, {})
    assert (info.rank, info.source) == (want, "profiler_info")


def test_profiler_info_beside_a_renamed_profiler_output(tmp_path):
    # A copied / renamed profiler root (MindStudio Insight's test_rank_0/): the folder that holds
    # ASCEND_PROFILER_OUTPUT/ is the root, so its profiler_info_N.json names the files inside.
    root = tmp_path / "test_rank_3"
    trace = _ascend_trace(root)
    (root / "profiler_info_3.json").write_text('{"rank_id": 3}')
    assert (ranks.resolve(trace, {}).rank, ranks.resolve(trace, {}).source) == (3, "profiler_info")


def test_profiler_info_elsewhere_or_ambiguous_is_ignored(tmp_path):
    # not under ASCEND_PROFILER_OUTPUT nor *_ascend_pt: a stray profiler_info says nothing
    plain = tmp_path / "plain_folder" / "trace_view.json"
    plain.parent.mkdir(parents=True)
    plain.write_text("[]")
    (plain.parent / "profiler_info_3.json").write_text('{"rank_id": 3}')
    assert ranks.resolve(plain, {}).rank is None
    # two ranks' files in one root: neither names the file
    root = tmp_path / "mixed"
    trace = _ascend_trace(root)
    (root / "profiler_info_1.json").write_text('{"rank_id": 1}')
    (root / "profiler_info_2.json").write_text('{"rank_id": 2}')
    assert ranks.resolve(trace, {}).rank is None


def test_vllm_folder_name_gives_rank_and_coordinates(tmp_path):
    trace = _ascend_trace(tmp_path / VLLM)
    info = ranks.resolve(trace, {})
    assert (info.rank, info.source) == (9, "vllm_dirname")
    assert (info.dp_rank, info.pp_rank, info.tp_rank, info.ep_rank) == (1, 0, 0, 9)
    # without the dcp field (older vLLM-Ascend)
    info = ranks.resolve(_ascend_trace(tmp_path / "dp0_pp1_tp2_ep3_rank11_9_2026_ascend_pt"), {})
    assert (info.rank, info.dp_rank, info.pp_rank, info.tp_rank, info.ep_rank) == (11, 0, 1, 2, 3)


def test_profiler_info_beats_folder_name_but_coordinates_stay(tmp_path):
    root = tmp_path / VLLM
    trace = _ascend_trace(root)
    (root / "profiler_info_6.json").write_text('{"rank_id": 6}')
    info = ranks.resolve(trace, {})
    assert (info.rank, info.source) == (6, "profiler_info")
    assert (info.dp_rank, info.ep_rank) == (1, 9)


def test_distributed_info_beats_folder_and_profiler_info(tmp_path):
    root = tmp_path / VLLM
    trace = _ascend_trace(root)
    (root / "profiler_info_6.json").write_text('{"rank_id": 6}')
    info = ranks.resolve(trace, {"rank": 2})
    assert (info.rank, info.source, info.dp_rank) == (2, "distributedInfo", 1)


@pytest.mark.parametrize(
    "pattern,want",
    [
        (r"worker(?P<rank>\d+)", 12),
        (r"node_(\d+)", 3),
        (r"node_\d+", None),  # no group: nothing says which digits are the rank
        (r"gpu(\d+)", None),  # no match
    ],
)
def test_rank_pattern(pattern, want):
    info = ranks.resolve(Path("/runs/node_3/worker12/trace.json"), {}, rank_pattern=pattern)
    assert info.rank == want
    assert info.source == ("rank_pattern" if want is not None else None)


def test_rank_pattern_loses_to_content():
    info = ranks.resolve(Path("/runs/worker12/trace.json"), {"rank": 1}, rank_pattern=r"worker(\d+)")
    assert (info.rank, info.source) == (1, "distributedInfo")


# -- rank maps ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["csv", "json"])
def test_rank_map_overrides_everything(tmp_path, kind):
    root = tmp_path / VLLM
    trace = _ascend_trace(root)
    other = tmp_path / "a" / "b" / "host7.json"
    entries = {str(trace): 40, "host*.json": 41, "b/host8.json": 42}
    mp = tmp_path / f"map.{kind}"
    if kind == "csv":
        mp.write_text("path,rank\n" + "".join(f"{k},{v}\n" for k, v in entries.items()))
    else:
        mp.write_text(json.dumps(entries))
    rmap = ranks.load_rank_map(mp)
    info = ranks.resolve(trace, {"rank": 2}, rank_pattern=r"rank(\d+)", rank_map=rmap)
    assert (info.rank, info.source, info.dp_rank) == (40, "rank_map", 1)
    assert ranks.resolve(other, {}, rank_map=rmap).rank == 41  # glob on name
    assert ranks.resolve(tmp_path / "a" / "b" / "host8.json", {}, rank_map=rmap).rank == 41  # first entry wins
    assert ranks.resolve(tmp_path / "b" / "x" / "host8.txt", {}, rank_map=rmap).rank is None
    assert ranks.resolve(tmp_path / "z" / "b" / "host8.json2", {}, rank_map=rmap).rank is None


def test_rank_map_relative_path_entry(tmp_path):
    mp = tmp_path / "map.json"
    mp.write_text(json.dumps({"rank3/trace.json": 3, "./rank4/trace.json": 4}))
    rmap = ranks.load_rank_map(mp)
    assert ranks.resolve(tmp_path / "run" / "rank3" / "trace.json", {}, rank_map=rmap).rank == 3
    assert ranks.resolve(tmp_path / "run" / "rank4" / "trace.json", {}, rank_map=rmap).rank == 4
    assert ranks.resolve(tmp_path / "run" / "xrank3" / "trace.json", {}, rank_map=rmap).rank is None


@pytest.mark.parametrize(
    "text,words",
    [
        ("file,rank\na.json,1\n", "header 'path,rank'"),
        ("path,rank\na.json,one\n", "integers"),
        ('{"a.json": "x"}', "integers"),
        ('{"a.json": true}', "integers"),
        ('{"a.json": -1}', "integers"),
        ('{"a.json": 1', "not valid JSON"),
    ],
)
def test_bad_rank_maps_are_usage_errors(tmp_path, text, words):
    mp = tmp_path / "map.txt"
    mp.write_text(text)
    with pytest.raises(UsageError) as exc:
        ranks.load_rank_map(mp)
    assert words in str(exc.value) and str(mp) in str(exc.value)


def test_missing_rank_map_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="cannot read the rank map"):
        ranks.load_rank_map(tmp_path / "nope.csv")


# -- through the ingest: sources columns and end-of-run warnings --------------------------------
def test_ingest_records_rank_sources_and_reports_gaps(tmp_db, tmp_path):
    run = tmp_path / "job"
    _kineto(run / "r0.json", rank=0, world_size=4)
    _kineto(run / "r1.json", rank=1, world_size=4)
    _kineto(run / "r1_again.json", rank=1, world_size=4)  # duplicate rank 1
    _kineto(run / "lost.json")  # no rank anywhere
    _ascend_trace(run / VLLM)  # rank 9 from the folder name
    pinfo = run / "node_77_ascend_pt"
    _ascend_trace(pinfo)
    (pinfo / "profiler_info_5.json").write_text('{"rank_id": 5}')
    _kineto(run / "worker6" / "t.json")  # rank from --rank-pattern
    mp = tmp_path / "map.csv"
    mp.write_text(f"path,rank\n{run / 'lost.json'},8\n")
    report = ingest_paths(tmp_db, [run], run="job", rank_pattern=r"worker(?P<rank>\d+)")
    assert report.exit_code == 0
    by = {Path(f.path).relative_to(run.resolve()).as_posix(): f for f in report.files}
    assert by[f"{VLLM}/ASCEND_PROFILER_OUTPUT/trace_view.json"].rank == 9
    assert by["node_77_ascend_pt/profiler_info_5.json"].status == "skipped"  # a companion, not data
    assert by["lost.json"].rank is None and "no rank" in by["lost.json"].message
    with duckdb.connect(str(tmp_db), read_only=True) as con:
        rows = {
            Path(p).name if "ascend_pt" not in p else Path(p).parts[-3]: (r, s, dp, ep)
            for p, r, s, dp, ep in con.execute(
                "SELECT path, rank, rank_source, dp_rank, ep_rank FROM sources"
            ).fetchall()
        }
    assert rows == {
        "r0.json": (0, "distributedInfo", None, None),
        "r1.json": (1, "distributedInfo", None, None),
        "r1_again.json": (1, "distributedInfo", None, None),
        "lost.json": (None, None, None, None),
        VLLM: (9, "vllm_dirname", 1, 9),
        "node_77_ascend_pt": (5, "profiler_info", None, None),
        "t.json": (6, "rank_pattern", None, None),
    }
    w = "\n".join(report.warnings)
    assert "rank 1 appears in 2 kineto files (duplicate rank)" in w
    assert "kineto world_size is 4 but 2 ranks are missing (2, 3)" in w
    assert "1 file(s) have no rank" in w

    # --rank-map names the lost file: rank 8 now, and no "no rank" warning
    report = ingest_paths(tmp_db, [run / "lost.json"], run="job", rank_map=mp)
    assert (report.files[0].rank, report.files[0].rank_source) == (8, "rank_map")
    assert not any("have no rank" in x for x in report.warnings)


def test_invalid_rank_pattern_is_a_usage_error(tmp_db, tmp_path):
    path = _kineto(tmp_path / "t.json", rank=0)
    with pytest.raises(UsageError, match="not a valid regular expression"):
        ingest_paths(tmp_db, [path], rank_pattern="rank(\\d+")
