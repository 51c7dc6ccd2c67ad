"""Scale (run with `-m slow`): streams stay streams. Peak memory of an ingest must not grow with
the file: a trace 10x larger may cost at most a bounded constant more, not 10x. Each ingest runs
in a fresh process so its peak RSS is its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEASURE = """
import json, resource, sys
from slowcard.ingest import ingest_paths
rep = ingest_paths(sys.argv[1], [sys.argv[2]], run="scale")
f = rep.files[0]
print(json.dumps({"status": f.status, "kept": f.rows_kept,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _generate(path: Path, mb: int, gz: bool) -> Path:
    args = [sys.executable, str(ROOT / "bench" / "gen_kineto.py"), "--out", str(path), "--mb", str(mb)]
    subprocess.run(args + (["--gz"] if gz else []), check=True, capture_output=True, timeout=600)
    return path.with_name(path.name + ".gz") if gz and not path.name.endswith(".gz") else path


def _ingest(tmp_path: Path, trace: Path) -> dict:
    db = tmp_path / f"{trace.name}.duckdb"
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(db), str(trace)], capture_output=True, text=True, timeout=900, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("gz", [False, True])
def test_peak_memory_does_not_grow_with_file_size(tmp_path, gz):
    small = _ingest(tmp_path, _generate(tmp_path / "small.pt.trace.json", 40, gz))
    large = _ingest(tmp_path, _generate(tmp_path / "large.pt.trace.json", 400, gz))
    assert small["status"] == large["status"] == "ok"
    assert large["kept"] > 8 * small["kept"]
    # 10x the events; memory bounded by the parts in flight and DuckDB's own limit, not the file
    assert large["rss_mb"] < small["rss_mb"] + 400, (small, large)
    assert large["rss_mb"] < 1024, large
