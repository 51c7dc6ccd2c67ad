"""A new database is a copy of a cached empty database with the schema (store.schema_template):
the same catalog as one built statement by statement, independent of the template, and a cache
that cannot be used (no folder, a file in its way, a damaged template) never stops an ingest."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest

from slowcard import store


def catalog(path: Path) -> dict:
    """Everything a new database holds: tables with their columns, views and macros with their
    text, and the rows of the tables the schema fills (meta, taxonomy, stamps)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        out = {
            "tables": con.execute(
                "SELECT table_name, list(column_name || ' ' || data_type ORDER BY column_index) "
                "FROM duckdb_columns() WHERE NOT internal GROUP BY 1 ORDER BY 1"
            ).fetchall(),
            "views": con.execute("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal ORDER BY 1").fetchall(),
            "macros": con.execute(
                "SELECT DISTINCT function_name, macro_definition FROM duckdb_functions() "
                "WHERE NOT internal AND function_type IN ('macro', 'table_macro') ORDER BY 1, 2"
            ).fetchall(),
            "indexes": con.execute("SELECT index_name, sql FROM duckdb_indexes() ORDER BY 1").fetchall(),
            "sequences": con.execute("SELECT sequence_name, start_value FROM duckdb_sequences() ORDER BY 1").fetchall(),
        }
        for table in ("meta", "op_taxonomy", "_mat_stamps", "sources", "_name_classes"):
            out[table] = sorted(map(repr, con.execute(f"SELECT * FROM {table}").fetchall()))
        return out
    finally:
        con.close()


def new_db(path: Path) -> Path:
    store.open_db(path).close()
    return path


def test_a_copy_of_the_template_is_the_database_the_ddl_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOWCARD_CACHE_DIR", str(tmp_path / "cache"))
    copied = new_db(tmp_path / "copied.duckdb")
    template = store.schema_template()
    assert template is not None and template.parent == tmp_path / "cache" / store.TEMPLATE_FOLDER
    monkeypatch.setenv("SLOWCARD_CACHE_DIR", "")  # no cache: the schema is created here
    assert store.schema_template() is None
    built = new_db(tmp_path / "built.duckdb")
    a, b = catalog(copied), catalog(built)
    assert a["tables"] and a["views"] and a["macros"] and a["op_taxonomy"]
    assert a == b


def test_the_template_is_built_once_and_its_copies_are_independent(tmp_path, monkeypatch, make_trace):
    from slowcard.ingest import ingest_paths

    monkeypatch.setenv("SLOWCARD_CACHE_DIR", str(tmp_path / "cache"))
    first = new_db(tmp_path / "first.duckdb")
    template = store.schema_template()
    stamp = (template.stat().st_mtime_ns, template.stat().st_ino)
    trace = make_trace(tmp_path / "r0.json", [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 5, "pid": 1, "tid": 1}])
    con = store.open_db(first)
    try:
        rep = ingest_paths(first, [str(trace)], run="r", con=con)
    finally:
        con.close()
    assert [f.status for f in rep.files] == ["ok"]
    second = new_db(tmp_path / "second.duckdb")
    assert (template.stat().st_mtime_ns, template.stat().st_ino) == stamp  # not rebuilt
    for path, files in ((first, 1), (second, 0), (template, 0)):
        con = duckdb.connect(str(path), read_only=True)
        try:
            assert con.execute("SELECT count(*) FROM sources").fetchone()[0] == files, path
        finally:
            con.close()


def test_a_cache_folder_that_cannot_be_made_leaves_the_schema_to_the_ingest(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("SLOWCARD_CACHE_DIR", str(blocker / "cache"))
    assert store.schema_template() is None
    db = new_db(tmp_path / "t.duckdb")
    assert catalog(db)["meta"]  # schema applied all the same
    assert [p for p in tmp_path.rglob("*") if "slowcard-template" in p.name] == []


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_template_is_dropped_and_rebuilt(tmp_path, monkeypatch, damage):
    monkeypatch.setenv("SLOWCARD_CACHE_DIR", str(tmp_path / "cache"))
    template = store.schema_template()
    good = template.read_bytes()
    template.write_bytes(b"not a database at all" if damage == "garbage" else good[: len(good) // 3])
    db = new_db(tmp_path / "t.duckdb")  # opens: the copy did not hash to the template's name
    assert catalog(db)["meta"]
    assert not template.exists()  # the damaged template went
    again = store.schema_template()
    assert again is not None and again.exists() and again.parent == template.parent
    assert catalog(new_db(tmp_path / "u.duckdb")) == catalog(db)


def test_an_existing_database_is_never_replaced_by_the_template(tmp_path, monkeypatch):
    monkeypatch.setenv("SLOWCARD_CACHE_DIR", str(tmp_path / "cache"))
    db = new_db(tmp_path / "t.duckdb")
    con = store.open_db(db)
    con.execute("INSERT INTO meta VALUES ('test_marker', 'kept')")
    con.close()
    con = store.open_db(db)
    try:
        assert con.execute("SELECT value FROM meta WHERE key = 'test_marker'").fetchone() == ("kept",)
    finally:
        con.close()
    assert [p for p in tmp_path.rglob("*") if "slowcard-template" in p.name] == []
    assert os.path.getsize(db) > 0


def test_a_copy_cut_short_by_a_kill_is_removed_by_the_next_write_open(tmp_path, monkeypatch):
    from slowcard import tempspace

    monkeypatch.setenv("SLOWCARD_CACHE_DIR", str(tmp_path / "cache"))
    # what a process killed while copying leaves: its temporary folder, owner file unlocked
    # (the lock died with it), beside the database and in the template folder
    store.schema_template()
    dead = []
    for parent in (tmp_path, tmp_path / "cache" / store.TEMPLATE_FOLDER):
        folder = parent / f".slowcard-template-{tempspace._host()}-999999999-abc{len(dead)}"
        folder.mkdir()
        (folder / tempspace.OWNER_FILE).write_text(f"slowcard temp folder abc{len(dead)}\n")
        (folder / "copy.duckdb").write_bytes(b"half a database")
        dead.append(folder)
    store.open_db(tmp_path / "t.duckdb").close()  # a write-open of a database in tmp_path
    assert not dead[0].exists()  # the database's folder
    for p in (tmp_path / "cache" / store.TEMPLATE_FOLDER).glob("schema-*.duckdb"):
        p.unlink()  # no template: the next new database builds one, cleaning its folder first
    new_db(tmp_path / "u.duckdb")
    assert not dead[1].exists()
