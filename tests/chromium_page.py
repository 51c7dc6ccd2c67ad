"""Open a report page in headless Chromium and read back what it drew (the page's DOM after its
figures are drawn, and the console), for the report tests and bench/bench_report.py.

The report's loader sets ``data-figures-drawn`` (figures drawn) and ``data-drawn-ms`` (ms from
the start of loading to the last figure drawn) on ``<body>`` once every figure is drawn."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SKIP_REASON = "Chromium is not installed (Debian package `chromium`; .ci/run installs it)"
_DRAWN = re.compile(r'<body[^>]*\bdata-figures-drawn="(\d+)"[^>]*\bdata-drawn-ms="(\d+)"')


def _command(profile: Path, *flags: str) -> list[str]:
    """Headless Chromium with no network, sync, extensions or first-run work, logging the page's
    console to stderr; ``flags`` say what to do with the page."""
    assert CHROMIUM is not None, SKIP_REASON
    return [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        *flags,
    ]


def _console(stderr: str) -> str:
    return "\n".join(ln for ln in stderr.splitlines() if "CONSOLE" in ln)


def open_page(html: Path, profile: Path, budget_ms: int = 60_000) -> dict:
    """{dom, console, figures_drawn (None: the loader never finished), drawn_ms, wall_s}."""
    cmd = _command(
        profile, f"--virtual-time-budget={budget_ms}", "--window-size=1400,2000", "--dump-dom", html.resolve().as_uri()
    )
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t0
    m = _DRAWN.search(proc.stdout)
    return {
        "dom": proc.stdout,
        "console": _console(proc.stderr),
        "figures_drawn": int(m.group(1)) if m else None,
        "drawn_ms": int(m.group(2)) if m else None,
        "wall_s": wall,
    }


def screenshot(html: Path, png: Path, profile: Path, size: str = "1400,2000") -> str:
    """Render the page into ``png``; return the console lines Chromium logged for it."""
    cmd = _command(profile, f"--screenshot={png}", f"--window-size={size}", html.resolve().as_uri())
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert png.exists(), f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return _console(proc.stderr)
