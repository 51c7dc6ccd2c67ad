"""Capture on alert (slowcard/capture.py, `watch --capture`, `slowcard capture`): the whole loop
alert -> capture -> ingest -> verdict on loopback, for each backend, and every failure path.

The vLLM side is tests/vllm_sim.py with ``--profile-dir``: it serves /start_profile and
/stop_profile and, at the stop, writes one Kineto trace per DP engine (tests/synth_kineto.py,
``token_skew`` on the engine that was hot during the capture), so the hot DP domain of the
metrics is also the slow rank of the trace: ep-slow-rank names rank 2, cause token-skew (one EP
rank per DP engine). The msServiceProfiler side is tests/msprof_sim.py: a thread polling the
JSON config as the service does, writing the collection (dp_script's service CSVs: dp-imbalance
names DP domain 2, request-skew) when ``enable`` goes back to 0.

Every process started here stops by itself (--duration) and is killed in a finally.
"""

from __future__ import annotations

import http.server
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slowcard import metrics as mx
from slowcard import queries, store
from slowcard.capture import (
    Alert,
    CaptureError,
    Capturer,
    ExecBackend,
    MsServiceProfilerBackend,
    VllmBackend,
    incomplete,
    wait_for_files,
)
from slowcard.watch import ScrapeSource, Watcher, parse_scrape

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))

import msprof_sim  # noqa: E402
from sim_procs import Sims  # noqa: E402
from synth_kineto import cut_trace, write_ep_run  # noqa: E402


@pytest.fixture
def sims():
    s = Sims(duration=30.0)
    try:
        yield s
    finally:
        s.close()


def vllm_capturer(tmp_path, port, **kw) -> Capturer:
    kw.setdefault("seconds", 0.5)
    kw.setdefault("wait_s", 10.0)
    kw.setdefault("settle_s", 0.4)
    return Capturer(
        tmp_path / "cap.duckdb",
        VllmBackend(f"http://127.0.0.1:{port}/metrics", tmp_path / "prof"),
        n_domains=lambda: 4,
        **kw,
    )


def rows(db, sql, params=None):
    con = store.open_db(db)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


# --- file completion ---------------------------------------------------------------------
def test_incomplete_tells_cut_files_from_whole_ones(tmp_path):
    whole = write_ep_run(tmp_path / "t", ranks=2)[0]
    assert incomplete(whole) is None
    cut = write_ep_run(tmp_path / "c", ranks=2)[0]
    cut_trace(cut, 4000)
    assert incomplete(cut) == "its gzip stream is cut short"
    j = tmp_path / "a.pt.trace.json"
    j.write_text('{"traceEvents": [{"ph": "X"}')
    assert incomplete(j) == "it is not a whole JSON document"
    j.write_text('{"traceEvents": []}\n')
    assert incomplete(j) is None
    c = tmp_path / "request.csv"
    c.write_text("a,b\n1,2")
    assert incomplete(c) == "its last CSV line is cut"
    c.write_text("a,b\n1,2\n")
    assert incomplete(c) is None


def test_wait_for_files_waits_for_a_growing_file_and_times_out_on_none(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    stop = threading.Event()
    with pytest.raises(CaptureError, match=r"no new file in .* within 0.5 s"):
        wait_for_files(folder, {}, 0.5, stop, settle_s=0.2, poll_s=0.05)
    f = folder / "x.json"

    def grow():
        f.write_text('{"a": [1,')
        time.sleep(0.6)
        f.write_text('{"a": [1, 2]}')

    t = threading.Thread(target=grow)
    t.start()
    got = wait_for_files(folder, {}, 5.0, stop, settle_s=0.3, poll_s=0.05)
    t.join()
    assert list(got) == [f] and got[f] == len('{"a": [1, 2]}')  # waited for the whole file


# --- vLLM backend: the loop and its failures --------------------------------------------
def test_vllm_capture_names_the_alerted_domain(sims, tmp_path):
    port = sims.start("--hot-engine", "2", "--hot-from", "0", "--profile-dir", str(tmp_path / "prof"))
    cap = vllm_capturer(tmp_path, port).run(Alert.on_demand(dp_rank=2))
    assert cap.status == "ok", cap.reason
    assert (cap.files, cap.run) == (4, "capture-1")
    assert (cap.slow_card, cap.cause, cap.verdict_status) == ("rank 2", "token-skew", "FAIL")
    assert cap.verdict_query.startswith("ep-slow-rank@")
    assert cap.matches_alert is True
    got = rows(
        tmp_path / "cap.duckdb",
        "SELECT status, subject, run, slow_card, cause, matches_alert, files, backend FROM captures",
    )
    assert got == [("ok", "DP domain 2", "capture-1", "rank 2", "token-skew", True, 4, "vllm")]
    assert rows(tmp_path / "cap.duckdb", "SELECT count(*) FROM sources WHERE run = 'capture-1'")[0][0] == 4


def test_vllm_capture_while_nothing_is_hot_names_no_card(sims, tmp_path):
    # near miss: the hot engine turns hot only long after the capture: a balanced trace
    port = sims.start("--hot-engine", "2", "--hot-from", "1000", "--profile-dir", str(tmp_path / "prof"))
    cap = vllm_capturer(tmp_path, port).run(Alert.on_demand(dp_rank=2))
    assert cap.status == "ok", cap.reason
    assert cap.slow_card is None and cap.verdict_status != "FAIL"
    assert cap.matches_alert is None


@pytest.mark.parametrize("code", [404, 500])
def test_vllm_endpoint_error_is_recorded(sims, tmp_path, code):
    port = sims.start("--profile-dir", str(tmp_path / "prof"), "--profile-status", str(code))
    cap = vllm_capturer(tmp_path, port).run(Alert.on_demand(dp_rank=1))
    assert cap.status == "failed"
    assert f"/start_profile: HTTP {code}" in cap.reason
    assert ("--profiler-config" in cap.reason) == (code == 404)  # the hint only for a missing endpoint
    assert rows(tmp_path / "cap.duckdb", "SELECT status, reason FROM captures") == [("failed", cap.reason)]


def test_vllm_unreachable_server_is_recorded(tmp_path):
    with socket_port() as port:  # nothing listens there
        pass
    cap = vllm_capturer(tmp_path, port).run(Alert.on_demand())
    assert cap.status == "failed" and "connection refused" in cap.reason


def test_files_that_never_appear_time_out(sims, tmp_path):
    port = sims.start("--profile-dir", str(tmp_path / "prof"), "--profile-write", "never")
    cap = vllm_capturer(tmp_path, port, wait_s=1.0).run(Alert.on_demand())
    assert cap.status == "timeout"
    assert "no new file in" in cap.reason and "within 1 s after the stop" in cap.reason
    assert rows(tmp_path / "cap.duckdb", "SELECT count(*) FROM sources")[0][0] == 0


def test_half_written_file_times_out_naming_it(sims, tmp_path):
    port = sims.start("--profile-dir", str(tmp_path / "prof"), "--profile-write", "half")
    cap = vllm_capturer(tmp_path, port, wait_s=2.0).run(Alert.on_demand())
    assert cap.status == "timeout"
    assert "dp0_rank0." in cap.reason and "still incomplete" in cap.reason and "gzip stream is cut short" in cap.reason
    assert rows(tmp_path / "cap.duckdb", "SELECT count(*) FROM sources")[0][0] == 0  # nothing half-ingested


def test_slow_writer_is_waited_for(sims, tmp_path):
    # each file first half-written, completed 1.5 s later: the capture waits, then ingests it whole
    port = sims.start("--hot-engine", "1", "--profile-dir", str(tmp_path / "prof"), "--profile-write", "slow")
    cap = vllm_capturer(tmp_path, port).run(Alert.on_demand(dp_rank=1))
    assert cap.status == "ok", cap.reason
    assert cap.slow_card == "rank 1" and cap.matches_alert is True


def test_size_cap_keeps_a_large_capture_out(sims, tmp_path):
    port = sims.start("--profile-dir", str(tmp_path / "prof"))
    cap = vllm_capturer(tmp_path, port, max_bytes=10_000).run(Alert.on_demand())
    assert cap.status == "too-large" and "over the cap of 0.01 MB" in cap.reason
    assert cap.files == 4 and cap.size_bytes > 10_000
    assert rows(tmp_path / "cap.duckdb", "SELECT count(*) FROM sources")[0][0] == 0


def test_one_at_a_time_then_cool_down(sims, tmp_path):
    port = sims.start("--profile-dir", str(tmp_path / "prof"))
    c = vllm_capturer(tmp_path, port, seconds=1.0, cooldown_s=60.0)
    first = Alert("dp-metrics-imbalance", "DP domain 0", "request-skew", "s", time.time_ns(), "live", 0)
    assert c.trigger(first).startswith("started (vllm, 1 s) for dp-metrics-imbalance: DP domain 0")
    assert "another capture is running" in c.trigger(first)
    c.wait(30)
    done = c.finished()
    assert [d.status for d in done] == ["ok"] and c.finished() == []
    assert "cool-down" in c.trigger(first)


def test_capture_during_shutdown_is_interrupted_and_stops_the_profiler(sims, tmp_path):
    port = sims.start("--profile-dir", str(tmp_path / "prof"))
    c = vllm_capturer(tmp_path, port, seconds=30.0)
    assert c.trigger(Alert.on_demand()).startswith("started")
    deadline = time.monotonic() + 10
    while c.phase != "profiling" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert c.phase == "profiling"
    t = time.monotonic()
    c.shutdown()
    assert time.monotonic() - t < 10  # not the 30 s window
    (cap,) = c.finished()
    assert cap.status == "interrupted" and "Ctrl-C, SIGTERM or the watch ending" in cap.reason
    assert rows(tmp_path / "cap.duckdb", "SELECT status FROM captures") == [("interrupted",)]
    assert c.trigger(Alert.on_demand()) == "not started: the watch is ending"
    # the profiler was stopped: it wrote its files after the stop (the sim writes at /stop_profile)
    deadline = time.monotonic() + 5
    while not list((tmp_path / "prof").glob("*.gz")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(list((tmp_path / "prof").glob("*.gz"))) == 4


# --- msServiceProfiler and exec backends --------------------------------------------------
def test_msserviceprofiler_without_parse_exe(tmp_path):
    cfg = msprof_sim.write_config(tmp_path / "ms_service_profiler_config.json", prof_dir="prof")
    poller = msprof_sim.FakeServiceProfiler(cfg, hot_dp=2)
    poller.start()
    try:
        backend = MsServiceProfilerBackend(cfg, parse_exe=None)
        assert backend.output_dir() == tmp_path / "prof"  # relative to the config's folder
        c = Capturer(tmp_path / "ms.duckdb", backend, seconds=0.5, wait_s=10.0, settle_s=0.3)
        cap = c.run(Alert.on_demand(dp_rank=2))
    finally:
        poller.close()
    assert cap.status == "ok", cap.reason
    assert (cap.slow_card, cap.cause, cap.verdict_status) == ("DP domain 2", "request-skew", "FAIL")
    assert cap.matches_alert is True
    assert any("msserviceprofiler is not on PATH" in n for n in cap.notes)
    doc = json.loads(cfg.read_text())
    assert doc["enable"] == 0 and doc["acl_task_time"] == 0  # switched back, other keys kept
    assert len(poller.collections) == 1


def capture_with_parse_exe(tmp_path, exe):
    """One on-demand msServiceProfiler capture (DP 1 hot) whose parse step is ``exe``."""
    cfg = msprof_sim.write_config(tmp_path / "cfg.json", prof_dir=str(tmp_path / "abs_prof"))
    poller = msprof_sim.FakeServiceProfiler(cfg, hot_dp=1)
    poller.start()
    try:
        backend = MsServiceProfilerBackend(cfg, parse_exe=str(exe))
        cap = Capturer(tmp_path / "ms.duckdb", backend, seconds=0.3, wait_s=10.0, settle_s=0.3).run(Alert.on_demand())
    finally:
        poller.close()
    return cap, poller


def test_msserviceprofiler_runs_its_parse_step(tmp_path):
    exe = msprof_sim.write_parse_exe(tmp_path)
    cap, poller = capture_with_parse_exe(tmp_path, exe)
    assert cap.status == "ok", cap.reason
    assert cap.slow_card == "DP domain 1" and cap.matches_alert is None  # no alerted domain given
    (coll,) = poller.collections
    assert (coll / "parse_args.txt").read_text() == (
        f"parse --input-path={coll} --output-path={coll}/slowcard_parsed/capture-1"
    )
    paths = [p for (p,) in rows(tmp_path / "ms.duckdb", "SELECT path FROM sources WHERE run = ?", [cap.run])]
    assert paths and all("/slowcard_parsed/" in p for p in paths)  # the parsed output was ingested


def test_msserviceprofiler_parse_step_that_fails(tmp_path):
    """msserviceprofiler's parse exits non-zero: the capture fails saying which step and why, and
    nothing is ingested (a collection ingested unparsed would be judged without request.csv)."""
    exe = tmp_path / "msserviceprofiler"
    exe.write_text("#!/bin/sh\necho 'no msprof data in input path' >&2\nexit 4\n")
    exe.chmod(0o755)
    cap, poller = capture_with_parse_exe(tmp_path, exe)
    assert cap.status == "failed"
    assert cap.reason.startswith("msserviceprofiler parse exited 4: ")
    assert cap.reason.endswith("no msprof data in input path")
    assert rows(tmp_path / "ms.duckdb", "SELECT count(*) FROM sources")[0][0] == 0


def test_msserviceprofiler_config_problems(tmp_path):
    with pytest.raises(CaptureError, match="no such file"):
        MsServiceProfilerBackend(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(CaptureError, match="expected a JSON object"):
        MsServiceProfilerBackend(bad)
    cfg = msprof_sim.write_config(tmp_path / "c.json", prof_dir=None)
    assert MsServiceProfilerBackend(cfg, parse_exe=None).output_dir() == Path.home() / ".ms_server_profiler"


def test_msserviceprofiler_collection_never_written(tmp_path):
    cfg = msprof_sim.write_config(tmp_path / "cfg.json")
    poller = msprof_sim.FakeServiceProfiler(cfg, write="never")
    poller.start()
    try:
        cap = Capturer(
            tmp_path / "ms.duckdb", MsServiceProfilerBackend(cfg, parse_exe=None), seconds=0.2, wait_s=0.8
        ).run(Alert.on_demand())
    finally:
        poller.close()
    assert cap.status == "timeout" and "no new file" in cap.reason


def test_exec_backend(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    writer = (
        f"{sys.executable} -c \"import sys; sys.path.insert(0, '{TESTS}'); from synth_kineto import write_ep_run; "
        f"write_ep_run('{out}', scenario='token_skew', slow_rank=3)\""
    )
    backend = ExecBackend(f"echo started > {tmp_path}/started", writer, out)
    cap = Capturer(tmp_path / "x.duckdb", backend, seconds=0.2, wait_s=10.0, settle_s=0.3).run(Alert.on_demand())
    assert cap.status == "ok", cap.reason
    assert (tmp_path / "started").exists() and cap.slow_card == "rank 3"
    failing = ExecBackend("echo no profiler >&2; exit 3", "true", out)
    cap = Capturer(tmp_path / "x.duckdb", failing, seconds=0.2).run(Alert.on_demand())
    assert cap.status == "failed" and cap.reason.startswith(
        "start command exited 3: echo no profiler >&2; exit 3: no profiler; the start may have taken effect: "
        "the profiler was stopped again"
    )


# --- the watcher and a capture share the database -----------------------------------------
def test_watcher_holds_its_windows_while_a_capture_holds_the_database(sims, tmp_path):
    port = sims.start("--engines", "0,1")
    lock = threading.Lock()
    w = Watcher(
        tmp_path / "w.duckdb",
        "live",
        ScrapeSource([(f"http://127.0.0.1:{port}/metrics", None)], mx.Mapping(), timeout_s=2.0),
        db_lock=lock,
        busy_wait_s=0.2,
    )
    w.step()
    time.sleep(0.3)
    with lock:  # a capture is ingesting
        held = w.step()
    assert held.busy and held.held_windows == 1 and not held.results
    time.sleep(0.3)
    after = w.step()
    assert after.busy is None and "dp-metrics-imbalance" in after.results
    assert rows(tmp_path / "w.duckdb", "SELECT count(DISTINCT ts_ns) FROM metric_window_rows")[0][0] == 2


# --- metric names beyond upstream vLLM -----------------------------------------------------
MINDIE_SCRAPE = """# TYPE request_success_total counter
request_success_total{{model_name="m"}} {req}
# TYPE num_requests_waiting gauge
num_requests_waiting{{model_name="m"}} {wait}
# TYPE npu_cache_usage_perc gauge
npu_cache_usage_perc{{model_name="m"}} 0.5
# TYPE time_to_first_token_seconds histogram
time_to_first_token_seconds_bucket{{model_name="m",le="0.1"}} {req}
time_to_first_token_seconds_bucket{{model_name="m",le="+Inf"}} {req}
time_to_first_token_seconds_count{{model_name="m"}} {req}
time_to_first_token_seconds_sum{{model_name="m"}} 1
"""


def test_mindie_names_one_endpoint_per_dp_domain():
    m = mx.Mapping.for_exporter("mindie")
    wanted = m.wanted()
    a, b = mx.Snapshot(ts_ns=0), mx.Snapshot(ts_ns=1_000_000_000)
    for snap, reqs in ((a, (10, 10)), (b, (30, 14))):
        for pos, req in enumerate(reqs):  # each DP instance serves its own /metrics: the position is the domain
            st = parse_scrape(MINDIE_SCRAPE.format(req=req, wait=pos), snap, m, wanted, f"u{pos}", pos, None)
            assert st.ok and st.samples == 7  # 4 series, the histogram's 2 buckets, count and sum
    got = {r["dp_rank"]: r for r in mx.window_rows(a, b, m)}
    assert got[0]["requests_per_s"] == 20.0 and got[1]["requests_per_s"] == 4.0
    assert got[1]["waiting"] == 1.0 and got[0]["kv_usage"] == 0.5
    # the vLLM names do not read a MindIE answer (no silent mix of the two)
    st = parse_scrape(
        MINDIE_SCRAPE.format(req=1, wait=0), mx.Snapshot(ts_ns=0), mx.Mapping(), mx.Mapping().wanted(), "u", 0, None
    )
    assert not st.ok and st.error == "no vLLM metric in the answer"
    assert mx.Mapping.for_exporter("vllm-ascend").metrics == mx.Mapping().metrics
    with pytest.raises(ValueError, match="unknown exporter 'tgi'"):
        mx.Mapping.for_exporter("tgi")


# --- the CLI ---------------------------------------------------------------------------------
def cli(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slowcard", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, **kw
    )


class Hook(http.server.BaseHTTPRequestHandler):
    got: list = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        Hook.got.append(json.loads(self.rfile.read(n)))
        self.send_response(204)
        self.end_headers()


class socket_port:
    def __enter__(self):
        import socket

        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        return self.s.getsockname()[1]

    def __exit__(self, *a):
        self.s.close()


def test_watch_capture_end_to_end_with_webhook_and_report(sims, tmp_path):
    prof = tmp_path / "prof"
    port = sims.start("--hot-engine", "2", "--hot-from", "1.5", "--profile-dir", str(prof), duration=30)
    Hook.got = []
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    db = tmp_path / "live.duckdb"
    try:
        # a watch that ends (--duration) while its capture runs waits for the capture
        p = cli(
            "watch", "--scrape", f"http://127.0.0.1:{port}/metrics", "--interval", "0.5s", "--duration", "5s",
            "--db", str(db), "--run", "live", "--capture", "vllm", "--capture-dir", str(prof),
            "--capture-seconds", "1s", "--webhook", f"http://127.0.0.1:{hook.server_port}/hook",
        )  # fmt: skip
    finally:
        hook.shutdown()
        hook.server_close()
    out = p.stdout
    assert p.returncode == 1, p.stderr
    alert = out.index("ALERT dp-metrics-imbalance: PASS -> FAIL: DP 2:")
    started = out.index("CAPTURE started (vllm, 1 s) for dp-metrics-imbalance: DP domain 2")
    done = out.index("CAPTURE 1 for dp-metrics-imbalance (DP domain 2: ")
    assert alert < started < done
    tail = " ".join(out[done:].split())
    assert "ok, vllm" in tail and "-> run capture-1" in tail
    ep = queries.load_catalog()["ep-slow-rank"]
    assert f"verdict FAIL ep-slow-rank@v{ep.version}: Slow card: rank 2 — token-skew" in tail
    assert "the alerted DP domain 2" in tail
    events = [g for g in Hook.got if g.get("event") == "capture"]
    assert len(events) == 1 and events[0]["capture"]["verdict"]["slow_card"] == "rank 2"
    assert events[0]["capture"]["alert"]["subject"] == "DP domain 2" and events[0]["run"] == "live"
    assert any(g.get("query") == "dp-metrics-imbalance" and g.get("status") == "FAIL" for g in Hook.got)
    pytest.importorskip("plotly")
    r = cli("report", "--db", str(db), "--run", "live", "--out", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "r.html").read_text()
    sec = page[page.index("<h2>Captures on alert</h2>") :]
    assert "dp-metrics-imbalance: DP domain 2" in sec and "capture-1" in sec and "the alerted domain" in sec
    from slowcard.renderers.html import figure_data

    (timeline,) = [f for f in figure_data(page) if f["query"].startswith("metric-timeline")]
    greens = [s for s in timeline["layout"]["shapes"] if s.get("fillcolor") == "#2ca02c"]
    assert greens and all(0.9 < s["x1"] - s["x0"] < 1.5 for s in greens)  # the 1 s capture window
    # the capture's own run links back to its alert
    r = cli("report", "--db", str(db), "--run", "capture-1", "--out", str(tmp_path / "c.html"))
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "c.html").read_text()
    assert "dp-metrics-imbalance: DP domain 2" in page[page.index("<h2>Captures on alert</h2>") :]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_watch_ctrl_c_during_a_capture(sims, tmp_path, sig):
    """Ctrl-C (or SIGTERM: systemctl / docker stop) while the capture's profiler is on: the
    profiler is stopped, the capture recorded `interrupted`, the watch exits with its verdicts'
    code. The profiler is tests/profiler_stub.py: the signal is sent once it has seen the start
    (event ordering: no sleep, no wall-clock bound; this test failed under load before)."""
    from profiler_stub import ProfilerStub

    prof = tmp_path / "prof"
    prof.mkdir()
    port = sims.start("--hot-engine", "1", "--hot-from", "1", duration=120)
    db = tmp_path / "live.duckdb"
    with ProfilerStub(prof) as stub:
        proc = subprocess.Popen(
            [sys.executable, "-m", "slowcard", "watch", "--scrape", f"http://127.0.0.1:{port}/metrics",
             "--interval", "0.5s", "--duration", "1h", "--db", str(db), "--capture", "vllm",
             "--capture-url", stub.base, "--capture-dir", str(prof), "--capture-seconds", "1h"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert stub.wait_for("start")
            proc.send_signal(getattr(signal, sig))
            out, err = proc.communicate(timeout=120)  # the 1 h window and watch end by the signal
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)  # reaps it and closes its pipes (left open, another test fails on them)
        assert stub.events == ["start", "stop"] and stub.on is False
    assert proc.returncode in (0, 1), err
    out = " ".join(out.split())
    assert "CAPTURE started (vllm, 3600 s) for dp-metrics-imbalance: DP domain 1" in out
    assert "CAPTURE 1 for dp-metrics-imbalance (DP domain 1" in out, err
    assert "interrupted: stopped" in out and "the profiler was stopped" in out, err
    assert "interrupted: stopping the running capture's profiler" in err and "Traceback" not in err
    assert rows(db, "SELECT status FROM captures") == [("interrupted",)]


def test_capture_command_exit_codes(sims, tmp_path):
    prof = tmp_path / "prof"
    port = sims.start("--hot-engine", "2", "--profile-dir", str(prof))
    base = ["--url", f"http://127.0.0.1:{port}", "--capture-dir", str(prof), "--capture-seconds", "0.5s"]
    ok = cli("capture", "vllm", *base, "--dp", "2", "--db", str(tmp_path / "a.duckdb"), "--format", "json")
    assert ok.returncode == 1, ok.stderr  # the capture's diagnosis FAILs: the slow card
    doc = json.loads(ok.stdout)
    assert (
        doc["status"] == "ok" and doc["verdict"]["slow_card"] == "rank 2" and doc["alert"]["subject"] == "DP domain 2"
    )
    bad_port = sims.start("--profile-dir", str(prof), "--profile-status", "404")
    failed = cli("capture", "vllm", "--url", f"http://127.0.0.1:{bad_port}", "--capture-dir", str(prof),
                 "--db", str(tmp_path / "b.duckdb"))  # fmt: skip
    flat = " ".join(failed.stdout.split())
    assert failed.returncode == 3 and "CAPTURE 1 for on-demand: failed: POST" in flat and "HTTP 404" in flat
    usage = cli("capture", "vllm", "--url", f"http://127.0.0.1:{port}", "--db", str(tmp_path / "c.duckdb"))
    assert usage.returncode == 2 and "needs --capture-dir" in usage.stderr
    assert cli("capture", "nsys", "--db", str(tmp_path / "c.duckdb")).returncode == 2
    w = cli("watch", "--scrape", "http://127.0.0.1:1/metrics", "--exporter", "tgi", "--db", str(tmp_path / "d.duckdb"))
    assert w.returncode == 2 and "unknown exporter 'tgi'" in w.stderr


def test_capture_command_msserviceprofiler(tmp_path):
    cfg = msprof_sim.write_config(tmp_path / "cfg.json", prof_dir="prof")
    poller = msprof_sim.FakeServiceProfiler(cfg, hot_dp=3)
    poller.start()
    try:
        p = cli(
            "capture", "msserviceprofiler", "--dp", "3", "--capture-seconds", "0.5s", "--db", str(tmp_path / "m.duckdb"),
            env={**__import__("os").environ, "SERVICE_PROF_CONFIG_PATH": str(cfg), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
    finally:
        poller.close()
    assert p.returncode == 1, p.stderr  # dp-imbalance FAILs on DP domain 3
    flat = " ".join(p.stdout.split())
    assert "CAPTURE 1 for on-demand (DP domain 3): ok, msserviceprofiler" in flat
    assert "verdict FAIL dp-imbalance@" in flat and "DP domain 3 — request-skew" in flat
    assert "; the alerted DP domain 3" in flat
    assert "note: msserviceprofiler is not on PATH: its parse step was not run" in flat


def test_watch_capture_usage_errors(tmp_path):
    base = ["watch", "--scrape", "http://127.0.0.1:1/metrics", "--once", "--db", str(tmp_path / "u.duckdb")]
    p = cli(*base, "--capture", "nsys")
    assert p.returncode == 2 and "--capture 'nsys': expected one of vllm, msserviceprofiler, exec" in p.stderr
    p = cli(*base, "--capture", "vllm")
    assert p.returncode == 2 and "needs --capture-dir" in p.stderr
    p = cli(*base, "--capture", "exec", "--capture-dir", str(tmp_path))
    assert p.returncode == 2 and "--capture-start CMD, --capture-stop CMD" in p.stderr
    p = cli(*base, "--capture", "vllm", "--capture-dir", str(tmp_path), "--capture-seconds", "0s")
    assert p.returncode == 2 and "--capture-seconds '0s'" in p.stderr


def test_exec_stop_failure_says_the_profiler_may_still_run(tmp_path):
    backend = ExecBackend("true", "exit 1", tmp_path)
    cap = Capturer(tmp_path / "x.duckdb", backend, seconds=0.1).run(Alert.on_demand())
    assert cap.status == "failed" and cap.reason.startswith("stop command exited 1")
    assert "the profiler may still be running" in cap.reason


# the Ctrl-C / SIGTERM / SIGHUP test of `slowcard capture` is in test_capture_safety.py


def test_wait_for_files_ends_when_stopped(tmp_path):
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t = time.monotonic()
    with pytest.raises(CaptureError, match=r"stopped while waiting for the files in .*nothing was ingested"):
        wait_for_files(tmp_path, {}, 30.0, stop, settle_s=0.2, poll_s=0.05)
    assert time.monotonic() - t < 5
