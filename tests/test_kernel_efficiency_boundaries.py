"""The boundaries that decide why-kernel-efficiency's and why-gmm-efficiency's answers (issue 48):
a rank doing less (or more) work is not read as a slow device, the same-work band's edges, the
median rank's yardsticks, min_ranks exactly, grouped GEMM FLOPs counted once per row (not per
group), and the peak of each device variant (a PCIe or NVL card never gets the SXM peak).

Each test names the mutant of bench/mutants.py it kills (the KERNEL_EFFICIENCY list)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import synth_gemm  # noqa: E402
from conftest import ingest_ok  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

CATALOG = queries.load_catalog()


def judge(db, query="why-kernel-efficiency", **params):
    con = queries.open_readonly(db)
    try:
        return queries.run_query(con, CATALOG[query], "r", params)
    finally:
        con.close()


def gemm_rows(tmp_path, **kw) -> dict:
    paths = synth_gemm.write_run(tmp_path / "trace", **kw)
    ingest_ok(tmp_path / "g.duckdb", paths, "r")
    res = judge(tmp_path / "g.duckdb")
    assert res.status == "INFO", res.summary
    return {r["rank"]: r for r in res.rows if r["kind"] == "gemm"}


# ------------------------------------------------------------------ work-normalised efficiency


def test_a_rank_doing_less_work_is_not_blamed_as_a_slow_device(tmp_path):
    """Rank 2's GEMMs have half the rows (half the FLOPs) and run at half the rate: smaller
    matmuls, not a slow card; its rate does not compare. Kills ke-less-work-read-as-a-slow-device
    and ke-same-work-band-widened-10x."""
    gemm = gemm_rows(tmp_path, work={2: 0.5}, slow={2: 2.0})
    row = gemm[2]
    assert row["work_ratio"] == pytest.approx(0.5, abs=0.01)
    assert row["tflops"] == pytest.approx(250, rel=0.01) and row["vs_median_pct"] == pytest.approx(50, abs=1)
    assert row["reading"].startswith("0.5x the median rank's FLOPs (other shapes): its rate (50.")
    assert "runs slower" not in row["reading"]
    assert all(gemm[r]["reading"].startswith("as efficient as the median rank") for r in (0, 1, 3))


def test_a_rank_doing_more_work_is_not_blamed_and_does_not_move_the_others_yardstick(tmp_path):
    """Rank 1 runs twice the rows at half the rate: other shapes (kills
    ke-more-work-read-as-a-slow-device); the others' work is compared with the MEDIAN rank's,
    not the busiest rank's (kills ke-work-yardstick-is-the-busiest-rank)."""
    gemm = gemm_rows(tmp_path, work={1: 2.0}, slow={1: 2.0})
    assert gemm[1]["work_ratio"] == pytest.approx(2.0, abs=0.01)
    assert gemm[1]["reading"].startswith("2.0x the median rank's FLOPs (other shapes)")
    for r in (0, 2, 3):
        assert gemm[r]["work_ratio"] == 1.0
        assert gemm[r]["reading"].startswith("as efficient as the median rank (100.0% of its ")


def test_near_miss_of_the_same_work_band_still_compares(tmp_path):
    """0.95x the median rank's FLOPs is the same work (within same_work_ratio 1.1): at half the
    rate it is a slow device. 0.88x is outside the band (0.88 x 1.1 < 1): other shapes."""
    assert gemm_rows(tmp_path / "in", work={2: 0.95}, slow={2: 2.0})[2]["reading"].startswith(
        "the same work runs slower: 50."
    )
    out = gemm_rows(tmp_path / "out", work={2: 0.88}, slow={2: 2.0})[2]
    assert out["work_ratio"] == pytest.approx(0.88, abs=0.01) and "(other shapes)" in out["reading"]


def test_exactly_min_ranks_have_a_median_rank(tmp_path):
    """Three ranks (min_ranks = 3) are compared: the slow one reads slower. Kills ke-min-ranks-exclusive."""
    gemm = gemm_rows(tmp_path, ranks=3, slow={2: 2.0})
    assert gemm[2]["median_rank_tflops"] == pytest.approx(500, rel=0.01)
    assert gemm[2]["reading"].startswith("the same work runs slower: 50.")


def test_the_median_rank_is_the_median_not_the_mean(tmp_path):
    """One rank at a quarter of the rate: the mean (406 TFLOP/s) would put the healthy ranks at
    123 %; the median keeps them at 100 %. Kills ke-rate-yardstick-is-the-mean."""
    gemm = gemm_rows(tmp_path, slow={3: 4.0})
    assert gemm[0]["median_rank_tflops"] == pytest.approx(500, rel=0.01)
    assert gemm[3]["vs_median_pct"] == pytest.approx(25, abs=0.5)
    assert all(gemm[r]["vs_median_pct"] == pytest.approx(100, abs=0.5) for r in (0, 1, 2))


# ------------------------------------------------------------------ FLOPs of a grouped GEMM


def test_grouped_gemm_flops_count_each_row_once_not_once_per_group(tmp_path):
    """aten::_grouped_mm [GM, GK] x [G, GK, GN]: every row meets ONE group's weight, so
    2 x GM x GK x GN FLOPs (kills ke-grouped-gemm-times-the-groups: G times that) and the op
    counts (kills ke-grouped-gemm-left-out)."""
    gemm = gemm_rows(tmp_path, grouped=True)
    row = gemm[0]
    per_step = synth_gemm.GEMM_FLOPS + synth_gemm.MM_FLOPS + synth_gemm.GROUPED_FLOPS
    assert row["gflop"] == pytest.approx(3 * per_step / 1e9, abs=1e-6)
    assert row["ops"] == 9 and row["kernels"] == 12  # addmm (2 kernels), mm, _grouped_mm per step
    assert row["tflops"] == pytest.approx(500, rel=0.01)  # the generator's rate: FLOPs as it counts them


# ------------------------------------------------------------------ peaks per device variant


@pytest.mark.parametrize(
    "name, model, peak_16bit",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
        ("NVIDIA H200", "H100 SXM", 989.4),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
        ("NVIDIA H800 PCIe", "H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", "H100 NVL", 835.5),
        ("NVIDIA H200 NVL", "H100 NVL", 835.5),
        # A100 PCIe and SXM4: NVIDIA's datasheet gives both the same dense peaks
        ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
        ("NVIDIA A100 80GB PCIe", "A100", 312.0),
        ("NVIDIA A100-PCIE-40GB", "A100", 312.0),
        ("Tesla V100-SXM2-32GB", "V100 SXM2", 125.0),
        ("Tesla V100-PCIE-16GB", "V100 PCIe", 112.0),
        ("Tesla V100S-PCIE-32GB", "V100S PCIe", 130.0),
    ],
)
def test_each_device_variant_gets_its_own_peak(tmp_path, name, model, peak_16bit):
    """A PCIe (or NVL) card runs at lower clocks and power than the SXM module of the same chip:
    the SXM peak would read a healthy PCIe card as 25 % short. Kills ke-h100-pcie-given-the-sxm-peak,
    ke-nvl-given-the-sxm-peak, ke-v100-pcie-given-the-sxm2-peak and ke-a100-pcie-unknown."""
    row = gemm_rows(tmp_path, ranks=1, tflops=50.0, device=name)[0]
    assert (row["device"], row["peak_tflops"]) == (model, peak_16bit)
    assert row["peak_pct"] == pytest.approx(100 * row["tflops"] / peak_16bit, abs=0.01)
    assert row["vs_peak"].startswith(f"{row['peak_pct']}% of the {model} 16-bit peak ({peak_16bit} TFLOP/s)")


def test_a_v100_form_not_in_the_table_has_no_peak_rather_than_another_forms(tmp_path):
    row = gemm_rows(tmp_path, ranks=1, tflops=50.0, device="Tesla V100-FHHL-16GB")[0]
    assert row["peak_tflops"] is None and row["vs_peak"].startswith('no peak: device unknown: "Tesla V100-FHHL-16GB"')


# ------------------------------------------------------------------ why-gmm-efficiency


def _ascend_gmm(folder: Path, rows_per_rank: dict[int, tuple[int, int]]) -> Path:
    """kernel_details.csv per rank: 6 GroupedMatmul tasks of x [M, 16] and 8 experts' 16 x 2048
    weights, ``rows_per_rank[rank] = (M, duration us)``."""
    for r, (m, dur) in rows_per_rank.items():
        lines = ["Name,Type,Start Time(us),Duration(us),Input Shapes"]
        for k in range(6):
            lines.append(
                f'aclnnGroupedMatmulV5_{k},GroupedMatmul,"{1736413971558972 + 1000 * k}.000\t",{dur},'
                f'"""{m},16;8,16,2048;;;;;;8"""'
            )
        (folder / f"rank{r}").mkdir(parents=True)
        (folder / f"rank{r}" / "kernel_details.csv").write_text("\n".join(lines) + "\n")
    return folder


def _gmm(tmp_path, rows_per_rank) -> dict:
    src = _ascend_gmm(tmp_path / "in", rows_per_rank)
    rep = ingest_paths(tmp_path / "o.duckdb", [str(src)], run="r", rank_pattern=r"rank(\d+)")
    assert all(f.status == "ok" for f in rep.files), [(f.path, f.message) for f in rep.files]
    res = judge(tmp_path / "o.duckdb", "why-gmm-efficiency")
    return {r["rank"]: r for r in res.rows}


def test_gmm_a_rank_with_fewer_rows_is_not_blamed_as_a_slow_device(tmp_path):
    """Rank 3 gets a quarter of the rows per call in the same time (a quarter of the rate):
    smaller matmuls, not a slow card. Kills gmm-fewer-rows-read-as-a-slow-device."""
    rows = _gmm(tmp_path, {0: (512, 100), 1: (512, 100), 2: (512, 100), 3: (128, 100)})
    assert rows[3]["shapes"] == "fewer rows" and rows[3]["rows_ratio"] == 0.25
    assert rows[3]["efficiency_pct"] == pytest.approx(25)
    assert rows[3]["reading"] == "smaller matmuls run less efficiently: a lower rate is expected"
    # every row meets one expert's 16 x 2048 weight, not all 8 (kills gmm-grouped-weight-times-the-experts)
    assert rows[0]["tflops"] == pytest.approx(2 * 512 * 16 * 2048 / 100e-6 / 1e12, rel=1e-3)


def test_gmm_exactly_min_ranks_are_compared(tmp_path):
    """Three ranks (min_ranks = 3): rank 2 at half the rate on the same shapes reads slower.
    Kills gmm-min-ranks-exclusive."""
    rows = _gmm(tmp_path, {0: (512, 100), 1: (512, 100), 2: (512, 200)})
    assert sorted(rows) == [0, 1, 2]
    assert rows[2]["efficiency_pct"] == pytest.approx(50)
    assert rows[2]["reading"] == "the same work runs slower: a slower device or process"
