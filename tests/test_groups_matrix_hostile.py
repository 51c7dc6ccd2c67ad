"""Parallel groups and communication matrices against hostile input (issue 46, red team round 4,
findings 5, 6, 13, 15, 16, 17, 18, 19): a typo in a groups file, members that are not integer
ranks, ranks the run does not have, a rank in two groups of one kind, a rank past int32 in a
communication group or link key, a link size past what a double holds in bytes, links without a
Transport Type, and a cluster matrix whose rank-set key is as wide as the job."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
import synth_comm_summary  # noqa: E402

import slowcard  # noqa: E402
from slowcard import queries, store  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402


def rows(db, sql, params=()):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


def groups_of(db, run):
    return rows(
        db,
        "SELECT DISTINCT kind, group_id, group_size FROM parallel_groups WHERE run = ? ORDER BY ALL",
        [run],
    )


# -- finding 5: rank ranges in linear time -----------------------------------------------------------


def test_rank_ranges_of_wide_strided_groups(tmp_db):
    """DP groups strided by 8 over 131,072 ranks: the old macro was cubic in the members (a
    list_contains per member inside a list_filter per run start), hours here; now linear."""
    con = store.open_db(tmp_db)
    try:
        got = con.execute(
            "SELECT o, _rank_ranges(range(o, 131072, 8)::INTEGER[]) FROM range(8) t(o) ORDER BY o"
        ).fetchall()
        edge = con.execute(
            "SELECT _rank_ranges([]::INTEGER[]), _rank_ranges([5]), _rank_ranges([0, 1, 2, 3, 8]), "
            "_rank_ranges([0, 2, 3, 4, 9, 10]), _rank_ranges(list_sort(list_distinct([3, 1, 2, 2, 7]))), "
            "_rank_ranges(NULL::INTEGER[])"
        ).fetchone()
    finally:
        con.close()
    for o, label in got:
        assert label == ",".join(map(str, range(o, 131072, 8)))
    assert edge == ("", "5", "0-3,8", "0,2-4,9-10", "1-3,7", None)


def test_strided_dp_groups_of_a_4096_rank_run(tmp_db, tmp_path):
    world = 4096
    groups = [{"kind": "tp", "ranks": list(range(s, s + 8))} for s in range(0, world, 8)]
    groups += [{"kind": "dp", "ranks": list(range(o, world, 8))} for o in range(8)]
    g = tmp_path / "groups.json"
    g.write_text(json.dumps({"parallel_groups": groups}))
    csv = synth_comm_summary.write_step_trace_csv(
        tmp_path / "c" / "cluster_step_trace_time.csv", {r: 1080.0 if r == 3 else 1000.0 for r in range(world)}
    )
    rep = ingest_paths(tmp_db, [csv, g], run="s")
    assert rep.warnings == []
    got = dict(
        rows(tmp_db, "SELECT group_id, count(*) FROM parallel_groups WHERE run = 's' AND kind = 'dp' GROUP BY 1")
    )
    assert got[f"dp {','.join(map(str, range(3, world, 8)))}"] == 512 and len(got) == 8
    res = slowcard.query(tmp_db, "cluster-step-skew", run="s")
    assert res.status == "FAIL" and {r["suspect_rank"] for r in res.rows} == {3}


# -- finding 6 / 18: ranks the run does not have, a typo, contradictory groups --------------------------


def _eight_ranks(tmp_path: Path) -> Path:
    c = {0: 1000, 1: 1000, 2: 1000, 3: 1080, 4: 1150, 5: 1150, 6: 1150, 7: 1150}
    return synth_comm_summary.write_step_trace_csv(
        tmp_path / "c" / "cluster_step_trace_time.csv", {r: float(v) for r, v in c.items()}
    )


def test_groups_typo_ranks_past_the_run_left_out_and_said(tmp_db, tmp_path):
    g = tmp_path / "tp.csv"
    g.write_text("kind,ranks\ntp,0-3\ntp,4-9999\n")
    rep = ingest_paths(tmp_db, [_eight_ranks(tmp_path), g], run="t")
    assert [w for w in rep.warnings if "tp.csv" in w] == [
        f"run 't': {g}: parallel group tp 4-9999: ranks 8-9999 are not in the run (its largest rank is 7): left out"
    ]
    # the group keeps the members the run has: 4 rows, not 9,996
    assert groups_of(tmp_db, "t") == [("tp", "tp 0-3", 4), ("tp", "tp 4-7", 4)]
    res = slowcard.query(tmp_db, "cluster-step-skew", run="t")
    assert ("tp 0-3", 3) in [(r["peer_group"], r["suspect_rank"]) for r in res.rows]


def test_groups_file_rank_past_the_limit_is_a_typo(tmp_db, tmp_path):
    from slowcard.ingest.parallel_groups import MAX_RANK

    g = tmp_path / "g.csv"
    g.write_text(f"kind,ranks\ntp,0-3\ntp,4-16777215\ndp,0 {MAX_RANK + 1}\ndp,1 {MAX_RANK}\n")
    rep = ingest_paths(tmp_db, [g], run="g")
    f = rep.files[0]
    assert (f.status, f.rows_kept, f.rows_dropped) == ("salvaged", 2, 2)
    assert f"16777215 is past rank {MAX_RANK} (a typo?)" in f.message
    # no other input names a rank: members are not bounded by the run
    assert groups_of(tmp_db, "g") == [("dp", f"dp 1,{MAX_RANK}", 2), ("tp", "tp 0-3", 4)]


def test_a_rank_in_two_groups_of_one_kind_uses_neither(tmp_db, tmp_path):
    g = tmp_path / "g.json"
    g.write_text(
        json.dumps(
            {
                "parallel_groups": [
                    {"kind": "tp", "ranks": [0, 1, 2, 3]},
                    {"kind": "tp", "ranks": [3, 4, 5, 6, 7]},  # rank 3 again: a typo for 4-7
                    {"kind": "dp", "ranks": [0, 4]},
                    {"kind": "dp", "ranks": [0, 4]},  # the same group twice is one group
                    {"kind": "other", "ranks": [0, 1]},  # mixed groups overlap by design
                    {"kind": "other", "ranks": [1, 2]},
                ]
            }
        )
    )
    rep = ingest_paths(tmp_db, [_eight_ranks(tmp_path), g], run="c")
    warned = [w for w in rep.warnings if "g.json" in w]
    assert len(warned) == 1 and "2 parallel group(s) not used as written" in warned[0]
    assert "rank 3 is in 2 tp groups (0-3; 3-7): contradictory, none of them is used" in warned[0]
    assert groups_of(tmp_db, "c") == [("dp", "dp 0,4", 2), ("other", "other 0-1", 2), ("other", "other 1-2", 2)]
    problems = rows(tmp_db, "SELECT written_group FROM parallel_group_problems WHERE run = 'c' ORDER BY 1")
    assert problems == [("tp 0-3",), ("tp 3-7",)]


# -- finding 17: Kineto pg_config members that are not integer ranks ------------------------------------


def test_kineto_pg_config_non_integer_members_drop_the_group(tmp_db, tmp_path, make_trace):
    pg = [
        {"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
        {"pg_name": "1", "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP", "ranks": [0.5, 1.5, 2]},
        {"pg_name": "2", "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP", "ranks": [True, 2]},
        {"pg_name": "3", "pg_desc": "DATA_PARALLEL_GROUP", "ranks": [1e20, 2]},
        {"pg_name": "4", "pg_desc": "DATA_PARALLEL_GROUP", "ranks": [None, 2]},
        {"pg_name": "5", "pg_desc": "DATA_PARALLEL_GROUP", "ranks": [0, 4294967296]},
        {"pg_name": "6", "pg_desc": "DATA_PARALLEL_GROUP", "ranks": [1, 3]},
    ]
    events = [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]
    make_trace(
        tmp_path / "rank1.json",
        events,
        {"schemaVersion": 1, "distributedInfo": {"rank": 1, "world_size": 4, "pg_config": pg}},
    )
    rep = ingest_paths(tmp_db, [tmp_path / "rank1.json"], run="k")
    # before: [0, 2], [1, 2], [2], [2] and a failed cast; now only the two well-formed groups
    assert groups_of(tmp_db, "k") == [("dp", "dp 1,3", 2), ("world", "world 0-3", 4)]
    problems = rows(tmp_db, "SELECT group_name, problem FROM parallel_group_problems WHERE run = 'k' ORDER BY 1")
    assert [n for n, _ in problems] == ["1", "2", "3", "4", "5"]
    assert all(p.startswith("a member is not an integer rank from 0 to 2147483647: ranks [") for _, p in problems)
    warned = [w for w in rep.warnings if "parallel group" in w]
    assert len(warned) == 1 and "5 parallel group(s) not used as written" in warned[0]


# -- finding 15: a rank past int32 in a communication group or a link key -------------------------------


def test_communication_group_rank_past_int32_dropped_and_the_rest_kept(tmp_db, tmp_path):
    p = tmp_path / "communication_group.json"
    p.write_text('{"collective": [[0, 1, 2, 3], [0, 1, 4294967296]], "p2p": [[0, 2]]}')
    rep = ingest_paths(tmp_db, [p], run="r")
    f = rep.files[0]
    assert (f.status, f.rows_kept, f.rows_dropped) == ("salvaged", 2, 1)
    assert "please report" not in f.message and "collective[1]" in f.message
    assert rows(tmp_db, "SELECT group_type, ranks FROM comm_groups ORDER BY 1") == [
        ("collective", [0, 1, 2, 3]),
        ("p2p", [0, 2]),
    ]


def _matrix(tmp_path: Path, edit=None, **kw) -> Path:
    d = tmp_path / "in" / "cluster_analysis_output"
    p = synth_comm_summary.write_cluster_comm_matrix(
        d / "cluster_communication_matrix.json", slow_pairs={(3, 5): 2.0, (5, 3): 2.0}, **kw
    )
    if edit:
        doc = json.loads(p.read_text())
        for op, links in next(iter(doc.values()))["step2"].items():
            if op != "Total Op Info":
                edit(links)
        p.write_text(json.dumps(doc))
    return tmp_path / "in"


def slow_links(db, run):
    con = queries.open_readonly(db)
    try:
        res = queries.run_query(con, queries.load_catalog()["why-slow-link"], run, {})
    finally:
        con.close()
    return res, [(r["src_rank"], r["dst_rank"], r["blame"]) for r in res.rows]


def test_link_key_rank_past_int32_dropped_and_the_slow_link_still_found(tmp_db, tmp_path):
    rep = ingest_paths(
        tmp_db, [_matrix(tmp_path, lambda links: links.update({"0-99999999999": dict(links["0-1"])}))], run="r"
    )
    f = rep.files[0]
    assert (f.status, f.rows_dropped) == ("salvaged", 6)
    assert "a rank past 2147483647" in f.message and "please report" not in f.message
    assert slow_links(tmp_db, "r")[1] == [(3, 5, "link"), (5, 3, "link")]


# -- finding 16: a link size past a double in bytes ------------------------------------------------------


def test_link_size_1e305_dropped_at_ingest(tmp_db, tmp_path):
    rep = ingest_paths(
        tmp_db, [_matrix(tmp_path, lambda links: links["1-2"].update({"Transit Size(MB)": 1e305}))], run="r"
    )
    f = rep.files[0]
    assert (f.status, f.rows_dropped) == ("salvaged", 6) and "Transit Size(MB) 1e+305 is out of range" in f.message
    res, got = slow_links(tmp_db, "r")
    assert res.status == "WARN" and got == [(3, 5, "link"), (5, 3, "link")]


def test_why_slow_link_leaves_out_non_finite_values_of_older_databases(tmp_db, tmp_path):
    """A database written before the ingest dropped them: the link holds 1e305 MB (inf bytes).
    why-slow-link v3 cast the size class of inf to INTEGER: ERROR for the whole run."""
    ingest_paths(tmp_db, [_matrix(tmp_path)], run="r")
    with duckdb.connect(str(tmp_db)) as con:
        n = con.execute(
            "UPDATE comm_matrix_rows SET transit_size_mb = 1e305 WHERE src_rank = 1 AND dst_rank = 2"
        ).fetchone()[0]
    assert n == 6
    res, got = slow_links(tmp_db, "r")
    assert res.status == "WARN" and got == [(3, 5, "link"), (5, 3, "link")]


# -- finding 19: links without a Transport Type ----------------------------------------------------------


def test_links_without_transport_type_skip_says_so(tmp_db, tmp_path):
    def untyped(links):
        for link in links.values():
            link["Transport Type"] = None

    ingest_paths(tmp_db, [_matrix(tmp_path, untyped)], run="r")
    res, _ = slow_links(tmp_db, "r")
    assert res.status == "SKIP"
    assert "none says its link type (`Transport Type` missing or empty)" in res.summary
    assert "336 links" in res.summary and "no transfer with a known size" not in res.summary


# -- finding 13: the rank-set key stored once --------------------------------------------------------------


def test_cluster_matrix_rank_set_stored_once(tmp_db, tmp_path):
    ingest_paths(tmp_db, [_matrix(tmp_path, ranks=64, ops=2)], run="r")
    key = "(" + ", ".join(map(str, range(64))) + ")"
    assert rows(tmp_db, "SELECT rank_set_id, rank_set FROM comm_rank_sets") == [(0, key)]
    # each link row names it by id: the key's 254 characters are not on 8,000 rows
    assert rows(
        tmp_db, "SELECT count(*), count(rank_set), min(rank_set_id), max(rank_set_id) FROM comm_matrix_rows"
    ) == [(2 * 64 * 64 + 1, 0, 0, 0)]
    # the view reads it as before
    assert rows(tmp_db, "SELECT DISTINCT rank_set FROM comm_matrix") == [(key,)]


def test_cluster_communication_rank_set_stored_once(tmp_db, tmp_path):
    p = synth_comm_summary.write_cluster_communication(
        tmp_path / "in" / "cluster_analysis_output" / "cluster_communication.json", ranks=4
    )
    ingest_paths(tmp_db, [p], run="r")
    assert rows(tmp_db, "SELECT rank_set FROM comm_rank_sets") == [("(0, 1, 2, 3)",)]
    assert rows(tmp_db, "SELECT count(rank_set) FROM comm_summary_rows") == [(0,)]
    assert rows(tmp_db, "SELECT DISTINCT rank_set FROM comm_summary") == [("(0, 1, 2, 3)",)]
