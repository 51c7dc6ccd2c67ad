"""End to end, whole process, against the peers (issue 17): what a user waits for.

    python bench/bench_e2e.py [--repeat 3] [--peer-python PY] [--baseline DIR]
                              [--large FILE] [--multi DIR] [--small DIR]

Each measurement is a fresh process (Python start, imports, parsing, analysis, output), timed
from outside; peak RSS is that process's own (wait4). Cases:
  - small: the committed 4-rank example (testdata/ep4_token_skew);
  - multi: a real multi-rank EP run (default ../shared/realdata/kineto_cpu_ep_noise/mild25_r2_w6,
    6 CPU ranks, gloo; it has no ProfilerStep, which HTA's straggler analysis needs);
  - gpu2: two real GPU ranks of one NCCL job (../shared/realdata/kineto/sampled_rank-{0,1}.json.gz,
    ProfilerStep#551-552), the multi-rank case HTA can analyse;
  - ep8: 8 real torch.profiler ranks (CPU, gloo) of bench/torch_ep_trace.py's EP decode loop,
    made here before timing when torch imports (--ep8 DIR: another 8-rank run); steps marked by
    prof.step() (ProfilerStep#N, which HTA needs); CPU only, so HTA's straggler analysis finds no
    kernels (it fails: "argmax of an empty sequence");
  - large: a large real single trace (default ../shared/realdata/kineto/df_index_resolver.json.gz).
Tools:
  - slowcard diagnose PATH --db NEW (ingest + every query + the conclusion), and
    slowcard query ep-slow-rank on the database just written; with its schema cache warm (any
    earlier slowcard command on the machine built it) and with no cache (SLOWCARD_CACHE_DIR='':
    a machine's first command);
  - HTA (PyPI holistictraceanalysis, the `bench` extra; needs pandas 2.x): TraceAnalysis load of
    the folder + get_potential_stragglers (multi-rank) or get_temporal_breakdown (one trace);
  - TraceLens (AMD): its collective / perf report when `TraceLens` imports in --peer-python;
  - --baseline DIR: another slowcard checkout (e.g. `git archive <commit>`), same commands.
A peer that is not installed, or that fails on a case, is reported as such; the ratios are
peer time / slowcard time from the same run (medians of --repeat). The peers can live in their
own environment (--peer-python): installing pandas next to slowcard makes DuckDB import it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REALDATA = ROOT.parent / "shared" / "realdata"

HTA_SCRIPT = r"""
import sys, warnings
warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
folder, mode = sys.argv[1], sys.argv[2]
a = TraceAnalysis(trace_dir=folder)
if mode == "multi":
    print("stragglers:", a.get_potential_stragglers(visualize=False))
else:
    print(a.get_temporal_breakdown(visualize=False).to_string()[:2000])
"""

TRACELENS_SCRIPT = r"""
import sys, glob, os
from TraceLens import TreePerfAnalyzer  # AMD TraceLens
files = sorted(glob.glob(os.path.join(sys.argv[1], "*.json*")))
for f in files:
    perf = TreePerfAnalyzer.from_file(f)
    print(os.path.basename(f), len(perf.get_df_kernel_launchers()))
"""


def run(cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> tuple[float, float, int, str]:
    """(wall s, peak RSS MB, exit code, last stderr line) of one process."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    code = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, code, (lines[-1] if lines else "")


def median_of(repeat: int, make_cmd, cwd=None, before=None, ok_codes=(0, 1), env=None) -> dict:
    walls, rss, last = [], [], None
    for _ in range(repeat):
        if before:
            before()
        wall, mb, code, msg = run(make_cmd(), cwd, env)
        if code not in ok_codes:
            return {"error": f"exit {code}: {msg[:160]}"}
        walls.append(wall)
        rss.append(mb)
        last = msg
    return {"wall": statistics.median(walls), "rss": statistics.median(rss), "note": last}


def peer_available(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def folder_of(path: Path, tmp: Path) -> Path:
    """HTA and TraceLens read folders: a single file gets one of its own (a symlink)."""
    if path.is_dir():
        return path
    d = tmp / f"one_{path.stem}"
    d.mkdir(exist_ok=True)
    link = d / path.name
    if not link.exists():
        link.symlink_to(path.resolve())
    return d


def make_ep8(tmp: Path) -> Path | None:
    """8 real torch.profiler ranks of the EP decode loop (CPU, gloo on loopback; rank 5 gets half of
    every rank's tokens; ProfilerStep#N steps), or None when torch is not installed."""
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0:
        print("# ep8: torch not installed (pip install -e '.[bench]'), skipped")
        return None
    out = tmp / "ep8"
    cmd = [sys.executable, str(ROOT / "bench" / "torch_ep_trace.py"), str(out), "--world", "8"]
    cmd += ["--scenario", "token_skew", "--effect", "0.5", "--slow-rank", "5", "--seed", "3", "--profiler-steps"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"# ep8: torch_ep_trace.py failed ({(done.stderr.strip().splitlines() or ['?'])[-1]}), skipped")
        return None
    print(f"# ep8: {done.stdout.strip().splitlines()[-1]}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peer-python", default=sys.executable, help="Python with HTA / TraceLens installed")
    ap.add_argument("--baseline", type=Path, help="another slowcard checkout to time the same way")
    ap.add_argument("--small", type=Path, default=ROOT / "testdata" / "ep4_token_skew")
    ap.add_argument("--multi", type=Path, default=REALDATA / "kineto_cpu_ep_noise" / "mild25_r2_w6")
    ap.add_argument(
        "--gpu2", type=Path, nargs="+", default=sorted((REALDATA / "kineto").glob("sampled_rank-*.json.gz"))
    )
    ap.add_argument("--large", type=Path, default=REALDATA / "kineto" / "df_index_resolver.json.gz")
    ap.add_argument(
        "--ep8",
        type=Path,
        help="an 8-rank run; default: 8 real torch.profiler ranks made here (untimed) by "
        "bench/torch_ep_trace.py when torch imports, else the case is skipped",
    )
    args = ap.parse_args()

    has_hta = peer_available(args.peer_python, "hta.trace_analysis")
    has_tl = peer_available(args.peer_python, "TraceLens")
    load = os.getloadavg()
    print(f"# load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs; repeat {args.repeat}")
    if not has_hta:
        print(f"# HTA: not installed in {args.peer_python} (pip install holistictraceanalysis 'pandas<3')")
    if not has_tl:
        print(
            f"# TraceLens: not installed in {args.peer_python} (AMD's TraceLens is not on PyPI; the PyPI "
            "package named TraceLens is an unrelated project; install from github.com/AMD-AGI/TraceLens)"
        )

    rows: list[tuple[str, str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="bench_e2e_") as tmp_s:
        tmp = Path(tmp_s)
        # slowcard's cache of the empty schema database (store.schema_template), built once here,
        # untimed, as any earlier slowcard command on the machine would have; the "no cache" line
        # times the first command on a machine (the schema created in place: the same work)
        warm = {**os.environ, "SLOWCARD_CACHE_DIR": str(tmp / "cache")}
        cold = {**os.environ, "SLOWCARD_CACHE_DIR": ""}
        subprocess.run(
            [sys.executable, "-c", "from slowcard import store; store.schema_template()"],
            env=warm,
            cwd=ROOT,
            check=True,
        )
        cases = [("small", args.small, "multi"), ("multi", args.multi, "multi")]
        if args.gpu2:
            gpu2 = tmp / "gpu2"
            gpu2.mkdir()
            for f in args.gpu2:
                (gpu2 / f.name).symlink_to(f.resolve())
            cases.append(("gpu2", gpu2, "multi"))
        ep8 = args.ep8 or make_ep8(tmp)
        if ep8:
            cases.append(("ep8", ep8, "multi"))
        cases.append(("large", args.large, "single"))
        for case, path, mode in cases:
            if not path.exists():
                print(f"# {case}: {path} not found, skipped")
                continue
            # (label, tree, environment, time a query too): a query opens an existing database,
            # so the schema cache does not change it and the no-cache line times only diagnose
            checkouts = [("slowcard", ROOT, warm, True), ("slowcard (no cache)", ROOT, cold, False)]
            checkouts += [("slowcard baseline", args.baseline, None, True)] if args.baseline else []
            base = None
            for label, repo, env, with_query in checkouts:
                db = tmp / f"{case}_{label.replace(' ', '_').strip('()')}.duckdb"

                def fresh(db=db):
                    for f in (db, Path(str(db) + ".wal")):
                        f.unlink(missing_ok=True)

                d = median_of(
                    args.repeat,
                    lambda db=db, path=path: [sys.executable, "-m", "slowcard", "diagnose", str(path), "--db", str(db)],
                    cwd=repo,
                    before=fresh,
                    env=env,
                )
                rows.append((case, f"{label} diagnose", d))
                if with_query:
                    q = median_of(
                        args.repeat,
                        lambda db=db: [sys.executable, "-m", "slowcard", "query", "ep-slow-rank", "--db", str(db)],
                        cwd=repo,
                        env=env,
                    )
                    rows.append((case, f"{label} query ep-slow-rank", q))
                if base is None:
                    base = d
            if has_hta:
                folder = folder_of(path, tmp)
                rows.append(
                    (
                        case,
                        "HTA load + " + ("get_potential_stragglers" if mode == "multi" else "get_temporal_breakdown"),
                        median_of(
                            args.repeat,
                            lambda folder=folder, mode=mode: [args.peer_python, "-c", HTA_SCRIPT, str(folder), mode],
                            ok_codes=(0,),
                        ),
                    )
                )
            if has_tl:
                folder = folder_of(path, tmp)
                rows.append(
                    (
                        case,
                        "TraceLens TreePerfAnalyzer per rank",
                        median_of(
                            args.repeat,
                            lambda folder=folder: [args.peer_python, "-c", TRACELENS_SCRIPT, str(folder)],
                            ok_codes=(0,),
                        ),
                    )
                )
            for r in rows:
                if r[0] == case:
                    r[2]["ref"] = base

    print()
    print("| case | tool | wall s (median) | peak RSS MB | time vs slowcard diagnose |")
    print("|---|---|---:|---:|---:|")
    for case, tool, m in rows:
        if "error" in m:
            print(f"| {case} | {tool} | failed: {m['error']} | | |")
            continue
        ref = m.get("ref")
        ratio = f"{m['wall'] / ref['wall']:.2f}x" if ref and "wall" in ref else "-"
        print(f"| {case} | {tool} | {m['wall']:.2f} | {m['rss']:.0f} | {ratio} |")
    shutil.rmtree(tmp_s, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
