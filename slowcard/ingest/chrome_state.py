"""What one trace file's ingest holds (counts, drops, notes, time base, carried text) and the
one statement every path inserts rows with. Part of the Chrome-trace reader (slowcard/ingest/chrome.py)."""

from __future__ import annotations

from decimal import Decimal

from ..store import scalar
from .base import Context
from .chrome_ts import _insert_sql


class _IngestState:
    """The state of one file's ingest, shared by its phases (header, parts, exact path, driver)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.path = ctx.path
        self.header: dict = {}
        self.trailer: dict = {}
        self.kept = 0
        self.seen = 0
        self.drops: dict[str, list] = {}  # reason -> [first event index, count]
        self.status = "ok"
        self.notes: list[str] = []
        self.base_ns = 0
        self.carry = ""  # unparsed text after a failed part (a split event)
        self.carry_index = 0
        self.part_info: dict[str, tuple[bytes, str]] = {}  # part file -> (stripped separator, ts mode)
        self.max_abs_us = Decimal((1 << 63) - 1) / 1000
        self.oversize: int | None = None  # byte where an event over options.max_event_bytes starts
        self.tmpdir = ""  # the folder of this file's parts and pipes, made by the driver

    def _drop(self, reason: str, index: int, n: int = 1) -> None:
        entry = self.drops.setdefault(reason, [index, 0])
        entry[1] += n
        self.seen += n

    def _insert_files(self, files: list[str], ts_type: str) -> int:
        params = {"sid": self.ctx.source_id, "base_ns": self.base_ns, "files": files}
        return scalar(self.ctx.con, _insert_sql(ts_type), params)
