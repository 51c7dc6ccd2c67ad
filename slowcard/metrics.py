"""Live service metrics -> per-window rows: the metric mapping and the window arithmetic.

Pure functions, no I/O (``slowcard/watch.py`` fetches and stores). A *snapshot* is every sample
of the mapped metrics at one instant, from a ``/metrics`` scrape or one step of a Prometheus
range query. Two consecutive snapshots make one *window*:

- gauges (running / waiting requests, KV-cache usage) take the later snapshot's value;
- counters (prompt / generation tokens, finished requests) become rates: the increase of each
  raw series over the window / its length. A series that went DOWN was reset (the exporter
  restarted): its increase is its new value (what it counted since the restart) and the window
  is marked ``reset``; it never becomes a negative or a huge rate;
- histograms (TTFT, end-to-end latency) become quantiles of the window: the increase of every
  ``le`` bucket (resets as for counters), interpolated inside the bucket like PromQL's
  ``histogram_quantile``.

Rows are per DP domain (the ``engine`` label of vLLM's per-engine metrics, else the endpoint's
DP number) and one row for the whole instance (``dp_rank`` NULL: the sum of the domains'
increases, so its quantiles are those of every request of the window).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

# canonical name -> (kind, exposed names tried in order). vLLM names the KV-cache gauge
# gpu_cache_usage_perc in V0 and kv_cache_usage_perc in V1; both are 0-1 fractions.
VLLM_MAPPING: dict[str, tuple[str, tuple[str, ...]]] = {
    "running": ("gauge", ("vllm:num_requests_running",)),
    "waiting": ("gauge", ("vllm:num_requests_waiting",)),
    "kv_usage": ("gauge", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    "requests": ("counter", ("vllm:request_success_total",)),
    "prompt_tokens": ("counter", ("vllm:prompt_tokens_total",)),
    "generation_tokens": ("counter", ("vllm:generation_tokens_total",)),
    "ttft": ("histogram", ("vllm:time_to_first_token_seconds",)),
    "e2e": ("histogram", ("vllm:e2e_request_latency_seconds",)),
    # Tokens routed to each expert slot (labels layer, rank = EP rank, slot = local slot). No
    # upstream exporter has a standard name for it: point it at yours with --metric expert_tokens=NAME.
    "expert_tokens": ("counter", ("vllm:expert_tokens_total",)),
}
KINDS = ("gauge", "counter", "histogram")
DP_LABELS = ("engine", "dp", "dp_rank")

# MindIE Service's /metrics (Prometheus format, served with MIES_SERVICE_MONITOR_MODE=1 on the
# metricsPort): the same quantities without the "vllm:" prefix and with a model_name label only.
# Sources: MindIE Service docs "服务管控指标查询接口(普罗格式)",
# https://www.hiascend.com/document/detail/zh/mindie/21RC1/mindieservice/servicedev/mindie_service0103.html
# (request_success_total, num_requests_running/waiting, prompt_tokens_total,
# generation_tokens_total, ...), and MindIE-LLM's PrometheusMetrics::InitPrometheusMetrics
# (prometheus_metrics.cpp: time_to_first_token_seconds and e2e_request_latency_seconds histograms,
# npu_cache_usage_perc gauge "1 means 100 percent usage"). No label carries a DP domain: each
# DP instance serves its own /metrics, so the domain is the endpoint's URL=DP (or its position).
MINDIE_MAPPING: dict[str, tuple[str, tuple[str, ...]]] = {
    "running": ("gauge", ("num_requests_running",)),
    "waiting": ("gauge", ("num_requests_waiting",)),
    "kv_usage": ("gauge", ("npu_cache_usage_perc",)),
    "requests": ("counter", ("request_success_total",)),
    "prompt_tokens": ("counter", ("prompt_tokens_total",)),
    "generation_tokens": ("counter", ("generation_tokens_total",)),
    "ttft": ("histogram", ("time_to_first_token_seconds",)),
    "e2e": ("histogram", ("e2e_request_latency_seconds",)),
    "expert_tokens": ("counter", ("expert_tokens_total",)),  # no MindIE standard name either: --metric
}

# Exporters `watch --exporter` knows: (mapping, DP labels, where the names come from).
# vLLM-Ascend is a platform plugin of vLLM (entry point vllm.platform_plugins "ascend"): the API
# server, and with it /metrics, is upstream vLLM's, so the names are vLLM's (vllm:*, the V1
# per-engine label `engine` = the DP rank; vLLM docs/design/metrics.md). Its profiling endpoints
# and msServiceProfiler switch: vllm-project/vllm-ascend
# docs/source/developer_guide/performance_and_debug/service_profiling_guide.md.
EXPORTERS: dict[str, tuple[dict[str, tuple[str, tuple[str, ...]]], tuple[str, ...], str]] = {
    "vllm": (VLLM_MAPPING, DP_LABELS, "vLLM docs/design/metrics.md (vllm/v1/metrics/loggers.py)"),
    "vllm-ascend": (VLLM_MAPPING, DP_LABELS, "vLLM's own metrics (vllm-ascend is a vLLM platform plugin)"),
    "mindie": (
        MINDIE_MAPPING,
        (),
        "MindIE Service metrics docs (mindie_service0103) and MindIE-LLM prometheus_metrics.cpp",
    ),
}
EP_RANK_LABELS = ("rank", "ep_rank", "device_id")
SLOT_LABELS = ("slot", "local_slot", "local_expert")


@dataclass
class Mapping:
    """Which exposed metric feeds which canonical series, and which label is the DP rank."""

    metrics: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=lambda: dict(VLLM_MAPPING))
    dp_labels: tuple[str, ...] = DP_LABELS

    @classmethod
    def for_exporter(cls, name: str) -> Mapping:
        """The mapping of a known exporter (EXPORTERS); ValueError for an unknown one."""
        if name not in EXPORTERS:
            raise ValueError(f"unknown exporter {name!r}; known: {', '.join(EXPORTERS)}")
        metrics, labels, _source = EXPORTERS[name]
        return cls(dict(metrics), labels)

    def override(self, canonical: str, name: str) -> None:
        """Use ``name`` for ``canonical`` (raises ValueError for an unknown canonical name)."""
        if canonical not in self.metrics:
            raise ValueError(f"unknown metric {canonical!r}; known: {', '.join(self.metrics)}")
        kind, _ = self.metrics[canonical]
        self.metrics[canonical] = (kind, (name,))

    def wanted(self) -> dict[str, tuple[str, str]]:
        """Exposed sample name -> (canonical, part); part is value | bucket | sum | count."""
        out: dict[str, tuple[str, str]] = {}
        for canon, (kind, names) in self.metrics.items():
            for n in names:
                if kind == "histogram":
                    for part in ("bucket", "sum", "count"):
                        out[f"{n}_{part}"] = (canon, part)
                else:
                    out[n] = (canon, "value")
                    if kind == "counter" and not n.endswith("_total"):
                        out[n + "_total"] = (canon, "value")
                    if kind == "counter" and n.endswith("_total"):
                        out[n[: -len("_total")]] = (canon, "value")  # a family name as parsed
        # The same names with ':' escaped to '_': prometheus_client's OpenMetrics output does that,
        # so a Prometheus server scraping vLLM may store vllm_num_requests_running.
        for n, hit in list(out.items()):
            out.setdefault(n.replace(":", "_"), hit)
        return out

    def kind(self, canonical: str) -> str:
        return self.metrics[canonical][0]


# A series key: (target, dp_rank, canonical, part, le, other labels as a sorted tuple)
SeriesKey = tuple


@dataclass
class Snapshot:
    """The mapped samples of every target at one instant (ts_ns)."""

    ts_ns: int
    values: dict = field(default_factory=dict)  # SeriesKey -> float
    targets: set = field(default_factory=set)  # targets that answered
    experts: dict = field(default_factory=dict)  # (target, layer, ep_rank, slot) -> float


# Numbers that become keys: a DP rank, an EP rank, a layer or a slot is a whole number in
# 0..MAX_INDEX (a label "inf", "1e30" or "-1" is no rank: the sample is dropped and counted, the
# rest of the scrape is kept; DuckDB's INTEGER column could not even hold "1e30").
MAX_INDEX = (1 << 20) - 1
# A sample value beyond this magnitude (or NaN / +-Inf) is dropped: sums and rates of such values
# overflow to Infinity, which no verdict can read and no JSON can carry.
MAX_VALUE = 1e18

# add_sample's answer for a sample that is not one of the mapped metrics (not a drop: the
# exposition simply holds other metrics too)
NOT_MAPPED = "not a mapped metric"


def check_index(raw, what: str) -> tuple[int | None, str | None]:
    """(value, None) for a whole number 0..MAX_INDEX given as text or number, else (None, why)."""
    try:
        text = str(raw).strip()
        value = int(text) if re.fullmatch(r"[+]?\d{1,12}", text) else float(text)
    except (TypeError, ValueError):
        return None, f"{what} {str(raw)[:40]!r} is not a number"
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            return None, f"{what} {str(raw)[:40]!r} is not a whole number"
        value = int(value) if abs(value) <= MAX_INDEX + 1 else MAX_INDEX + 1
    if not 0 <= value <= MAX_INDEX:
        return None, f"{what} {str(raw)[:40]!r} is out of range (0..{MAX_INDEX})"
    return value, None


def add_sample(
    snap: Snapshot,
    mapping: Mapping,
    wanted: dict,
    target: str,
    default_dp: int | None,
    name: str,
    labels: dict,
    value: float,
    forced_dp: int | None = None,
) -> str | None:
    """Put one exposed sample into the snapshot. Returns None when it was stored, NOT_MAPPED when
    it is not a mapped metric, else why it was dropped (a number that cannot be a rank, a bucket
    bound or a value: the caller counts it and keeps the rest of the scrape).

    The DP rank is ``forced_dp`` (the user mapped the endpoint to a domain), else the sample's DP
    label (vLLM's ``engine``), else ``default_dp`` (the endpoint's position)."""
    hit = wanted.get(name)
    if hit is None:
        return NOT_MAPPED
    try:
        value = float(value)
    except (TypeError, ValueError):
        return f"{name}: value {str(value)[:40]!r} is not a number"
    if not math.isfinite(value) or abs(value) > MAX_VALUE:
        return f"{name}: value {value!r} is not a finite number of at most {MAX_VALUE:g}"
    canon, part = hit
    if canon == "expert_tokens":
        key_parts = []
        for what, names in (("layer", ("layer",)), ("EP rank", EP_RANK_LABELS), ("slot", SLOT_LABELS)):
            raw = next((labels[n] for n in names if labels.get(n) is not None), None)
            if raw is None:
                return f"{name}: no {what} label ({', '.join(names)})"
            got, why = check_index(raw, f"{what} label")
            if why:
                return f"{name}: {why}"
            key_parts.append(got)
        key = (target, *key_parts)
        snap.experts[key] = snap.experts.get(key, 0.0) + value
        return None
    dp = forced_dp
    if dp is None:
        raw = next((labels[n] for n in mapping.dp_labels if labels.get(n) is not None), None)
        if raw is not None:
            dp, why = check_index(raw, "DP label")
            if why:
                return f"{name}: {why}"
    if dp is None:
        dp = default_dp
    if dp is None:
        return f"{name}: no DP label ({', '.join(mapping.dp_labels)}) and no DP for the endpoint"
    le = None
    if part == "bucket":
        raw = labels.get("le")
        try:
            le = float(str(raw)) if raw is not None else math.nan  # '+Inf' is the last bucket
        except (TypeError, ValueError):
            return f"{name}: bucket bound le={str(raw)[:40]!r} is not a number"
        if math.isnan(le):
            return f"{name}: bucket bound le={str(raw)[:40]!r} is not a number"
    skip = set(mapping.dp_labels) | {"le", "__name__", "instance", "job"}
    rest = tuple(sorted((k, str(v)) for k, v in labels.items() if k not in skip))
    snap.values[(target, dp, canon, part, le, rest)] = value
    snap.targets.add(target)
    return None


def increase(prev: float | None, cur: float) -> tuple[float, bool]:
    """A counter's increase over a window and whether it was reset (went down) inside it."""
    if prev is None:
        return cur, False  # a series born inside the window counted from 0
    if cur < prev:
        return cur, True
    return cur - prev, False


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """PromQL's histogram_quantile on cumulative (le, count) buckets: None without observations."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][0] != math.inf:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == math.inf:
                return prev_le  # above the last finite bound: its bound, as PromQL
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


WINDOW_COLUMNS = (
    "ts_ns",
    "window_s",
    "dp_rank",
    "targets",
    "running",
    "waiting",
    "kv_usage",
    "requests_per_s",
    "prompt_tokens_per_s",
    "generation_tokens_per_s",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "e2e_p50_ms",
    "e2e_p95_ms",
    "e2e_p99_ms",
    "reset",
)


def window_rows(prev: Snapshot, cur: Snapshot, mapping: Mapping) -> list[dict]:
    """One row per DP domain seen in ``cur`` plus an instance row (dp_rank None).

    Rates and quantiles of a domain come only from targets present in both snapshots (a target
    that just (re)appeared has no window yet); gauges come from ``cur``.
    """
    dt_s = (cur.ts_ns - prev.ts_ns) / 1e9
    if dt_s <= 0:
        return []
    both = cur.targets & prev.targets
    gauges: dict = {}  # (dp, canon) -> sum (running, waiting) / list (kv)
    rates: dict = {}  # (dp, canon) -> increase
    hist: dict = {}  # (dp, canon, le) -> increase
    reset: set = set()
    targets: dict = {}  # dp -> set of targets
    for key, v in cur.values.items():
        target, dp, canon, part, le, _rest = key
        targets.setdefault(dp, set()).add(target)
        kind = mapping.kind(canon)
        if kind == "gauge":
            gauges.setdefault((dp, canon), []).append(v)
            continue
        if target not in both:
            continue
        inc, was_reset = increase(prev.values.get(key), v)
        if was_reset:
            reset.add(dp)
        if kind == "counter":
            rates[(dp, canon)] = rates.get((dp, canon), 0.0) + inc
        elif part == "bucket":
            hist[(dp, canon, le)] = hist.get((dp, canon, le), 0.0) + inc
    # buckets per (dp, canonical): each row reads its own (a scan of every bucket per domain was
    # quadratic: 3,000 engines took 34 s per collection)
    buckets: dict = {}
    inst_h: dict = {}
    for (dp, canon, le), v in hist.items():
        buckets.setdefault((dp, canon), []).append((le, v))
        inst_h[(None, canon, le)] = inst_h.get((None, canon, le), 0.0) + v
    for (dp, canon, le), v in inst_h.items():
        buckets.setdefault((dp, canon), []).append((le, v))
    rows = []
    for dp in sorted(targets):
        rows.append(_row(cur.ts_ns, dt_s, dp, len(targets[dp]), gauges, rates, buckets, dp in reset))
    if rows:
        inst_g: dict = {}
        for (_dp, canon), vals in gauges.items():
            inst_g.setdefault((None, canon), []).extend(vals)
        inst_r: dict = {}
        for (_dp, canon), v in rates.items():
            inst_r[(None, canon)] = inst_r.get((None, canon), 0.0) + v
        rows.append(
            _row(cur.ts_ns, dt_s, None, len(set().union(*targets.values())), inst_g, inst_r, buckets, bool(reset))
        )
    return rows


def _finite(v):
    """A computed number, or None when it is not finite (sums of huge samples can overflow)."""
    return v if v is None or math.isfinite(v) else None


def _row(ts_ns, dt_s, dp, n_targets, gauges, rates, buckets, was_reset) -> dict:
    def g(canon, how):
        vals = gauges.get((dp, canon))
        return None if not vals else _finite(how(vals))

    def r(canon):
        v = rates.get((dp, canon))
        return None if v is None else _finite(v / dt_s)

    def qs(canon):
        # cumulative buckets summed over label sets stay cumulative
        b = buckets.get((dp, canon), [])
        return [None if (x := histogram_quantile(q, b)) is None else _finite(x * 1000.0) for q in (0.5, 0.95, 0.99)]

    ttft, e2e = qs("ttft"), qs("e2e")
    return {
        "ts_ns": ts_ns,
        "window_s": dt_s,
        "dp_rank": dp,
        "targets": n_targets,
        "running": g("running", sum),
        "waiting": g("waiting", sum),
        "kv_usage": g("kv_usage", lambda v: sum(v) / len(v)),
        "requests_per_s": r("requests"),
        "prompt_tokens_per_s": r("prompt_tokens"),
        "generation_tokens_per_s": r("generation_tokens"),
        "ttft_p50_ms": ttft[0],
        "ttft_p95_ms": ttft[1],
        "ttft_p99_ms": ttft[2],
        "e2e_p50_ms": e2e[0],
        "e2e_p95_ms": e2e[1],
        "e2e_p99_ms": e2e[2],
        "reset": was_reset,
    }


def expert_rows(prev: Snapshot, cur: Snapshot) -> list[tuple[int, int, int, float]]:
    """(layer, ep_rank, slot, tokens of the window) per expert slot; resets as for counters.
    Slots of a target absent from ``prev`` wait for the next window."""
    out: dict = {}
    prev_targets = {k[0] for k in prev.experts}
    for key, v in cur.experts.items():
        target, layer, ep_rank, slot = key
        if target not in prev_targets:
            continue
        inc, _ = increase(prev.experts.get(key), v)
        k = (layer, ep_rank, slot)
        out[k] = out.get(k, 0.0) + inc
    return [(*k, v) for k, v in sorted(out.items())]
