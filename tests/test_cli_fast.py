"""The fast command-line path (cli.fast_parse, issue 17): `query`, `diagnose` and `ingest` command lines it
accepts must give exactly the arguments typer gives; everything else must be left to typer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from slowcard import cli

ROOT = Path(__file__).resolve().parents[1]

ACCEPTED = [
    ["query"],
    ["query", "ep-slow-rank"],
    ["query", "ep-slow-rank", "moe-breakdown", "--db", "x.duckdb"],
    ["query", "--db", "x.duckdb", "ep-slow-rank", "-f", "json", "--strict"],
    ["query", "ep-slow-rank", "-p", "alpha=0.1", "--param", "min_ranks=3", "--run", "a", "--run", "b"],
    ["query", "--all-runs", "--limit", "5", "--sql-dir", "d1", "--sql-dir", "d2", "--format", "csv"],
    ["query", "--list"],
    ["query", "ep-slow-rank", "--wide", "-f", "markdown"],
    ["query", "ep-slow-rank", "-p", "alpha=-1"],
    ["diagnose"],
    ["diagnose", "testdata/ep4_token_skew", "--db", "demo.duckdb"],
    ["diagnose", "a", "b", "--run", "r", "-f", "json", "--strict", "--sql-dir", "s"],
    ["diagnose", "-v", "--db", "x.duckdb"],
    ["diagnose", "--verbose", "-f", "markdown"],
    ["ingest", "x"],
    ["ingest", "a", "b", "--db", "x.duckdb", "--run", "r", "-j", "2", "-q"],
    ["ingest", "--jobs", "3", "a", "--rank-pattern", "rank(\\d+)", "--rank-map", "m.csv", "--taxonomy", "t.csv"],
    ["ingest", "a", "--run-per-folder", "--executor", "dask", "--scheduler", "tcp://127.0.0.1:8786", "--quiet"],
    ["ingest", "a", "--groups", "tp.json", "--groups", "pp.csv"],
]

LEFT_TO_TYPER = [
    [],
    ["ingest"],
    ["ingest", "--db", "x.duckdb"],
    ["ingest", "x", "--jobs", "0"],
    ["ingest", "x", "-j", "-1"],
    ["ingest", "x", "-q", "-q"],
    ["ingest", "x", "--run", "a", "--run", "b"],
    ["ingest", "x", "--executor=dask"],
    ["list"],
    ["query", "--help"],
    ["query", "--db=x.duckdb"],
    ["query", "-fjson"],
    ["query", "-f=json"],
    ["query", "--", "ep-slow-rank"],
    ["query", "--limit", "-1"],
    ["query", "--limit", "x"],
    ["query", "--limit", "٣"],
    ["query", "--db"],
    ["query", "--db", "a", "--db", "b"],
    ["query", "--strict", "--strict"],
    ["query", "--run", "--strict"],
    ["query", "--bogus"],
    ["diagnose", "--run", "a", "--run", "b"],
    ["diagnose", "--help"],
    ["diagnose", "-v", "-v"],
    ["query", "--wide", "--wide"],
    ["--version"],
]


def _typer_kwargs(argv: list[str]) -> dict:
    """What typer hands the command function for argv (parsing + its collection normalisation)."""
    group = typer.main.get_command(cli.app)
    command = group.commands[argv[0]]
    ctx = command.make_context(argv[0], list(argv[1:]))
    params = {p.name: p for p in command.params}
    return {k: typer.main._normalize_collection_value(params[k], v) for k, v in ctx.params.items()}


@pytest.mark.parametrize("argv", ACCEPTED, ids=" ".join)
def test_fast_parse_gives_typer_arguments(argv):
    fast = cli.fast_parse(argv)
    assert fast is not None
    command, kwargs = fast
    assert command == argv[0]
    assert kwargs == _typer_kwargs(argv)


@pytest.mark.parametrize("argv", LEFT_TO_TYPER, ids=lambda a: " ".join(a) or "(none)")
def test_unusual_command_lines_go_to_typer(argv):
    assert cli.fast_parse(argv) is None


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slowcard", *args], capture_output=True, text=True, cwd=ROOT)


def test_fast_and_typer_paths_print_the_same(tmp_path):
    """The same command through both paths (`--db=X` is left to typer): same output, exit code."""
    db = tmp_path / "d.duckdb"
    ing_fast = _cli("ingest", "testdata/ep4_token_skew", "--db", str(db), "-j", "2")
    assert ing_fast.returncode == 0 and "4 ok" in ing_fast.stdout
    ing_typer = _cli("ingest", "testdata/ep4_token_skew", f"--db={db}", "-j", "2")  # the same files again
    assert (ing_typer.returncode, ing_typer.stdout) == (ing_fast.returncode, ing_fast.stdout)
    gone_fast = _cli("ingest", "testdata/no-such-folder", "--db", str(db))
    gone_typer = _cli("ingest", "testdata/no-such-folder", f"--db={db}")
    assert gone_fast.returncode == gone_typer.returncode == 2 and gone_fast.stderr == gone_typer.stderr
    diag_fast = _cli("diagnose", "testdata/ep4_token_skew", "--db", str(db))
    assert diag_fast.returncode == 1 and "Slow card: rank 1" in diag_fast.stdout
    diag_typer = _cli("diagnose", f"--db={db}")
    assert (diag_typer.returncode, diag_typer.stdout) == (diag_fast.returncode, diag_fast.stdout)
    fast = _cli("query", "ep-slow-rank", "-f", "json", "--db", str(db))
    slow = _cli("query", "ep-slow-rank", "-f", "json", f"--db={db}")
    assert fast.returncode == slow.returncode == 1
    assert fast.stdout == slow.stdout and '"status": "FAIL"' in fast.stdout
    for extra in ([], ["--debug"]):  # library errors: exit 2 and one line (a traceback with --debug)
        a = _cli("query", "no-such-query", "--db", str(db), *extra)
        b = _cli("query", "no-such-query", f"--db={db}", *extra)
        assert a.returncode == b.returncode
        assert a.stderr.splitlines()[-1] == b.stderr.splitlines()[-1]
    bad = _cli("query", "-f", "yaml", "--db", str(db))
    assert bad.returncode == 2 and bad.stderr == _cli("query", "-f", "yaml", f"--db={db}").stderr
