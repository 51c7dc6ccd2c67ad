"""`slowcard ingest` as a user runs it: the bad-input matrix of testdata/bad/EXPECTED.md, and the
exit-code contract (0 all ingested, 1 some failed / salvaged / truncated, 2 usage error)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from slowcard.cli import app

BAD = Path(__file__).resolve().parents[1] / "testdata" / "bad"
ROW = re.compile(r"^\|\s*([^|`\s]+)\s*\|\s*(\d)\s*\|\s*(\w+)\s*\|(.*)\|\s*$")


def expected_rows() -> list[tuple[str, int, str, list[str]]]:
    """(file, exit code, status, phrases) for every row of the EXPECTED.md table."""
    rows = []
    for line in (BAD / "EXPECTED.md").read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m and m.group(1) != "file":
            rows.append((m.group(1), int(m.group(2)), m.group(3), re.findall(r"`([^`]+)`", m.group(4))))
    return rows


ROWS = expected_rows()


def run_cli(*args: str):
    result = CliRunner().invoke(app, ["ingest", *args])
    # a crash inside the command would surface as an exception here, not as an exit code
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.stdout + result.stderr
    return result


def test_matrix_covers_every_trace_file():
    files = {p.name for p in BAD.iterdir() if p.name.endswith((".json", ".json.gz"))}
    listed = {r[0] for r in ROWS}
    assert len(ROWS) >= 18
    assert files <= listed, f"files without a row in EXPECTED.md: {sorted(files - listed)}"
    assert {f for f in listed if f.endswith((".json", ".json.gz"))} <= files, "rows without a file"
    assert all(r[2] in {"ok", "salvaged", "truncated", "failed", "skipped"} and r[3] for r in ROWS)


@pytest.mark.parametrize("name,code,status,phrases", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_matrix(tmp_db, name, code, status, phrases):
    path = BAD / name
    res = run_cli(str(path), "--db", str(tmp_db), "--run", "bad")
    assert res.exit_code == code, res.stdout + res.stderr
    # the summary table (stdout) has the file's row with its status
    line = next(ln for ln in res.stdout.splitlines() if str(path) in ln)
    assert re.search(rf"\s{status}\s", line), line
    out = res.stdout + res.stderr
    for phrase in phrases:
        assert phrase in out, f"{name}: {phrase!r} not in output:\n{out}"
    if status != "ok":
        # problems go to stderr, one line per file, starting with its status
        assert re.search(rf"^{status}: ", res.stderr, re.M), res.stderr
    if status == "failed":
        assert str(path) in res.stderr  # the message names the file
    with duckdb.connect(str(tmp_db), read_only=True) as con:
        n_src, kept = con.execute("SELECT count(*), coalesce(sum(rows_kept), 0) FROM sources").fetchone()
        pending = con.execute("SELECT count(*) FROM pending_sources").fetchone()[0]
    assert pending == 0
    assert n_src == (0 if status == "failed" else 1)  # a failed file leaves no trace in the db
    m = re.search(r"kept (\d+) events", out)
    if m:
        assert kept == int(m.group(1))


def _trace(path: Path, rank: int | None, n: int = 5, world_size: int = 2) -> Path:
    di = {"backend": "nccl", "world_size": world_size} | ({"rank": rank} if rank is not None else {})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "schemaVersion": 1,
                "distributedInfo": di,
                "traceEvents": [{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(n)],
            }
        )
    )
    return path


def test_exit_0_when_everything_ingests(tmp_db, tmp_path):
    _trace(tmp_path / "job" / "rank0.json", 0)
    _trace(tmp_path / "job" / "rank1.json", 1)
    (tmp_path / "job" / "notes.txt").write_text("not a profile\n")  # found by walking: skipped
    res = run_cli(str(tmp_path / "job"), "--db", str(tmp_db))
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "run 'job'" in res.stdout and "2 ok" in res.stdout and "1 skipped" in res.stdout
    assert res.stderr == ""
    with duckdb.connect(str(tmp_db), read_only=True) as con:
        assert con.execute("SELECT run, rank, count(*) FROM events GROUP BY ALL ORDER BY rank").fetchall() == [
            ("job", 0, 5),
            ("job", 1, 5),
        ]


def test_exit_1_when_some_file_fails_and_the_rest_still_lands(tmp_db, tmp_path):
    _trace(tmp_path / "job" / "rank0.json", 0)
    good = tmp_path / "job" / "rank1.json"
    _trace(good, 1, n=8)
    cut = good.read_text()
    good.write_text(cut[: cut.rindex('{"ph"') + 10])  # rank1 cut inside its last event
    (tmp_path / "job" / "rank2.json").write_text("")  # empty: fails
    res = run_cli(str(tmp_path / "job"), "--db", str(tmp_db), "-q")
    assert res.exit_code == 1
    assert res.stdout == ""  # -q: no table
    assert re.search(r"^truncated: \S*rank1\.json: kept 7 events, dropped 1", res.stderr, re.M), res.stderr
    assert re.search(
        rf"^failed: {re.escape(str(tmp_path / 'job' / 'rank2.json'))}: the file is empty", res.stderr, re.M
    )
    with duckdb.connect(str(tmp_db), read_only=True) as con:
        assert con.execute("SELECT rank, status, rows_kept FROM sources ORDER BY rank").fetchall() == [
            (0, "ok", 5),
            (1, "truncated", 7),
        ]


@pytest.mark.parametrize(
    "args,words",
    [
        (["{tmp}/does_not_exist.json"], "no such file or folder"),
        (["{tmp}/nothing_*.json"], "matches no file"),
        (["{tmp}/t.json", "--rank-pattern", "rank(\\d+"], "not a valid regular expression"),
        (["{tmp}/t.json", "--rank-map", "{tmp}/missing_map.csv"], "cannot read the rank map"),
    ],
)
def test_exit_2_on_usage_errors(tmp_db, tmp_path, args, words):
    _trace(tmp_path / "t.json", 0)
    res = run_cli(*[a.format(tmp=tmp_path) for a in args], "--db", str(tmp_db))
    assert res.exit_code == 2, res.stdout + res.stderr
    assert res.stderr.startswith("Error: ") and words in res.stderr
    assert res.stdout == ""
    with duckdb.connect(str(tmp_db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM sources").fetchone()[0] == 0


def test_rank_map_and_pattern_from_the_command_line(tmp_db, tmp_path):
    a = _trace(tmp_path / "node3" / "worker5" / "t.json", None)
    b = _trace(tmp_path / "node4" / "worker6" / "t.json", None)
    mp = tmp_path / "map.json"
    mp.write_text(json.dumps({"node4/worker6/t.json": 11}))
    res = run_cli(
        str(a),
        str(b),
        "--db",
        str(tmp_db),
        "--run",
        "r",
        "--rank-pattern",
        r"worker(?P<rank>\d+)",
        "--rank-map",
        str(mp),
    )
    assert res.exit_code == 0, res.stderr
    with duckdb.connect(str(tmp_db), read_only=True) as con:
        got = dict(con.execute("SELECT rank_source, rank FROM sources").fetchall())
    assert got == {"rank_pattern": 5, "rank_map": 11}
