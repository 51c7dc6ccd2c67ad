"""The report of a long watch (issue 47): size and open time of `slowcard report` pages.

    python bench/bench_report.py [--windows 86400] [--repeat 3]

Writes two watched runs with tests/synth_watch_day.py (8 DP domains + the instance, one-second
windows, one 30 s alert): a short one (25 windows, the size of the watch in issue 47) and a long
one (``--windows``, default a day: 86,400). For each: `slowcard report` run as a fresh process
(wall seconds), the page's size, and the page opened in headless Chromium (/usr/bin/chromium)
``--repeat`` times: ``drawn`` is the page's own clock from the start of loading to the last
figure drawn (the report's loader records it on <body>), ``chromium`` the whole browser process
(start, load, draw, exit). Medians of the repeats; the ratios are long / short of this run.
Needs plotly (the `report` extra); without Chromium only the build and size are measured.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from chromium_page import CHROMIUM, open_page  # noqa: E402
from synth_watch_day import write_day  # noqa: E402


def measure(d: Path, name: str, windows: int, repeat: int) -> dict:
    db = d / f"{name}.duckdb"
    alert = (min(windows // 2, max(windows - 30, 0)), min(windows // 2 + 30, windows))
    write_day(db, run=name, windows=windows, alert=alert)
    out = d / f"{name}.html"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "slowcard", "report", "--db", str(db), "--run", name, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    build = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"slowcard report failed on {name}: {proc.stderr}")
    got = {"windows": windows, "build_s": build, "mb": out.stat().st_size / 1e6}
    if CHROMIUM is not None:
        drawn, wall = [], []
        for i in range(repeat):
            page = open_page(out, d / f"profile-{name}-{i}")
            if page["drawn_ms"] is None:
                raise SystemExit(f"{name}: Chromium did not finish drawing the figures: {page['console'][-500:]}")
            drawn.append(page["drawn_ms"] / 1000)
            wall.append(page["wall_s"])
        got["drawn_s"] = statistics.median(drawn)
        got["chromium_s"] = statistics.median(wall)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=86_400)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        short = measure(d, "short", 25, args.repeat)
        long = measure(d, "long", args.windows, args.repeat)
    cols = ["windows", "build_s", "mb"] + (["drawn_s", "chromium_s"] if "drawn_s" in long else [])
    print(f"{'run':<6} " + " ".join(f"{c:>11}" for c in cols))
    for name, r in (("short", short), ("long", long)):
        print(f"{name:<6} " + " ".join(f"{r[c]:>11.2f}" if isinstance(r[c], float) else f"{r[c]:>11}" for c in cols))
    print(
        "long / short: "
        + ", ".join(f"{c} {long[c] / short[c]:.2f}x" for c in cols if c != "windows" and short[c])
        + ("" if CHROMIUM else " (no Chromium: open time not measured)")
    )


if __name__ == "__main__":
    main()
