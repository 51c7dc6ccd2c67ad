"""store.json_rows: rows bound as one JSON text come back as they were, whatever their text and
whatever the size of their integers (the batch commit's `sources` rows go this way)."""

from __future__ import annotations

import duckdb

from slowcard import store

TEXTS = [
    "plain",
    "tab\tnew\nline",
    "quote ' and \" and \\ back",
    "nul\x00inside",
    "emoji 🚀 and 中文",
    "\u2028 a JavaScript line separator",
    "",
    None,
    "x" * 100_000,
    "$1 and ? and $parts and '{}'",
]


def test_text_and_big_integers_come_back_as_they_were():
    con = duckdb.connect()
    columns = (("s", "VARCHAR"), ("n", "BIGINT"), ("i", "INTEGER"))
    rows = [(t, (1 << 63) - 1 - k, -(1 << 31) + k) for k, t in enumerate(TEXTS)]
    rows.append(("min", -(1 << 63), None))
    named, text = store.json_rows(columns, rows)
    assert con.execute(f"SELECT {named}", [text]).fetchall() == rows
    # a named parameter, as the batch INSERT binds it beside $files
    named, text = store.json_rows(columns, rows, "$parts")
    assert con.execute(f"SELECT {named}", {"parts": text}).fetchall() == rows


def test_the_select_list_names_and_types_the_columns():
    con = duckdb.connect()
    named, text = store.json_rows((("source_id", "INTEGER"), ("path", "VARCHAR")), [(7, "/a b/c.json")])
    con.execute(f"CREATE TABLE t AS SELECT {named}", [text])
    assert con.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 't'"
    ).fetchall() == [
        ("source_id", "INTEGER"),
        ("path", "VARCHAR"),
    ]
    assert con.execute("SELECT * FROM t").fetchall() == [(7, "/a b/c.json")]
