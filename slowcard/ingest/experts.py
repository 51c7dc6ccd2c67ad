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

import re
from pathlib import Path

from ..errors import InputError
from .base import Context, Outcome, strip_bom
from .expert_base import (
    _HOTSPOT_CONFIG,
    _HOTSPOT_NAME_RE,
    _SCRAPE_TS_RE,
    NPY_MAGIC,
)
from .expert_load import ExpertLoadFormats
from .expert_map import ExpertMapFormat
from .prometheus_text import PrometheusTextFormat

_BARE_TENSOR_RE = re.compile(rb"^\[(\s*\[){2,}\s*[-+0-9.]")
_HOTSPOT_LINE_RE = re.compile(r"^\s*[0-9]+(?:\s*,\s*[0-9]+)+\s*,?\s*$")
_LOAD_KIND_RE = re.compile(rb'"kind"\s*:\s*"expert_load"')
_PROM_SAMPLE_RE = re.compile(
    r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?\s+([-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+)|NaN|[-+]?Inf)(\s+-?\d+)?$"
)


class ExpertsReader(ExpertLoadFormats, ExpertMapFormat, PrometheusTextFormat):
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


READER = ExpertsReader()
