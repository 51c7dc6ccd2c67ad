"""Across runs (issue 45): the physical device behind each rank, the stored verdicts per run, and
`slowcard fleet` telling a bad device from a hot rank, naming nothing in a balanced fleet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ingest_ok, write_trace
from synth_fleet import write_fleet
from typer.testing import CliRunner

from slowcard import fleet as fleet_mod
from slowcard import store
from slowcard.cli import app
from slowcard.devices import load_device_map
from slowcard.errors import UsageError
from slowcard.ingest import ingest_paths

BAD, HOT = "node1/2", 5


def flagged(result, key):
    return {r[key]: r["level"] for r in result.rows if r["level"] in ("FAIL", "WARN")}


@pytest.fixture(scope="module")
def bad_fleet(tmp_path_factory) -> Path:
    """20 runs x 8 ranks on 12 devices: node1/2 slow wherever it serves, rank 5 slow wherever it lands."""
    db = tmp_path_factory.mktemp("fleet") / "bad.duckdb"
    write_fleet(db, bad_device=BAD, hot_rank=HOT)
    return db


@pytest.fixture(scope="module")
def balanced_fleet(tmp_path_factory) -> Path:
    """No card special: 60 % of the runs name one random rank; node1/2 slow in its first 2 runs only."""
    db = tmp_path_factory.mktemp("fleet") / "balanced.duckdb"
    write_fleet(db, bad_device=BAD, bad_in_runs=2, noise_share=0.6)
    return db


def test_bad_device_and_hot_rank_are_told_apart(bad_fleet):
    out = fleet_mod.fleet(bad_fleet)
    assert out.judged == [] and out.kept == 20  # the generated verdicts are current: none re-judged
    devices, ranks = out.results["fleet-devices"], out.results["fleet-ranks"]
    assert flagged(devices, "device") == {BAD: "FAIL"}
    assert flagged(ranks, "rank") == {HOT: "FAIL"}
    bad = next(r for r in devices.rows if r["device"] == BAD)
    assert bad["slow_runs"] == bad["runs_present"] and bad["slow_runs"] >= 10
    assert bad["reading"].startswith("the device: slow as") and bad["cause"] == "slow-compute"
    hot = next(r for r in ranks.rows if r["rank"] == HOT)
    assert hot["slow_runs"] == 20 and hot["devices_when_slow"] >= 5
    assert hot["reading"].startswith("the rank, wherever it lands") and hot["cause"] == "token-skew"
    # the devices that carried rank 5 were slow as often as chance says: not named
    carriers = [r for r in devices.rows if r["device"] != BAD and r["slow_runs"] >= 3]
    assert carriers and all(r["level"] == "PASS" and r["reading"] == "within chance" for r in carriers)


def test_balanced_fleet_names_nothing(balanced_fleet):
    out = fleet_mod.fleet(balanced_fleet)
    devices, ranks = out.results["fleet-devices"], out.results["fleet-ranks"]
    assert str(devices.status) == "PASS" and str(ranks.status) == "PASS"
    assert not flagged(devices, "device") and not flagged(ranks, "rank")
    # near miss of the count: the bad device, slow in 2 runs of 20
    assert next(r for r in devices.rows if r["device"] == BAD)["slow_runs"] == 2
    # near miss of the test: a device slow in >= 3 runs, as often as chance allows
    lucky = [r for r in devices.rows if r["slow_runs"] >= 3]
    assert lucky and all(r["p_adjusted"] >= 0.01 for r in lucky)


def test_each_guard_holds_the_verdict(bad_fleet, balanced_fleet):
    # alpha: loosened, the lucky device of the balanced fleet is named (so alpha is what held it)
    loose = fleet_mod.fleet(balanced_fleet, {"alpha": "0.5", "fail_alpha": "0.0"})
    assert set(flagged(loose.results["fleet-devices"], "device").values()) == {"WARN"}
    # min_slow_runs: above the bad device's count it is not named, though its p-value is tiny
    strict = fleet_mod.fleet(bad_fleet, {"min_slow_runs": "40"})
    assert flagged(strict.results["fleet-devices"], "device") == {}
    assert next(r for r in strict.results["fleet-devices"].rows if r["device"] == BAD)["p_adjusted"] < 1e-6


def test_fixed_placement_names_the_device_and_says_the_rank_cannot_be_told(tmp_path):
    db = tmp_path / "fixed.duckdb"
    write_fleet(db, bad_device="node0/3", fixed_placement=True)  # rank 3 always on node0/3
    out = fleet_mod.fleet(db)
    dev = out.results["fleet-devices"].rows[0]
    assert (dev["device"], dev["level"]) == ("node0/3", "FAIL")
    assert "cannot tell them apart" in dev["reading"]
    rank3 = next(r for r in out.results["fleet-ranks"].rows if r["rank"] == 3)
    assert rank3["level"] == "PASS" and rank3["reading"].startswith("slow on one device only (node0/3)")


def test_trend_and_since(bad_fleet):
    out = fleet_mod.fleet(bad_fleet, {"device": BAD})
    rows = out.results["fleet-trend"].rows
    assert rows and all(r["device"] == BAD and r["slow"] for r in rows)
    costs = [r["cost_pct"] for r in rows]
    assert costs == sorted(costs) and costs[-1] > costs[0]  # the generated card wears out
    assert [r["slow_runs_so_far"] for r in rows] == list(range(1, len(rows) + 1))
    # --since: only the runs from the 11th hour on
    later = fleet_mod.fleet(bad_fleet, {"since": "2026-11-01 18:00:00"})
    assert next(r for r in later.results["fleet-ranks"].rows if r["rank"] == HOT)["runs_present"] == 10


def test_cli_fleet(bad_fleet, balanced_fleet):
    runner = CliRunner()
    res = runner.invoke(app, ["fleet", "--db", str(bad_fleet), "--trend", BAD])
    assert res.exit_code == 1, res.output
    assert f"device {BAD} [FAIL]" in res.output and f"rank {HOT} [FAIL]" in res.output
    assert "fleet-trend@v1 INFO" in res.output
    res = runner.invoke(app, ["fleet", "--db", str(balanced_fleet), "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert [r["status"] for r in data["results"]] == ["PASS", "PASS"]
    res = runner.invoke(app, ["fleet", "--db", str(bad_fleet), "--since", "last tuesday"])
    assert res.exit_code == 2 and "--since 'last tuesday'" in res.output


def test_judge_stores_a_real_runs_slow_card_once(realdata, tmp_path):
    """The real 4-rank run (rank 1 the slow card) judged and stored; judged again only when its
    files change."""
    db = tmp_path / "real.duckdb"
    dmap = tmp_path / "devices.json"
    dmap.write_text(json.dumps({str(r): {"host": "vm", "device_id": r} for r in range(4)}))
    con = store.open_db(db)
    try:
        ingest_paths(db, [str(realdata / "kineto_cpu_ep4_hot1")], run="hot", con=con, device_map=dmap)
    finally:
        con.close()
    judged, kept = fleet_mod.judge(db)
    assert (judged, kept) == (["hot"], 0)
    con = store.open_db(db, read_only=True)
    try:
        cards = con.execute("SELECT rank, level, cause, query FROM run_slow_cards WHERE run = 'hot'").fetchall()
        row = con.execute("SELECT device, slow FROM fleet_rank_runs WHERE run = 'hot' AND rank = 1").fetchone()
    finally:
        con.close()
    assert [(c[0], c[1]) for c in cards] == [(1, "FAIL")] and cards[0][3].startswith("ep-slow-rank@v")
    assert row == ("vm/1", True)
    assert fleet_mod.judge(db) == ([], 1)
    ingest_ok(db, [realdata / "kineto_cpu_ep4_hot1" / "rank0.pt.trace.json.gz"], "hot")  # files changed
    assert fleet_mod.judge(db) == (["hot"], 0)


# -- device identity ---------------------------------------------------------------------------


def identities(db, run):
    con = store.open_db(db, read_only=True)
    try:
        return con.execute(
            "SELECT rank, host, host_source, device_id, device_source FROM rank_devices WHERE run = ? ORDER BY rank",
            [run],
        ).fetchall()
    finally:
        con.close()


def test_real_ascend_host_from_profiler_info(realdata, tmp_db):
    base = realdata / "thirdparty" / "msinsight" / "test_data"
    con = store.open_db(tmp_db)
    try:
        rep = ingest_paths(tmp_db, [str(base / "test_rank_0"), str(base / "test_rank_1")], run="asc", con=con)
    finally:
        con.close()
    # _worker_name "localhost.localdomain_1408366" / "_1408367"; the files carry no device id
    assert identities(tmp_db, "asc") == [
        (0, "localhost.localdomain", "profiler_info", None, None),
        (1, "localhost.localdomain", "profiler_info", None, None),
    ]
    assert rep.notes == [
        "device: 2 of 2 rank(s) (0, 1) without a device id in their files: stored as NULL, left out of "
        "`slowcard fleet`'s device counts; --device-map FILE (rank,host,device_id) names them"
    ]
    assert not [w for w in rep.warnings if "device" in w]


def test_real_kineto_device_from_kernels_and_host_from_header(realdata, tmp_db):
    ingest_ok(
        tmp_db, [realdata / "kineto" / "sampled_rank-0.json.gz", realdata / "kineto" / "sampled_rank-1.json.gz"], "gpu"
    )
    assert identities(tmp_db, "gpu") == [(0, None, None, 0, "kernel_pid"), (1, None, None, 1, "kernel_pid")]
    ingest_ok(tmp_db, [realdata / "kineto_cpu_ep4_hot1"], "cpu")  # host_name 'vm', CPU only: no device
    assert {(h, s, d) for _, h, s, d, _ in identities(tmp_db, "cpu")} == {("vm", "trace_header", None)}


def test_host_pid_file_name_and_a_name_that_is_not_one(tmp_db, tmp_path):
    ev = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 3, "tid": 7, "ts": 1, "dur": 2}]
    header = {"distributedInfo": {"rank": 0, "world_size": 2}, "deviceProperties": [{"id": 3}]}
    write_trace(tmp_path / "t" / "gpu-node7_41233.1733000000000.pt.trace.json", ev, header)
    h1 = {"distributedInfo": {"rank": 1, "world_size": 2}, "deviceProperties": [{"id": 0}]}
    write_trace(tmp_path / "t" / "graph_capture_rank_1.1773709742341309550.pt.trace.json", [], h1)
    ingest_ok(tmp_db, [tmp_path / "t"], "names")
    assert identities(tmp_db, "names") == [
        (0, "gpu-node7", "file_name", 3, "kernel_pid"),
        (1, None, None, 0, "device_properties"),  # underscores: not a host name
    ]


def test_device_map_fills_the_rest_and_a_bad_map_loses_nothing(tmp_db, tmp_path, realdata):
    good = tmp_path / "map.csv"
    good.write_text("rank,host,device_id\n0,node-a,3\n1,node-a,5\n9,node-b,0\n")
    con = store.open_db(tmp_db)
    try:
        rep = ingest_paths(tmp_db, [str(realdata / "kineto_cpu_ep4_hot1")], run="m", con=con, device_map=good)
    finally:
        con.close()
    got = identities(tmp_db, "m")
    assert got[:2] == [(0, "node-a", "device_map", 3, "device_map"), (1, "node-a", "device_map", 5, "device_map")]
    assert got[2] == (2, "vm", "trace_header", None, None)
    assert not rep.warnings  # rank 9: a cluster-wide map names ranks a smaller run lacks
    assert any("2 of 4 rank(s) (2, 3) without a device id" in n for n in rep.notes)
    bad = tmp_path / "bad.json"
    bad.write_text('{"0": 3}')
    with pytest.raises(UsageError, match=r"bad\.json: the device map"):
        load_device_map(bad)
    res = CliRunner().invoke(
        app,
        ["ingest", str(realdata / "kineto_cpu_ep4_hot1"), "--db", str(tmp_db), "--run", "m", "--device-map", str(bad)],
    )
    assert res.exit_code == 2 and "bad.json" in res.output
    assert identities(tmp_db, "m") == got  # the refused map changed nothing already ingested
    other = tmp_path / "other.csv"
    other.write_text("rank,host,device_id\n40,node-z,0\n")
    con = store.open_db(tmp_db)
    try:
        rep = ingest_paths(tmp_db, [str(realdata / "kineto_cpu_ep4_hot1")], run="m", con=con, device_map=other)
    finally:
        con.close()
    assert rep.warnings == [
        "run 'm': --device-map names none of the run's ranks (0, 1, 2, 3); it was not used for this run"
    ]
    csv_no_header = tmp_path / "nohead.csv"
    csv_no_header.write_text("0,node-a,3\n")
    with pytest.raises(UsageError, match="rank,host,device_id"):
        load_device_map(csv_no_header)


def test_a_database_from_before_keeps_its_rows_and_gains_the_columns(tmp_db, realdata):
    ingest_ok(tmp_db, [realdata / "kineto" / "sampled_rank-0.json.gz"], "old")
    con = store.open_db(tmp_db)
    try:
        for col in ("device_id", "host_source", "device_source"):
            con.execute(f"ALTER TABLE sources DROP COLUMN {col}")
        con.execute("DROP VIEW fleet_rank_runs")
        con.execute("DROP VIEW rank_devices")
        con.execute("DROP TABLE run_verdicts")
        con.execute("DROP TABLE run_slow_cards")
        con.execute("UPDATE meta SET value = 'previous' WHERE key = 'ddl_fingerprint'")
    finally:
        con.close()
    con = store.open_db(tmp_db)
    try:
        assert con.execute("SELECT rank, device_id FROM sources WHERE run = 'old'").fetchall() == [(0, None)]
        assert con.execute("SELECT count(*) FROM run_verdicts").fetchone() == (0,)
    finally:
        con.close()


def test_fleet_queries_are_their_own_scope(tmp_path):
    from slowcard import queries
    from slowcard.errors import QueryDefinitionError

    run_scope, fleet_scope = queries.load_catalog(), queries.load_catalog(scope="fleet")
    assert set(fleet_scope) == {"fleet-devices", "fleet-ranks", "fleet-trend"}
    assert not set(run_scope) & set(fleet_scope)  # diagnose, report, compare never run them
    q = tmp_path / "my-fleet.sql"
    q.write_text(
        "-- name: my-fleet\n-- version: 1\n-- description: d\n-- requires: run_verdicts\n-- verdict: none\n-- scope: fleet\nSELECT 1 AS x\n"
    )
    assert queries.parse_query(q).scope == "fleet"  # no $run needed
    q.write_text(q.read_text().replace("scope: fleet", "scope: cluster"))
    with pytest.raises(QueryDefinitionError, match="scope must be one of run, fleet"):
        queries.parse_query(q)
    q.write_text(q.read_text().replace("-- scope: cluster\n", ""))
    with pytest.raises(QueryDefinitionError, match=r"must filter on the run \(use \$run\)"):
        queries.parse_query(q)


def test_hosts_and_devices_named_by_paths(tmp_path):
    from slowcard.devices import _device_dir, host_from_path

    assert host_from_path(Path("/p/ms_service_node3-4242/batch.csv")) == ("node3", "prof_id")
    assert host_from_path(Path("/p/ms_service_node3-4242.db")) == ("node3", "prof_id")
    pt = tmp_path / "node5_1234_20260101120000123_ascend_pt"
    csv = pt / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    assert host_from_path(csv) == ("node5", "ascend_pt_dir")  # no profiler_info: the folder name
    (pt / "PROF_000001_x" / "device_6").mkdir(parents=True)
    assert _device_dir(csv) == 6
    (pt / "PROF_000001_x" / "device_7").mkdir()
    assert _device_dir(csv) is None  # two devices under one root: neither is the file's
    assert host_from_path(Path("/p/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")) == (None, None)


def test_fleet_page_heat_map(bad_fleet, tmp_path):
    pytest.importorskip("plotly", reason="the fleet page needs the report extra (plotly)")
    from slowcard.renderers.html import figure_data

    page = tmp_path / "fleet.html"
    res = CliRunner().invoke(app, ["fleet", "--db", str(bad_fleet), "--html", str(page)])
    assert res.exit_code == 1, res.output  # the bad device FAILs
    (fig,) = figure_data(page.read_text())
    assert fig["query"] == "fleet-trend@v1"
    heat = fig["data"][0]
    assert len(heat["y"]) == 12 and heat["x"] == [f"job{i:02d}" for i in range(20)]
    row = dict(zip(heat["y"], heat["z"]))[BAD]
    present = [v for v in row if v is not None]
    assert present and all(v > 0 for v in present) and len(present) < 20  # slow wherever present, absent elsewhere
    others = [v for d, z in zip(heat["y"], heat["z"]) if d != BAD for v in z if v is not None]
    assert 0 < sum(v > 0 for v in others) <= 20  # only where they served rank 5
    assert "fleet-devices" in page.read_text() and 'class="hot"' in page.read_text()


def test_fleet_sql_pastes_into_the_duckdb_shell(bad_fleet):
    import subprocess

    from conftest import duckdb_cli

    exe = duckdb_cli()
    if exe is None:
        pytest.skip("the duckdb shell (PyPI duckdb-cli) is not installed")
    runner = CliRunner()
    script = runner.invoke(app, ["show", "fleet-devices"])
    assert script.exit_code == 0 and "slowcard_scope" not in script.output  # every run, not one
    out = subprocess.run(
        [exe, "-readonly", "-csv", str(bad_fleet)], input=script.output, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1].startswith(f"{BAD},FAIL,")  # the same first row as `slowcard fleet`
    res = runner.invoke(app, ["query", "fleet-devices", "--db", str(bad_fleet)])
    assert res.exit_code == 2 and "run it with `slowcard fleet`" in res.output
