"""Files of the profilers' tool chains that slowcard recognises but does not ingest.

A user points ``ingest`` at a whole profiler output folder; the files no reader needs (memory
records, companions of other files, intermediate tables of old tool versions) are reported as
skipped with what they are, instead of "unknown format". Recognised by content (a CSV header's
names, a JSON's keys, a one-line ``key: value``), except the two metadata companions that the
rank resolution reads by their fixed names. Nothing here reads more than the head of a file.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

# Read by name (slowcard.ranks reads them for the rank of the files beside them).
COMPANION = ("profiler_info", "profiler_metadata")

_KEY_VALUE = re.compile(rb"\A\s*[A-Za-z_][A-Za-z0-9_.]*\s*:\s*[-+0-9.eE]+\s*\Z")

# (header names that must all be present, what the file is). Names compare without case / spaces.
_CSV_KNOWN: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("Component", "Timestamp(us)", "Total Reserved(MB)"),
        "Ascend memory_record.csv / npu_module_mem.csv (memory usage over time; not used by the queries)",
    ),
    (
        ("Name", "Size(KB)", "Allocation Time(us)", "Release Time(us)"),
        "Ascend operator_memory.csv (per-operator allocations; not used by the queries)",
    ),
    (
        ("Op Name", "Graph ID", "Node Index Start", "Size(KB)"),
        "Ascend static_op_mem.csv (static graph memory; not used by the queries)",
    ),
    (
        ("Name", "Call Stack", "Host Self Duration(us)", "Device Self Duration(us)"),
        "Ascend operator_details.csv (per-operator host/device totals; kernel_details.csv has the device tasks)",
    ),
    (
        ("pid", "tid", "event_type", "start_time", "end_time", "mark_id", "domain"),
        "msServiceProfiler (2024) tx_data_df.csv: the raw events chrome_tracing.json is built from",
    ),
    (
        ("start_time", "end_time", "cpu_no", "usage", "during_time"),
        "msServiceProfiler (2024) cpu_data_df.csv: host CPU usage (also in chrome_tracing.json)",
    ),
    (
        ("time", "metrics"),
        "msServiceProfiler (2024) metric / request-status table (the same counters are in chrome_tracing.json)",
    ),
)


def _norm(name: str) -> str:
    return re.sub(r"[\s_]+", "", name.strip().lower())


def _header(head: bytes) -> set[str] | None:
    line = head.lstrip(b"\xef\xbb\xbf").split(b"\n", 1)[0].decode("utf-8", errors="replace").strip()
    if "," not in line or line.startswith(("{", "[")):
        return None
    try:
        return {_norm(n) for n in next(csv.reader([line]))}
    except (csv.Error, StopIteration):
        return None


def known(path: Path, head: bytes) -> str | None:
    """What a file no reader claims is, when it is a known non-data file; else None."""
    if path.name.startswith(COMPANION) and path.suffix == ".json":
        return "metadata companion file (read for rank identity)"
    body = head.lstrip(b"\xef\xbb\xbf")
    if len(body) < 256 and _KEY_VALUE.match(body):
        return (
            "a one-line `key: value` note (msServiceProfiler's cpu_frequency.txt / *_start_cnt.txt: "
            "clock constants of the raw data); not profiler data, nothing to ingest"
        )
    if body.lstrip().startswith(b"{") and b'"num_moe_layers"' in body and b'"num_of_experts"' in body:
        return (
            "MindIE model_gen_config.json: read with the expert hot-spot dumps beside it "
            "(num_moe_layers); nothing to ingest on its own"
        )
    names = _header(body)
    if names:
        for need, what in _CSV_KNOWN:
            if {_norm(n) for n in need} <= names:
                return f"{what}; not ingested"
    return None
