"""MoE layers on every real profiler output: one timeline, never negative, parts adding up.

Holds for any file added to ../shared/realdata: every folder's own files are ingested as one run
(the files of a folder belong together; folders would collide on rank numbers), and the
properties are checked per source."""

from __future__ import annotations

import pytest

from slowcard import queries
from slowcard.ingest import ingest_paths


@pytest.fixture(scope="module")
def real_all_db(realdata, tmp_path_factory):
    db = tmp_path_factory.mktemp("real_moe") / "all.duckdb"
    folders = sorted({p.parent for p in realdata.rglob("*") if p.is_file()})
    for folder in folders:
        files = sorted(p for p in folder.iterdir() if p.is_file())
        report = ingest_paths(db, files, run=str(folder.relative_to(realdata)))
        # files named one by one are reported even when they are no profiler output (README.md)
        assert all("unknown format" in f.message for f in report.failed), [f.message for f in report.failed]
    return db


def _sql(db, text):
    con = queries.open_readonly(db)
    try:
        return con.execute(text).fetchall()
    finally:
        con.close()


def test_no_negative_duration_in_moe_layers(real_all_db):
    (n_layers,) = _sql(real_all_db, "SELECT count(*) FROM moe_layers")[0]
    if n_layers == 0:
        pytest.skip("no real file with MoE layers")
    assert _sql(real_all_db, "SELECT count(*) FROM moe_layers WHERE dur_ns < 0 OR end_ns < start_ns") == [(0,)]
    cols = [
        "layer_ns",
        "gmm_ns",
        "dispatch_ns",
        "combine_ns",
        "gating_ns",
        "collective_ns",
        "gmm_excl_ns",
        "dispatch_excl_ns",
        "combine_excl_ns",
        "gating_excl_ns",
        "overlap_ns",
        "other_ns",
    ]
    neg = _sql(
        real_all_db, "SELECT " + ", ".join(f"count(*) FILTER (WHERE {c} < 0)" for c in cols) + " FROM moe_layer_facts"
    )[0]
    assert dict(zip(cols, neg)) == dict.fromkeys(cols, 0)


def test_layer_parts_add_up_per_source(real_all_db):
    rows = _sql(
        real_all_db,
        """
        SELECT source_id, sum(layer_ns),
               sum(gmm_excl_ns + dispatch_excl_ns + combine_excl_ns + gating_excl_ns + overlap_ns + other_ns),
               sum(gmm_ns) , sum(greatest(gmm_ns, dispatch_ns, combine_ns, gating_ns) - layer_ns) FILTER (WHERE greatest(gmm_ns, dispatch_ns, combine_ns, gating_ns) > layer_ns)
        FROM moe_layer_facts GROUP BY source_id""",
    )
    if not rows:
        pytest.skip("no real file with MoE layers")
    for sid, layer, parts, _gmm, too_long in rows:
        assert parts == layer, sid  # exact: the split is a partition of each layer
        assert too_long is None, sid  # no class is longer than its layer (unions are clipped)


def test_vllm_fused_moe_regions_show_grouped_matmul_and_gating(real_all_db):
    """Any real vLLM trace whose MoE layers are FusedMoE regions (vllm::moe_forward)."""
    srcs = [
        r[0]
        for r in _sql(
            real_all_db,
            """SELECT DISTINCT source_id FROM op_classes
                                              WHERE op_class = 'moe_layer' AND name LIKE 'vllm::moe_forward%'""",
        )
    ]
    if not srcs:
        pytest.skip("no real vLLM trace with FusedMoE regions")
    con = queries.open_readonly(real_all_db)
    try:
        for sid in srcs:
            ((run, rank),) = con.execute("SELECT run, rank FROM sources WHERE source_id = ?", [sid]).fetchall()
            res = queries.run_query(con, queries.load_catalog()["moe-breakdown"], run, {})
            assert res.status == "INFO", res.summary
            (row,) = [r for r in res.rows if r["rank"] == rank]
            assert row["gmm_ms"] > 0 and row["gating_ms"] > 0, row
            shares = sum(row[f"{p}_pct"] for p in ("gmm", "dispatch", "combine", "gating", "overlap", "other"))
            assert shares == pytest.approx(100.0, abs=1.0), row
    finally:
        con.close()


def test_nccl_kernels_launched_in_a_host_all_to_all_are_all_to_all(real_all_db):
    """Checked the long way round (JSON correlation ids, launch on the same thread inside the
    host range), independent of the launch_ns the views use."""
    rows = _sql(
        real_all_db,
        """
        WITH k AS (
            SELECT source_id, name, ts_ns, json_extract_string(args, '$.correlation') AS corr
            FROM events WHERE cat = 'kernel' AND name ILIKE 'nccl%SendRecv%'
              AND NOT contains(args, 'Collective name')
        ),
        r AS (
            SELECT source_id, tid, ts_ns, json_extract_string(args, '$.correlation') AS corr
            FROM events WHERE cat = 'cuda_runtime' AND name ILIKE '%launch%'
        ),
        h AS (SELECT source_id, tid, ts_ns, end_ns FROM events WHERE ph = 'X' AND name = 'nccl:all_to_all')
        SELECT DISTINCT k.source_id, k.name, k.ts_ns
        FROM k JOIN r USING (source_id, corr)
        JOIN h ON h.source_id = r.source_id AND h.tid = r.tid AND r.ts_ns >= h.ts_ns AND r.ts_ns < h.end_ns""",
    )
    if not rows:
        pytest.skip("no real NCCL SendRecv kernel launched inside a host all_to_all")
    con = queries.open_readonly(real_all_db)
    try:
        for sid, name, ts in rows:
            kinds = con.execute(
                "SELECT coll_kind FROM op_classes WHERE source_id = ? AND name = ? AND ts_ns = ?", [sid, name, ts]
            ).fetchall()
            assert kinds == [("all_to_all",)], (sid, name, ts, kinds)
    finally:
        con.close()
