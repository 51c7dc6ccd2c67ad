"""The CLI's start (issue 17): DuckDB tries `import pandas` for every bound parameter, and the CLI
answers those tries at once when pandas is not installed. That must not change what an import of
pandas does for anything else in the process (pyarrow's CSV reader, DuckDB)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import io, sys
from slowcard import cli
cli._no_pandas_search()
cli._no_pandas_search()  # twice: one finder
print(sum(isinstance(f, cli._AbsentModule) for f in sys.meta_path))
try:
    import pandas
    print("imported")
except ModuleNotFoundError as exc:
    print(type(exc).__name__, exc.name)
print("pandas" in sys.modules)
import pyarrow.csv
table = pyarrow.csv.read_csv(io.BytesIO(b"a,b\n1,x\n2,y\n"))
print(table.to_pylist())
import duckdb
print(duckdb.connect().execute("SELECT ?, list_sum(?)", ["v", [1, 2, 3]]).fetchall())
"""


@pytest.mark.skipif(
    importlib.util.find_spec("pandas") is not None, reason="pandas is installed: the CLI leaves it alone"
)
def test_absent_pandas_answered_at_once_and_pyarrow_and_duckdb_still_work():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.splitlines() == [
        "1",
        "ModuleNotFoundError pandas",
        "False",
        "[{'a': 1, 'b': 'x'}, {'a': 2, 'b': 'y'}]",
        "[('v', 6)]",
    ], out.stderr
