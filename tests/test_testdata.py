"""The committed example runs equal what their generator writes today."""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import make_testdata  # noqa: E402


def test_committed_examples_match_generator(tmp_path):
    fresh = make_testdata.write_all(tmp_path)
    assert fresh
    for p in fresh:
        committed = make_testdata.ROOT / p.relative_to(tmp_path)
        assert committed.exists(), f"{committed} missing: run python tests/make_testdata.py"
        read = gzip.decompress if p.suffix == ".gz" else (lambda b: b)
        assert read(committed.read_bytes()) == read(p.read_bytes()), (
            f"{committed} differs from its generator: run python tests/make_testdata.py"
        )
