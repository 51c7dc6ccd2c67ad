"""How much request counts can tell under a random dispatcher: the pooled statistic of
dp-imbalance v3 against a pure binomial z and against measured variance always.

Arrivals only (tests/synth_service.py ``make_requests``, the calibration's traffic), no ingest: the
statistic is computed here from the per-window counts exactly as sql/dp-imbalance.sql does, for the
hot domain of request-skew runs (detection) and for every domain of burst runs (false alarms: any
domain at or above the critical value). bench/calibrate_dp.py measures the shipped query end to
end; this script compares variance choices over many more draws in seconds.

    python bench/dp_count_power.py --draws 200
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import Counter
from pathlib import Path
from statistics import NormalDist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import synth_service as ss  # noqa: E402

N_DP, WINDOW_S, ALPHA, SKEW_RATIO = 4, 5.0, 0.01, 1.2
LEVELS = (0.6, 0.8, 1.2)
VARIANCES = ("binomial", "larger of both", "switched (v3)")
CASES = (
    ("request skew 1.5x", "request_skew", {"skew_weight": 1.5}),
    ("burst 3x for 3 s", "burst", {"skew_weight": 3.0, "burst_len_s": 3.0}),
    ("burst 3x for 10 s", "burst", {"skew_weight": 3.0, "burst_len_s": 10.0}),
)


def pooled_z(per_window: list[Counter], dp: int) -> dict[str, float]:
    """The domain's count over the run against its share, under each variance choice."""
    n = sum(sum(c.values()) for c in per_window)
    x = sum(c[dp] for c in per_window)
    binom = n * (1 / N_DP) * (1 - 1 / N_DP)
    excess = [c[dp] - sum(c.values()) / N_DP for c in per_window]
    measured = len(excess) * statistics.variance(excess)
    bound = binom * (1 + 1.645 * math.sqrt(2 / (len(excess) - 1)))  # 95 % chi-square, normal approx
    var = {
        "binomial": binom,
        "larger of both": max(binom, measured),
        "switched (v3)": measured if measured > bound else binom,
    }
    return {k: (x - n / N_DP) / math.sqrt(v) for k, v in var.items()}


def draw(scenario: str, level: float, seed: int, hot: int, **extra) -> tuple[list[Counter], Counter]:
    cfg = ss.realistic_config(scenario, rate_rps=level * N_DP, assign="random", hot_dp=hot, seed=seed, **extra)
    reqs = ss.make_requests(cfg)
    t0 = min(r.arrival_us for r in reqs)
    windows: dict[int, Counter] = {}
    for r in reqs:
        windows.setdefault(int((r.arrival_us - t0) // (WINDOW_S * 1e6)), Counter())[r.dp] += 1
    return [windows[w] for w in sorted(windows)], Counter(r.dp for r in reqs)


def flagged(per_window: list[Counter], totals: Counter, dp: int, z_crit: float) -> dict[str, bool]:
    others = [totals[d] for d in range(N_DP) if d != dp]
    ratio_ok = totals[dp] >= SKEW_RATIO * sum(others) / len(others)
    return {k: ratio_ok and z >= z_crit for k, z in pooled_z(per_window, dp).items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=200, help="arrival draws per case and traffic level")
    args = ap.parse_args(argv)
    z_crit = NormalDist().inv_cdf(1 - ALPHA / (4 * N_DP))
    print(f"random dispatcher, 4 domains, 120 s; one-sided critical z {z_crit:.2f} (alpha {ALPHA} / 16)")
    print(f"{'case':<20} {'req/s/dp':>8} " + " ".join(f"{v:>16}" for v in VARIANCES))
    for label, scenario, extra in CASES:
        for level in LEVELS:
            hits = Counter()
            for i in range(args.draws):
                hot = i % N_DP
                more = dict(extra)
                if scenario == "burst":
                    more["burst_start_s"] = 10.0 + (i * 7) % 100
                per_window, totals = draw(scenario, level, 1000 + i, hot, **more)
                domains = [hot] if scenario == "request_skew" else range(N_DP)
                for k in VARIANCES:
                    hits[k] += any(flagged(per_window, totals, d, z_crit)[k] for d in domains)
            cells = " ".join(f"{hits[k]:>6}/{args.draws:<4} {100 * hits[k] / args.draws:>4.0f}%" for k in VARIANCES)
            print(f"{label:<20} {level:>8.1f} {cells}")
    print("request skew rows: detection of the hot domain; burst rows: runs where any domain was flagged")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
