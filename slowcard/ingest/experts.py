"""Expert-parallel load data: expert-load tensors, expert maps and Prometheus scrapes.

Formats (``sources.format``), recognised by content:

``expert_load_json``
    The load tensor vLLM-Ascend all-gathers for EPLB, shape ``[moe_layers, ep_ranks,
    local_experts]`` (token counts per local physical slot), one per window. Accepted shapes::

        {"kind": "expert_load",
         "epoch": 0,                         # optional: EPLB epoch of every window
         "windows": [{"window": 0,           # optional, default: position in the list
                      "ts_ns": 1700000000000000000,   # optional window time, epoch ns
                      "epoch": 0,            # optional, overrides the top-level epoch
                      "load": [[[12, 7, ...], ...], ...]}, ...]}
        {"kind": "expert_load", "load": [[[...]]]}          # one window
        [[[...]]]                                            # bare 3-D list: one window
        [[[[...]]]]                                          # bare 4-D list: [window, layer, rank, slot]

``expert_load_csv``
    Long form, one row per cell: header ``window,layer,rank,local_expert,tokens`` (aliases:
    ``window_idx``/``iteration``/``step``, ``ep_rank``/``device_id``, ``local_slot``/``slot``,
    ``load``/``count``), optional ``ts_ns`` and ``epoch`` columns.

``expert_load_npy``
    NumPy ``.npy`` (read without numpy): little-endian int32/int64/float32/float64, C order;
    3-D = one window, 4-D = ``[window, layer, rank, local_expert]``.

``expert_map``
    vLLM-Ascend / MindStudio Insight expert map ``{"moe_layer_count", "layer_list": [{"layer_id",
    "device_count", "device_list": [{"device_id", "device_expert": [...]}]}]}``; one file per
    EPLB epoch. The epoch is the top-level ``"epoch"``, else ``epoch<N>`` in the file name, else 0;
    an optional top-level ``"ts_ns"`` says when the map took effect.

``expert_hotspot``
    MindIE expert hot-spot dump (MindStudio Insight's ``{prefill,decode}_<rank>.csv``): header-less,
    one line per MoE layer, one comma-separated token count per local expert slot of ONE rank.
    Recognised by shape (every line the same number of non-negative integers), which is weak,
    so the file name must also say ``prefill_<N>`` / ``decode_<N>`` or a ``model_gen_config.json``
    must sit beside it; the rank comes from the name (its last number). All dumps of one stage in
    one folder form one load tensor: their rows share ``series`` (``<stage>@<folder>``), window 0.
    When the config's ``num_moe_layers`` is smaller than the number of lines, only the last
    ``num_moe_layers`` lines are MoE layers (as MindStudio Insight reads them).

``prometheus_text``
    Prometheus text exposition scraped to a file: one scrape, or many separated by
    ``# scrape_ts=<unix seconds>`` lines, or samples with their own timestamps (ms). Parsed with
    ``prometheus_client`` (optional extra ``metrics``); every sample is kept in the generic
    ``metric_sample_rows`` table.

Windows of a single-window file (3-D tensor) take their index from ``window<N>``/``step<N>``/
``iter<N>`` in the file name (else 0), and their epoch from ``epoch<N>`` in the file name.
"""

from __future__ import annotations

import ast
import json
import math
import re
import struct
import sys
from collections import Counter
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

NPY_MAGIC = b"\x93NUMPY"
# dtype code (without byte order) -> (arrow type, item size)
_NPY_TYPES = {"i4": ("int32", 4), "i8": ("int64", 8), "f4": ("float32", 4), "f8": ("float64", 8)}  # pyarrow type, bytes

_EPOCH_RE = re.compile(r"(?:^|[^a-z])epoch[_-]?(\d+)", re.IGNORECASE)
_WINDOW_RE = re.compile(r"(?:^|[^a-z])(?:window|win|step|iter|iteration)[_-]?(\d+)", re.IGNORECASE)
_LOAD_KIND_RE = re.compile(rb'"kind"\s*:\s*"expert_load"')
_BARE_TENSOR_RE = re.compile(rb"^\[(\s*\[){2,}\s*[-+0-9.]")
_PROM_SAMPLE_RE = re.compile(
    r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?\s+([-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+)|NaN|[-+]?Inf)(\s+-?\d+)?$"
)
_SCRAPE_TS_RE = re.compile(r"^#\s*scrape_ts\s*=\s*(\S+)\s*$")
_HOTSPOT_LINE_RE = re.compile(r"^\s*[0-9]+(?:\s*,\s*[0-9]+)+\s*,?\s*$")
_HOTSPOT_NAME_RE = re.compile(r"(?:^|[^a-z])(prefill|decode)[_-]?(\d+)\.csv$", re.IGNORECASE)
_HOTSPOT_CONFIG = "model_gen_config.json"

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

_INSERT_WINDOW = """
INSERT INTO expert_load_rows (source_id, window_idx, ts_ns, epoch, layer, ep_rank, local_slot, tokens)
SELECT $sid, $win, $ts, $epoch,
       (r.i // ($R * $S))::INTEGER, ((r.i // $S) % $R)::INTEGER, (r.i % $S)::INTEGER, x.tokens
FROM range($n) r(i) POSITIONAL JOIN "{name}" x
WHERE isfinite(x.tokens) AND x.tokens >= 0
"""


def _name_int(regex: re.Pattern, path: Path) -> int | None:
    m = regex.search(path.name)
    return int(m.group(1)) if m else None


def _opt_int(value, what: str, path: Path, position: str) -> int | None:
    """An optional integer field (window, epoch, ts_ns): None stays None, anything else must be an int."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or int(value) != value:
        raise InputError(path, f"{what} must be an integer, got {value!r}", position=position)
    return int(value)


class ExpertsReader:
    """Reader of expert-load tensors, expert maps and Prometheus scrapes (see module docstring)."""

    name = "experts"

    # ------------------------------------------------------------------ sniff
    def sniff(self, path: Path, head: bytes) -> str | None:
        if head.startswith(NPY_MAGIC):
            return "expert_load_npy"
        body = strip_bom(head).lstrip()
        if body.startswith(b"{"):
            if b'"layer_list"' in body and (b'"device_list"' in body or b'"moe_layer_count"' in body):
                return "expert_map"
            if _LOAD_KIND_RE.search(body):
                return "expert_load_json"
            return None
        if body.startswith(b"["):
            return "expert_load_json" if _BARE_TENSOR_RE.match(body) else None
        text = body.decode("utf-8", errors="replace")
        lines = [ln.strip() for ln in text.splitlines()[:50] if ln.strip()]
        if not lines:
            return None
        if self._csv_columns(lines[0]) is not None:
            return "expert_load_csv"
        if self._is_hotspot(path, lines):
            return "expert_hotspot"
        if any(ln.startswith(("# TYPE ", "# HELP ")) or _SCRAPE_TS_RE.match(ln) for ln in lines[:20]):
            return "prometheus_text"
        samples = [ln for ln in lines[:5] if not ln.startswith("#")]
        # "key: value" notes (msServiceProfiler's cpu_frequency.txt) look like a sample of a metric
        # named "key:"; real metric names never end with the colon.
        if (
            samples
            and all(
                _PROM_SAMPLE_RE.match(ln) and not re.split(r"[{\s]", ln, maxsplit=1)[0].endswith(":") for ln in samples
            )
            and ("{" in samples[0] or ":" in samples[0])
        ):
            return "prometheus_text"
        return None

    @staticmethod
    def _is_hotspot(path: Path, lines: list[str]) -> bool:
        """A header-less matrix of counts, all lines as wide, named like a hot-spot dump or beside
        its model_gen_config.json (the shape alone could be any numeric CSV)."""
        if not all(_HOTSPOT_LINE_RE.match(ln) for ln in lines):
            return False
        if len({len(ln.rstrip(", ").split(",")) for ln in lines}) != 1:
            return False
        return bool(_HOTSPOT_NAME_RE.search(path.name)) or (path.parent / _HOTSPOT_CONFIG).is_file()

    def guess_note(self, path: Path, head: bytes, fmt: str) -> str | None:
        """What the per-file table should say when the format was guessed from weak evidence."""
        if fmt == "expert_hotspot":
            how = "its name" if _HOTSPOT_NAME_RE.search(path.name) else f"{_HOTSPOT_CONFIG} beside it"
            return (
                f"format guessed from the shape (header-less integer matrix) and {how}: MindIE expert "
                "hot-spot dump, rows = MoE layers, columns = local expert slots"
            )
        return None

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

    # ------------------------------------------------------------------ ingest
    def ingest(self, ctx: Context) -> Outcome:
        if ctx.format == "expert_load_npy":
            return self._ingest_npy(ctx)
        if ctx.format == "expert_load_json":
            return self._ingest_load_json(ctx)
        if ctx.format == "expert_load_csv":
            return self._ingest_csv(ctx)
        if ctx.format == "expert_map":
            return self._ingest_map(ctx)
        if ctx.format == "prometheus_text":
            return self._ingest_prometheus(ctx)
        if ctx.format == "expert_hotspot":
            return self._ingest_hotspot(ctx)
        raise InputError(ctx.path, f"unknown expert format {ctx.format!r}")

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
            depth = ExpertsReader._depth(load)
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
            {"path": str(path), "comp": "gzip" if is_gzip(path) else "none", "delim": delim},
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

    # --- expert maps ------------------------------------------------------
    def _ingest_map(self, ctx: Context) -> Outcome:
        path = ctx.path
        with open_bytes(path) as f:
            data = f.read()
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise InputError(
                path,
                f"expert map is not valid JSON ({exc})",
                position="document",
                hint="an expert map must be one complete JSON object",
            ) from None
        if not isinstance(doc, dict) or not isinstance(doc.get("layer_list"), list):
            raise InputError(path, 'expected an expert map object with a "layer_list" list', position="document")
        epoch = _opt_int(doc.get("epoch"), "epoch", path, "document")
        if epoch is None:
            epoch = _name_int(_EPOCH_RE, path)
        if epoch is None:
            epoch = 0
        ts_ns = _opt_int(doc.get("ts_ns"), "ts_ns", path, "document")
        layers = doc["layer_list"]

        # First pass: structure of each layer; collect (layer, device, slot, expert).
        parsed: list[tuple[int, str, list[tuple[int, int, int, int]] | None, str | None, int]] = []
        for li, layer in enumerate(layers):
            pos = f"layer_list[{li}]"
            rows, err, n = self._map_layer(layer)
            parsed.append((li, pos, rows, err, n))
        # The number of logical experts: the most common (max id + 1) over well-formed layers, so
        # one layer with a stray id does not make every other layer look incomplete.
        sizes = [max(e for _, _, _, e in rows) + 1 for _, _, rows, err, _ in parsed if rows and not err]
        n_experts = max(set(sizes), key=lambda s: (sizes.count(s), s)) if sizes else 0
        out: list[tuple] = []
        drops: list[tuple[str, str, int]] = []
        seen = 0
        layer_ids: set[int] = set()
        for _li, pos, rows, err, n in parsed:
            seen += max(n, 1)
            if err is None:
                assert rows is not None  # _map_layer gives rows whenever it gives no error
                lid = rows[0][0]
                experts = {e for _, _, _, e in rows}
                missing = sorted(set(range(n_experts)) - experts)
                extra = sorted(e for e in experts if e >= n_experts)
                if lid in layer_ids:
                    err = f"layer_id {lid} appears twice"
                elif extra:
                    err = f"layer {lid}: expert ids {extra[:8]} beyond the {n_experts} logical experts of the other layers"
                elif missing:
                    err = (
                        f"layer {lid}: logical experts {missing[:8]}{'…' if len(missing) > 8 else ''} are not placed "
                        f"on any device (expected all of 0..{n_experts - 1})"
                    )
            if err is not None:
                drops.append((err, pos, max(n, 1)))
                continue
            assert rows is not None
            layer_ids.add(rows[0][0])
            out.extend((ctx.source_id, epoch, ts_ns, lid, dev, slot, e) for lid, dev, slot, e in rows)
        if not out:
            first = drops[0] if drops else ("no layer in layer_list", "layer_list", 0)
            raise InputError(
                path,
                first[0],
                position=first[1],
                hint="each layer needs device_list[].device_expert covering every logical expert",
            )
        table = pa.table(
            {
                k: pa.array(v, type=t)
                for k, v, t in zip(
                    ["source_id", "epoch", "ts_ns", "layer", "ep_rank", "local_slot", "expert"],
                    zip(*out),
                    [pa.int32(), pa.int32(), pa.int64(), pa.int32(), pa.int32(), pa.int32(), pa.int32()],
                )
            }
        )
        with arrow_view(ctx, "experts_map", table) as name:
            ctx.con.execute(f'INSERT INTO expert_map_rows SELECT * FROM "{name}"')
        kept = len(out)
        seen = kept + sum(n for _, _, n in drops)
        declared = doc.get("moe_layer_count")
        # (layer, device, expert) placed in more than one slot of that device: kept as replicas
        placed = Counter((r[3], r[4], r[6]) for r in out)
        same_dev = sum(c - 1 for c in placed.values())
        dup_layers = len({k[0] for k, c in placed.items() if c > 1})
        meta = {
            "epoch": epoch,
            "ts_ns": ts_ns,
            "moe_layer_count": declared,
            "logical_experts": n_experts,
            "layers": len(layer_ids),
            "same_device_replicas": same_dev,
        }
        replicas = (
            f"{same_dev} extra slot(s) in {dup_layers} layer(s) repeat an expert already on the same device "
            "(kept as replicas)"
            if same_dev
            else ""
        )
        count = (
            f"moe_layer_count says {declared} but layer_list has {len(layers)} layers"
            if isinstance(declared, int) and declared != len(layers)
            else ""
        )
        return self._outcome(seen, kept, drops, meta, notes=(replicas, count))

    @staticmethod
    def _map_layer(layer) -> tuple[list[tuple[int, int, int, int]] | None, str | None, int]:
        """(rows, error, number of slots) of one layer_list entry."""
        if not isinstance(layer, dict):
            return None, "layer entry is not an object", 1
        lid = layer.get("layer_id")
        devices = layer.get("device_list")
        if isinstance(lid, bool) or not isinstance(lid, int) or not isinstance(devices, list) or not devices:
            return None, "layer needs an integer layer_id and a non-empty device_list", 1
        n = (
            sum(
                len(d["device_expert"])
                for d in devices
                if isinstance(d, dict) and isinstance(d.get("device_expert"), list)
            )
            or 1
        )
        count = layer.get("device_count")
        if count is not None and count != len(devices):
            return None, f"layer {lid}: device_count {count} but device_list has {len(devices)} devices", n
        rows: list[tuple[int, int, int, int]] = []
        seen_dev: set[int] = set()
        for d in devices:
            dev = d.get("device_id") if isinstance(d, dict) else None
            exps = d.get("device_expert") if isinstance(d, dict) else None
            if isinstance(dev, bool) or not isinstance(dev, int) or dev < 0 or not isinstance(exps, list):
                return None, f"layer {lid}: a device needs an integer device_id >= 0 and a device_expert list", n
            if dev in seen_dev:
                return None, f"layer {lid}: device_id {dev} appears twice", n
            seen_dev.add(dev)
            if any(isinstance(e, bool) or not isinstance(e, int) or e < 0 for e in exps):
                return None, f"layer {lid} device {dev}: device_expert holds a non-integer or negative id", n
            # The same logical expert twice on one device is kept: each slot is a replica that
            # takes its own share of the tokens (MindIE's real deployment maps do this).
            rows.extend((lid, dev, slot, e) for slot, e in enumerate(exps))
        if not rows:
            return None, f"layer {lid}: no expert placed", n
        return rows, None, n

    # --- Prometheus -------------------------------------------------------
    def _ingest_prometheus(self, ctx: Context) -> Outcome:
        path = ctx.path
        try:
            from prometheus_client.parser import text_string_to_metric_families  # noqa: F401 (error early)
        except ImportError:
            raise InputError(
                path,
                "reading Prometheus scrapes needs the optional package prometheus_client",
                hint="pip install -e .[metrics]",
            ) from None
        with open_bytes(path) as f:
            text = strip_bom(f.read()).decode("utf-8", errors="replace")
        lines = text.splitlines()
        # Split into scrapes at `# scrape_ts=` lines; a file without them is one scrape.
        scrapes: list[tuple[int, float | None, int, list[str]]] = []  # (index, ts_s, first line no, lines)
        cur: list[str] = []
        cur_ts: float | None = None
        cur_start = 1
        drops: list[tuple[str, str, int]] = []
        for no, line in enumerate(lines, start=1):
            m = _SCRAPE_TS_RE.match(line.strip())
            if m:
                if any(ln.strip() for ln in cur):
                    scrapes.append((len(scrapes), cur_ts, cur_start, cur))
                try:
                    cur_ts = float(m.group(1))
                    if not math.isfinite(cur_ts):
                        raise ValueError
                except ValueError:
                    cur_ts = None
                    drops.append(("scrape_ts is not unix seconds", f"line {no}", 0))
                cur, cur_start = [], no + 1
            else:
                cur.append(line)
        if any(ln.strip() for ln in cur):
            scrapes.append((len(scrapes), cur_ts, cur_start, cur))

        rows: list[tuple] = []
        seen = 0
        for idx, ts_s, start, block in scrapes:
            n_samples = sum(1 for ln in block if ln.strip() and not ln.lstrip().startswith("#"))
            seen += n_samples
            samples, block_drops = parse_exposition(block, start)
            rows.extend(self._sample_row(ctx.source_id, idx, ts_s, fam, typ, s) for fam, typ, s in samples)
            drops.extend(block_drops)
        kept = len(rows)
        if seen and kept == 0:
            raise InputError(
                path,
                "no Prometheus sample line parses",
                position=drops[0][1] if drops else None,
                hint='expected lines like `name{label="v"} 1.0 [timestamp_ms]`',
            )
        if rows:
            cols = list(zip(*rows))
            table = pa.table(
                {
                    "source_id": pa.array(cols[0], pa.int32()),
                    "scrape": pa.array(cols[1], pa.int32()),
                    "ts_ns": pa.array(cols[2], pa.int64()),
                    "family": pa.array(cols[3], pa.string()),
                    "type": pa.array(cols[4], pa.string()),
                    "name": pa.array(cols[5], pa.string()),
                    "labels": pa.array(cols[6], pa.string()),
                    "value": pa.array(cols[7], pa.float64()),
                }
            )
            with arrow_view(ctx, "experts_prom", table) as name:
                ctx.con.execute(
                    "INSERT INTO metric_sample_rows SELECT source_id, scrape, ts_ns, family, type, "
                    f'name, labels::JSON, value FROM "{name}"'
                )
        dropped = sum(n for _, _, n in drops)
        seen = max(seen, kept + dropped)
        return self._outcome(seen, kept, drops, {"scrapes": len(scrapes)})

    @staticmethod
    def _sample_row(sid: int, scrape: int, ts_s: float | None, family: str, typ: str, s) -> tuple:
        ts = s.timestamp if s.timestamp is not None else ts_s
        ts_ns = None
        if ts is not None:
            # prometheus_client gives float seconds; keep µs precision exactly
            ts_ns = int(round(float(ts) * 1e6)) * 1000
        labels = orjson.dumps(dict(sorted(s.labels.items()))).decode()
        value = float(s.value)
        return (sid, scrape, ts_ns, family, typ, s.name, labels, value)

    @staticmethod
    def _drop_message(drops: list[tuple[str, str, int]], *notes: str) -> str:
        """The first drops (where, why, how many), then each non-empty note, joined by '; '."""
        parts = [f"{pos}: {reason} ({n} dropped)" for reason, pos, n in drops[:3]]
        if len(drops) > 3:
            parts.append(f"+{len(drops) - 3} more")
        return "; ".join(parts + [n for n in notes if n])

    @classmethod
    def _outcome(
        cls, seen: int, kept: int, drops: list, metadata: dict, status: str | None = None, notes: tuple[str, ...] = ()
    ) -> Outcome:
        """A file's outcome: kept and dropped rows, salvaged when something was dropped."""
        return Outcome(
            rows_seen=seen,
            rows_kept=kept,
            rows_dropped=seen - kept,
            status=status or ("salvaged" if drops else "ok"),
            message=cls._drop_message(drops, *notes),
            drops=drops,
            metadata=metadata,
        )


def parse_exposition(block: list[str], start: int = 1) -> tuple[list[tuple], list[tuple[str, str, int]]]:
    """Parse one Prometheus text exposition (its lines; ``start`` = file line number of the first).

    Returns ([(family, type, prometheus_client Sample), ...], drops). The parser rejects a whole
    text for one bad line, so on failure every line is parsed alone (with its family's TYPE line in
    front so histograms and counters keep their type) and each bad line becomes a drop
    (reason, "line N", 1). Needs prometheus_client (ImportError otherwise). Also used by
    slowcard/watch.py on live scrapes.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: list[tuple] = []
    drops: list[tuple[str, str, int]] = []
    try:
        for fam in text_string_to_metric_families("\n".join(block) + "\n"):
            for s in fam.samples:
                out.append((fam.name, fam.type, s))
        return out, drops
    except Exception:
        out = []
    types: dict[str, str] = {}
    for off, line in enumerate(block):
        st = line.strip()
        if not st:
            continue
        if st.startswith("#"):
            parts = st.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3]
            continue
        base = re.split(r"[{\s]", st, maxsplit=1)[0]
        fam_name = next(
            (n for n in (base, re.sub(r"_(bucket|sum|count|total|created)$", "", base)) if n in types), None
        )
        snippet = (f"# TYPE {fam_name} {types[fam_name]}\n" if fam_name else "") + st + "\n"
        try:
            for fam in text_string_to_metric_families(snippet):
                for s in fam.samples:
                    out.append((fam.name, fam.type, s))
        except Exception as exc:
            detail = str(exc) or type(exc).__name__
            drops.append((f"metric line does not parse ({detail[:80]})", f"line {start + off}", 1))
    return out, drops


READER = ExpertsReader()
