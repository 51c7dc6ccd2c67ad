"""The contract between the ingest driver and one format module.

A format module (``slowcard/ingest/<format>.py``) exposes ``READER``, an object with:

- ``name``: the family name (``chrome``, ``op_csv`` …);
- ``sniff(path, head) -> str | None``: given the first bytes of a file (already decompressed
  for ``.gz``), return the precise format name (stored in ``sources.format``) or None;
- ``ingest(ctx) -> Outcome``: write the file's rows into its own tables, tagged with
  ``ctx.source_id``, using ``ctx.con`` (already inside the file's transaction), and return counts.

Its tables are declared in ``slowcard/ingest/<format>.sql`` beside it. A module raises
``InputError`` for a file it cannot read at all; a partly bad file is salvaged and the drops
are returned in ``Outcome.drops``. Modules never print, never commit, and touch no other
format's tables.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import duckdb

from ._gz import GZIP_MAGIC


def max_event_bytes_from_env() -> int:
    """SLOWCARD_MAX_EVENT_MB (default 64): the largest single event / value a reader buffers.
    A larger one (a 4 GB string, a run of GBs of whitespace in a gzip bomb) ends the read there
    with a message instead of taking all memory."""
    import math
    import os

    try:
        mb = float(os.environ.get("SLOWCARD_MAX_EVENT_MB", "64"))
    except ValueError:
        mb = 64.0
    return int(mb * (1 << 20)) if math.isfinite(mb) and mb >= 1 else 64 << 20


@dataclass
class IngestOptions:
    """User options that reach the format modules."""

    tmp_dir: Path | None = None  # where part files go (default: /dev/shm or the system tmp)
    part_bytes: int = 64 << 20  # target size of one JSON part handed to DuckDB
    threads: int = 2  # DuckDB threads / parts per wave
    memory_limit: str = "512MB"  # DuckDB's buffer pool while ingesting (it caches what it writes)
    max_event_bytes: int = field(default_factory=max_event_bytes_from_env)  # one event / value at most


@dataclass
class Context:
    """One file being ingested."""

    path: Path
    format: str  # what sniff() returned
    source_id: int
    run: str
    con: duckdb.DuckDBPyConnection
    options: IngestOptions
    # Called with how many more bytes of the file (as stored: compressed for .gz) have been read,
    # from any thread, so a progress bar moves within one large file. Readers that do not call it
    # are counted whole when they finish.
    on_bytes: Callable[[int], None] | None = None
    # The path as DuckDB can open it (read_csv, read_json): ``path`` itself, or for a name that
    # is not UTF-8 (DuckDB takes UTF-8 names only) the file opened by the driver, as
    # /proc/self/fd/N (issue 31). Python code opens ``path``.
    db_path: str = ""
    # The batch this file is ingested with (ingest/_shared.py: one INSERT for the parts of all
    # its traces, one statement for their derived rows), or None: on its own.
    shared: Any = None

    def __post_init__(self) -> None:
        if not self.db_path:
            self.db_path = str(self.path)

    def read_bytes(self, n: int) -> None:
        if self.on_bytes and n > 0:
            self.on_bytes(n)


@dataclass
class Outcome:
    """What a format module reports back for one file.

    ``rows_seen == rows_kept + rows_dropped`` must hold; every drop has a reason in ``drops``.
    """

    rows_seen: int
    rows_kept: int
    rows_dropped: int = 0
    status: str = "ok"  # ok | salvaged | truncated
    message: str = ""
    drops: list[tuple[str, str, int]] = field(default_factory=list)  # (reason, position, n)
    # (reason, position, n) of rows kept whole but for one cell whose content was not read
    # (source_drops scope 'cell'; not part of rows_dropped)
    cell_drops: list[tuple[str, str, int]] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)  # header keys worth keeping
    rank_hints: dict = field(default_factory=dict)  # rank, world_size, dp_rank, host, … from content
    base_time_ns: int = 0


class Reader(Protocol):
    name: str

    def sniff(self, path: Path, head: bytes) -> str | None: ...

    def ingest(self, ctx: Context) -> Outcome: ...


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_bytes(path: Path) -> io.BufferedReader | gzip.GzipFile:
    """A binary stream of the file's content, decompressing gzip transparently (the stdlib
    ``gzip`` module: every member, zero padding after the last skipped; a cut stream raises
    EOFError where it stops)."""
    if is_gzip(path):
        return gzip.open(path, "rb")
    return open(path, "rb")


def read_head(path: Path, n: int = 1 << 16) -> bytes:
    """First n bytes of the (decompressed) content; raises OSError / EOFError / gzip errors."""
    with open_bytes(path) as f:
        return f.read(n)


def strip_bom(head: bytes) -> bytes:
    return head[3:] if head.startswith(b"\xef\xbb\xbf") else head


@contextmanager
def arrow_view(ctx: Context, prefix: str, table):
    """An Arrow table visible to SQL for the duration of a block, as ``_<prefix>_<source_id>``:
    files ingested in parallel (one cursor each) never share a name."""
    name = f"_{prefix}_{ctx.source_id}"
    ctx.con.register(name, table)
    try:
        yield name
    finally:
        ctx.con.unregister(name)
