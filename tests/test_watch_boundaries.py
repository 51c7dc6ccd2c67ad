"""The boundaries that decide what `slowcard watch` collects and keeps (issue 48), each judged on a
fake clock (tests/ticked_exporter.py FakeClock in place of slowcard.watch's time module) or on
the order of events, never on how fast the machine is:

- one deadline for the whole request (a server dripping a byte at a time is cut off at it);
- the size cap: a body of exactly the cap is read, one byte more is refused;
- a range query's samples: the last asked step is kept, a timestamp off the step grid is not;
- the backfill's chunks: contiguous, none asked twice, shrunk 8x after an oversized answer;
- the loop: sleeps the interval minus the collection's time, stops at the duration;
- the retention: the windows of the last retention_s kept, exactly.

Each test names the mutant of bench/mutants.py (the WATCH list) it kills."""

from __future__ import annotations

import http.server
import json
import sys
import threading
import urllib.parse
from pathlib import Path

import duckdb
import pytest

import slowcard.watch as watch
from slowcard import metrics as mx
from slowcard.watch import PrometheusSource, ScrapeSource, Step, Watcher, http_get, http_request

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ticked_exporter import FakeClock, TickedExporter  # noqa: E402

HOLD_S = 20.0  # a held request's upper bound: reached only when the deadline is broken


class _Server:
    """An HTTP server on 127.0.0.1 port 0 running ``handle(handler)`` per GET, stopped in close()."""

    def __init__(self, handle):
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                try:
                    handle(self)
                except OSError:
                    pass  # the client went away (its deadline)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_port}/metrics"

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


# ------------------------------------------------------------------ one deadline per request


def test_a_server_dripping_bytes_is_cut_off_at_the_request_deadline():
    """Headers, then a byte every 50 ms: each read gets its byte long before a per-read timeout,
    so only a deadline for the whole request ends it. The request returns "timeout" while the
    server is still dripping (event order, no clock). Kills watch-a-timeout-per-read-not-one-deadline
    (the request would then run until the server gives up, HOLD_S, and read its body)."""
    release, finished = threading.Event(), threading.Event()

    def drip(h):
        h.send_response(200)
        h.end_headers()
        h.wfile.flush()
        try:
            for _ in range(int(HOLD_S / 0.05)):
                if release.wait(0.05):
                    break
                h.wfile.write(b"#")
                h.wfile.flush()
        finally:
            finished.set()

    srv = _Server(drip)
    try:
        got = http_get(srv.url, 0.5)
        still_dripping = not finished.is_set()
    finally:
        release.set()
        srv.close()
    assert got.body is None and got.error == "timeout"
    assert still_dripping


def test_a_held_answer_is_a_timeout_while_the_server_still_holds_it():
    """A server that answers only when released: the request gives up at its deadline first."""
    release = threading.Event()
    answered = []

    def hold(h):
        release.wait(HOLD_S)
        answered.append(True)
        h.send_response(200)
        h.end_headers()
        h.wfile.write(b"# nothing\n")

    srv = _Server(hold)
    try:
        got = http_get(srv.url, 0.3)
        held = not answered
    finally:
        release.set()
        srv.close()
    assert (got.error, held) == ("timeout", True)


# ------------------------------------------------------------------ the size cap


@pytest.mark.parametrize("with_length", [True, False])
def test_a_body_of_exactly_the_cap_is_read_and_one_byte_more_is_refused(with_length):
    """Kills watch-size-cap-refuses-exactly-the-cap (a streamed body) and
    watch-size-cap-by-content-length-off-by-one (a body with its Content-Length)."""
    cap = 1 << 20

    def body(h):
        n = int(urllib.parse.urlparse(h.path).query)
        h.send_response(200)
        if with_length:
            h.send_header("Content-Length", str(n))
        h.end_headers()
        h.wfile.write(b"x" * n)

    srv = _Server(body)
    try:
        at = http_request(f"{srv.url}?{cap}", 10.0, max_bytes=cap)
        over = http_request(f"{srv.url}?{cap + 1}", 10.0, max_bytes=cap)
    finally:
        srv.close()
    assert at[2] is None and len(at[1]) == cap
    assert over[1] is None and over[2] == "response over 1 MB"


# ------------------------------------------------------------------ a range query's samples


def _api(values_by_series: list[list]) -> bytes:
    return json.dumps(
        {
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [
                    {
                        "metric": {
                            "__name__": "vllm:num_requests_running",
                            "engine": str(i),
                            "instance": "a:1",
                            "job": "vllm",
                        },
                        "values": v,
                    }
                    for i, v in enumerate(values_by_series)
                ],
            },
        }
    ).encode()


def test_range_keeps_the_last_asked_step_and_drops_what_is_off_the_grid(monkeypatch):
    """Asked 100.000 .. 110.000 s at 1 s: 11 steps, both ends included. 111 s (past the range)
    and 104.5 s (half a step off the grid) are dropped and counted. Kills
    watch-range-drops-the-last-step and watch-step-grid-tolerance-half-a-step."""
    on_grid = [[100 + k, "3"] for k in range(11)]
    body = _api([on_grid + [[111, "3"], [104.5, "9"]]])
    monkeypatch.setattr(watch, "http_request", lambda *a, **k: (200, body, None))
    src = PrometheusSource("http://prom", mx.Mapping(), step_s=1.0, backfill_s=60)
    snaps, st = src._range(100_000, 110_000)
    assert sorted(snaps) == [100_000 + 1000 * k for k in range(11)]
    assert st.ok and st.samples == 11 and st.dropped == 2
    assert "timestamp outside the asked range" in st.note and "timestamp off the asked step grid" in st.note


# ------------------------------------------------------------------ the backfill's chunks


def _recording_api(monkeypatch, oversize_above_steps: int | None = None) -> list[tuple[int, int]]:
    asked: list[tuple[int, int]] = []

    def fake(url, *a, **k):
        q = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
        start, end = round(float(q["start"][0]) * 1e3), round(float(q["end"][0]) * 1e3)
        asked.append((start, end))
        if oversize_above_steps is not None and (end - start) // 1000 > oversize_above_steps:
            return 200, None, "response over 32 MB"
        return 200, _api([]), None

    monkeypatch.setattr(watch, "http_request", fake)
    return asked


def test_backfill_chunks_are_contiguous_and_never_ask_a_step_twice(monkeypatch):
    """300 s of backfill at 1 s in chunks of 120 steps: every step from the first to now asked
    exactly once. Kills watch-backfill-chunks-skip-a-step."""
    clock = FakeClock(start_ns=1_700_000_000_000_000_000)
    monkeypatch.setattr(watch, "time", clock)
    asked = _recording_api(monkeypatch)
    src = PrometheusSource("http://prom", mx.Mapping(), step_s=1.0, backfill_s=300)
    batches = list(src.collect(None))
    end = clock.time_ns() // 1_000_000 // 1000 * 1000
    steps = [t for s, e in asked for t in range(s, e + 1, 1000)]
    assert steps == list(range(end - 300_000, end + 1, 1000))  # in order, none twice, none missed
    assert len(asked) == len(batches) == 3 and all(st.ok for _, sts in batches for st in sts)


def test_an_oversized_answer_makes_the_chunks_8x_shorter_and_the_backfill_goes_on(monkeypatch):
    """Answers over the cap for more than 15 steps: after one refusal the chunks are 120 // 8 =
    15 steps and every step is fetched. Kills watch-oversized-answer-not-shrunk."""
    monkeypatch.setattr(watch, "time", FakeClock(start_ns=1_700_000_000_000_000_000))
    asked = _recording_api(monkeypatch, oversize_above_steps=15)
    src = PrometheusSource("http://prom", mx.Mapping(), step_s=1.0, backfill_s=60)
    batches = list(src.collect(None))
    assert src.chunk_steps == 15
    assert all(st.ok for _, sts in batches for st in sts)
    assert (asked[0][1] - asked[0][0]) // 1000 == 60 and asked[-1][1] == asked[0][1]  # refused, then to the end


# ------------------------------------------------------------------ the loop's clock


class _Steps:
    """A stand-in watcher for run_loop: each collection takes ``cost_s`` of the fake clock."""

    def __init__(self, clock: FakeClock, cost_s: float):
        self.clock, self.cost_s, self.at = clock, cost_s, []

    def step(self):
        self.at.append(round(self.clock.elapsed_s, 6))
        self.clock.elapsed_s += self.cost_s
        return Step(ts_ns=self.clock.time_ns())


def test_the_loop_collects_every_interval_until_the_duration(monkeypatch):
    """--interval 0.5 s --duration 2 s: collections at 0, 0.5, 1, 1.5 and 2 s, no sixth past the
    duration (kills watch-duration-one-collection-long)."""
    clock = FakeClock()
    monkeypatch.setattr(watch, "time", clock)
    w = _Steps(clock, 0.0)
    Watcher.run_loop(w, 0.5, duration_s=2.0)
    assert w.at == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_the_loop_sleeps_the_interval_minus_the_collection(monkeypatch):
    """A collection taking 0.2 s of a 0.5 s interval: the loop sleeps 0.3 s, so the collections
    stay 0.5 s apart instead of drifting to 0.7 s. Kills watch-loop-sleeps-the-whole-interval."""
    clock = FakeClock()
    monkeypatch.setattr(watch, "time", clock)
    w = _Steps(clock, 0.2)
    Watcher.run_loop(w, 0.5, duration_s=2.0)
    assert clock.sleeps == pytest.approx([0.3] * 4)
    assert w.at == [0.0, 0.5, 1.0, 1.5, 2.0]


# ------------------------------------------------------------------ retention


def test_retention_keeps_exactly_the_windows_of_the_last_retention_seconds(monkeypatch, tmp_path):
    """Windows every 0.5 s of the fake clock for 3.5 s, retention 1 s: at the last write (3.5 s)
    the windows at 2.5, 3.0 and 3.5 s remain (one exactly at the cutoff kept). Kills
    watch-retention-read-as-ms (1 ms of retention keeps one window)."""
    clock = FakeClock(start_ns=1_700_000_000_000_000_000)
    monkeypatch.setattr(watch, "time", clock)
    exporter = TickedExporter(engines=(0, 1))
    try:
        w = Watcher(tmp_path / "w.duckdb", "r", ScrapeSource([(exporter.url, None)], mx.Mapping()), retention_s=1.0)
        w.run_loop(0.5, duration_s=3.5)
    finally:
        exporter.close()
    assert exporter.scrapes == 8
    con = duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True)
    try:
        kept = [r[0] for r in con.execute("SELECT DISTINCT ts_ns FROM metric_window_rows ORDER BY 1").fetchall()]
    finally:
        con.close()
    assert [round((t - clock.start_ns) / 1e9, 3) for t in kept] == [2.5, 3.0, 3.5]
