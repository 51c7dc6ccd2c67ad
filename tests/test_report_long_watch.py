"""The report of a long watch (issue 47): a day of one-second windows (86,400 x 8 DP domains +
the instance, tests/synth_watch_day.py) is drawn from at most ~1,500 merged points per line
(metric-timeline v2), its 30 alert windows exact; the page stays under 10 MB and every figure
draws in headless Chromium (skipped without it; the open time is measured by
bench/bench_report.py, not bounded here: no wall-clock bounds in tests). A short watch is
drawn window by window, as before."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from chromium_page import CHROMIUM, SKIP_REASON, open_page  # noqa: E402
from synth_watch_day import T0_NS, write_day  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.diagnosis import diagnose  # noqa: E402

CATALOG = queries.load_catalog()
MAX_POINTS = next(p.default for p in CATALOG["metric-timeline"].params if p.name == "max_points")
ALERT = (43_200, 43_230)  # the alert windows: seconds 43,200 to 43,229 of the day


def _timeline(con, run, **params):
    return queries.run_query(con, CATALOG["metric-timeline"], run, params or None)


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    pytest.importorskip("plotly")
    from slowcard.renderers import html as report

    d = tmp_path_factory.mktemp("day")
    db = d / "day.duckdb"
    meta = write_day(db, windows=86_400, alert=ALERT)
    con = queries.open_readonly(db)
    try:
        diag = diagnose(con, "day", CATALOG)
        page = report.build_report(con, "day", dict(diag.results), conclusion=diag.conclusion, catalog=CATALOG)
        stored = dict(
            con.execute(
                "SELECT (ts_ns - ?) // 1000000000, requests_per_s FROM metric_windows WHERE dp_rank = 5", [T0_NS]
            ).fetchall()
        )
    finally:
        con.close()
    path = d / "day.html"
    path.write_text(page, encoding="utf-8")
    return {"db": db, "page": page, "path": path, "meta": meta, "results": diag.results, "stored": stored, "dir": d}


def test_a_day_of_windows_is_drawn_from_merged_points_with_the_alert_exact(day):
    from slowcard.renderers.html import figure_data

    page = day["page"]
    assert len(page.encode("utf-8")) < 10_000_000
    (fig,) = [f for f in figure_data(page) if f["query"].startswith("metric-timeline@v")]
    lines = [t for t in fig["data"] if t["type"] == "scatter"]
    assert len(lines) == 8 * 3 + 2
    n_points = {len(t["x"]) for t in lines}
    assert n_points == {MAX_POINTS + ALERT[1] - ALERT[0]}, n_points  # 1,500 slices + 30 alert windows, of 86,400
    assert {t["mode"] for t in lines} == {"lines"}  # no markers on so many points
    # the alert windows: each drawn at its own second, with its own value (DP 5 at 5x its rate)
    hot = next(t for t in lines if t.get("legendgroup") == "dp5")
    at = dict(zip(hot["x"], hot["y"]))
    for s in range(*ALERT):
        assert at[float(s)] == pytest.approx(day["stored"][s], abs=1e-3)
    # the quiet point just before them ends at the last quiet second and merges many windows
    rows = [r for r in day["results"]["metric-timeline"].rows if r["dp_rank"] == 5]
    before = max((r for r in rows if r["since_start_s"] < ALERT[0]), key=lambda r: r["since_start_s"])
    assert before["since_start_s"] == ALERT[0] - 1 and before["windows"] > 1 and before["failing"] is None
    assert sum(r["windows"] for r in rows) == 86_400  # every window is in exactly one point
    # the alert period shaded exactly: from the start of its first window to the end of its last
    reds = {(s["x0"], s["x1"]) for s in fig["layout"]["shapes"] if s.get("fillcolor") == "#d62728"}
    assert reds == {(ALERT[0] - 1.0, ALERT[1] - 1.0)}
    assert re.search(r"86400 window\(s\) drawn as 1530 points \(quiet windows merged", page)


def test_a_short_watch_is_drawn_window_by_window(tmp_path):
    db = tmp_path / "short.duckdb"
    write_day(db, run="short", windows=1_000, alert=(500, 510))
    write_day(db, run="mid", windows=1_000, alert=(505, 512))  # an alert across two slices
    con = queries.open_readonly(db)
    try:
        res = _timeline(con, "short")
        merged = _timeline(con, "short", max_points=100)
        mid = _timeline(con, "mid", max_points=100)
    finally:
        con.close()
    # quiet windows are never merged across an alert: slice 50 splits into 500-504 and the
    # alert, slice 51 into the alert and 512-519
    mid_inst = [(r["since_start_s"], r["windows"]) for r in mid.rows if r["dp_rank"] is None]
    assert mid_inst[49:60] == [(499.0, 10), (504.0, 5)] + [(float(s), 1) for s in range(505, 512)] + [
        (519.0, 8),
        (529.0, 10),
    ]
    # 1,000 windows <= max_points: every window is a point of its own, as stored
    assert len(res.rows) == 1_000 * 9 and {r["windows"] for r in res.rows} == {1}
    # with max_points 100 the quiet windows merge into slices of 10; the alert's 10 windows (all of
    # slice 50) stay whole, so 99 quiet points and 10 alert points
    inst = [r for r in merged.rows if r["dp_rank"] is None]
    alert = [r for r in inst if r["failing"]]
    assert [r["since_start_s"] for r in alert] == [float(s) for s in range(500, 510)]
    assert {r["windows"] for r in alert} == {1}
    assert len(inst) == 99 + 10 and sum(r["windows"] for r in inst) == 1_000
    assert {r["windows"] for r in inst if not r["failing"]} == {10}
    # rates are the time-weighted mean of the merged windows, gauges their peak
    dp0 = [r for r in merged.rows if r["dp_rank"] == 0]
    raw = {r["since_start_s"]: r for r in res.rows if r["dp_rank"] == 0}
    first = dp0[0]
    parts = [raw[float(s)] for s in range(int(first["windows"]))]
    assert first["requests_per_s"] == pytest.approx(sum(p["requests_per_s"] for p in parts) / len(parts), abs=2e-3)
    assert first["waiting"] == max(p["waiting"] for p in parts)


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_the_day_report_draws_in_chromium(day):
    from slowcard.renderers.html import figure_data

    got = open_page(day["path"], day["dir"] / "profile")
    assert not re.search(r"Uncaught|Error", got["console"]), got["console"]
    assert got["figures_drawn"] == len(figure_data(day["page"])) >= 1
    # every line drawn: the 26 traces of the timeline are in the drawn SVG
    assert got["dom"].count('class="js-line"') >= 26
