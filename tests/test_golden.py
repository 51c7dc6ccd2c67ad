"""Golden outputs of `slowcard diagnose --format json`: the verdicts and rows of every query on
the committed examples, on deterministic synthetic runs (expert load + traces) and on the real
runs in ../shared/realdata (skipped when absent).

The goldens were written before the query knowledge moved from Python into the query headers
(issue 12), so they pin "same verdicts and outputs as before". Other work legitimately changes
them (new readers, recalibrated verdicts, version bumps); then rewrite them and review the diff:

    python tests/test_golden.py --update            # every case
    python tests/test_golden.py --update ep4        # the cases whose name contains "ep4"

Only the stable parts are compared: the run, its status and conclusion, and per query its name,
version, status, summary, columns, rows, parameters and rule. Paths are written relative to the
case's input folder; floats are rounded to 9 significant digits (summation order may differ);
row ids (source_id, summary_id) read "<row id>": files ingested side by side get their ids in
the order they finish, so the same run can number its sources differently (real_ascend did).
"""

from __future__ import annotations

import json
import math
import re
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # run as a script: this checkout's slowcard, not an installed one
import synth_experts  # noqa: E402
import synth_kineto  # noqa: E402

from slowcard.cli import app  # noqa: E402

ROOT = HERE.parent
TESTDATA = ROOT / "testdata"
GOLDEN = TESTDATA / "golden" / "diagnose"
REALDATA = ROOT.parent / "shared" / "realdata"


def _synth_chain(experts: str | None, trace: str | None):
    def build(d: Path) -> Path:
        if experts:
            synth_experts.write_scenario(experts, d / "experts")
        if trace:
            synth_kineto.write_ep_run(d / "trace", scenario=trace, steps=3, layers=3)
        return d

    return build


# case name -> ("testdata" | "realdata" | "synth", relative path or builder)
CASES = {
    "ep4_token_skew": ("testdata", "ep4_token_skew"),
    "service_dp4_request_skew": ("testdata", "service_dp4_request_skew"),
    "ops": ("testdata", "ops"),
    "synth_concentrated_token_skew": ("synth", _synth_chain("concentrated", "token_skew")),
    "synth_spread_balanced": ("synth", _synth_chain("spread", "balanced")),
    "synth_slow_device_slow_compute": ("synth", _synth_chain("slow_device", "slow_compute")),
    "synth_eplb_fails": ("synth", _synth_chain("eplb_fails", None)),
    "synth_eplb_works": ("synth", _synth_chain("eplb_works", None)),
    "real_kineto_cpu_ep4_hot1": ("realdata", "kineto_cpu_ep4_hot1"),
    "real_ascend": ("realdata", "ascend"),
    "real_ep_noise_hot_r5_w6": ("realdata", "kineto_cpu_ep_noise/hot_r5_w6"),
    "real_ep_noise_slow_r3_w4": ("realdata", "kineto_cpu_ep_noise/slow_r3_w4"),
    "real_ep_noise_bal_w4": ("realdata", "kineto_cpu_ep_noise/bal_w4"),
    "real_ep_noise_bal_w6": ("realdata", "kineto_cpu_ep_noise/bal_w6"),
    "real_ep_noise_mild15_r0_w4": ("realdata", "kineto_cpu_ep_noise/mild15_r0_w4"),
    "real_ep_noise_mild25_r2_w6": ("realdata", "kineto_cpu_ep_noise/mild25_r2_w6"),
}

RESULT_KEYS = ("query", "version", "status", "summary", "columns", "rows", "params", "rule")


def _round(v):
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return float(f"{v:.9g}")
    if isinstance(v, dict):
        return {str(k): _round(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_round(x) for x in v]
    return v


ROW_ID = "<row id>"
_ROW_ID_VALUE = re.compile(r'"(source_id|summary_id)": (\d+)')
_ROW_ID_TEXT = re.compile(r"\b(source_id|summary_id)=(\d+)")


def mask_row_ids(doc: dict) -> dict:
    """``doc`` with every row id value (a source_id / summary_id column, and ``source_id=N`` in
    summary and evidence text) replaced by ROW_ID: ids follow the order files finish ingesting."""
    text = json.dumps(doc, ensure_ascii=False)
    text = _ROW_ID_VALUE.sub(lambda m: f'"{m[1]}": "{ROW_ID}"', text)
    return json.loads(_ROW_ID_TEXT.sub(lambda m: f"{m[1]}={ROW_ID}", text))


def stable(doc: dict, base: Path) -> dict:
    """The parts of a diagnosis that must not move by accident (no timings, no absolute paths,
    no row ids)."""
    text = json.dumps(doc, ensure_ascii=False).replace(str(base) + "/", "").replace(str(base), ".")
    doc = mask_row_ids(json.loads(text))
    return _round(
        {
            "run": doc["run"],
            "status": doc["status"],
            "conclusion": doc["conclusion"],
            "results": {r["query"]: {k: r.get(k) for k in RESULT_KEYS if k != "query"} for r in doc["results"]},
        }
    )


def _input(case: str, tmp: Path) -> Path | None:
    kind, what = CASES[case]
    if kind == "testdata":
        return TESTDATA / what
    if kind == "realdata":
        return REALDATA / what if (REALDATA / what).is_dir() else None
    return what(tmp / "in")


def diagnose_json(case: str, tmp: Path) -> dict | None:
    """Ingest the case's input and diagnose it through the CLI; None when its input is absent."""
    from typer.testing import CliRunner

    src = _input(case, tmp)
    if src is None:
        return None
    res = CliRunner().invoke(
        app, ["diagnose", str(src), "--db", str(tmp / "g.duckdb"), "--run", case, "--format", "json"]
    )
    assert res.exit_code in (0, 1), (res.exit_code, res.output, res.exception)
    start = res.stdout.index("{")  # ingest notes (salvaged files) go to stderr, but be safe
    return stable(json.loads(res.stdout[start:]), src)


def golden_path(case: str) -> Path:
    return GOLDEN / f"{case}.json"


def dump(doc: dict) -> str:
    """JSON with one line per query field and per row, so a changed row is a one-line diff."""

    def j(v):
        return json.dumps(v, ensure_ascii=False)

    out = [
        "{",
        f' "run": {j(doc["run"])},',
        f' "status": {j(doc["status"])},',
        ' "conclusion": ' + json.dumps(doc["conclusion"], indent=1, ensure_ascii=False).replace("\n", "\n ") + ",",
        ' "results": {',
    ]
    names = list(doc["results"])
    for i, name in enumerate(names):
        res = doc["results"][name]
        out.append(f"  {j(name)}: {{")
        out += [f"   {j(k)}: {j(v)}," for k, v in res.items() if k != "rows"]
        rows = res["rows"]
        out.append('   "rows": [' + ("" if rows else "]"))
        out += [f"    {j(r)}{',' if n < len(rows) - 1 else ''}" for n, r in enumerate(rows)]
        if rows:
            out.append("   ]")
        out.append("  }" + ("," if i < len(names) - 1 else ""))
    out += [" }", "}"]
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("case", list(CASES))
def test_diagnose_matches_golden(case, tmp_path):
    if CASES[case][0] == "realdata" and not (REALDATA / CASES[case][1]).is_dir():
        pytest.skip(f"real profiler data not found at {REALDATA / CASES[case][1]}")
    path = golden_path(case)
    assert path.exists(), f"{path} is missing; run `python tests/test_golden.py --update {case}`"
    got = diagnose_json(case, tmp_path)
    want = mask_row_ids(json.loads(path.read_text(encoding="utf-8")))  # (goldens written before ids were masked)
    assert got["status"] == want["status"]
    assert got["conclusion"] == want["conclusion"]
    assert list(got["results"]) == list(want["results"]), "queries (or their order) changed"
    for name, res in want["results"].items():
        assert got["results"][name] == res, (
            f"{name} changed on {case}; if intended, run `python tests/test_golden.py --update {case}`"
        )


def test_row_ids_do_not_change_a_golden():
    """The same diagnosis with its sources numbered in another order compares equal."""
    doc = {
        "conclusion": {"evidence": "gap_pct=36.4, source_id=2"},
        "results": {"q": {"rows": [{"rank": 1, "source_id": 2, "summary_id": 0}, {"rank": 5, "source_id": 3}]}},
    }
    other = json.loads(
        json.dumps(doc).replace('"source_id": 2', '"source_id": 7').replace("source_id=2", "source_id=7")
    )
    assert other != doc and mask_row_ids(other) == mask_row_ids(doc)
    assert mask_row_ids(doc)["results"]["q"]["rows"][0] == {"rank": 1, "source_id": ROW_ID, "summary_id": ROW_ID}


def update(patterns: list[str]) -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        if patterns and not any(p in case for p in patterns):
            continue
        with tempfile.TemporaryDirectory() as d:
            doc = diagnose_json(case, Path(d))
        if doc is None:
            print(f"skipped {case}: no input")
            continue
        golden_path(case).write_text(dump(doc), encoding="utf-8")
        print(f"wrote {golden_path(case).relative_to(ROOT)}: {doc['status']}, {doc['conclusion'].get('headline')}")


if __name__ == "__main__":
    if "--update" in sys.argv:
        update([a for a in sys.argv[1:] if a != "--update"])
    else:
        print(__doc__)
