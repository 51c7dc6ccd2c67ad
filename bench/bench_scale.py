#!/usr/bin/env python3
"""Scale measured, not assumed: ingest and query cost from 8 to 512 ranks, --jobs 2 and the Dask path.

    python bench/bench_scale.py [--sizes 8,32,128,512] [--events-per-rank 5000] [--compare 128]
                                [--big-ranks 4 --big-events 60000] [--split-files 32]
                                [--preregistered 1024] [--readme bench/README.md]

Everything below is measured in ONE run of this script, each ingest and each query in a fresh
Python process (wall seconds; peak RSS from resource.getrusage in that process):

1. Runs of N ranks (synthetic Kineto from bench/gen_kineto.py, token_skew on rank 1, gzip, the
   same events per rank for every N): ingest with --jobs 1, then ``ep-slow-rank``; events/s shows
   whether cost is linear in total events, query/ingest whether the query stays cheap.
2. The same files of the --compare run with ``ingest_paths(jobs=2)``: the speed-up over jobs=1.
3. The same files through ``slowcard.distributed.ingest_paths_dask`` on a real cluster on
   loopback: a ``dask scheduler`` process and --workers ``dask worker`` processes (one thread
   each), started here and stopped at the end; the cluster start and worker warm-up shown apart,
   the worker-side seconds and the coordinator's registration seconds (time in ``_register``,
   measured by wrapping it here), and ep-slow-rank over the lake against the copied database.
4. A few large ranks (--big-ranks x --big-events) through jobs=1 and Dask, so that the per-file
   fixed cost and the per-MB cost can be told apart.
5. The two halves of the Dask path timed apart in one process, one core, no contention
   (``ingest_one_file`` then ``_register``, on --split-files of the --compare files and on the big
   files; once more with --preregistered files already registered, since the view the
   coordinator rewrites lists every registered file), the end-of-run refresh of the stored
   views, and from them the projection to 1,024 ranks x 1 GB for N workers.

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


def start_cluster(workers: int, folder: Path) -> tuple[str, list]:
    """A real `dask scheduler` and ``workers`` `dask worker` processes (one thread each) on
    loopback, each its own process as on a cluster; returns (address, processes). Ports are the
    OS's choice (port 0), no dashboard; the workers import slowcard from this tree (PYTHONPATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    sched_file = folder / "scheduler.json"
    sched_file.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env, "cwd": folder}
    procs = [
        subprocess.Popen(
            [
                "dask",
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--dashboard-address",
                "127.0.0.1:0",
                "--scheduler-file",
                str(sched_file),
            ],
            **quiet,
        )
    ]
    deadline = time.monotonic() + 60
    while not sched_file.exists():
        if time.monotonic() > deadline or procs[0].poll() is not None:
            stop_cluster(procs)
            raise SystemExit("dask scheduler did not start")
        time.sleep(0.1)
    address = json.loads(sched_file.read_text())["address"]
    for i in range(workers):
        procs.append(
            subprocess.Popen(
                [
                    "dask",
                    "worker",
                    address,
                    "--host",
                    "127.0.0.1",
                    "--nthreads",
                    "1",
                    "--nworkers",
                    "1",
                    "--no-dashboard",
                    "--name",
                    f"bench-{i}",
                    "--local-directory",
                    str(folder / f"w{i}"),
                ],
                **quiet,
            )
        )
    return address, procs


def stop_cluster(procs: list) -> None:
    for p in reversed(procs):  # the workers first, then the scheduler
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def child_dask(a) -> dict:
    from dask.distributed import Client

    import slowcard.distributed as dist

    reg = {"s": 0.0, "n": 0, "each": []}
    orig = dist._register

    def timed(*args, **kw):
        t = time.perf_counter()
        try:
            return orig(*args, **kw)
        finally:
            dt = time.perf_counter() - t
            reg["s"] += dt
            reg["n"] += 1
            reg["each"].append(dt)

    dist._register = timed
    t0 = time.perf_counter()
    address, procs = start_cluster(a.workers, Path(a.db).parent / "cluster")
    try:
        client = Client(address, timeout="60s")
        client.wait_for_workers(a.workers, timeout=120)
        try:
            tw = time.perf_counter()
            # Per worker process, once: import the readers and warm DuckDB, so that the per-file
            # worker seconds below are steady-state (the warm-up is reported on its own).
            client.run(_warm_worker)
            t1 = time.perf_counter()
            rep = dist.ingest_paths_dask(a.db, [a.path], run="bench", scheduler=address)
            t2 = time.perf_counter()
        finally:
            client.close()
    finally:
        stop_cluster(procs)
    out = _report_dict(rep, time.perf_counter() - t0)
    out.update(
        startup_s=tw - t0,
        warmup_s=t1 - tw,
        ingest_s=t2 - t1,
        register_s=reg["s"],
        register_each=reg["each"],
        worker_s=sum(f.seconds for f in rep.files) - reg["s"],
    )
    return out


def _warm_worker() -> None:
    """Import the readers and apply the DDL once in this worker process (the per-ingest template
    that ingest_paths_dask then builds costs ~1 s per worker and stays inside the timing)."""
    import slowcard.distributed as dist
    from slowcard.ingest import readers

    readers()
    dist._template_db("warm-up", [])
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
    worker side (ingest_one_file: temp DB, derived rows, Parquet into the lake) then coordinator
    side (_register: the sources row and the lake files, one commit), per file; then the refresh
    of the stored cross-rank views, which reads the op-class Parquet once at the end. With
    --preregistered K, K lake_files rows (copies of the first file's entry) are registered before
    the timed registrations: the view the coordinator rewrites then names K more files."""
    import tempfile

    import slowcard.distributed as dist
    from slowcard import lake, store
    from slowcard.ingest import expand_paths
    from slowcard.ingest.base import IngestOptions

    files = [p for p, _ in expand_paths([a.path])][: a.limit]
    stage = tempfile.mkdtemp(dir=Path(a.db).parent)
    lake_dir = Path(f"{a.db}.lake").resolve()
    dist._template_db(stage, [])  # built once per worker process in the real path
    con = store.open_db(a.db)
    store.ensure_run(con, "bench", str(a.path))
    sids = [store.new_source_id(con) for _ in files]
    outs, worker_s, worker_cpu = [], [], []
    for p, sid in zip(files, sids):
        t, c = time.perf_counter(), time.process_time()
        out = dist.ingest_one_file(
            str(p), "bench", False, p.stat().st_size, IngestOptions(threads=1), None, None, stage, sid, str(lake_dir)
        )
        outs.append((p, sid, out))
        worker_s.append(time.perf_counter() - t)
        worker_cpu.append(time.process_time() - c)
    dist._drop_templates(stage)
    cols = {
        t: dist._table_columns(con, t)
        for t in store.row_tables(con)
        if t not in dist.NOT_STAGED and t not in lake.LAKE_TABLES
    }
    if a.preregistered:
        # K entries naming one real file, under ids no source has: never read by a view's join,
        # but every rewrite of the view lists them (the cost that grows with files registered)
        first = outs[0][2]["lake"][0]
        con.execute(
            "INSERT INTO lake_files SELECT -1 - range, ?, ?, 0 FROM range(?)", [first[0], first[1], a.preregistered]
        )
    reg_s, reg_cpu = [], []
    for p, sid, out in outs:
        t, c = time.perf_counter(), time.process_time()
        res = dist._register(con, "bench", p.stat().st_size, out, cols, sid)
        reg_s.append(time.perf_counter() - t)
        reg_cpu.append(time.process_time() - c)
        assert res.status == "ok", res.message
        dist._unlink_staged(out, True)
    if a.preregistered:
        con.execute("DELETE FROM lake_files WHERE source_id < 0")
        lake.rebuild_views(con)
    t, c = time.perf_counter(), time.process_time()
    store.refresh_materialized(con)
    refresh_s = time.perf_counter() - t
    refresh_cpu = time.process_time() - c
    op_rows = con.execute("SELECT count(*) FROM op_class_rows_all").fetchone()[0]
    con.close()
    shutil.rmtree(stage, ignore_errors=True)
    return {
        "files": len(files),
        "mb": sum(p.stat().st_size for p in files) / 1e6,
        "worker_s": sum(worker_s),
        "register_s": sum(reg_s),
        "register_each": reg_s,
        "worker_first_s": worker_s[0],
        "worker_cpu": sum(worker_cpu),
        "register_cpu": sum(reg_cpu),
        "refresh_s": refresh_s,
        "refresh_cpu": refresh_cpu,
        "op_class_rows": op_rows,
    }


# The queries timed over the lake and over the copied database: the cross-rank verdicts (they read
# the stored per-rank / per-collective tables) and two that read raw events (why-op-diff: every
# rank's operators in the compared units; why-straggler: what ran in each segment).
LAKE_QUERIES = ("ep-slow-rank", "straggler-rank", "moe-breakdown", "sync-gaps", "why-op-diff", "why-straggler")


def child_query(a) -> dict:
    from slowcard import queries

    names = [q for q in (a.queries or "ep-slow-rank").split(",") if q]
    con = queries.open_readonly(a.db)
    try:
        catalog = queries.load_catalog()
        each = {}
        for name in names:
            t0 = time.perf_counter()
            res = queries.run_query(con, catalog[name], "bench")
            each[name] = {
                "wall_s": time.perf_counter() - t0,
                "status": res.status,
                "summary": res.summary,
                "rows": [sorted((k, str(v)) for k, v in r.items()) for r in res.rows],
            }
        n_ev = con.execute("SELECT count(*) FROM events WHERE run = 'bench'").fetchone()[0]
    finally:
        con.close()
    self_mb, _ = _rss_mb()
    first = each[names[0]]
    return {
        "wall_s": first["wall_s"],
        "status": first["status"],
        "ranks": [dict(r).get("rank") for r in first["rows"]],
        "summary": first["summary"],
        "each": each,
        "events": n_ev,
        "rss_mb": self_mb,
    }


def child_refresh(a) -> dict:
    """The end-of-ingest refresh of the stored cross-rank views, again, on a database built by an
    ingest (copied) or by the Dask path's halves (lake): its stamps cleared, every run refilled.

    With --times K (K > 1), on a copy of a copied database: every rank's op-class and
    all-to-all split rows are repeated K times, each copy shifted past the last by the run's span
    (step numbers and NCCL Seq moved on with it), so the run is K times longer with the same
    ranks: the refresh's cost per op-class row measured at K x the rows, where the per-rank fixed
    costs do not grow (the ranks are the same)."""
    from slowcard import store

    db = a.db
    if a.times > 1:
        db = str(Path(a.db).with_name(f"{Path(a.db).stem}.x{a.times}.duckdb"))
        shutil.copy(a.db, db)
    con = store.open_db(db)
    try:
        if a.times > 1:
            span = con.execute("SELECT max(end_ns) - min(ts_ns) + 1000000000 FROM op_class_rows").fetchone()[0]
            con.execute("BEGIN")
            con.execute(
                r"""INSERT INTO op_class_rows
                    SELECT * EXCLUDE (k) REPLACE (
                        CASE WHEN op_class = 'step'
                             THEN regexp_replace(name, '\d+\s*\z',
                                                 (TRY_CAST(regexp_extract(name, '(\d+)\s*\z', 1) AS BIGINT) + k * 100000)::VARCHAR)
                             ELSE name END AS name,
                        ts_ns + k * ?::BIGINT AS ts_ns, end_ns + k * ?::BIGINT AS end_ns,
                        launch_ns + k * ?::BIGINT AS launch_ns, seq + k * 1000000 AS seq)
                    FROM op_class_rows, range(1, ?) t(k)""",
                [span, span, span, a.times],
            )
            con.execute(
                "INSERT INTO a2a_split_rows SELECT source_id, ts_ns + k * ?::BIGINT, recv_tokens "
                "FROM a2a_split_rows, range(1, ?) t(k)",
                [span, a.times],
            )
            con.execute("COMMIT")
        con.execute("DELETE FROM _mat_stamps")
        t, c = time.perf_counter(), time.process_time()
        store.refresh_materialized(con)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        rows = con.execute("SELECT count(*) FROM op_class_rows_all").fetchone()[0]  # table + lake
        ranks = con.execute("SELECT count(DISTINCT rank) FROM sources").fetchone()[0]
        layers = con.execute("SELECT count(*) FROM moe_layer_facts").fetchone()[0]
    finally:
        con.close()
    if a.times > 1:
        for p in Path(db).parent.glob(Path(db).name + "*"):
            p.unlink()
    return {"refresh_s": wall, "refresh_cpu": cpu, "op_class_rows": rows, "ranks": ranks, "layer_rows": layers}


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


def plane_fit(pts: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """Least squares y = a + b * x1 + c * x2 (the normal equations, by Cramer's rule)."""
    n = len(pts)
    s1, s2 = sum(p[0] for p in pts), sum(p[1] for p in pts)
    s11, s22, s12 = sum(p[0] ** 2 for p in pts), sum(p[1] ** 2 for p in pts), sum(p[0] * p[1] for p in pts)
    sy, s1y, s2y = sum(p[2] for p in pts), sum(p[0] * p[2] for p in pts), sum(p[1] * p[2] for p in pts)
    m = [[n, s1, s2], [s1, s11, s12], [s2, s12, s22]]

    def det(x):
        return (
            x[0][0] * (x[1][1] * x[2][2] - x[1][2] * x[2][1])
            - x[0][1] * (x[1][0] * x[2][2] - x[1][2] * x[2][0])
            + x[0][2] * (x[1][0] * x[2][1] - x[1][1] * x[2][0])
        )

    d = det(m)
    if d == 0:
        return sy / n, 0.0, 0.0
    rhs = [sy, s1y, s2y]
    out = []
    for col in range(3):
        mc = [row[:] for row in m]
        for r in range(3):
            mc[r][col] = rhs[r]
        out.append(det(mc) / d)
    return out[0], out[1], out[2]


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
    ap.add_argument(
        "--preregistered",
        type=int,
        default=1024,
        help="files already registered when the coordinator's registration is timed again",
    )
    ap.add_argument(
        "--lake-sizes", default="128,512", help="rank counts (of --sizes) whose queries are timed over the lake too"
    )
    ap.add_argument(
        "--replicate",
        default="8,32,128",
        help="the --compare run's rows repeated this many times (comma-separated) to time the refresh at more rows",
    )
    ap.add_argument("--readme", type=Path, default=HERE / "README.md")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep bench/out/scale")
    ap.add_argument("--note", default="", help="a line written under the table (e.g. machine load)")
    # child mode
    ap.add_argument("--child", choices=["ingest", "dask", "query", "split", "refresh"])
    ap.add_argument("--queries", default="")
    ap.add_argument("--times", type=int, default=1)
    ap.add_argument("--limit", type=int, default=10**9)
    ap.add_argument("--db")
    ap.add_argument("--path")
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args(argv)

    if a.child:
        out = {
            "ingest": child_ingest,
            "dask": child_dask,
            "query": child_query,
            "split": child_split,
            "refresh": child_refresh,
        }[a.child](a)
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
        q = run_child("query", db=db, queries=",".join(LAKE_QUERIES))
        db_mb = db.stat().st_size / 1e6
        rf = run_child("refresh", db=db)
        rows.append(dict(ranks=n, mb=mb, gz_mb=ing["bytes"] / 1e6, ing=ing, q=q, db_mb=db_mb, rf=rf))
        say(
            f"  {n:4d} ranks: {ing['events']:>9,} events, ingest {ing['wall_s']:.1f} s "
            f"({ing['events'] / ing['wall_s']:,.0f} ev/s, {ing['files_s'] / ing['files']:.3f} s/file, "
            f"{ing['rss_mb']:.0f} MB RSS), ep-slow-rank {q['wall_s']:.2f} s ({q['status']} ranks "
            f"{q['ranks'][:3]}, {q['rss_mb']:.0f} MB RSS), db {db_mb:.0f} MB"
        )
        if ing["not_ok"]:
            say("    not ok:", ing["not_ok"][:3])

    # jobs=2 and Dask (a real `dask scheduler` + `dask worker` processes) on the same files as the
    # jobs=1 run of --compare
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
        f"-> overhead {dk['wall_s'] / j2['wall_s']:.2f}x; ep-slow-rank {qd['wall_s']:.2f} s over the lake "
        f"vs {base['q']['wall_s']:.2f} s copied"
    )
    same = (
        q2["summary"] == base["q"]["summary"] == qd["summary"] and j2["events"] == dk["events"] == base["ing"]["events"]
    )
    say(f"  same events and ep-slow-rank verdict in jobs=1 / jobs=2 / dask databases: {same}")
    sp = run_child("split", db=fresh_db(OUT / "split.duckdb"), path=d, limit=a.split_files, preregistered=0)
    spk = run_child(
        "split", db=fresh_db(OUT / "splitk.duckdb"), path=d, limit=a.split_files, preregistered=a.preregistered
    )
    say(
        f"  split {sp['files']} files: worker {sp['worker_s']:.1f} s, registration {sp['register_s']:.2f} s "
        f"({spk['register_s']:.2f} s with {a.preregistered} files already registered), refresh {sp['refresh_s']:.2f} s"
    )

    # Queries over the lake (the Dask path's database: the event tables are views over the workers'
    # Parquet) against the copied database of the same files, at --lake-sizes: the lake built by
    # the two halves of the Dask path in one process (no cluster: the database is the same).
    lakes = []
    for n in [n for n in (int(x) for x in a.lake_sizes.split(",") if x) if n in mb_of]:
        copied = next(r for r in rows if r["ranks"] == n)
        ldb = fresh_db(OUT / f"lake{n}.duckdb")
        built = run_child("split", db=ldb, path=OUT / f"r{n}", preregistered=0)
        lq = run_child("query", db=ldb, queries=",".join(LAKE_QUERIES))
        same_rows = all(lq["each"][k]["rows"] == copied["q"]["each"][k]["rows"] for k in LAKE_QUERIES)
        lakes.append(dict(ranks=n, built=built, q=lq, copied=copied, same=same_rows))
        say(
            f"  lake {n} ranks: "
            + ", ".join(
                f"{k} {lq['each'][k]['wall_s']:.2f} s (copied {copied['q']['each'][k]['wall_s']:.2f} s)"
                for k in LAKE_QUERIES
            )
            + f"; same rows: {same_rows}; refresh {built['refresh_cpu']:.2f} s CPU ({built['op_class_rows']:,} rows)"
        )

    # The refresh at many more op-class rows per rank than the generated runs have (a 1 GB rank has
    # ~90,000): the --compare run's rows repeated K times (child_refresh --replicate).
    replicated = []
    for k in [int(x) for x in a.replicate.split(",") if x]:
        rp = run_child("refresh", db=OUT / f"r{a.compare}.duckdb", times=k)
        replicated.append(dict(k=k, **rp))
        say(
            f"  refresh of the {a.compare}-rank run x{k}: {rp['refresh_cpu']:.2f} s CPU ({rp['refresh_s']:.2f} s wall), "
            f"{rp['op_class_rows']:,} op-class rows, {rp['layer_rows']:,} layer rows"
        )

    # a few large ranks: per-file cost apart from per-MB cost
    dbig = OUT / "big"
    t = time.perf_counter()
    big_mb = generate(dbig, a.big_ranks, a.big_events, a.units, a.layers)
    say(f"  generated {a.big_ranks} big ranks: {big_mb:.0f} MB in {time.perf_counter() - t:.0f} s")
    bg = run_child("ingest", db=fresh_db(OUT / "big.duckdb"), path=dbig, jobs=1)
    bq = run_child("query", db=OUT / "big.duckdb")
    bdk = run_child("dask", db=fresh_db(OUT / "bigdask.duckdb"), path=dbig, workers=a.workers)
    bsp = run_child("split", db=fresh_db(OUT / "bigsplit.duckdb"), path=dbig, preregistered=0)
    say(
        f"  big: jobs=1 {bg['wall_s']:.1f} s ({big_mb / bg['wall_s']:.1f} MB/s, {bg['rss_mb']:.0f} MB RSS), "
        f"dask {bdk['wall_s']:.1f} s; split worker {bsp['worker_s']:.1f} s, registration {bsp['register_s']:.2f} s, "
        f"refresh {bsp['refresh_s']:.2f} s"
    )

    # Per-file fits y = a + b * MB over run means (MB per file = run MB / files):
    # local jobs=1 from the in-process per-file seconds (no process start), and the two halves of
    # the Dask path from the uncontended split runs.
    small_mb = mb_of[a.compare] / a.compare
    big_file_mb = big_mb / a.big_ranks
    pts = [(r["mb"] / r["ranks"], r["ing"]["files_s"] / r["ing"]["files"]) for r in rows]
    pts.append((big_file_mb, bg["files_s"] / bg["files"]))
    la, lb = line_fit(pts)
    # CPU seconds of the one process (process_time: every thread of it): on this shared 2-core box
    # the wall seconds of a serial step carry the other load's waits, the CPU seconds do not
    wa, wb = line_fit([(small_mb, sp["worker_cpu"] / sp["files"]), (big_file_mb, bsp["worker_cpu"] / bsp["files"])])
    ra, rb = line_fit([(small_mb, sp["register_cpu"] / sp["files"]), (big_file_mb, bsp["register_cpu"] / bsp["files"])])
    # The end-of-run refresh of the stored cross-rank views: CPU seconds = a + b x ranks + c x
    # op-class rows, fitted over every refresh measured (the generated runs at 8-512 ranks, copied
    # and lake, whose rows grow with the ranks; the --compare run replicated, whose rows grow at
    # fixed ranks: the two directions the fit needs to tell the per-rank from the per-row cost).
    refresh_pts = (
        [(r["ranks"], r["rf"]["op_class_rows"], r["rf"]["refresh_cpu"]) for r in rows]
        + [(x["files"], x["op_class_rows"], x["refresh_cpu"]) for x in (sp, bsp)]
        + [(lk["ranks"], lk["built"]["op_class_rows"], lk["built"]["refresh_cpu"]) for lk in lakes]
        + [(a.compare, x["op_class_rows"], x["refresh_cpu"]) for x in replicated]
    )
    fa, f_rank, f_row = plane_fit(refresh_pts)
    rows_per_mb = sp["op_class_rows"] / (small_mb * sp["files"])
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
    reg_k = spk["register_cpu"] / spk["files"]  # per file, with --preregistered files already in the view
    qa = [r["q"]["wall_s"] / max(1, r["q"]["events"]) * 1e6 for r in rows]
    total_s = time.perf_counter() - t_start
    load1 = os.getloadavg()
    say(
        f"  per-file fits: local {la:.3f} s + {lb:.4f} s/MB; worker {wa:.3f} s + {wb:.4f} s/MB; "
        f"registration {ra:.3f} s + {rb:.5f} s/MB ({reg_k:.3f} s/file at {a.preregistered} registered); "
        f"refresh {fa:.2f} s + {f_rank * 1e3:.2f} ms per rank + {f_row * 1e6:.3f} µs per op-class row, "
        f"{rows_per_mb:,.0f} rows/MB"
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
        "query RSS (6 queries) | query / ingest | verdict | DB MB |"
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
    for r in rows:
        if r["q"]["status"] != "FAIL":
            w(f"At {r['ranks']} ranks ep-slow-rank says {r['q']['status']}: {r['q']['summary']}")
            w("")
    w(
        "Query RSS: the peak of the process that ran the six queries of the lake comparison below, "
        "one after the other (ep-slow-rank's time is its own)."
    )
    w("")
    first, last = rows[0], rows[-1]
    eps = [r["ing"]["events"] / r["ing"]["wall_s"] for r in rows]
    w(
        f"Linearity: from {first['ranks']} to {last['ranks']} ranks the events grow "
        f"{last['ing']['events'] / first['ing']['events']:.0f}x, the ingest time "
        f"{last['ing']['wall_s'] / first['ing']['wall_s']:.1f}x and the query time "
        f"{last['q']['wall_s'] / first['q']['wall_s']:.1f}x: events/s goes from "
        f"{first['ing']['events'] / first['ing']['wall_s']:,.0f} to {last['ing']['events'] / last['ing']['wall_s']:,.0f}, "
        f"the slowest size at {min(eps) / max(eps):.2f}x the fastest's rate (the fixed costs, process start, "
        "schema check and first-file imports, are spread over more files as the run grows)."
        " ep-slow-rank costs " + ", ".join(f"{x:.1f}" for x in qa) + " µs per stored event (query / ingest "
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
    w("| path | wall | / jobs=1 | / jobs=2 | peak RSS | ep-slow-rank after | where the time goes |")
    w("|---|---:|---:|---:|---:|---:|---|")
    w(
        f"| local, jobs=1 | {j1:.1f} s | 1.00 | {j1 / j2['wall_s']:.2f} | {base['ing']['rss_mb']:.0f} MB | "
        f"{base['q']['wall_s']:.2f} s | |"
    )
    w(
        f"| local, jobs=2 | {j2['wall_s']:.1f} s | {j2['wall_s'] / j1:.2f} | 1.00 | {j2['rss_mb']:.0f} MB | "
        f"{q2['wall_s']:.2f} s | **speed-up {j1 / j2['wall_s']:.2f}x** |"
    )
    w(
        f"| Dask, `dask scheduler` + {a.workers} `dask worker` processes | {dk['wall_s']:.1f} s | "
        f"{dk['wall_s'] / j1:.2f} | **{dk['wall_s'] / j2['wall_s']:.2f}** | {dk['rss_mb']:.0f} MB coordinator | "
        f"{qd['wall_s']:.2f} s (lake) | cluster start {dk['startup_s']:.1f} s + worker warm-up {dk['warmup_s']:.1f} s + "
        f"ingest {dk['ingest_s']:.1f} s (worker-side {dk['worker_s']:.1f} s summed over files, coordinator "
        f"registration {dk['register_s']:.2f} s = {dk['register_s'] / max(1, dk['files']):.3f} s/file) |"
    )
    w("")
    w(
        f"Same events and the same ep-slow-rank verdict in the three databases: {'yes' if same else 'NO'}. "
        f"Big files ({a.big_ranks} x {big_file_mb:.0f} MB): jobs=1 {bg['wall_s']:.1f} s, Dask {bdk['wall_s']:.1f} s "
        f"(start + warm-up {bdk['startup_s'] + bdk['warmup_s']:.1f} s, ingest {bdk['ingest_s']:.1f} s). "
        "On this box the Dask workers and the coordinator share 2 cores, each file pays a temporary "
        "database, its commit and a Parquet write on the worker, and the cluster start is fixed: it buys "
        "nothing on one machine and is meant for files spread over many. The ep-slow-rank query reads the "
        "stored cross-rank views in both databases (refreshed once at the end of the ingest, from the "
        "op-class Parquet in place on the Dask path)."
    )
    w("")
    w("### The coordinator's cost per file against file size")
    w("")
    w(
        "Timed apart, serially in one process, CPU seconds of that process (`time.process_time`, every "
        "thread; the wall seconds in brackets carry the waits for the other load of this shared box): "
        "the worker side "
        "(`ingest_one_file`: temporary DuckDB, the file's commit with its derived rows, Parquet into the "
        "lake) and the coordinator's registration (`_register`: the `sources` row, the small staged "
        "tables, the `lake_files` rows and the rewritten views, one commit)."
    )
    w("")
    w(
        "| files | MB per file | worker s/file, CPU (wall) | registration s/file, CPU (wall) | "
        "registration CPU s/MB | refresh at the end, CPU (wall) |"
    )
    w("|---|---:|---:|---:|---:|---:|")
    for label, x, mbf in (
        (f"{sp['files']} of the {a.compare}-rank run", sp, small_mb),
        (f"{a.big_ranks} big", bsp, big_file_mb),
    ):
        n = x["files"]
        w(
            f"| {label} | {mbf:.1f} | {x['worker_cpu'] / n:.3f} ({x['worker_s'] / n:.3f}) | "
            f"{x['register_cpu'] / n:.4f} ({x['register_s'] / n:.4f}) | {x['register_cpu'] / n / mbf:.5f} | "
            f"{x['refresh_cpu']:.2f} s ({x['refresh_s']:.2f} s) |"
        )
    w(
        f"| {spk['files']} of the {a.compare}-rank run, {a.preregistered} files already registered | "
        f"{small_mb:.1f} | | {reg_k:.4f} ({spk['register_s'] / spk['files']:.4f}) | | |"
    )
    w("")
    w(
        f"Fits of the CPU seconds (a + b x MB): worker {wa:.3f} s + {wb:.4f} s/MB; registration {ra:.4f} s + "
        f"{rb:.5f} s/MB: a {big_file_mb / small_mb:.0f}x larger file costs the coordinator "
        f"{(bsp['register_cpu'] / bsp['files']) / (sp['register_cpu'] / sp['files']):.2f}x as much to register "
        "(no row is copied: the cost is the commit and the view rewrite, which grows with the files "
        "registered, not with their size). The refresh of the stored cross-rank views at the end of these "
        f"two runs took {sp['refresh_cpu']:.2f} and {bsp['refresh_cpu']:.2f} s CPU, mostly its fixed cost; its "
        "cost per rank and per op-class row is fitted below over larger runs."
        + (f" Fit coefficients clamped to 0 (negative from noise): {', '.join(clamped)}." if clamped else "")
    )
    w("")
    gb = 1000.0
    per_w = wa + wb * gb
    # Registration copies no row: its per-MB slope between two file sizes is noise (the rows stay in
    # the lake), and extrapolating it 50x past the largest file would project noise. The projection
    # takes the largest per-file cost measured (any size, or with --preregistered files registered);
    # the fitted slope is shown as the pessimistic case.
    per_r = max(reg_k, sp["register_cpu"] / sp["files"], bsp["register_cpu"] / bsp["files"])
    per_r_fit = ra + rb * gb
    rows_tb = rows_per_mb * 1024 * gb
    refresh_tb = max(fa, 0.0) + max(f_rank, 0.0) * 1024 + max(f_row, 0.0) * rows_tb
    largest_rows = max(p[1] for p in refresh_pts)
    start_s = dk["startup_s"] + dk["warmup_s"]
    w("### Projection: 1,024 ranks x 1 GB")
    w("")
    w(
        f"From the costs above: a 1 GB rank takes {fmt_s(per_w)} on one worker core and {per_r:.3f} s to "
        f"register (the largest per-file registration measured, at {big_file_mb:.0f} MB or with "
        f"{a.preregistered} files registered: no row is copied, so the fitted per-MB slope, "
        f"{rb:.5f} s/MB, is taken as noise; the pessimistic case below takes it as real); the stored "
        "views are refreshed once at the end. Assumptions: each worker is one core "
        "as fast as this box's, busy only with its file (CPU seconds taken as wall seconds); the shared file system keeps up (reading 1 TB of traces, writing the "
        "Parquet); the coordinator registers serially on one core while the workers run; the refresh "
        "is projected apart. Ingest wall time = "
        f"{start_s:.0f} s start-up + max(ceil(1024 / N) x {fmt_s(per_w)}, 1024 x {per_r:.3f} s):"
    )
    w("")
    w("| workers | ingest wall time | workers' part | coordinator's part | bound by |")
    w("|---:|---:|---:|---:|---|")
    for nw in (1, 2, 8, 32, 128, 1024):
        tw = math.ceil(1024 / nw) * per_w
        tr = 1024 * per_r
        w(
            f"| {nw} | {fmt_s(max(tw, tr) + start_s)} | {fmt_s(tw)} | {fmt_s(tr)} | "
            f"{'workers' if tw >= tr else 'coordinator registration'} |"
        )
    w("")
    w(
        "Then the refresh of the stored cross-rank views, once, on the coordinator (the ingest's last step; "
        "no query runs before it), projected from a fit of its CPU seconds over the "
        f"{len(refresh_pts)} refreshes measured in this run (below): {fa:.2f} s + {f_rank * 1e3:.2f} ms per "
        f"rank + {f_row * 1e6:.2f} µs per op-class row. A 1,024 x 1 GB run has {rows_per_mb:,.0f} op-class "
        f"rows per MB x 1,024 GB = {rows_tb / 1e6:,.0f} M rows -> {fmt_s(refresh_tb)} on one core "
        f"({rows_tb / max(1, largest_rows):,.0f}x the largest run measured, {largest_rows:,} rows: a linear "
        "extrapolation; DuckDB spreads the refresh over the coordinator's cores where it has them). "
        f"With 128 workers the whole job is then {fmt_s(math.ceil(1024 / 128) * per_w + start_s + refresh_tb)} "
        "(ingest, then the refresh; target: under 20 min)."
    )
    w("")
    w("| refresh measured on | ranks | op-class rows | CPU s | wall s |")
    w("|---|---:|---:|---:|---:|")
    for r in rows:
        w(
            f"| copied, {r['ranks']} ranks | {r['ranks']} | {r['rf']['op_class_rows']:,} | {r['rf']['refresh_cpu']:.2f} | {r['rf']['refresh_s']:.2f} |"
        )
    for lk in lakes:
        b = lk["built"]
        w(
            f"| lake, {lk['ranks']} ranks | {lk['ranks']} | {b['op_class_rows']:,} | {b['refresh_cpu']:.2f} | {b['refresh_s']:.2f} |"
        )
    for label, x in (
        (f"lake, {sp['files']} of the {a.compare}-rank files", sp),
        (f"lake, {a.big_ranks} big files", bsp),
    ):
        w(f"| {label} | {x['files']} | {x['op_class_rows']:,} | {x['refresh_cpu']:.2f} | {x['refresh_s']:.2f} |")
    for x in replicated:
        w(
            f"| copied, the {a.compare}-rank run's rows x{x['k']} | {a.compare} | {x['op_class_rows']:,} | "
            f"{x['refresh_cpu']:.2f} | {x['refresh_s']:.2f} |"
        )
    w("")
    if lakes:
        w("### Queries over the lake against the copied database")
        w("")
        w(
            "The same files ingested locally (copied: every row in the database) and by the two halves of the "
            "Dask path (lake: the event tables are views over the workers' Parquet, the stored cross-rank "
            "views and the small per-rank tables in the database), each query in a fresh process, wall "
            "seconds (lake / copied):"
        )
        w("")
        w("| ranks | " + " | ".join(LAKE_QUERIES) + " | same rows |")
        w("|---:|" + "---:|" * len(LAKE_QUERIES) + "---|")
        for lk in lakes:
            cells = []
            for k in LAKE_QUERIES:
                lw, cw = lk["q"]["each"][k]["wall_s"], lk["copied"]["q"]["each"][k]["wall_s"]
                cells.append(f"{lw:.2f} / {cw:.2f} s ({lw / cw:.2f}x)")
            w(f"| {lk['ranks']} | " + " | ".join(cells) + f" | {'yes' if lk['same'] else 'NO'} |")
        w("")
    knee = per_w / per_r if per_r > 0 else float("inf")
    # the per-file fit can lose its slope to the small files' fixed costs: never below the big files' rate
    local_gb = max(la + lb * gb, bg["files_s"] / bg["files"] / big_file_mb * gb)
    knee_fit = per_w / per_r_fit if per_r_fit > 0 else float("inf")
    w(
        f"The coordinator becomes the bound only past about {knee:,.0f} workers (pessimistic case, the "
        f"fitted slope taken as real: {per_r_fit:.3f} s per 1 GB file, {fmt_s(1024 * per_r_fit)} for 1,024, the "
        f"bound past about {knee_fit:,.0f} workers). Local path on this box "
        f"(jobs=1, {local_gb:.1f} s per GB: the larger of the fit and the big files' own rate): "
        f"{fmt_s(1024 * local_gb)}; ep-slow-rank on such a run, "
        f"extrapolated linearly from the largest copied run ({qa[-1]:.1f} µs per event, "
        f"{last['ing']['events'] / last['mb']:,.0f} events per MB): "
        f"{fmt_s(qa[-1] * 1e-6 * 1024 * gb * last['ing']['events'] / last['mb'])} (far outside the measured "
        "range: an estimate, not a measurement)."
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
