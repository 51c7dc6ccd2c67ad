"""Deterministic synthetic expert-parallel load data: load tensors, expert maps, Prometheus scrapes.

A small MoE: ``LAYERS`` MoE layers, ``RANKS`` EP ranks, ``SLOTS`` local slots per rank, so
``RANKS * SLOTS`` logical experts (no redundant experts). The default placement puts logical
expert ``e`` on rank ``e // SLOTS``, slot ``e % SLOTS``. Every logical expert gets ``BASE``
tokens per window plus a small deterministic wobble (-5..+5); hot experts get ``factor`` times
that. A window's tensor ``[layer][rank][slot]`` holds the tokens of the expert placed there by the
map of the window's EPLB epoch.

Scenarios (``SCENARIOS``), ``WINDOWS`` windows 60 s apart from ``T0_NS``:

- ``concentrated``: experts 4 and 5 (both on rank 1) are 4x hot in every window and layer;
- ``spread``: experts 1, 5, 9, 13 (one per rank) are 4x hot in every window: rank loads stay equal;
- ``spike``: experts 4 and 5 are 3x hot in window 3 only;
- ``eplb_works``: as ``concentrated``; at window 3 EPLB epoch 1 swaps expert 5 with expert 0
  (rank 0), so ranks 0 and 1 each carry one hot expert;
- ``eplb_fails``: as ``concentrated``; epoch 1 swaps two cold experts (0 and 8), the hot pair
  stays on rank 1;
- ``slow_device``: balanced load (the slow device shows only in traces, not in expert load).

Not in ``SCENARIOS`` (written on demand): ``one_hot``: expert 13 (rank 3) gets 8x its tokens in
every window, 5.6x the layer's mean expert: heavier than a rank's fair share, so moving experts
cannot help, only replicas can (the run of issue 13).

Each scenario writes: the load (JSON, CSV or .npy), one expert map per epoch
(``expert_map_epoch<N>.json`` with ``ts_ns`` = the moment it took effect) and a Prometheus scrape
file (``metrics.prom``, one scrape per window separated by ``# scrape_ts=`` lines) with the
ms-service-metric EPLB gauges, per-DP gauges and, after an EPLB update, the
``eplb:expert_weight_update:duration`` histogram.

Same arguments -> byte-identical files.
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path

LAYERS, RANKS, SLOTS, WINDOWS = 4, 4, 4, 6
EXPERTS = RANKS * SLOTS
BASE = 100
T0_NS = 1_700_000_000_000_000_000
WINDOW_NS = 60_000_000_000
PREFIX = "vllm_profiling_"
UPDATE_WINDOW = 3  # EPLB epoch 1 starts with this window
UPDATE_COST_S = 0.85  # one expert-weight update, seconds (the histogram's _sum)

SCENARIOS = ("concentrated", "spread", "spike", "eplb_works", "eplb_fails", "slow_device")


@dataclass
class Scenario:
    name: str
    hot: dict[int, float] = field(default_factory=dict)  # logical expert -> factor
    hot_windows: tuple[int, ...] = tuple(range(WINDOWS))
    swap_at_update: tuple[int, int] | None = None  # experts swapped by EPLB epoch 1

    def epoch_of(self, window: int) -> int:
        return 1 if self.swap_at_update and window >= UPDATE_WINDOW else 0


def scenario(name: str) -> Scenario:
    hot2 = {4: 4.0, 5: 4.0}
    return {
        "concentrated": Scenario(name, hot2),
        "spread": Scenario(name, {1: 4.0, 5: 4.0, 9: 4.0, 13: 4.0}),
        "spike": Scenario(name, {4: 3.0, 5: 3.0}, hot_windows=(3,)),
        "eplb_works": Scenario(name, hot2, swap_at_update=(5, 0)),
        "eplb_fails": Scenario(name, hot2, swap_at_update=(0, 8)),
        "slow_device": Scenario(name, {}),
        "one_hot": Scenario(name, {13: 8.0}),
    }[name]


def default_placement() -> list[list[list[int]]]:
    """[layer][rank][slot] -> logical expert."""
    return [[[r * SLOTS + s for s in range(SLOTS)] for r in range(RANKS)] for _ in range(LAYERS)]


def placement(sc: Scenario, epoch: int) -> list[list[list[int]]]:
    place = default_placement()
    if epoch == 1 and sc.swap_at_update:
        a, b = sc.swap_at_update
        for layer in place:
            for slots in layer:
                for i, e in enumerate(slots):
                    slots[i] = b if e == a else a if e == b else e
    return place


def logical_tokens(sc: Scenario, window: int, layer: int, expert: int) -> int:
    wobble = (window * 7 + layer * 13 + expert * 5) % 11 - 5
    t = BASE + wobble
    if expert in sc.hot and window in sc.hot_windows:
        t = int(round(t * sc.hot[expert]))
    return t


def load_tensor(sc: Scenario, window: int) -> list[list[list[int]]]:
    place = placement(sc, sc.epoch_of(window))
    return [[[logical_tokens(sc, window, l, e) for e in place[l][r]] for r in range(RANKS)] for l in range(LAYERS)]


def window_ts(window: int) -> int:
    return T0_NS + (window + 1) * WINDOW_NS  # the window's end


def map_time(epoch: int) -> int:
    """When a map took effect: epoch 0 before the first window, epoch 1 just before UPDATE_WINDOW ends."""
    return T0_NS if epoch == 0 else window_ts(UPDATE_WINDOW - 1) + 1_000_000_000


def par(tensor_layer: list[list[float]]) -> float:
    loads = [sum(slots) for slots in tensor_layer]
    return max(loads) / (sum(loads) / len(loads))


# ------------------------------------------------------------------ writers
def map_doc(place: list[list[list[int]]], epoch: int | None = None, ts_ns: int | None = None) -> dict:
    doc: dict = {
        "moe_layer_count": len(place),
        "layer_list": [
            {
                "layer_id": l,
                "device_count": len(place[l]),
                "device_list": [{"device_id": r, "device_expert": list(place[l][r])} for r in range(len(place[l]))],
            }
            for l in range(len(place))
        ],
    }
    if epoch is not None:
        doc["epoch"] = epoch
    if ts_ns is not None:
        doc["ts_ns"] = ts_ns
    return doc


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, separators=(",", ":")) + "\n", encoding="utf-8")
    return path


def write_load_json(
    path: Path, tensors: list, ts: list[int | None] | None = None, epochs: list[int | None] | None = None
) -> Path:
    wins = []
    for w, t in enumerate(tensors):
        item: dict = {"window": w}
        if ts and ts[w] is not None:
            item["ts_ns"] = ts[w]
        if epochs and epochs[w] is not None:
            item["epoch"] = epochs[w]
        item["load"] = t
        wins.append(item)
    return write_json(path, {"kind": "expert_load", "windows": wins})


def write_load_csv(path: Path, tensors: list, ts: list[int] | None = None) -> Path:
    head = "window,layer,rank,local_expert,tokens" + (",ts_ns" if ts else "")
    lines = [head]
    for w, t in enumerate(tensors):
        for l, layer in enumerate(t):
            for r, slots in enumerate(layer):
                for s, v in enumerate(slots):
                    lines.append(f"{w},{l},{r},{s},{v}" + (f",{ts[w]}" if ts else ""))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def npy_bytes(
    values: list[float], shape: tuple[int, ...], descr: str = "<i8", fortran: bool = False, version: int = 1
) -> bytes:
    """A .npy file as numpy.save writes it (header padded so the data starts at a multiple of 64)."""
    code = descr[1:]
    typecode = {"i4": "i", "i8": "q", "f4": "f", "f8": "d"}[code]
    arr = array(typecode, values)
    if (descr[0] == ">") == (sys.byteorder == "little"):
        arr.byteswap()
    shape_txt = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    header = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape_txt}, }}"
    pre = 10 if version == 1 else 12
    pad = (-(pre + len(header) + 1)) % 64
    header = (header + " " * pad + "\n").encode("latin-1")
    size = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + size + header + arr.tobytes()


def flatten(x) -> list:
    out = []
    stack = [x]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(reversed(v))
        else:
            out.append(v)
    return out


def write_load_npy(path: Path, tensors: list, descr: str = "<i8") -> Path:
    shape = (len(tensors), len(tensors[0]), len(tensors[0][0]), len(tensors[0][0][0]))
    path.write_bytes(npy_bytes(flatten(tensors), shape, descr))
    return path


def prometheus_text(sc: Scenario, tensors: list) -> str:
    """One scrape per window (at its end + 1 s), ms-service-metric names with the vllm_profiling_ prefix."""
    out = []
    for w, t in enumerate(tensors):
        pars = [par(layer) for layer in t]
        out.append(f"# scrape_ts={(window_ts(w) + 1_000_000_000) / 1e9:.3f}")
        for g, v in (
            ("current_mean", sum(pars) / len(pars)),
            ("current_max", max(pars)),
            ("update_mean", sum(pars) / len(pars)),
            ("update_max", max(pars)),
        ):
            n = f"{PREFIX}eplb:expert_hotness:{g}"
            out += [
                f"# HELP {n} Expert hotness {g}.",
                f"# TYPE {n} gauge",
                f'{n}{{dp="0",phase="all",rank="0"}} {v:.4f}',
            ]
        n = f"{PREFIX}eplb:expert_hotness:imbalance"
        out += [f"# HELP {n} Per-layer peak-to-average expert load.", f"# TYPE {n} gauge"]
        out += [f'{n}{{dp="0",layer="{l}",phase="current",rank="0"}} {p:.4f}' for l, p in enumerate(pars)]
        if sc.swap_at_update and w >= UPDATE_WINDOW:
            n = f"{PREFIX}eplb:expert_weight_update:duration"
            out += [
                f"# HELP {n} Expert weight update duration (s).",
                f"# TYPE {n} histogram",
                f'{n}_bucket{{dp="0",le="0.5",phase="all"}} 0.0',
                f'{n}_bucket{{dp="0",le="1.0",phase="all"}} 1.0',
                f'{n}_bucket{{dp="0",le="+Inf",phase="all"}} 1.0',
                f'{n}_sum{{dp="0",phase="all"}} {UPDATE_COST_S}',
                f'{n}_count{{dp="0",phase="all"}} 1.0',
            ]
        for gauge, vals in (("waiting_batch_size", (3 + w % 2, 2)), ("free_kvcache_blocks", (900 - w, 950))):
            n = f"{PREFIX}{gauge}"
            out += [f"# HELP {n} {gauge}.", f"# TYPE {n} gauge"]
            out += [f'{n}{{dp="{dp}"}} {v}' for dp, v in enumerate(vals)]
    return "\n".join(out) + "\n"


def write_scenario(
    name: str,
    out_dir: Path,
    load_format: str = "json",
    maps: bool = True,
    explicit_epoch: bool = False,
    metrics: bool = True,
    map_ts: bool = True,
) -> list[Path]:
    """Write one scenario's files into out_dir; returns the paths.

    load_format: ``json`` (windows with ts_ns), ``csv`` (long form with ts_ns), ``npy`` (4-D int64,
    no times: give ``explicit_epoch`` or only one epoch). ``explicit_epoch`` writes each window's
    epoch into the JSON (else the epoch comes from the maps' ts_ns); ``map_ts=False`` leaves
    ``ts_ns`` out of the maps (then only explicit epochs place windows in epochs).
    """
    sc = scenario(name)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = [load_tensor(sc, w) for w in range(WINDOWS)]
    ts = [window_ts(w) for w in range(WINDOWS)]
    paths: list[Path] = []
    if load_format == "json":
        epochs = [sc.epoch_of(w) for w in range(WINDOWS)] if explicit_epoch else None
        paths.append(write_load_json(out_dir / "expert_load.json", tensors, ts, epochs))
    elif load_format == "csv":
        paths.append(write_load_csv(out_dir / "expert_load.csv", tensors, ts))
    elif load_format == "npy":
        if sc.swap_at_update:
            # .npy has no times: one file per epoch, the epoch in the file name
            for e in (0, 1):
                ws = [t for w, t in enumerate(tensors) if sc.epoch_of(w) == e]
                paths.append(write_load_npy(out_dir / f"expert_load_epoch{e}.npy", ws))
        else:
            paths.append(write_load_npy(out_dir / "expert_load.npy", tensors))
    else:
        raise ValueError(load_format)
    if maps:
        for e in sorted({sc.epoch_of(w) for w in range(WINDOWS)}):
            paths.append(
                write_json(
                    out_dir / f"expert_map_epoch{e}.json",
                    map_doc(placement(sc, e), ts_ns=map_time(e) if map_ts else None),
                )
            )
    if metrics:
        p = out_dir / "metrics.prom"
        p.write_text(prometheus_text(sc, tensors), encoding="utf-8")
        paths.append(p)
    return paths


def ingest(db_path: Path, paths: list[Path], run: str, con=None):
    """Ingest files with the project's driver (on ``con`` when given); returns its report."""
    from slowcard.ingest import ingest_paths

    return ingest_paths(db_path, [str(p) for p in paths], run=run, con=con)
