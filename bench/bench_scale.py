#!/usr/bin/env python3
"""Scale measured, not assumed: ingest and query cost from 8 to 512 ranks, --jobs 2 and the Dask path.

    python bench/bench_scale.py [--sizes 8,32,128,512] [--events-per-rank 5000] [--compare 128]
                                [--big-ranks 4 --big-events 60000] [--readme bench/README.md]

Everything below is measured in ONE run of this script, each ingest and each query in a fresh
Python process (wall seconds; peak RSS from resource.getrusage in that process):

1. Runs of N ranks (synthetic Kineto from bench/gen_kineto.py, token_skew on rank 1, gzip, the
   same events per rank for every N): ingest with --jobs 1, then ``ep-slow-rank``; events/s shows
   whether cost is linear in total events, query/ingest whether the query stays cheap.
2. The same files of the --compare run with ``ingest_paths(jobs=2)``: the speed-up over jobs=1.
3. The same files through ``slowcard.distributed.ingest_paths_dask`` on a LocalCluster of 2
   single-threaded workers (loopback): the overhead ratio against the local path, with the cluster
   start-up and worker warm-up shown apart, the worker-side seconds and the coordinator's
   registration seconds (time in ``_register``, measured by wrapping it here).
4. A few large ranks (--big-ranks x --big-events) through jobs=1 and Dask, so that the per-file
   fixed cost and the per-MB cost can be told apart.
5. The two halves of the Dask path timed apart in one process, one core, no contention
   (``ingest_one_file`` then ``_register``, on --split-files of the --compare files and on the big
   files), and from them the projection to 1,024 ranks x 1 GB for N workers: per file
   ``a + b * 1000 MB`` on a worker, registered serially on the coordinator.

The table and the projection replace the "## Scale" section of bench/README.md (other sections are
kept). Generated data goes to bench/out/scale/ (git-ignored) and is removed unless --keep.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "scale"

# ------------------------------------------------------------------------------------------------
# child processes (one measurement each; print one JSON line)


def _rss_mb() -> tuple[float, float]:
    import resource

    self_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return self_mb, kids_mb


def child_ingest(a) -> dict:
    from slowcard.ingest import ingest_paths

    t0 = time.perf_counter()
    rep = ingest_paths(a.db, [a.path], run="bench", jobs=a.jobs)
    wall = time.perf_counter() - t0
    return _report_dict(rep, wall)


def child_dask(a) -> dict:
    import logging

    from dask.distributed import Client, LocalCluster

    import slowcard.distributed as dist

    reg = {"s": 0.0, "n": 0}
    orig = dist._register

    def timed(*args, **kw):
        t = time.perf_counter()
        try:
            return orig(*args, **kw)
        finally:
            reg["s"] += time.perf_counter() - t
            reg["n"] += 1

    dist._register = timed
    t0 = time.perf_counter()
    cluster = LocalCluster(
        n_workers=a.workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        silence_logs=logging.ERROR,
    )
    client = Client(cluster)
    try:
        tw = time.perf_counter()
        # Per worker process, once: import the readers and warm DuckDB, so that the per-file
        # worker seconds below are steady-state (the warm-up is reported on its own).
        client.run(_warm_worker)
        t1 = time.perf_counter()
        rep = dist.ingest_paths_dask(a.db, [a.path], run="bench", client=client)
        t2 = time.perf_counter()
    finally:
        client.close()
        cluster.close()
    out = _report_dict(rep, time.perf_counter() - t0)
    out.update(
        startup_s=tw - t0,
        warmup_s=t1 - tw,
        ingest_s=t2 - t1,
        register_s=reg["s"],
        worker_s=sum(f.seconds for f in rep.files) - reg["s"],
    )
    return out


def _warm_worker() -> None:
    """Import the readers and apply the DDL once in this worker process (the per-ingest template
    that ingest_paths_dask then builds costs ~1 s per worker and stays inside the timing)."""
    import slowcard.distributed as dist
    from slowcard.ingest import readers

    readers()
    dist._template_db("warm-up")
    dist._drop_templates("warm-up")


def _report_dict(rep, wall: float) -> dict:
    self_mb, kids_mb = _rss_mb()
    return {
        "wall_s": wall,
        "files": len(rep.files),
        "events": sum(f.rows_kept for f in rep.files),
        "files_s": sum(f.seconds for f in rep.files),
        "bytes": sum(f.size_bytes for f in rep.files),
        "not_ok": [f"{f.path}: {f.status} {f.message}" for f in rep.files if f.status != "ok"],
        "rss_mb": self_mb,
        "children_rss_mb": kids_mb,
    }


def child_split(a) -> dict:
    """The two halves of the Dask path, serially in this one process (one core, no contention):
    worker side (ingest_one_file: temp DB + Parquet) then coordinator side (_register), per file."""
    import tempfile

    import slowcard.distributed as dist
    from slowcard import store
    from slowcard.ingest import expand_paths
    from slowcard.ingest.base import IngestOptions

    files = [p for p, _ in expand_paths([a.path])][: a.limit]
    stage = tempfile.mkdtemp(dir=Path(a.db).parent)
    dist._template_db(stage)  # built once per worker process in the real path
    outs, worker_s = [], []
    for p in files:
        t = time.perf_counter()
        outs.append(
            (
                p,
                dist.ingest_one_file(
                    str(p), "bench", False, p.stat().st_size, IngestOptions(threads=1), None, None, stage
                ),
            )
        )
        worker_s.append(time.perf_counter() - t)
    dist._drop_templates(stage)
    con = store.open_db(a.db)
    store.ensure_run(con, "bench", str(a.path))
    cols = {t: dist._table_columns(con, t) for t in store.row_tables(con) if t not in dist.NOT_STAGED}
    reg_s = []
    for p, out in outs:
        t = time.perf_counter()
        res = dist._register(con, "bench", p.stat().st_size, out, cols)
        reg_s.append(time.perf_counter() - t)
        assert res.status == "ok", res.message
        dist._unlink_staged(out)
    con.close()
    shutil.rmtree(stage, ignore_errors=True)
    return {"files": len(files), "worker_s": sum(worker_s), "register_s": sum(reg_s), "worker_first_s": worker_s[0]}


def child_query(a) -> dict:
    from slowcard import queries

    con = queries.open_readonly(a.db)
    try:
        q = queries.load_catalog()["ep-slow-rank"]
        t0 = time.perf_counter()
        res = queries.run_query(con, q, "bench")
        wall = time.perf_counter() - t0
        n_ev = con.execute("SELECT count(*) FROM events WHERE run = 'bench'").fetchone()[0]
    finally:
        con.close()
    self_mb, _ = _rss_mb()
    ranks = [r.get("rank") for r in res.rows]
    return {
        "wall_s": wall,
        "status": res.status,
        "ranks": ranks,
        "summary": res.summary,
        "events": n_ev,
        "rss_mb": self_mb,
    }


def run_child(kind: str, **kw) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child {kind} {kw} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------
# the run


def say(*a):
    print(*a, flush=True)


def generate(out: Path, ranks: int, events: int, units: int, layers: int) -> float:
    """Write rank{r}.pt.trace.json.gz into out; returns the uncompressed MB (from the generator)."""
    if out.exists():
        shutil.rmtree(out)
    # --jobs 1: the generator's cross-rank plan is computed once (with --jobs N every process
    # would redo it, and it grows with ranks^2).
    cmd = [
        sys.executable,
        str(HERE / "gen_kineto.py"),
        "--ranks",
        str(ranks),
        "--events-per-rank",
        str(events),
        "--units",
        str(units),
        "--layers",
        str(layers),
        "--out-dir",
        str(out),
        "--gz",
        "--jobs",
        "1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = re.search(r"([\d.]+) MB uncompressed", proc.stderr)
    return float(m.group(1)) if m else float("nan")


def fresh_db(path: Path) -> Path:
    for p in (path, Path(str(path) + ".wal")):
        if p.exists():
            p.unlink()
    # The schema is created here, outside the timed child, as a user's database would already be.
    from slowcard import store

    store.open_db(path).close()
    return path


def line_fit(pts: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b * x."""
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return my, 0.0
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return my - b * mx, b


def fmt_s(x: float) -> str:
    if x >= 86400:
        return f"{x / 86400:.1f} d"
    if x >= 3600:
        return f"{x / 3600:.1f} h"
    if x >= 60:
        return f"{x / 60:.1f} min"
    return f"{x:.1f} s"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8,32,128,512", help="rank counts, comma-separated")
    ap.add_argument("--events-per-rank", type=int, default=5000)
    ap.add_argument(
        "--units",
        type=int,
        default=40,
        help="filler units per (step, layer) block "
        "(more units = fewer blocks per rank: the generator's plan costs ranks^2 x blocks)",
    )
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--compare", type=int, default=128, help="run (rank count) for jobs=2 and Dask")
    ap.add_argument("--big-ranks", type=int, default=4)
    ap.add_argument("--big-events", type=int, default=60000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--split-files",
        type=int,
        default=32,
        help="files of the --compare run timed half by half (worker / coordinator)",
    )
    ap.add_argument("--readme", type=Path, default=HERE / "README.md")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep bench/out/scale")
    ap.add_argument("--note", default="", help="a line written under the table (e.g. machine load)")
    # child mode
    ap.add_argument("--child", choices=["ingest", "dask", "query", "split"])
    ap.add_argument("--limit", type=int, default=10**9)
    ap.add_argument("--db")
    ap.add_argument("--path")
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args(argv)

    if a.child:
        out = {"ingest": child_ingest, "dask": child_dask, "query": child_query, "split": child_split}[a.child](a)
        print(json.dumps(out))
        return 0

    sizes = [int(s) for s in a.sizes.split(",") if s]
    if a.compare not in sizes:
        ap.error("--compare must be one of --sizes")
    OUT.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    say(
        f"bench_scale: sizes {sizes}, {a.events_per_rank} events/rank, compare {a.compare}, "
        f"big {a.big_ranks}x{a.big_events}; {os.cpu_count()} cores, load {load0[0]:.1f}"
    )

    rows = []  # the scaling table (jobs=1)
    mb_of = {}
    for n in sizes:
        d = OUT / f"r{n}"
        t = time.perf_counter()
        mb = generate(d, n, a.events_per_rank, a.units, a.layers)
        mb_of[n] = mb
        say(f"  generated {n} ranks: {mb:.0f} MB uncompressed in {time.perf_counter() - t:.0f} s")
        db = fresh_db(OUT / f"r{n}.duckdb")
        ing = run_child("ingest", db=db, path=d, jobs=1)
        q = run_child("query", db=db)
        db_mb = db.stat().st_size / 1e6
        rows.append(dict(ranks=n, mb=mb, gz_mb=ing["bytes"] / 1e6, ing=ing, q=q, db_mb=db_mb))
        say(
            f"  {n:4d} ranks: {ing['events']:>9,} events, ingest {ing['wall_s']:.1f} s "
            f"({ing['events'] / ing['wall_s']:,.0f} ev/s, {ing['files_s'] / ing['files']:.3f} s/file, "
            f"{ing['rss_mb']:.0f} MB RSS), ep-slow-rank {q['wall_s']:.2f} s ({q['status']} ranks "
            f"{q['ranks'][:3]}, {q['rss_mb']:.0f} MB RSS), db {db_mb:.0f} MB"
        )
        if ing["not_ok"]:
            say("    not ok:", ing["not_ok"][:3])

    # jobs=2 and Dask on the same files as the jobs=1 run of --compare
    base = next(r for r in rows if r["ranks"] == a.compare)
    d = OUT / f"r{a.compare}"
    j2 = run_child("ingest", db=fresh_db(OUT / "jobs2.duckdb"), path=d, jobs=2)
    q2 = run_child("query", db=OUT / "jobs2.duckdb")
    j1 = base["ing"]["wall_s"]
    say(f"  jobs=2 on {a.compare} ranks: {j2['wall_s']:.1f} s (jobs=1 {j1:.1f} s) -> speed-up {j1 / j2['wall_s']:.2f}x")
    dk = run_child("dask", db=fresh_db(OUT / "dask.duckdb"), path=d, workers=a.workers)
    qd = run_child("query", db=OUT / "dask.duckdb")
    say(
        f"  dask on {a.compare} ranks: {dk['wall_s']:.1f} s total = {dk['startup_s']:.1f} s cluster "
        f"start + {dk['warmup_s']:.1f} s warm-up + {dk['ingest_s']:.1f} s ingest (worker-side "
        f"{dk['worker_s']:.1f} s, registration {dk['register_s']:.1f} s); jobs=2 {j2['wall_s']:.1f} s "
        f"-> overhead {dk['wall_s'] / j2['wall_s']:.2f}x"
    )
    same = (
        q2["summary"] == base["q"]["summary"] == qd["summary"] and j2["events"] == dk["events"] == base["ing"]["events"]
    )
    say(f"  same events and ep-slow-rank verdict in jobs=1 / jobs=2 / dask databases: {same}")
    sp = run_child("split", db=fresh_db(OUT / "split.duckdb"), path=d, limit=a.split_files)

    # a few large ranks: per-file cost apart from per-MB cost
    dbig = OUT / "big"
    t = time.perf_counter()
    big_mb = generate(dbig, a.big_ranks, a.big_events, a.units, a.layers)
    say(f"  generated {a.big_ranks} big ranks: {big_mb:.0f} MB in {time.perf_counter() - t:.0f} s")
    bg = run_child("ingest", db=fresh_db(OUT / "big.duckdb"), path=dbig, jobs=1)
    bq = run_child("query", db=OUT / "big.duckdb")
    bdk = run_child("dask", db=fresh_db(OUT / "bigdask.duckdb"), path=dbig, workers=a.workers)
    bsp = run_child("split", db=fresh_db(OUT / "bigsplit.duckdb"), path=dbig)
    say(
        f"  big: jobs=1 {bg['wall_s']:.1f} s ({big_mb / bg['wall_s']:.1f} MB/s, {bg['rss_mb']:.0f} MB RSS), "
        f"dask {bdk['wall_s']:.1f} s; split worker {bsp['worker_s']:.1f} s, registration {bsp['register_s']:.1f} s"
    )

    # Per-file fits y = a + b * MB over run means (MB per file = run MB / files):
    # local jobs=1 from the in-process per-file seconds (no process start), and the two halves of
    # the Dask path from the uncontended split runs.
    small_mb = mb_of[a.compare] / a.compare
    big_file_mb = big_mb / a.big_ranks
    pts = [(r["mb"] / r["ranks"], r["ing"]["files_s"] / r["ing"]["files"]) for r in rows]
    pts.append((big_file_mb, bg["files_s"] / bg["files"]))
    la, lb = line_fit(pts)
    wa, wb = line_fit([(small_mb, sp["worker_s"] / sp["files"]), (big_file_mb, bsp["worker_s"] / bsp["files"])])
    ra, rb = line_fit([(small_mb, sp["register_s"] / sp["files"]), (big_file_mb, bsp["register_s"] / bsp["files"])])
    clamped = [
        n
        for n, v in (
            ("local a", la),
            ("local b", lb),
            ("worker a", wa),
            ("worker b", wb),
            ("registration a", ra),
            ("registration b", rb),
        )
        if v < 0
    ]
    la, lb, wa, wb, ra, rb = (max(0.0, v) for v in (la, lb, wa, wb, ra, rb))
    qa = [r["q"]["wall_s"] / max(1, r["q"]["events"]) * 1e6 for r in rows]
    total_s = time.perf_counter() - t_start
    load1 = os.getloadavg()
    say(
        f"  per-file fits: local {la:.3f} s + {lb:.4f} s/MB; worker {wa:.3f} s + {wb:.4f} s/MB; "
        f"registration {ra:.3f} s + {rb:.4f} s/MB"
    )

    # ----------------------------------------------------------------- the README section
    lines = []
    w = lines.append
    w("## Scale")
    w("")
    w(
        f"`python bench/bench_scale.py --sizes {a.sizes} --events-per-rank {a.events_per_rank} "
        f"--compare {a.compare} --big-ranks {a.big_ranks} --big-events {a.big_events}`: one run, "
        f"{total_s / 60:.1f} min on this {os.cpu_count()}-core box, load average {load0[0]:.1f} at the "
        f"start and {load1[0]:.1f} at the end (this box is shared: with other work running, absolute "
        "times come out up to 2-3x longer; read the ratios). Synthetic Kineto from bench/gen_kineto.py (token_skew on "
        "rank 1, gzip level 1, the same events per rank at every size); every ingest and every query "
        "in a fresh process, peak RSS from `getrusage` in that process. MB = uncompressed JSON "
        "(10^6 bytes); s/file = the in-process seconds per file (without process start and imports)."
    )
    if a.note:
        w("")
        w(a.note)
    w("")
    w(
        "| ranks | MB (gz) | events | ingest jobs=1 | s/file | events/s | ingest RSS | ep-slow-rank | "
        "query RSS | query / ingest | verdict | DB MB |"
    )
    w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows + [
        dict(
            ranks=f"{a.big_ranks} big",
            mb=big_mb,
            gz_mb=bg["bytes"] / 1e6,
            ing=bg,
            q=bq,
            db_mb=(OUT / "big.duckdb").stat().st_size / 1e6,
        )
    ]:
        ing, q = r["ing"], r["q"]
        w(
            f"| {r['ranks']} | {r['mb']:.0f} ({r['gz_mb']:.0f}) | {ing['events']:,} | {ing['wall_s']:.1f} s | "
            f"{ing['files_s'] / ing['files']:.3f} | {ing['events'] / ing['wall_s']:,.0f} | {ing['rss_mb']:.0f} MB | "
            f"{q['wall_s']:.2f} s | {q['rss_mb']:.0f} MB | {q['wall_s'] / ing['wall_s']:.2f} | "
            f"{q['status']} rank {q['ranks'][0] if q['ranks'] else '-'} | {r['db_mb']:.0f} |"
        )
    w("")
    first, last = rows[0], rows[-1]
    w(
        f"Linearity: from {first['ranks']} to {last['ranks']} ranks the events grow "
        f"{last['ing']['events'] / first['ing']['events']:.0f}x, the ingest time "
        f"{last['ing']['wall_s'] / first['ing']['wall_s']:.1f}x and the query time "
        f"{last['q']['wall_s'] / first['q']['wall_s']:.1f}x: events/s rises from "
        f"{first['ing']['events'] / first['ing']['wall_s']:,.0f} to {last['ing']['events'] / last['ing']['wall_s']:,.0f} "
        "as the fixed costs (process start, schema check, first-file imports) are spread over more files; "
        "no size is slower per event than a smaller one. ep-slow-rank costs "
        + ", ".join(f"{x:.1f}" for x in qa)
        + " µs per stored event (query / ingest "
        f"{min(r['q']['wall_s'] / r['ing']['wall_s'] for r in rows):.2f}-"
        f"{max(r['q']['wall_s'] / r['ing']['wall_s'] for r in rows):.2f}; at the smallest sizes the query's "
        "own fixed cost dominates)."
    )
    w("")
    w(
        f"Per-file fit over the jobs=1 runs (seconds per file = a + b x MB, least squares on the run "
        f"means): a = {la:.3f} s, b = {lb:.4f} s/MB ({(1 / lb) if lb > 0 else float('inf'):.0f} MB/s "
        "once a file is open)."
    )
    w("")
    w(f"The {a.compare}-rank files ({mb_of[a.compare]:.0f} MB, {base['ing']['files']} files), three ways:")
    w("")
    w("| path | wall | / jobs=1 | / jobs=2 | peak RSS | where the time goes |")
    w("|---|---:|---:|---:|---:|---|")
    w(f"| local, jobs=1 | {j1:.1f} s | 1.00 | {j1 / j2['wall_s']:.2f} | {base['ing']['rss_mb']:.0f} MB | |")
    w(
        f"| local, jobs=2 | {j2['wall_s']:.1f} s | {j2['wall_s'] / j1:.2f} | 1.00 | {j2['rss_mb']:.0f} MB | "
        f"**speed-up {j1 / j2['wall_s']:.2f}x** |"
    )
    w(
        f"| Dask, LocalCluster {a.workers} workers | {dk['wall_s']:.1f} s | {dk['wall_s'] / j1:.2f} | "
        f"**{dk['wall_s'] / j2['wall_s']:.2f}** | {dk['rss_mb']:.0f} MB coordinator, {dk['children_rss_mb']:.0f} MB "
        f"largest worker | cluster start {dk['startup_s']:.1f} s + worker warm-up {dk['warmup_s']:.1f} s + "
        f"ingest {dk['ingest_s']:.1f} s (worker-side {dk['worker_s']:.1f} s summed over files, coordinator "
        f"registration {dk['register_s']:.1f} s) |"
    )
    w("")
    w(
        f"Same events and the same ep-slow-rank verdict in the three databases: {'yes' if same else 'NO'}. "
        f"Big files ({a.big_ranks} x {big_file_mb:.0f} MB): jobs=1 {bg['wall_s']:.1f} s, Dask {bdk['wall_s']:.1f} s "
        f"(start + warm-up {bdk['startup_s'] + bdk['warmup_s']:.1f} s, ingest {bdk['ingest_s']:.1f} s). "
        f"The Dask overhead on this box: two worker processes and the coordinator share 2 cores (the "
        "coordinator's registration is a second write of every row), each file pays a temporary database, "
        "its commit and a Parquet export on the worker, and the cluster start is fixed; it buys nothing on "
        "one machine and is meant for files spread over many."
    )
    w("")
    gb = 1000.0
    per_w = wa + wb * gb
    per_r = ra + rb * gb
    start_s = dk["startup_s"] + dk["warmup_s"]
    w("### Projection: 1,024 ranks x 1 GB")
    w("")
    w(
        f"The two halves of the Dask path timed apart, serially in one process (one core, no contention; "
        f"{sp['files']} of the {a.compare}-rank files and the {a.big_ranks} big files): worker side "
        f"(temporary DuckDB, ingest_file, Parquet) = {wa:.3f} s + {wb:.4f} s/MB per file, coordinator "
        f"registration (INSERT from Parquet, commit, derived op_class_rows) = {ra:.3f} s + {rb:.4f} s/MB per "
        f"file. A 1 GB rank: {fmt_s(per_w)} on one worker core, {fmt_s(per_r)} to register. With N workers "
        f"(one core each, as fast as this box's) the wall time is about max(ceil(1024 / N) x {fmt_s(per_w)}, "
        f"1024 x {fmt_s(per_r)}) + {start_s:.0f} s start-up, assuming a shared file system that keeps up:"
    )
    w("")
    w("| workers | wall time | bound by |")
    w("|---:|---:|---|")
    for nw in (1, 2, 8, 32, 128, 1024):
        tw = math.ceil(1024 / nw) * per_w
        tr = 1024 * per_r
        w(f"| {nw} | {fmt_s(max(tw, tr) + start_s)} | {'workers' if tw >= tr else 'coordinator registration'} |")
    w("")
    knee = per_w / per_r if per_r > 0 else float("inf")
    w(
        f"Past about {knee:.0f} workers the serial registration on the coordinator is the bound: it copies "
        "every row once more into the one database file. Going further needs registration without a copy "
        "(tables over the staged Parquet instead of INSERT) or several databases; not done here. The "
        f"database itself would be about {last['db_mb'] / last['mb'] * 1024 * gb / 1e3:,.0f} GB "
        f"({last['db_mb'] / last['mb']:.2f} DB MB per input MB at {last['ranks']} ranks). Local path on this "
        f"box (jobs=1 fit {la:.3f} s + {lb:.4f} s/MB): {fmt_s(1024 * (la + lb * gb))}; ep-slow-rank on such a "
        f"database, extrapolated linearly from the largest run ({qa[-1]:.1f} µs per event, "
        f"{last['ing']['events'] / last['mb']:,.0f} events per MB): "
        f"{fmt_s(qa[-1] * 1e-6 * 1024 * gb * last['ing']['events'] / last['mb'])} (far outside the measured "
        "range: an estimate, not a measurement)."
        + (f" Fit coefficients clamped to 0 (negative from noise): {', '.join(clamped)}." if clamped else "")
    )
    w("")
    section = "\n".join(lines) + "\n"
    say("")
    say(section)

    if not a.no_readme:
        write_section(a.readme, section)
        say(f"wrote the Scale section of {a.readme}")
    if not a.keep:
        shutil.rmtree(OUT, ignore_errors=True)
    return 0


def write_section(readme: Path, section: str) -> None:
    """Replace the '## Scale' section (up to the next '## ' heading) or append it."""
    text = readme.read_text(encoding="utf-8") if readme.exists() else "# Benchmarks\n\n"
    m = re.search(r"^## Scale\n.*?(?=^## |\Z)", text, flags=re.S | re.M)
    if m:
        text = text[: m.start()] + section + ("\n" if text[m.end() :] else "") + text[m.end() :]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    readme.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
