"""The physical device behind each rank: host and device id of every file of a run, from what the
inputs carry, and ``--device-map FILE`` for the rest.

Read after a run's files are committed (``identify``), into the ``sources`` columns ``host``,
``device_id``, ``host_source`` and ``device_source``. First that answers wins:

host
  1. ``--device-map`` entry of the file's rank (``device_map``);
  2. the trace header's ``host_name`` (Kineto, already in ``sources.host``: ``trace_header``);
  3. the file name ``HOST_PID.<time>.pt.trace.json[.gz]`` of torch's tensorboard handler, whose
     default worker name is ``{hostname}_{pid}`` (``file_name``; a host name has no ``_``, so
     ``graph_capture_rank_0.<time>.pt.trace.json`` names no host);
  4. ``config.common_config.on_trace_ready._worker_name`` (``HOST_PID``) of the Ascend
     ``profiler_info_*.json`` beside the file's ``ASCEND_PROFILER_OUTPUT`` (``profiler_info``);
  5. the Ascend root folder name ``HOST_PID_<timestamp>_ascend_pt`` (``ascend_pt_dir``);
  6. an msServiceProfiler prof id ``ms_service_<host>-<pid>`` in the path (``prof_id``).
device id
  1. ``--device-map`` (``device_map``);
  2. the one device the file's kernels ran on: Kineto device events carry the device index as
     ``pid`` (``kernel_pid``), checked against ``deviceProperties`` ids when the header lists them;
  3. a Kineto header whose ``deviceProperties`` lists exactly one device (``device_properties``);
  4. the one ``Device_id`` of an Ascend kernel_details / op_summary CSV (``kernel_details``);
  5. the one ``PROF_*/device_<id>`` folder under the Ascend root (``prof_device_dir``).
Nothing else: ``local_rank = rank % devices`` is a guess and is never made; unknown stays NULL
and ``identify`` says how many ranks have no device. Library code: no printing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from . import store
from .errors import UsageError
from .ranks import ascend_pt_root, read_map_file

HOST_PID_TRACE = re.compile(r"^(?P<host>[A-Za-z0-9][A-Za-z0-9.-]*)_(?P<pid>\d+)\.\d+\.pt\.trace\.json(?:\.gz)?\Z")
WORKER = re.compile(r"^(?P<host>[A-Za-z0-9][A-Za-z0-9.-]*)_(?P<pid>\d+)\Z")
ASCEND_PT = re.compile(r"^(?P<host>[A-Za-z0-9][A-Za-z0-9.-]*)_(?P<pid>\d+)_\d+_ascend_pt\Z")
PROF_ID = re.compile(r"ms_service_(?P<host>[A-Za-z0-9][A-Za-z0-9.-]*?)-(?P<pid>\d+)(?:\.db)?\Z")
DEVICE_DIR = re.compile(r"^device_(\d+)\Z")
# the file formats whose rank runs on one device (service CSVs mix many processes)
DEVICE_FORMATS = ("kineto", "ascend_trace", "kernel_details", "op_summary")
DEVICE_EVENT_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def load_device_map(path: str | Path) -> dict[int, tuple[str | None, int | None]]:
    """rank -> (host, device id) from a CSV ``rank,host,device_id`` or JSON
    ``{"<rank>": {"host": "node1", "device_id": 3}}`` (either key may be left out)."""
    p = Path(path)
    data = read_map_file(p, "device map")
    try:
        if isinstance(data, dict):
            items = [
                (k, v.get("host"), v.get("device_id")) if isinstance(v, dict) else (k, None, v) for k, v in data.items()
            ]
            if any(not isinstance(v, dict) for v in data.values()):
                raise ValueError('each rank maps to an object {"host": ..., "device_id": ...}')
        else:
            rows = data
            if not rows or "rank" not in rows[0] or not {"host", "device_id"} & set(rows[0]):
                raise UsageError(f"{p}: a device map CSV needs a header 'rank,host,device_id'")
            items = [(r["rank"], r.get("host"), r.get("device_id")) for r in rows]
        out: dict[int, tuple[str | None, int | None]] = {}
        for rank, host, dev in items:
            r = int(str(rank).strip())
            d = None if dev is None or str(dev).strip() == "" else int(str(dev).strip())
            if r < 0 or (d is not None and d < 0) or isinstance(dev, (bool, float)):
                raise ValueError(f"rank {rank!r}: rank and device_id are integers >= 0")
            h = None if host is None or str(host).strip() == "" else str(host).strip()
            out[r] = (h, d)
    except (ValueError, TypeError) as exc:
        raise UsageError(
            f"{p}: the device map holds rank,host,device_id with integer rank and device_id ({exc})"
        ) from None
    return out


def shown_ranks(ranks: list[int]) -> str:
    """Ranks as a note shows them: the first 8, then "…"."""
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (", …" if len(ranks) > 8 else "")


def _worker_host(root: Path) -> str | None:
    """The host of ``_worker_name`` (``HOST_PID``) in the root's one profiler_info file."""
    infos = sorted(root.glob("profiler_info*.json"))
    if len(infos) != 1:
        return None
    try:
        data = json.loads(infos[0].read_text(encoding="utf-8"))
        name = data["config"]["common_config"]["on_trace_ready"]["_worker_name"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    m = WORKER.match(name) if isinstance(name, str) else None
    return m["host"] if m else None


def host_from_path(path: Path) -> tuple[str | None, str | None]:
    """(host, where from) that the file's name or its Ascend root names; (None, None) if none."""
    m = HOST_PID_TRACE.match(path.name)
    if m:
        return m["host"], "file_name"
    root = ascend_pt_root(path)
    if root is not None:
        host = _worker_host(root)
        if host:
            return host, "profiler_info"
        m = ASCEND_PT.match(root.name)
        if m:
            return m["host"], "ascend_pt_dir"
    for part in reversed(path.parts):
        m = PROF_ID.search(Path(part).stem if part.endswith(".db") else part)
        if m:
            return m["host"], "prof_id"
    return None, None


def _device_dir(path: Path) -> int | None:
    root = ascend_pt_root(path)
    if root is None:
        return None
    found = {int(m.group(1)) for d in root.glob("PROF_*/device_*") if (m := DEVICE_DIR.match(d.name))}
    return found.pop() if len(found) == 1 else None


PID_FORMATS = ("kineto", "ascend_trace")  # traces whose device kernels' pid is the device id


def kernel_pids(con, sids: list[int]) -> dict[int, list[int | None]]:
    """Distinct pids of the device events (DEVICE_EVENT_CATS) of each of files ``sids``, at most 3
    each, by ONE scan: a query per file scanned the rows of a whole batch of files 64 times over
    (they share row groups; 64 rank files: ~0.4 s of the ingest, bench/README "Many small rank
    files")."""
    if not sids:
        return {}
    cats = ", ".join(f"'{c}'" for c in DEVICE_EVENT_CATS)
    out: dict[int, list[int | None]] = {sid: [] for sid in sids}
    for sid, pid in con.execute(
        f"""SELECT DISTINCT source_id, TRY_CAST(pid AS INTEGER) FROM event_rows_all
            WHERE _in_files(source_id, {store._sids_literal(sids)}) AND cat IN ({cats})"""
    ).fetchall():
        if len(out[sid]) < 3:
            out[sid].append(pid)
    return out


def device_from_source(
    con, sid: int, fmt: str, metadata: dict, path: Path, pids: list[int | None] | None = None
) -> tuple[int | None, str | None]:
    """(device id, where from) of one file, or (None, None). ``pids``: its kernel_pids, when
    the caller read them for many files at once."""
    props = metadata.get("deviceProperties") if isinstance(metadata, dict) else None
    prop_ids = {d.get("id") for d in props if isinstance(d, dict)} if isinstance(props, list) else set()
    if fmt in PID_FORMATS:
        if pids is None:
            pids = kernel_pids(con, [sid])[sid]
        if len(pids) == 1 and pids[0] is not None and pids[0] >= 0 and (not prop_ids or pids[0] in prop_ids):
            return int(pids[0]), "kernel_pid"
        only = next(iter(prop_ids)) if len(prop_ids) == 1 else None
        if isinstance(only, int) and not isinstance(only, bool) and only >= 0:
            return only, "device_properties"
    ids = metadata.get("device_ids") if isinstance(metadata, dict) else None
    if isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], int):
        return ids[0], "kernel_details"
    d = _device_dir(path)
    if d is not None:
        return d, "prof_device_dir"
    return None, None


def identify(
    con, run: str, device_map: dict[int, tuple[str | None, int | None]] | None = None
) -> tuple[list[str], list[str]]:
    """Fill host / device_id (and where each came from) of the run's files; returns (notes,
    warnings): the ranks whose device stays unknown (a fact of the input, said under the ingest
    table), and --device-map entries for ranks the run does not have (a mistake, warned)."""
    rows = con.execute(
        "SELECT source_id, path, format, rank, host, metadata FROM sources WHERE run = ? ORDER BY source_id", [run]
    ).fetchall()
    updates = []
    pids = kernel_pids(con, [sid for sid, _path, fmt, *_rest in rows if fmt in PID_FORMATS])
    for sid, path, fmt, rank, host, meta in rows:
        try:
            metadata = json.loads(meta) if meta else {}
        except ValueError:
            metadata = {}
        p = Path(path)
        host_src: str | None = "trace_header" if host else None
        if not host:
            host, host_src = host_from_path(p)
        dev, dev_src = (
            device_from_source(con, sid, fmt, metadata, p, pids.get(sid)) if fmt in DEVICE_FORMATS else (None, None)
        )
        mapped = (device_map or {}).get(rank) if rank is not None else None
        if mapped:
            if mapped[0] is not None:
                host, host_src = mapped[0], "device_map"
            if mapped[1] is not None:
                dev, dev_src = mapped[1], "device_map"
        updates.append((host, host_src, dev, dev_src, sid))
    if updates:
        # one statement for all files (an UPDATE per file is a write commit each)
        named, values = store.json_rows(
            (
                ("host", "VARCHAR"),
                ("host_source", "VARCHAR"),
                ("device_id", "INTEGER"),
                ("device_source", "VARCHAR"),
                ("source_id", "INTEGER"),
            ),
            updates,
        )
        con.execute(
            f"""UPDATE sources SET host = u.host, host_source = u.host_source, device_id = u.device_id,
                   device_source = u.device_source
               FROM (SELECT {named}) u
               WHERE sources.source_id = u.source_id""",
            [values],
        )
    notes, warnings = [], []
    missing, no_host, no_dev, ranks = con.execute(
        """SELECT list(rank ORDER BY rank) FILTER (WHERE host IS NULL OR device_id IS NULL),
                  count(*) FILTER (WHERE host IS NULL), count(*) FILTER (WHERE device_id IS NULL), count(*)
           FROM rank_devices WHERE run = ?""",
        [run],
    ).fetchone()
    if missing:
        shown = shown_ranks(missing)
        unknown = " and ".join(w for w, n in (("host", no_host), ("device id", no_dev)) if n)
        notes.append(
            f"device: {len(missing)} of {ranks} rank(s) ({shown}) without a {unknown} in their files: stored "
            "as NULL, left out of `slowcard fleet`'s device counts; --device-map FILE (rank,host,device_id) names them"
        )
    if device_map:
        # a map for a whole cluster names ranks a smaller run lacks: only a map that names none of
        # the run's ranks is a mistake worth saying (the wrong file, or ranks numbered otherwise)
        have = {r for (r,) in con.execute("SELECT DISTINCT rank FROM rank_devices WHERE run = ?", [run]).fetchall()}
        if have and not have & set(device_map):
            warnings.append(
                f"run {run!r}: --device-map names none of the run's ranks ({shown_ranks(sorted(have))}); "
                "it was not used for this run"
            )
    return notes, warnings
