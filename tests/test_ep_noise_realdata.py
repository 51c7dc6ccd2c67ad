"""ep-slow-rank on the real runs under host noise (../shared/realdata/kineto_cpu_ep_noise): each
run gives the reading that the set's own README.md expects.

The expectations are read from that README's table (column "expected reading"), not written
here, so a run added to the set with its reading is checked too. The readings understood:
``PASS`` (optionally "at most a WARN; never a FAIL"), ``FAIL rank N <cause>`` (optionally
"; rank M not a FAIL"), and ``rank N named, <cause> (WARN or FAIL ...)``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import REALDATA  # noqa: E402

from slowcard import queries  # noqa: E402
from slowcard.ingest import ingest_paths  # noqa: E402

SET = REALDATA / "kineto_cpu_ep_noise"
CAUSES = ("token-skew", "slow-compute", "slow-comm")


def expected_readings(readme: Path) -> dict[str, dict]:
    """run -> {"statuses": allowed statuses, "rank": named rank or None, "cause": its cause,
    "not_fail": ranks that must not be a FAIL row}, from the README's markdown table."""
    lines = [line for line in readme.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    col = header.index("expected reading")
    out = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        run, text = cells[0], cells[col]
        exp = {"statuses": set(), "rank": None, "cause": None, "not_fail": set()}
        if text.startswith("PASS"):
            exp["statuses"] = {"PASS", "WARN"} if "at most a WARN" in text else {"PASS"}
        elif m := re.match(r"FAIL rank (\d+) ([a-z-]+)", text):
            exp.update(statuses={"FAIL"}, rank=int(m[1]), cause=m[2])
        elif m := re.match(r"rank (\d+) named, ([a-z-]+) \((WARN or FAIL|WARN|FAIL)", text):
            exp.update(statuses=set(m[3].split(" or ")), rank=int(m[1]), cause=m[2])
        else:
            raise AssertionError(f"{readme}: reading {text!r} of run {run!r} is not understood by this test")
        assert exp["cause"] in (None, *CAUSES), text
        exp["not_fail"] = {int(r) for r in re.findall(r"rank (\d+) not a FAIL", text)}
        out[run] = exp
    return out


@pytest.fixture(scope="module")
def noise_set(realdata, tmp_path_factory):
    if not SET.is_dir() or not (SET / "README.md").is_file():
        pytest.skip(f"{SET} (with its README.md) is absent")
    readings = expected_readings(SET / "README.md")
    runs = sorted(p.name for p in SET.iterdir() if p.is_dir() and p.name in readings)
    assert runs, f"no run folder of {SET} has a reading in its README"
    db = tmp_path_factory.mktemp("ep_noise") / "ep.duckdb"
    for run in runs:
        rep = ingest_paths(db, [SET / run], run=run)
        assert all(f.status == "ok" for f in rep.files), [(f.path, f.message) for f in rep.files]
    return db, {r: readings[r] for r in runs}


def test_every_run_gives_the_reading_its_readme_expects(noise_set):
    db, readings = noise_set
    con = queries.open_readonly(db)
    try:
        got = {run: queries.run_query(con, queries.load_catalog()["ep-slow-rank"], run) for run in readings}
    finally:
        con.close()
    wrong = []
    for run, exp in readings.items():
        res = got[run]
        findings = [(r["rank"], r["cause"], r["level"]) for r in res.rows]
        ok = res.status in exp["statuses"]
        if exp["rank"] is not None:
            # the named rank is the first (costliest) finding, with the expected cause
            ok = ok and findings[:1] and findings[0][:2] == (exp["rank"], exp["cause"])
        ok = ok and not any(rank in exp["not_fail"] and level == "FAIL" for rank, _, level in findings)
        if not ok:
            wrong.append(f"{run}: expected {exp}, got {res.status} {findings}: {res.summary}")
    assert not wrong, "\n".join(wrong)
    # every FAIL/WARN row carries its level and its cost, and the summary states the cost
    for res in got.values():
        for r in res.rows:
            assert r["level"] in ("FAIL", "WARN") and r["cost_ms"] >= 0 and r["cost_pct"] >= 0, r
        if res.rows:
            assert "% of the profiled time" in res.summary and " ms = " in res.summary


def test_a_single_rank_of_a_real_run_is_a_skip(realdata, tmp_path):
    """One rank's trace alone (any run of the set) can neither pass nor fail."""
    if not SET.is_dir():
        pytest.skip(f"{SET} is absent")
    run_dir = next(p for p in sorted(SET.iterdir()) if p.is_dir())
    one = sorted(run_dir.iterdir())[0]
    db = tmp_path / "one.duckdb"
    rep = ingest_paths(db, [one], run="one")
    assert [f.status for f in rep.files] == ["ok"]
    con = queries.open_readonly(db)
    try:
        res = queries.run_query(con, queries.load_catalog()["ep-slow-rank"], "one")
    finally:
        con.close()
    assert res.status == "SKIP" and "1 rank(s) with MoE layers" in res.summary, res.summary
