"""The `fleet` command (added to the typer app by ``register(app)``): across every run of the
database, the device that keeps being slow and the rank slow wherever it lands.

Prints only through typer.echo; exit 0 nothing named, 1 a FAIL (a WARN too with --strict),
2 usage or input error.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import typer

from .cli_common import (
    DEFAULT_DB,
    DbOption,
    FormatOption,
    LimitOption,
    SqlDirOption,
    StrictOption,
    WideOption,
    check_format,
    exit_code,
    screen_width,
)
from .errors import UsageError


def _since(value: str | None) -> str:
    if not value:
        return ""
    try:
        return datetime.fromisoformat(value).isoformat(sep=" ")
    except ValueError:
        raise UsageError(
            f"--since {value!r}: expected an ISO date or time, e.g. 2026-11-01 or 2026-11-01T08:00"
        ) from None


def register(app: typer.Typer) -> None:
    """Add the `fleet` command to ``app``."""

    @app.command("fleet")
    def fleet_cmd(
        db: DbOption = Path(DEFAULT_DB),
        since: str | None = typer.Option(
            None, "--since", help="Only runs ingested at or after this time (ISO date or time)."
        ),
        trend: str | None = typer.Option(
            None, "--trend", help="One card's cost run by run: host/device_id as the device table names it."
        ),
        min_slow_runs: int = typer.Option(
            3, "--min-slow-runs", min=1, help="A device or rank is named only when slow in at least this many runs."
        ),
        html_out: Path | None = typer.Option(
            None, "--html", help="Also write the fleet page: a devices x runs heat map and the tables (needs plotly)."
        ),
        rejudge: bool = typer.Option(
            False, "--rejudge", help="Judge every run again (default: only runs new or changed since last time)."
        ),
        fmt: FormatOption = "table",
        sql_dir: SqlDirOption = None,
        strict: StrictOption = False,
        limit: LimitOption = 20,
        wide: WideOption = False,
    ):
        """Which physical card keeps coming up slow, across every run of the database?

        Judges each run not judged yet (its slow-card verdicts, as diagnose; stored in
        run_verdicts / run_slow_cards), then per device and per rank: how often it was the slow
        card, with cause, cost and first/last seen. FAIL / WARN: beyond chance given how often
        it was present (binomial test against each run's share of slow ranks, Bonferroni over
        the devices). --trend DEVICE: that card's cost run by run.

        Example:
            slowcard fleet --db fleet.duckdb --since 2026-11-01
        """
        from . import fleet as fleet_mod
        from .render import to_json
        from .renderers.tables import render_results

        check_format(fmt, ("table", "json", "markdown"))
        if not Path(db).exists():
            raise UsageError(f"{db}: no such database; ingest runs first (slowcard ingest PATH --run NAME --db {db})")
        when = _since(since)
        params = {"since": when, "min_slow_runs": str(min_slow_runs), "device": trend or ""}
        if html_out is not None:
            from .renderers.html import _plotly

            _plotly()  # plotly missing: said before the runs are judged
        out = fleet_mod.fleet(db, params, sql_dir, rejudge, reports=trend is not None)
        results = list(out.results.values())
        if html_out is not None:
            from .outfile import atomic_output
            from .renderers.fleet_html import build_fleet_page

            every = fleet_mod.fleet(db, {**params, "device": "*"}, sql_dir, reports=True)
            heat = next(r for r in every.results.values() if r.spec is not None and not r.spec.is_verdict)
            page = build_fleet_page(every.results, heat)
            try:
                with atomic_output(html_out) as f:
                    f.write(page.encode("utf-8"))
            except OSError as exc:
                raise UsageError(f"{html_out}: cannot write the fleet page ({exc.strerror or exc})") from None
            typer.echo(f"wrote {html_out} ({len(page) / 1e6:.1f} MB)", err=True)
        if fmt == "json":
            typer.echo(to_json(out.to_dict()))
        else:
            typer.echo(
                f"{len(out.judged)} run(s) judged now, {out.kept} judged before (stored verdicts still current)"
                + (
                    f"; {out.no_device} rank(s) of judged runs have no known device (host/device id): counted per "
                    "rank only (ingest --device-map FILE)"
                    if out.no_device
                    else ""
                ),
                err=True,
            )
            typer.echo(render_results(results, fmt, limit, screen_width(), wide))
        raise typer.Exit(exit_code(results, strict))
