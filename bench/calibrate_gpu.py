"""Calibration bench on a labelled GPU set (issue 28): multi-rank DeepEP runs built from a REAL
single-rank GPU trace (tests/real_gpu_ep.py: a real vLLM MoE decode step, its kernel names and
durations, replayed per rank in eager mode with DeepEP low-latency dispatch / combine kernels,
re-timed causally), with known effects on chosen ranks: slower expert GEMMs (slow-compute), host
delay before each launch in the MoE blocks (host-bound), a late rank at the dispatch, and both
at once on two ranks. Truth for every rank is measured from the written files
(real_gpu_ep.measure), never from the knobs.

    python bench/calibrate_gpu.py              # 5 seeds per cell, 4 and 8 ranks
    python bench/calibrate_gpu.py --seeds 2    # quicker

Prints: detection per cell (the planted ranks), per measured-cost band (every rank: FAIL with
the measured cause, named), false alarms on balanced runs, the cost error, whether straggler-rank,
sync-gaps and rank-waits answer (not SKIP), and moe-breakdown's waiting share against the
measured one. Needs ../shared/realdata beside the checkout (the real source trace).
"""

from __future__ import annotations

import argparse
import shutil
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

import real_gpu_ep as rg  # noqa: E402
from calibrate_ep import cost_band_table, table  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

CATALOG = queries.load_catalog()
CELLS = (
    [("balanced", None)] * 2
    + [("slow-compute", f) for f in (1.02, 1.05, 1.1, 1.2, 1.5)]
    # the host runs ahead of the device until its delay per MoE launch eats the slack (~20 us
    # per launch here): the effect rises steeply between 20 and 40 us
    + [("host-bound", d) for d in (10.0, 22.0, 25.0, 28.0, 32.0, 40.0, 80.0)]
    + [("late", 500.0), ("mixed", (1.2, 40.0))]
)


def runs(seeds: int, worlds: tuple[int, ...]) -> dict[str, dict]:
    out = {}
    for ci, (kind, effect) in enumerate(CELLS):
        for world in worlds:
            for seed in range(seeds):
                seed_i = 1000 * ci + 10 * world + seed
                rank = seed_i % world
                effects: dict[int, rg.Effect] = {}
                if kind == "slow-compute":
                    effects[rank] = rg.Effect(gemm_factor=effect)
                elif kind == "host-bound":
                    effects[rank] = rg.Effect(host_delay_us=effect)
                elif kind == "late":
                    effects[rank] = rg.Effect(late_us=effect)
                elif kind == "mixed":
                    effects[rank] = rg.Effect(gemm_factor=effect[0])
                    effects[(rank + world // 2) % world] = rg.Effect(host_delay_us=effect[1])
                label = "" if effect is None else (f"{effect[0]}x + {effect[1]} us" if kind == "mixed" else str(effect))
                out[f"gpu_{kind}_{ci}_w{world}_{seed}"] = dict(
                    kind=kind, effect=label, world=world, seed=seed_i, effects=effects
                )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--worlds", default="4,8")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    if not rg.SOURCE.is_file():
        sys.exit(f"the real source trace {rg.SOURCE} is absent (../shared/realdata beside the checkout)")
    plan = runs(a.seeds, tuple(int(w) for w in a.worlds.split(",")))
    work = Path(tempfile.mkdtemp(prefix="calibrate_gpu_"))
    t0 = time.perf_counter()
    try:
        db = work / "gpu.duckdb"
        for i, (name, case) in enumerate(plan.items()):
            folder = work / name
            rg.write_run(folder, ranks=case["world"], steps=a.steps, effects=case["effects"], seed=case["seed"])
            case["truth"] = rg.measure(folder, case["world"])
            rep = ingest_paths(db, [folder], run=name)
            bad = [(f.path, f.message) for f in rep.files if f.status != "ok"]
            if bad:
                raise RuntimeError(f"{name}: ingest {bad}")
            shutil.rmtree(folder)
            if (i + 1) % 10 == 0:
                print(f"  {i + 1}/{len(plan)}: {time.perf_counter() - t0:.0f} s", flush=True)
        con = queries.open_readonly(db)
        try:
            for name, case in plan.items():
                res = queries.run_query(con, CATALOG["ep-slow-rank"], name)
                case["found"] = {r["rank"]: r for r in res.rows if r.get("level") in ("FAIL", "WARN")}
                case["status"] = str(res.status)
                case["coll"] = {
                    q: str(queries.run_query(con, CATALOG[q], name).status)
                    for q in ("straggler-rank", "sync-gaps", "rank-waits")
                }
                case["straggler"] = [r["rank"] for r in queries.run_query(con, CATALOG["straggler-rank"], name).rows]
                br = queries.run_query(con, CATALOG["moe-breakdown"], name)
                case["wait_pct"] = {r["rank"]: r["wait_pct"] for r in br.rows}
        finally:
            con.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(report(plan, time.perf_counter() - t0))


def report(plan: dict, secs: float) -> str:
    cells: dict[tuple, list] = defaultdict(list)
    bands: dict[str, list] = defaultdict(list)
    errors, wait_err, answers = [], [], defaultdict(int)
    bal = {"runs": 0, "fail": 0, "warn": 0}
    late = {"runs": 0, "straggler_named": 0, "ep_named": 0}
    for case in plan.values():
        truth, found = case["truth"], case["found"]
        if case["kind"] == "balanced":
            bal["runs"] += 1
            bal["fail"] += any(r["level"] == "FAIL" for r in found.values())
            bal["warn"] += any(r["level"] == "WARN" for r in found.values())
        for q, status in case["coll"].items():
            answers[q] += status != "SKIP"
        for rank, tr in truth.items():
            got = found.get(rank)
            band = "cost >= 5 %" if tr["cost_pct"] >= 5 else "cost 2-5 %" if tr["cost_pct"] >= 2 else "cost < 2 %"
            bands[band].append((tr, got))
            if got is not None and tr["cost_pct"] >= 2:
                errors.append((got["cost_ms"] * 1000 - tr["excess_us"]) / tr["excess_us"])
            if rank in case["wait_pct"]:
                wait_err.append(case["wait_pct"][rank] - tr["wait_pct"])
        if case["kind"] == "late":
            late["runs"] += 1
            slow = next(iter(case["effects"]))
            late["straggler_named"] += slow in case["straggler"]
            late["ep_named"] += slow in found
        for rank in case["effects"]:
            cells[(case["kind"], case["effect"])].append((truth[rank], found.get(rank)))
    rows = []
    for (kind, effect), pairs in sorted(cells.items(), key=lambda kv: (kv[0][0], float(str(kv[0][1]).split("x")[0]))):
        costs = [tr["cost_pct"] for tr, _ in pairs]
        right = [(tr, g) for tr, g in pairs if g is not None and g["cause"] == tr["cause"]]
        rows.append(
            [
                kind,
                effect,
                len(pairs),
                f"{statistics.median(costs):.1f}",
                f"{min(costs):.1f}-{max(costs):.1f}",
                sum(g["level"] == "FAIL" for _, g in right),
                sum(g["level"] == "WARN" for _, g in right),
                sum(g is not None and g["cause"] != tr["cause"] for tr, g in pairs),
                sum(g is None for _, g in pairs),
            ]
        )
    text = "### GPU set built from a real vLLM decode trace (tests/real_gpu_ep.py)\n\nPlanted ranks, per cell:\n\n"
    text += table(
        rows,
        [
            "planted",
            "effect",
            "ranks",
            "measured cost % of step (median)",
            "range",
            "FAIL right cause",
            "WARN right cause",
            "named, other cause",
            "not named",
        ],
    )
    text += "\n\nEvery rank of every run, by its measured cost (% of step time):\n\n" + cost_band_table(bands)
    within = sum(abs(e) <= 0.30 for e in errors)
    n_runs = len(plan)
    text += (
        f"\n\nBalanced runs: {bal['runs']}, FAIL {bal['fail']}, WARN {bal['warn']} [target: 0 FAIL]"
        f"\nLate rank (500 us before each dispatch launch): straggler-rank names it in {late['straggler_named']}/{late['runs']}; "
        f"ep-slow-rank names it in {late['ep_named']}/{late['runs']} (its device then waits for its host: host-bound)"
        f"\nCollective queries answering (not SKIP) on the {n_runs} DeepEP runs: "
        + ", ".join(f"{q} {n}/{n_runs}" for q, n in answers.items())
        + f"\nCost error of named findings (measured cost >= 2 %): {within}/{len(errors)} ({100 * within / max(len(errors), 1):.0f} %) within +-30 %"
        + (f"; median {100 * statistics.median(errors):+.1f} %" if errors else "")
        + f"\nmoe-breakdown waiting share vs measured, per rank: {sum(abs(e) <= 5 for e in wait_err)}/{len(wait_err)} within +-5 points"
        + (f" (largest {max(wait_err, key=abs):+.1f})" if wait_err else "")
        + f"\n\n({n_runs} runs, {secs:.0f} s)"
    )
    return text


if __name__ == "__main__":
    main()
