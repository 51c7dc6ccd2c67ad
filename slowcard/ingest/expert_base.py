"""What the expert-data readers share: the outcome of a file, its drop message, and the patterns
and small parsers more than one family uses (see slowcard/ingest/experts.py for the formats)."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import InputError
from .base import Outcome

NPY_MAGIC = b"\x93NUMPY"

_EPOCH_RE = re.compile(r"(?:^|[^a-z])epoch[_-]?(\d+)", re.IGNORECASE)
_SCRAPE_TS_RE = re.compile(r"^#\s*scrape_ts\s*=\s*(\S+)\s*$")
_HOTSPOT_NAME_RE = re.compile(r"(?:^|[^a-z])(prefill|decode)[_-]?(\d+)\.csv$", re.IGNORECASE)
_HOTSPOT_CONFIG = "model_gen_config.json"


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


class ExpertsBase:
    """The outcome every expert-data family builds the same way."""

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
