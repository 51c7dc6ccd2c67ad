"""The name-class table `_name_classes` (issue 17): a file's commit classifies only the operation
names no file had before (ranks of one job share theirs); it must always answer what the
taxonomy answers now, and files committed at once (--jobs) must not duplicate classified rows."""

from __future__ import annotations

from pathlib import Path

from slowcard import store
from slowcard.ingest import ingest_paths

EP4 = Path(__file__).resolve().parents[1] / "testdata" / "ep4_token_skew"

CACHED = "SELECT DISTINCT name, op_class, coll_kind, pattern FROM _name_classes WHERE op_class IS NOT NULL"
LIVE = "SELECT name, op_class, coll_kind, pattern FROM _name_class"  # the rule over every name, now


def _matches_the_taxonomy(con) -> None:
    unseen = con.execute("SELECT count(*) FROM _names_of(NULL) WHERE name NOT IN (SELECT name FROM _name_classes)")
    assert unseen.fetchone()[0] == 0
    for a, b in ((CACHED, LIVE), (LIVE, CACHED)):
        assert con.execute(f"SELECT count(*) FROM ({a} EXCEPT {b})").fetchone()[0] == 0, (a, b)


def _op_rows(con) -> list:
    return sorted(
        con.execute(
            """SELECT s.rank, o.origin, o.pid, o.tid, o.cat, o.name, o.ts_ns, o.dur_ns, o.op_class,
                      o.coll_kind, o.pattern, o.pg, o.seq, o.launch_ns
               FROM op_class_rows o JOIN sources s USING (source_id)"""
        ).fetchall()
    )


def test_files_committed_at_once_classify_like_one_at_a_time(tmp_path):
    rows = {}
    for jobs in (1, 2):
        db = tmp_path / f"j{jobs}.duckdb"
        rep = ingest_paths(db, [EP4], run="ep4", jobs=jobs)
        assert [f.status for f in rep.files] == ["ok"] * 4
        con = store.open_db(db)
        try:
            _matches_the_taxonomy(con)
            rows[jobs] = _op_rows(con)
        finally:
            con.close()
    assert rows[1], "the example has classified operations"
    assert rows[1] == rows[2]


def test_a_taxonomy_load_reclassifies_names_already_seen(tmp_path):
    db = tmp_path / "t.duckdb"
    ingest_paths(db, [EP4], run="ep4")
    con = store.open_db(db)
    try:
        count = "SELECT count(*) FROM op_class_rows WHERE name = 'GroupedMatmul' AND op_class = ?"
        before = con.execute(count, ["grouped_matmul"]).fetchone()[0]
        assert before > 0
        f = tmp_path / "tax.csv"
        f.write_text("pattern,op_class,coll_kind,priority\n^GroupedMatmul$,gating,,1\n")
        assert store.load_user_taxonomy(con, f) == 1
        _matches_the_taxonomy(con)
        assert con.execute(count, ["gating"]).fetchone()[0] == before
        assert con.execute(count, ["grouped_matmul"]).fetchone()[0] == 0
    finally:
        con.close()
    # a file committed after the load reads the new answer too
    ingest_paths(db, [EP4 / "rank0.pt.trace.json.gz"], run="again")
    con = store.open_db(db)
    try:
        _matches_the_taxonomy(con)
        got = con.execute(
            """SELECT DISTINCT o.op_class FROM op_class_rows o JOIN sources s USING (source_id)
               WHERE s.run = 'again' AND o.name = 'GroupedMatmul'"""
        ).fetchall()
        assert got == [("gating",)]
    finally:
        con.close()
