"""A long watched run written straight into a database, for the report's long-watch tests and
bench/bench_report.py: ``windows`` one-second metric windows of ``domains`` DP domains plus the
instance row (as `slowcard watch` writes them, ``metric_window_rows``), with one alert period in
which DP domain ``hot`` takes most of the traffic and dp-metrics-imbalance was FAIL
(``metric_verdict_rows``, one evaluation per window). Collecting a day for real takes a day.

    python tests/synth_watch_day.py DB [--windows 86400]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from slowcard import store

T0_NS = 1_780_000_000 * 10**9  # a fixed epoch: the same database every time


def write_day(
    db: Path,
    run: str = "day",
    windows: int = 86_400,
    domains: int = 8,
    hot: int = 5,
    alert: tuple[int, int] = (43_200, 43_230),
) -> dict:
    """Write the run; returns {run, windows, domains, hot, alert_ts_ns: [ts of each alert window]}."""
    a0, a1 = alert
    con = store.open_db(db)
    try:
        store.ensure_run(con, run, "synthetic day")
        sid = con.execute("SELECT coalesce(max(source_id), 0) + 1 FROM sources").fetchone()[0]
        con.execute(
            """INSERT INTO sources (source_id, run, path, size_bytes, fingerprint, format, rows_seen,
                           rows_kept, rows_dropped, status, message, metadata, ingested_at)
               VALUES (?, ?, 'http://127.0.0.1:1/metrics', 0, '', 'metrics_scrape', 0, ?, 0, 'ok', '', ?, now())""",
            [sid, run, windows * (domains + 1), json.dumps({"watch": "synthetic day"})],
        )
        # deterministic, gently varying traffic: a slow daily wave plus a per-domain wobble; in the
        # alert windows the hot domain takes 5x its share and the instance latency rises
        con.execute(
            f"""INSERT INTO metric_window_rows
                SELECT {sid}, {T0_NS} + i * 1000000000, 1.0, d, 1, 4 + (i + d) % 3,
                       CASE WHEN hot THEN 20 + (i % 4) ELSE (i * 7 + d) % 3 END,
                       CASE WHEN hot THEN 0.9 ELSE 0.3 + 0.05 * ((i + d) % 5) END,
                       rps * CASE WHEN hot THEN 5 ELSE 1 END,
                       rps * 200, rps * 40,
                       NULL, NULL, NULL, NULL, NULL, NULL, FALSE
                FROM (SELECT i, d, (d = {hot} AND i >= {a0} AND i < {a1}) AS hot,
                             2 + sin(i / 13750.0) + 0.1 * ((i * 31 + d * 17) % 10) AS rps
                      FROM range({windows}) r(i), range({domains}) s(d))"""
        )
        con.execute(
            f"""INSERT INTO metric_window_rows
                SELECT {sid}, {T0_NS} + i * 1000000000, 1.0, NULL, {domains}, NULL, NULL, NULL,
                       {domains} * (2 + sin(i / 13750.0)), NULL, NULL, NULL, NULL,
                       CASE WHEN i >= {a0} AND i < {a1} THEN 900 ELSE 150 + (i % 50) END,
                       NULL, NULL, CASE WHEN i >= {a0} AND i < {a1} THEN 4000 ELSE 900 + (i % 200) END,
                       FALSE
                FROM range({windows}) r(i)"""
        )
        con.execute(
            f"""INSERT INTO metric_verdict_rows
                SELECT {sid}, {T0_NS} + i * 1000000000, 'dp-metrics-imbalance',
                       CASE WHEN i >= {a0} AND i < {a1} THEN 'FAIL' ELSE 'PASS' END, ''
                FROM range({windows}) r(i)"""
        )
    finally:
        con.close()
    return {
        "run": run,
        "windows": windows,
        "domains": domains,
        "hot": hot,
        "alert_ts_ns": [T0_NS + i * 10**9 for i in range(a0, a1)],
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db", type=Path)
    ap.add_argument("--windows", type=int, default=86_400)
    args = ap.parse_args()
    print(write_day(args.db, windows=args.windows, alert=(args.windows // 2, args.windows // 2 + 30)))
