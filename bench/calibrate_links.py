#!/usr/bin/env python3
"""Calibration of why-slow-link's pair judgement (issue 30 item 1): false alarms on healthy
communication matrices and detection per cause (one link slow both ways, one direction, a rank slow
with every peer) and effect size, over world sizes and transfer noise.

    python bench/calibrate_links.py [--seeds N] [--worlds 4,8,16]

Each run is msprof-analyze's ``cluster_communication_matrix.json`` written by
tests/synth_comm_summary.write_cluster_comm_matrix (6 all-gathers, every transfer's time off by a
uniform +-jitter), ingested as its own run of one database. **Truth is measured from the written
file**, not from the generator's factor: the planted pair's (or rank's) median bandwidth over its
transfers divided by the median bandwidth of every other pair of the matrix. A run is "named right"
when the query's rows are exactly the planted thing with the planted blame (``link``: both
directions, ``one direction``: that pair, ``rank``: one row for the rank); "named other" counts runs
with any row about something not planted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import synth_comm_summary  # noqa: E402
from calibrate_ep import table  # noqa: E402

from slowcard import queries, store  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

FACTORS = (1.25, 1.5, 2.0, 3.0)  # transit time x factor: bandwidth / factor
JITTERS = (0.1, 0.3)
BANDS = ((0.0, 0.6, "<= 0.60"), (0.6, 0.67, "0.60-0.67"), (0.67, 0.8, "0.67-0.80"), (0.8, 9.0, "> 0.80"))


def plant(kind: str, world: int, factor: float) -> dict:
    src, dst = 1, world - 1
    if kind == "link":
        return {"slow_pairs": {(src, dst): factor, (dst, src): factor}}
    if kind == "one direction":
        return {"slow_pairs": {(src, dst): factor}}
    return {"slow_ranks": {src: factor}}


def measured_ratio(path: Path, kind: str, world: int) -> float:
    """The planted thing's median bandwidth / the median of every other pair's median, from the file."""
    doc = json.loads(path.read_text())
    per_pair: dict[tuple[int, int], list[float]] = defaultdict(list)
    for step in doc.values():
        for ops in step.values():
            for links in ops.values():
                for key, v in links.items():
                    s, d = (int(x) for x in key.split("-"))
                    if s != d:
                        per_pair[(s, d)].append(float(v["Bandwidth(GB/s)"]))
    src, dst = 1, world - 1
    if kind == "link":
        planted = {(src, dst), (dst, src)}
    elif kind == "one direction":
        planted = {(src, dst)}
    else:
        planted = {p for p in per_pair if src in p}
    mine = [bw for p in planted for bw in per_pair[p]]
    others = [statistics.median(v) for p, v in per_pair.items() if p not in planted]
    return statistics.median(mine) / statistics.median(others)


def judged(res) -> set[tuple]:
    return {
        (r["src_rank"], r["dst_rank"], r["blame"]) if r["blame"] != "rank" else (r["rank"], "rank") for r in res.rows
    }


def expected(kind: str, world: int) -> set[tuple]:
    src, dst = 1, world - 1
    if kind == "link":
        return {(src, dst, "link"), (dst, src, "link")}
    if kind == "one direction":
        return {(src, dst, "one direction")}
    return {(src, "rank")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="seeds per (cause, factor, world, jitter)")
    ap.add_argument("--balanced-seeds", type=int, default=20, help="healthy matrices per (world, jitter)")
    ap.add_argument("--worlds", default="4,8,16")
    args = ap.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    plan = [("balanced", w, 1.0, j, s) for w in worlds for j in JITTERS for s in range(args.balanced_seeds)]
    plan += [
        (kind, w, f, j, s)
        for kind in ("link", "one direction", "rank")
        for f in FACTORS
        for w in worlds
        for j in JITTERS
        for s in range(args.seeds)
    ]
    catalog = queries.load_catalog()
    t0 = time.perf_counter()
    out = []
    with tempfile.TemporaryDirectory(prefix="slowcard-links-") as tmp:
        db = Path(tmp) / "links.duckdb"
        for i, (kind, w, f, j, _seed) in enumerate(plan):
            folder = Path(tmp) / f"m{i}"
            path = folder / "cluster_analysis_output" / "cluster_communication_matrix.json"
            extra = {} if kind == "balanced" else plant(kind, w, f)
            synth_comm_summary.write_cluster_comm_matrix(path, ranks=w, jitter=j, seed=1000 + i, **extra)
            con = store.open_db(db)
            try:
                rep = ingest_paths(db, [str(folder)], run=f"m{i}", con=con)
            finally:
                con.close()
            assert all(x.status == "ok" for x in rep.files), [(x.path, x.message) for x in rep.files]
            con = queries.open_readonly(db)
            try:
                res = queries.run_query(con, catalog["why-slow-link"], f"m{i}", {})
            finally:
                con.close()
            rows = judged(res)
            ratio = None if kind == "balanced" else measured_ratio(path, kind, w)
            want = set() if kind == "balanced" else expected(kind, w)
            out.append(
                {
                    "kind": kind,
                    "world": w,
                    "factor": f,
                    "jitter": j,
                    "ratio": ratio,
                    "right": rows == want,
                    "other": bool(rows - want),
                    "any": bool(rows),
                }
            )
    secs = time.perf_counter() - t0

    bal = [r for r in out if r["kind"] == "balanced"]
    rows = []
    for w in worlds:
        for j in JITTERS:
            cell = [r for r in bal if r["world"] == w and r["jitter"] == j]
            rows.append(["balanced", w, f"+-{j:.0%}", len(cell), sum(r["any"] for r in cell)])
    text = "### why-slow-link on generated communication matrices\n\nHealthy matrices:\n\n"
    text += table(rows, ["planted", "ranks", "noise", "runs", "WARN (false alarm)"])
    rows = []
    for kind in ("link", "one direction", "rank"):
        for f in FACTORS:
            cell = [r for r in out if r["kind"] == kind and r["factor"] == f]
            ratios = sorted(r["ratio"] for r in cell)
            rows.append(
                [
                    kind,
                    f"{1 / f:.2f}x",
                    len(cell),
                    f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})",
                    f"{sum(r['right'] for r in cell)} ({100 * sum(r['right'] for r in cell) / len(cell):.0f} %)",
                    sum(r["other"] for r in cell),
                ]
            )
    text += "\n\nPlanted, per cause and bandwidth (all world sizes and noise levels):\n\n"
    text += table(
        rows, ["planted", "bandwidth", "runs", "measured ratio (median, range)", "named right", "named other"]
    )
    rows = []
    planted = [r for r in out if r["kind"] != "balanced"]
    for lo, hi, label in BANDS:
        cell = [r for r in planted if lo <= r["ratio"] < hi]
        n = len(cell)
        rows.append(
            [
                label,
                n,
                f"{sum(r['right'] for r in cell)} ({100 * sum(r['right'] for r in cell) / max(n, 1):.0f} %)",
                sum(r["any"] for r in cell),
            ]
        )
    text += "\n\nBy the measured bandwidth ratio (truth from the file; the rule: <= max_bw_ratio 0.67 in >= 75 % of the transfers):\n\n"
    text += table(rows, ["measured ratio", "runs", "named right", "any row"])
    fa = sum(r["any"] for r in bal)
    text += f"\n\nHealthy matrices: {len(bal)}, WARN {fa} [target: 0]\n({len(out)} runs, {secs:.0f} s)"
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
