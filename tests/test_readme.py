"""The README is the front door: every command in it works as printed and shows what it says.

Blocks, by their fence:
- ``sh``: commands to run as printed. The set-up block's main job runs (pip and pytest are what CI
  itself runs); its ``text`` block is compared with what the command printed.
- ``console``: a session: each ``$ command`` runs in a scratch folder laid out like a checkout
  (``testdata/`` and ``../shared/`` reachable as printed); the lines after it are compared with
  what it printed.
- ``synopsis``: templates (PATH, NAME, …): each subcommand exists and accepts every option shown.
- ``python``: runs as printed in the scratch folder.
- ``sql``: the query file example; it loads from ``--sql-dir`` and runs.

Shown output is compared as text with whitespace folded and runs of dashes (table rules) folded;
``...`` (or ``…``) stands for anything, so a shown line may leave out columns or a long tail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHARED = ROOT.parent / "shared"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(kind: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text(encoding="utf-8")) if lang == kind]


def _fold(text: str) -> str:
    text = text.replace("…", "...")
    return re.sub(r"-{3,}", "---", re.sub(r"\s+", " ", text)).strip()


def assert_shown(shown: str, actual: str, what: str) -> None:
    """Each '...'-separated piece of the shown text appears in the actual output, in order."""
    out, pos = _fold(actual), 0
    for piece in _fold(shown).split("..."):
        piece = piece.strip()
        if not piece:
            continue
        i = out.find(piece, pos)
        assert i >= 0, f"{what}: the README shows\n  {piece!r}\nbut the command printed:\n{actual}"
        pos = i + len(piece)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A folder laid out like a checkout: testdata/ and tests/ here, shared/ beside it (when it exists)."""
    base = tmp_path_factory.mktemp("readme")
    cwd = base / "checkout"
    cwd.mkdir()
    (cwd / "testdata").symlink_to(ROOT / "testdata")
    (cwd / "tests").symlink_to(ROOT / "tests")  # the generators a session runs (tests/synth_eplb.py)
    if SHARED.is_dir():
        (base / "shared").symlink_to(SHARED)
    return cwd


def _env() -> dict:
    scripts = sysconfig.get_path("scripts")
    # the README shows the screens of a 100-column terminal
    return {**os.environ, "PATH": scripts + os.pathsep + os.environ.get("PATH", ""), "COLUMNS": "100", "NO_COLOR": "1"}


def sh(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, shell=True, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600, executable="/bin/bash"
    )


def test_setup_block_runs_the_main_job_and_shows_what_the_readme_says(scratch):
    (setup,) = blocks("sh")[:1]
    lines = [line.strip() for line in setup.strip().splitlines()]
    assert lines[0].startswith("pip install -e '.[dev]' && slowcard diagnose ")
    assert lines[1] == "python -m pytest -q"
    # CI runs exactly these two lines through .ci/run
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -q -e '.[dev]'" in ci and "python -m pytest -q" in ci
    main_job = lines[0].split("&&", 1)[1].strip()
    res = sh(main_job, scratch)
    assert res.returncode == 1, res.stderr  # "exits with code 1 because it found a slow card"
    shown = blocks("text")[0]
    assert_shown(shown, res.stdout, main_job)


def test_setup_makes_a_virtual_environment_first(tmp_path):
    """A Debian / Ubuntu system Python refuses `pip install` (externally managed): the set-up
    says to make a venv first, and that command, run as printed, gives a venv with pip."""
    text = README.read_text(encoding="utf-8")
    setup = text[text.index("## Set up, run, test") : text.index("```sh")]
    line = re.search(r"`(python3 -m venv \.venv && \. \.venv/bin/activate)`", " ".join(setup.split()))
    assert line, "the set-up does not say how to make the virtual environment"
    res = sh(line.group(1) + " && command -v pip && python -c 'import sys; print(sys.prefix)'", tmp_path)
    assert res.returncode == 0, res.stderr
    assert str(tmp_path / ".venv") in res.stdout and (tmp_path / ".venv" / "bin" / "pip").exists()


def _sessions() -> list[tuple[str, str]]:
    """(command, shown output) of every '$ ' line of the console blocks."""
    out = []
    for body in blocks("console"):
        cmd, shown = None, []
        for line in body.splitlines():
            if line.startswith("$ "):
                if cmd:
                    out.append((cmd, "\n".join(shown)))
                cmd, shown = line[2:].strip(), []
            else:
                shown.append(line)
        if cmd:
            out.append((cmd, "\n".join(shown)))
    return out


def test_console_sessions_run_as_printed(scratch):
    sessions = _sessions()
    assert sessions
    if not SHARED.is_dir() and any("../shared" in c for c, _ in sessions):
        pytest.skip(f"{SHARED} is absent: the README's real session reads ../shared/realdata")
    for cmd, shown in sessions:
        res = sh(cmd, scratch)
        assert res.returncode in (0, 1), (cmd, res.stderr)
        assert "Traceback" not in res.stderr, (cmd, res.stderr)
        assert_shown(shown, res.stdout, cmd)


def _help(sub: str) -> str:
    res = sh(f"slowcard {sub} --help", ROOT)
    assert res.returncode == 0, (sub, res.stderr)
    return res.stdout


def test_synopsis_commands_exist_with_the_options_shown():
    (synopsis,) = blocks("synopsis")
    seen = 0
    for line in synopsis.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("duckdb "):
            assert shutil.which("duckdb", path=_env()["PATH"]), "the duckdb shell (duckdb-cli) is not installed"
            continue
        if not line.startswith("slowcard "):
            continue
        # the command's words up to its first option ("plan eplb", "show ep-slow-rank"): a group's
        # options are on its subcommand's help
        words = []
        for w in line.split()[1:]:
            if w.startswith(("-", "[", "|")):
                break
            words.append(w)
        sub = " ".join(words)
        text = _help(sub)
        for opt in re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-z])\b", line):
            assert opt in text, f"`slowcard {sub}` has no option {opt} (README synopsis: {line})"
        seen += 1
    assert seen >= 8


def test_python_block_runs_as_printed(scratch):
    (code,) = blocks("python")
    ns: dict = {}
    cwd = os.getcwd()
    os.chdir(scratch)
    try:
        exec(compile(code, "README.md (python block)", "exec"), ns)
    finally:
        os.chdir(cwd)
    assert ns["res"].status == "FAIL"  # as its comment says
    assert ns["res"].to_arrow().num_rows == len(ns["res"].rows) >= 1


def test_sql_block_is_a_query_that_loads_and_runs(scratch, tmp_path):
    (sql,) = blocks("sql")
    name = re.search(r"^-- name: (\S+)", sql, re.M).group(1)
    qdir = tmp_path / "q"
    qdir.mkdir()
    (qdir / f"{name}.sql").write_text(sql, encoding="utf-8")
    db = tmp_path / "q.duckdb"
    assert sh(f"slowcard ingest testdata/ep4_token_skew --db {db} -q", scratch).returncode == 0
    res = sh(f"slowcard query {name} --sql-dir {qdir} --db {db} --format json", scratch)
    assert res.returncode in (0, 1), res.stderr
    assert f'"query": "{name}"' in res.stdout and '"status": "WARN"' in res.stdout


def test_development_commands_exist():
    (dev,) = blocks("sh")[1:2]
    cmds = [line.split("#", 1)[0].strip() for line in dev.splitlines() if line.strip()]
    assert "python -m pytest -q" in cmds
    assert "python -m pytest -q -m slow" in cmds
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "slow", "--collect-only"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert re.search(r"^(\d+)/\d+ tests collected", collected.stdout, re.M), collected.stdout[-500:]
    assert int(re.search(r"^(\d+)/", collected.stdout, re.M).group(1)) >= 1
    for cmd in cmds:
        if cmd.startswith("python tests/"):
            script = ROOT / cmd.split()[1]
            assert script.is_file(), cmd
            for flag in cmd.split()[2:]:
                if not flag.startswith("["):  # [CASE]: a placeholder, not a flag
                    assert flag in script.read_text(encoding="utf-8"), (cmd, flag)
