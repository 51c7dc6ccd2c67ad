"""The query catalog: header rules, version fingerprints, parameters, user folders, read-only runs.

Fingerprints: testdata/golden/query_fingerprints.txt records `name version fingerprint` for every
built-in query. After changing a query's body, params or verdict, bump its version and run
`python tests/test_catalog.py --update` to rewrite the file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if __name__ == "__main__":  # run as a script: this checkout's slowcard, not an installed one
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slowcard import queries, store  # noqa: E402
from slowcard.errors import QueryDefinitionError, UsageError

FINGERPRINTS = Path(__file__).resolve().parents[1] / "testdata" / "golden" / "query_fingerprints.txt"


def current_fingerprints() -> dict[str, tuple[int, str]]:
    return {q.name: (q.version, q.fingerprint()) for q in queries.load_catalog(scope=None).values()}


def recorded_fingerprints() -> dict[str, tuple[int, str]]:
    out = {}
    for line in FINGERPRINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version, fp = line.split()
            out[name] = (int(version), fp)
    return out


def test_every_builtin_query_parses_with_stem_equal_to_name():
    catalog = queries.load_catalog()
    assert {"ep-slow-rank", "moe-layer-durations", "moe-breakdown", "sync-gaps"} <= set(catalog)
    for name, q in catalog.items():
        assert q.path.stem == name
        assert q.description and "\n" not in q.description
        assert q.requires, f"{name} declares no required table"


def test_versions_change_with_fingerprints():
    """A query whose body, params or verdict changed must carry a new version."""
    recorded = recorded_fingerprints()
    current = current_fingerprints()
    problems = []
    for name, (version, fp) in current.items():
        if name not in recorded:
            problems.append(f"{name}: new query; run `python tests/test_catalog.py --update`")
            continue
        old_version, old_fp = recorded[name]
        if fp != old_fp and version == old_version:
            problems.append(
                f"sql/{name}.sql changed but its version is still {version}; bump it and run "
                "`python tests/test_catalog.py --update`"
            )
        elif fp != old_fp or version != old_version:
            problems.append(f"{name}: fingerprint file is stale; run `python tests/test_catalog.py --update`")
    assert not problems, "\n".join(problems)


def _write(tmp_path, name, text):
    p = tmp_path / f"{name}.sql"
    p.write_text(text)
    return p


GOOD = """-- name: my-check
-- version: 2
-- description: Ranks with many events.
-- requires: events
-- param: min_events INTEGER = 10  -- threshold
-- verdict: warn if rows > 0
-- summary: rank {rank}: {n} events
SELECT rank, count(*) AS n FROM events WHERE run = $run GROUP BY rank HAVING count(*) >= $min_events ORDER BY rank
"""


def test_fingerprint_ignores_comments_but_not_body(tmp_path):
    a = queries.parse_query(_write(tmp_path, "my-check", GOOD))
    b = queries.parse_query(_write(tmp_path, "my-check", GOOD.replace("-- summary:", "-- a comment\n-- summary:")))
    c = queries.parse_query(_write(tmp_path, "my-check", GOOD.replace(">= $min_events", "> $min_events")))
    d = queries.parse_query(_write(tmp_path, "my-check", GOOD.replace("= 10", "= 11")))
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != c.fingerprint()
    assert a.fingerprint() != d.fingerprint()


@pytest.mark.parametrize(
    "mutation, words",
    [
        (("-- name: my-check", "-- name: other"), "must equal the file stem"),
        (("-- version: 2", "-- version: two"), "version must be an integer"),
        (("-- verdict: warn if rows > 0", "-- verdict: warn when bad"), "bad verdict clause"),
        (("-- param: min_events INTEGER = 10  -- threshold\n", ""), "used but not declared"),
        (("HAVING count(*) >= $min_events", ""), "declared but not used"),
        (("WHERE run = $run ", ""), "must filter on the run"),
        (("-- requires: events", "-- requires: events\n-- colour: red"), "unknown header key"),
        (("-- version: 2", "-- version: 2\n-- version: 3"), "duplicate header key"),
        (("INTEGER = 10", "NUMBER = 10"), "bad param"),
        (("INTEGER = 10", "INTEGER = ten"), "not a valid INTEGER"),
    ],
)
def test_header_rule_breaks_are_named(tmp_path, mutation, words):
    text = GOOD.replace(*mutation)
    with pytest.raises((QueryDefinitionError, UsageError)) as exc:
        queries.parse_query(_write(tmp_path, "my-check", text))
    assert words in str(exc.value)
    assert "my-check.sql" in str(exc.value)


@pytest.fixture()
def small_db(tmp_path):
    """Two ranks of a tiny trace, ingested as run 'r'."""
    import json

    from slowcard.ingest import ingest_paths

    d = tmp_path / "traces"
    d.mkdir()
    for rank, n in ((0, 3), (1, 12)):
        events = [
            {"ph": "X", "name": "op", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": i * 10.0, "dur": 5.0} for i in range(n)
        ]
        (d / f"rank{rank}.json").write_text(
            json.dumps({"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": events})
        )
    db = tmp_path / "t.duckdb"
    ingest_paths(db, [d], run="r")
    return db


def test_user_sql_dir_query_runs_with_params_and_verdict(tmp_path, small_db):
    user = tmp_path / "mine"
    user.mkdir()
    _write(user, "my-check", GOOD)
    catalog = queries.load_catalog([user])
    con = queries.open_readonly(small_db)
    try:
        res = queries.run_query(con, catalog["my-check"], "r")
        assert res.status == "WARN" and [r["rank"] for r in res.rows] == [1]
        assert res.summary == "rank 1: 12 events"
        res = queries.run_query(con, catalog["my-check"], "r", {"min_events": "2"})
        assert [r["rank"] for r in res.rows] == [0, 1] and res.params == {"min_events": 2}
        assert res.summary == "rank 0: 3 events | rank 1: 12 events"
        res = queries.run_query(con, catalog["my-check"], "r", {"min_events": 100})
        assert res.status == "PASS" and res.rows == []
        with pytest.raises(UsageError, match="no parameter 'nope'"):
            queries.run_query(con, catalog["my-check"], "r", {"nope": 1})
        with pytest.raises(UsageError, match="not a valid INTEGER"):
            queries.run_query(con, catalog["my-check"], "r", {"min_events": "many"})
        skipped = queries.run_query(con, catalog["my-check"], "no-such-run")
        assert skipped.status == "SKIP" and "no rows for run" in skipped.summary
    finally:
        con.close()


def test_user_query_cannot_shadow_a_builtin(tmp_path):
    user = tmp_path / "mine"
    user.mkdir()
    _write(user, "ep-slow-rank", GOOD.replace("my-check", "ep-slow-rank"))
    with pytest.raises(QueryDefinitionError, match="already defined"):
        queries.load_catalog([user])


def test_unknown_query_suggests_close_names():
    with pytest.raises(UsageError, match="did you mean ep-slow-rank"):
        queries.find(queries.load_catalog(), "ep-slow-rnak")


@pytest.mark.parametrize(
    "sql, words",
    [
        ("DROP TABLE sources", "read-only"),
        ("INSERT INTO runs VALUES ('x', NULL, NULL, NULL)", "read-only"),
        ("DELETE FROM event_rows", "read-only"),
        ("COPY (SELECT 1) TO '/tmp/slowcard_leak.csv'", "disabled"),
        ("SELECT * FROM read_csv('/etc/passwd')", "disabled"),
        ("ATTACH '/tmp/other.duckdb' AS other", "disabled"),
        ("SET enable_external_access = true", "locked"),
    ],
)
def test_queries_run_read_only_without_file_access(tmp_path, small_db, sql, words):
    """A query from --sql-dir can neither change the database nor read or write other files."""
    import dataclasses

    q = _write(tmp_path, "evil", GOOD.replace("my-check", "evil"))
    # The header rules would refuse a body without $run; the runner must hold even so.
    query = dataclasses.replace(queries.parse_query(q), body=sql, params=[])
    con = queries.open_readonly(small_db)
    try:
        res = queries.run_query(con, query, "r")
    finally:
        con.close()
    assert res.status == "ERROR"
    assert words in res.summary.lower() or words in res.summary
    assert not Path("/tmp/slowcard_leak.csv").exists()
    check = store.open_db(small_db, read_only=True)
    assert check.execute("SELECT count(*) FROM sources").fetchone()[0] == 2
    check.close()


if __name__ == "__main__" and "--update" in sys.argv:
    lines = ["# name version fingerprint (python tests/test_catalog.py --update rewrites this file)"]
    lines += [f"{n} {v} {fp}" for n, (v, fp) in sorted(current_fingerprints().items())]
    FINGERPRINTS.write_text("\n".join(lines) + "\n")
    print(f"wrote {FINGERPRINTS}")
