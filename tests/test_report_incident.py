"""The report of a watched incident (issue 47): alert, capture and verdict in one page.

A real `slowcard watch --capture vllm` against tests/vllm_sim.py (8 DP engines, engine 5 hot;
at the profiler stop the simulator writes one Kineto trace per engine, token_skew on the hot
one, so the capture run's ep-slow-rank names rank 5), then `slowcard report` of the watched run:
the capture's verdict under the alerted domain's "why" with a link to the capture run's own
section in the same page; PASS / INFO / SKIP folded in the verdict table as the first screen
folds them; one colour per DP domain / rank across every figure, the slow card marked, the
instance lines grey and dashed. Then the page in headless Chromium (skipped without it).
The joining rules (which capture belongs to which card) are checked on their own, with near misses.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))

from chromium_page import CHROMIUM, SKIP_REASON, open_page  # noqa: E402
from sim_procs import Sims  # noqa: E402

from slowcard import incident, queries  # noqa: E402
from slowcard.renderers import html as report  # noqa: E402

pytest.importorskip("plotly")
HOT = 5


@pytest.fixture(scope="module")
def incident_page(tmp_path_factory):
    d = tmp_path_factory.mktemp("incident")
    prof, db = d / "prof", d / "live.duckdb"
    sims = Sims(duration=30.0)
    try:
        port = sims.start(
            "--engines", "0,1,2,3,4,5,6,7", "--hot-engine", str(HOT), "--hot-from", "1.5", "--profile-dir", str(prof)
        )
        watch = subprocess.run(
            [sys.executable, "-m", "slowcard", "watch", "--scrape", f"http://127.0.0.1:{port}/metrics",
             "--interval", "0.5s", "--duration", "6s", "--db", str(db), "--run", "live", "--capture", "vllm",
             "--capture-dir", str(prof), "--capture-seconds", "1s"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        sims.close()
    assert watch.returncode == 1, watch.stderr
    assert f"CAPTURE 1 for dp-metrics-imbalance (DP domain {HOT}" in watch.stdout, watch.stdout[-2000:]
    out = d / "live.html"
    r = subprocess.run(
        [sys.executable, "-m", "slowcard", "report", "--db", str(db), "--run", "live", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return {"db": db, "path": out, "page": out.read_text(encoding="utf-8"), "dir": d}


def _between(page: str, start: str, end: str = "<h2") -> str:
    i = page.index(start)
    return page[i : page.index(end, i + len(start))]


def test_the_alerted_domains_why_shows_the_captures_verdict(incident_page):
    page = incident_page["page"]
    ep = queries.load_catalog()["ep-slow-rank"]
    why = _between(page, f'<h2 class="why">Why is DP domain {HOT} slow?')
    join = why[why.index('class="capture-join"') :]
    # the capture's card, cause, cost, verdict and its match with the alert, linked to its section
    assert re.search(
        rf"<b>rank {HOT}</b> — token-skew costs [\d.]+ ms \([\d.]+ %\) <code class=\"from\">ep-slow-rank@v{ep.version}",
        join,
    ), join[:800]
    assert f"<i>the alerted DP domain {HOT}</i>" in join
    assert '<a class="capture-link" href="#capture-run-1">run capture-1: its diagnosis' in join
    # the old dead end is gone: the note now points at the capture
    assert "ingest the profiler traces of its ranks" not in why
    assert f"this run holds no trace of DP domain {HOT}&#x27;s ranks; the capture above does" in why
    # the first screen carries the same line under the card's why, and no dead end either
    top = page[page.index('<div class="conclusion') : page.index('<h2 class="why">')]
    assert f"<b>rank {HOT}</b> — token-skew" in top and "ingest the profiler traces" not in top
    # the capture run's own section is in the page, where the link points, with its own diagnosis
    sec = page[page.index('<section class="capture-run" id="capture-run-1">') :]
    sec = sec[: sec.index("</section>")]
    assert "Capture 1: run <code>capture-1</code>" in sec
    assert f"Slow card: rank {HOT} — token-skew" in sec and f'<h2 class="why">Why is rank {HOT} slow?' in sec
    assert "<h2>MoE time per rank</h2>" in sec and "Live metrics" not in sec
    # the captures table links the run to that section
    assert '<td><a href="#capture-run-1">capture-1</a></td>' in _between(page, "<h2>Captures on alert</h2>")


def test_the_timeline_marks_the_capture_with_what_it_found(incident_page):
    page = incident_page["page"]
    (timeline,) = [f for f in report.figure_data(page) if f["query"].startswith("metric-timeline")]
    greens = [s for s in timeline["layout"]["shapes"] if s.get("fillcolor") == "#2ca02c"]
    # one capture: one window, shaded on each of the 4 rows
    assert len(greens) == 4 and len({(s["x0"], s["x1"]) for s in greens}) == 1
    assert 0.9 < greens[0]["x1"] - greens[0]["x0"] < 1.5
    labels = [a["text"] for a in timeline["layout"]["annotations"] if a.get("font", {}).get("color") == "#2ca02c"]
    assert labels == [f"capture 1: rank {HOT} token-skew"]
    note = _between(page, "<h2>Live metrics</h2>", '<div class="fig"')
    assert f'<a href="#capture-run-1">capture 1: rank {HOT} token-skew</a>' in note


def test_the_verdict_table_folds_pass_info_and_skip_by_missing_input(incident_page):
    page = incident_page["page"]
    verdicts = page[page.index("<h2>Verdicts</h2>") : page.index('<section class="capture-run"')]
    table = verdicts[: verdicts.index("</table>")]
    # the table lists only what flags: FAIL, WARN, ERROR
    assert "dp-metrics-imbalance@v" in table and "st-skip" not in table and "st-pass" not in table
    groups = re.findall(
        r'<details class="fold fold-skip"><summary><span class="st st-skip">SKIP</span> (\d+), missing input: '
        r"<b>([^<]+)</b></summary>(.*?)</details>",
        verdicts,
        flags=re.S,
    )
    needs = {need: int(n) for n, need, _ in groups}
    assert "multi-rank traces" in needs and "MoE traces" in needs, needs
    for n, _, body in groups:  # each group holds its queries, each with its own SKIP reason
        assert body.count("<tr>") == int(n) and body.count("st-skip") == int(n)
    assert "requires _layer_collectives: no rows for run &#x27;live&#x27;" in verdicts
    total = int(re.search(r"SKIP=(\d+)", page).group(1))
    assert sum(needs.values()) == total  # every SKIP is in exactly one group
    assert re.search(
        r'<details class="fold fold-info"><summary><span class="st st-info">INFO</span> 1 report', verdicts
    )


def test_one_colour_per_domain_and_rank_across_every_figure(incident_page):
    figs = report.figure_data(incident_page["page"])
    colours: dict[int, set] = {}
    widths: dict[int, set] = {}
    for f in figs:
        for t in f["data"]:
            m = re.fullmatch(r"dp(\d+)", t.get("legendgroup") or "")
            if m:
                colours.setdefault(int(m.group(1)), set()).add(t["line"]["color"])
                widths.setdefault(int(m.group(1)), set()).add(t["line"]["width"])
        for axis in [v for k, v in f["layout"].items() if k.startswith(("xaxis", "yaxis"))]:
            for tick in axis.get("ticktext") or []:  # rank labels of the capture run's figures
                m = re.search(r'color:(#[0-9a-f]{6})">(?:<b>)?rank (\d+)', tick)
                if m:
                    colours.setdefault(int(m.group(2)), set()).add(m.group(1))
    assert sorted(colours) == list(range(8))
    assert all(len(c) == 1 for c in colours.values()), colours  # DP n and rank n: one colour everywhere
    assert len({next(iter(c)) for c in colours.values()}) == 8  # and no two alike
    # the slow card stands out: DP 5 thick and named so (first in the legend), the others thin
    assert widths[HOT] == {report.SLOW_WIDTH} and all(widths[d] == {report.LINE_WIDTH} for d in widths if d != HOT)
    (timeline,) = [f for f in figs if f["query"].startswith("metric-timeline")]
    hot = [t for t in timeline["data"] if t.get("legendgroup") == f"dp{HOT}" and t.get("showlegend")]
    assert hot[0]["name"] == f"DP {HOT} ◀ slow card (request-skew)" and hot[0]["legendrank"] == 1
    # the instance lines: neutral greys, dashed
    inst = [t for t in timeline["data"] if t["name"].startswith("instance")]
    assert {t["line"]["dash"] for t in inst} == {"dash", "dot"}
    assert {t["line"]["color"] for t in inst} == {"#7f7f7f", "#404040"}
    assert not {t["line"]["color"] for t in inst} & set(report.PALETTE)
    # the capture run's MoE figure marks the slow rank on its axis
    moe = [f for f in figs if f["query"].startswith("moe-breakdown")]
    ticks = moe[0]["layout"]["xaxis"]["ticktext"]
    assert [t for t in ticks if "slow card" in t] == [
        f'<span style="color:{report.colour(HOT)}"><b>rank {HOT} ◀ slow card (token-skew)</b></span>'
    ]


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_the_incident_page_draws_in_chromium(incident_page):
    got = open_page(incident_page["path"], incident_page["dir"] / "profile")
    assert not re.search(r"Uncaught|Error", got["console"]), got["console"]
    n_figs = len(report.figure_data(incident_page["page"]))
    assert got["figures_drawn"] == n_figs and n_figs >= 3  # the timeline and the capture run's figures
    dom = got["dom"]
    # what the browser drew: the slow card marked in the timeline's legend and on the capture's axis
    assert re.search(rf'class="legendtext"[^>]*>DP {HOT} ◀ slow card \(request-skew\)<', dom)
    assert f"rank {HOT} ◀ slow card (token-skew)" in dom
    # the capture's verdict under the alerted domain's why, and the folded SKIP groups, as drawn
    why = _between(dom, f'<h2 class="why">Why is DP domain {HOT} slow?')
    assert "capture-verdict" in why and f"<b>rank {HOT}</b> — token-skew" in why
    assert len(re.findall(r'<details class="fold fold-skip">', dom)) >= 2


# ---------------------------------------------------------------- the joining rules


def _cap(capture_id, subject, status="ok", run=None, watch_run="live", matches=True):
    return incident.Capture(
        {
            "capture_id": capture_id,
            "watch_run": watch_run,
            "subject": subject,
            "status": status,
            "run": run or f"capture-{capture_id}",
            "matches_alert": matches,
            "reason": None if status == "ok" else "no new file in /p within 120 s after the stop",
        }
    )


def test_a_capture_joins_only_the_card_its_alert_named():
    story = [
        _cap(1, "DP domain 5"),
        _cap(2, "DP domain 3"),  # another domain's alert
        _cap(3, "DP domain 5", status="timeout", run=None),
        _cap(4, "DP domain 5", watch_run="other"),  # another watched run's alert
        _cap(5, "expert 5, layer 0"),
    ]
    story[2].row["run"] = None
    joined = incident.by_card(story, ["DP domain 5", "rank 5"], "live")
    assert [c.capture_id for c in joined["DP domain 5"]] == [1, 3] and "rank 5" not in joined
    assert incident.by_card(story, ["DP domain 50"], "live") == {}  # a prefix is not the card


def test_capture_line_says_how_it_matches_and_why_it_failed():
    ok, other, unknown = (
        _cap(1, "DP domain 5"),
        _cap(2, "DP domain 5", matches=False),
        _cap(3, "DP domain 5", matches=None),
    )
    assert ok.match_text() == "the alerted DP domain 5"
    assert other.match_text() == "not the alerted DP domain 5: another card"
    assert unknown.match_text() == "cannot tell whether it is DP domain 5"
    failed = _cap(4, "DP domain 5", status="timeout")
    line = report._capture_line(failed)
    assert "timeout: no new file in /p within 120 s" in line and "href" not in line  # no run: no link
    line = report._capture_line(ok)  # not diagnosed here (c.diag None): the headline, no link
    assert "href" not in line and "<i>the alerted DP domain 5</i>" in line


def test_story_diagnoses_only_the_newest_captures_that_have_a_run(tmp_path):
    """Each diagnosed capture is a whole diagnosis in the page: the newest ``most`` that ended ok
    with a run of their own; a failed one, one of another watched run, and the run itself, none."""
    from slowcard import store

    db = tmp_path / "caps.duckdb"
    con = store.open_db(db)
    try:
        store.ensure_run(con, "live", None)
        for cid, status, run, watch_run in (
            (1, "ok", "capture-1", "live"),
            (2, "ok", "capture-2", "live"),
            (3, "timeout", None, "live"),
            (4, "ok", "capture-4", "live"),
            (5, "ok", "capture-5", "other"),
        ):
            con.execute(
                "INSERT INTO captures (capture_id, watch_run, query, subject, backend, status, run) "
                "VALUES (?, ?, 'dp-metrics-imbalance', 'DP domain 1', 'vllm', ?, ?)",
                [cid, watch_run, status, run],
            )
        got = incident.story(con, "live", most=2)
        mine = incident.story(con, "capture-4")  # a capture run's own page: its row, not diagnosed again
    finally:
        con.close()
    assert [c.capture_id for c in got] == [1, 2, 3, 4]
    assert [c.capture_id for c in got if c.diag is not None] == [2, 4]
    assert got[1].diag.run == "capture-2" and got[1].anchor == "capture-run-2"
    assert [(c.capture_id, c.diag) for c in mine] == [(4, None)]
