"""Ascend communication matrices and msprof-analyze communication groups.

Formats (``sources.format``), recognised by content, never by file name:

``comm_matrix``
    One rank's ``ASCEND_PROFILER_OUTPUT/communication_matrix.json`` (Ascend PyTorch Profiler):
    ``{step: {"collective" | "p2p": {"<op>@<group>": {"<src>-<dst>": {"Transport Type",
    "Transit Size(MB)", "Transit Time(ms)", "Bandwidth(GB/s)"[, "Op Name"]}}}}}``.
``cluster_comm_matrix``
    msprof-analyze's ``cluster_communication_matrix.json``: the same links one level down,
    ``{rank set | "p2p": {step: {op: {"<src>-<dst>": {...}}}}}``.
``communication_group``
    msprof-analyze's ``communication_group.json``: ``{"collective": [[ranks], ...], "p2p":
    [[ranks], ...]}``, newer versions add ``"comm_group_parallel_info"``: a list of records
    (``rank_set``, ``group_name``, ``group_id``, ``pg_name`` …). A p2p group is a pipeline
    stage's ranks; a record's ``pg_name`` says which parallel dimension (dp / tp / pp …) a group is.

The files are small (one entry per link of each op), parsed in Python and handed to DuckDB as one
Arrow table. Owns the tables in ``comm_matrix.sql``. A level that is not an object fails the file
with its key path; a link with a bad key or a non-number is dropped with its key path.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    import pyarrow as pa
else:
    from .._lazy import LazyModule

    pa = LazyModule("pyarrow")  # imported on first use (issue 17)

from ..errors import InputError
from .base import Context, Outcome, arrow_view, strip_bom
from .cluster_analysis import (
    _COMM_TYPES,
    _PER_RANK_KEY,
    _RANK_SET_KEY,
    _RANK_SET_RE,
    RankSets,
    _BadValue,
    _drop_list,
    _load_json,
    _lookup,
    _number,
    _step_id,
)

_TRANSPORT = "Transport Type"
_INT32_MAX = 2**31 - 1
_LINK_KEY = re.compile(r"\s*([0-9]+)\s*-\s*([0-9]+)\s*")
_GROUP_KEY = re.compile(rb'\{\s*"(?:collective|p2p|comm_group_parallel_info)"\s*:\s*\[')

_MATRIX_FIELDS = {
    "transit_size_mb": ("Transit Size(MB)",),
    "transit_ms": ("Transit Time(ms)",),
    "bandwidth_gbps": ("Bandwidth(GB/s)",),
}


@functools.cache
def _matrix_schema():
    return pa.schema(
        [
            ("source_id", pa.int32()),
            ("rank_set_id", pa.int32()),
            ("comm_type", pa.string()),
            ("step", pa.string()),
            ("step_id", pa.int32()),
            ("op_name", pa.string()),
            ("group_name", pa.string()),
            ("src_rank", pa.int32()),
            ("dst_rank", pa.int32()),
            ("transport_type", pa.string()),
        ]
        + [(c, pa.float64()) for c in _MATRIX_FIELDS]
        + [("link_op_name", pa.string())]
    )


@functools.cache
def _group_schema():
    return pa.schema(
        [
            ("source_id", pa.int32()),
            ("group_type", pa.string()),
            ("group_idx", pa.int32()),
            ("ranks", pa.list_(pa.int32())),
            ("group_name", pa.string()),
            ("pg_name", pa.string()),
            ("info", pa.string()),
        ]
    )


def _shape(path: Path, where: str, found, expected: str) -> InputError:
    kind = "a list" if isinstance(found, list) else type(found).__name__ if found is not None else "null"
    return InputError(
        path,
        f"{expected}, found {kind}",
        position="document" if where == "document" else f"key {where}",
        hint='expected an Ascend communication_matrix.json {step: {"collective"|"p2p": {op: '
        '{"src-dst": {...}}}}} or msprof-analyze\'s cluster_communication_matrix.json',
    )


def _ops(path: Path, doc: dict, cluster: bool):
    """(rank_set, comm_type, step, op key, links object, where) of either layout."""
    for top, level1 in doc.items():
        if not isinstance(level1, dict):
            raise _shape(path, top, level1, "an object")
        if cluster:
            if not (_RANK_SET_RE.fullmatch(top.strip()) or top.strip() in _COMM_TYPES):
                raise InputError(
                    path,
                    f'top-level key {top[:60]!r} is not a rank set like "(0, 1)" or "p2p"',
                    position="document",
                    hint="this is not a cluster_communication_matrix.json",
                )
            ctype = top.strip() if top.strip() in _COMM_TYPES else "collective"
            for step, ops in level1.items():
                if not isinstance(ops, dict):
                    raise _shape(path, f"{top} / {step}", ops, "an object keyed by communication op")
                for op, links in ops.items():
                    yield top, ctype, step, op, links, f"{top} / {step} / {op}"
        else:
            for ctype, ops in level1.items():
                if not isinstance(ops, dict):
                    raise _shape(path, f"{top} / {ctype}", ops, "an object keyed by communication op")
                for op, links in ops.items():
                    yield None, ctype, top, op, links, f"{top} / {ctype} / {op}"


def _ingest_matrix(ctx: Context) -> Outcome:
    path = ctx.path
    doc, lenient = _load_json(path)
    if not isinstance(doc, dict):
        raise _shape(path, "document", doc, "a JSON object")
    cols: dict[str, list] = {f.name: [] for f in _matrix_schema()}
    drops: list[tuple[str, str]] = []
    kept = 0
    rank_sets = RankSets()
    for rank_set, ctype, step, op, links, where in _ops(path, doc, ctx.format == "cluster_comm_matrix"):
        if not isinstance(links, dict):
            raise _shape(path, where, links, 'an object keyed by "src-dst" rank pairs')
        op_name, sep, group = op.rpartition("@")
        if not sep:
            op_name, group = op, None
        for key, link in links.items():
            try:
                m = _LINK_KEY.fullmatch(key)
                if not m:
                    raise _BadValue(f'link key {key[:40]!r} is not "<src rank>-<dst rank>"')
                if max(int(m[1]), int(m[2])) > _INT32_MAX:
                    raise _BadValue(f"link key {key[:40]!r}: a rank past {_INT32_MAX}")
                if not isinstance(link, dict):
                    raise _BadValue("link entry is not an object")
                vals = {c: _link_value(link, a) for c, a in _MATRIX_FIELDS.items()}
                transport = link.get(_TRANSPORT)
                link_op = link.get("Op Name")
            except _BadValue as exc:
                drops.append((str(exc), f"{where} / {key}"))
                continue
            kept += 1
            for c, v in (
                ("source_id", ctx.source_id),
                ("rank_set_id", rank_sets.id(rank_set)),
                ("comm_type", ctype),
                ("step", step),
                ("step_id", _step_id(step)),
                ("op_name", op_name),
                ("group_name", group),
                ("src_rank", int(m[1])),
                ("dst_rank", int(m[2])),
                ("transport_type", None if transport is None else str(transport)),
                ("link_op_name", None if link_op is None else str(link_op)),
            ):
                cols[c].append(v)
            for c, v in vals.items():
                cols[c].append(v)
    if drops and not kept:
        raise InputError(path, f"no usable link entry: {drops[0][0]}", position=f"key {drops[0][1]}")
    if kept:
        rank_sets.insert(ctx)
        with arrow_view(ctx, "comm_matrix", pa.table(cols, schema=_matrix_schema())) as name:
            ctx.con.execute(f'INSERT INTO comm_matrix_rows BY NAME SELECT * FROM "{name}"')
    message = "" if kept else "no link entries"
    if drops:
        message = f"{len(drops)} of {kept + len(drops)} links dropped (first: {drops[0][0]}, key {drops[0][1]})"
    if lenient:
        message = (message + "; " if message else "") + "NaN / Infinity values read as NULL"
    meta = {
        "steps": len(set(cols["step"])),
        "ops": len(set(zip(cols["op_name"], cols["group_name"]))),
        "transport_types": sorted({t for t in cols["transport_type"] if t}),
    }
    return Outcome(
        rows_seen=kept + len(drops),
        rows_kept=kept,
        rows_dropped=len(drops),
        status="salvaged" if drops else "ok",
        message=message,
        drops=_drop_list(drops, "key"),
        metadata=meta,
    )


def _link_value(link: dict, aliases: tuple[str, ...]) -> float | None:
    """A link's MB / ms / GB/s value (None when absent, null, NaN or infinite); raises _BadValue
    when it is past what a double holds in bytes or ns (1e305 MB: the bytes are inf, issue 46)."""
    v = _number(_lookup(link, aliases)[1], aliases[0])
    if v is not None and not math.isfinite(v * 1e6):
        raise _BadValue(f"{aliases[0]} {v:g} is out of range")
    return v


def _ranks(value) -> list[int]:
    """A rank list written as [0, 1] or "(0, 1)"; raises _BadValue (a rank past 2^31 - 1 too: it
    failed the whole file in the Arrow conversion, issue 46)."""
    ranks: list[int] | None = None
    if isinstance(value, str) and _RANK_SET_RE.fullmatch(value.strip()):
        ranks = [int(x) for x in re.findall(r"[0-9]+", value)]
    elif isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value):
        ranks = list(value)
    if ranks is not None and all(r <= _INT32_MAX for r in ranks):
        return ranks
    raise _BadValue(
        f"rank list {orjson.dumps(value).decode()[:40]} is not a list of integer ranks from 0 to {_INT32_MAX}"
    )


def _ingest_groups(ctx: Context) -> Outcome:
    path = ctx.path
    doc, _lenient = _load_json(path)
    if not isinstance(doc, dict):
        raise _shape(path, "document", doc, 'a JSON object with "collective" / "p2p" rank lists')
    cols: dict[str, list] = {f.name: [] for f in _group_schema()}
    drops: list[tuple[str, str]] = []
    for gtype, groups in doc.items():
        if not isinstance(groups, list):
            raise _shape(path, gtype, groups, "a list of groups")
        for i, g in enumerate(groups):
            where = f"{gtype}[{i}]"
            try:
                if isinstance(g, dict):  # a comm_group_parallel_info record
                    ranks = _ranks(g.get("rank_set", g.get("ranks")))
                    name, pg = g.get("group_name"), g.get("pg_name")
                    typ = str(g.get("type") or gtype)
                    info = orjson.dumps(g).decode()
                else:
                    ranks, name, pg, typ, info = _ranks(g), None, None, gtype, None
            except _BadValue as exc:
                drops.append((str(exc), where))
                continue
            for c, v in (
                ("source_id", ctx.source_id),
                ("group_type", typ),
                ("group_idx", i),
                ("ranks", ranks),
                ("group_name", None if name is None else str(name)),
                ("pg_name", None if pg is None else str(pg)),
                ("info", info),
            ):
                cols[c].append(v)
    kept = len(cols["source_id"])
    if drops and not kept:
        raise InputError(path, f"no usable group: {drops[0][0]}", position=f"key {drops[0][1]}")
    if kept:
        with arrow_view(ctx, "comm_groups", pa.table(cols, schema=_group_schema())) as name:
            ctx.con.execute(f'INSERT INTO comm_group_rows BY NAME SELECT * REPLACE (info::JSON AS info) FROM "{name}"')
    message = (
        f"{len(drops)} of {kept + len(drops)} groups dropped (first: {drops[0][0]}, {drops[0][1]})" if drops else ""
    )
    return Outcome(
        rows_seen=kept + len(drops),
        rows_kept=kept,
        rows_dropped=len(drops),
        status="salvaged" if drops else "ok",
        message=message,
        drops=_drop_list(drops, "key"),
        metadata={"group_types": sorted(set(cols["group_type"]))},
    )


class CommMatrixReader:
    """Reader for communication matrices (per rank and cluster) and communication_group.json."""

    name = "comm_matrix"

    def sniff(self, path: Path, head: bytes) -> str | None:
        body = strip_bom(head).lstrip()
        if not body.startswith(b"{"):
            return None
        if _GROUP_KEY.match(body):
            return "communication_group"
        if b'"' + _TRANSPORT.encode() + b'"' not in body:
            return None
        if _RANK_SET_KEY.match(body):
            return "cluster_comm_matrix"
        if _PER_RANK_KEY.match(body):
            return "comm_matrix"
        return None

    def ingest(self, ctx: Context) -> Outcome:
        if ctx.format in ("comm_matrix", "cluster_comm_matrix"):
            return _ingest_matrix(ctx)
        if ctx.format == "communication_group":
            return _ingest_groups(ctx)
        raise InputError(ctx.path, f"unknown communication format {ctx.format!r}")


READER = CommMatrixReader()
