"""Prometheus text expositions scraped to a file (``prometheus_text``) into ``metric_sample_rows``;
``parse_exposition`` is shared with the live collector (slowcard/watch.py). Format:
slowcard/ingest/experts.py."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    import pyarrow as pa
else:
    from .._lazy import LazyModule

    pa = LazyModule("pyarrow")  # imported on first use (issue 17)

from ..errors import InputError
from .base import Context, Outcome, arrow_view, open_bytes, strip_bom
from .expert_base import (
    _SCRAPE_TS_RE,
    ExpertsBase,
)

# The latest time an int64 of nanoseconds holds (year 2262): a later or non-finite timestamp is no time.
MAX_TS_S = 9_223_372_036.0


class PrometheusTextFormat(ExpertsBase):
    """Scraped Prometheus text into metric_sample_rows, scrape by scrape."""

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
                    if not 0 <= cur_ts <= MAX_TS_S:  # also NaN and +-inf
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
            for fam, typ, s in samples:
                row = self._sample_row(ctx.source_id, idx, ts_s, fam, typ, s)
                if row is None:  # one bad time drops its sample, not the file (issue 31)
                    drops.append((f"sample timestamp is not unix seconds in 0..{MAX_TS_S:.0f}", f"line {start}", 1))
                else:
                    rows.append(row)
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
    def _sample_row(sid: int, scrape: int, ts_s: float | None, family: str, typ: str, s) -> tuple | None:
        """The row of one sample; None when its timestamp is no time (not finite, or beyond what
        an int64 of nanoseconds holds: 1e300 or Inf was an OverflowError that failed the file)."""
        ts = s.timestamp if s.timestamp is not None else ts_s
        ts_ns = None
        if ts is not None:
            # prometheus_client gives float seconds; keep µs precision exactly
            sec = float(ts)
            if not 0 <= sec <= MAX_TS_S:
                return None
            ts_ns = int(round(sec * 1e6)) * 1000
        labels = orjson.dumps(dict(sorted(s.labels.items()))).decode()
        value = float(s.value)
        return (sid, scrape, ts_ns, family, typ, s.name, labels, value)


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
