#!/usr/bin/env python3
"""Calibration of the verdicts, in one run: false alarms on many balanced runs and detection rate
per cause and effect size, for EP (bench/calibrate_ep.py: ep-slow-rank), DP (bench/calibrate_dp.py:
dp-imbalance) and live metrics (bench/calibrate_metrics.py: dp-metrics-imbalance).

    python bench/calibrate.py [--quick] [--only ep|dp|metrics]

Each part prints its own tables and targets; this driver runs them one after the other (same
machine, same run) and ends with each part's exit code. Results are quoted in bench/README.md
("Calibration (EP)", "Calibration (DP)", "Calibration (live metrics)").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = {"ep": HERE / "calibrate_ep.py", "dp": HERE / "calibrate_dp.py", "metrics": HERE / "calibrate_metrics.py"}
# A smoke run of each part (--quick): far fewer runs per cell; not a calibration.
QUICK = {"ep": ["--quick", "--no-torch"], "dp": ["--balanced", "24", "--per-cause", "6"], "metrics": ["--seeds", "3"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer runs per cell (a smoke run, not a calibration)")
    ap.add_argument("--only", choices=sorted(PARTS), help="run one part only")
    args = ap.parse_args()
    codes = {}
    for name, script in PARTS.items():
        if args.only and name != args.only:
            continue
        if not script.is_file():
            print(f"== {name}: {script.name} is missing", flush=True)
            codes[name] = 2
            continue
        print(f"== {name}: python {script.relative_to(HERE.parent)}", flush=True)
        t0 = time.perf_counter()
        cmd = [sys.executable, str(script)] + (QUICK[name] if args.quick else [])
        codes[name] = subprocess.run(cmd, cwd=HERE.parent).returncode
        print(f"== {name}: exit {codes[name]} in {time.perf_counter() - t0:.0f} s\n", flush=True)
    print("exit codes: " + ", ".join(f"{k} {v}" for k, v in codes.items()))
    return 0 if all(v == 0 for v in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
