"""`--format json` is the machine contract: its shape (which keys, nested how) must not change
when the human screens do (issue 32). The shape was recorded from the JSON before the screens
were rebuilt; this test compares the keys of today's output with it.

    python tests/test_json_shape.py --update     # only when the contract itself changes

The shape is the key tree with scalars as "value"; query-specific maps (a result's ``rows``,
``params``, a finding's ``subject``, a why part's ``rows``) are opaque, since a query's columns
and parameters are the query's own (versioned in its file), not the envelope's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script: this checkout's slowcard

from typer.testing import CliRunner  # noqa: E402

from slowcard.cli import app  # noqa: E402

ROOT = HERE.parent
SHAPE = ROOT / "testdata" / "golden" / "json_shape.json"
OPAQUE = {"rows", "params", "subject"}
# (name, command line after the database) whose JSON is pinned; every example in testdata/.
COMMANDS = {
    "diagnose ep4_token_skew": ["diagnose", str(ROOT / "testdata" / "ep4_token_skew"), "--format", "json"],
    "diagnose service_dp4_request_skew": [
        "diagnose",
        str(ROOT / "testdata" / "service_dp4_request_skew"),
        "--format",
        "json",
    ],
    "diagnose ops": ["diagnose", str(ROOT / "testdata" / "ops"), "--format", "json"],
}
QUERIES = ("ep-slow-rank", "moe-breakdown", "straggler-rank", "why-op-diff")


def shape(v, key: str | None = None):
    """The key tree of a JSON value: dicts keep their keys, lists the merged shape of their items."""
    if key in OPAQUE:
        return "object" if isinstance(v, dict) else "list" if isinstance(v, list) else "value"
    if isinstance(v, dict):
        return {k: shape(x, k) for k, x in sorted(v.items())}
    if isinstance(v, list):
        merged: dict = {}
        scalars = False
        for item in v:
            s = shape(item, key)
            if isinstance(s, dict):
                _merge(merged, s)
            else:
                scalars = True
        if merged:
            return [merged]
        return ["value"] if scalars else []
    return "value"


def _merge(into: dict, s: dict) -> None:
    for k, x in s.items():
        if isinstance(x, dict) and isinstance(into.get(k), dict):
            _merge(into[k], x)
        elif isinstance(x, list) and x and isinstance(into.get(k), list) and into[k]:
            if isinstance(x[0], dict) and isinstance(into[k][0], dict):
                _merge(into[k][0], x[0])
        elif k not in into or into[k] in ("value", [], None):
            into[k] = x


def current(tmp: Path) -> dict:
    runner = CliRunner()
    out = {}
    for name, argv in COMMANDS.items():
        res = runner.invoke(app, [*argv, "--db", str(tmp / "ep.duckdb" if "ep4" in name else tmp / f"{name[-3:]}.db")])
        assert res.exit_code in (0, 1), (name, res.output)
        out[name] = shape(json.loads(res.stdout))
    for q in QUERIES:
        res = runner.invoke(app, ["query", q, "--db", str(tmp / "ep.duckdb"), "--format", "json"])
        assert res.exit_code in (0, 1), (q, res.output)
        out[f"query {q}"] = shape(json.loads(res.stdout))
    return out


def test_json_keys_are_those_recorded_before_the_screens_changed(tmp_path):
    want = json.loads(SHAPE.read_text(encoding="utf-8"))
    got = current(tmp_path)
    assert list(got) == list(want)
    for name in want:
        assert got[name] == want[name], f"the JSON of `{name}` changed shape"


def test_shape_sees_a_renamed_or_dropped_key():
    """The comparison can fail: a key renamed deep inside, or a list item's key dropped."""
    doc = {"conclusion": {"cards": [{"card": "rank 1", "cost_ms": 1.0}]}, "results": [{"rows": [{"a": 1}]}]}
    renamed = {"conclusion": {"cards": [{"card": "rank 1", "cost": 1.0}]}, "results": [{"rows": [{"b": 1}]}]}
    assert shape(doc) != shape(renamed)
    # a query's own columns are not the envelope: rows may differ
    other_rows = {"conclusion": {"cards": [{"card": "rank 2", "cost_ms": None}]}, "results": [{"rows": [{"b": 1}]}]}
    assert shape(doc) == shape(other_rows)


if __name__ == "__main__":
    if "--update" in sys.argv:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            SHAPE.write_text(json.dumps(current(Path(d)), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {SHAPE.relative_to(ROOT)}")
    else:
        print(__doc__)
