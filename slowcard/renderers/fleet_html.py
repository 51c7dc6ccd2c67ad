"""The fleet page (`slowcard fleet --html FILE`): ONE self-contained HTML file with the devices x
runs heat map (a slow card's cost in each run it was named; blank where the device was absent)
and the fleet verdicts' tables. Built from the results of the fleet queries only (the report
query with every device for the heat map): it runs no query of its own. Pure: returns the text.
"""

from __future__ import annotations

import datetime as _dt
import html

from .._version import __version__
from .html import _CSS, _LOADER, _Figures, _plotly, _ref, _status_span, _table, esc


def _heat(F: _Figures, res) -> str:
    """Devices (rows) x runs (columns, oldest first): cost % where the device was the slow card,
    0 where it was present and not slow, blank where absent; the hover names the rank it served."""
    rows = res.rows
    if not rows:
        return f'<p class="skip">No judged run has a device for its ranks ({esc(res.summary)}).</p>'
    runs = sorted({(r["run_at"], r["run"]) for r in rows})
    run_names = [name for _, name in runs]
    col = {name: i for i, name in enumerate(run_names)}
    devices = sorted({r["device"] for r in rows})
    line = {d: i for i, d in enumerate(devices)}
    z: list[list[float | None]] = [[None] * len(run_names) for _ in devices]
    text: list[list[str]] = [[""] * len(run_names) for _ in devices]
    for r in rows:
        i, j = line[r["device"]], col[r["run"]]
        slow = bool(r["slow"])
        z[i][j] = (r["cost_pct"] if r["cost_pct"] is not None else 1.0) if slow else 0.0
        what = f"slow card ({r['level']}, {r['cause']}, {r['cost_pct']} %)" if slow else "not slow"
        text[i][j] = f"{r['device']} in {r['run']} as rank {r['rank']}: {what}"
    fig = F.go.Figure(
        F.go.Heatmap(
            z=z,
            x=run_names,
            y=devices,
            text=text,
            hoverinfo="text",
            colorscale=[[0, "#eef5ee"], [0.01, "#fde0c5"], [1, "#b2182b"]],
            colorbar=dict(title="cost %"),
            zmin=0,
        )
    )
    fig.update_layout(
        title="Slow card cost per device and run (blank: the device was not in the run)",
        xaxis_title="run (oldest first)",
        yaxis_title="device (host/device_id)",
    )
    return F.block(fig, html.escape(_ref(res)), max(320, 26 * len(devices) + 140))


def build_fleet_page(results: dict, heat) -> str:
    """The page: the verdict tables of ``results`` (fleet query name -> Result) and the heat map
    of ``heat`` (the report result holding every device's runs)."""
    go, _make_subplots, offline = _plotly()
    F = _Figures(go)
    sections = ["<h2>Devices x runs</h2>", _heat(F, heat)]
    for res in results.values():
        if res is heat:
            continue
        sections.append(f"<h2>{html.escape(res.query)}</h2>")
        sections.append(
            f"<p>{_status_span(str(res.status))} {esc(res.summary)} <code>{html.escape(_ref(res))}</code></p>"
        )
        if res.rows:
            sections.append(
                _table(res.columns, res.rows, 50, highlight=lambda r: str(r.get("level")) in ("FAIL", "WARN"))
            )
    when = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            "<title>slowcard fleet</title>",
            f"<style>{_CSS}</style>",
            f'<script type="text/javascript">{offline.get_plotlyjs()}</script>',
            "</head><body>",
            "<h1>slowcard fleet: which card keeps coming up slow</h1>",
            f'<p class="meta">slowcard {html.escape(__version__)}, generated {when}. Each figure and table names '
            "the query behind it (<code>name@version</code>); <code>slowcard show NAME</code> prints its SQL.</p>",
            *sections,
            f"<script>{_LOADER}</script>",
            "</body></html>",
        ]
    )
