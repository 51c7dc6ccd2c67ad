"""The visual report: ONE self-contained HTML file (plotly.js inlined, no CDN, no network).

It opens with the first screen of the diagnosis, the same view the terminal draws
(``view.Screen``: each slow card with its cause, cost, evidence, why and next step, the
findings, the folded lists, the totals), then the why-rows of each slow card. Then what it shows,
each part from the query whose header puts it there (``shows: report.moe`` …; its ``name@vN``
is printed under the figure) and each part replaced by a short note when its data is absent
(the query SKIPs). Today's built-in queries per place:

- ``report.moe``: MoE time per rank, stacked GroupedMatmul / dispatch / combine / gating / other,
  and beside it the time the rank waited for the last arrival (part of dispatch + combine) --
  ``moe-breakdown``; the slow cards that are ranks (verdicts shown there) are marked on it;
- ``report.waits``: rank x (step, layer) heat maps of the time waited for the last arrival and of
  how often the rank arrived last -- ``wait-heatmap`` (else per collective, ``report.collectives``:
  ``sync-gaps``);
- ``report.experts``: layer x expert slot, grouped by the rank that holds it --
  ``expert-heatmap``, with the verdict line of ``expert-hotspots``;
- ``report.dp`` / ``report.dp-windows``: the side-by-side table (``dp-report``), the domains
  ``dp-imbalance`` flags highlighted, and per-window tokens, queue wait and KV usage (``dp-batch``);
- ``report.metrics``: live metrics over time when the run has them (``metric-timeline``: per DP
  domain requests/s, waiting, KV usage; the instance's TTFT / e2e P99; alert windows shaded; a
  long watch arrives merged into at most ~1,500 points, the alert windows exact), then the
  captures taken on its alerts (``captures`` table: each beside its alert, with the slow card of
  its own diagnosis; their windows shaded green on the timeline, labelled with what they found);
- every verdict folded as the first screen folds them (``view.Screen``): FAIL / WARN / ERROR in
  the table with their evidence, PASS and INFO one expandable line each, the SKIPs one
  expandable line per missing input;
- a watched run's incident (``incident.story``): what each capture taken on an alert found is
  shown under the alerted card's why (card, cause, cost, verdict, its match with the alert),
  linked to the capture run's own section at the end of the page (its first screen, why,
  figures and verdicts).

Colours: each DP domain / rank number keeps one colour (``colour(n)``) in every figure (lines,
axis labels); the slow card is drawn thick, named "◀ slow card (cause)" and listed first in the
legend, and its axis label is bold; the instance-level lines are grey and dashed.

Every string that can come from a trace (names, summaries, row values) is passed through
``html.escape`` before it reaches the page or a figure; the figure JSON is embedded in
``<script type="application/json">`` with ``<``, ``>`` and ``&`` written as ``\\uXXXX`` escapes,
so no trace content can close the script element. plotly is the optional ``report`` extra and is
imported only when a report is built.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from decimal import Decimal

from .. import findings as findings_mod
from .. import incident as incident_mod
from .. import queries as queries_mod
from .. import why as why_mod
from .._version import __version__
from ..errors import UsageError
from ..verdict import Status, fmt_value, severity

# The report's places (a query's `shows:` header puts it in one): section data and verdict lines.
SECTIONS = ("report.moe", "report.waits", "report.collectives", "report.experts", "report.dp", "report.dp-windows")

# Heat maps wider than this many (step, layer) columns are folded to one column per layer.
MAX_HEATMAP_COLUMNS = 400
# Evidence rows shown per verdict.
EVIDENCE_ROWS = 20

_PARTS = (
    ("gmm_ms", "GroupedMatmul", "#1f77b4"),
    ("dispatch_ms", "dispatch", "#ff7f0e"),
    ("combine_ms", "combine", "#2ca02c"),
    ("gating_ms", "gating", "#9467bd"),
    ("overlap_ms", "two or more at once", "#bcbd22"),
    ("other_ms", "other", "#8c8c8c"),
)

# One colour per DP domain / rank number, the same in every figure of the page (DP n and rank n
# share it: vLLM DP + EP with TP 1 runs one rank per DP engine). No red (alerts, the slow-card
# marks), green (captures) or grey (the instance) among them; beyond 10 the colours repeat.
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#393b79",
    "#e7ba52",
    "#7b4173",
)
# Instance-level lines (not one domain's): neutral, dashed.
INSTANCE_LINES = {"ttft_p99_ms": ("#7f7f7f", "dash"), "e2e_p99_ms": ("#404040", "dot")}
SLOW_WIDTH, LINE_WIDTH = 4.0, 1.5
# Points per line above which a figure draws lines without markers.
MARKERS_UP_TO = 300


def _plotly():
    """plotly.graph_objects, plotly.subplots and plotly.offline, or a UsageError saying how to get them."""
    try:
        import plotly.graph_objects as go
        import plotly.offline as offline
        from plotly.subplots import make_subplots
    except ImportError as exc:  # the optional extra is not installed
        raise UsageError(
            f"the HTML report needs plotly ({exc}); install it with "
            "`pip install -e .[report]` (or `pip install 'slowcard[report]'`)"
        ) from None
    return go, make_subplots, offline


def esc(v) -> str:
    """A value as page text: formatted like the verdict summaries, then HTML-escaped."""
    if isinstance(v, Decimal):
        v = float(v)
    if isinstance(v, dict):
        v = ", ".join(f"{fmt_value(_num(k))}: {fmt_value(_num(x))}" for k, x in v.items())
    elif isinstance(v, (list, tuple)):
        v = ", ".join(fmt_value(_num(x)) for x in v)
    else:
        v = fmt_value(v)
    return html.escape(v, quote=True)


def _num(v):
    return float(v) if isinstance(v, Decimal) else v


def _f(v) -> float | None:
    """A number for a figure (None for NULL / NaN)."""
    if v is None or isinstance(v, bool):
        return None if v is None else float(v)
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def report_queries(catalog: dict) -> list[str]:
    """The queries the report reads: every query shown in a report section or the why-section,
    and every verdict that may name the slow card (the conclusion and the marks on the figures come from them)."""
    return [
        q.name
        for q in sorted(catalog.values(), key=lambda q: (q.order, q.name))
        if any(s.startswith("report.") or s == "why" for s in q.shows) or (q.is_verdict and q.priority is not None)
    ]


def ensure_results(con, run: str, results: dict | None, names=None, catalog=None) -> dict:
    """``results`` completed with the named queries it lacks (run with default parameters);
    ``names`` None means ``report_queries(catalog)``."""
    catalog = catalog or queries_mod.load_catalog()
    out = queries_mod.with_specs(dict(results or {}), catalog)
    for n in report_queries(catalog) if names is None else names:
        if n not in out and n in catalog:
            out[n] = queries_mod.run_query(con, catalog[n], run)
    return out


def shown(results: dict, place: str, role: str | None = None) -> list:
    """The results whose query shows in ``place`` (optionally only reports or only verdicts),
    in diagnosis order."""
    out = [
        r
        for r in results.values()
        if r.spec is not None and place in r.spec.shows and (role is None or r.spec.role == role)
    ]
    return sorted(out, key=lambda r: (r.spec.order, r.query))


def _data(results: dict, place: str):
    """The report query that feeds ``place`` (the first in diagnosis order), or None."""
    found = shown(results, place, "report")
    return found[0] if found else None


def _ref(res) -> str:
    return f"{html.escape(res.query)}@v{res.version}"


def _usable(res) -> bool:
    return res is not None and res.status not in (Status.SKIP, Status.ERROR) and bool(res.rows)


def _skip_note(what: str, *results) -> str:
    why = "; ".join(f"{_ref(r)} {html.escape(r.status)}: {esc(r.summary)}" for r in results if r is not None)
    return f'<p class="skip">{html.escape(what)}{(" (" + why + ")") if why else ""}.</p>'


class _Figures:
    """Collects figures as JSON blocks that the page's loader hands to Plotly.newPlot."""

    def __init__(self, go):
        self.go = go
        self.n = 0

    def block(self, fig, query_refs: str, height: int) -> str:
        self.n += 1
        fid = f"fig{self.n}"
        fig.update_layout(height=height, margin=dict(l=70, r=30, t=50, b=60), template="plotly_white")
        data = fig.to_json()  # validated by plotly; python lists stay plain JSON arrays
        # JSON with <, > and & as \\u escapes: still the same JSON, and it cannot end the script.
        data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        return (
            f'<div class="fig" id="{fid}" style="height:{height}px"></div>\n'
            f'<script type="application/json" class="figure-data" data-target="{fid}" '
            f'data-query="{query_refs}">{data}</script>\n'
            f'<p class="src">from {query_refs}</p>'
        )


def colour(n) -> str:
    """The colour of DP domain / rank ``n`` in every figure."""
    return PALETTE[int(n) % len(PALETTE)]


def _tick(label: str, n, slow: str | None) -> str:
    """An axis label in its rank / domain colour; the slow card's in bold, marked."""
    text = html.escape(label) + (f" ◀ slow card ({html.escape(slow)})" if slow else "")
    return f'<span style="color:{colour(n)}">{"<b>" + text + "</b>" if slow else text}</span>'


def slow_domains(results: dict) -> dict[int, str]:
    """DP domain -> cause: the slow cards that are DP domains."""
    out: dict[int, str] = {}
    for f in findings_mod.slow_cards(results):
        for kind, value in f.subject:
            if kind == "dp_rank" and value is not None:
                out.setdefault(int(value), f.causes or f.cause or "slow")
    return out


def _slow_ranks(results: dict) -> dict[int, str]:
    """rank -> cause: the slow cards that are ranks, from the verdicts shown on the MoE figure."""
    return {rank: f.cause or "slow" for rank, f in findings_mod.slow_ranks(results, "report.moe").items()}


def _rank_label(rank) -> str:
    return "rank ?" if rank is None else f"rank {int(rank)}"


# ---------------------------------------------------------------- sections


def _moe_section(F: _Figures, results: dict, slow: dict) -> str:
    res = _data(results, "report.moe")
    head = "<h2>MoE time per rank</h2>"
    if not _usable(res):
        return head + _skip_note("No MoE layers found in this run", res)
    go = F.go
    rows = [r for r in res.rows if r.get("layer") is None] or res.rows
    x = [_rank_label(r.get("rank")) for r in rows]
    fig = go.Figure()
    base = [0.0] * len(rows)
    for col, label, color in _PARTS:
        y = [_f(r.get(col)) or 0.0 for r in rows]
        fig.add_trace(
            go.Bar(
                name=label,
                x=x,
                y=y,
                base=list(base),
                offsetgroup="moe",
                marker_color=color,
                legendgroup="moe",
                hovertemplate=f"{label}: %{{y:.3f}} ms<extra>%{{x}}</extra>",
            )
        )
        base = [b + v for b, v in zip(base, y)]
    fig.add_trace(
        go.Bar(
            name="waited for the last arrival (part of dispatch + combine)",
            x=x,
            y=[_f(r.get("wait_ms")) or 0.0 for r in rows],
            offsetgroup="wait",
            marker_color="#d62728",
            marker_pattern_shape="/",
            hovertemplate="waited: %{y:.3f} ms<extra>%{x}</extra>",
        )
    )
    for i, r in enumerate(rows):
        if r.get("rank") is not None and int(r["rank"]) in slow:
            fig.add_annotation(
                x=x[i],
                y=base[i],
                text=html.escape(f"slow card: {slow[int(r['rank'])]}"),
                showarrow=True,
                arrowhead=2,
                ay=-40,
                font=dict(color="#d62728"),
            )
    if all(r.get("rank") is not None for r in rows):
        fig.update_xaxes(
            tickvals=x, ticktext=[_tick(x[i], r["rank"], slow.get(int(r["rank"]))) for i, r in enumerate(rows)]
        )
    fig.update_layout(
        barmode="group",
        bargap=0.25,
        bargroupgap=0.05,
        title="Time inside MoE layers per rank (stacked), and the time spent waiting",
        yaxis_title="ms (sum over MoE layer instances)",
        legend=dict(orientation="h", y=-0.15),
    )
    note = (
        "<p>dispatch and combine include their collectives, so the red bar (the time this rank "
        "waited for the last rank to arrive) is a part of them, not an extra cost. The slow card "
        "arrives last: it waits least while the others wait for it.</p>"
    )
    return head + note + F.block(fig, _ref(res), 480)


def _heat_columns(rows):
    """(column keys, labels, folded) for the wait heat map: (step, layer) or layer when too wide."""
    keys = sorted({(r["step"], r["layer"]) for r in rows}, key=lambda k: (k[0] is None, k[0] or 0, k[1] or 0))
    if len(keys) <= MAX_HEATMAP_COLUMNS:
        return keys, [f"s{s} L{l}" for s, l in keys], False
    layers = sorted({k[1] for k in keys}, key=lambda v: (v is None, v or 0))
    return layers, [f"L{l}" for l in layers], True


def _wait_section(F: _Figures, results: dict, make_subplots, slow: dict) -> str:
    body = _wait_figure(F, results, make_subplots, slow)
    sg = _data(results, "report.collectives")
    if _usable(sg):
        cols = [
            c
            for c in (
                "pg",
                "coll_kind",
                "instance",
                "name",
                "last_rank",
                "arrival_skew_us",
                "min_dur_us",
                "max_dur_us",
                "wait_us_by_rank",
            )
            if c in sg.columns
        ]
        body += "<h3>Largest arrival skews</h3>" + _table(cols, sg.rows, 10) + f'<p class="src">from {_ref(sg)}</p>'
    return body


def _wait_figure(F: _Figures, results: dict, make_subplots, slow: dict) -> str:
    head = "<h2>Waiting at collectives, per rank</h2>"
    res = _data(results, "report.waits")
    go = F.go
    if _usable(res):
        cols, labels, folded = _heat_columns(res.rows)
        ranks = sorted({r["rank"] for r in res.rows}, key=lambda v: (v is None, v or 0))
        ri = {r: i for i, r in enumerate(ranks)}
        ci = {c: i for i, c in enumerate(cols)}
        lag: list[list[float | None]] = [[None] * len(cols) for _ in ranks]
        last: list[list[int | None]] = [[None] * len(cols) for _ in ranks]
        for r in res.rows:
            c = ci[r["layer"] if folded else (r["step"], r["layer"])]
            i = ri[r["rank"]]
            lag[i][c] = (lag[i][c] or 0.0) + (_f(r["arrival_lag_ms"]) or 0.0)
            last[i][c] = (last[i][c] or 0) + int(r["n_arrived_last"] or 0)
        y = [_rank_label(r) for r in ranks]
        fig = make_subplots(
            rows=2,
            cols=1,
            shared_xaxes=True,
            vertical_spacing=0.12,
            subplot_titles=("waited for the last arrival (ms)", "arrived last (collectives)"),
        )
        fig.add_trace(
            go.Heatmap(
                z=lag,
                x=labels,
                y=y,
                colorscale="Reds",
                colorbar=dict(y=0.79, len=0.42),
                hovertemplate="%{y} %{x}: waited %{z:.3f} ms<extra></extra>",
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Heatmap(
                z=last,
                x=labels,
                y=y,
                colorscale="Blues",
                colorbar=dict(y=0.21, len=0.42),
                hovertemplate="%{y} %{x}: arrived last at %{z} collectives<extra></extra>",
            ),
            row=2,
            col=1,
        )
        fig.update_yaxes(autorange="reversed")
        if None not in ranks:
            fig.update_yaxes(tickvals=y, ticktext=[_tick(y[i], k, slow.get(int(k))) for i, k in enumerate(ranks)])
        fig.update_layout(title=("rank x layer (summed over steps)" if folded else "rank x (step, layer)"))
        note = (
            "<p>The slow card is the row that is pale on top (it hardly waits) and dark below "
            "(it is the one the others wait for).</p>"
        )
        return head + note + F.block(fig, _ref(res), 160 + 2 * max(160, 28 * len(ranks)))
    sg = _data(results, "report.collectives")
    if _usable(sg):
        rows = sorted(sg.rows, key=lambda r: r.get("first_ts_ns") or 0)[:MAX_HEATMAP_COLUMNS]
        ranks = sorted({int(k) for r in rows for k in (r.get("wait_us_by_rank") or {})})
        labels = [f"{esc(r.get('coll_kind'))} #{esc(r.get('instance'))} {esc(r.get('pg'))}" for r in rows]
        z = [[_f((r.get("wait_us_by_rank") or {}).get(k)) for r in rows] for k in ranks]
        fig = go.Figure(
            go.Heatmap(
                z=z,
                x=labels,
                y=[_rank_label(k) for k in ranks],
                colorscale="Reds",
                hovertemplate="%{y} %{x}: wait %{z:.1f} us<extra></extra>",
            )
        )
        fig.update_yaxes(autorange="reversed")
        fig.update_yaxes(
            tickvals=[_rank_label(k) for k in ranks], ticktext=[_tick(_rank_label(k), k, slow.get(k)) for k in ranks]
        )
        fig.update_layout(title="wait inside each matched collective (us), in time order", xaxis_type="category")
        skipped = f" ({_ref(res)} {html.escape(res.status)}: {esc(res.summary)})" if res is not None else ""
        return (
            head
            + f"<p>No MoE layers to group by{skipped}; one column per matched collective.</p>"
            + F.block(fig, _ref(sg), 160 + max(160, 28 * len(ranks)))
        )
    return head + _skip_note("No collectives matched across ranks", res, sg)


def _expert_section(F: _Figures, results: dict) -> str:
    head = "<h2>Expert hotness</h2>"
    res = _data(results, "report.experts")
    if not _usable(res):
        return head + _skip_note("No expert load data in this run", res)
    go = F.go
    rows = res.rows
    slots = sorted({(r["ep_rank"], r["local_slot"]) for r in rows})
    layers = sorted({r["layer"] for r in rows})
    si = {s: i for i, s in enumerate(slots)}
    li = {lay: i for i, lay in enumerate(layers)}
    z: list[list[float | None]] = [[None] * len(slots) for _ in layers]
    text = [[""] * len(slots) for _ in layers]
    for r in rows:
        i, j = li[r["layer"]], si[(r["ep_rank"], r["local_slot"])]
        z[i][j] = _f(r["mean_hotness"])
        text[i][j] = (
            f"expert {esc(r['expert'])} (replicas {esc(r['replicas'])}), peak "
            f"{esc(r['peak_hotness'])}, {esc(r['mean_slot_tokens'])} tokens/window"
        )
    x = [f"r{a}/s{b}" for a, b in slots]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=x,
            y=[f"layer {lay}" for lay in layers],
            text=text,
            colorscale="YlOrRd",
            zmin=0,
            colorbar=dict(title="x layer mean"),
            hovertemplate="%{y}, %{x}: %{z:.2f}x layer mean<br>%{text}<extra></extra>",
        )
    )
    # rank groups: a line between ranks and the rank's name above its slots
    ranks = sorted({a for a, _ in slots})
    for rk in ranks:
        idx = [si[s] for s in slots if s[0] == rk]
        fig.add_annotation(
            x=(min(idx) + max(idx)) / 2,
            y=1.02,
            xref="x",
            yref="paper",
            showarrow=False,
            text=f"rank {rk}",
            font=dict(size=11),
        )
        if min(idx) > 0:
            fig.add_shape(
                type="line",
                x0=min(idx) - 0.5,
                x1=min(idx) - 0.5,
                y0=0,
                y1=1,
                xref="x",
                yref="paper",
                line=dict(color="#333", width=2),
            )
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(
        title="mean hotness per expert slot (tokens / the layer's mean expert tokens), "
        "grouped by the rank that holds it",
        xaxis_type="category",
    )
    epoch = rows[0].get("epoch")
    note = (
        f"<p>Latest EPLB epoch: {esc(epoch) if epoch is not None else 'unknown (no expert map)'}, "
        f"{esc(max(r['windows'] for r in rows))} load window(s).</p>"
    )
    for hs in shown(results, "report.experts", "verdict"):
        note += f'<p class="verdict-line">{_status_span(hs.status)} {_ref(hs)}: {esc(hs.summary)}</p>'
    return head + note + F.block(fig, _ref(res), 140 + max(220, 22 * len(layers)))


def _dp_section(F: _Figures, results: dict, make_subplots) -> str:
    head = "<h2>DP domains</h2>"
    rep = _data(results, "report.dp")
    if not _usable(rep):
        return head + _skip_note("No DP service data in this run", rep)
    verdicts = shown(results, "report.dp", "verdict")
    # the DP domains the verdicts shown here flag, highlighted in the table and the figures
    hot = {value for v in verdicts for f in findings_mod.findings(v) for kind, value in f.subject if kind == "dp_rank"}
    cols = [
        c
        for c in (
            "dp_rank",
            "requests",
            "requests_pct",
            "input_tokens",
            "output_tokens",
            "tokens_pct",
            "batches",
            "total_scheduled_tokens",
            "exec_p50_ms",
            "exec_p99_ms",
            "kv_usage_mean",
            "queue_wait_p99_ms",
            "ttft_p99_ms",
            "requests_vs_median",
            "tokens_vs_median",
            "exec_vs_median",
        )
        if c in rep.columns
    ]
    out = head + _table(cols, rep.rows, highlight=lambda r: r.get("dp_rank") in hot)
    out += f'<p class="src">from {_ref(rep)}</p>'
    for imb in verdicts:
        out += f'<p class="verdict-line">{_status_span(imb.status)} {_ref(imb)}: {esc(imb.summary)}</p>'
    ts = _data(results, "report.dp-windows")
    wrows = [r for r in (ts.rows if _usable(ts) else []) if r.get("scope") == "window"]
    if not wrows:
        return out + _skip_note("No per-window DP data", ts)
    go = F.go
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        subplot_titles=("tokens (input + output of requests arriving)", "queue wait p99 (ms)", "KV-cache usage (mean)"),
    )
    slow = slow_domains(results)
    for dp in sorted({r["dp_rank"] for r in wrows}):
        rs = sorted((r for r in wrows if r["dp_rank"] == dp), key=lambda r: r["window_start_s"])
        x = [_f(r["window_start_s"]) for r in rs]
        tokens = [
            None
            if r.get("input_tokens") is None and r.get("output_tokens") is None
            else (_f(r.get("input_tokens")) or 0) + (_f(r.get("output_tokens")) or 0)
            for r in rs
        ]
        for row, y in (
            (1, tokens),
            (2, [_f(r.get("queue_wait_p99_ms")) for r in rs]),
            (3, [_f(r.get("kv_usage_mean")) for r in rs]),
        ):
            fig.add_trace(_domain_line(go, dp, x, y, slow.get(dp), legend=row == 1), row=row, col=1)
    fig.update_xaxes(title_text="seconds since the first batch", row=3, col=1)
    fig.update_layout(title=f"per window of {esc(ts.params.get('window_s'))} s")
    return out + F.block(fig, _ref(ts), 720)


def _domain_line(go, dp, x, y, slow: str | None, legend: bool):
    """One DP domain's line: its colour; the slow card's thick, named so and first in the legend."""
    return go.Scatter(
        x=x,
        y=y,
        mode="lines+markers" if len(x) <= MARKERS_UP_TO else "lines",
        name=f"DP {dp}" + (f" ◀ slow card ({html.escape(slow)})" if slow else ""),
        legendgroup=f"dp{dp}",
        legendrank=1 if slow else 1000 + int(dp),
        showlegend=legend,
        line=dict(color=colour(dp), width=SLOW_WIDTH if slow else LINE_WIDTH),
    )


def _status_span(status: str) -> str:
    return f'<span class="st st-{html.escape(status.lower())}">{html.escape(status)}</span>'


def _table(cols, rows, limit: int | None = None, highlight=None) -> str:
    shown = rows if limit is None else rows[:limit]
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = []
    for r in shown:
        cls = ' class="hot"' if highlight and highlight(r) else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{esc(r.get(c))}</td>" for c in cols) + "</tr>")
    more = "" if limit is None or len(rows) <= limit else f'<p class="more">+{len(rows) - limit} more rows</p>'
    return f'<div class="tbl"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>{more}'


def _verdicts_section(results: dict, sc) -> str:
    """Every verdict, folded as the first screen folds them (``view.Screen``): FAIL, WARN and
    ERROR in the table with their evidence; PASS and INFO each one expandable line; the SKIPs
    one expandable line per missing input, each with its queries and their reasons."""
    loud = sorted(
        (r for r in results.values() if r.status not in (Status.PASS, Status.INFO, Status.SKIP)),
        key=lambda r: (severity(r.status), r.query),
    )
    out = ["<h2>Verdicts</h2>"]
    if loud:
        out.append(
            '<table class="verdicts"><thead><tr><th>query</th><th>status</th><th>summary</th></tr></thead><tbody>'
            + "".join(_verdict_row(r) for r in loud)
            + "</tbody></table>"
        )
    else:
        out.append("<p>No verdict is FAIL, WARN or ERROR.</p>")

    def fold(kind: str, summary: str, names: list[str], reasons: list[str] | None = None) -> str:
        rows = "".join(
            _verdict_row(results[n], reasons[i] if reasons else None) for i, n in enumerate(names) if n in results
        )
        return (
            f'<details class="fold fold-{kind}"><summary>{summary}</summary>'
            f'<table class="verdicts"><tbody>{rows}</tbody></table></details>'
        )

    if sc.passed:
        out.append(fold("pass", f"{_status_span('PASS')} {len(sc.passed)} verdict(s) found nothing", sc.passed))
    if sc.info:
        out.append(fold("info", f"{_status_span('INFO')} {len(sc.info)} report(s)", sc.info))
    for g in sc.skips:
        out.append(
            fold(
                "skip",
                f"{_status_span('SKIP')} {len(g.queries)}, missing input: <b>{esc(g.need)}</b>",
                g.queries,
                g.reasons,
            )
        )
    for r in loud:
        if Status(r.status).flags and r.rows:
            out.append(
                f"<details open><summary>evidence of <code>{_ref(r)}</code> {_status_span(r.status)} "
                f"({len(r.rows)} row{'s' if len(r.rows) != 1 else ''})</summary>"
                + _table(r.columns, r.rows, EVIDENCE_ROWS)
                + "</details>"
            )
    return "\n".join(out)


def _verdict_row(r, summary: str | None = None) -> str:
    text = r.summary if summary is None else summary
    return f"<tr><td><code>{_ref(r)}</code></td><td>{_status_span(r.status)}</td><td>{esc(text)}</td></tr>"


def _why_section(why: list[dict], joins: dict | None = None) -> str:
    """Per slow card, the rows of the why queries about its ranks (why.explain), and what the
    captures taken on its alert found (``incident.by_card``); nothing when no verdict names a
    slow card."""
    out = []
    for card in why:
        caps = (joins or {}).get(card["card"], [])
        out.append(f'<h2 class="why">Why is {esc(card["card"])} slow? ({esc(card["cause"] or card["query"])})</h2>')
        if caps:
            out.append(
                f'<div class="capture-join"><p class="label">the capture{"s" if len(caps) > 1 else ""} taken on '
                f"its alert</p><ul>"
                + "".join(f'<li class="capture-verdict">{_capture_line(c)}</li>' for c in caps)
                + "</ul></div>"
            )
        if card["note"]:
            note = card["note"]
            if caps and not card["ranks"]:
                note = f"this run holds no trace of {card['card']}'s ranks; the capture above does"
            out.append(f'<p class="skip">{esc(note)}</p>')
        for part in card["parts"]:
            ref = html.escape(part["query"])
            if not part["rows"]:
                out.append(f"<p><code>{ref}</code> {_status_span(part['status'])}: {esc(part['summary'])}</p>")
                continue
            cols = [c for c in part["rows"][0] if c != "skip_reason"]
            out.append(f"<p><code>{ref}</code>: {esc(part['summary'])}</p>" + _table(cols, part["rows"], EVIDENCE_ROWS))
    return "\n".join(out)


def _when(ns) -> str:
    return _dt.datetime.fromtimestamp(ns / 1e9).strftime("%H:%M:%S") if ns else "-"


def _capture_line(c) -> str:
    """One capture of an alerted card: when, what its own diagnosis found (card, cause, cost,
    the verdict), how that matches the alert, and a link to its run's section."""
    row = c.row
    head = f"capture {esc(row['capture_id'])} at {esc(_when(row.get('started_ns') or row.get('alert_ts_ns')))}"
    if row.get("window_s") is not None:
        head += f" ({esc(row['window_s'])} s, {esc(row.get('backend'))})"
    if row.get("status") != "ok":
        return f"{head}: {esc(row.get('status'))}: {esc(row.get('reason') or '')}"
    card = c.card()
    if card is not None:
        cost = card.cost()
        found = (
            f"{_status_span(card.level)} <b>{esc(card.card)}</b> — {esc(card.causes)}"
            + (f" costs {esc(cost)}" if cost else "")
            + f' <code class="from">{esc(card.query)}</code>'
        )
    else:
        found = f"{_status_span(row.get('verdict_status') or 'SKIP')} {esc(row.get('headline') or '')}"
    link = (
        f' <a class="capture-link" href="#{c.anchor}">run {esc(row.get("run"))}: its diagnosis ↓</a>'
        if c.diag is not None
        else ""
    )
    return f"{head}: {found}; <i>{esc(c.match_text())}</i>.{link}"


def screen_section(sc, joins: dict | None = None) -> str:
    """The first screen (``view.Screen``) at the top of the page, as the terminal shows it: the
    headline, each slow card with its cause, cost, evidence, why and next step (and what the
    captures taken on its alert found, ``joins``: card label -> incident.Capture), the findings,
    the folded lists and the totals."""
    from .terminal import header_line

    kind = {"PASS": " ok", "SKIP": " skip"}.get(sc.status, "")
    out = [
        f'<div class="conclusion{kind}">',
        f'<p class="meta">{esc(header_line(sc, 10**6))}</p>',
        f'<p class="headline">{_status_span(sc.status)} {esc(sc.headline)}</p>',
    ]
    for card in sc.cards:
        cost = card.cost()
        out.append(
            f'<div class="card"><h3>{esc(card.card)} — {esc(card.causes)} {_status_span(card.level)}'
            + (f" costs {esc(cost)}" if cost else "")
            + f' <code class="from">{esc(card.query)}</code></h3>'
        )
        if card.evidence:
            out.append('<ul class="evidence">' + "".join(f"<li>{esc(e)}</li>" for e in card.evidence) + "</ul>")
        caps = (joins or {}).get(card.card, [])
        why = [f'<span class="capture-verdict">{_capture_line(c)}</span>' for c in caps]
        why += [esc(w) for w in card.why]
        why += [f"<code>{esc(q)}</code> {_status_span(st)}" for q, st in card.why_quiet]
        if card.why_note and not caps:
            why.append(esc(card.why_note))
        if why:
            out.append('<p class="label">why</p><ul class="why">' + "".join(f"<li>{w}</li>" for w in why) + "</ul>")
        if card.next_step:
            out.append(f'<p class="next"><span class="label">next</span> {esc(card.next_step)}</p>')
        out.append("</div>")
    if not sc.cards:
        if sc.resting:
            out.append("<ul>" + "".join(f"<li>{esc(r)}</li>" for r in sc.resting) + "</ul>")
        if sc.conclusion.get("next_step"):
            out.append(f'<p class="next"><span class="label">next</span> {esc(sc.conclusion["next_step"])}</p>')
    if sc.findings or sc.errors:
        rows = "".join(
            f"<tr><td>{_status_span(f.level)}</td><td><code>{esc(f.query)}</code></td><td>{esc(f.label)}</td>"
            f"<td>{esc(f.cost)}</td><td>{esc(f.causes)}</td></tr>"
            for f in sc.findings
        ) + "".join(f'<tr><td>{_status_span("ERROR")}</td><td colspan="4">{esc(e)}</td></tr>' for e in sc.errors)
        out.append(
            '<table class="findings"><thead><tr><th>level</th><th>query</th><th>subject</th><th>cost</th>'
            f"<th>cause</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    folded = []
    if sc.passed:
        folded.append(
            f"{_status_span('PASS')} {len(sc.passed)}: " + ", ".join(f"<code>{esc(q)}</code>" for q in sc.passed)
        )
    if sc.info:
        folded.append(
            f"{_status_span('INFO')} {len(sc.info)} reports: " + ", ".join(f"<code>{esc(q)}</code>" for q in sc.info)
        )
    for g in sc.skips:
        folded.append(
            f"{_status_span('SKIP')} {len(g.queries)}, missing input: {esc(g.need)} ("
            + ", ".join(f"<code>{esc(q)}</code>" for q in g.queries)
            + ")"
        )
    if folded:
        out.append('<ul class="folded">' + "".join(f"<li>{f}</li>" for f in folded) + "</ul>")
    totals = " ".join(f"{k}={v}" for k, v in sc.totals.items()) + f" TOTAL={sc.total}"
    out.append(f'<p class="totals"><code>{esc(totals)}</code></p></div>')
    return "\n".join(out)


def _captures_section(story: list) -> str:
    """Each capture beside the alert that caused it: its status (or why it failed), the slow
    card its own diagnosis names, and a link to that diagnosis in this page."""
    if not story:
        return ""
    rows = []
    for c in story:
        row = c.row
        alert = f"{row['query']}" + (f": {row['subject']}" if row.get("subject") else "")
        alert += f" ({row['alert_cause']})" if row.get("alert_cause") else ""
        if row["status"] == "ok":
            verdict = (
                f"{row.get('verdict_status') or '-'} {row.get('verdict_query') or ''}: {row.get('headline') or ''}"
            )
            m = row.get("matches_alert")
            link = "-" if m is None else ("the alerted domain" if m else "another card than the alert's")
        else:
            verdict, link = row.get("reason") or "", "-"
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{esc(v)}</td>"
                for v in (
                    row["capture_id"],
                    _when(row.get("alert_ts_ns")),
                    alert,
                    row["backend"],
                    row["status"],
                    "-" if row.get("window_s") is None else f"{row['window_s']:.1f} s",
                )
            )
            + (
                f'<td><a href="#{c.anchor}">{esc(row["run"])}</a></td>'
                if c.diag is not None
                else f"<td>{esc(row.get('run') or '-')}</td>"
            )
            + "".join(f"<td>{esc(v)}</td>" for v in (verdict, link, row.get("notes") or ""))
            + "</tr>"
        )
    cols = ["capture", "alert at", "alert", "backend", "status", "window", "run", "capture's verdict", "names", "notes"]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    return (
        "<h2>Captures on alert</h2><p>Each profile capture taken when a watched verdict turned FAIL "
        "(<code>slowcard watch --capture</code>), its files ingested as the run shown and diagnosed "
        "(the newest ones drawn below, each in a section of its own); shaded green on the timeline above.</p>"
        f'<div class="tbl"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'
    )


def _metrics_section(F: _Figures, results: dict, make_subplots, story: list | None = None) -> str:
    """Live metrics over time (``report.metrics``: per DP domain requests/s, waiting requests and
    KV usage, the instance's TTFT and e2e P99), the windows in which a watched verdict was FAIL
    shaded, and the captures taken on its alerts (green, labelled with what each found);
    nothing when the run has no metric windows. A long watch arrives merged into fewer points
    by the query (its ``windows`` column), the alert windows whole."""
    res = _data(results, "report.metrics")
    if not _usable(res):
        return ""
    go = F.go
    rows = res.rows
    fig = make_subplots(
        rows=4,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=(
            "finished requests/s per DP domain",
            "waiting requests per DP domain",
            "KV-cache usage per DP domain",
            "instance first-token (TTFT) and end-to-end P99 (ms)",
        ),
    )
    slow = slow_domains(results)
    domains = sorted({r["dp_rank"] for r in rows if r.get("dp_rank") is not None})
    for dp in domains:
        rs = [r for r in rows if r.get("dp_rank") == dp]
        x = [_f(r["since_start_s"]) for r in rs]
        for row, col in ((1, "requests_per_s"), (2, "waiting"), (3, "kv_usage")):
            fig.add_trace(
                _domain_line(go, dp, x, [_f(r.get(col)) for r in rs], slow.get(dp), legend=row == 1), row=row, col=1
            )
    inst = [r for r in rows if r.get("dp_rank") is None]
    for col, label in (("ttft_p99_ms", "TTFT P99"), ("e2e_p99_ms", "e2e P99")):
        line_colour, dash = INSTANCE_LINES[col]
        fig.add_trace(
            go.Scatter(
                x=[_f(r["since_start_s"]) for r in inst],
                y=[_f(r.get(col)) for r in inst],
                mode="lines+markers" if len(inst) <= MARKERS_UP_TO else "lines",
                name=f"instance {label}",
                legendrank=2000,
                line=dict(color=line_colour, dash=dash, width=LINE_WIDTH),
                marker=dict(color=line_colour),
            ),
            row=4,
            col=1,
        )
    alerts = _alert_spans(inst)
    for x0, x1, what in alerts:
        fig.add_vrect(x0=x0, x1=x1, fillcolor="#d62728", opacity=0.12, line_width=0, layer="below", row="all", col=1)
        # and a line at its start: a 30 s alert in a day-long timeline is narrower than a pixel
        fig.add_vline(x=x0, line=dict(color="#d62728", width=1), opacity=0.5, layer="below", row="all", col=1)
        fig.add_annotation(  # inside the top row: above it sits that row's title
            x=(x0 + x1) / 2,
            y=1.0,
            xref="x",
            yref="y domain",
            yanchor="top",
            showarrow=False,
            text=html.escape(f"FAIL: {what}"),
            font=dict(color="#d62728", size=11),
        )
    first = next((r for r in rows if r.get("since_start_s") is not None and r.get("ts_ns") is not None), None)
    taken: list[str] = []
    for c in story or []:
        row_ = c.row
        if first is None or row_.get("started_ns") is None or row_.get("stopped_ns") is None:
            continue
        zero_ns = first["ts_ns"] - (_f(first["since_start_s"]) or 0.0) * 1e9
        x0, x1 = (row_["started_ns"] - zero_ns) / 1e9, (row_["stopped_ns"] - zero_ns) / 1e9
        fig.add_vrect(x0=x0, x1=x1, fillcolor="#2ca02c", opacity=0.18, line_width=0, layer="below", row="all", col=1)
        fig.add_vline(x=x0, line=dict(color="#2ca02c", width=1), opacity=0.6, layer="below", row="all", col=1)
        card = c.card()
        found = f"{card.card} {card.causes}" if card is not None else (row_.get("slow_card") or row_["status"])
        label = html.escape(f"capture {row_['capture_id']}: {found}")
        if c.diag is not None:
            # plotly drops links to the page itself when it is opened from a file: linked in the note
            taken.append(f'<a href="#{c.anchor}">capture {row_["capture_id"]}: {esc(found)}</a>')
        fig.add_annotation(
            x=(x0 + x1) / 2,
            y=0.88,
            xref="x",
            yref="y domain",
            yanchor="top",
            showarrow=False,
            text=label,
            font=dict(color="#2ca02c", size=11),
            bgcolor="rgba(255,255,255,0.7)",
        )
    fig.update_xaxes(title_text="seconds since the first window", row=4, col=1)
    fig.update_layout(title="Live metrics (slowcard watch), per window")
    n_windows = sum(int(r.get("windows") or 1) for r in inst) if inst else len({r["ts_ns"] for r in rows})
    n_points = len({r["ts_ns"] for r in rows})
    merged = (
        f" drawn as {n_points} points (quiet windows merged: rates averaged, gauges and P99s at their peak; "
        "alert windows exact)"
        if n_points < n_windows
        else ""
    )
    note = (
        f"<p>{len(domains)} DP domain(s), {n_windows} window(s){merged}"
        + (f"; {len(alerts)} alert period(s) shaded (a watched verdict FAIL)" if alerts else "; no alert")
        + (
            "; the slow card's line is thick and first in the legend, the instance lines grey and dashed"
            if slow
            else "; the instance lines grey and dashed"
        )
        + ".</p>"
    )
    if taken:
        note += (
            '<p class="captures-taken">Captures (shaded green, their diagnosis below): ' + "; ".join(taken) + ".</p>"
        )
    return "<h2>Live metrics</h2>" + note + F.block(fig, _ref(res), 900)


def _alert_spans(inst_rows: list) -> list[tuple[float, float, str]]:
    """(start s, end s, failing verdicts) of each run of consecutive windows with a FAIL."""
    spans: list[tuple[float, float, str]] = []
    for r in sorted(inst_rows, key=lambda r: r["since_start_s"]):
        end = _f(r["since_start_s"]) or 0.0
        start = end - (_f(r.get("window_s")) or 0.0)
        what = r.get("failing")
        if not what:
            continue
        if spans and spans[-1][2] == what and abs(spans[-1][1] - start) < 1e-6 + (_f(r.get("window_s")) or 0) * 0.5:
            spans[-1] = (spans[-1][0], end, what)
        else:
            spans.append((start, end, str(what)))
    return spans


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1300px;
     color:#222;padding:0 16px}
h1{font-size:1.5em}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#666}.skip{color:#777;font-style:italic}.src{color:#888;font-size:.85em;margin-top:0}
.conclusion{border-left:6px solid #d62728;background:#fff5f5;padding:8px 16px}
.conclusion .headline{font-size:1.2em;font-weight:600}.conclusion dt{font-weight:600}
.conclusion dd{margin:0 0 6px 0}.conclusion.ok{border-color:#2ca02c;background:#f3fff3}
.conclusion.skip{border-color:#999;background:#f7f7f7}.conclusion .meta{margin:4px 0}
.card{margin:10px 0}.card h3{margin:6px 0;font-size:1.05em}.card ul{margin:2px 0 4px 0}
.label{font-weight:600;margin:2px 0}.from{color:#666;font-weight:400}.totals{margin-top:8px}
table{border-collapse:collapse;font-size:.85em;margin:6px 0}td,th{border:1px solid #ddd;padding:3px 6px;
     text-align:left;vertical-align:top}th{background:#f3f3f3}tr.hot td{background:#ffe9e9}
.tbl{overflow-x:auto}.st{font-weight:700;padding:0 4px;border-radius:3px}
.st-fail,.st-error{background:#d62728;color:#fff}.st-warn{background:#ffbf00}.st-pass{background:#2ca02c;color:#fff}
.st-info{background:#ddd}.st-skip{background:#eee;color:#777}
details{margin:8px 0}.more{color:#888;font-size:.85em}.fig{width:100%}
details.fold{margin:2px 0}details.fold summary{cursor:pointer}details.fold table{margin-left:18px}
.capture-join{border-left:4px solid #2ca02c;background:#f3fff3;padding:4px 12px;margin:6px 0}
.capture-verdict{display:inline}section.capture-run{border-top:3px solid #2ca02c;margin-top:3em}
"""

# Draws every figure; once all are drawn, the body says how many and when (ms since the page
# began loading): what a headless browser reads to know the page is complete.
_LOADER = """
var drawn = [];
document.querySelectorAll('script.figure-data').forEach(function (s) {
  var fig = JSON.parse(s.textContent);
  drawn.push(Plotly.newPlot(s.getAttribute('data-target'), fig.data, fig.layout,
                            {responsive: true, displaylogo: false}));
});
Promise.all(drawn).then(function () {
  document.body.setAttribute('data-figures-drawn', String(drawn.length));
  document.body.setAttribute('data-drawn-ms', String(Math.round(performance.now())));
});
"""


def build_report(con, run: str, results: dict, *, conclusion: dict | None = None, catalog=None) -> str:
    """The report page of one run as an HTML string.

    ``results`` maps query name -> Result (e.g. ``Diagnosis.results``); queries the report needs
    and ``results`` lacks are run here with default parameters. The page opens with the first
    screen of the diagnosis (``view.screen``) of ``conclusion`` (the diagnosis conclusion dict;
    without one, the conclusion of ``results``). A watched run's page also holds its captures
    (``incident.story``): what each found under the alerted card's "why", and the newest
    capture runs' own diagnoses in sections of their own. Raises UsageError when plotly is missing.
    """
    go, make_subplots, offline = _plotly()
    from ..diagnosis import Diagnosis, conclude
    from ..view import run_inputs, screen

    results = ensure_results(con, run, results, None, catalog)
    why = why_mod.explain(results, con, run)
    sc = screen(
        Diagnosis(run=run, results=results, conclusion=conclusion or conclude(results), why=why), run_inputs(con, run)
    )
    story = incident_mod.story(con, run, catalog)
    joins = incident_mod.by_card(story, [c.card for c in sc.cards], run)
    F = _Figures(go)
    sections = [
        screen_section(sc, joins),
        _why_section(why, joins),
        # a watched run: its metrics and captures first (its trace figures are mostly empty)
        _metrics_section(F, results, make_subplots, story),
        _captures_section(story),
        *_figure_sections(F, results, make_subplots),
        _verdicts_section(results, sc),
    ]
    for c in reversed(story):  # the newest capture first
        if c.diag is not None:
            sections.append(_capture_run_section(F, con, c, make_subplots))
    when = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>slowcard report: {html.escape(run)}</title>",
            f"<style>{_CSS}</style>",
            # plotly.js inline: the page needs no network at all
            f'<script type="text/javascript">{offline.get_plotlyjs()}</script>',
            "</head><body>",
            f"<h1>slowcard report: run <code>{html.escape(run)}</code></h1>",
            f'<p class="meta">slowcard {html.escape(__version__)}, generated {when}. Each figure names the '
            "query behind it (<code>name@version</code>); <code>slowcard show NAME</code> prints its SQL. "
            "Each DP domain and rank keeps one colour in every figure; the slow card is marked.</p>",
            *sections,
            f"<script>{_LOADER}</script>",
            "</body></html>",
        ]
    )


def _figure_sections(F: _Figures, results: dict, make_subplots) -> list[str]:
    """The figures of a run's traces and service data: MoE time, waits, experts, DP domains."""
    slow = _slow_ranks(results)
    return [
        _moe_section(F, results, slow),
        _wait_section(F, results, make_subplots, slow),
        _expert_section(F, results),
        _dp_section(F, results, make_subplots),
    ]


def _capture_run_section(F: _Figures, con, c, make_subplots) -> str:
    """A capture run's own diagnosis, in the watched run's page: its first screen, why, figures
    and verdicts, under the anchor the alerted card's "why" links to."""
    from ..view import run_inputs, screen

    diag, row = c.diag, c.row
    sc = screen(diag, run_inputs(con, diag.run))
    alert = f"{row['query']}" + (f": {row['subject']}" if row.get("subject") else "")
    parts = [
        f'<section class="capture-run" id="{c.anchor}">',
        f"<h2>Capture {esc(row['capture_id'])}: run <code>{esc(diag.run)}</code></h2>",
        f'<p class="meta">taken at {esc(_when(row.get("started_ns")))} for {esc(row.get("window_s"))} s on the alert '
        f"{esc(alert)}; its slow card is <i>{esc(c.match_text())}</i>. "
        f"<code>slowcard report --run {esc(diag.run)}</code> draws it alone.</p>",
        screen_section(sc),
        _why_section(diag.why),
        *_figure_sections(F, diag.results, make_subplots),
        _verdicts_section(diag.results, sc),
        "</section>",
    ]
    return "\n".join(parts)


def figure_data(page: str) -> list[dict]:
    """The figures embedded in a report page: [{"query": "name@vN", "data": [...], "layout": {...}}].
    (For tests and tools that check what the page shows without a browser.)"""
    import re

    out = []
    for m in re.finditer(
        r'<script type="application/json" class="figure-data" data-target="[^"]*" '
        r'data-query="([^"]*)">(.*?)</script>',
        page,
        flags=re.S,
    ):
        fig = json.loads(m.group(2))
        out.append({"query": html.unescape(m.group(1)), "data": fig.get("data", []), "layout": fig.get("layout", {})})
    return out
