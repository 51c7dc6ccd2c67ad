"""Calibration of dp-metrics-imbalance on simulated metric windows (no exporter, no network).

Per scenario and seed: W windows of `window_s` seconds for D DP domains; requests per window are
Poisson(rate x window_s) per domain (tokens per request uniform 200-400 prompt + 50-150 generated,
waiting requests Poisson(1)), instance TTFT P99 log-normal noise around 80 ms. Scenarios:

- jitter:     every domain at the same rate (pure traffic noise): any WARN/FAIL is a false alarm;
- burst:      one domain at 2x for 2 windows in the middle: any WARN/FAIL at the end of the burst
              or after it is a false alarm;
- hot:        one domain at `factor` from window 10 on, P99 rising 15% a window: windows until FAIL.

Prints one table row per (scenario, traffic level). Usage: python bench/calibrate_metrics.py [--seeds N]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slowcard import metrics as mx  # noqa: E402
from slowcard import queries, store  # noqa: E402


def poisson(rng: random.Random, lam: float) -> int:
    if lam > 50:
        return max(0, int(round(rng.gauss(lam, math.sqrt(lam)))))
    k, p, t = 0, 1.0, math.exp(-lam)
    while True:
        p *= rng.random()
        if p <= t:
            return k
        k += 1


def windows(rng, n_windows, domains, rate, window_s, hot=None, factor=2.0, hot_from=10, hot_to=None, rising=False):
    rows = []
    for w in range(n_windows):
        is_hot = hot is not None and w >= hot_from and (hot_to is None or w < hot_to)
        tot = 0.0
        for d in range(domains):
            lam = rate * window_s * (factor if is_hot and d == hot else 1.0)
            n = poisson(rng, lam)
            prompt = sum(rng.randint(200, 400) for _ in range(min(n, 200))) * (n / min(n, 200) if n > 200 else 1)
            gen = sum(rng.randint(50, 150) for _ in range(min(n, 200))) * (n / min(n, 200) if n > 200 else 1)
            tot += n
            rows.append(
                dict(
                    ts_ns=w * int(window_s * 1e9),
                    window_s=window_s,
                    dp_rank=d,
                    targets=1,
                    running=8,
                    waiting=poisson(rng, 1.0),
                    kv_usage=0.4 + rng.uniform(-0.05, 0.05),
                    requests_per_s=n / window_s,
                    prompt_tokens_per_s=prompt / window_s,
                    generation_tokens_per_s=gen / window_s,
                    ttft_p50_ms=None,
                    ttft_p95_ms=None,
                    ttft_p99_ms=None,
                    e2e_p50_ms=None,
                    e2e_p95_ms=None,
                    e2e_p99_ms=None,
                    reset=False,
                )
            )
        p99 = 80 * math.exp(rng.gauss(0, 0.1)) * ((1.15 ** (w - hot_from + 1)) if (rising and is_hot) else 1.0)
        rows.append(
            dict(
                ts_ns=w * int(window_s * 1e9),
                window_s=window_s,
                dp_rank=None,
                targets=domains,
                running=8 * domains,
                waiting=None,
                kv_usage=None,
                requests_per_s=tot / window_s,
                prompt_tokens_per_s=None,
                generation_tokens_per_s=None,
                ttft_p50_ms=None,
                ttft_p95_ms=p99 * 0.8,
                ttft_p99_ms=p99,
                e2e_p50_ms=None,
                e2e_p95_ms=None,
                e2e_p99_ms=None,
                reset=False,
            )
        )
    return rows


def verdict(con, q, rows) -> str:
    con.execute("DELETE FROM metric_window_rows")
    con.executemany(
        f"INSERT INTO metric_window_rows VALUES ({', '.join('?' * (len(mx.WINDOW_COLUMNS) + 1))})",
        [[1] + [r[c] for c in mx.WINDOW_COLUMNS] for r in rows],
    )
    return queries.run_query(con, q, "cal").status


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--domains", type=int, default=4)
    ap.add_argument("--window-s", type=float, default=15.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        con = store.open_db(Path(d) / "cal.duckdb")
        store.ensure_run(con, "cal", None)
        con.execute(
            "INSERT INTO sources (source_id, run, path, format, status) VALUES (1, 'cal', 'sim', 'metrics_scrape', 'ok')"
        )
        q = queries.load_catalog()["dp-metrics-imbalance"]
        print(f"{'scenario':<8} {'req/s/domain':>12} {'alarms':>8} {'detect (windows after start)':>30}")
        for rate in (0.5, 2.0, 10.0):
            for name in ("jitter", "burst", "hot"):
                alarms, delays = 0, []
                for seed in range(a.seeds):
                    rng = random.Random(seed * 1000 + int(rate * 10))
                    if name == "jitter":
                        st = verdict(con, q, windows(rng, 20, a.domains, rate, a.window_s))
                        alarms += st in ("WARN", "FAIL")
                    elif name == "burst":
                        rows = windows(rng, 20, a.domains, rate, a.window_s, hot=1, hot_from=10, hot_to=12)
                        # judged at every window from the burst's end on, as the watch loop does
                        per_w = len(rows) // 20
                        alarms += any(verdict(con, q, rows[: per_w * end]) in ("WARN", "FAIL") for end in range(12, 21))
                    else:
                        rows = windows(rng, 20, a.domains, rate, a.window_s, hot=2, factor=2.0, rising=True)
                        per_w = len(rows) // 20
                        first = next(
                            (end - 10 for end in range(11, 21) if verdict(con, q, rows[: per_w * end]) == "FAIL"), None
                        )
                        delays.append(first)
                found = [x for x in delays if x is not None]
                det = (
                    f"{len(found)}/{len(delays)} found, median {sorted(found)[len(found) // 2]}"
                    if found
                    else ("-" if name != "hot" else f"0/{len(delays)} found")
                )
                print(f"{name:<8} {rate:>12g} {alarms if name != 'hot' else '-':>8} {det:>30}")
        con.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
