"""Write the committed example runs under testdata/ from the generators (deterministic).

    python tests/make_testdata.py            # rewrite them
A test (tests/test_testdata.py) checks that the committed files equal what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import synth_kineto  # noqa: E402

ROOT = Path(__file__).resolve().parents[1] / "testdata"

# name -> (writer, kwargs): small runs used by the README example and the tests.
EXAMPLES = {
    "ep4_token_skew": dict(scenario="token_skew", ranks=4, steps=4, layers=4, slow_rank=1, seed=0),
}


def write_all(root: Path = ROOT) -> list[Path]:
    paths = []
    for name, kwargs in EXAMPLES.items():
        paths += synth_kineto.write_ep_run(root / name, **kwargs)
    return paths


if __name__ == "__main__":
    for p in write_all():
        print(p)
