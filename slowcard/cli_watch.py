"""The `watch` and `capture` commands (added to the typer app by ``register(app)``): live
metrics into the database, one status line per interval, an alert line when a verdict turns
FAIL or back; with ``--capture``, a profile capture on each alert (slowcard/capture.py) whose
verdict is printed beside it.

Exit codes of `watch` as for `query`: 0 no watched verdict FAILed or ERRORed at the end (WARN too
with --strict), 1 otherwise, 2 usage or input error; captures do not change them. Ctrl-C ends the
watch with the exit code of the last verdicts (a running capture is stopped and recorded
interrupted); the database keeps every whole window collected before it. `capture`: 0 diagnosed
and nothing FAILs, 1 its diagnosis FAILs, 2 usage error, 3 the capture did not complete.
SIGTERM and SIGHUP (systemctl / docker stop, `timeout`, a closed terminal) are handled as Ctrl-C:
a profiler that may be on is stopped before slowcard exits.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, NamedTuple, overload

import typer

from .errors import SlowcardError, UsageError
from .render import safe_field

DEFAULT_DB = "slowcard.duckdb"
_DUR = re.compile(r"^\s*(\d{1,15}(?:\.\d{1,9})?)\s*(ms|s|m|h|d)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
DAY_S = 86400.0
# The longest value each duration may take: past these a sleep or a socket timeout overflows
# the platform's time_t (99999999999999d was an OverflowError), and nothing sensible needs more.
DURATION_MAX_S = {
    "--interval": 7 * DAY_S,
    "--timeout": 3600.0,
    "--duration": 3660 * DAY_S,
    "--backfill": 3660 * DAY_S,
    "--retention": 3660 * DAY_S,
    "--capture-seconds": 3600.0,
    "--capture-wait": 3600.0,
    "--capture-cooldown": 7 * DAY_S,
}


def _fmt_s(seconds: float) -> str:
    for unit, size in (("d", DAY_S), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def parse_duration(text: str, what: str) -> float:
    """'15', '15s', '2m', '1.5h', '7d' -> seconds: finite, above 0 and at most DURATION_MAX_S[what]."""
    m = _DUR.match(text or "")
    value = float(m.group(1)) * _UNIT[m.group(2)] if m else 0.0
    top = DURATION_MAX_S.get(what, 3660 * DAY_S)
    if not m or not 0 < value <= top:
        raise UsageError(f"{what} {text!r}: expected a positive duration up to {_fmt_s(top)}, like 15s, 2m, 1h or 7d")
    return value


def _dp(text: str, what: str) -> int:
    """A DP rank given on the command line: a whole number 0..MAX_INDEX."""
    from .metrics import MAX_INDEX

    if not (text.strip().isascii() and text.strip().isdigit()) or int(text) > MAX_INDEX:
        raise UsageError(f"{what}: the DP rank must be a number from 0 to {MAX_INDEX}")
    return int(text)


@overload
def _pairs(values: list[str] | None, what: str, int_value: Literal[True]) -> list[tuple[str, int | None]]: ...
@overload
def _pairs(values: list[str] | None, what: str, int_value: Literal[False]) -> list[tuple[str, str]]: ...
def _pairs(values: list[str] | None, what: str, int_value: bool) -> list[tuple[str, Any]]:
    """(URL, DP or None) pairs with ``int_value``, else (NAME, VALUE) pairs."""
    out: list[tuple[str, Any]] = []
    for raw in values or []:
        key, sep, val = raw.rpartition("=")
        if int_value:
            # URL=DP; an '=' inside the URL's query string (?a=1) is part of the URL
            if sep and val.strip().isascii() and val.strip().isdigit() and "?" not in key:
                out.append((key, _dp(val, f"{what} {raw}")))
            else:
                out.append((raw, None))
            continue
        if not sep or not key or not val:
            raise UsageError(f"{what} {raw!r}: expected NAME=VALUE")
        out.append((key, val))
    return out


def _fmt_ms(v) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.0f} ms"


def status_line(step, width: int = 100) -> str:
    """The interval's lines, none wider than ``width``: time, endpoints up, the instance's P99
    of the latest window and the verdicts; then the DP domains' load (requests/s, waiting, KV),
    as many domains a line as fit; then the endpoints that are down."""
    from .renderers import clip

    ts = time.strftime("%H:%M:%S", time.localtime(step.ts_ns / 1e9))
    up = sum(1 for s in step.statuses if s.ok)
    parts = [f"{ts} {up}/{len(step.statuses)} up"]
    doms = []
    if step.windows:
        last_ts = max(r["ts_ns"] for r in step.windows)
        rows = [r for r in step.windows if r["ts_ns"] == last_ts]
        for r in rows:
            if r["dp_rank"] is None:
                continue
            kv = f" kv{100 * r['kv_usage']:.0f}%" if r["kv_usage"] is not None else ""
            req = f"{r['requests_per_s']:.1f}" if r["requests_per_s"] is not None else "-"
            w = f"{r['waiting']:.0f}" if r["waiting"] is not None else "-"
            doms.append(f"DP{r['dp_rank']} {req} req/s w{w}{kv}" + (" (restart)" if r["reset"] else ""))
        inst = next((r for r in rows if r["dp_rank"] is None), None)
        if inst:
            parts.append(f"P99 TTFT {_fmt_ms(inst['ttft_p99_ms'])} e2e {_fmt_ms(inst['e2e_p99_ms'])}")
        n_win = step.n_windows or len({r["ts_ns"] for r in step.windows})
        if n_win > 1:
            parts.append(f"{n_win} windows")
        if not doms:
            parts.append("no domain")
    else:
        parts.append("no new window")
    if step.busy:
        parts.append(f"database busy: {step.held_windows} window(s) held, written when it is free")
    else:
        judged = [f"{name} {r.status}" for name, r in step.results.items() if r.status != "SKIP"]
        skipped = sum(1 for r in step.results.values() if r.status == "SKIP")
        parts.append(", ".join(judged + ([f"{skipped} SKIP"] if skipped else [])))
    if step.lost_windows:
        parts.append(f"{step.lost_windows} window(s) dropped while the database was busy")
    dropped = sum(s.dropped for s in step.statuses)
    if dropped:
        why = next((s.note for s in step.statuses if s.note), None)
        parts.append(f"{dropped} sample(s) dropped" + (f" ({why})" if why else ""))
    # each line escaped whatever the names and server answers hold (a newline in an error text
    # forged an ALERT line)
    lines = [clip(safe_field("  ".join(parts)), width)]
    if doms:  # the domains in groups of equal size, one line each
        fit = max((width - 2 + 3) // (max(len(d) for d in doms) + 3), 1)
        n_lines = -(-len(doms) // fit)
        start = 0
        for k in range(n_lines):
            size = len(doms) // n_lines + (1 if k < len(doms) % n_lines else 0)
            lines.append(clip("  " + " | ".join(doms[start : start + size]), width))
            start += size
    down = [f"{s.target}: {s.error}" for s in step.statuses if not s.ok]
    if down:
        text = "  down: " + "; ".join(down[:3]) + (f" (+{len(down) - 3})" if len(down) > 3 else "")
        lines.append(clip(safe_field(text), width))
    return "\n".join(lines)


def change_lines(name: str, old: str, new: str, summary: str, width: int = 100) -> str:
    """A verdict change on lines of its own: ``ALERT name: PASS -> FAIL: summary`` when it turns
    FAIL, ``CLEARED`` when it turns back; the summary escaped (newlines too) and wrapped within
    ``width``, never cut."""
    from .renderers import wrap

    tag = "ALERT" if new == "FAIL" else "CLEARED"
    return "\n".join(wrap(safe_field(f"{tag} {name}: {old} -> {new}: {summary}"), width, indent="  "))


@contextmanager
def signals_as_ctrl_c(signals: tuple[str, ...] = ("SIGTERM", "SIGHUP")) -> Iterator[list[str]]:
    """While the block runs, each of ``signals`` raises KeyboardInterrupt in the main thread as
    Ctrl-C does (systemctl / docker stop and `timeout` send SIGTERM; a closed terminal SIGHUP),
    so the command's Ctrl-C path stops a running profiler instead of dying with it on; the names
    of the signals received are appended to the yielded list. Outside the main thread (where
    Python cannot set handlers) nothing changes."""
    got: list[str] = []

    def handler(signum, _frame):
        got.append(signal.Signals(signum).name)
        raise KeyboardInterrupt

    old = {}
    if threading.current_thread() is threading.main_thread():
        for name in signals:
            if hasattr(signal, name):
                old[name] = signal.signal(getattr(signal, name), handler)
    try:
        yield got
    finally:
        for name, previous in old.items():
            signal.signal(getattr(signal, name), previous)


def await_capture_end(ended: Callable[[float], bool], bound_s: float) -> bool:
    """Wait for a stopped capture to end (its profiler stopped, its row written), at most
    ``bound_s``: True when it did. Another Ctrl-C / SIGTERM meanwhile does not cut it short (the
    stop it waits for is what leaves the service unprofiled): it is said once and ignored."""
    deadline = time.monotonic() + bound_s
    told = False
    while True:
        try:
            if ended(max(0.0, min(0.2, deadline - time.monotonic()))):
                return True
        except KeyboardInterrupt:
            if not told:
                typer.echo(
                    f"still stopping the profiler: slowcard ends once it is off (at most {bound_s:.0f} s)", err=True
                )
                told = True
            continue
        if time.monotonic() >= deadline:
            return False


def _server_of(url: str) -> str:
    """http://host:port of a /metrics URL: vLLM serves /start_profile on the same server."""
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    return f"{u.scheme}://{u.netloc}"


class CaptureOptions(NamedTuple):
    backend: str
    url: str | None
    capture_dir: Path | None
    config: Path | None
    start: str | None
    stop: str | None
    seconds: str
    wait: str
    cooldown: str
    max_mb: float


def make_capturer(opts: CaptureOptions, db: Path, sql_dir, db_lock, n_domains):
    """A Capturer from the command line's --capture* options (UsageError for a bad one)."""
    from .capture import BACKENDS, CaptureError, Capturer, make_backend

    if opts.backend not in BACKENDS:
        raise UsageError(f"--capture {opts.backend!r}: expected one of {', '.join(BACKENDS)}")
    if opts.url is not None and not opts.url.startswith(("http://", "https://")):
        raise UsageError(f"--capture-url {opts.url!r}: expected an http:// or https:// URL")
    seconds = parse_duration(opts.seconds, "--capture-seconds")
    wait = parse_duration(opts.wait, "--capture-wait")
    cooldown = parse_duration(opts.cooldown, "--capture-cooldown")
    try:
        backend = make_backend(
            opts.backend,
            url=opts.url,
            capture_dir=opts.capture_dir,
            config=opts.config,
            start_cmd=opts.start,
            stop_cmd=opts.stop,
        )
    except CaptureError as exc:
        raise UsageError(str(exc)) from None
    return Capturer(
        db,
        backend,
        seconds=seconds,
        cooldown_s=cooldown,
        max_bytes=int(opts.max_mb * 1e6),
        wait_s=wait,
        sql_dirs=sql_dir,
        db_lock=db_lock,
        n_domains=n_domains,
    )


def capture_lines(cap, width: int = 100) -> str:
    """A finished capture on lines of its own: ``CAPTURE n for <alert>: <status> ...`` then the
    capture's verdict beside the alert (or the reason it has none)."""
    from .renderers import wrap

    a = cap.alert
    what = a.query + (f" ({a.subject}" + (f": {a.cause})" if a.cause else ")") if a.subject else "")
    head = f"CAPTURE {cap.capture_id} for {what}: {cap.status}"
    if cap.status == "ok":
        head += (
            f", {cap.backend} {cap.window_s:.1f} s, {cap.files} file(s) {cap.size_bytes / 1e6:.1f} MB -> run {cap.run}"
        )
    elif cap.reason:
        head += f": {cap.reason}"
    lines = [head]
    if cap.status == "ok":
        verdict = f"verdict {cap.verdict_status}"
        if cap.verdict_query:
            verdict += f" {cap.verdict_query}"
        verdict += f": {cap.headline}" if cap.headline else ""
        if cap.matches_alert is True:
            verdict += f"; the alerted {a.subject}" if a.subject else ""
        elif cap.matches_alert is False:
            verdict += f"; NOT the alerted {a.subject}" if a.subject else ""
        lines.append(verdict)
        if cap.next_step and cap.slow_card:
            lines.append(f"next: {cap.next_step}")
    lines += [f"note: {n}" for n in cap.notes]
    out = []
    for i, text in enumerate(lines):
        out += wrap(safe_field(text), width, indent="    " if i else "  ", first="  " if i else "")
    return "\n".join(out)


def register(app: typer.Typer) -> None:
    """Add the `watch` and `capture` commands to ``app``."""

    @app.command()
    def watch(
        scrape: list[str] | None = typer.Option(
            None,
            "--scrape",
            help="A /metrics URL, optionally URL=DP (repeatable; default DP: the engine label, else the position).",
        ),
        prometheus: str | None = typer.Option(
            None, "--prometheus", help="Prometheus server URL: range-query backfill, then follow."
        ),
        dp_map: list[str] | None = typer.Option(
            None, "--dp-map", help="With --prometheus: INSTANCE=DP for instances without an engine label (repeatable)."
        ),
        db: Path = typer.Option(DEFAULT_DB, "--db", help="DuckDB database file (created if missing)."),
        run: str = typer.Option("watch", "--run", help="Run name the metrics are stored under."),
        interval: str = typer.Option("15s", "--interval", help="Collection interval (= window length), e.g. 15s, 1m."),
        duration: str | None = typer.Option(None, "--duration", help="Stop after this long (default: until Ctrl-C)."),
        backfill: str = typer.Option(
            "1h", "--backfill", help="With --prometheus: how far back the first collection reaches."
        ),
        retention: str = typer.Option(
            "7d", "--retention", help="Windows older than this are deleted from the database."
        ),
        timeout: str = typer.Option("5s", "--timeout", help="Per-request timeout."),
        metric: list[str] | None = typer.Option(
            None,
            "--metric",
            help="CANONICAL=NAME: read another exposed metric (e.g. expert_tokens=my_moe_tokens_total).",
        ),
        dp_label: str | None = typer.Option(
            None, "--dp-label", help="Label holding the DP rank (default: engine, dp, dp_rank)."
        ),
        exec_cmd: str | None = typer.Option(
            None,
            "--exec",
            help="Shell command run when a verdict turns FAIL or back (SLOWCARD_QUERY/STATUS/BEFORE/SUMMARY/RUN in its environment).",
        ),
        webhook: str | None = typer.Option(
            None, "--webhook", help="URL that gets a JSON POST when a verdict turns FAIL or back."
        ),
        once: bool = typer.Option(False, "--once", help="Collect one window, judge, print, exit (for cron)."),
        serve: str | None = typer.Option(
            None,
            "--serve",
            help="HOST:PORT: expose the current verdicts as Prometheus metrics (slowcard_verdict, "
            "slowcard_cost_pct) while watching; port 0: any free port.",
        ),
        strict: bool = typer.Option(False, "--strict", help="Exit 1 on WARN too."),
        sql_dir: list[Path] | None = typer.Option(None, "--sql-dir", help="Extra folder of query files."),
        exporter: str = typer.Option(
            "vllm", "--exporter", help="Metric names of: vllm | vllm-ascend | mindie (see docs/tables.md)."
        ),
        capture: str | None = typer.Option(
            None,
            "--capture",
            help="When a verdict turns FAIL, profile the service: vllm | msserviceprofiler | exec (see README).",
        ),
        capture_url: str | None = typer.Option(
            None, "--capture-url", help="vLLM API server for /start_profile (default: the first --scrape's server)."
        ),
        capture_dir: Path | None = typer.Option(
            None, "--capture-dir", help="Where the profiler writes (vllm: its torch_profiler_dir; exec)."
        ),
        capture_config: Path | None = typer.Option(
            None, "--capture-config", help="msServiceProfiler JSON config (default: $SERVICE_PROF_CONFIG_PATH)."
        ),
        capture_start: str | None = typer.Option(None, "--capture-start", help="exec: shell command that starts it."),
        capture_stop: str | None = typer.Option(None, "--capture-stop", help="exec: shell command that stops it."),
        capture_seconds: str = typer.Option("10s", "--capture-seconds", help="How long the profiler runs."),
        capture_wait: str = typer.Option(
            "2m", "--capture-wait", help="After the stop: how long the files may take to be complete."
        ),
        capture_cooldown: str = typer.Option(
            "5m", "--capture-cooldown", help="Least time between the end of a capture and the next."
        ),
        capture_max_mb: float = typer.Option(
            2048.0, "--capture-max-mb", min=0.001, help="A capture larger than this is not ingested."
        ),
    ):
        """Collect live service metrics (vLLM /metrics or a Prometheus server) into the database
        and re-judge dp-metrics-imbalance and expert-hotspots after every interval.

        Example:
            slowcard watch --scrape http://127.0.0.1:8000/metrics --interval 15s --db live.duckdb
        """
        from . import metrics as mx
        from .cli_common import screen_width
        from .watch import PrometheusSource, ScrapeSource, Watcher

        last = None
        served = None  # the --serve exporter, stopped when the watch ends
        source: ScrapeSource | PrometheusSource
        try:
            if bool(scrape) == bool(prometheus):
                raise UsageError("give --scrape URL (repeatable) or --prometheus URL, not both and not neither")
            interval_s = parse_duration(interval, "--interval")
            duration_s = parse_duration(duration, "--duration") if duration else None
            timeout_s = parse_duration(timeout, "--timeout")
            try:
                mapping = mx.Mapping.for_exporter(exporter)
            except ValueError as exc:
                raise UsageError(f"--exporter: {exc}") from None
            if dp_label:
                mapping.dp_labels = (dp_label,)
            for canon, name in _pairs(metric, "--metric", False):
                try:
                    mapping.override(canon, name)
                except ValueError as exc:
                    raise UsageError(f"--metric {canon}={name}: {exc}") from None
            if scrape:
                targets = _pairs(scrape, "--scrape", True)
                for url, _ in targets:
                    if not url.startswith(("http://", "https://")):
                        raise UsageError(f"--scrape {url!r}: expected an http:// or https:// URL")
                source = ScrapeSource(targets, mapping, timeout_s=timeout_s)
            else:
                assert prometheus is not None  # exactly one of --scrape / --prometheus: checked above
                if not prometheus.startswith(("http://", "https://")):
                    raise UsageError(f"--prometheus {prometheus!r}: expected an http:// or https:// URL")
                dmap = {k: _dp(v, f"--dp-map {k}={v}") for k, v in _pairs(dp_map, "--dp-map", False)}
                source = PrometheusSource(
                    prometheus,
                    mapping,
                    step_s=interval_s,
                    backfill_s=parse_duration(backfill, "--backfill"),
                    dp_map=dmap,
                    timeout_s=timeout_s,
                )
            capturer = None
            domains: list[int | None] = [None]  # DP domains in the latest window (to link a capture's rank)
            if capture:
                opts = CaptureOptions(
                    capture,
                    capture_url or (_server_of(_pairs(scrape[:1], "--scrape", True)[0][0]) if scrape else None),
                    capture_dir,
                    capture_config,
                    capture_start,
                    capture_stop,
                    capture_seconds,
                    capture_wait,
                    capture_cooldown,
                    capture_max_mb,
                )
                capturer = make_capturer(opts, db, sql_dir, threading.Lock(), lambda: domains[0])
            watcher = Watcher(
                db,
                run,
                source,
                retention_s=parse_duration(retention, "--retention"),
                exec_cmd=exec_cmd,
                webhook=webhook,
                sql_dirs=sql_dir,
                db_lock=capturer.db_lock if capturer else None,
            )
            if serve:
                from .exporter import Exporter, parse_host_port

                served = Exporter(watcher.run, *parse_host_port(serve))
                typer.echo(f"serving the verdicts as Prometheus metrics on {served.url}", err=True)

            def show_captures(width: int) -> None:
                if capturer is None:
                    return
                for cap in capturer.finished():
                    typer.echo(capture_lines(cap, width))
                    if webhook:
                        from .capture import post_capture

                        typer.echo(safe_field(f"  {post_capture(webhook, cap, watcher.run)}"), err=True)

            def show(step):
                nonlocal last
                if served is not None:
                    served.update(step)
                if step.results or last is None:
                    last = step  # a step that found the database busy judged nothing: keep the last verdicts
                width = screen_width()
                typer.echo(status_line(step, width))
                for name, old, new in step.changes:
                    typer.echo(change_lines(name, old, new, step.results[name].summary, width))
                for act in step.actions:
                    typer.echo(safe_field(f"  {act}"), err=True)
                if capturer is not None:
                    if step.windows:
                        last_ts = max(r["ts_ns"] for r in step.windows)
                        domains[0] = len({r["dp_rank"] for r in step.windows if r["ts_ns"] == last_ts} - {None})
                    show_captures(width)
                    for name, _old, new in step.changes:
                        if new == "FAIL":
                            from .capture import Alert

                            alert = Alert.from_result(name, step.results[name], step.ts_ns, watcher.run)
                            typer.echo(safe_field(f"CAPTURE {capturer.trigger(alert)}"))

            with signals_as_ctrl_c():  # SIGTERM / SIGHUP as Ctrl-C, while it stops a capture too
                try:
                    watcher.run_loop(interval_s, duration_s=duration_s, once=once, on_step=show)
                    if capturer is not None:
                        if capturer.busy():
                            typer.echo("waiting for the running capture to end (Ctrl-C stops it)", err=True)
                            capturer.wait()
                        show_captures(screen_width())
                except KeyboardInterrupt:
                    if capturer is not None:
                        capturer.request_stop()
                        if capturer.busy():
                            typer.echo("interrupted: stopping the running capture's profiler", err=True)
                        if not await_capture_end(capturer.wait, capturer.stop_bound_s()):
                            phase = capturer.phase
                            capturer.abandon()
                            typer.echo(
                                f"Error: the running capture did not end in time ({phase}): the profiler may still "
                                "be on: stop it by hand",
                                err=True,
                            )
                        show_captures(screen_width())
                    if watcher.pending():  # the database was busy at the last collections
                        typer.echo(
                            "interrupted: the windows held while the database was busy were not written; "
                            "every window written before is in the database",
                            err=True,
                        )
                    else:
                        typer.echo("interrupted: every window collected before Ctrl-C is in the database", err=True)
        except SlowcardError as exc:
            typer.echo(safe_field(f"Error: {exc}"), err=True)
            raise typer.Exit(2) from None
        finally:
            if served is not None:
                served.close()
        results = list(last.results.values()) if last else []
        bad = {"FAIL", "ERROR"} | ({"WARN"} if strict else set())
        raise typer.Exit(1 if any(r.status in bad for r in results) else 0)

    @app.command("capture")
    def capture_cmd(
        backend: str = typer.Argument(..., help="vllm | msserviceprofiler | exec"),
        url: str | None = typer.Option(None, "--url", help="vllm: the API server, e.g. http://127.0.0.1:8000."),
        capture_dir: Path | None = typer.Option(
            None, "--capture-dir", help="Where the profiler writes (vllm: its torch_profiler_dir; exec)."
        ),
        config: Path | None = typer.Option(
            None, "--capture-config", help="msServiceProfiler JSON config (default: $SERVICE_PROF_CONFIG_PATH)."
        ),
        start: str | None = typer.Option(None, "--capture-start", help="exec: shell command that starts it."),
        stop: str | None = typer.Option(None, "--capture-stop", help="exec: shell command that stops it."),
        seconds: str = typer.Option("10s", "--capture-seconds", help="How long the profiler runs."),
        wait: str = typer.Option("2m", "--capture-wait", help="After the stop: how long the files may take."),
        max_mb: float = typer.Option(2048.0, "--capture-max-mb", min=0.001, help="Larger captures are not ingested."),
        dp: str | None = typer.Option(None, "--dp", help="The suspect DP domain (links the verdict to it)."),
        db: Path = typer.Option(DEFAULT_DB, "--db", help="DuckDB database file (created if missing)."),
        fmt: str = typer.Option("table", "--format", help="table | json"),
        sql_dir: list[Path] | None = typer.Option(None, "--sql-dir", help="Extra folder of query files."),
    ):
        """Profile a running service now: start its profiler, keep it --capture-seconds, stop it,
        wait for the files, ingest them as run capture-N and diagnose it.

        Exit codes: 0 the capture was diagnosed and nothing FAILs, 1 its diagnosis FAILs,
        2 usage error, 3 the capture failed, timed out, was too large or was interrupted.

        Example:
            slowcard capture vllm --url http://127.0.0.1:8000 --capture-dir /tmp/vllm_profile --dp 2
        """
        from .capture import Alert

        try:
            if fmt not in ("table", "json"):
                raise UsageError(f"--format {fmt!r}: expected table or json")
            dp_rank = _dp(dp, "--dp") if dp is not None else None
            opts = CaptureOptions(backend, url, capture_dir, config, start, stop, seconds, wait, "1s", max_mb)
            capturer = make_capturer(opts, db, sql_dir, threading.Lock(), lambda: None)
        except SlowcardError as exc:
            typer.echo(safe_field(f"Error: {exc}"), err=True)
            raise typer.Exit(2) from None
        alert = Alert.on_demand(dp_rank=dp_rank)
        done: list = []
        ended = threading.Event()

        def work():
            try:
                done.append(capturer.run(alert))
            finally:
                ended.set()

        phase = "starting"
        with signals_as_ctrl_c(("SIGINT", "SIGTERM", "SIGHUP")) as got:
            threading.Thread(target=work, daemon=True).start()
            try:
                while not ended.wait(0.1):  # short waits (never Thread.join): Ctrl-C lands here at once
                    pass
            except KeyboardInterrupt:
                why = "interrupted" if not got or got[0] == "SIGINT" else got[0]
                typer.echo(f"{why}: stopping the profiler", err=True)
                capturer.request_stop()  # sets the stop the capture waits on; it stops its profiler
                if not await_capture_end(ended.wait, capturer.stop_bound_s()):
                    phase = capturer.phase
                    capturer.abandon()
        if not done:
            typer.echo(
                f"Error: the capture did not end in time after it was interrupted ({phase}): the profiler may still "
                "be on: stop it by hand",
                err=True,
            )
            raise typer.Exit(3)
        cap = done[0]
        if fmt == "json":
            from .render import to_json

            typer.echo(to_json(cap.to_dict()))
        else:
            from .cli_common import screen_width

            typer.echo(capture_lines(cap, screen_width()))
        if cap.status != "ok":
            raise typer.Exit(3)
        raise typer.Exit(1 if cap.verdict_status in ("FAIL", "ERROR") else 0)
