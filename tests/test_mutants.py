"""bench/mutants.py's list stays usable: every mutant applies to the tree exactly once, changes
something, and names covering tests that exist. (Running the mutants takes ~15 minutes: that is
`python bench/mutants.py`, not the suite.) When a change moves the text a mutant edits, update
the mutant with it, so the next change to that guard can still show that a test holds it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _mutants():
    if "bench_mutants" not in sys.modules:  # (its dataclasses look their module up by name)
        spec = importlib.util.spec_from_file_location("bench_mutants", REPO / "bench" / "mutants.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["bench_mutants"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["bench_mutants"]


def test_every_mutant_applies_once_and_names_existing_tests():
    mod = _mutants()
    assert mod.check(mod.MUTANTS) == []
    assert len(mod.MUTANTS) >= 60


def test_the_check_sees_a_mutant_that_no_longer_applies(tmp_path):
    mod = _mutants()
    m = mod.MUTANTS[0]
    (tmp_path / Path(m.path).parent).mkdir(parents=True)
    (tmp_path / m.path).write_text("text without the guard\n")
    for t in m.tests:
        (tmp_path / t).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / t).write_text("")
    assert mod.check([m], root=tmp_path) == [f"{m.name}: its text occurs 0 times in {m.path} (must be exactly once)"]
    assert mod.check([m, m], root=tmp_path)[0] == f"{m.name}: duplicate mutant name"


def test_the_judging_run_leaves_out_the_fingerprint_check_and_the_goldens():
    mod = _mutants()
    assert "tests/test_catalog.py::test_versions_change_with_fingerprints" in mod.NEVER_JUDGE
    assert "tests/test_golden.py" in mod.NEVER_JUDGE
    assert not any("test_golden" in t or "test_versions_change" in t for m in mod.MUTANTS for t in m.tests)
