"""Parallel groups (TP / PP / DP / EP …) that a run's ranks belong to.

Formats (``sources.format``), recognised by content, never by file name:

``ascend_parallel_groups``
    torch_npu's ``profiler_metadata.json`` (one per rank folder) when it carries
    ``"parallel_group_info"``: ``{hccl group: {"group_name": "tp" | "dp" | "pp" | "exp" …,
    "group_rank": n, "global_ranks": [ranks]}}``. The kind comes from ``group_name`` (see
    ``_group_kind`` in ``parallel_groups.sql``); names of mixed groups (``tp_dp``, ``mp_exp``)
    read as ``other``. Without that key the file stays a metadata companion (not ingested).
``parallel_groups``
    The user's groups file (``slowcard ingest --groups FILE``, or any file of this shape): JSON
    ``{"parallel_groups": [{"kind": "tp", "ranks": [0, 1, 2, 3], "name": "tp0"}, …]}`` (``name``
    optional), or a CSV whose header is ``kind,ranks`` (optionally ``,name``) with ranks written
    ``0 1 2 3``, ``0;1;2;3`` or ``0-3``. Kinds: tp, pp, dp, ep, cp, stage (the ranks of one
    pipeline stage), world, other.

Groups that other inputs carry are read where they are stored, by the view ``parallel_groups``:
msprof-analyze's ``communication_group.json`` (``comm_groups``) and Kineto's
``distributedInfo.pg_config`` (``sources.metadata``). A group without a usable rank list or with
an unknown kind is dropped with its key path / line; a file with no usable group fails. A rank
past ``MAX_RANK`` is a typo (``tp,4-9999999``), never read as millions of ranks: its group is dropped.

The view checks every group of a run whatever its input (``parallel_groups.sql``): a member that
is not an integer rank drops its group, members past the run's largest rank are left out, and
groups of one kind that share a rank are contradictory and none is used. ``run_warnings`` puts
what it dropped on the ingest summary.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import orjson

from ..errors import InputError
from .base import Context, Outcome, open_bytes, read_head, strip_bom
from .cluster_analysis import _drop_list, _load_json

KINDS = ("tp", "pp", "dp", "ep", "cp", "stage", "world", "other")

_JSON_HEAD = re.compile(rb'\A\s*\{\s*"parallel_groups"\s*:\s*\[')
_RANK_TOKEN = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?")
# The largest rank a groups file may name: a rank list "0-99999999" is a typo, not a cluster (and
# read as written it held 10^8 ranks: 2.3 GB and minutes for "0-16777215", issue 46). 2^18 ranks is
# past the largest jobs run today; the view then bounds members by the ranks the run has.
MAX_RANK = (1 << 18) - 1


class _BadGroup(ValueError):
    pass


def _rank_list(value) -> list[int]:
    """[0, 1] or "0 1" / "0;1" / "0,1" / "0-3"; raises _BadGroup."""
    if isinstance(value, list):
        if value and all(type(x) is int and 0 <= x <= MAX_RANK for x in value):
            return sorted(set(value))
        raise _BadGroup(
            f"ranks {orjson.dumps(value).decode()[:40]} is not a non-empty list of integer ranks from 0 to {MAX_RANK}"
        )
    if isinstance(value, str):
        out: set[int] = set()
        for tok in filter(None, re.split(r"[\s;,|]+", value.strip().strip("[]()"))):
            m = _RANK_TOKEN.fullmatch(tok)
            if not m:
                raise _BadGroup(f"ranks {value[:40]!r}: {tok!r} is not a rank or a range a-b")
            lo = int(m.group(1))
            hi = int(m.group(2)) if m.group(2) else lo
            if hi < lo:
                raise _BadGroup(f"ranks {value[:40]!r}: range {tok!r} is empty")
            if hi > MAX_RANK:
                raise _BadGroup(f"ranks {value[:40]!r}: {hi} is past rank {MAX_RANK} (a typo?)")
            out.update(range(lo, hi + 1))
        if out:
            return sorted(out)
    raise _BadGroup(f'ranks {str(value)[:40]!r} is not a list of ranks (e.g. [0, 1] or "0-3")')


def _kind(value) -> str:
    kind = str(value or "").strip().lower()
    if kind not in KINDS:
        raise _BadGroup(f"kind {str(value)[:20]!r} is not one of {', '.join(KINDS)}")
    return kind


def _csv_header(head: bytes) -> list[str] | None:
    line = strip_bom(head).split(b"\n", 1)[0].decode("utf-8", errors="replace").strip()
    names = [n.strip().lower() for n in line.split(",")]
    return names if names[:2] == ["kind", "ranks"] and set(names) <= {"kind", "ranks", "name"} else None


def _groups_from_json(path: Path) -> tuple[list[tuple], list[tuple[str, int | str]]]:
    doc, _ = _load_json(path)
    items = doc.get("parallel_groups") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise InputError(
            path,
            'expected {"parallel_groups": [{"kind": "tp", "ranks": [0, 1]}, ...]}',
            hint="see README, Parallel groups",
        )
    groups: list[tuple] = []
    drops: list[tuple[str, int | str]] = []
    for i, g in enumerate(items):
        where = f"parallel_groups[{i}]"
        try:
            if not isinstance(g, dict):
                raise _BadGroup("a group is an object with kind and ranks")
            name = g.get("name")
            groups.append((_kind(g.get("kind")), None if name is None else str(name), _rank_list(g.get("ranks"))))
        except _BadGroup as exc:
            drops.append((str(exc), where))
    return groups, drops


def _groups_from_csv(path: Path) -> tuple[list[tuple], list[tuple[str, int | str]]]:
    with open_bytes(path) as f:
        text = strip_bom(f.read()).decode("utf-8", errors="replace")
    reader = csv.DictReader(io.StringIO(text), skipinitialspace=True)
    reader.fieldnames = [n.strip().lower() for n in reader.fieldnames or []]
    groups: list[tuple] = []
    drops: list[tuple[str, int | str]] = []
    for row in reader:
        line = reader.line_num
        if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
            continue
        try:
            name = (row.get("name") or "").strip() or None
            groups.append((_kind(row.get("kind")), name, _rank_list(row.get("ranks") or "")))
        except _BadGroup as exc:
            drops.append((str(exc), line))
    return groups, drops


def _groups_from_ascend(path: Path) -> tuple[list[tuple], list[tuple[str, int | str]]]:
    doc, _ = _load_json(path)
    info = doc.get("parallel_group_info") if isinstance(doc, dict) else None
    if not isinstance(info, dict):
        raise InputError(path, 'expected "parallel_group_info": {hccl group: {"group_name", "global_ranks"}}')
    groups: list[tuple] = []
    drops: list[tuple[str, int | str]] = []
    for key, g in info.items():
        where = f"parallel_group_info.{key}"
        try:
            if not isinstance(g, dict):
                raise _BadGroup("a group is an object with group_name and global_ranks")
            name = g.get("group_name")
            # kind None: the view names it from group_name (_group_kind), like the other sources
            groups.append((None, None if name is None else str(name), _rank_list(g.get("global_ranks"))))
        except _BadGroup as exc:
            drops.append((str(exc), where))
    return groups, drops


class ParallelGroupsReader:
    """Reader for groups files and Ascend profiler_metadata.json's parallel_group_info."""

    name = "parallel_groups"

    def sniff(self, path: Path, head: bytes) -> str | None:
        body = strip_bom(head)
        if _JSON_HEAD.match(body):
            return "parallel_groups"
        if body.lstrip().startswith(b"{"):
            # profiler_metadata.json is small and written by torch_npu with json.dump: the key
            # sits in the head read here (64 KiB) in every file seen.
            if b'"parallel_group_info"' in body and b'"global_ranks"' in body:
                return "ascend_parallel_groups"
            return None
        return "parallel_groups" if _csv_header(body) else None

    def ingest(self, ctx: Context) -> Outcome:
        path = ctx.path
        if ctx.format == "ascend_parallel_groups":
            groups, drops = _groups_from_ascend(path)
            unit = "key"
        elif strip_bom(read_head(path, 64)).lstrip().startswith(b"{"):
            groups, drops = _groups_from_json(path)
            unit = "key"
        else:
            groups, drops = _groups_from_csv(path)
            unit = "line"
        if not groups:
            reason = drops[0][0] if drops else "the file lists no group"
            where = f"{unit} {drops[0][1]}" if drops else None
            raise InputError(path, f"no usable parallel group: {reason}", position=where)
        ctx.con.executemany(
            "INSERT INTO parallel_group_rows VALUES (?, ?, ?, ?, ?)",
            [[ctx.source_id, i, kind, name, ranks] for i, (kind, name, ranks) in enumerate(groups)],
        )
        message = f"{len(drops)} of {len(groups) + len(drops)} groups dropped (first: {drops[0][0]})" if drops else ""
        return Outcome(
            rows_seen=len(groups) + len(drops),
            rows_kept=len(groups),
            rows_dropped=len(drops),
            status="salvaged" if drops else "ok",
            message=message,
            drops=_drop_list(drops, unit),
            metadata={"kinds": sorted({k for k, _, _ in groups if k})},
        )


READER = ParallelGroupsReader()


def run_warnings(con, run: str) -> list[str]:
    """What the view parallel_groups dropped or changed in ``run``'s groups (the view
    parallel_group_problems), one line per file and problem, for the ingest summary."""
    from ..store import set_scope

    cur = con.cursor()
    try:
        set_scope(cur, run)  # the checks read this run's files only
        rows = cur.execute(
            """SELECT path, regexp_replace(regexp_replace(problem, '[:(].*', ''), '[0-9][-0-9,]*', 'N', 'g') AS what,
                      count(*),
                      min(written_group || ': ' || problem)
               FROM parallel_group_problems WHERE run = ? GROUP BY ALL ORDER BY 1, 2""",
            [run],
        ).fetchall()
    finally:
        cur.close()
    return [
        f"run {run!r}: {path}: {n} parallel group(s) not used as written ({first})"
        if n > 1
        else f"run {run!r}: {path}: parallel group {first}"
        for path, _what, n, first in rows
    ]
