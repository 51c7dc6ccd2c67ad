"""How a part's ts and dur reach DuckDB exactly: the three ways a part is read (DOUBLE, VARCHAR,
exact), chosen from a sample of its ts texts, and the one INSERT statement of a part. Part of the
Chrome-trace reader (slowcard/ingest/chrome.py)."""

from __future__ import annotations

import json
import math
import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

SAMPLE_BYTES = 1 << 16  # head of each part inspected to choose how its ts is read


class _Num(float):
    """A JSON number with a fraction that remembers its text: ``ts`` keeps digits a double cannot
    hold (1704161511420306.491). Serialised again it is a plain float."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str):
        self = super().__new__(cls, text)
        self.text = text
        return self


_DECODER = json.JSONDecoder(parse_float=_Num)

# The columns DuckDB reads from every event; anything else in an event is ignored.
# ts must end up as exact integer nanoseconds. Two DuckDB 1.5 traps decide how it is read:
# - its JSON reader parses every JSON number as a double first; read as DECIMAL, the double is
#   then multiplied by 1000 in double arithmetic: 1704161511420306.5 becomes ...306.512 and the
#   real Kineto value 4458676624388.731 becomes ...388.732;
# - a string cast to a DECIMAL wider than 18 digits (needed for epoch µs with 3 decimals) costs
#   ~200 µs per value (DECIMAL(18,3) is fast but holds only 15 integer digits).
# So each part is read one of three ways, chosen from a sample of its ts texts (_ts_mode):
# - 'DOUBLE' (numbers only): ns = trunc(ts) * 1000 + round(fraction * 1000), on the exact integer
#   and fraction of the double: exact for every ts text a double holds to the ns (relative Kineto
#   ts, integer epoch µs, epoch µs ending in .0/.25/.5/.75);
# - 'VARCHAR' (some strings, e.g. Ascend "1704161511420306.491"): integer arithmetic on the text
#   (a number in a VARCHAR column arrives as its shortest round-trip text); anything that is not a
#   plain decimal ("1.5e3", "abc", true) fails the part, and the exact path judges each event;
# - 'exact': numbers with more digits than a double holds (1704161511420306.491 unquoted): parsed
#   event by event in Python from the original text (slower, exact).
_COLUMNS = (
    "{{ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'VARCHAR', tid: 'VARCHAR', "
    "ts: '{ts_type}', dur: 'DOUBLE', id: 'VARCHAR', args: 'JSON'}}"
)

_TS_NS = {
    "DOUBLE": "CAST(trunc(ts) AS BIGINT) * 1000 + CAST(round((ts - trunc(ts)) * 1000) AS BIGINT)",
    "VARCHAR": (
        "CASE WHEN ts IS NULL THEN NULL "
        # the common case, exactly 3 decimals ("1704161511420306.491", and every _normalise output)
        "WHEN strpos(ts, '.') = length(ts) - 3 AND right(ts, 1) BETWEEN '0' AND '9' "
        "THEN CAST(replace(ts, '.', '') AS BIGINT) "
        "WHEN regexp_full_match(ts, '\\s*-?[0-9]+(\\.[0-9]*)?\\s*') THEN "
        "CAST(split_part(trim(ts), '.', 1) AS BIGINT) * 1000 "
        "+ (CASE WHEN starts_with(trim(ts), '-') THEN -1 ELSE 1 END) "
        "* CAST(CAST('0.' || split_part(trim(ts), '.', 2) AS DECIMAL(18,3)) * 1000 AS BIGINT) "
        "ELSE error('ts is not a decimal number: ' || ts) END"
    ),
}

_INSERT = (
    "INSERT INTO event_rows SELECT $sid, ph, cat, name, pid, tid, {ts_ns} + $base_ns, "
    "CAST(round(dur * 1000) AS BIGINT), id, args "
    "FROM read_json($files, format = 'array', columns = {columns}, maximum_object_size = 16777216)"
)

# The same for the parts of several files at once (ingest/_shared.py): each part's rows take the
# source id and time base of its file, looked up by the part's name (read_json's filename column).
_SHARED_INSERT = (
    "INSERT INTO event_rows SELECT m.sid, ph, cat, name, pid, tid, {ts_ns} + m.base_ns, "
    "CAST(round(dur * 1000) AS BIGINT), id, args "
    "FROM read_json($files, format = 'array', columns = {columns}, maximum_object_size = 16777216, "
    "filename = true) "
    "JOIN (SELECT {parts}) m USING (filename)"
)
# The columns of that statement's parts table ``m`` (its {parts}: store.json_rows over $parts).
SHARED_PART_COLUMNS = (("filename", "VARCHAR"), ("sid", "INTEGER"), ("base_ns", "BIGINT"))

_TS_TEXT = re.compile(rb'"ts"\s*:\s*("?)\s*(-?[0-9][0-9.eE+-]*)')

_BOOL_TIME = re.compile(rb'"(?:ts|dur)"\s*:\s*(?:true|false)')

_ONE = Decimal(1)


def _insert_sql(ts_type: str) -> str:
    return _INSERT.format(ts_ns=_TS_NS[ts_type], columns=_COLUMNS.format(ts_type=ts_type))


def _shared_insert_sql(ts_type: str, parts: str) -> str:
    """``parts``: the select list of the parts table (filename, sid, base_ns)."""
    return _SHARED_INSERT.format(ts_ns=_TS_NS[ts_type], columns=_COLUMNS.format(ts_type=ts_type), parts=parts)


def _double_exact(text: str) -> bool:
    """True when the DOUBLE route gives this numeric ts text its exact nanoseconds."""
    try:
        exact = Decimal(text)
        f = float(text)
    except (InvalidOperation, ValueError):
        return False
    if not math.isfinite(f) or abs(f) >= 1e17:
        return True  # out of range either way: DuckDB fails the part, the exact path drops it
    return (exact * 1000).quantize(_ONE, ROUND_HALF_UP) == (Decimal(f) * 1000).quantize(_ONE, ROUND_HALF_UP)


# A ts text the DOUBLE route reads exactly without asking Decimal: at most 3 decimals and below
# 8e12 µs (up to 12 integer digits, or 13 starting with 1-7). Below 2^43 µs (8.8e12) a double's
# spacing is at most 2^-10 µs, so the value read is within 2^-11 µs (0.49 ns) of the text's: the
# rounding to whole ns lands on the text's ns (_double_exact agrees: tests/test_ingest_ts.py; from
# 8.8e12 it does not). Kineto's ts (µs since boot, 13 digits and 3 decimals in the real traces) are
# all like this, and the Decimal test of each was most of a small file's work before its INSERT.
_SHORT_DECIMAL = re.compile(rb"-?(?:[0-9]{1,12}|[1-7][0-9]{12})(?:\.[0-9]{1,3})?")


def _ts_mode(sample: bytes) -> str:
    """How to read ts in a part whose first bytes are ``sample``: 'DOUBLE', 'VARCHAR' or 'exact'
    (see _COLUMNS)."""
    if _BOOL_TIME.search(sample):
        return "exact"  # DuckDB would read true/false as 1/0 µs; the exact path drops them
    strings = False
    for m in _TS_TEXT.finditer(sample):
        if m.group(1):
            strings = True
            continue
        text = m.group(2)
        if _SHORT_DECIMAL.fullmatch(text):
            continue
        if text.strip(b"-0123456789") and not _double_exact(text.decode("ascii")):
            return "exact"  # a fraction or exponent a double cannot hold
    return "VARCHAR" if strings else "DOUBLE"
