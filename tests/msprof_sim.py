"""A fake msServiceProfiler for the capture tests: a thread that polls the JSON config the way
the service does (``SERVICE_PROF_CONFIG_PATH``: ``"enable"`` 0 -> 1 starts a collection, 1 -> 0
ends it) and, at the end of each collection, writes into ``prof_dir/<start time>/`` what the
collection saw, already in the parsed form slowcard ingests (``batch.csv`` with the dp_rank
column, ``request.csv``: the files ``msserviceprofiler parse`` produces), from the scripted
writer of tests/dp_script.py: DP domain ``hot_dp`` gets 3 requests per 5 s window against 2 on
the others, and its requests wait 130 ms in the queue against 30 ms (dp-imbalance: that domain,
cause request-skew, FAIL).

``write="never"`` writes nothing; ``write="half"`` leaves request.csv's last line cut.
A fake ``msserviceprofiler`` executable (``write_parse_exe``) stands for the parse step.
"""

from __future__ import annotations

import json
import stat
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dp_script as ds  # noqa: E402

N_DP = 4
WINDOWS = 20


def write_collection(out: Path, hot_dp: int) -> Path:
    counts = {(w, d): (3 if d == hot_dp else 2) for w in range(WINDOWS) for d in range(N_DP)}
    reqs = ds.counts_run(counts, lambda w, d, i: {"wait_ms": 130.0 if d == hot_dp else 30.0})
    return ds.write_run(out, reqs, n_dp=N_DP)


class FakeServiceProfiler(threading.Thread):
    """Polls ``config`` every ``poll_s``; stops with ``close()``."""

    def __init__(self, config: Path, hot_dp: int = 2, poll_s: float = 0.05, write: str = "ok"):
        super().__init__(daemon=True)
        self.config = Path(config)
        self.hot_dp = hot_dp
        self.poll_s = poll_s
        self.write = write
        self.collections: list[Path] = []
        self._halt = threading.Event()

    def prof_dir(self) -> Path:
        doc = json.loads(self.config.read_text())
        base = Path(doc.get("prof_dir") or Path.home() / ".ms_server_profiler")
        return base if base.is_absolute() else self.config.parent / base

    def run(self) -> None:
        enabled = False
        started = 0.0
        while not self._halt.wait(self.poll_s):
            try:
                on = json.loads(self.config.read_text()).get("enable") == 1
            except (OSError, ValueError):
                continue  # the service ignores a config it cannot read this time
            if on and not enabled:
                enabled, started = True, time.time()
            elif enabled and not on:
                enabled = False
                if self.write == "never":
                    continue
                out = self.prof_dir() / time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
                write_collection(out, self.hot_dp)
                if self.write == "half":
                    req = out / "request.csv"
                    req.write_bytes(req.read_bytes()[:-9])
                self.collections.append(out)

    def close(self) -> None:
        self._halt.set()
        self.join(5)


def write_parse_exe(folder: Path) -> Path:
    """A stand-in ``msserviceprofiler`` whose ``parse --input-path=IN --output-path=OUT`` copies
    the CSVs of IN into OUT and logs its arguments to OUT/../parse_args.txt."""
    exe = Path(folder) / "msserviceprofiler"
    exe.write_text(
        f"#!{sys.executable}\n"
        "import shutil, sys\n"
        "from pathlib import Path\n"
        "args = dict(a.split('=', 1) for a in sys.argv[2:])\n"
        "src, dst = Path(args['--input-path']), Path(args['--output-path'])\n"
        "assert sys.argv[1] == 'parse'\n"
        "dst.mkdir(parents=True, exist_ok=True)\n"
        "for p in src.glob('*.csv'):\n"
        "    shutil.copy(p, dst / p.name)\n"
        "(src / 'parse_args.txt').write_text(' '.join(sys.argv[1:]))\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


def write_config(path: Path, prof_dir: str | None = "prof", enable: int = 0) -> Path:
    doc = {"enable": enable, "acl_task_time": 0, "acl_prof_task_time_level": ""}
    if prof_dir is not None:
        doc["prof_dir"] = prof_dir
    path.write_text(json.dumps(doc, indent=4))
    return path


__all__ = ["FakeServiceProfiler", "write_collection", "write_parse_exe", "write_config"]
