"""Why is this card slow (issue 18): the why-analysis queries, and the why-section of
`diagnose` and the report, on generated runs and on the shared real runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_kineto  # noqa: E402
from conftest import REALDATA, ingest_ok  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.diagnosis import diagnose  # noqa: E402
from slowcard.renderers.terminal import verbose_text  # noqa: E402
from slowcard.view import screen  # noqa: E402


def diagnosis_text(diag) -> str:
    """What `slowcard diagnose -v` prints of a diagnosis."""
    return verbose_text(screen(diag))


CATALOG = queries.load_catalog()
NOISE_SET = REALDATA / "kineto_cpu_ep_noise"


def run(db, name, run_name="r", **params):
    con = queries.open_readonly(db)
    try:
        return queries.run_query(con, CATALOG[name], run_name, params)
    finally:
        con.close()


def diag_of(db, run_name="r"):
    con = queries.open_readonly(db)
    try:
        return diagnose(con, run_name, CATALOG)
    finally:
        con.close()


def rank_rows(res, rank):
    return [r for r in res.rows if r["rank"] == rank]


@pytest.fixture(scope="module")
def synth_db(tmp_path_factory):
    cache: dict = {}

    def make(scenario, slow_rank=1, ranks=4):
        key = (scenario, slow_rank, ranks)
        if key not in cache:
            d = tmp_path_factory.mktemp(scenario)
            paths = synth_kineto.write_ep_run(
                d / "trace", scenario=scenario, ranks=ranks, slow_rank=slow_rank, steps=4, layers=4
            )
            ingest_ok(d / "run.duckdb", paths, "r")
            cache[key] = d / "run.duckdb"
        return cache[key]

    return make


# ---------------------------------------------------------------- why-op-diff (generated runs)


@pytest.mark.parametrize("scenario, shapes", [("token_skew", "more tokens"), ("slow_compute", "same shapes")])
def test_op_diff_puts_grouped_matmul_first_and_tells_more_work_from_slower_device(synth_db, scenario, shapes):
    res = run(synth_db(scenario, slow_rank=2), "why-op-diff")
    assert res.status == "INFO", res.summary
    rows = rank_rows(res, 2)
    assert rows, res.rows
    first = rows[0]
    assert first["op_class"] == "grouped_matmul" and first["name"] == "GroupedMatmul"
    assert first["shapes"] == shapes
    assert first["excess_us"] > 0 and first["ratio"] > 1.5
    assert first["excess_share_pct"] > 50
    # every row is an operator that takes this rank longer than the median rank, largest first
    assert all(r["excess_us"] > 0 for r in rows)
    assert [r["excess_us"] for r in rows] == sorted((r["excess_us"] for r in rows), reverse=True)
    assert sum(r["excess_share_pct"] for r in rows) <= 100.5


def test_op_diff_on_a_balanced_run_finds_no_large_operator_excess(synth_db):
    res = run(synth_db("balanced"), "why-op-diff")
    assert res.status == "INFO"
    assert all(r["ratio"] < 1.5 for r in res.rows), res.rows


def test_op_diff_top_n_bounds_the_rows_per_rank(synth_db):
    res = run(synth_db("slow_compute", slow_rank=2), "why-op-diff", top_n=1)
    ranks = [r["rank"] for r in res.rows]
    assert len(ranks) == len(set(ranks)) and 2 in ranks


def test_op_diff_skips_with_a_reason_below_min_ranks(synth_db):
    res = run(synth_db("token_skew", ranks=2, slow_rank=1), "why-op-diff")
    assert res.status == "SKIP"
    assert "needs >= 3" in res.summary


# ------------------------------------------------- diagnose and report: the why-section


def test_diagnose_has_a_why_section_for_the_slow_card(synth_db):
    diag = diag_of(synth_db("slow_compute", slow_rank=2))
    assert diag.conclusion["slow_cards"] == ["rank 2"]
    assert [c["card"] for c in diag.why] == ["rank 2"]
    card = diag.why[0]
    assert card["ranks"] == [2]
    part = next(p for p in card["parts"] if p["query"].startswith("why-op-diff@"))
    # only rows about the slow card, and the first names GroupedMatmul with the same shapes
    assert part["rows"] and {r["rank"] for r in part["rows"]} == {2}
    assert part["rows"][0]["name"] == "GroupedMatmul" and part["rows"][0]["shapes"] == "same shapes"
    text = diagnosis_text(diag)
    assert "Why is rank 2 slow (slow-compute):" in text
    assert "rank 2: GroupedMatmul (grouped_matmul)" in text
    assert diag.to_dict()["why"][0]["card"] == "rank 2"


def test_no_why_section_without_a_slow_card(synth_db):
    diag = diag_of(synth_db("balanced"))
    assert diag.conclusion["slow_cards"] == []
    assert diag.why == []
    assert "Why is" not in diagnosis_text(diag)


def test_report_shows_the_why_section_for_the_slow_card(synth_db):
    pytest.importorskip("plotly", reason="the HTML report needs the optional plotly extra")
    from slowcard.renderers.html import build_report

    db = synth_db("token_skew", slow_rank=1)
    diag = diag_of(db)
    con = queries.open_readonly(db)
    try:
        page = build_report(con, "r", dict(diag.results), conclusion=diag.conclusion, catalog=CATALOG)
    finally:
        con.close()
    assert '<h2 class="why">Why is rank 1 slow? (token-skew)</h2>' in page
    section = page.split('<h2 class="why">', 1)[1].split("<h2", 1)[0]
    assert "why-op-diff@v" in section and "GroupedMatmul" in section and "more tokens" in section


# ------------------------------------------------------------------ the shared real runs


def _first_of_slow_card(db, run_name):
    diag = diag_of(db, run_name)
    assert diag.slow_cards, diag.conclusion
    card = diag.why[0]
    part = next(p for p in card["parts"] if p["query"].startswith("why-op-diff@"))
    return diag.slow_cards[0], part


def test_real_ep_run_token_skew_card_is_explained_by_grouped_matmul_with_more_tokens(real_ep_db):
    from conftest import REAL_EP_RUN

    finding, part = _first_of_slow_card(real_ep_db, REAL_EP_RUN)
    # whatever rank the verdict names: a token-skew card's first excess is GroupedMatmul with
    # larger inputs than the median rank's
    assert finding.cause == "token-skew"
    first = part["rows"][0]
    assert first["rank"] == finding.rank
    assert (first["op_class"], first["name"], first["shapes"]) == ("grouped_matmul", "GroupedMatmul", "more tokens")


@pytest.fixture(scope="module")
def noise_db(realdata, tmp_path_factory):
    if not (NOISE_SET / "README.md").is_file():
        pytest.skip(f"{NOISE_SET} (with its README.md) is absent")
    from test_ep_noise_realdata import expected_readings

    readings = expected_readings(NOISE_SET / "README.md")
    runs = {
        p.name: readings[p.name]
        for p in NOISE_SET.iterdir()
        if p.is_dir() and p.name in readings and readings[p.name]["statuses"] == {"FAIL"}
    }
    if not runs:
        pytest.skip(f"no run of {NOISE_SET} has a FAIL reading")
    db = tmp_path_factory.mktemp("why_noise") / "noise.duckdb"
    for name in sorted(runs):
        ingest_ok(db, [NOISE_SET / name], name)
    return db, runs


def test_real_noise_runs_first_operator_of_the_slow_card_matches_the_cause(noise_db):
    """Every FAIL run of the calibration set: the named card's first operator excess is
    GroupedMatmul, with 'more tokens' for a token-skew card and 'same shapes' for slow-compute."""
    db, runs = noise_db
    want = {"token-skew": "more tokens", "slow-compute": "same shapes"}
    checked = 0
    for name, exp in runs.items():
        if exp["cause"] not in want:
            continue
        finding, part = _first_of_slow_card(db, name)
        assert finding.rank == exp["rank"], name
        first = part["rows"][0]
        assert (first["name"], first["shapes"]) == ("GroupedMatmul", want[exp["cause"]]), (name, part["rows"])
        checked += 1
    if not checked:
        pytest.skip("no token-skew or slow-compute FAIL run in the set")


# ---------------------------------------------------------- why-host-device (generated GPU runs)


@pytest.fixture(scope="module")
def gpu_db(tmp_path_factory):
    import synth_host_device

    cache: dict = {}

    def make(scenario, slow_rank=2):
        key = (scenario, slow_rank)
        if key not in cache:
            d = tmp_path_factory.mktemp(f"hd_{scenario}")
            paths = synth_host_device.write_host_device_run(d / "trace", scenario=scenario, slow_rank=slow_rank)
            ingest_ok(d / "run.duckdb", paths, "r")
            cache[key] = d / "run.duckdb"
        return cache[key]

    return make


def by_rank(res):
    return {r["rank"]: r for r in res.rows}


def test_host_device_names_the_rank_whose_device_waits_for_its_host_host_bound(gpu_db):
    res = run(gpu_db("host_bound"), "why-host-device")
    assert res.status == "INFO", res.summary
    rows = by_rank(res)
    assert rows[2]["bound"] == "host-bound"
    assert rows[2]["host_wait_pct"] >= 25 and rows[2]["host_wait_us"] > 0
    # the others' devices have their launches in time and wait at the all-reduce for rank 2
    for r in (0, 1, 3):
        assert rows[r]["bound"] != "host-bound" and rows[r]["host_wait_us"] == 0
        assert rows[r]["collective_pct"] > rows[2]["collective_pct"]
    # the four parts add up to the device window
    for row in res.rows:
        parts = row["compute_us"] + row["collective_us"] + row["host_wait_us"] + row["other_idle_us"]
        assert parts == pytest.approx(row["window_ms"] * 1e3, rel=1e-3)


def test_host_device_names_the_rank_whose_kernels_run_longer_device_bound(gpu_db):
    rows = by_rank(run(gpu_db("device_slow"), "why-host-device"))
    assert rows[2]["bound"] == "device-bound"
    assert rows[2]["compute_ratio"] > 2 and rows[2]["host_wait_pct"] < 5
    assert all(rows[r]["compute_ratio"] == pytest.approx(1, abs=0.05) for r in (0, 1, 3))


def test_host_device_by_step_gives_one_row_per_rank_and_step(gpu_db):
    res = run(gpu_db("host_bound"), "why-host-device", by_step=True)
    keys = {(r["rank"], r["step"]) for r in res.rows}
    assert len(keys) == len(res.rows) == 4 * 6
    assert all(r["bound"] == "host-bound" for r in res.rows if r["rank"] == 2)


def test_host_device_skips_cpu_only_traces_with_the_reason(synth_db):
    res = run(synth_db("token_skew", slow_rank=1), "why-host-device")
    assert res.status == "SKIP"
    assert "no device activity" in res.summary and "CPU-only" in res.summary


def test_diagnose_why_section_of_a_host_bound_straggler(gpu_db):
    diag = diag_of(gpu_db("host_bound"))
    assert diag.conclusion["slow_cards"] == ["rank 2"]
    part = next(p for p in diag.why[0]["parts"] if p["query"].startswith("why-host-device@"))
    assert [r["rank"] for r in part["rows"]] == [2] and part["rows"][0]["bound"] == "host-bound"
    assert "rank 2 host-bound" in diagnosis_text(diag)


# ------------------------------------------------------------------ why-slow-link


def test_slow_link_names_the_rank_whose_transfers_run_at_half_the_bandwidth(gpu_db):
    res = run(gpu_db("slow_link"), "why-slow-link")
    assert res.status == "WARN", res.summary
    assert [(r["rank"], r["cause"], r["source"]) for r in res.rows] == [(2, "slow-link", "trace")]
    row = res.rows[0]
    assert row["bw_ratio"] == pytest.approx(0.5, abs=0.05) and row["below_pct"] == 100
    # bytes from the NCCL args: 4 Mi bf16 elements per all-reduce
    assert row["mbytes"] == pytest.approx(row["samples"] * 4 * 1024 * 1024 * 2 / 1e6, abs=1e-3)
    assert "all_reduce" in row["link"]


@pytest.mark.parametrize("scenario", ["balanced", "host_bound", "device_slow"])
def test_slow_link_passes_when_every_rank_moves_its_bytes_at_the_same_speed(gpu_db, scenario):
    # a straggler that arrives late is not a slow link: bandwidth is judged on the transfer
    res = run(gpu_db(scenario), "why-slow-link")
    assert res.status == "PASS", res.rows


def test_slow_link_on_a_cpu_ep_run_names_the_slow_comm_card(synth_db):
    db = synth_db("slow_link", slow_rank=1)
    res = run(db, "why-slow-link")
    assert res.status == "WARN" and {r["rank"] for r in res.rows} == {1}
    diag = diag_of(db)
    assert diag.conclusion["cause"] == "slow-comm"
    part = next(p for p in diag.why[0]["parts"] if p["query"].startswith("why-slow-link@"))
    assert part["rows"] and part["rows"][0]["cause"] == "slow-link" and part["rows"][0]["rank"] == 1


def test_slow_link_reads_ascend_link_types_from_the_communication_summary(tmp_path):
    import synth_comm_summary

    synth_comm_summary.write_cluster_communication(
        tmp_path / "in" / "cluster_analysis_output" / "cluster_communication.json", slow={3: ("HCCS", 2.0)}
    )
    ingest_ok(tmp_path / "c.duckdb", [tmp_path / "in"], "r")
    res = run(tmp_path / "c.duckdb", "why-slow-link")
    assert res.status == "WARN"
    assert [(r["rank"], r["link"], r["source"]) for r in res.rows] == [(3, "HCCS", "comm_summary")]
    assert res.rows[0]["bw_gbps"] == pytest.approx(40) and res.rows[0]["median_bw_gbps"] == pytest.approx(80)


def test_slow_link_skips_with_the_reason_below_three_ranks(tmp_path):
    import synth_comm_summary

    synth_comm_summary.write_cluster_communication(
        tmp_path / "in" / "cluster_analysis_output" / "cluster_communication.json", ranks=2
    )
    ingest_ok(tmp_path / "c.duckdb", [tmp_path / "in"], "r")
    res = run(tmp_path / "c.duckdb", "why-slow-link")
    assert res.status == "SKIP" and "no median rank" in res.summary


# ------------------------------------------------------------------ why-gmm-efficiency


def test_gmm_efficiency_of_a_slow_device_is_far_below_the_median_rank_for_the_same_shapes(synth_db):
    res = run(synth_db("slow_compute", slow_rank=2), "why-gmm-efficiency")
    assert res.status == "INFO", res.summary
    rows = {r["rank"]: r for r in res.rows}
    # the generator runs rank 2's GroupedMatmul ops 3x longer on the same rows
    assert rows[2]["shapes"] == "same shapes"
    assert rows[2]["efficiency_pct"] < 50
    assert all(70 < rows[r]["efficiency_pct"] < 130 for r in (0, 1, 3))
    # TFLOP/s = FLOPs / time, with FLOPs = 2 M K N of the matmuls inside
    for r in res.rows:
        assert r["tflops"] == pytest.approx(r["gflop"] / r["time_ms"], rel=0.01, abs=1e-4)  # GFLOP/ms


def test_gmm_efficiency_reads_ascend_operator_csv_input_shapes(tmp_path):
    from slowcard.ingest import ingest_paths

    for r in range(4):
        lines = ["Name,Type,Start Time(us),Duration(us),Input Shapes"]
        for k in range(6):
            dur = 200 if r == 3 else 100
            lines.append(
                f'aclnnGroupedMatmulV5_{k},GroupedMatmul,"{1736413971558972 + 1000 * k}.000\t",{dur},"""512,16;8,16,2048;;;;;;8"""'
            )
        (tmp_path / "in" / f"rank{r}").mkdir(parents=True)
        (tmp_path / "in" / f"rank{r}" / "kernel_details.csv").write_text("\n".join(lines) + "\n")
    rep = ingest_paths(tmp_path / "o.duckdb", [str(tmp_path / "in")], run="r", rank_pattern=r"rank(\d+)")
    assert all(f.status == "ok" for f in rep.files)
    rows = {r["rank"]: r for r in run(tmp_path / "o.duckdb", "why-gmm-efficiency").rows}
    # x [512, 16], 8 experts of 16 x 2048: 2 x 512 x 16 x 2048 FLOPs per 100 us call
    assert rows[0]["shape"] == "16x2048"
    assert rows[0]["tflops"] == pytest.approx(2 * 512 * 16 * 2048 / 100e-6 / 1e12, rel=1e-3)
    assert rows[3]["efficiency_pct"] == pytest.approx(50) and rows[3]["shapes"] == "same shapes"


def test_gmm_efficiency_skips_without_known_shapes(gpu_db):
    res = run(gpu_db("balanced"), "why-gmm-efficiency")
    assert res.status == "SKIP" and "known shapes" in res.summary


def test_real_slow_compute_card_runs_its_grouped_matmul_below_the_median_rank(noise_db):
    """Every slow-compute FAIL run of the calibration set: the named card's GroupedMatmul
    achieves clearly fewer TFLOP/s than the median rank for the same shapes."""
    db, runs = noise_db
    checked = 0
    for name, exp in runs.items():
        if exp["cause"] != "slow-compute":
            continue
        res = run(db, "why-gmm-efficiency", run_name=name)
        card = [r for r in res.rows if r["rank"] == exp["rank"]]
        assert card and card[0]["shapes"] == "same shapes", (name, res.rows)
        assert card[0]["efficiency_pct"] < 70, (name, card)
        checked += 1
    if not checked:
        pytest.skip("no slow-compute FAIL run in the set")


# ------------------------------------------------------------------ which ranks a card stands for


def _finding(subject):
    from slowcard.findings import Finding
    from slowcard.verdict import Status

    label = ", ".join(f"{k} {v}" for k, v in subject)
    return Finding("q", 1, Status.FAIL, tuple(subject), label, "c", None, None, None, {})


def test_card_ranks_of_a_rank_card_and_of_a_dp_domain():
    import duckdb

    from slowcard.why import card_ranks

    con = duckdb.connect()
    con.execute("CREATE TABLE sources (run VARCHAR, rank INTEGER, dp_rank INTEGER)")
    con.execute(
        "INSERT INTO sources VALUES ('r', 0, 0), ('r', 1, 0), ('r', 2, 1), ('r', 3, 1), ('r', NULL, 1), ('s', 9, 1)"
    )
    assert card_ranks(_finding([("rank", 3)]), con, "r") == [3]
    # a DP domain stands for the traced ranks of that domain in the run
    assert card_ranks(_finding([("dp_rank", 1)]), con, "r") == [2, 3]
    assert card_ranks(_finding([("dp_rank", 5)]), con, "r") == []
    assert card_ranks(_finding([("expert", 5)]), con, "r") == []


def test_op_diff_without_moe_layers_compares_steps_and_finds_the_slower_kernels(gpu_db):
    res = run(gpu_db("device_slow"), "why-op-diff")
    assert res.status == "INFO", res.summary
    first = rank_rows(res, 2)[0]
    assert first["unit"] == "step" and first["instances"] == 6
    # the GEMM kernels, placed in steps by their launch: 100 us instead of 40 us, 8 per step
    assert "gemm" in first["name"] and first["ratio"] == pytest.approx(2.5, rel=0.05)
    assert first["shapes"] == "shapes unknown"
    diag = diag_of(gpu_db("device_slow"))
    part = next(p for p in diag.why[0]["parts"] if p["query"].startswith("why-op-diff@"))
    assert diag.why[0]["card"] == "rank 2" and part["rows"][0]["name"] == first["name"]


def test_host_device_parts_add_up_on_every_real_kineto_trace(realdata, tmp_path):
    """Each real Kineto file as its own one-rank run: on a file with device activity the four
    parts are non-negative and add up to the device window; a CPU-only file SKIPs with the reason."""
    from slowcard.ingest import ingest_paths

    files = sorted((realdata / "kineto").glob("*.json*")) if (realdata / "kineto").is_dir() else []
    if not files:
        pytest.skip(f"no Kineto trace in {realdata / 'kineto'}")
    rank_map = tmp_path / "map.json"
    rank_map.write_text('{"*": 0}')
    db = tmp_path / "k.duckdb"
    seen_device = False
    for i, f in enumerate(files):
        ingest_paths(db, [str(f)], run=f"k{i}", rank_map=rank_map)
        res = run(db, "why-host-device", run_name=f"k{i}")
        if res.status == "SKIP":
            assert "no device activity" in res.summary or "duplicate ranks" in res.summary, (f, res.summary)
            continue
        assert res.status == "INFO", (f, res.summary)
        seen_device = True
        for row in res.rows:
            parts = [row["compute_us"], row["collective_us"], row["host_wait_us"], row["other_idle_us"]]
            assert all(p >= 0 for p in parts), (f, row)
            assert sum(parts) == pytest.approx(row["window_ms"] * 1e3, rel=1e-3, abs=1), (f, row)
            assert row["bound"] in ("host-bound", "device-bound", "waiting at collectives", "idle (not the host)")
    if not seen_device:
        pytest.skip("no real Kineto trace with device activity")
