"""`slowcard watch`: live metrics from real exporters (tests/vllm_sim.py processes on 127.0.0.1)
and a real Prometheus server (skipped without the `prometheus` binary) into the database, and
the metrics verdicts on them: a persistent hot DP domain with rising P99 is flagged within a few
intervals, a short burst and traffic jitter are not, an exporter restart is not an alert, the
hot-expert Top list names the concentrated experts and ranks; robust to garbage, timeouts and
vanished endpoints; Ctrl-C leaves whole windows.

Every process started here stops by itself (--duration) and is killed in a finally.
"""

from __future__ import annotations

import http.server
import json
import math
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from slowcard import metrics as mx
from slowcard import store
from slowcard.cli import app
from slowcard.diagnosis import diagnose
from slowcard.watch import PrometheusSource, ScrapeSource, Watcher, parse_scrape

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prom_server import NO_PROMETHEUS, PROMETHEUS, Prometheus  # noqa: E402
from sim_procs import Sims  # noqa: E402
from ticked_exporter import FakeClock, TickedExporter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# --- helpers ---------------------------------------------------------------------------------
@pytest.fixture
def sims():
    s = Sims()
    try:
        yield s
    finally:
        s.close()


def watch_steps(db, urls, interval_s=0.5, steps=10, run="live", **kw) -> list:
    source = ScrapeSource([(u, None) for u in urls], mx.Mapping(), timeout_s=kw.pop("timeout_s", 2.0))
    w = Watcher(db, run, source, **kw)
    out = []
    for _ in range(steps):
        t = time.monotonic()
        out.append(w.step())
        time.sleep(max(0.0, interval_s - (time.monotonic() - t)))
    return out


def statuses(steps, query="dp-metrics-imbalance") -> list[str]:
    return [s.results[query].status for s in steps]


# --- pure window arithmetic ------------------------------------------------------------------
def test_counter_increase_handles_resets():
    assert mx.increase(10.0, 25.0) == (15.0, False)
    assert mx.increase(100.0, 7.0) == (7.0, True)  # restarted: counts since the restart
    assert mx.increase(None, 3.0) == (3.0, False)


def test_histogram_quantile_interpolates_like_promql():
    b = [(0.1, 50.0), (0.2, 90.0), (0.5, 100.0), (math.inf, 100.0)]
    assert mx.histogram_quantile(0.5, b) == pytest.approx(0.1)
    assert mx.histogram_quantile(0.7, b) == pytest.approx(0.15)
    assert mx.histogram_quantile(0.99, b) == pytest.approx(0.2 + 0.3 * 0.9)
    assert mx.histogram_quantile(0.99, [(0.1, 0.0), (math.inf, 0.0)]) is None


def _scrape(engine_vals: dict[int, tuple[float, list[float]]]) -> str:
    """A tiny vLLM exposition: requests counter and a 3-bucket TTFT histogram per engine."""
    lines = ["# TYPE vllm:request_success counter", "# TYPE vllm:time_to_first_token_seconds histogram"]
    for e, (req, cum) in engine_vals.items():
        lines.append(f'vllm:request_success_total{{engine="{e}",finished_reason="stop"}} {req}')
        for le, c in zip(("0.1", "0.5", "+Inf"), cum):
            lines.append(f'vllm:time_to_first_token_seconds_bucket{{engine="{e}",le="{le}"}} {c}')
        lines.append(f'vllm:time_to_first_token_seconds_count{{engine="{e}"}} {cum[-1]}')
        lines.append(f'vllm:time_to_first_token_seconds_sum{{engine="{e}"}} 1.0')
    return "\n".join(lines) + "\n"


def test_window_rows_rates_quantiles_and_restart():
    m = mx.Mapping()
    wanted = m.wanted()
    a, b = mx.Snapshot(ts_ns=0), mx.Snapshot(ts_ns=2_000_000_000)
    assert parse_scrape(_scrape({0: (100, [10, 20, 20]), 1: (500, [40, 40, 40])}), a, m, wanted, "t", 0, None).ok
    # engine 1 restarted: its counters went down
    assert parse_scrape(_scrape({0: (140, [30, 60, 60]), 1: (8, [8, 8, 8])}), b, m, wanted, "t", 0, None).ok
    rows = {r["dp_rank"]: r for r in mx.window_rows(a, b, m)}
    assert rows[0]["requests_per_s"] == pytest.approx(20.0) and not rows[0]["reset"]
    assert rows[1]["requests_per_s"] == pytest.approx(4.0) and rows[1]["reset"]  # never negative
    assert rows[0]["ttft_p50_ms"] == pytest.approx(100.0)  # 20 of 40 new below 0.1 s
    inst = rows[None]
    assert inst["requests_per_s"] == pytest.approx(24.0) and inst["reset"]
    assert inst["ttft_p99_ms"] > rows[1]["ttft_p99_ms"]


def test_parse_scrape_rejects_garbage_and_foreign_metrics():
    m = mx.Mapping()
    snap = mx.Snapshot(ts_ns=0)
    st = parse_scrape("<html><body>502 Bad Gateway</body></html>", snap, m, m.wanted(), "t", 0, None)
    assert not st.ok and "no vLLM metric" in st.error
    st = parse_scrape('vllm:num_requests_running{engine="0"} abc\n', snap, m, m.wanted(), "t", 0, None)
    assert not st.ok and st.error.startswith("garbage") and st.dropped == 1
    st = parse_scrape("node_load1 0.5\n" * 3, snap, m, m.wanted(), "t", 0, None)
    assert not st.ok and not snap.values


def test_mapping_override_and_endpoint_dp():
    m = mx.Mapping()
    with pytest.raises(ValueError, match="unknown metric"):
        m.override("latency", "x")
    m.override("waiting", "sglang:num_queue_reqs")
    snap = mx.Snapshot(ts_ns=0)
    # the endpoint's DP wins over a label every per-engine endpoint repeats
    assert parse_scrape('sglang:num_queue_reqs{engine="0"} 4\n', snap, m, m.wanted(), "u", 0, 3).ok
    assert [k[1] for k in snap.values] == [3]


# --- real exporters --------------------------------------------------------------------------
def test_hot_domain_with_rising_p99_is_flagged_within_a_few_intervals(sims, tmp_path):
    port = sims.start("--hot-engine", "2", "--hot-from", "2.0", "--jitter", "0.2")
    steps = watch_steps(tmp_path / "w.duckdb", [f"http://127.0.0.1:{port}/metrics"], steps=12)
    st = statuses(steps)
    assert "FAIL" in st, st
    first_fail = st.index("FAIL")
    # FAIL at exactly the 3rd hot window (min_windows): a streak of 3, and no later than the 3rd
    # window read surely after the domain turned hot. The simulator sets the hot domain's gauges
    # (KV usage 2.5x) at its first tick (every 0.05 s) at or after hot_from, so a window read after
    # that is hot. A window is read after its snapshot time (its end); the simulator's clock starts
    # just before `started` (it prints its port, then starts).
    assert steps[first_fail].results["dp-metrics-imbalance"].rows[0]["hot_windows"] == 3
    hot_at = sims.started[port] + 2.0
    upto = [s for s in steps[: first_fail + 1] if s.windows]
    surely_hot = sum(1 for s in upto if s.windows[-1]["ts_ns"] / 1e9 > hot_at + 0.1)
    assert surely_hot <= 3, (st, [round(s.windows[-1]["ts_ns"] / 1e9 - hot_at, 2) for s in upto])
    res = steps[-1].results["dp-metrics-imbalance"]
    assert [r["dp_rank"] for r in res.rows] == [2]
    assert res.rows[0]["cause"] == "request-skew" and res.rows[0]["latency_rising"]
    assert steps[first_fail].changes == [("dp-metrics-imbalance", "PASS", "FAIL")]
    # diagnose puts the metrics verdict in its conclusion when the run has metrics
    con = store.open_db(tmp_path / "w.duckdb", read_only=True)
    try:
        diag = diagnose(con, "live")
    finally:
        con.close()
    assert diag.conclusion["headline"] == "Slow card: DP domain 2 — request-skew"
    assert diag.conclusion["query"].startswith("dp-metrics-imbalance@v")


def test_short_burst_and_jitter_are_not_flagged(tmp_path, monkeypatch):
    # on a fake clock, traffic advancing 0.5 s per scrape (tests/ticked_exporter.py): the burst
    # falls in the same windows however loaded the machine is (real time diluted it under load)
    import slowcard.watch

    clock = FakeClock()
    monkeypatch.setattr(slowcard.watch, "time", clock)
    exporter = TickedExporter(hot_engine=1, hot_from=2.0, hot_to=2.6, jitter=0.3)
    try:
        w = Watcher(tmp_path / "w.duckdb", "live", ScrapeSource([(exporter.url, None)], mx.Mapping()))
        steps = []
        for _ in range(12):
            steps.append(w.step())
            clock.sleep(0.5)
    finally:
        exporter.close()
    st = statuses(steps)
    assert "FAIL" not in st and "WARN" not in st, st
    # the burst was seen (a domain was ahead for a window) but never persisted
    con = duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True)
    peak = con.execute("SELECT max(requests_per_s) FROM metric_window_rows WHERE dp_rank = 1").fetchone()[0]
    base = con.execute("SELECT median(requests_per_s) FROM metric_window_rows WHERE dp_rank = 0").fetchone()[0]
    con.close()
    assert peak > 1.3 * base


def test_exporter_restart_is_not_an_alert(sims, tmp_path):
    # the steady exporter outlives any load (13 collections of 0.5 s took over 20 s, its default
    # lifetime, when two suites ran at once): it is killed at the end either way
    p1 = sims.start("--engines", "0,1", "--seed", "1", duration=300)
    p2 = sims.start("--engines", "2,3", "--seed", "2")
    urls = [f"http://127.0.0.1:{p1}/metrics", f"http://127.0.0.1:{p2}/metrics"]
    source = ScrapeSource([(u, None) for u in urls], mx.Mapping(), timeout_s=2.0)
    w = Watcher(tmp_path / "w.duckdb", "live", source)
    steps = []
    for i in range(13):
        t = time.monotonic()
        if i == 4:  # restart between two scrapes: its counters start again from zero
            sims.stop(sims.procs[-1])
            sims.start("--engines", "2,3", "--seed", "3", port=p2)
        if i == 7:  # vanishes for two scrapes, then comes back
            sims.stop(sims.procs[-1])
        if i == 9:
            sims.start("--engines", "2,3", "--seed", "4", port=p2)
        steps.append(w.step())
        time.sleep(max(0.0, 0.5 - (time.monotonic() - t)))
    assert "FAIL" not in statuses(steps), [s.results["dp-metrics-imbalance"].summary for s in steps]
    assert [s.error for s in steps[7].statuses] == [None, "connection refused"]
    con = duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True)
    neg = con.execute(
        "SELECT count(*) FROM metric_window_rows WHERE requests_per_s < 0 "
        "OR prompt_tokens_per_s < 0 OR generation_tokens_per_s < 0"
    ).fetchone()[0]
    resets = con.execute("SELECT count(*) FROM metric_window_rows WHERE reset AND dp_rank IN (2, 3)").fetchone()[0]
    others_reset = con.execute("SELECT count(*) FROM metric_window_rows WHERE reset AND dp_rank IN (0, 1)").fetchone()[
        0
    ]
    peak_restarted, peak_steady = con.execute(
        "SELECT max(requests_per_s) FILTER (WHERE dp_rank IN (2, 3)), max(requests_per_s) FILTER (WHERE dp_rank IN (0, 1)) "
        "FROM metric_window_rows"
    ).fetchone()
    con.close()
    assert neg == 0
    assert resets >= 2 and others_reset == 0  # the restart is seen as a counter reset ...
    assert peak_restarted < 1.5 * peak_steady  # ... and never as a burst of requests
    assert {r["dp_rank"] for r in steps[-1].windows} == {0, 1, 2, 3, None}


class _Handler(http.server.BaseHTTPRequestHandler):
    mode = "garbage"

    def do_GET(self):
        if self.server.mode == "slow":  # held until the test releases it (or 30 s: a broken deadline)
            self.server.release.wait(30)
            self.server.answered_early = not self.server.released_by_test
        body = b"<html>oops</html>" if self.server.mode == "garbage" else b"# nothing\n"
        try:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, *a):
        pass


def _bad_server(mode: str):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.mode = mode
    srv.release, srv.released_by_test, srv.answered_early = threading.Event(), False, False
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_garbage_timeout_and_vanished_endpoints_do_not_stop_the_watch(sims, tmp_path):
    port = sims.start("--engines", "0,1")
    garbage, slow = _bad_server("garbage"), _bad_server("slow")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    try:
        urls = [
            f"http://127.0.0.1:{port}/metrics",
            f"http://127.0.0.1:{garbage.server_port}/metrics",
            f"http://127.0.0.1:{slow.server_port}/metrics",
            f"http://127.0.0.1:{dead}/metrics",
        ]
        steps = watch_steps(tmp_path / "w.duckdb", urls, steps=3, timeout_s=0.5, retention_s=3600)
        # a slow endpoint costs its timeout only: every collection ended while the slow server
        # still held its answer (event order, not a wall-clock bound)
        assert not slow.answered_early
    finally:
        for srv in (garbage, slow):
            srv.released_by_test = True
            srv.release.set()
            srv.shutdown()
            srv.server_close()
    errors = {s.target.split(":")[2].split("/")[0]: s.error for s in steps[-1].statuses}
    assert errors[str(port)] is None
    assert "no vLLM metric" in errors[str(garbage.server_port)]
    assert [s.error for st in steps for s in st.statuses if s.target.endswith(f":{slow.server_port}/metrics")] == [
        "timeout"
    ] * 3
    assert errors[str(dead)] == "connection refused"
    assert {r["dp_rank"] for r in steps[-1].windows} == {0, 1, None}
    con = duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True)
    n = con.execute("SELECT count(*) FROM metric_scrapes WHERE NOT ok").fetchone()[0]
    con.close()
    assert n == 9


def test_series_cap_bounds_a_huge_exposition():
    m = mx.Mapping()
    text = "".join(f'vllm:num_requests_running{{engine="{i}"}} 1\n' for i in range(5000))
    snap = mx.Snapshot(ts_ns=0)
    st = parse_scrape(text, snap, m, m.wanted(), "t", 0, None, max_series=1000)
    assert st.ok and st.samples == 1000 and st.dropped == 4000 and len(snap.values) == 1000


def test_retention_bounds_the_stored_windows(sims, tmp_path):
    port = sims.start("--engines", "0")
    steps = watch_steps(
        tmp_path / "w.duckdb", [f"http://127.0.0.1:{port}/metrics"], interval_s=0.3, steps=8, retention_s=1.0
    )
    assert sum(1 for s in steps if s.windows) >= 6
    con = duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True)
    kept = con.execute("SELECT count(DISTINCT ts_ns) FROM metric_window_rows").fetchone()[0]
    con.close()
    assert 1 <= kept <= 5


def test_hot_expert_top_list_names_concentrated_experts_and_rank(sims, tmp_path):
    port = sims.start("--engines", "0", "--hot-experts", "0:1:2,0:1:3,1:1:0", "--expert-ranks", "4")
    steps = watch_steps(tmp_path / "w.duckdb", [f"http://127.0.0.1:{port}/metrics"], steps=6)
    res = steps[-1].results["expert-hotspots"]
    assert res.status == "FAIL", res.summary
    flagged = {(r["layer"], r["expert"]) for r in res.rows if r["concentrated_hot_spot"]}
    assert flagged == {(0, 6), (0, 7), (1, 4)}  # rank 1 slots 2, 3 and 0 (4 slots a rank)
    assert {r["ep_rank"] for r in res.rows if r["concentrated_hot_spot"]} == {1}
    assert all(r["layer_hot_ranks"] == 1 for r in res.rows if r["concentrated_hot_spot"])


# --- the command line ------------------------------------------------------------------------
def test_cli_once_for_cron_with_exec_on_change(sims, tmp_path):
    port = sims.start("--hot-engine", "3")
    db, log = tmp_path / "cron.duckdb", tmp_path / "changes.txt"
    runner = CliRunner()
    codes, outs = [], []
    for _ in range(5):
        r = runner.invoke(
            app,
            [
                "watch",
                "--scrape",
                f"http://127.0.0.1:{port}/metrics",
                "--once",
                "--interval",
                "0.4s",
                "--db",
                str(db),
                "--run",
                "cron",
                "--exec",
                f'echo "$SLOWCARD_QUERY $SLOWCARD_BEFORE $SLOWCARD_STATUS" >> {log}',
            ],
        )
        codes.append(r.exit_code)
        outs.append(r.output)
    assert codes[-1] == 1 and codes[0] == 0, (codes, outs)
    assert any("ALERT dp-metrics-imbalance: PASS -> FAIL: DP 3" in o for o in outs), outs
    assert "dp-metrics-imbalance PASS FAIL" in log.read_text()
    con = duckdb.connect(str(db), read_only=True)
    windows = con.execute("SELECT count(DISTINCT ts_ns) FROM metric_windows WHERE run = 'cron'").fetchone()[0]
    con.close()
    assert windows >= 5  # each cron run adds its window(s)


class _Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.server.got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *a):
        pass


def test_webhook_gets_the_change_with_its_evidence(sims, tmp_path):
    port = sims.start("--hot-engine", "0")
    hook = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    hook.got = []
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    try:
        steps = watch_steps(
            tmp_path / "w.duckdb",
            [f"http://127.0.0.1:{port}/metrics"],
            steps=7,
            webhook=f"http://127.0.0.1:{hook.server_port}/alert",
        )
    finally:
        hook.shutdown()
        hook.server_close()
    assert "FAIL" in statuses(steps)
    changes = [g for g in hook.got if g["query"] == "dp-metrics-imbalance"]
    assert changes and changes[0]["before"] == "PASS" and changes[0]["status"] == "FAIL"
    assert changes[0]["rows"][0]["dp_rank"] == 0 and changes[0]["run"] == "live"
    assert any(a == "webhook HTTP 204" for s in steps for a in s.actions)


def test_cli_usage_errors_exit_2(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["watch", "--db", str(tmp_path / "x.duckdb")])
    assert r.exit_code == 2 and "--scrape URL" in r.output
    r = runner.invoke(app, ["watch", "--scrape", "http://127.0.0.1:1/metrics", "--interval", "soon"])
    assert r.exit_code == 2 and "--interval 'soon'" in r.output
    r = runner.invoke(app, ["watch", "--scrape", "http://127.0.0.1:1/metrics", "--metric", "latency=x"])
    assert r.exit_code == 2 and "unknown metric" in r.output
    r = runner.invoke(app, ["watch", "--prometheus", "http://127.0.0.1:1", "--dp-map", "node1:8000=first"])
    assert r.exit_code == 2 and "must be a number" in r.output


def test_scrape_url_dp_mapping():
    from slowcard.cli_watch import _pairs

    assert _pairs(["http://h:8000/metrics=3", "http://h:8001/metrics", "http://h/metrics?x=1"], "--scrape", True) == [
        ("http://h:8000/metrics", 3),
        ("http://h:8001/metrics", None),
        ("http://h/metrics?x=1", None),
    ]


def test_ctrl_c_leaves_whole_windows(sims, tmp_path):
    port = sims.start("--engines", "0,1,2")
    db = tmp_path / "int.duckdb"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slowcard",
            "watch",
            "--scrape",
            f"http://127.0.0.1:{port}/metrics",
            "--interval",
            "0.2s",
            "--duration",
            "300s",  # ended by the Ctrl-C below, after its 6th interval however long that takes
            "--db",
            str(db),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = 0
        while lines < 6:  # interrupt mid-watch, after a few windows (event order: no wall-clock bound)
            line = proc.stdout.readline()
            if not line:
                break  # the watch ended on its own: the asserts below say how
            if line[:1].isdigit():  # an interval's first line (its DP lines follow)
                lines += 1
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode in (0, 1), err
    assert "interrupted" in err
    con = store.open_db(db)  # write-open: nothing pending to clean, every window whole
    try:
        per_ts = con.execute("SELECT ts_ns, count(*) FROM metric_window_rows GROUP BY ts_ns").fetchall()
        assert len(per_ts) >= 4 and {n for _, n in per_ts} == {4}  # 3 domains + the instance row
        assert con.execute("SELECT count(*) FROM pending_sources").fetchone()[0] == 0
        kept = con.execute("SELECT rows_kept FROM sources WHERE format = 'metrics_scrape'").fetchone()[0]
        assert kept == 4 * len(per_ts)
    finally:
        con.close()


# --- a real Prometheus server ----------------------------------------------------------------
@pytest.mark.skipif(PROMETHEUS is None, reason=NO_PROMETHEUS)
def test_prometheus_backfill_then_follow_flags_the_hot_domain(sims, tmp_path):
    port = sims.start("--hot-engine", "1", "--hot-from", "0", duration=40)
    prom = Prometheus(tmp_path, [f"127.0.0.1:{port}"])
    try:
        deadline = time.monotonic() + 25  # until the server holds 6 scrapes of 1 s
        while prom.scrapes() < 6 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert prom.scrapes() >= 6, "the Prometheus server did not scrape the exporter"
        source = PrometheusSource(prom.url, mx.Mapping(), step_s=1.0, backfill_s=60)
        w = Watcher(tmp_path / "p.duckdb", "prom", source)
        first = w.step()  # backfill
        assert len({r["ts_ns"] for r in first.windows}) >= 3, [s.error for s in first.statuses]
        assert first.results["dp-metrics-imbalance"].status == "FAIL", first.results["dp-metrics-imbalance"].summary
        assert [r["dp_rank"] for r in first.results["dp-metrics-imbalance"].rows] == [1]
        time.sleep(2.5)
        second = w.step()  # follow: only the new steps
        assert second.windows and min(r["ts_ns"] for r in second.windows) > max(r["ts_ns"] for r in first.windows)
        con = duckdb.connect(str(tmp_path / "p.duckdb"), read_only=True)
        dup = con.execute(
            "SELECT count(*) FROM (SELECT ts_ns, dp_rank FROM metric_window_rows GROUP BY ALL HAVING count(*) > 1)"
        ).fetchone()[0]
        con.close()
        assert dup == 0
    finally:
        prom.close()


def test_a_ctrl_c_inside_a_duckdb_statement_ends_the_watch_as_a_ctrl_c():
    """A SIGINT that lands while a collection's COMMIT runs reaches Python as DuckDB's
    RuntimeError("Query interrupted"): the loop raises it as the KeyboardInterrupt it was (the
    watch then stops its captures and sums them up); any other error is left as it is."""
    from slowcard.watch import Watcher

    class Interrupted:
        def step(self):
            raise RuntimeError("Query interrupted")

    with pytest.raises(KeyboardInterrupt):
        Watcher.run_loop(Interrupted(), 0.01, duration_s=1)

    class Broken:
        def step(self):
            raise RuntimeError("something else")

    with pytest.raises(RuntimeError, match="something else"):
        Watcher.run_loop(Broken(), 0.01, duration_s=1)
