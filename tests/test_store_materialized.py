"""The stored cross-rank views (store.MATERIALIZED, issue 17): queries read tables filled from the
views' definitions; they must always hold what the definitions compute now, be refilled when a
run's files or the taxonomy change, and databases made before them must still open."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from slowcard import queries, store
from slowcard.errors import UsageError
from slowcard.ingest import ingest_paths

ROOT = Path(__file__).resolve().parents[1]
EP4 = ROOT / "testdata" / "ep4_token_skew"


def _ingest(db: Path, paths, run: str) -> None:
    con = store.open_db(db)
    try:
        rep = ingest_paths(db, [str(p) for p in paths], run=run, con=con)
    finally:
        con.close()
    assert all(f.status == "ok" for f in rep.files)


def _stored_equals_live(con) -> None:
    """Every stored view holds exactly what its definition gives on the (stored) views it reads;
    checked in dependency order, this means the whole chain matches the definitions."""
    for v in store.MATERIALIZED:
        for a, b in ((f"_mat_{v}", f"_live_{v}"), (f"_live_{v}", f"_mat_{v}")):
            extra = con.execute(f'SELECT count(*) FROM (FROM "{a}" EXCEPT ALL FROM "{b}")').fetchone()[0]
            assert extra == 0, f"{v}: {extra} rows of {a} not in {b}"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_materialized_listed_in_dependency_order():
    """Each stored view is refilled after the stored views it reads (else it would read old rows)."""
    text = "\n".join(t for _n, t in store.ddl_texts())
    bodies = dict(
        (m.group(1), m.group(2))
        for m in re.finditer(r"CREATE OR REPLACE VIEW (\w+) AS(.*?)(?=CREATE OR REPLACE|\Z)", text, re.S)
    )
    for i, v in enumerate(store.MATERIALIZED):
        assert v in bodies, f"{v} is not a view of the DDL"
        body = re.sub(r"--[^\n]*", "", bodies[v])
        later = [w for w in store.MATERIALIZED[i + 1 :] if re.search(rf"\b{w}\b", body)]
        assert not later, f"{v} reads {later}, listed after it in store.MATERIALIZED"


def test_stored_views_match_definitions_after_ingest_and_have_rows(tmp_db):
    _ingest(tmp_db, sorted(EP4.glob("*.json.gz")), "ep4")
    con = queries.open_readonly(tmp_db)
    try:
        assert con.execute("SELECT count(*) FROM moe_layer_facts WHERE run = 'ep4'").fetchone()[0] > 0
        assert con.execute("SELECT count(*) FROM collective_waits WHERE run = 'ep4'").fetchone()[0] > 0
        _stored_equals_live(con)
    finally:
        con.close()


def test_open_of_up_to_date_database_writes_nothing(tmp_db):
    """Neither the DDL nor the stored views are redone when the stamps match: the file is unchanged."""
    _ingest(tmp_db, sorted(EP4.glob("*.json.gz")), "ep4")
    queries.open_readonly(tmp_db).close()  # fills the stored views
    before = _digest(tmp_db)
    for _ in range(2):
        con = queries.open_readonly(tmp_db)
        con.close()
    assert _digest(tmp_db) == before


def test_new_run_refills_only_its_rows_and_reingest_replaces(tmp_db):
    files = sorted(EP4.glob("*.json.gz"))
    _ingest(tmp_db, files, "a")
    con = queries.open_readonly(tmp_db)
    stamp_a = con.execute("SELECT stamp FROM _mat_stamps WHERE run = 'a'").fetchone()[0]
    facts_a = con.execute("SELECT * FROM moe_layer_facts WHERE run = 'a' ORDER BY ALL").fetchall()
    con.close()
    _ingest(tmp_db, files[:2], "b")  # a 2-rank run: its own cross-rank rows
    con = queries.open_readonly(tmp_db)
    try:
        assert con.execute("SELECT stamp FROM _mat_stamps WHERE run = 'a'").fetchone()[0] == stamp_a
        assert con.execute("SELECT * FROM moe_layer_facts WHERE run = 'a' ORDER BY ALL").fetchall() == facts_a
        assert set(
            r[0] for r in con.execute("SELECT DISTINCT rank FROM moe_layer_facts WHERE run = 'b'").fetchall()
        ) <= {
            0,
            1,
        }
        _stored_equals_live(con)
    finally:
        con.close()
    _ingest(tmp_db, files[:1], "b")  # re-ingest one file of b: new source id, b refilled
    con = queries.open_readonly(tmp_db)
    try:
        _stored_equals_live(con)
        ids = {r[0] for r in con.execute("SELECT source_id FROM sources WHERE run = 'b'").fetchall()}
        stored = {
            r[0] for r in con.execute("SELECT DISTINCT source_id FROM _mat_moe_layer_facts WHERE run = 'b'").fetchall()
        }
        assert stored <= ids
    finally:
        con.close()


def test_stale_stamp_gets_rebuilt_on_open(tmp_db):
    _ingest(tmp_db, sorted(EP4.glob("*.json.gz")), "ep4")
    queries.open_readonly(tmp_db).close()
    con = duckdb.connect(str(tmp_db))
    want = con.execute("SELECT * FROM moe_layer_facts ORDER BY ALL").fetchall()
    con.execute("DELETE FROM _mat_moe_layer_facts")
    con.execute("UPDATE _mat_stamps SET stamp = 'stale'")
    con.close()
    con = queries.open_readonly(tmp_db)
    try:
        assert con.execute("SELECT * FROM moe_layer_facts ORDER BY ALL").fetchall() == want
    finally:
        con.close()


def test_queries_on_the_writing_connection_see_new_files(tmp_db):
    """A writable connection that ingests and then queries (watch, notebooks) reads fresh rows."""
    con = store.open_db(tmp_db)
    try:
        ingest_paths(tmp_db, [str(EP4)], run="ep4", con=con)
        res = queries.run_query(con, queries.load_catalog()["ep-slow-rank"], "ep4")
        assert res.status == "FAIL" and res.rows and res.rows[0]["rank"] == 1
        _stored_equals_live(con)
    finally:
        con.close()


def test_the_duckdb_shell_reads_current_rows_right_after_an_ingest(tmp_db):
    """The contract: ad-hoc SQL in the duckdb shell on the database an ingest wrote. The ingest
    itself brings the stored views up to date (no slowcard query needed first)."""
    files = sorted(EP4.glob("*.json.gz"))
    _ingest(tmp_db, files, "a")
    _ingest(tmp_db, files[:2], "b")
    con = duckdb.connect(str(tmp_db), read_only=True)  # what `duckdb -readonly F` opens
    try:
        assert not store.materialized_stale(con)
        runs = dict(con.execute("SELECT run, count(DISTINCT rank) FROM moe_layer_facts GROUP BY run").fetchall())
        assert runs == {"a": 4, "b": 2}
        _stored_equals_live(con)
    finally:
        con.close()


def test_foreign_read_only_connection_to_stale_database_is_refused(tmp_db):
    _ingest(tmp_db, sorted(EP4.glob("*.json.gz")), "ep4")
    con = duckdb.connect(str(tmp_db))  # as a slowcard older than the stored views would leave it
    con.execute("UPDATE _mat_stamps SET stamp = 'stale'")
    con.close()
    con = duckdb.connect(str(tmp_db), read_only=True)
    try:
        with pytest.raises(UsageError, match="out of date"):
            queries.run_query(con, queries.load_catalog()["ep-slow-rank"], "ep4")
    finally:
        con.close()


def test_database_of_the_previous_version_opens_and_gives_the_same_verdict(tmp_db):
    """A database written before the stored views (plain views, older DDL fingerprint) is
    upgraded on its first read-only open."""
    _ingest(tmp_db, sorted(EP4.glob("*.json.gz")), "ep4")
    con = queries.open_readonly(tmp_db)
    want = queries.run_query(con, queries.load_catalog()["ep-slow-rank"], "ep4")
    con.close()
    con = duckdb.connect(str(tmp_db))  # back to the layout of the previous version
    for v in store.MATERIALIZED:
        con.execute(f'DROP VIEW "{v}"')
        con.execute(f'DROP TABLE "_mat_{v}"')
        con.execute(f'ALTER VIEW "_live_{v}" RENAME TO "{v}"')
    con.execute("DROP TABLE _mat_stamps")
    con.execute("UPDATE meta SET value = 'previous' WHERE key = 'ddl_fingerprint'")
    con.close()
    con = queries.open_readonly(tmp_db)
    try:
        got = queries.run_query(con, queries.load_catalog()["ep-slow-rank"], "ep4")
        assert (got.status, got.rows) == (want.status, want.rows)
        _stored_equals_live(con)
    finally:
        con.close()


def test_import_cli_does_not_load_heavy_or_unused_modules():
    """`import slowcard.cli` (every command's start) leaves out what only some commands need."""
    code = (
        "import sys, slowcard.cli; "
        "print(','.join(m for m in ('pyarrow', 'tabulate', 'pandas', 'numpy', 'slowcard.renderers.html', "
        "'slowcard.annotate', 'slowcard.watch', 'slowcard.compare', 'slowcard.export', "
        "'slowcard.ingest.chrome', 'slowcard.ingest.experts', 'slowcard.ingest.service_csv') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == ""


def test_a_view_failing_on_the_data_errors_the_queries_that_read_it_only(tmp_db):
    """As when the views ran inside each query: the queries over a failing view (and the views
    built on it) ERROR with its message; the others still run."""
    _ingest(tmp_db, sorted(EP4.glob("*.json.gz")), "ep4")
    queries.open_readonly(tmp_db).close()
    con = duckdb.connect(str(tmp_db))
    sql = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = '_live_clock_offsets'").fetchone()[0]
    body = sql.split(" AS ", 1)[1].rstrip(";")
    con.execute(f"CREATE OR REPLACE VIEW _live_clock_offsets AS SELECT * FROM ({body}) WHERE error('boom') IS NULL")
    con.execute("UPDATE _mat_stamps SET stamp = 'stale'")
    con.close()
    con = queries.open_readonly(tmp_db)
    try:
        catalog = queries.load_catalog()
        got = {n: queries.run_query(con, catalog[n], "ep4") for n in ("clock-offsets", "rank-waits", "ep-slow-rank")}
        for name, res in got.items():
            assert res.status == "ERROR" and "boom" in res.summary, (name, res.summary)
        assert queries.run_query(con, catalog["moe-layer-durations"], "ep4").status == "INFO"
    finally:
        con.close()
