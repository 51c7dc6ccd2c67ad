#!/usr/bin/env python3
"""Calibration of the verdicts, in one run: false alarms on many balanced runs and detection rate
per cause and effect size, for EP (bench/calibrate_ep.py) and DP (bench/calibrate_dp.py).

    python bench/calibrate.py [--quick] [--only ep|dp]

Each part prints its own table; this driver runs them one after the other (same machine, same
run) and ends with their exit codes: 0 when every target of the issue holds, 1 when one misses.
Results are quoted in bench/README.md ("Calibration").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = {"ep": HERE / "calibrate_ep.py", "dp": HERE / "calibrate_dp.py"}


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
        cmd = [sys.executable, str(script)] + (["--quick"] if args.quick else [])
        codes[name] = subprocess.run(cmd, cwd=HERE.parent).returncode
        print(f"== {name}: exit {codes[name]} in {time.perf_counter() - t0:.0f} s\n", flush=True)
    print("targets: " + ", ".join(f"{k} {'met' if v == 0 else 'MISSED' if v == 1 else 'not run'}"
                                  for k, v in codes.items()))
    return 0 if all(v == 0 for v in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
