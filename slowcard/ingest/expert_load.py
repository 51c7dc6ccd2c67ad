"""Expert-load tensors (``expert_load_json``, ``expert_load_csv``, ``expert_load_npy``) and MindIE
hot-spot dumps (``expert_hotspot``): token counts per (window, layer, rank, local slot) into
``expert_load_rows``. Formats: slowcard/ingest/experts.py."""

from __future__ import annotations

import ast
import json
import re
import struct
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    from .._lazy import LazyModule

    pa = LazyModule("pyarrow")  # imported on first use (issue 17)
    pc = LazyModule("pyarrow.compute")

from ..errors import InputError
from ..store import one_row, scalar
from .base import Context, Outcome, arrow_view, is_gzip, open_bytes, strip_bom
from .expert_base import (
    _EPOCH_RE,
    _HOTSPOT_CONFIG,
    _HOTSPOT_NAME_RE,
    NPY_MAGIC,
    ExpertsBase,
    _name_int,
    _opt_int,
)

_INSERT_WINDOW = """
INSERT INTO expert_load_rows (source_id, window_idx, ts_ns, epoch, layer, ep_rank, local_slot, tokens)
SELECT $sid, $win, $ts, $epoch,
       (r.i // ($R * $S))::INTEGER, ((r.i // $S) % $R)::INTEGER, (r.i % $S)::INTEGER, x.tokens
FROM range($n) r(i) POSITIONAL JOIN "{name}" x
WHERE isfinite(x.tokens) AND x.tokens >= 0
"""
# dtype code (without byte order) -> (arrow type, item size)
_NPY_TYPES = {"i4": ("int32", 4), "i8": ("int64", 8), "f4": ("float32", 4), "f8": ("float64", 8)}  # pyarrow type, bytes
_WINDOW_RE = re.compile(r"(?:^|[^a-z])(?:window|win|step|iter|iteration)[_-]?(\d+)", re.IGNORECASE)

# CSV header aliases -> canonical column
_CSV_ALIASES = {
    "window": "window",
    "window_idx": "window",
    "win": "window",
    "iteration": "window",
    "step": "window",
    "layer": "layer",
    "layer_id": "layer",
    "moe_layer": "layer",
    "rank": "ep_rank",
    "ep_rank": "ep_rank",
    "device_id": "ep_rank",
    "device": "ep_rank",
    "local_expert": "local_slot",
    "local_slot": "local_slot",
    "slot": "local_slot",
    "tokens": "tokens",
    "load": "tokens",
    "count": "tokens",
    "token_count": "tokens",
    "ts_ns": "ts_ns",
    "epoch": "epoch",
}

_CSV_REQUIRED = ("layer", "ep_rank", "local_slot", "tokens")


class ExpertLoadFormats(ExpertsBase):
    """Load tensors: JSON, CSV, NPY and hot-spot dumps into expert_load_rows."""

    @staticmethod
    def _csv_columns(header_line: str) -> tuple[str, list[str | None]] | None:
        """(delimiter, canonical name per column) when the line is an expert-load CSV header."""
        for delim in (",", "\t", ";"):
            if delim not in header_line:
                continue
            names = [c.strip().strip('"').strip().lower() for c in header_line.split(delim)]
            canon = [_CSV_ALIASES.get(n) for n in names]
            if all(req in canon for req in _CSV_REQUIRED):
                return delim, canon
        return None

    # --- load tensors -----------------------------------------------------
    def _insert_cells(
        self,
        ctx: Context,
        cells: pa.Array,
        dims: tuple[int, int, int],
        window: int | None,
        ts_ns: int | None,
        epoch: int | None,
    ) -> int:
        """Insert one window's flat C-order cells; returns the rows kept (finite, >= 0)."""
        L, R, S = dims
        if cells.type != pa.float64():
            cells = cells.cast(pa.float64())
        table = pa.table({"tokens": cells})
        valid = pc.and_(pc.is_finite(cells), pc.greater_equal(cells, 0.0))
        kept = pc.sum(pc.cast(valid, pa.int64())).as_py() or 0
        with arrow_view(ctx, "experts_cells", table) as name:
            ctx.con.execute(
                _INSERT_WINDOW.format(name=name),
                {"sid": ctx.source_id, "win": window, "ts": ts_ns, "epoch": epoch, "R": R, "S": S, "n": len(cells)},
            )
        return kept

    def _ingest_npy(self, ctx: Context) -> Outcome:
        path = ctx.path
        with open_bytes(path) as f:
            head = f.read(10)
            if len(head) < 10 or not head.startswith(NPY_MAGIC):
                raise InputError(path, "not a NumPy .npy file (magic \\x93NUMPY missing)", position="byte 0")
            major = head[6]
            if major == 1:
                (hlen,) = struct.unpack("<H", head[8:10])
                start = 10
            elif major in (2, 3):
                (hlen,) = struct.unpack("<I", head[8:10] + f.read(2))
                start = 12
            else:
                raise InputError(
                    path,
                    f"unsupported .npy format version {major}",
                    position="byte 6",
                    hint="save with numpy.save (format version 1, 2 or 3)",
                )
            raw_header = f.read(hlen)
            try:
                header = ast.literal_eval(raw_header.decode("latin-1"))
                descr, fortran, shape = header["descr"], header["fortran_order"], tuple(header["shape"])
            except Exception:
                raise InputError(
                    path,
                    "unreadable .npy header (expected a dict with descr, fortran_order, shape)",
                    position=f"byte {start}",
                ) from None
            dtype = self._npy_dtype(path, descr)
            if fortran:
                raise InputError(
                    path,
                    "Fortran-ordered .npy arrays are not supported",
                    position="header",
                    hint="save numpy.ascontiguousarray(load) instead",
                )
            if len(shape) not in (3, 4) or any(not isinstance(d, int) for d in shape):
                raise InputError(
                    path,
                    f"expert load tensor has {len(shape)} dimensions {list(shape)}; expected 3 "
                    "[moe_layers, ep_ranks, local_experts] or 4 [window, moe_layers, ep_ranks, local_experts]",
                    position="header shape",
                )
            arrow_type, item = dtype
            if len(shape) == 3:
                n_win, dims = 1, shape
                windows = [_name_int(_WINDOW_RE, path) or 0]
            else:
                n_win, dims = shape[0], shape[1:]
                windows = list(range(n_win))
            epoch = _name_int(_EPOCH_RE, path)
            per_win = dims[0] * dims[1] * dims[2]
            seen = n_win * per_win
            kept = 0
            drops: list[tuple[str, str, int]] = []
            status = "ok"
            for w in range(n_win):
                data = f.read(per_win * item)
                n_avail = len(data) // item
                if n_avail < per_win:
                    # Truncated file: keep the complete (layer) blocks of this window only, since a
                    # layer with missing ranks would give a wrong per-layer mean.
                    block = dims[1] * dims[2]
                    n_keep = (n_avail // block) * block
                    if n_keep:
                        cells = pa.Array.from_buffers(arrow_type, n_keep, [None, pa.py_buffer(data[: n_keep * item])])
                        kept += self._insert_cells(
                            ctx, cells, (n_keep // block, dims[1], dims[2]), windows[w], None, epoch
                        )
                    lost = seen - (w * per_win) - n_keep
                    drops.append(
                        (
                            "truncated tail: incomplete layer block",
                            f"window {windows[w]}, byte {start + hlen + (w * per_win + n_keep) * item}",
                            lost,
                        )
                    )
                    status = "truncated"
                    break
                cells = pa.Array.from_buffers(arrow_type, per_win, [None, pa.py_buffer(data)])
                kept += self._insert_cells(ctx, cells, tuple(dims), windows[w], None, epoch)
        truncated_lost = sum(n for r, _, n in drops if r.startswith("truncated"))
        bad_values = seen - truncated_lost - kept
        if bad_values:
            drops.append(("negative, NaN or infinite token count", "values", bad_values))
            status = "salvaged" if status == "ok" else status
        if kept == 0:
            raise InputError(
                path,
                "no usable expert-load cell (file truncated inside the first layer block, or every count negative/NaN)",
                position=drops[0][1] if drops else None,
            )
        return self._outcome(seen, kept, drops, {"shape": list(shape), "dtype": descr, "epoch": epoch}, status)

    @staticmethod
    def _npy_dtype(path: Path, descr) -> tuple[pa.DataType, int]:
        if not isinstance(descr, str) or len(descr) < 3:
            raise InputError(
                path,
                f"unsupported .npy dtype {descr!r}",
                position="header descr",
                hint="save the load as int32, int64, float32 or float64",
            )
        order, code = descr[0], descr[1:]
        native_little = sys.byteorder == "little"
        if order == ">" or (order == "=" and not native_little):
            raise InputError(
                path,
                f"big-endian .npy dtype {descr!r} is not supported",
                position="header descr",
                hint="save load.astype('<i8') (little-endian) instead",
            )
        if order not in "<=|" or code not in _NPY_TYPES:
            raise InputError(
                path,
                f"unsupported .npy dtype {descr!r}; expected little-endian int32, int64, float32 or float64",
                position="header descr",
                hint="save load.astype('<i8') or load.astype('<f8')",
            )
        arrow_type, size = _NPY_TYPES[code]
        return getattr(pa, arrow_type)(), size

    def _ingest_load_json(self, ctx: Context) -> Outcome:
        path = ctx.path
        with open_bytes(path) as f:
            data = f.read()
        drops: list[tuple[str, str, int]] = []
        truncated = False
        try:
            doc = orjson.loads(data)
            items = self._load_windows(path, doc)
        except orjson.JSONDecodeError as exc:
            items, tail = self._salvage_windows(path, data)
            truncated = True
            drops.append((f"unparsable JSON tail ({exc})", tail, 1))
        file_epoch = _name_int(_EPOCH_RE, path)
        seen = kept = 0
        dims0: tuple[int, int, int] | None = None
        windows_kept = 0
        bad_windows = 0
        for pos, item, default_window, top_epoch in items:
            try:
                if not isinstance(item, dict):
                    raise InputError(path, 'window entry is not an object with a "load" tensor', position=pos)
                window = _opt_int(item.get("window", default_window), "window", path, pos)
                ts_ns = _opt_int(item.get("ts_ns"), "ts_ns", path, pos)
                epoch = _opt_int(item.get("epoch", top_epoch), "epoch", path, pos)
                if epoch is None:
                    epoch = file_epoch
                cells, dims = self._tensor3(path, item.get("load"), pos)
                if dims0 is None:
                    dims0 = dims
                elif dims != dims0:
                    raise InputError(
                        path, f"tensor shape {list(dims)} differs from the first window's {list(dims0)}", position=pos
                    )
            except InputError as exc:
                bad_windows += 1
                n_cells = self._count_cells(item.get("load") if isinstance(item, dict) else None)
                seen += n_cells
                drops.append((exc.expected, pos, n_cells))
                continue
            n = dims[0] * dims[1] * dims[2]
            seen += n
            k = self._insert_cells(ctx, cells, dims, window, ts_ns, epoch)
            kept += k
            windows_kept += 1
            if k < n:
                drops.append(("negative, NaN or infinite token count", pos, n - k))
        if windows_kept == 0:
            first = drops[0] if drops else ("no window with a load tensor", "document", 0)
            raise InputError(
                path,
                first[0],
                position=first[1],
                hint='expected {"kind": "expert_load", "windows": [{"load": [layer][rank][slot]}]} '
                "or a bare 3-D/4-D list of token counts",
            )
        status = "truncated" if truncated else ("salvaged" if drops else "ok")
        # rows_seen counts cells; a bad window whose size cannot be known counts as one row
        seen = max(seen, kept + sum(n for _, _, n in drops))
        metadata = {"windows": windows_kept, "bad_windows": bad_windows, "shape": list(dims0) if dims0 else None}
        return self._outcome(seen, kept, drops, metadata, status)

    @staticmethod
    def _count_cells(load) -> int:
        """How many numbers a (bad) tensor holds, so that drops count cells like kept rows do; >= 1."""
        stack, n = [load], 0
        while stack:
            x = stack.pop()
            if isinstance(x, list):
                stack.extend(x)
            else:
                n += 1
        return max(n, 1)

    @staticmethod
    def _depth(x) -> int:
        d = 0
        while isinstance(x, list) and x:
            d += 1
            x = x[0]
        return d

    def _load_windows(self, path: Path, doc) -> list[tuple[str, object, int, int | None]]:
        """(position, window object, default window index, top-level epoch) per window."""
        if isinstance(doc, list):
            depth = self._depth(doc)
            if depth == 4:
                return [(f"window {i}", {"load": w}, i, None) for i, w in enumerate(doc)]
            if depth == 3:
                return [("tensor", {"load": doc}, _name_int(_WINDOW_RE, path) or 0, None)]
            raise InputError(
                path,
                f"expert load tensor has {depth} dimensions; expected 3 [moe_layers, ep_ranks, "
                "local_experts] or 4 [window, moe_layers, ep_ranks, local_experts]",
                position="document",
            )
        if not isinstance(doc, dict):
            raise InputError(path, "expected a JSON object or a nested list of token counts", position="document")
        top_epoch = _opt_int(doc.get("epoch"), "epoch", path, "document")
        if "windows" in doc:
            wins = doc["windows"]
            if not isinstance(wins, list):
                raise InputError(path, '"windows" must be a list', position="windows")
            return [(f"windows[{i}]", w, i, top_epoch) for i, w in enumerate(wins)]
        if "load" in doc:
            item = {k: doc[k] for k in ("load", "window", "ts_ns") if k in doc}
            return [("load", item, _name_int(_WINDOW_RE, path) or 0, top_epoch)]
        raise InputError(path, 'expert_load object has neither "windows" nor "load"', position="document")

    def _salvage_windows(self, path: Path, data: bytes):
        """Windows that parse before a cut/corrupt spot of a JSON file (the error path only)."""
        text = data.decode("utf-8", errors="replace")
        dec = json.JSONDecoder()
        body = text.lstrip("\ufeff \t\r\n")
        offset = len(text) - len(body)
        items: list = []
        if body.startswith("{"):
            m = re.search(r'"windows"\s*:\s*\[', body)
            if not m:
                raise InputError(path, 'JSON is cut or corrupt before the "windows" list', position="document")
            i = m.end()
            prefix = body[: m.start()]
            em = re.search(r'"epoch"\s*:\s*(-?\d+)', prefix)
            top_epoch = int(em.group(1)) if em else None
            label, make = "windows[{}]", (lambda obj: obj)
        elif body.startswith("["):
            i = 1
            top_epoch = None
            label, make = "window {}", (lambda obj: {"load": obj})
        else:
            raise InputError(path, "not JSON", position="byte 0")
        n = 0
        while True:
            while i < len(body) and body[i] in " \t\r\n,":
                i += 1
            if i >= len(body) or body[i] in "]}":
                break
            try:
                obj, end = dec.raw_decode(body, i)
            except ValueError:
                break
            if n == 0 and body.startswith("[") and self._depth(obj) < 3:
                raise InputError(
                    path,
                    "the 3-D tensor is cut or corrupt; a single window cannot be salvaged",
                    position=f"byte {offset + i}",
                    hint="re-export the expert load",
                )
            items.append((label.format(n), make(obj), n, top_epoch))
            n += 1
            i = end
        return items, f"byte {offset + i} (after {n} complete windows)"

    @staticmethod
    def _tensor3(path: Path, load, pos: str) -> tuple[pa.Array, tuple[int, int, int]]:
        """Validate one window's [layer][rank][slot] list; return flat C-order cells and dims."""
        if not isinstance(load, list) or not load:
            raise InputError(
                path, '"load" must be a non-empty 3-D list [moe_layers][ep_ranks][local_experts]', position=pos
            )
        try:
            arr = pa.array(load, type=pa.list_(pa.list_(pa.float64())))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            depth = ExpertLoadFormats._depth(load)
            raise InputError(
                path,
                f"tensor of the wrong rank or with non-numbers (found depth {depth}); expected 3 "
                "dimensions [moe_layers][ep_ranks][local_experts] of token counts",
                position=pos,
            ) from None
        ranks = pc.list_value_length(arr)
        flat1 = pc.list_flatten(arr)
        slots = pc.list_value_length(flat1)
        cells = pc.list_flatten(flat1)
        if arr.null_count or flat1.null_count or cells.null_count:
            raise InputError(path, "tensor contains null entries", position=pos)
        L = len(arr)
        R = ranks[0].as_py()
        bad = pc.indices_nonzero(pc.not_equal(ranks, R))
        if len(bad) or not R:
            i = bad[0].as_py() if len(bad) else 0
            raise InputError(
                path, f"ragged tensor: layer {i} has {ranks[i].as_py()} ranks, layer 0 has {R}", position=pos
            )
        S = slots[0].as_py()
        bad = pc.indices_nonzero(pc.not_equal(slots, S))
        if len(bad) or not S:
            j = bad[0].as_py() if len(bad) else 0
            raise InputError(
                path,
                f"ragged tensor: layer {j // R} rank {j % R} has {slots[j].as_py()} local experts, "
                f"layer 0 rank 0 has {S}",
                position=pos,
            )
        return cells, (L, R, S)

    def _ingest_csv(self, ctx: Context) -> Outcome:
        path = ctx.path
        with open_bytes(path) as f:
            first = strip_bom(f.readline()).decode("utf-8", errors="replace").strip()
        found = self._csv_columns(first)
        if found is None:
            raise InputError(
                path, "expected a header with layer, rank, local_expert and tokens columns", position="line 1"
            )
        delim, canon = found
        # Every line as one string with its exact line number; split and cast in SQL so that a
        # bad line (too few/many fields, a non-number) is dropped and counted, never the file.
        # Trailing delimiters are cut first: Ascend tools end numbers with a stray tab.
        src = (
            "read_csv($path, columns={'line': 'VARCHAR'}, header=false, delim='\x1f', quote='', escape='', "
            "auto_detect=false, strict_mode=false, compression=$comp) WITH ORDINALITY"
        )
        idx = {name: i + 1 for i, name in enumerate(canon) if name is not None}

        def col(name: str) -> str:
            return f"trim(f[{idx[name]}], ' \t\r\"')" if name in idx else "NULL"

        ncol = len(canon)
        con = ctx.con
        tmp = f"_experts_csv_{ctx.source_id}"
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE {tmp} AS
            WITH raw AS (
                SELECT ordinality AS line_no, string_split(rtrim(line, chr(13) || ' ' || $delim), $delim) AS f
                FROM {src} WHERE ordinality > 1 AND line IS NOT NULL AND trim(line) <> ''
            ), typed AS (
                SELECT line_no, len(f) AS nf,
                       {"TRY_CAST(" + col("window") + " AS INTEGER)" if "window" in idx else "0"} AS window_idx,
                       TRY_CAST({col("ts_ns")} AS BIGINT) AS ts_ns,
                       TRY_CAST({col("epoch")} AS INTEGER) AS epoch,
                       TRY_CAST({col("layer")} AS INTEGER) AS layer,
                       TRY_CAST({col("ep_rank")} AS INTEGER) AS ep_rank,
                       TRY_CAST({col("local_slot")} AS INTEGER) AS local_slot,
                       TRY_CAST({col("tokens")} AS DOUBLE) AS tokens,
                       {col("ts_ns")} AS ts_raw, {col("epoch")} AS epoch_raw
                FROM raw
            )
            SELECT *, CASE
                WHEN nf < {ncol} THEN 'missing fields (expected {ncol})'
                WHEN nf > {ncol} THEN 'too many fields (expected {ncol})'
                WHEN window_idx IS NULL OR layer IS NULL OR ep_rank IS NULL OR local_slot IS NULL
                  THEN 'window, layer, rank or local_expert is not an integer'
                WHEN layer < 0 OR ep_rank < 0 OR local_slot < 0 THEN 'negative layer, rank or local_expert'
                WHEN tokens IS NULL THEN 'tokens is not a number'
                WHEN NOT isfinite(tokens) OR tokens < 0 THEN 'negative, NaN or infinite token count'
                WHEN ts_ns IS NULL AND ts_raw IS NOT NULL AND ts_raw <> '' THEN 'ts_ns is not an integer'
                WHEN epoch IS NULL AND epoch_raw IS NOT NULL AND epoch_raw <> '' THEN 'epoch is not an integer'
              END AS reason
            FROM typed
        """,
            {"path": ctx.db_path, "comp": "gzip" if is_gzip(path) else "none", "delim": delim},
        )
        try:
            file_epoch = _name_int(_EPOCH_RE, path)
            con.execute(
                f"""
                INSERT INTO expert_load_rows (source_id, window_idx, ts_ns, epoch, layer, ep_rank, local_slot, tokens)
                SELECT $sid, window_idx, ts_ns, COALESCE(epoch, $epoch), layer, ep_rank, local_slot, tokens
                FROM {tmp} WHERE reason IS NULL
            """,
                {"sid": ctx.source_id, "epoch": file_epoch},
            )
            seen, kept = one_row(con, f"SELECT count(*), count(*) FILTER (WHERE reason IS NULL) FROM {tmp}")
            drops = [
                (r, f"line {ln}", n)
                for r, ln, n in con.execute(
                    f"SELECT reason, min(line_no), count(*) FROM {tmp} WHERE reason IS NOT NULL "
                    "GROUP BY reason ORDER BY 2"
                ).fetchall()
            ]
            dup = scalar(
                con,
                f"""SELECT count(*) FROM (SELECT 1 FROM {tmp} WHERE reason IS NULL
                                 GROUP BY window_idx, layer, ep_rank, local_slot HAVING count(*) > 1)""",
            )
        finally:
            con.execute(f"DROP TABLE IF EXISTS {tmp}")
        if seen and kept == 0:
            raise InputError(path, f"no usable row: {drops[0][0]}", position=drops[0][1])
        if seen == 0:
            raise InputError(path, "the CSV has a header but no data rows", position="line 2")
        meta = {"duplicate_cells": dup} if dup else {}
        note = f"{dup} (window, layer, rank, slot) cells appear more than once (summed by the views)" if dup else ""
        return self._outcome(seen, kept, drops, meta, notes=(note,))

    # --- MindIE hot-spot dumps --------------------------------------------
    def _ingest_hotspot(self, ctx: Context) -> Outcome:
        path = ctx.path
        m = _HOTSPOT_NAME_RE.search(path.name)
        nums = re.findall(r"\d+", path.stem)
        if m:
            stage, rank = m.group(1).lower(), int(m.group(2))
        elif nums:
            stage, rank = "unknown", int(nums[-1])
        else:
            raise InputError(
                path,
                "an expert hot-spot dump names its rank in the file name (prefill_<rank>.csv, "
                "decode_<rank>.csv); this name has no number",
                position="file name",
                hint="rename the file <stage>_<rank>.csv as MindIE writes it",
            )
        with open_bytes(path) as f:
            text = strip_bom(f.read()).decode("utf-8", errors="replace")
        lines = [(no, ln.strip()) for no, ln in enumerate(text.splitlines(), start=1) if ln.strip()]
        n_layers_cfg = self._hotspot_layers(path.parent / _HOTSPOT_CONFIG)
        drops: list[tuple[str, str, int]] = []
        width = None
        layer_lines = lines
        if n_layers_cfg is not None and len(lines) > n_layers_cfg:
            extra = len(lines) - n_layers_cfg
            drops.append(
                (
                    f"{extra} line(s) before the last num_moe_layers={n_layers_cfg} of {_HOTSPOT_CONFIG} "
                    "(not MoE layers)",
                    f"line {lines[0][0]}",
                    extra,
                )
            )
            layer_lines = lines[extra:]
        cols: dict[str, list] = {"layer": [], "local_slot": [], "tokens": []}
        for layer, (no, ln) in enumerate(layer_lines):
            cells = ln.rstrip(", ").split(",")
            if width is None:
                width = len(cells)
            try:
                vals = [int(c) for c in cells]
            except ValueError:
                drops.append(("not a list of integer token counts", f"line {no}", 1))
                continue
            if len(vals) != width:
                drops.append((f"{len(vals)} slots where line {layer_lines[0][0]} has {width}", f"line {no}", 1))
                continue
            cols["layer"].extend([layer] * width)
            cols["local_slot"].extend(range(width))
            cols["tokens"].extend(float(v) for v in vals)
        if not cols["layer"]:
            raise InputError(
                path, drops[0][0] if drops else "no line of token counts", position=drops[0][1] if drops else None
            )
        n = len(cols["layer"])
        table = pa.table(
            {
                "layer": pa.array(cols["layer"], pa.int32()),
                "local_slot": pa.array(cols["local_slot"], pa.int32()),
                "tokens": pa.array(cols["tokens"], pa.float64()),
            }
        )
        series = f"{stage}@{path.parent}"
        with arrow_view(ctx, "experts_hotspot", table) as name:
            ctx.con.execute(
                f"""INSERT INTO expert_load_rows (source_id, window_idx, ts_ns, epoch, layer, ep_rank,
                                local_slot, tokens, series)
                                SELECT $sid, 0, NULL, NULL, layer, $rank, local_slot, tokens, $series FROM "{name}" """,
                {"sid": ctx.source_id, "rank": rank, "series": series},
            )
        # rows are cells, like the other load formats; a dropped line counts its slots
        dropped = sum(n_ for _, _, n_ in drops) * (width or 1)
        seen = n + dropped
        return Outcome(
            rows_seen=seen,
            rows_kept=n,
            rows_dropped=dropped,
            status="salvaged" if drops else "ok",
            message=self._drop_message(drops),
            drops=[(r, pos, n_ * (width or 1)) for r, pos, n_ in drops],
            metadata={
                "stage": stage,
                "ep_rank": rank,
                "layers": len(set(cols["layer"])),
                "slots": width,
                "num_moe_layers": n_layers_cfg,
                "series": series,
            },
        )

    @staticmethod
    def _hotspot_layers(config: Path) -> int | None:
        """num_moe_layers of a model_gen_config.json beside the dumps; None when absent or unreadable."""
        try:
            doc = orjson.loads(config.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        v = doc.get("num_moe_layers") if isinstance(doc, dict) else None
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
