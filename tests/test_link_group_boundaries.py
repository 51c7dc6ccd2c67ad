"""The boundaries that decide why-slow-link's pairs and the parallel-group comparisons (issue 48):
each test names the one-line mutant it kills (written before the test, checked by applying it).

- duplicate link rows: a rank's own communication_matrix.json beside the cluster matrix holds the
  same links; mutant `max(transit_size_mb)` -> `sum(transit_size_mb)` in why-slow-link's mx (and
  sum of both): the duplicated pairs look twice as fast (or carry twice the bytes);
- comparability width: a size class is a factor of 2; mutant `floor(log2(bytes))` ->
  `floor(log10(bytes))` (a factor of 10): 12 MB and 21 MB transfers compared;
- msprof's "-top1" summary entries: mutant the filter's `(top|middle|bottom)` -> `(middle|bottom)`;
- mixed 'other' groups (tp_dp) are not peers: mutant `kind IN ('tp', 'dp', 'ep', 'cp')` ->
  `... 'cp', 'other')` in cluster-step-skew's peer_groups, and `_group_kind`'s `(_group)?` ->
  `(_.*)?` (tp_dp read as tp);
- a group of exactly 2 ranks is compared: mutant `HAVING count(*) >= 2` -> `> 2` in scopes;
- size-1 EP groups do not make ep-slow-rank SKIP: mutant `AND group_size > 1` removed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import synth_comm_summary  # noqa: E402
from conftest import ingest_ok  # noqa: E402

import slowcard  # noqa: E402
from slowcard import queries  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402


def judge(db, run="r"):
    con = queries.open_readonly(db)
    try:
        return queries.run_query(con, queries.load_catalog()["why-slow-link"], run, {})
    finally:
        con.close()


def cluster_matrix(root: Path, **kw) -> Path:
    return synth_comm_summary.write_cluster_comm_matrix(
        root / "cluster_analysis_output" / "cluster_communication_matrix.json", **kw
    )


def edit_ops(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    step = next(iter(doc.values()))["step2"]
    for op in list(step):
        if op != "Total Op Info":
            fn(op, step[op], step)
    path.write_text(json.dumps(doc))


# -- duplicate link rows ---------------------------------------------------------------------------------


def test_a_ranks_own_matrix_beside_the_cluster_matrix_counts_each_link_once(tmp_path):
    root = tmp_path / "in"
    cm = cluster_matrix(root, slow_pairs={(3, 5): 2.0, (5, 3): 2.0})
    # rank 3's own communication_matrix.json: the same links it took part in, as the profiler wrote them
    doc = json.loads(cm.read_text())
    ops = next(iter(doc.values()))["step2"]
    own = {
        op: {k: v for k, v in links.items() if 3 in tuple(map(int, k.split("-")))}
        for op, links in ops.items()
        if op != "Total Op Info"
    }
    d = root / "rank3_ascend_pt"
    (d / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (d / "profiler_info_3.json").write_text('{"rank_id": 3}')
    (d / "ASCEND_PROFILER_OUTPUT" / "communication_matrix.json").write_text(json.dumps({"step2": {"collective": own}}))
    rep = ingest_paths(tmp_path / "c.duckdb", [root], run="r")
    assert sorted((f.format, f.status) for f in rep.files if f.status != "skipped") == [
        ("cluster_comm_matrix", "ok"),
        ("comm_matrix", "ok"),
    ]
    res = judge(tmp_path / "c.duckdb")
    got = [(r["src_rank"], r["dst_rank"], r["blame"], r["samples"], r["mbytes"]) for r in res.rows]
    # as from the cluster matrix alone: 6 transfers of 20.97152 MB each way, never 12 or 251.7 MB
    assert got == [(3, 5, "link", 6, 125.829), (5, 3, "link", 6, 125.829)]
    assert res.rows[0]["bw_ratio"] <= 0.55


# -- comparability width ----------------------------------------------------------------------------------


def _two_sizes(tmp_path: Path, small_mb: float) -> Path:
    """8 ranks; rank 7 sends small_mb (not 20.97 MB) to each peer at half the bandwidth (small
    messages move slower), every op: its pairs are their own size class when small_mb is more
    than a factor of 2 below."""
    cm = cluster_matrix(tmp_path / "in", jitter=0.02)

    def small(op, links, step):
        for k, link in links.items():
            if k.startswith("7-") and k != "7-7":
                link.update({"Transit Size(MB)": small_mb, "Transit Time(ms)": small_mb / 9.6})

    edit_ops(cm, small)
    ingest_ok(tmp_path / "c.duckdb", [tmp_path / "in"], "r")
    return tmp_path / "c.duckdb"


def test_pairs_a_factor_below_two_apart_in_size_are_not_compared(tmp_path):
    # 12 MB vs 20.97 MB: log2 classes 23 and 24; a class 10x wider (log10: both 7) compares them
    # and names rank 7's seven pairs slow
    res = judge(_two_sizes(tmp_path, 12.0))
    assert (res.status, res.rows) == ("PASS", [])


def test_pairs_within_a_size_class_are_compared(tmp_path):
    # 17 MB vs 20.97 MB: the same class (24): rank 7's pairs at half the bandwidth are slow
    res = judge(_two_sizes(tmp_path, 17.0))
    assert res.status == "WARN"
    assert {(r["src_rank"], r["blame"]) for r in res.rows} == {(7, "one direction")}
    assert len(res.rows) == 7


# -- msprof's summary entries ---------------------------------------------------------------------------------


def test_top1_summary_entries_are_not_links(tmp_path):
    """msprof-analyze adds "<op type>-top1" (and -middle / -bottom1) entries: an instance again,
    not a transfer of its own. Here three real all-gathers are healthy and nine -top1 entries (3
    op types x 3 HCCL groups) of 5 MB hold link 3 -> 5 at half the bandwidth: taken as links, 3 -> 5
    is below the median in 9 of its 12 transfers (median ratio 0.5) and reads slow."""
    cm = cluster_matrix(tmp_path / "in", ops=3)

    def summaries(op, links, step):
        if op.startswith("hcom_allGather__483_0@"):
            for kind in ("hcom_allGather", "hcom_reduceScatter", "hcom_broadcast"):
                for group in ("11", "12", "13"):
                    step[f"{kind}-top1@{group}"] = {
                        k: {**v, "Transit Size(MB)": 5.0, "Transit Time(ms)": 5.0 / (9.6 if k == "3-5" else 19.2)}
                        for k, v in links.items()
                    }

    edit_ops(cm, summaries)
    ingest_ok(tmp_path / "c.duckdb", [tmp_path / "in"], "r")
    res = judge(tmp_path / "c.duckdb")
    assert (res.status, res.rows) == ("PASS", [])


# -- parallel groups: mixed groups, a group of 2, size-1 EP groups ------------------------------------------------


def _skew_rows(db, run):
    res = slowcard.query(db, "cluster-step-skew", run=run)
    return [(r["peer_group"], r["suspect_rank"]) for r in res.rows]


def test_mixed_groups_are_not_compared_as_peers(tmp_db, tmp_path):
    # ranks 0-3 ~1000 us, 4-7 1150 us (another batch); rank 3 at 1080 us stands out only among 0-3.
    # A torch_npu "tp_dp" group 0-3 mixes dimensions: its members do different work, no comparison.
    data = synth_comm_summary.write_step_trace_csv(
        tmp_path / "c" / "cluster_step_trace_time.csv",
        {0: 1000.0, 1: 1000.0, 2: 1000.0, 3: 1080.0, 4: 1150.0, 5: 1150.0, 6: 1150.0, 7: 1150.0},
    )
    meta = tmp_path / "m" / "profiler_metadata.json"
    meta.parent.mkdir()
    meta.write_text(
        json.dumps(
            {
                "parallel_group_info": {
                    "g1": {"group_name": "tp_dp", "group_rank": 0, "global_ranks": [0, 1, 2, 3]},
                    "g2": {"group_name": "tp_dp", "group_rank": 0, "global_ranks": [4, 5, 6, 7]},
                }
            }
        )
    )
    g = tmp_path / "other.csv"
    g.write_text("kind,ranks\nother,0-3\nother,4-7\n")
    ingest_paths(tmp_db, [data, meta, g], run="mixed")
    assert _skew_rows(tmp_db, "mixed") == [("stage", 4)]
    # the same member sets as TP groups are compared (the test can tell)
    t = tmp_path / "tp.csv"
    t.write_text("kind,ranks\ntp,0-3\ntp,4-7\n")
    ingest_paths(tmp_db, [data, t], run="tp")
    assert _skew_rows(tmp_db, "tp") == [("stage", 4), ("tp 0-3", 3)]


def test_a_group_of_exactly_two_ranks_is_compared(tmp_db, tmp_path):
    # rank 1 at 1080 us against rank 0's 1000 us: 6.3 % of their mean step, inside TP group 0-1
    # only (the stage's spread is set by ranks 2-3 at 1150 us)
    data = synth_comm_summary.write_step_trace_csv(
        tmp_path / "c" / "cluster_step_trace_time.csv", {0: 1000.0, 1: 1080.0, 2: 1150.0, 3: 1150.0}
    )
    g = tmp_path / "tp.csv"
    g.write_text("kind,ranks\ntp,0-1\ntp,2-3\n")
    ingest_paths(tmp_db, [data, g], run="two")
    assert ("tp 0-1", 1) in _skew_rows(tmp_db, "two")


def test_size_one_ep_groups_do_not_make_ep_slow_rank_skip(tmp_db, tmp_path):
    """torch_npu writes an 'exp' group of one rank when EP is 1 (profiler_metadata's "ep 0"): such
    groups say nothing about peers; the ranks are judged together as without groups."""
    import ep_lockstep as ls

    def cells(rank, s, layer):
        return ls.Cell(gmm_us=2000.0 if rank == 2 else 1000.0)

    paths = ls.write_run(tmp_path / "ep", cells, ranks=4)
    g = tmp_path / "ep.csv"
    g.write_text("kind,ranks\nep,0\nep,1\nep,2\nep,3\n")
    ingest_paths(tmp_db, [*paths, g], run="ones")
    res = slowcard.query(tmp_db, "ep-slow-rank", run="ones")
    assert res.status == "FAIL"
    assert [(r["rank"], r["peer_group"]) for r in res.rows] == [(2, "all ranks")]
