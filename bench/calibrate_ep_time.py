"""Calibration bench for ep-slow-rank v8 (issue 41): verdicts decided on time, where, from when,
and what the fix saves, on GPU expert-parallel runs built from a REAL single-rank vLLM trace
(tests/real_gpu_ep.py: its kernel names and durations replayed per rank, DeepEP dispatch /
combine inserted, re-timed causally, optionally DualPipe-shaped).

    python bench/calibrate_ep_time.py                     # 3 seeds per cell
    python bench/calibrate_ep_time.py --seed-base 1000    # hold-out: seeds no rule was judged on
    python bench/calibrate_ep_time.py --quick             # 1 seed per cell

The grid, the patterns of the issue (a rank gets an effect, ``real_gpu_ep.Effect``; where two
ranks get one, they are half the world apart):
(a) balanced runs, 8 and 16 ranks, with and without DualPipe: false alarms;
(b) a host-bound rank (host delay before each MoE launch) in DualPipe-shaped runs, where every
    other instance is a lone combine the delay does not touch (an effect present in one
    instance kind only), delays chosen so the measured saving spans ~2-40 %;
(c) slower expert GEMMs only (1.1-2x), with and without DualPipe;
(d) onset: slower GEMMs or a host delay from step 3 of 6;
(e) 7-8 ranks with 1.3-2x GEMM effects, and two slow devices (1.9x beside 1.3x) on 7 ranks;
(f) two effects where one hides the other: a host-bound rank and a slow-GEMM rank;
(g) a late rank at the collectives (host time before each dispatch launch): not a cause
    ep-slow-rank names; the bench reports what it says.

Truth is measured from the written files, never from the knobs (real_gpu_ep.saving_pct: the
same run, same seed and noise, written again without the effects, and the profiled step times
read back): per planted rank, what fixing it alone saves (% of the profiled step time); with
two planted ranks also what it saves after the other is fixed (saving of fixing both minus
saving of fixing the other). The pace-setter is the planted rank whose fix alone saves more;
the other is the hidden rank. A rank's measured saving is the larger of the two; ranks
without an effect save nothing. The right cause is host-bound for a host delay, slow-compute
for slower GEMMs.

Each run goes into its own scratch DuckDB in a temp dir, removed afterwards. Prints per cell,
then the issue's targets: false FAIL / WARN on balanced runs; of the planted ranks whose fix
saves >= 5 %, the share that FAILs with the right cause; of 2-5 %, the share named; the
reported saving (cost_pct; for a hidden rank after_pace_pct) within +-30 % of the measured
one; mixed runs: each rank with its own cause, the pace-setter's row first. Needs
../shared/realdata beside the checkout (the real source trace).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import real_gpu_ep as rg  # noqa: E402
from calibrate_ep import table  # noqa: E402

from slowcard import queries, verdict  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

E = rg.Effect
# (pattern, label, worlds (one per seed, in turn), dualpipe, steps, effects on the planted ranks)
# Host delays: the host runs ahead of the device until its delay per MoE launch eats the slack
# (~30 us per launch here); the saving rises from ~1 % at 30 us to ~5 % at 32 us and ~33 % at 60 us.
CELLS: list[tuple[str, str, tuple[int, ...], bool, int, tuple[rg.Effect, ...]]] = [
    ("a balanced", "8 ranks", (8,), False, 4, ()),
    ("a balanced", "8 ranks dualpipe", (8,), True, 4, ()),
    ("a balanced", "16 ranks", (16,), False, 4, ()),
    ("a balanced", "16 ranks dualpipe", (16,), True, 4, ()),
    *[("b host-bound dualpipe", f"{d} us", (8, 16), True, 4, (E(host_delay_us=d),)) for d in (31, 33, 36, 45, 70)],
    *[
        ("c slow GEMMs", f"{f}x" + (" dualpipe" if dp else ""), (8, 16), dp, 4, (E(gemm_factor=f),))
        for dp in (False, True)
        for f in (1.1, 1.5, 2.0)
    ],
    ("d onset", "1.5x from step 3 of 6", (8,), False, 6, (E(gemm_factor=1.5, from_step=3),)),
    ("d onset", "45 us from step 3 of 6 dualpipe", (8,), True, 6, (E(host_delay_us=45, from_step=3),)),
    ("e 7-8 ranks", "1.3x", (7, 8), False, 4, (E(gemm_factor=1.3),)),
    ("e 7-8 ranks", "2.0x", (7, 8), False, 4, (E(gemm_factor=2.0),)),
    ("e 7-8 ranks", "1.9x + 1.3x on 7", (7,), False, 4, (E(gemm_factor=1.9), E(gemm_factor=1.3))),
    ("f hidden", "60 us + 1.4x", (8,), False, 4, (E(host_delay_us=60), E(gemm_factor=1.4))),
    ("f hidden", "70 us + 1.5x dualpipe", (8, 16), True, 4, (E(host_delay_us=70), E(gemm_factor=1.5))),
    # close to each other: each hides the other (both fixes alone save little, together much)
    ("f hidden", "45 us + 1.5x dualpipe", (8,), True, 4, (E(host_delay_us=45), E(gemm_factor=1.5))),
    ("g late", "300 us", (8,), False, 4, (E(late_us=300),)),
    ("g late", "1000 us", (8,), False, 4, (E(late_us=1000),)),
]
KEEP = ("level", "rank", "cause", "causes", "cost_pct", "after_pace_pct", "pace_rank", "onset_step", "decided_in")


def plan(seeds: int, seed_base: int = 0) -> dict[str, dict]:
    """name -> one run of the grid: its cell, world, seed and effects by rank. Seeds are
    (seed_base + s) * 1000 + cell index: another seed_base (a multiple of 1000 past the seeds
    used) gives traces no rule was ever judged on."""
    runs = {}
    for ci, (pattern, label, worlds, dualpipe, steps, effects) in enumerate(CELLS):
        for s in range(seeds):
            seed = (seed_base + s) * 1000 + ci
            world = worlds[s % len(worlds)]
            first = seed % world
            ranks = [(first + i * (world // 2)) % world for i in range(len(effects))]
            runs[f"c{ci}_{s}"] = dict(
                cell=ci,
                pattern=pattern,
                label=label,
                world=world,
                dualpipe=dualpipe,
                steps=steps,
                seed=seed,
                effects=dict(zip(ranks, effects)),
            )
    return runs


def true_cause(eff: rg.Effect) -> str | None:
    if eff.host_delay_us > 0:
        return "host-bound"
    if eff.gemm_factor != 1.0:
        return "slow-compute"
    return None  # a late rank: no MoE cause


def sql_digest() -> str:
    """The query's version and a digest of its SQL and the views it reads, as this run sees them
    (the rule may be edited while the bench runs: the report says whether every run saw one)."""
    query = queries.load_catalog()["ep-slow-rank"]
    h = hashlib.sha256(query.path.read_bytes())
    for view in sorted((ROOT / "slowcard" / "views").glob("*.sql")):
        h.update(view.read_bytes())
    return f"v{query.version} {h.hexdigest()[:10]}"


def one_run(name: str, case: dict, scratch: str) -> dict:
    """Write the run, measure the truth from the files, ingest into a scratch DuckDB, query;
    everything written is removed. Returns truth, the query's rows, and the time taken."""
    t0, c0 = time.perf_counter(), time.process_time()
    work = Path(tempfile.mkdtemp(prefix=name + "_", dir=scratch))
    try:
        world, effects = case["world"], case["effects"]
        kw = dict(steps=case["steps"], seed=case["seed"], dualpipe=case["dualpipe"])
        rg.write_run(work / "actual", ranks=world, effects=effects, **kw)
        truth: dict[int, dict] = {}
        alone = {r: rg.saving_pct(work, world, effects, {r}, **kw) for r in effects}
        both = rg.saving_pct(work, world, effects, set(effects), **kw) if len(effects) == 2 else None
        for r, eff in effects.items():
            after = None
            if both is not None:
                (other,) = set(effects) - {r}
                after = both - alone[other]
            truth[r] = dict(
                alone_pct=alone[r],
                after_pct=after,
                saving_pct=max(alone[r], after if after is not None else alone[r]),
                cause=true_cause(eff),
            )
        if len(effects) == 2:
            # hidden: its fix alone saves less than half what it saves after the other's; the
            # other then sets the pace, unless it is hidden too (each hides the other: co-paced)
            for r in effects:
                truth[r]["role"] = "hidden" if alone[r] < 0.5 * truth[r]["after_pct"] else "pace-setter"
            if all(t["role"] == "hidden" for t in truth.values()):
                for t in truth.values():
                    t["role"] = "co-paced"
        t_truth = time.perf_counter() - t0
        db = work / "run.duckdb"
        rep = ingest_paths(db, [work / "actual"], run=name)
        bad = [(f.path, f.message) for f in rep.files if f.status != "ok"]
        if bad:
            raise RuntimeError(f"{name}: ingest {bad}")
        t_ingest = time.perf_counter() - t0 - t_truth
        query = queries.load_catalog()["ep-slow-rank"]
        con = queries.open_readonly(db)
        try:
            res = queries.run_query(con, query, name)
        finally:
            con.close()
        rows = []
        for r in res.rows:
            if r.get("level") not in ("FAIL", "WARN"):
                continue
            line = verdict.fill(query.summary or "", {**r, "caveat": ""}).split("; next:")[0]
            rows.append({**{k: r.get(k) for k in KEEP}, "line": line})
        return dict(
            sql=sql_digest(),
            truth=truth,
            rows=rows,
            status=str(res.status),
            secs=dict(
                truth=t_truth,
                ingest=t_ingest,
                query=time.perf_counter() - t0 - t_truth - t_ingest,
                wall=time.perf_counter() - t0,
                cpu=time.process_time() - c0,
            ),
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _reported(case: dict, rank: int, row: dict) -> tuple[float | None, float]:
    """The saving the query reports for a planted rank and the measured one it is judged against:
    a hidden rank's after_pace_pct against its saving after the pace-setter's fix, else cost_pct
    against the saving of its fix alone."""
    tr = case["truth"][rank]
    if tr.get("role") in ("hidden", "co-paced"):
        got = row.get("after_pace_pct")
        return (got if got is not None else row.get("cost_pct")), tr["after_pct"]
    return row.get("cost_pct"), tr["alone_pct"]


def _err(got: float | None, want: float) -> float | None:
    if got is None or want <= 0:
        return None
    return (got - want) / want


def _example(case: dict, rank: int | None, why: str) -> str:
    """The run, what is wrong about ``rank``, the measured savings of its planted ranks and the
    query's summary lines."""
    head = f"- {case['pattern']} / {case['label']}, {case['world']} ranks, seed {case['seed']}: rank {rank} {why}"
    meas = "; ".join(
        f"rank {r} ({true_cause(e) or 'late'}{', ' + case['truth'][r]['role'] if 'role' in case['truth'][r] else ''}) "
        + ", ".join(
            f"{k.removesuffix('_pct')} {case['truth'][r][k]:.1f} %"
            for k in ("alone_pct", "after_pct")
            if case["truth"][r][k] is not None
        )
        for r, e in case["effects"].items()
    )
    said = "\n".join(f"    query: [{r['level']}] {r['line']}" for r in case["rows"]) or "    query: PASS (no row)"
    return f"{head}\n    measured fix saves: {meas or 'nothing planted'}\n{said}"


def report(runs: dict[str, dict], secs: float, cpu: float, seed_base: int, seeds: int) -> str:
    cells: dict[int, list[dict]] = defaultdict(list)
    for case in runs.values():
        cells[case["cell"]].append(case)
    bands: dict[str, list[tuple[dict, dict | None]]] = defaultdict(list)
    errors: list[tuple[float, dict, int, float | None, float]] = []
    misses: dict[str, list[str]] = defaultdict(list)
    bal: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    spurious = {"runs": 0, "fail": 0, "warn": 0}
    mixed = []
    late = []
    onset = []

    cell_rows = []
    for _ci, cs in sorted(cells.items()):
        pattern, label = cs[0]["pattern"], cs[0]["label"]
        if pattern.startswith("a "):
            fails = sum(any(r["level"] == "FAIL" for r in c["rows"]) for c in cs)
            warns = sum(any(r["level"] == "WARN" for r in c["rows"]) for c in cs)
            b = bal[label]
            b[0] += len(cs)
            b[1] += fails
            b[2] += warns
            for c in cs:
                if c["rows"]:
                    misses["balanced run named a rank"].append(_example(c, c["rows"][0]["rank"], "false alarm"))
            cell_rows.append([pattern, label, len(cs), "-", "-", "-", "-", "-", "-", f"{fails} / {warns}", "-", "-"])
            continue
        pairs, errs, other = [], [], [0, 0]
        for c in cs:
            found = {r["rank"]: r for r in c["rows"]}
            spurious["runs"] += 1
            for r, row in found.items():
                if r not in c["effects"]:
                    other[row["level"] == "WARN"] += 1
                    spurious["fail" if row["level"] == "FAIL" else "warn"] += 1
            for r in c["effects"]:
                tr, got = c["truth"][r], found.get(r)
                pairs.append((tr, got))
                if tr["cause"] is None:
                    continue
                s = tr["saving_pct"]
                band = "saves >= 5 %" if s >= 5 else "saves 2-5 %" if s >= 2 else "saves < 2 %"
                bands[band].append((tr, got))
                if got is not None and s >= 2:
                    rep, want = _reported(c, r, got)
                    e = _err(rep, want)
                    if e is not None:
                        errs.append(e)
                        errors.append((e, c, r, rep, want))
                if s >= 5 and not (got is not None and got["level"] == "FAIL" and got["cause"] == tr["cause"]):
                    misses[">= 5 % not FAILed with the right cause"].append(
                        _example(c, r, "not named" if got is None else f"{got['level']} {got['cause']}")
                    )
                elif 2 <= s < 5 and got is None:
                    misses["2-5 % not named"].append(_example(c, r, "not named"))
            if len(c["effects"]) == 2:
                mixed.append(c)
            if pattern.startswith("g "):
                late.append(c)
            if pattern.startswith("d "):
                onset.append(c)
        savings = [tr["saving_pct"] for tr, _ in pairs]
        right = [(tr, g) for tr, g in pairs if g is not None and g["cause"] == tr["cause"]]
        kinds = sorted({g["decided_in"] for _, g in pairs if g is not None})
        cell_rows.append(
            [
                pattern,
                label,
                len(cs),
                len(pairs),
                f"{statistics.median(savings):.1f} ({min(savings):.1f}-{max(savings):.1f})",
                sum(g["level"] == "FAIL" for _, g in right),
                sum(g["level"] == "WARN" for _, g in right),
                sum(g is not None and g["cause"] != tr["cause"] for tr, g in pairs),
                sum(g is None for _, g in pairs),
                f"{other[0]} / {other[1]}",
                f"{100 * statistics.median(errs):+.0f} %" if errs else "-",
                "; ".join(kinds)[:70] or "-",
            ]
        )
    text = (
        f"### ep-slow-rank on time (issue 41): GPU runs from a real vLLM trace, seed base {seed_base}, "
        f"{seeds} seed(s) per cell\n\nPer cell (planted ranks; truth measured from the files):\n\n"
    )
    text += table(
        cell_rows,
        [
            "pattern",
            "cell",
            "runs",
            "planted",
            "measured saving % (median, range)",
            "FAIL right cause",
            "WARN right cause",
            "named, other cause",
            "not named",
            "other ranks FAIL / WARN",
            "saving error (median)",
            "decided in",
        ],
    )

    rows = [[label, n, f, w] for label, (n, f, w) in bal.items()]
    total_bal = [sum(v[i] for v in bal.values()) for i in range(3)]
    text += "\n\nBalanced runs (false alarms):\n\n" + table(
        rows + [["all", *total_bal]], ["runs", "n", "runs with a FAIL", "runs with a WARN"]
    )
    text += f"\n[target: 0 FAIL] -> {total_bal[1]} FAIL, {total_bal[2]} WARN in {total_bal[0]} runs"
    text += (
        f"\nRanks without an effect named in runs with one: {spurious['fail']} FAIL, {spurious['warn']} WARN "
        f"over {spurious['runs']} runs"
    )

    band_rows = []
    for band in ("saves >= 5 %", "saves 2-5 %", "saves < 2 %"):
        ps = bands.get(band, [])
        n = len(ps)
        fr = sum(g is not None and g["level"] == "FAIL" and g["cause"] == tr["cause"] for tr, g in ps)
        named = sum(g is not None for _, g in ps)
        named_right = sum(g is not None and g["cause"] == tr["cause"] for tr, g in ps)
        band_rows.append(
            [
                band,
                n,
                f"{fr} ({100 * fr / max(n, 1):.0f} %)",
                f"{named} ({100 * named / max(n, 1):.0f} %)",
                f"{named_right} ({100 * named_right / max(n, 1):.0f} %)",
            ]
        )
    text += (
        "\n\nPlanted ranks with a MoE cause (host delay, slower GEMMs) by measured saving "
        "(the larger of alone / after the other's fix):\n\n"
    )
    text += table(band_rows, ["measured", "ranks", "FAIL, right cause", "named (WARN or FAIL)", "named, right cause"])
    text += "\n[targets: >= 5 %: >= 95 % FAIL with the right cause; 2-5 %: >= 85 % named]"

    es = [x[0] for x in errors]
    within = sum(abs(e) <= 0.30 for e in es)
    text += (
        f"\n\nReported saving vs measured (named planted ranks, measured >= 2 %; cost_pct vs the fix alone, "
        f"a hidden rank's after_pace_pct vs its saving after the pace-setter's fix): {within}/{len(es)} "
        f"({100 * within / max(len(es), 1):.0f} %) within +-30 % [target: >= 90 %]"
    )
    if es:
        qs = statistics.quantiles(es, n=10) if len(es) > 1 else [es[0]] * 9
        text += (
            f"; median error {100 * statistics.median(es):+.1f} %, 10th-90th percentile "
            f"{100 * qs[0]:+.0f} % .. {100 * qs[-1]:+.0f} %"
        )
    for e, c, r, got, want in sorted(errors, key=lambda x: -abs(x[0])):
        if abs(e) > 0.30:
            misses["saving off by more than 30 %"].append(
                _example(c, r, f"reported {got} % vs measured {want:.1f} % ({100 * e:+.0f} %)")
            )

    if mixed:
        mrows = []
        for c in mixed:
            found = {r["rank"]: r for r in c["rows"]}
            order = [r["rank"] for r in c["rows"]]
            roles = {r: t["role"] for r, t in c["truth"].items()}
            own = all(found.get(r) is not None and found[r]["cause"] == c["truth"][r]["cause"] for r in c["effects"])
            # with one pace-setter and one hidden rank: the pace-setter's row comes first
            pace = [r for r, role in roles.items() if role == "pace-setter"]
            hidden = [r for r, role in roles.items() if role == "hidden"]
            first = None
            if len(pace) == 1 and len(hidden) == 1:
                first = bool(order) and order[0] == pace[0]
            cells_ = []
            for r in sorted(c["effects"], key=lambda r: roles[r] != "pace-setter"):
                t, g = c["truth"][r], found.get(r)
                said = "not named" if g is None else f"{g['level']} {g['cause']} {g['cost_pct']}"
                if g is not None and g.get("after_pace_pct") is not None:
                    said += f", after rank {g['pace_rank']} {g['after_pace_pct']}"
                cells_.append(
                    f"{r} {roles[r]} ({true_cause(c['effects'][r])}): {t['alone_pct']:.1f} / {t['after_pct']:.1f}"
                    f" -> {said}"
                )
            mrows.append(
                [
                    c["label"],
                    c["world"],
                    *cells_,
                    "yes" if own else "no",
                    "-" if first is None else "yes" if first else "no",
                    " ".join(map(str, order)),
                ]
            )
            if not own or first is False:
                misses["mixed: a rank without its own cause, or the pace-setter not first"].append(
                    _example(
                        c,
                        hidden[0] if hidden else None,
                        "named with its own cause, but the pace-setter is not first"
                        if own
                        else "or the other not named with its own cause",
                    )
                )
        text += (
            "\n\nTwo effects in one run. Per rank: role (measured), true cause: saves alone % / after the "
            "other's fix % -> the query's level, cause, cost_pct (and after_pace_pct after pace_rank):\n\n"
        )
        text += table(
            mrows,
            [
                "cell",
                "ranks",
                "rank A (the pace-setter if one)",
                "rank B",
                "each its own cause",
                "pace-setter first",
                "row order",
            ],
        )
        n_ok = sum(r[4] == "yes" and r[5] != "no" for r in mrows)
        text += f"\n[target: each rank its own cause, the pace-setter first] -> {n_ok}/{len(mrows)}"

    if onset:
        orows = []
        for c in onset:
            (r,) = c["effects"]
            g = next((x for x in c["rows"] if x["rank"] == r), None)
            orows.append(
                [
                    c["label"],
                    c["world"],
                    f"{c['truth'][r]['saving_pct']:.1f}",
                    "-" if g is None else f"{g['level']} {g['cause']}",
                    "-" if g is None else g["onset_step"],
                    "-" if g is None else g["cost_pct"],
                ]
            )
        text += "\n\nOnset (effect from step 3; steps are numbered from 0):\n\n" + table(
            orows, ["cell", "ranks", "measured saving %", "verdict", "onset_step", "cost_pct"]
        )

    if late:
        lrows = []
        for c in late:
            (r,) = c["effects"]
            g = next((x for x in c["rows"] if x["rank"] == r), None)
            lrows.append(
                [
                    c["label"],
                    c["world"],
                    f"{c['truth'][r]['saving_pct']:.1f}",
                    "not named" if g is None else f"{g['level']} {g['causes']} cost {g['cost_pct']} %",
                    sum(x["rank"] != r for x in c["rows"]),
                ]
            )
        text += (
            "\n\nLate rank at the collectives (host time before each dispatch launch; not an ep-slow-rank cause):\n\n"
        )
        text += table(lrows, ["cell", "ranks", "measured saving %", "late rank's verdict", "other ranks named"])

    if misses:
        text += "\n\nExamples where the targets are missed (the query's summary line and the measured truth):\n"
        for what, ex in misses.items():
            # the first three in full, the next ones by their first line
            text += f"\n{what} ({len(ex)}):\n" + "\n".join(ex[:3] + [x.splitlines()[0] for x in ex[3:12]]) + "\n"
    seen = sorted({c["sql"] for c in runs.values()})
    text += (
        f"\n({len(runs)} runs, {secs:.0f} s wall, {cpu:.0f} s CPU in the runs; ep-slow-rank "
        + (seen[0] if len(seen) == 1 else f"CHANGED DURING THE BENCH: {', '.join(seen)}")
        + ")"
    )
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=None, help="seeds per cell (default 3, --quick 1)")
    ap.add_argument("--seed-base", type=int, default=0, help="shift every seed: a hold-out grid (e.g. 1000)")
    ap.add_argument("--quick", action="store_true", help="1 seed per cell")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (processes)")
    ap.add_argument("--only", default="", help="cells whose pattern starts with one of these letters, e.g. 'bf'")
    a = ap.parse_args()
    if not rg.SOURCE.is_file():
        sys.exit(f"the real source trace {rg.SOURCE} is absent (../shared/realdata beside the checkout)")
    seeds = a.seeds or (1 if a.quick else 3)
    runs = plan(seeds, a.seed_base)
    if a.only:
        runs = {k: v for k, v in runs.items() if v["pattern"][0] in a.only}
    scratch = tempfile.mkdtemp(prefix="calibrate_ep_time_")
    t0 = time.perf_counter()
    try:
        with ProcessPoolExecutor(max_workers=a.jobs) as pool:
            futures = {name: pool.submit(one_run, name, case, scratch) for name, case in runs.items()}
            for i, (name, fut) in enumerate(futures.items()):
                runs[name].update(fut.result())
                s = runs[name]["secs"]
                print(
                    f"  {i + 1}/{len(runs)} {name} {runs[name]['pattern']} / {runs[name]['label']} "
                    f"w{runs[name]['world']}: {runs[name]['status']} (truth {s['truth']:.1f} s, ingest "
                    f"{s['ingest']:.1f} s, query {s['query']:.1f} s, cpu {s['cpu']:.1f} s; "
                    f"{time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    cpu = sum(c["secs"]["cpu"] for c in runs.values())
    print(report(runs, time.perf_counter() - t0, cpu, a.seed_base, seeds))
    print(f"(load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())})")


if __name__ == "__main__":
    main()
