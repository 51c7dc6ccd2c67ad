"""Rank and parallel coordinates of a file, from metadata, folder names, patterns and maps.

Precedence (first that answers wins), as the README documents:
1. ``--rank-map FILE`` entry for the file (an explicit statement by the user overrides the rest);
2. ``distributedInfo.rank`` from the trace header (Kineto);
3. ``profiler_info_{rank}.json`` in the enclosing ``*_ascend_pt`` folder, or in the folder that holds
   ``ASCEND_PROFILER_OUTPUT/`` when the root was renamed (its ``rank_id`` key, else the number in
   its name);
4. a vLLM worker folder name ``dp{d}_pp{p}_tp{t}_dcp{c}_ep{e}_rank{g}_…`` anywhere in the path;
5. ``--rank-pattern REGEX`` searched in the path (named group ``rank`` or the first group).
Nothing else: a file none of these names gets rank NULL and is reported, never called rank 0.
Coordinates (dp/tp/pp/ep) are taken from the vLLM folder name whenever it is present.
Reads metadata files and names only, never event bodies.
"""

from __future__ import annotations

import csv
import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError

VLLM_DIR = re.compile(
    r"(?:^|_)dp(?P<dp>\d+)_pp(?P<pp>\d+)_tp(?P<tp>\d+)(?:_dcp(?P<dcp>\d+))?_ep(?P<ep>\d+)_rank(?P<rank>\d+)"
)
PROFILER_INFO = re.compile(r"^profiler_info_(\d+)\.json$")


@dataclass
class RankInfo:
    rank: int | None = None
    source: str | None = None
    dp_rank: int | None = None
    tp_rank: int | None = None
    pp_rank: int | None = None
    ep_rank: int | None = None
    world_size: int | None = None
    host: str | None = None


def read_map_file(p: Path, what: str) -> dict | list[dict]:
    """A map file given on the command line (``--rank-map``, ``--device-map``): its JSON object,
    or the rows of its CSV (by header) when it does not start with '{'."""
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{p}: cannot read the {what} ({exc})") from None
    if not text.lstrip().startswith("{"):
        return list(csv.DictReader(text.splitlines()))
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{p}: the {what} is not valid JSON ({exc})") from None


def load_rank_map(path: str | Path) -> list[tuple[str, int]]:
    """Read a rank map: CSV with columns ``path,rank`` or JSON ``{"<path or glob>": rank}``.

    Entries match a file when equal to its absolute path, its name, or as a glob on either; a
    relative path with a '/' matches the file whose path ends with it.
    """
    p = Path(path)
    data = read_map_file(p, "rank map")
    entries: list[tuple[str, int]] = []
    try:
        if isinstance(data, dict):
            items = list(data.items())
        else:
            rows = data
            if not rows or "path" not in rows[0] or "rank" not in rows[0]:
                raise UsageError(f"{p}: a rank map CSV needs a header 'path,rank'")
            items = [(r["path"].strip(), (r["rank"] or "").strip()) for r in rows]
        for key, value in items:
            if isinstance(value, bool) or isinstance(value, float):
                raise ValueError(f"{key!r}: {value!r}")
            rank = int(value)
            if rank < 0:
                raise ValueError(f"{key!r}: {value!r} is negative")
            entries.append((key, rank))
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{p}: rank map values must be integers >= 0 ({exc})") from None
    return entries


def _from_map(path: Path, rank_map: list[tuple[str, int]]) -> int | None:
    full, name = str(path), path.name
    for key, rank in rank_map:
        if key in (full, name) or fnmatch.fnmatch(full, key) or fnmatch.fnmatch(name, key):
            return rank
        # a relative path ("rank3/trace.json") names the file by its trailing path components
        rel = key[2:] if key.startswith("./") else key
        if (
            not Path(rel).is_absolute()
            and "/" in rel
            and (full.endswith("/" + rel) or fnmatch.fnmatch(full, "*/" + rel))
        ):
            return rank
    return None


def ascend_pt_root(path: Path) -> Path | None:
    """The profiler's output root of a file: the enclosing ``*_ascend_pt`` folder, else the folder
    holding ``ASCEND_PROFILER_OUTPUT`` (renamed roots, e.g. ``test_rank_0/``), else None."""
    for parent in path.parents:
        if parent.name.endswith("_ascend_pt"):
            return parent
    for parent in path.parents:
        if parent.name == "ASCEND_PROFILER_OUTPUT":
            return parent.parent
    return None


def _from_profiler_info(root: Path) -> int | None:
    infos = sorted(root.glob("profiler_info*.json"))
    if len({i.name for i in infos if PROFILER_INFO.match(i.name)}) > 1:
        return None  # several ranks' files in one folder: none of them names this file
    for info in infos:
        try:
            data = json.loads(info.read_text(encoding="utf-8"))
            if isinstance(data, dict) and isinstance(data.get("rank_id"), int) and data["rank_id"] >= 0:
                return data["rank_id"]
        except (OSError, ValueError):
            pass
        m = PROFILER_INFO.match(info.name)
        if m:
            return int(m.group(1))
    return None


def resolve(
    path: Path, hints: dict, rank_pattern: str | None = None, rank_map: list[tuple[str, int]] | None = None
) -> RankInfo:
    """Work out the rank of one file. ``hints`` come from the file's own content."""
    info = RankInfo(world_size=hints.get("world_size"), host=hints.get("host"))
    m = None
    for part in reversed(path.parts):
        m = VLLM_DIR.search(part)
        if m:
            break
    if m:
        info.dp_rank, info.pp_rank = int(m["dp"]), int(m["pp"])
        info.tp_rank, info.ep_rank = int(m["tp"]), int(m["ep"])
    if "dp_rank" in hints and info.dp_rank is None:
        info.dp_rank = hints["dp_rank"]

    if rank_map:
        r = _from_map(path, rank_map)
        if r is not None:
            info.rank, info.source = r, "rank_map"
            return info
    if isinstance(hints.get("rank"), int):
        info.rank, info.source = hints["rank"], "distributedInfo"
        return info
    root = ascend_pt_root(path)
    if root is not None:
        r = _from_profiler_info(root)
        if r is not None:
            info.rank, info.source = r, "profiler_info"
            return info
    if m:
        info.rank, info.source = int(m["rank"]), "vllm_dirname"
        return info
    if rank_pattern:
        try:
            pm = re.search(rank_pattern, str(path))
        except re.error as exc:
            raise UsageError(f"--rank-pattern {rank_pattern!r} is not a valid regular expression: {exc}") from None
        if pm:
            g = pm.groupdict().get("rank") or (pm.group(1) if pm.groups() else None)
            if g is not None and g.isdigit():
                info.rank, info.source = int(g), "rank_pattern"
    return info
