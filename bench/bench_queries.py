#!/usr/bin/env python3
"""The EP queries on a large run, next to the ingest time of the same data, in ONE run.

    python bench/bench_queries.py [--ranks 64] [--events-per-rank 1000000] [--keep]

Generates a synthetic Kineto EP run (bench/gen_kineto.py: token_skew on rank 1, uncompressed
.pt.trace.json, one file per rank), ingests it with `slowcard ingest` in a fresh process, then runs
each query in a fresh process (`slowcard query NAME --format json`). Prints, per step, wall
seconds, peak RSS (of that process, from getrusage) and the query's time as a share of the ingest
time, plus the verdict. Generated data and the database go to bench/out/queries/ (git-ignored)
and are removed unless --keep (the generated JSON is reused by the next run when kept).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUERIES = [
    "ep-slow-rank",
    "moe-layer-durations",
    "moe-breakdown",
    "sync-gaps",
    "rank-waits",
    "clock-offsets",
    "wait-heatmap",
]


def run_child(cmd: list[str]) -> dict:
    """Run a command: wall seconds, exit code, output and the child's own peak RSS (os.wait4)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    err = proc.stderr.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "wall_s": time.perf_counter() - t0,
        "rc": proc.returncode,
        "out": out,
        "err": err,
        "rss_mb": usage.ru_maxrss / 1024,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--events-per-rank", type=int, default=1_000_000)
    ap.add_argument("--jobs", type=int, default=1, help="slowcard ingest --jobs")
    ap.add_argument("--out", type=Path, default=HERE / "out" / "queries")
    ap.add_argument("--keep", action="store_true", help="keep the generated run and the database")
    a = ap.parse_args()

    data = a.out / f"r{a.ranks}_e{a.events_per_rank}"
    db = a.out / "bench.duckdb"
    if not data.exists():
        t0 = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                str(HERE / "gen_kineto.py"),
                "--out-dir",
                str(data),
                "--ranks",
                str(a.ranks),
                "--events-per-rank",
                str(a.events_per_rank),
                "--scenario",
                "token_skew",
                "--slow-rank",
                "1",
                "--jobs",
                "1",
            ],
            check=True,
        )
        print(f"generated in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    size_mb = sum(p.stat().st_size for p in data.iterdir()) / 1e6
    for p in (db, Path(f"{db}.wal")):
        p.unlink(missing_ok=True)

    slowcard = [sys.executable, "-m", "slowcard"]
    ing = run_child(slowcard + ["ingest", str(data), "--db", str(db), "--run", "big", "--jobs", str(a.jobs), "-q"])
    if ing["rc"] != 0:
        print(f"ingest failed (exit {ing['rc']}): {ing['err'][-2000:]}", file=sys.stderr)
        return 1
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        events = con.execute("SELECT count(*) FROM event_rows").fetchone()[0]
        derived = con.execute("SELECT count(*) FROM op_class_rows").fetchone()[0]
    rows = []
    for q in QUERIES:
        r = run_child(slowcard + ["query", q, "--db", str(db), "--run", "big", "--format", "json"])
        try:
            res = json.loads(r["out"])[0]
            verdict = res["status"] + (f" ({len(res['rows'])} rows)" if res["rows"] else "")
            if q == "ep-slow-rank" and res["rows"]:
                verdict = res["status"] + " " + ", ".join(f"rank {x['rank']} {x['cause']}" for x in res["rows"])
        except (ValueError, IndexError, KeyError):
            verdict = f"exit {r['rc']}: {r['err'].strip().splitlines()[-1] if r['err'].strip() else '?'}"
        rows.append((q, r["wall_s"], r["rss_mb"], r["wall_s"] / ing["wall_s"], verdict))

    print(
        f"\n{a.ranks} ranks x {a.events_per_rank:,} events/rank: {events:,} events stored, "
        f"{derived:,} classified ops, {size_mb:,.0f} MB of JSON, DB {db.stat().st_size / 1e6:,.0f} MB, "
        f"{os.cpu_count()} cores\n"
    )
    print("| step | wall s | peak RSS MB | / ingest | result |\n|---|---:|---:|---:|---|")
    print(
        f"| slowcard ingest --jobs {a.jobs} | {ing['wall_s']:.1f} | {ing['rss_mb']:.0f} | 1.00 | "
        f"{size_mb / ing['wall_s']:.0f} MB/s, {events / ing['wall_s']:,.0f} events/s |"
    )
    for q, wall, rss, ratio, verdict in rows:
        print(f"| query {q} | {wall:.2f} | {rss:.0f} | {ratio:.3f} | {verdict} |")
    if not a.keep:
        shutil.rmtree(a.out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
