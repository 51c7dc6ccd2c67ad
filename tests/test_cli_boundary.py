"""The CLI is a thin shell: one error boundary (library errors -> exit 2, --debug re-raises),
everything it can ingest the Python API can, and imports flow downward (no cycle between modules)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import synth_kineto  # noqa: E402

import slowcard  # noqa: E402
from slowcard import queries  # noqa: E402
from slowcard.cli import app  # noqa: E402
from slowcard.errors import UsageError  # noqa: E402

runner = CliRunner()
PACKAGE = Path(slowcard.__file__).resolve().parent


@pytest.mark.parametrize(
    "args, words",
    [
        (["query", "ep-slow-rnak"], ["unknown query 'ep-slow-rnak'", "did you mean ep-slow-rank"]),
        (["list", "--sql-dir", "/no/such/folder"], ["/no/such/folder: --sql-dir is not a folder"]),
        (["diagnose", "--db", "/no/such.duckdb"], ["/no/such.duckdb: no such database"]),
        (["compare", "a", "b", "--db", "/no/such.duckdb"], ["/no/such.duckdb: no such database"]),
        (["ingest", "x", "--executor", "ray"], ["--executor 'ray': expected one of local, dask"]),
    ],
)
def test_library_errors_exit_2_with_the_message(args, words):
    res = runner.invoke(app, args)
    assert res.exit_code == 2, (res.output, res.exception)
    assert res.stdout == ""
    assert res.stderr.startswith("Error: ")
    for w in words:
        assert w in res.stderr


def test_debug_reraises_the_library_error():
    res = runner.invoke(app, ["--debug", "query", "ep-slow-rnak"])
    assert isinstance(res.exception, UsageError) and "ep-slow-rnak" in str(res.exception)
    assert "Error: " not in res.stderr


def test_debug_anywhere_through_the_console_entry_point(monkeypatch):
    from slowcard import cli

    monkeypatch.setenv("SLOWCARD_DEBUG", "0")  # main() sets it to 1; undone after the test
    monkeypatch.setattr(sys, "argv", ["slowcard", "query", "ep-slow-rnak", "--debug"])
    with pytest.raises(UsageError):
        cli.main()


def test_list_shows_the_header_metadata():
    narrow = runner.invoke(app, ["list"], env={"COLUMNS": "100"})
    assert narrow.exit_code == 0
    assert narrow.stdout.split("\n")[0].split() == ["query", "version", "role", "verdict", "description"]
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 100  # not 330 characters a row
    res = runner.invoke(app, ["list", "--wide"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert lines[0].split()[:8] == ["query", "version", "role", "verdict", "subject", "priority", "order", "shows"]
    row = next(ln for ln in lines if ln.startswith("cluster-step-skew "))
    assert "verdict" in row and "suspect_rank as rank" in row and "report.moe, annotate" in row
    # in diagnosis order
    names = [ln.split()[0] for ln in lines[2:]]
    catalog = queries.load_catalog(scope=None)  # the fleet queries are listed too
    assert names == sorted(names, key=lambda n: (catalog[n].order, n))


def test_the_python_api_ingests_like_the_cli(tmp_path):
    root = tmp_path / "runs"
    synth_kineto.write_ep_run(root / "a", scenario="token_skew", steps=2, layers=2)
    synth_kineto.write_ep_run(root / "b", scenario="balanced", steps=2, layers=2)
    tax = tmp_path / "tax.csv"
    tax.write_text("pattern,op_class,coll_kind,priority\n^MyFusedMoe$,moe_fused,,1\n", encoding="utf-8")
    db = tmp_path / "api.duckdb"
    reports = slowcard.ingest_runs(db, root, run_per_folder=True, taxonomy=tax)
    assert [r.run for r in reports] == ["a", "b"] and all(r.exit_code == 0 for r in reports)
    con = slowcard.open_db(db)
    try:
        assert queries.runs(con) == ["a", "b"]
        user = con.execute("SELECT pattern, op_class FROM op_taxonomy WHERE origin = 'user'").fetchall()
        assert user == [("^MyFusedMoe$", "moe_fused")]
    finally:
        con.close()
    with pytest.raises(UsageError, match="exclude each other"):
        slowcard.ingest_runs(db, root, run="x", run_per_folder=True)
    with pytest.raises(UsageError, match="expected one of local, dask"):
        slowcard.ingest_files(db, root / "a", run="a", executor="threads")
    # the same as the CLI gives
    cli_db = tmp_path / "cli.duckdb"
    res = runner.invoke(
        app, ["ingest", str(root), "--run-per-folder", "--taxonomy", str(tax), "--db", str(cli_db), "-q"]
    )
    assert res.exit_code == 0, res.output
    assert slowcard.diagnose(cli_db, run="a").conclusion == slowcard.diagnose(db, run="a").conclusion


def _imports(path: Path, module: str, is_pkg: bool, modules: set[str]) -> set[str]:
    """The slowcard modules a module imports anywhere in its body (function-level imports too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
            elif (node.module or "").startswith("slowcard"):
                base = []
            else:
                continue
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                cand = f"{target}.{alias.name}"
                out.add(cand if cand in modules else target)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
    return (out & modules) - {module}


def test_imports_flow_downward():
    """No cycle in the import graph of the package (``store`` <-> ``taxonomy`` was one)."""
    files = {}
    for p in PACKAGE.rglob("*.py"):
        parts = list(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = p
    graph = {m: _imports(p, m, p.name == "__init__.py", set(files)) for m, p in files.items()}
    assert "slowcard.taxonomy" in graph["slowcard.store"]  # the graph sees real edges
    cycles = []
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(" -> ".join(stack[stack.index(n) :] + [n]))
            elif n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
