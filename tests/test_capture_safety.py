"""Capture safety (issue 46 findings 2-4 and 7-12, issue 48's capture items): a capture is a
transaction with the service's profiler, edits msServiceProfiler's config in place, takes only
regular files inside the profile folder and judges them with bounded reads.

The profiler endpoint is tests/profiler_stub.py on 127.0.0.1 (it records the start and stop
requests in order); the exec backend runs shell commands; time is a fake clock wherever a
boundary depends on it (settle time, cool-down). No assertion depends on the machine's speed:
each waits for an event (the start arrived), and the timeouts given only keep a broken build
from hanging the suite.
"""

from __future__ import annotations

import gzip
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from slowcard import store
from slowcard.capture import (
    FULL_PARSE_BYTES,
    Alert,
    Capture,
    Capturer,
    ExecBackend,
    MsServiceProfilerBackend,
    VllmBackend,
    check_file,
    incomplete,
    match_alert,
    scan,
    wait_for_files,
)
from slowcard.cli_watch import capture_lines

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
TRACES = ROOT / "testdata" / "ep4_token_skew"  # 4 rank .json.gz, ~25 KB each, ~0.41 MB of JSON each
sys.path.insert(0, str(TESTS))

import msprof_sim  # noqa: E402
from profiler_stub import ProfilerStub  # noqa: E402


def rows(db, sql, params=None):
    con = store.open_db(db)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def traces() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(TRACES.glob("*.json.gz"))}


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


# --- finding 3: a start that may have taken effect is always followed by a stop -----------------
def test_start_that_times_out_after_turning_the_profiler_on_is_stopped(tmp_path):
    """/start_profile turns the profiler on and answers after the request timeout: the capture
    fails, and a stop follows (before: `failed`, no stop, the profiler left on)."""
    with ProfilerStub(mode="hang_start") as stub:
        backend = VllmBackend(stub.base, tmp_path / "prof", timeout_s=0.5)
        cap = Capturer(tmp_path / "c.duckdb", backend, seconds=0.1).run(Alert.on_demand())
        assert stub.wait_for("stop")
        assert stub.events == ["start", "stop"] and stub.on is False
    assert cap.status == "failed"
    assert "/start_profile: timeout" in cap.reason
    assert "the start may have taken effect: the profiler was stopped again" in cap.reason
    assert rows(tmp_path / "c.duckdb", "SELECT status FROM captures") == [("failed",)]


@pytest.mark.parametrize(("code", "stopped"), [(500, True), (404, False)])
def test_start_error_answer_and_the_stop_after_it(tmp_path, code, stopped):
    """A 500 may come after the profiler turned on: a stop follows and, failing too, the reason
    says the profiler may still be on. A 404 (no such endpoint) never turned anything on."""
    with ProfilerStub(mode=f"status_{code}") as stub:
        cap = Capturer(tmp_path / "c.duckdb", VllmBackend(stub.base, tmp_path), seconds=0.1).run(Alert.on_demand())
        assert stub.events == (["start", "stop"] if stopped else ["start"])
    assert cap.status == "failed" and f"/start_profile: HTTP {code}" in cap.reason
    assert ("the profiler may still be on: stop it by hand" in cap.reason) == stopped


def test_exec_start_that_fails_still_runs_the_stop(tmp_path):
    backend = ExecBackend(f"touch {tmp_path}/started; exit 5", f"touch {tmp_path}/stopped", tmp_path)
    cap = Capturer(tmp_path / "x.duckdb", backend, seconds=0.1).run(Alert.on_demand())
    assert cap.status == "failed" and cap.reason.startswith("start command exited 5")
    assert (tmp_path / "stopped").exists()  # before: never run
    assert "the profiler was stopped again" in cap.reason


# --- finding 4: child commands never hold slowcard on inherited pipes -------------------------
def test_exec_start_that_backgrounds_the_profiler(tmp_path):
    """The start command leaves a process in the background that keeps its stdout and stderr
    open (a profiler daemon): the capture goes on at once and its stop command ends it (before:
    blocked on the pipe until the command timeout, "start command killed", stop never run)."""
    out = tmp_path / "out"
    out.mkdir()
    state = tmp_path / "state"
    start = f'echo on > {state}; ( while [ "$(cat {state})" = on ]; do sleep 0.1; done; echo gone > {state}.bg ) &'
    stop = f'echo off > {state}; cp {TRACES}/*.json.gz "$SLOWCARD_CAPTURE_DIR"/'
    backend = ExecBackend(start, stop, out, timeout_s=30)
    cap = Capturer(tmp_path / "x.duckdb", backend, seconds=0.2, wait_s=60, settle_s=0.3).run(Alert.on_demand())
    assert cap.status == "ok", cap.reason
    assert state.read_text().strip() == "off" and cap.files == 4


# --- finding 2: SIGTERM / SIGHUP / Ctrl-C stop the profiler ------------------------------------
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_capture_command_signal_stops_the_profiler(tmp_path, sig):
    """A signal while the profiler is on (systemctl / docker stop, `timeout`, a closed
    terminal, Ctrl-C): the stop is sent, the row says `interrupted`, exit 3 (before, SIGTERM:
    exit 143, no stop, the row `running` forever). The signal is sent once the stub has seen
    the start: no sleep decides the order."""
    prof = tmp_path / "prof"
    prof.mkdir()
    db = tmp_path / "c.duckdb"
    with ProfilerStub(prof, traces()) as stub:
        proc = subprocess.Popen(
            [sys.executable, "-m", "slowcard", "capture", "vllm", "--url", stub.base, "--capture-dir", str(prof),
             "--capture-seconds", "1h", "--db", str(db)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert stub.wait_for("start")
            proc.send_signal(getattr(signal, sig))
            out, err = proc.communicate(timeout=120)  # the 1 h window ended by the signal, not by time
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
        assert stub.events == ["start", "stop"] and stub.on is False
    assert proc.returncode == 3, err
    said = "interrupted" if sig == "SIGINT" else sig
    assert f"{said}: stopping the profiler" in err
    flat = " ".join(out.split())
    assert "CAPTURE 1 for on-demand: interrupted: stopped" in flat and "the profiler was stopped" in flat
    assert rows(db, "SELECT status FROM captures") == [("interrupted",)]
    assert "Traceback" not in err


def test_stopped_capture_reaches_its_final_row_when_the_watcher_lost_its_lock(tmp_path, monkeypatch):
    """A Ctrl-C that lands in the watch between taking the database lock and its ``try`` leaves
    the lock taken for good (seen under load: "the running capture did not end in time", the
    row `running`). A capture being stopped waits only STOPPING_LOCK_WAIT_S for it, then
    records its outcome anyway."""
    import slowcard.capture as capture_mod

    monkeypatch.setattr(capture_mod, "STOPPING_LOCK_WAIT_S", 0.5)
    lock = threading.Lock()
    with ProfilerStub(tmp_path) as stub:
        c = Capturer(tmp_path / "c.duckdb", VllmBackend(stub.base, tmp_path / "prof"), seconds=3600, db_lock=lock)
        assert c.trigger(Alert.on_demand()).startswith("started")
        assert stub.wait_for("start")
        lock.acquire()  # the watcher's main thread, interrupted, never gives it back
        assert c.shutdown(timeout_s=120)
        assert stub.events == ["start", "stop"]
    (cap,) = c.finished()
    assert cap.status == "interrupted"
    assert rows(tmp_path / "c.duckdb", "SELECT status FROM captures") == [("interrupted",)]


# --- finding 12: msServiceProfiler's config edited in place ------------------------------------
CONFIG = '{\n  "enable": 0,\n  "prof_dir": "prof",\n  "timelimit": 1e999,\n  "rate": 1.50, "n": 2E3\n}\n'


def linked_config(tmp_path, text: str, mode: int = 0o444) -> tuple[Path, Path]:
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "config.json"
    real.write_text(text)
    real.chmod(mode)
    link = tmp_path / "config.json"
    link.symlink_to("real/config.json")
    return link, real


def test_msserviceprofiler_config_is_edited_in_place_through_its_link(tmp_path):
    """A read-only config behind a link, holding a number JSON parsers read as infinity: the
    start writes only the enable value into the link's target (same inode: no folder write, the
    link stays a link, mode 0444 stays), the stop gives back the very bytes it had (before: the
    link replaced by a plain 0644 file, 1e999 written as Infinity, the target left enabled)."""
    link, real = linked_config(tmp_path, CONFIG)
    ino = real.stat().st_ino
    b = MsServiceProfilerBackend(link, parse_exe=None)
    b.start()
    assert link.is_symlink() and real.stat().st_ino == ino
    assert stat.S_IMODE(real.stat().st_mode) == 0o444
    assert real.read_text() == CONFIG.replace('"enable": 0', '"enable": 1')
    b.stop()
    assert link.is_symlink() and real.stat().st_ino == ino
    assert real.read_text() == CONFIG and stat.S_IMODE(real.stat().st_mode) == 0o444
    assert b.notes == []


def test_msserviceprofiler_enable_already_on_stays_on(tmp_path):
    link, real = linked_config(tmp_path, CONFIG.replace('"enable": 0', '"enable": 1'), 0o640)
    b = MsServiceProfilerBackend(link, parse_exe=None)
    b.start()
    b.stop()
    assert json.loads(real.read_text())["enable"] == 1  # before: switched off
    assert real.read_text() == CONFIG.replace('"enable": 0', '"enable": 1')
    assert any('"enable" was already 1 before the capture' in n for n in b.notes)


@pytest.mark.parametrize(
    "text",
    [
        '{"enable": false, "prof_dir": "p"}',  # a longer value: padded with spaces, the size kept
        '{"prof_dir": "p", "x": 1e999}',  # no enable: added, then removed
        '{"a": {"enable": 1}, "enable": 0}',  # only the top-level key is the switch
        "{}",
    ],
)
def test_msserviceprofiler_switch_round_trips_the_bytes(tmp_path, text):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(text)
    b = MsServiceProfilerBackend(cfg, parse_exe=None)
    b.start()
    on = cfg.read_text()
    assert json.loads(on.replace("1e999", "1"))["enable"] == 1
    if "enable" in text and '"a"' not in text:
        assert len(on) == len(text)  # the one value rewritten in place
    b.stop()
    assert cfg.read_text() == text


def test_msserviceprofiler_config_changed_meanwhile_gets_its_old_value_back(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text('{"enable": 0, "prof_dir": "p"}')
    b = MsServiceProfilerBackend(cfg, parse_exe=None)
    b.start()
    cfg.write_text('{"prof_dir": "q", "enable": 1, "other": 1e999}')  # edited by hand during the capture
    b.stop()
    assert cfg.read_text() == '{"prof_dir": "q", "enable": 0, "other": 1e999}'


def test_msserviceprofiler_capture_through_a_linked_config(tmp_path):
    """The whole capture with the service polling a config that is a link: it collects, and the
    link still points at a config whose enable is back to 0."""
    (tmp_path / "conf").mkdir()
    real = msprof_sim.write_config(tmp_path / "conf" / "cfg.json", prof_dir=str(tmp_path / "prof"))
    link = tmp_path / "cfg.json"
    link.symlink_to(real)
    poller = msprof_sim.FakeServiceProfiler(link, hot_dp=2)
    poller.start()
    try:
        c = Capturer(tmp_path / "ms.duckdb", MsServiceProfilerBackend(link, parse_exe=None), seconds=0.5, settle_s=0.3)
        cap = c.run(Alert.on_demand(dp_rank=2))
    finally:
        poller.close()
    assert cap.status == "ok", cap.reason
    assert cap.slow_card == "DP domain 2" and len(poller.collections) == 1
    assert link.is_symlink() and json.loads(real.read_text())["enable"] == 0


def test_msserviceprofiler_parse_takes_only_this_captures_output(tmp_path, monkeypatch):
    """Two captures into the same folder: the second ingests only what its own parse wrote
    (before: everything under slowcard_parsed, the first capture's output too)."""
    # the service writes both collections into one folder (named by the second, here fixed)
    monkeypatch.setattr(
        msprof_sim, "time", SimpleNamespace(time=lambda: 0.0, localtime=lambda *a: None, strftime=lambda *a: "flat")
    )
    cfg = msprof_sim.write_config(tmp_path / "cfg.json", prof_dir=str(tmp_path / "prof"))
    exe = msprof_sim.write_parse_exe(tmp_path)
    db = tmp_path / "ms.duckdb"
    poller = msprof_sim.FakeServiceProfiler(cfg, hot_dp=1)
    poller.start()
    try:
        backend = MsServiceProfilerBackend(cfg, parse_exe=str(exe))
        c = Capturer(db, backend, seconds=0.3, settle_s=0.3, cooldown_s=0)
        first = c.run(Alert.on_demand())
        second = c.run(Alert.on_demand())
    finally:
        poller.close()
    assert first.status == "ok" and second.status == "ok", (first.reason, second.reason)
    assert poller.collections == [tmp_path / "prof" / "flat"] * 2
    paths = sorted(p for (p,) in rows(db, "SELECT path FROM sources WHERE run = ?", [second.run]))
    assert paths == [
        str(tmp_path / "prof" / "flat" / "slowcard_parsed" / second.run / n) for n in ("batch.csv", "request.csv")
    ]


# --- findings 7, 8, 11: only regular files inside the folder ----------------------------------
def test_scan_takes_only_regular_files_inside_the_folder(tmp_path):
    """A link out of the folder (another job's trace), a link to /dev/zero, a FIFO, a link to a
    file inside and a link to a folder: none is taken, each is listed with what it is (before:
    all taken; the FIFO blocked the completeness check, /dev/zero read forever)."""
    outside = tmp_path / "other_job"
    outside.mkdir()
    (outside / "rank0.json").write_text("{}")
    d = tmp_path / "prof"
    d.mkdir()
    (d / "a.json").write_text("{}")
    (d / "secret.pt.trace.json").symlink_to(outside / "rank0.json")
    (d / "zero.json").symlink_to("/dev/zero")
    os.mkfifo(d / "pipe.json")
    (d / "again.json").symlink_to(d / "a.json")
    (d / "jobdir").symlink_to(outside)
    skipped: dict[Path, str] = {}
    assert list(scan(d, skipped)) == [d / "a.json"]
    assert skipped == {
        d / "secret.pt.trace.json": "a link to a path outside the folder",
        d / "zero.json": "a link to a path outside the folder",
        d / "pipe.json": "a FIFO",
        d / "again.json": "a link (what it points to in the folder is taken itself)",
        d / "jobdir": "a link to a path outside the folder",
    }
    # a file swapped for one of these after the scan is not opened as what it points to
    assert check_file(d / "pipe.json").why == "not a regular file"
    assert check_file(d / "zero.json").why.startswith("unreadable")


def test_capture_takes_no_file_outside_the_folder_and_says_so(tmp_path):
    """The profile folder gets a link to another job's trace beside its own 4 traces: the
    capture ingests its 4 and names the link in a note (before: 5 files ingested, rank 0 twice,
    the verdict SKIP "duplicate ranks" instead of FAIL rank 1)."""
    out = tmp_path / "out"
    out.mkdir()
    other = tmp_path / "other_job_rank0.json"
    other.write_bytes(gzip.decompress((TRACES / "rank0.pt.trace.json.gz").read_bytes()))
    stop = f'cp {TRACES}/*.json.gz "$SLOWCARD_CAPTURE_DIR"/; ln -s {other} "$SLOWCARD_CAPTURE_DIR"/secret.pt.trace.json'
    backend = ExecBackend("true", stop, out)
    cap = Capturer(tmp_path / "x.duckdb", backend, seconds=0.1, wait_s=60, settle_s=0.3).run(Alert.on_demand())
    assert cap.status == "ok", cap.reason
    assert cap.files == 4 and cap.verdict_status == "FAIL"
    assert any("secret.pt.trace.json (a link to a path outside the folder)" in n for n in cap.notes)
    assert rows(tmp_path / "x.duckdb", "SELECT count(*) FROM sources WHERE path LIKE '%other_job%'") == [(0,)]


# --- findings 9, 10 and the multi-member gzip: bounded completeness checks ----------------------
def test_multi_member_gzip_is_judged_whole(tmp_path):
    """`cat a.gz b.gz`: a valid gzip whose JSON ends in the second member (before: judged by
    its first member, "not closed" until --capture-wait)."""
    p = tmp_path / "r.pt.trace.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X"},') + gzip.compress(b'{"ph": "X"}]}'))
    assert incomplete(p) is None
    assert check_file(p).content_bytes == len(b'{"traceEvents": [{"ph": "X"},{"ph": "X"}]}')


def test_whole_gzip_holding_cut_json_is_not_complete(tmp_path):
    """A gzip stream that is whole (end marker, CRC) around JSON cut after an event: the JSON
    is what must be whole (before: accepted, its last byte being '}')."""
    p = tmp_path / "r.pt.trace.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X"}, {"ph": "X"}'))
    assert incomplete(p) == "it is not a whole JSON document"
    p.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X"}, {"ph": "X"}]}'))
    assert incomplete(p) is None


def gz_of_spaces(path: Path, mb: int) -> None:
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(b"[")
        for _ in range(mb):
            f.write(b" " * (1 << 20))
        f.write(b"]")


def test_gzip_bomb_is_counted_only_up_to_the_cap(tmp_path):
    """64 MB of content in ~70 KB: the check decompresses in chunks and stops past the limit
    (the content counted, the file judged too large), never holding more than a chunk."""
    p = tmp_path / "bomb.pt.trace.json.gz"
    gz_of_spaces(p, 64)
    assert p.stat().st_size < 1 << 20
    got = check_file(p, limit=8 << 20)
    assert got.why is None and (8 << 20) < got.content_bytes <= (9 << 20)
    assert check_file(p, limit=100 << 20).content_bytes == (64 << 20) + 2


def test_capture_size_cap_counts_decompressed_bytes(tmp_path):
    """--capture-max-mb caps what will be ingested: 64 MB of JSON in a 70 KB file is over a
    10 MB cap (before: 0.07 MB counted, the bomb ingested)."""
    out = tmp_path / "out"
    out.mkdir()
    bomb = tmp_path / "bomb.json.gz"
    gz_of_spaces(bomb, 64)
    backend = ExecBackend("true", f'cp {bomb} "$SLOWCARD_CAPTURE_DIR"/', out)
    c = Capturer(tmp_path / "x.duckdb", backend, seconds=0.1, wait_s=60, settle_s=0.3, max_bytes=10_000_000)
    cap = c.run(Alert.on_demand())
    assert cap.status == "too-large"
    assert cap.reason.startswith("over 10.") and "MB of content (decompressed) in 1 file(s)" in cap.reason
    assert "over the cap of 10 MB" in cap.reason
    assert rows(tmp_path / "x.duckdb", "SELECT count(*) FROM sources") == [(0,)]


def test_large_plain_json_is_judged_by_its_end(tmp_path, monkeypatch):
    """A plain JSON past FULL_PARSE_BYTES is never parsed whole (before: up to 256 MB parsed,
    3 GB of memory for 250 MB, on every poll): its end tells a closed document from a cut one."""
    import orjson

    assert FULL_PARSE_BYTES <= 32 << 20  # a whole parse holds ~12x the bytes in memory
    parsed: list[int] = []
    real_loads = orjson.loads
    monkeypatch.setattr(orjson, "loads", lambda data: parsed.append(len(data)) or real_loads(data))
    event = b'{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 5, "pid": 0, "tid": 1},'
    body = b'{"traceEvents": [' + event * (FULL_PARSE_BYTES // len(event) + 10)
    p = tmp_path / "big.pt.trace.json"
    p.write_bytes(body[:-1] + b"]}")
    assert incomplete(p) is None
    p.write_bytes(body + b'{"ph": "X", "na')
    assert incomplete(p) == "its JSON document is not closed"
    assert all(n <= FULL_PARSE_BYTES for n in parsed)


# --- issue 48: settle time and cool-down through a fake clock ----------------------------------
def test_settle_time_waits_for_files_arriving_one_by_one(tmp_path):
    """4 files appear 0.5 s apart (fake time): with a 1 s settle time the capture takes all 4,
    which a capture without it would not (it returns on the first one)."""
    folder = tmp_path / "out"
    folder.mkdir()

    def run(settle_s: float) -> dict:
        for f in folder.iterdir():
            f.unlink()
        clock = FakeClock(0.0)
        due = [0.0, 0.5, 1.0, 1.5]

        def sleep(s: float) -> None:
            clock.t += s
            while due and due[0] <= clock.t:
                (folder / f"r{4 - len(due)}.csv").write_text("a,b\n1,2\n")
                due.pop(0)

        sleep(0.0)
        return wait_for_files(folder, {}, 100.0, threading.Event(), settle_s, 0.25, clock=clock, sleep=sleep)

    assert sorted(p.name for p in run(1.0)) == ["r0.csv", "r1.csv", "r2.csv", "r3.csv"]
    assert len(run(0.0)) == 1  # the same arrivals without a settle time: what the settle time is for


def test_cool_down_follows_a_failed_capture(tmp_path):
    """A capture that failed (its start command exited 1) starts the cool-down as an ok one
    does: an alert 10 s later is refused, one after the cool-down starts a capture."""
    clock = FakeClock()
    backend = ExecBackend("exit 1", "true", tmp_path)
    c = Capturer(tmp_path / "x.duckdb", backend, seconds=0.1, cooldown_s=60.0, clock=clock)
    alert = Alert("dp-metrics-imbalance", "DP domain 1", "request-skew", "s", 0, "live", 1)
    assert c.trigger(alert).startswith("started")
    assert c.wait(120)
    assert [cap.status for cap in c.finished()] == ["failed"]
    clock.t += 10
    assert c.trigger(alert) == "not started for dp-metrics-imbalance: cool-down, 50 s left (--capture-cooldown)"
    clock.t += 51
    assert c.trigger(alert).startswith("started")
    assert c.wait(120)
    assert [cap.status for cap in c.finished()] == ["failed"]


# --- issue 48: the negative branch of the alert match -------------------------------------------
def card(kind: str, value) -> SimpleNamespace:
    return SimpleNamespace(subject=((kind, value),))


def test_match_alert_says_false_for_another_card():
    alert = Alert.on_demand(dp_rank=2)
    assert match_alert(alert, card("dp_rank", 2), None, None) is True
    assert match_alert(alert, card("dp_rank", 3), None, None) is False
    assert match_alert(alert, card("rank", 3), 4, 4) is False  # one rank per DP domain: rank 3 is DP 3
    assert match_alert(alert, card("rank", 2), 4, 4) is True
    assert match_alert(alert, card("rank", 3), 8, 4) is None  # ranks are not domains: cannot tell
    assert match_alert(Alert.on_demand(), card("dp_rank", 3), None, None) is None


def test_capture_line_says_when_the_card_is_not_the_alerted_one():
    base = dict(capture_id=1, alert=Alert.on_demand(dp_rank=2), backend="exec", status="ok", window_s=1.0)
    no = Capture(**base, run="capture-1", verdict_status="FAIL", headline="Slow card: rank 3", matches_alert=False)
    yes = Capture(**base, run="capture-1", verdict_status="FAIL", headline="Slow card: rank 2", matches_alert=True)
    assert "; NOT the alerted DP domain 2" in " ".join(capture_lines(no).split())
    flat = " ".join(capture_lines(yes).split())
    assert "; the alerted DP domain 2" in flat and "NOT" not in flat


def test_capture_of_another_slow_rank_does_not_match_the_alert(tmp_path):
    """The alert names DP 2, the capture's trace is slow on rank 3 (4 ranks, 4 DP domains)."""
    out = tmp_path / "out"
    out.mkdir()
    writer = (
        f"{shlex.quote(sys.executable)} -c \"import sys; sys.path.insert(0, '{TESTS}'); "
        f"from synth_kineto import write_ep_run; write_ep_run('{out}', scenario='token_skew', slow_rank=3)\""
    )
    c = Capturer(
        tmp_path / "x.duckdb", ExecBackend("true", writer, out), seconds=0.1, settle_s=0.3, n_domains=lambda: 4
    )
    cap = c.run(Alert.on_demand(dp_rank=2))
    assert cap.status == "ok", cap.reason
    assert cap.slow_card == "rank 3" and cap.matches_alert is False
    assert rows(tmp_path / "x.duckdb", "SELECT matches_alert FROM captures") == [(False,)]


# --- issue 48: --capture-max-mb through the CLI, in MB ------------------------------------------
@pytest.mark.parametrize(("max_mb", "code", "status"), [("2", 1, "ok"), ("1", 3, "too-large")])
def test_capture_max_mb_through_the_cli(tmp_path, max_mb, code, status):
    """The 4 traces hold 1.63 MB of JSON in 0.1 MB of gzip: a 2 MB cap takes them (read as kB
    it would refuse them), a 1 MB cap refuses them (counted compressed it would take them)."""
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.run(
        [sys.executable, "-m", "slowcard", "capture", "exec", "--capture-start", "true",
         "--capture-stop", f'cp {TRACES}/*.json.gz "$SLOWCARD_CAPTURE_DIR"/', "--capture-dir", str(out),
         "--capture-seconds", "0.1s", "--capture-max-mb", max_mb, "--db", str(tmp_path / "m.duckdb"),
         "--format", "json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == code, p.stderr
    doc = json.loads(p.stdout)
    assert doc["status"] == status and doc["files"] == 4
    assert 1_600_000 < doc["size_bytes"] < 1_700_000  # decompressed
    if status == "too-large":
        assert "over the cap of 1 MB (--capture-max-mb)" in doc["reason"]
    else:
        assert doc["verdict"]["slow_card"] == "rank 1"
