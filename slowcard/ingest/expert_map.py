"""Expert maps (``expert_map``: vLLM-Ascend / MindStudio Insight placement, one file per EPLB epoch)
into ``expert_map_rows``. Format: slowcard/ingest/experts.py."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    import pyarrow as pa
else:
    from .._lazy import LazyModule

    pa = LazyModule("pyarrow")  # imported on first use (issue 17)

from ..errors import InputError
from .base import Context, Outcome, arrow_view, open_bytes
from .expert_base import (
    _EPOCH_RE,
    ExpertsBase,
    _name_int,
    _opt_int,
)


class ExpertMapFormat(ExpertsBase):
    """Expert maps into expert_map_rows, layer by layer (a bad layer is dropped alone)."""

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
