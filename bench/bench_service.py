"""Benchmark: msServiceProfiler ingest and the DP queries on a generated large service run.

Generates (once, cached by size) a request-skew run of ``--dp`` DP domains with about ``--rows``
batch.csv rows (default: one million rows over 16 domains, ~1 GB of CSV), ingests the folder into
a fresh database with ``slowcard.ingest.ingest_paths`` and runs dp-imbalance, dp-report and
dp-batch on it, printing the time of every step. Not a test: run it by hand.

    python bench/bench_service.py                      # 1,000,000 batch rows, 16 DP domains
    python bench/bench_service.py --rows 100000        # a quick check
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import synth_service as ss  # noqa: E402

from slowcard import queries, store  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

ITER_MS = 80.0  # about one scheduler iteration per domain every ITER_MS (test-size timing)


def config(rows: int, n_dp: int) -> ss.ServiceConfig:
    """A request-skew run whose batch.csv has about ``rows`` rows (2 rows per iteration)."""
    duration_s = rows / (2 * n_dp * (1000.0 / ITER_MS))
    return ss.config_for("request_skew", n_dp=n_dp, hot_dp=1, duration_s=duration_s, rate_rps=2.0 * n_dp)


def mb(path: Path) -> float:
    return path.stat().st_size / 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="batch.csv rows to generate (about)")
    ap.add_argument("--dp", type=int, default=16, help="DP domains")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "out", help="work folder (gitignored)")
    ap.add_argument("--regenerate", action="store_true", help="write the run again even if cached")
    ap.add_argument("--queries-only", action="store_true", help="reuse the database of the last run")
    args = ap.parse_args(argv)

    out = args.out / f"service_{args.rows}_{args.dp}"
    folder = out / "run"
    say = sys.stdout.write
    if args.regenerate or not (folder / "request.csv").exists():
        shutil.rmtree(folder, ignore_errors=True)
        t = time.perf_counter()
        counts = ss.write_run(folder, config(args.rows, args.dp))
        say(f"generate: {counts} in {time.perf_counter() - t:.1f} s\n")
    files = sorted(folder.iterdir())
    total_mb = sum(mb(p) for p in files)
    say("files: " + ", ".join(f"{p.name} {mb(p):.1f} MB" for p in files) + f" (total {total_mb:.1f} MB)\n")

    db = out / "bench.duckdb"
    if not (args.queries_only and db.exists()):
        ingest(db, folder, total_mb, say)
    run_queries(db, say)
    return 0


def ingest(db: Path, folder: Path, total_mb: float, say) -> None:
    for p in (db, db.with_suffix(".duckdb.wal")):
        p.unlink(missing_ok=True)
    store.open_db(db).close()  # schema creation is not part of the ingest time
    t = time.perf_counter()
    rep = ingest_paths(db, [folder], run="bench")
    ingest_s = time.perf_counter() - t
    for f in rep.files:
        size = mb(Path(f.path))
        say(
            f"ingest {Path(f.path).name:22s} {f.status:8s} {f.rows_kept:>11,d} rows  {f.seconds:7.2f} s  "
            f"{size / max(f.seconds, 1e-9):7.1f} MB/s  {f.rows_kept / max(f.seconds, 1e-9):>10,.0f} rows/s\n"
        )
    say(
        f"ingest total: {ingest_s:.1f} s for {total_mb:.0f} MB ({total_mb / ingest_s:.1f} MB/s); "
        f"database {mb(db):.0f} MB\n"
    )


def run_queries(db: Path, say) -> None:
    con = store.open_db(db, read_only=True)
    n_items = con.execute("SELECT count(*) FROM batch_requests").fetchone()[0]
    say(f"batch_requests rows (res_list items): {n_items:,d}\n")
    sql_dir = queries.builtin_sql_dir()
    catalog = {n: queries.parse_query(sql_dir / f"{n}.sql") for n in ("dp-imbalance", "dp-report", "dp-batch")}
    for name in ("dp-imbalance", "dp-report", "dp-batch"):
        t = time.perf_counter()
        res = queries.run_query(con, catalog[name], "bench")
        say(
            f"query {name:13s} {res.status:5s} {time.perf_counter() - t:6.2f} s  {len(res.rows)} rows  "
            f"{res.summary[:160]}\n"
        )
    con.close()


if __name__ == "__main__":
    raise SystemExit(main())
