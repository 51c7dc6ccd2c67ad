"""The screens a user reads (issue 32): the first screen of `slowcard diagnose` on every example,
query tables, `list`, `compare`, watch lines, colour and the help, at 100 columns.

Golden screens: testdata/golden/screens/<case>.txt hold `slowcard diagnose` exactly as printed
at COLUMNS=100 into a pipe (no colour, ASCII picture). After a deliberate change:

    python tests/test_screens.py --update            # every case
    python tests/test_screens.py --update ep4        # the cases whose name contains "ep4"
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # run as a script: this checkout's slowcard

import synth_experts  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.cli import app  # noqa: E402
from slowcard.errors import QueryDefinitionError  # noqa: E402

ROOT = HERE.parent
TESTDATA = ROOT / "testdata"
GOLDEN = TESTDATA / "golden" / "screens"
REALDATA = ROOT.parent / "shared" / "realdata"
WIDTH, LINES = 100, 30
ENV = {"COLUMNS": str(WIDTH), "NO_COLOR": "1"}
runner = CliRunner()


def _experts(d: Path) -> Path:
    synth_experts.write_scenario("eplb_fails", d / "experts")
    return d / "experts"


# case -> (kind, input): every example in testdata/, one rank of one, the real EP run, and a
# generated run with many slow cards (the folding)
CASES = {
    "ep4_token_skew": ("testdata", "ep4_token_skew"),
    "service_dp4_request_skew": ("testdata", "service_dp4_request_skew"),
    "ops": ("testdata", "ops"),
    "one_rank": ("testdata", "ep4_token_skew/rank0.pt.trace.json.gz"),
    "real_kineto_cpu_ep4_hot1": ("realdata", "kineto_cpu_ep4_hot1"),
    "synth_eplb_fails": ("synth", _experts),
}


def _input(case: str, tmp: Path) -> Path | None:
    kind, what = CASES[case]
    if kind == "testdata":
        return TESTDATA / what
    if kind == "realdata":
        return REALDATA / what if (REALDATA / what).exists() else None
    return what(tmp)


def diagnose(case: str, tmp: Path, *extra: str):
    src = _input(case, tmp)
    if src is None:
        pytest.skip(f"real profiler data not found at {REALDATA / CASES[case][1]}")
    res = runner.invoke(app, ["diagnose", str(src), "--db", str(tmp / "s.duckdb"), "--run", case, *extra], env=ENV)
    assert res.exit_code in (0, 1), (res.exit_code, res.output, res.exception)
    return res


@pytest.mark.parametrize("case", list(CASES))
def test_first_screen_matches_golden_and_fits(case, tmp_path):
    res = diagnose(case, tmp_path)
    lines = res.stdout.rstrip("\n").split("\n")
    assert len(lines) <= LINES, f"{case}: {len(lines)} lines"
    wide = [line for line in lines if len(line) > WIDTH]
    assert not wide, f"{case}: lines wider than {WIDTH}: {wide}"
    # the answer in the first 3 lines: each costliest card, its cause and its cost
    doc = json.loads(diagnose(case, tmp_path, "--format", "json").stdout)
    top = " ".join(lines[:3])
    conclusion = doc["conclusion"]
    if conclusion.get("cards"):
        first = conclusion["cards"][0]
        assert first["card"] in top and first["causes"][:20] in top, top
        if first["cost_ms"] is not None:
            assert f"{first['cost_ms']:.3g} ms" in top, top
    else:
        assert conclusion["headline"][:60] in " ".join(line.strip() for line in lines[:3]), top
    assert lines[0].rstrip().endswith(conclusion["status"])
    path = GOLDEN / f"{case}.txt"
    assert path.exists(), f"{path} is missing; run `python tests/test_screens.py --update {case}`"
    assert res.stdout == path.read_text(encoding="utf-8"), (
        f"the first screen of {case} changed; if intended: python tests/test_screens.py --update {case}"
    )


def test_one_rank_is_skip_with_the_reason_in_the_headline(tmp_path):
    res = diagnose("one_rank", tmp_path)
    assert res.exit_code == 0  # SKIP is not a failure (README: exit codes)
    assert res.stdout.split("\n")[0].endswith("SKIP")
    assert "Cannot name a slow card: 1 rank(s) with MoE layers" in res.stdout
    doc = json.loads(diagnose("one_rank", tmp_path, "--format", "json").stdout)
    assert doc["conclusion"]["status"] == "SKIP" and "needs >= 3" in doc["conclusion"]["headline"]
    # near miss: the same ranks all present decide (FAIL), not SKIP
    full = runner.invoke(app, ["diagnose", str(TESTDATA / "ep4_token_skew"), "--db", str(tmp_path / "f.duckdb")])
    assert full.exit_code == 1 and full.stdout.split("\n")[0].endswith("FAIL")


def test_verbose_shows_everything_and_markdown_is_for_tickets(tmp_path):
    short = diagnose("ep4_token_skew", tmp_path).stdout
    verbose = diagnose("ep4_token_skew", tmp_path, "-v").stdout
    n_queries = len(queries.load_catalog())
    for name in queries.load_catalog():
        assert re.search(rf"^{name}@v\d+ (FAIL|WARN|PASS|INFO|SKIP|ERROR) ", verbose, re.M), name
        assert not re.search(rf"^{name}@v\d+ ", short, re.M)  # folded on the first screen
    assert "Why is rank 1 slow (token-skew):" in verbose and f"TOTAL={n_queries}" in verbose
    md = diagnose("ep4_token_skew", tmp_path, "--format", "markdown").stdout
    assert md.startswith("### slowcard diagnose · run 'ep4_token_skew'") and md.rstrip().endswith("`")
    assert "| FAIL | `ep-slow-rank@v" in md and "- **next:** routing" in md


def test_query_tables_never_wrap_at_100_columns(tmp_path):
    """Every query of the catalog on the examples (and expert data): no line over 100 columns;
    the default table shows the headline columns, --wide every column."""
    dbs = []
    for name, paths in (
        ("ep", [TESTDATA / "ep4_token_skew"]),
        ("dp", [TESTDATA / "service_dp4_request_skew"]),
        ("ex", [_experts(tmp_path)]),
    ):
        db = tmp_path / f"{name}.duckdb"
        assert runner.invoke(app, ["ingest", *map(str, paths), "--db", str(db), "-q"]).exit_code == 0
        dbs.append(db)
    for db in dbs:
        res = runner.invoke(app, ["query", "--db", str(db), "--limit", "0"], env=ENV)
        assert res.exit_code in (0, 1), res.output
        wide = [line for line in res.stdout.split("\n") if len(line) > WIDTH]
        assert not wide, (db.name, wide)
    ep = runner.invoke(app, ["query", "ep-slow-rank", "--db", str(dbs[0])], env=ENV).stdout.split("\n")
    header = " ".join(ep[1:4])
    for col in ("rank", "level", "cause", "cost", "tokens", "[ms]", "[%]"):
        assert col in header, (col, ep[:5])
    assert "p_value" not in " ".join(ep) and "more columns: --wide" in " ".join(ep)
    wide = runner.invoke(app, ["query", "ep-slow-rank", "--db", str(dbs[0]), "--wide"], env=ENV).stdout
    assert "p_value" in wide and "next_step" in wide
    md = runner.invoke(app, ["query", "ep-slow-rank", "--db", str(dbs[0]), "-f", "markdown"], env=ENV).stdout
    assert "| rank | level | cause | cost (ms) | cost (%) |" in md


def test_list_and_compare_fit_100_columns(tmp_path):
    res = runner.invoke(app, ["list"], env=ENV)
    assert res.exit_code == 0 and max(len(line) for line in res.stdout.split("\n")) <= WIDTH
    db = tmp_path / "c.duckdb"
    for run, src in (
        ("before", TESTDATA / "ep4_token_skew"),
        ("after", TESTDATA / "ep4_token_skew" / "rank0.pt.trace.json.gz"),
    ):
        assert runner.invoke(app, ["ingest", str(src), "--db", str(db), "--run", run, "-q"]).exit_code == 0
    cmp = runner.invoke(app, ["compare", "before", "after", "--db", str(db)], env=ENV)
    lines = cmp.stdout.split("\n")
    assert max(len(line) for line in lines) <= WIDTH, [line for line in lines if len(line) > WIDTH]
    # each changed verdict on a line of its own, then the unchanged ones counted
    assert any(re.match(r"ep-slow-rank@v\d+\s+FAIL -> SKIP", line) for line in lines), lines[:8]
    assert any(re.match(r"\d+ verdicts? unchanged: ", line) for line in lines)


def test_headline_header_is_checked_and_not_fingerprinted(tmp_path):
    src = (ROOT / "sql" / "straggler-rank.sql").read_text(encoding="utf-8")
    q = queries.parse_query(ROOT / "sql" / "straggler-rank.sql")
    assert q.headline_columns == ["last_pct", "cost_ms", "total_wait_ms"]
    # another headline: the same fingerprint (presentation only, no version bump needed)
    other = re.sub(r"^-- headline: .*$", "-- headline: rank | collectives", src, flags=re.M)
    assert queries.parse_query(tmp_path / "straggler-rank.sql", other).fingerprint() == q.fingerprint()
    assert queries.parse_query(tmp_path / "straggler-rank.sql", other).headline_columns == ["rank", "collectives"]
    bad = re.sub(r"^-- headline: .*$", "-- headline: rank | not a column", src, flags=re.M)
    with pytest.raises(QueryDefinitionError, match=r"straggler-rank.sql:\d+: headline entry 'not a column'"):
        queries.parse_query(tmp_path / "straggler-rank.sql", bad)


def test_every_headline_column_is_a_column_of_its_query():
    """Checked on the golden diagnose outputs: each query that returned columns names only those."""
    cols: dict[str, set] = {}
    for path in (TESTDATA / "golden" / "diagnose").glob("*.json"):
        for name, res in json.loads(path.read_text(encoding="utf-8"))["results"].items():
            if res["columns"] and not all(r.get("skip_reason") for r in res["rows"]):
                cols.setdefault(name, set()).update(res["columns"])
    catalog = queries.load_catalog()
    assert len(cols) >= 15
    for name, seen in cols.items():
        q = catalog[name]
        used = set(q.headline_columns) | {f for e in q.headline for f in re.findall(r"\{([a-z_0-9]+)\}", e)}
        assert q.headline and used <= seen, (name, used - seen)


def test_one_dp_domain_in_live_metrics_is_skip(tmp_path):
    """A single-engine vLLM instance: dp-metrics-imbalance SKIPs with the reason (was PASS), and
    diagnose says it cannot name a slow card; with 4 engines the same query judges (PASS)."""
    from sim_procs import Sims
    from test_watch import watch_steps

    sims = Sims()
    try:
        one = sims.start("--engines", "0")
        four = sims.start("--engines", "0,1,2,3")
        single = watch_steps(tmp_path / "one.duckdb", [f"http://127.0.0.1:{one}/metrics"], interval_s=0.4, steps=4)
        many = watch_steps(tmp_path / "four.duckdb", [f"http://127.0.0.1:{four}/metrics"], interval_s=0.4, steps=4)
    finally:
        sims.close()
    res = single[-1].results["dp-metrics-imbalance"]
    assert res.status == "SKIP" and res.summary.startswith("1 DP domain(s) in the metrics")
    assert many[-1].results["dp-metrics-imbalance"].status == "PASS"
    diag = runner.invoke(app, ["diagnose", "--db", str(tmp_path / "one.duckdb"), "--format", "json"])
    assert diag.exit_code == 0
    assert json.loads(diag.stdout)["conclusion"]["headline"].startswith("Cannot name a slow card: 1 DP domain(s)")


def test_watch_lines_fit_and_alerts_stand_alone():
    from slowcard.cli_watch import change_lines, status_line
    from slowcard.queries import Result
    from slowcard.watch import Step

    rows = [{"ts_ns": 1, "dp_rank": None, "kv_usage": None, "ttft_p99_ms": 72.0, "e2e_p99_ms": 1950.0}]
    rows += [
        {"ts_ns": 1, "dp_rank": d, "requests_per_s": 38.0 + d, "waiting": 1.0, "kv_usage": 0.35, "reset": False}
        for d in range(16)
    ]
    step = Step(1_000_000_000, rows, [])
    step.results = {"dp-metrics-imbalance": Result("dp-metrics-imbalance", 2, "w", "PASS", "")}
    lines = status_line(step, 100).split("\n")
    assert all(len(line) <= 100 for line in lines)
    per_line = [line.count("req/s") for line in lines[1:]]
    assert sum(per_line) == 16 and max(per_line) - min(per_line) <= 1 and len(per_line) <= 6  # equal groups
    assert "dp-metrics-imbalance PASS" in lines[0] and "P99 TTFT 72 ms" in lines[0]
    alert = change_lines("dp-metrics-imbalance", "PASS", "FAIL", "DP 2: request-skew " + "x " * 80, 100).split("\n")
    assert alert[0].startswith("ALERT dp-metrics-imbalance: PASS -> FAIL: DP 2") and len(alert) > 1
    assert all(len(line) <= 100 for line in alert)
    assert change_lines("q", "FAIL", "PASS", "ok", 100) == "CLEARED q: FAIL -> PASS: ok"


def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch):
    from slowcard.cli_common import screen_style
    from slowcard.render import terminal_safe
    from slowcard.renderers.terminal import colour

    class Tty:
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    style, coloured = screen_style(Tty())
    assert style.unicode and coloured
    monkeypatch.setenv("NO_COLOR", "1")
    style, coloured = screen_style(Tty())
    assert style.unicode and not coloured  # block characters, no colour
    style, coloured = screen_style(object())  # a pipe, a file
    assert not style.unicode and not coloured
    # colour goes on text made safe first: a name with an OSC title sequence stays inert
    out = colour(terminal_safe("FAIL rank 1 \x1b]0;pwned\x07 ███"))
    assert "\x1b]" not in out and "\\u001b]0;pwned" in out
    assert "\x1b[1;31mFAIL\x1b[0m" in out and "\x1b[34m███\x1b[0m" in out


def test_version_and_flags_in_help():
    from slowcard import __version__

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.startswith(f"slowcard {__version__} (duckdb ")
    help_text = runner.invoke(app, ["query", "--help"], env={"COLUMNS": "120"}).stdout
    strict = next(line for line in help_text.split("\n") if "--strict" in line)
    assert "<bool>" not in strict and "Exit 1 on WARN too" in strict
    assert "<int>" in next(line for line in help_text.split("\n") if "--limit" in line)  # options keep their type


def test_renderers_take_the_view_and_never_the_package_front():
    """Shape of the house (issue 32): the view is built once next to diagnosis.py; each renderer
    is a module of slowcard/renderers/, and none of them (nor the view) takes a name from the
    package front (``slowcard/__init__``): only modules."""
    import ast

    package = ROOT / "slowcard"
    modules = {p.stem for p in package.glob("*.py")} | {p.name for p in package.iterdir() if p.is_dir()}
    files = sorted((package / "renderers").glob("*.py")) + [package / "view.py"]
    assert {p.stem for p in files} >= {"terminal", "picture", "tables", "markdown", "html", "view"}
    for path in files:
        depth = 2 if path.parent.name == "renderers" else 1
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == depth and node.module is None:
                names = {a.name for a in node.names}
                assert names <= modules, (path.name, names - modules)  # `from .. import __version__` is not
            if isinstance(node, ast.Import):
                assert all(a.name != "slowcard" for a in node.names), path.name
    assert not (package / "report.py").exists()  # the report is the html renderer


def test_progress_is_rich_on_a_terminal_and_silent_otherwise(monkeypatch):
    import io

    from slowcard import cli_common

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert cli_common.progress_printer() is None  # not a terminal: nothing

    class Tty(io.StringIO):
        def isatty(self):
            return True

        @property
        def unfiltered(self):  # what rich draws on (cli._TerminalSafe passes its stream)
            return drawn

    drawn = io.StringIO()
    monkeypatch.setattr(sys, "stderr", Tty())
    show = cli_common.progress_printer()
    assert show is not None
    state = {"files_done": 0, "files_total": 2, "bytes_done": 0, "bytes_total": 2_000_000, "events": 0}
    show({**state, "current": "/x/rank0.pt.trace.json.gz"})
    show({**state, "files_done": 1, "bytes_done": 1_000_000, "events": 1500, "current": None})
    show({**state, "files_done": 2, "bytes_done": 2_000_000, "events": 3000, "current": "/x/bad\x1b]0;t\x07.json"})
    out = drawn.getvalue()
    assert "2/2 files" in out and "3,000 rows" in out and "2.0/2.0" in out  # files, rows, bytes
    assert "\x1b]0;" not in out and "\\u001b" in out  # a file name cannot drive the terminal
    assert show.bar is None  # the bar closes when every file is done


def update(patterns: list[str]) -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        if patterns and not any(p in case for p in patterns):
            continue
        with tempfile.TemporaryDirectory() as d:
            src = _input(case, Path(d))
            if src is None:
                print(f"skipped {case}: no input")
                continue
            res = runner.invoke(app, ["diagnose", str(src), "--db", f"{d}/s.duckdb", "--run", case], env=ENV)
        (GOLDEN / f"{case}.txt").write_text(res.stdout, encoding="utf-8")
        print(f"wrote {(GOLDEN / f'{case}.txt').relative_to(ROOT)}: {len(res.stdout.splitlines())} lines")


if __name__ == "__main__":
    if "--update" in sys.argv:
        update([a for a in sys.argv[1:] if a != "--update"])
    else:
        print(__doc__)
