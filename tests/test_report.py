"""`slowcard report`: one self-contained HTML page, on the real EP run and on a generated run
(EP + expert + DP data in one run), escaping of trace strings, the CLI, and rendering in
headless Chromium (skipped when Chromium is not installed)."""

from __future__ import annotations

import gzip
import json
import re
import sys
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import chromium_page  # noqa: E402
import synth_experts  # noqa: E402
import synth_kineto  # noqa: E402
from conftest import REAL_EP_RUN as REAL_RUN  # noqa: E402
from conftest import ingest_ok

from slowcard import queries  # noqa: E402
from slowcard.errors import UsageError  # noqa: E402
from slowcard.queries import Result  # noqa: E402
from slowcard.renderers import html as report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CATALOG = queries.load_catalog()
EP = f"ep-slow-rank@v{CATALOG['ep-slow-rank'].version}"
PAYLOAD = '<script>alert("pwned")</script>'
GEN_RUN = f"gen{PAYLOAD}"
EXTERNAL = re.compile(r"<(script|link|img|iframe|embed|object)\b[^>]*\b(src|href)\s*=\s*[\"']?\s*(https?:)?//", re.I)


def _report_results(con, run):
    """The queries the report reads (what diagnose would hand it, minus the ones it does not show)."""
    return report.ensure_results(con, run, None, None, CATALOG)


@pytest.fixture(scope="module")
def real(tmp_path_factory, real_ep_db):
    d = tmp_path_factory.mktemp("real")
    db = real_ep_db
    con = queries.open_readonly(db)
    results = _report_results(con, REAL_RUN)
    page = report.build_report(con, REAL_RUN, results)
    con.close()
    out = d / "report.html"
    out.write_text(page, encoding="utf-8")
    return {"db": db, "page": page, "path": out, "results": results}


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    """One run with everything: a token-skew EP trace whose collective names carry a script
    payload, expert load of the 'concentrated' scenario, and the committed DP example."""
    d = tmp_path_factory.mktemp("gen")
    ep = synth_kineto.write_ep_run(d / "ep", scenario="token_skew", steps=2, layers=3, gz=True)
    for p in ep:  # trace strings an attacker controls: the collective names
        text = gzip.decompress(p.read_bytes()).decode()
        p.write_bytes(
            gzip.compress(
                text.replace('"gloo:all_to_all"', '"gloo:all_to_all' + PAYLOAD.replace('"', '\\"') + '"').encode()
            )
        )
    ex = synth_experts.write_scenario("concentrated", d / "experts", metrics=False)
    db = d / "gen.duckdb"
    ingest_ok(db, [d / "ep", *ex, ROOT / "testdata" / "service_dp4_request_skew"], GEN_RUN)
    con = queries.open_readonly(db)
    results = _report_results(con, GEN_RUN)
    page = report.build_report(
        con,
        GEN_RUN,
        results,
        conclusion={
            "headline": f"Slow card: rank 1 {PAYLOAD}",
            "slow_cards": ["rank 1"],
            "cause": "token-skew",
            "evidence": "token_ratio=20",
            "next_step": "rebalance",
            "query": EP,
        },
    )
    con.close()
    return {"db": db, "page": page, "results": results}


def _fig(page, query_prefix):
    figs = [f for f in report.figure_data(page) if f["query"].startswith(query_prefix)]
    assert figs, f"no figure from {query_prefix} in the page"
    return figs[0]


def _trace(fig, name):
    return next(t for t in fig["data"] if t.get("name", "").startswith(name))


def _self_contained(page):
    assert not EXTERNAL.search(page), EXTERNAL.search(page).group(0)
    # plotly.js itself is in the page (several MB), and the figures call it
    assert len(page) > 3_000_000 and "Plotly.newPlot" in page and "plotly.js" in page.lower()


# ---------------------------------------------------------------- real EP run


def test_real_report_is_self_contained_and_names_the_slow_rank(real):
    page = real["page"]
    _self_contained(page)
    assert EP in page
    row = re.search(rf"<tr><td><code>{EP}</code></td><td>(.*?)</td><td>(.*?)</td></tr>", page)
    assert row and "FAIL" in row.group(1) and "rank 1 token-skew" in row.group(2)
    # the page opens with the first screen of the diagnosis (here concluded from the results):
    # the slow card with its cause, cost, evidence and next step, then the findings, worst first
    start = page.index('<div class="conclusion">')
    top = page[start : page.index("<h2", start)]
    assert "Slow card: rank 1 — token-skew (" in top
    card = top[top.index('<div class="card">') :]
    assert "tokens per layer (median rank" in card and '<span class="label">next</span> routing' in card
    findings = top[top.index('<table class="findings">') :]
    assert re.findall(r"<code>([a-z-]+@v\d+)</code>", findings) == [
        EP,
        f"straggler-rank@v{CATALOG['straggler-rank'].version}",
    ]
    assert "missing input: expert load" in top and "TOTAL=" in top
    # then the why-section of the slow card, before the figures
    assert start < page.index('<h2 class="why">Why is rank 1 slow?') < page.index("<h2>MoE time per rank</h2>")
    # every figure names its query@version under it
    for f in report.figure_data(page):
        assert re.fullmatch(r"[a-z0-9-]+@v\d+", f["query"])
        assert f"from {f['query']}" in page
    # parts without data say so instead of failing
    assert "No expert load data in this run" in page and "No DP service data in this run" in page


def test_real_report_rank1_bar_stands_out(real):
    fig = _fig(real["page"], "moe-breakdown@v")
    gmm = _trace(fig, "GroupedMatmul")
    wait = _trace(fig, "waited")
    assert gmm["x"] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    others = [v for i, v in enumerate(gmm["y"]) if i != 1]
    assert gmm["y"][1] > 10 * max(others)  # 80 ms vs ~2 ms of GroupedMatmul
    assert wait["y"][1] == min(wait["y"]) and wait["y"][1] < 0.5 * min(v for i, v in enumerate(wait["y"]) if i != 1)
    # the bars are the query's numbers, stacked: each segment's base is the sum below it
    rows = {r["rank"]: r for r in real["results"]["moe-breakdown"].rows}
    assert gmm["y"] == [rows[r]["gmm_ms"] for r in range(4)]
    disp = _trace(fig, "dispatch")
    assert disp["base"] == gmm["y"]
    assert any("slow card" in a.get("text", "") for a in fig["layout"].get("annotations", []))


def test_real_report_heatmap_shows_who_arrives_last(real):
    fig = _fig(real["page"], "wait-heatmap@v")
    lag, last = fig["data"]
    assert lag["y"][1] == "rank 1"
    totals = [sum(v or 0 for v in row) for row in last["z"]]
    assert totals[1] == max(totals) and totals[1] > 2 * sorted(totals)[-2]
    waited = [sum(v or 0 for v in row) for row in lag["z"]]
    assert waited[1] == min(waited)
    assert len(lag["x"]) == 16 and lag["x"][0] == "s0 L0"  # 4 steps x 4 layers


# ---------------------------------------------------------------- generated run


def test_generated_report_has_every_part(gen):
    page = gen["page"]
    _self_contained(page)
    fig = _fig(page, "moe-breakdown@v")
    gmm = _trace(fig, "GroupedMatmul")["y"]
    assert gmm[1] > 3 * max(v for i, v in enumerate(gmm) if i != 1)
    # expert heat map: physical slots grouped by rank; the hot expert of expert-hotspots is the hottest cell
    ex = _fig(page, "expert-heatmap@v")
    hm = ex["data"][0]
    hot = gen["results"]["expert-hotspots"].rows[0]
    assert gen["results"]["expert-hotspots"].status == "FAIL"
    layer_row = hm["y"].index(f"layer {hot['layer']}")
    col = max(range(len(hm["x"])), key=lambda j: hm["z"][layer_row][j] or 0)
    assert hm["x"][col].startswith(f"r{hot['ep_rank']}/")
    assert f"expert {hot['expert']} " in hm["text"][layer_row][col]
    assert [x.split("/")[0] for x in hm["x"]] == sorted((x.split("/")[0] for x in hm["x"]), key=lambda s: int(s[1:]))
    # DP: the table (hot domain highlighted) and the per-window series of every domain
    imb = gen["results"]["dp-imbalance"]
    assert imb.status == "FAIL" and imb.rows[0]["dp_rank"] == 1
    hot_rows = re.findall(r'<tr class="hot"><td>(\d+)</td>', page)
    assert hot_rows == ["1"]
    ts = _fig(page, "dp-batch@v")
    names = {t["name"].split(" ◀")[0] for t in ts["data"]}  # the slow card's name carries its mark
    assert names == {"DP 0", "DP 1", "DP 2", "DP 3"} and len(ts["data"]) == 12
    # the conclusion is shown on top
    assert page.index('class="conclusion"') < page.index("<h2>MoE time per rank</h2>")


def test_trace_strings_cannot_inject(gen):
    page = gen["page"]
    assert PAYLOAD not in page and "<script>alert" not in page
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in page  # shown, as text
    # the only script elements are plotly.js, the loader and one JSON block per figure
    n_figs = len(report.figure_data(page))
    assert page.count("<script") == 2 + n_figs and page.count("</script>") == 2 + n_figs


def test_figure_labels_are_escaped_inside_the_json(gen):
    """A figure label from a trace (the sync-gaps fallback labels use the process-group name)."""
    con = queries.open_readonly(gen["db"])
    try:
        results = dict(gen["results"])
        sg = results["sync-gaps"]
        bad_pg = "</script><script>alert(2)</script>"
        results["sync-gaps"] = Result(
            sg.query,
            sg.version,
            sg.run,
            sg.status,
            sg.summary,
            sg.columns,
            [{**r, "pg": bad_pg} for r in sg.rows],
            sg.params,
        )
        results["wait-heatmap"] = Result("wait-heatmap", 1, GEN_RUN, "SKIP", "requires _layer_collectives: none")
        page = report.build_report(con, GEN_RUN, results)
    finally:
        con.close()
    assert "<script>alert(2)" not in page
    fig = _fig(page, "sync-gaps@v")
    assert fig["data"][0]["x"][0].endswith("&lt;/script&gt;&lt;script&gt;alert(2)&lt;/script&gt;")
    assert "one column per matched collective" in page
    n_figs = len(report.figure_data(page))
    assert page.count("<script") == 2 + n_figs


def test_missing_plotly_names_the_extra(gen, monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    con = queries.open_readonly(gen["db"])
    try:
        with pytest.raises(UsageError, match=r"pip install -e \.\[report\]"):
            report.build_report(con, GEN_RUN, gen["results"])
    finally:
        con.close()


# ---------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A watched run: 4 simulated vLLM DP engines, engine 2 hot from 2 s on, 9 windows of 0.5 s,
    so dp-metrics-imbalance turns FAIL part-way (tests/vllm_sim.py, as the watch tests use)."""
    from sim_procs import Sims
    from test_watch import watch_steps

    d = tmp_path_factory.mktemp("live")
    sims = Sims()
    try:
        port = sims.start("--hot-engine", "2", "--hot-from", "2")
        steps = watch_steps(d / "live.duckdb", [f"http://127.0.0.1:{port}/metrics"], interval_s=0.5, steps=12)
    finally:
        sims.close()
    assert any(s.results["dp-metrics-imbalance"].status == "FAIL" for s in steps)
    con = queries.open_readonly(d / "live.duckdb")
    try:
        page = report.build_report(con, "live", _report_results(con, "live"))
    finally:
        con.close()
    return {"page": page}


def test_report_live_metrics_section_marks_the_alert_windows(live, real):
    page = live["page"]
    assert "<h2>Live metrics</h2>" in page
    fig = _fig(page, "metric-timeline@v")
    names = {t.get("name").split(" ◀")[0] for t in fig["data"]}  # the slow card's name carries its mark
    assert {"DP 0", "DP 1", "DP 2", "DP 3", "instance TTFT P99"} <= names
    req = [t for t in fig["data"] if t.get("legendgroup") == "dp2"][0]
    others = [t for t in fig["data"] if t.get("legendgroup") == "dp0"][0]
    assert max(req["y"]) > 2 * max(others["y"])  # the hot domain stands out in requests/s
    shaded = [sh for sh in fig["layout"].get("shapes", []) if sh.get("fillcolor") == "#d62728"]
    assert shaded and all(sh["x1"] > sh["x0"] for sh in shaded)  # the alert windows
    assert any("FAIL: dp-metrics-imbalance" in a.get("text", "") for a in fig["layout"]["annotations"])
    # the first screen heads the page here too: the hot domain, from the live metrics verdict
    top = page[page.index('<div class="conclusion') : page.index("<h2")]
    assert "Slow card: DP domain 2 — request-skew" in top
    # a run without metric windows has no such section
    assert "<h2>Live metrics</h2>" not in real["page"]


def test_cli_report_writes_the_page_and_rejects_bad_input(app, tmp_path):
    """On a one-rank trace without MoE layers: every part SKIPs with a note, the page is written."""
    trace = tmp_path / "t" / "rank0.pt.trace.json"
    trace.parent.mkdir()
    trace.write_text(
        json.dumps(
            {
                "schemaVersion": 1,
                "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 1},
                "traceEvents": [
                    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0}
                ],
            }
        )
    )
    db = tmp_path / "tiny.duckdb"
    ingest_ok(db, [trace.parent], "tiny")
    runner = CliRunner()
    out = tmp_path / "r" / "report.html"
    res = runner.invoke(app, ["report", "--db", str(db), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and "'tiny'" in res.output and out.stat().st_size > 3_000_000
    page = out.read_text(encoding="utf-8")
    assert "No MoE layers found in this run" in page and EP in page
    assert "Nothing to diagnose" in page  # the diagnosis conclusion heads the page
    assert report.figure_data(page) == []
    res = runner.invoke(app, ["report", "--db", str(db), "--run", "nope", "--out", str(out)])
    assert res.exit_code == 2 and "no run named 'nope'" in res.output
    res = runner.invoke(app, ["report", "--db", str(tmp_path / "missing.duckdb"), "--out", str(out)])
    assert res.exit_code == 2 and "no such database" in res.output


# ---------------------------------------------------------------- Chromium


def _chromium_screenshot(html: Path, png: Path, tmp: Path, size="1400,2000") -> str:
    return chromium_page.screenshot(html, png, tmp / "profile", size)


def _png_size_and_ink(png: Path) -> tuple[int, int, float]:
    """(width, height, share of filtered pixel bytes that are neither 0 nor 255)."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    idat, i = b"", 8
    while i < len(data):
        n = int.from_bytes(data[i : i + 4], "big")
        if data[i + 4 : i + 8] == b"IDAT":
            idat += data[i + 8 : i + 8 + n]
        i += 12 + n
    raw = zlib.decompress(idat)
    ink = sum(1 for b in raw[::7] if b not in (0, 255)) / len(raw[::7])
    return width, height, ink


@pytest.mark.skipif(chromium_page.CHROMIUM is None, reason=chromium_page.SKIP_REASON)
def test_chromium_flags_a_broken_page(tmp_path):
    """The console check below really sees page errors."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><p>x</p><script>throw new Error('boom-thrown')</script></body></html>")
    console = _chromium_screenshot(bad, tmp_path / "bad.png", tmp_path, size="400,300")
    assert "Uncaught Error: boom-thrown" in console


@pytest.mark.skipif(chromium_page.CHROMIUM is None, reason=chromium_page.SKIP_REASON)
def test_report_renders_in_chromium(real, tmp_path):
    png = tmp_path / "report.png"
    console = _chromium_screenshot(real["path"], png, tmp_path)
    assert not re.search(r"Uncaught|Error", console), console
    width, height, ink = _png_size_and_ink(png)
    assert (width, height) == (1400, 2000)
    assert png.stat().st_size > 50_000 and ink > 0.01, (png.stat().st_size, ink)


@pytest.mark.skipif(chromium_page.CHROMIUM is None, reason=chromium_page.SKIP_REASON)
def test_live_report_renders_in_chromium(live, tmp_path):
    """The page with the first screen and the live-metrics section draws without a page error."""
    path = tmp_path / "live.html"
    path.write_text(live["page"], encoding="utf-8")
    png = tmp_path / "live.png"
    console = _chromium_screenshot(path, png, tmp_path)
    assert not re.search(r"Uncaught|Error", console), console
    width, height, ink = _png_size_and_ink(png)
    assert (width, height) == (1400, 2000) and ink > 0.01
