"""Issue 31 (red team, round 3): `watch` against hostile endpoints, the schema template cache,
temp folders across PID namespaces, names that are not UTF-8, forged lines, strict JSON and the
`show` sandbox. One test (or more) per finding; the finding's number is in each test's name.

The endpoints are tests/hostile_endpoint.py on 127.0.0.1 (slow, huge, malformed, non-finite,
future and ancient timestamps); every server and process stops by itself.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import PEAK_RSS_CHILD  # noqa: E402
from hostile_endpoint import HostileEndpoint  # noqa: E402

from slowcard import metrics as mx  # noqa: E402
from slowcard import store, tempspace  # noqa: E402
from slowcard.watch import FUTURE_SLACK_NS, PrometheusSource, ScrapeSource, Watcher, http_get  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EP4 = ROOT / "testdata" / "ep4_token_skew"
CLI = [sys.executable, "-m", "slowcard"]


def cli(*args, env=None, timeout=120, **kw) -> subprocess.CompletedProcess:
    """The CLI in a subprocess; arguments may be bytes (names that are not UTF-8)."""
    res = subprocess.run(
        CLI + [a if isinstance(a, bytes) else str(a) for a in args],
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        **kw,
    )
    res.stdout = res.stdout.decode("utf-8", "replace")
    res.stderr = res.stderr.decode("utf-8", "replace")
    return res


def rows(db: Path, sql: str, params=None) -> list:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


@pytest.fixture
def srv():
    with HostileEndpoint(lifetime_s=30) as s:
        yield s


def scrape_steps(db: Path, url: str, steps: int = 2, pause_s: float = 0.3, **kw) -> list:
    w = Watcher(db, "live", ScrapeSource([(url, None)], mx.Mapping(), timeout_s=kw.pop("timeout_s", 5.0)), **kw)
    out = []
    for i in range(steps):
        if i:
            time.sleep(pause_s)
        out.append(w.step())
    return out


def stored_numbers_are_finite(db: Path) -> bool:
    cols = [c for c in mx.WINDOW_COLUMNS if c not in ("ts_ns", "dp_rank", "targets", "reset")]
    bad = rows(db, "SELECT count(*) FROM metric_window_rows WHERE " + " OR ".join(f"NOT isfinite({c})" for c in cols))
    return bad[0][0] == 0


# --- 1: one far-future step no longer bricks the database --------------------------------------


def test_1_a_future_step_is_dropped_and_later_runs_store_windows(srv, tmp_path):
    db = tmp_path / "w.duckdb"
    url = srv.url("/api_flip")  # the first answer holds a step 10 years ahead, then honest ones
    for _ in range(3):
        res = cli("watch", "--prometheus", url, "--once", "--interval", "5s", "--backfill", "1m", "--db", db)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    now = time.time_ns()
    n, newest = rows(db, "SELECT count(DISTINCT ts_ns), max(ts_ns) FROM metric_window_rows")[0]
    assert n >= 10 and newest <= now  # the backfill of the honest answers is stored, nothing ahead
    dropped, note = rows(db, "SELECT dropped, note FROM metric_scrape_rows ORDER BY ts_ns LIMIT 1")[0]
    assert dropped == 2 and "outside the asked range" in note  # one bad step per engine, counted


def test_1_a_database_already_holding_a_future_window_is_repaired(srv, tmp_path):
    db = tmp_path / "w.duckdb"
    source = PrometheusSource(srv.url("/api_ok"), mx.Mapping(), step_s=1.0, backfill_s=20)
    assert Watcher(db, "prom", source).step().n_windows >= 10
    con = store.open_db(db)  # what a version before issue 31 could store
    con.execute(
        "INSERT INTO metric_window_rows (source_id, ts_ns, window_s, dp_rank) "
        "SELECT source_id, max(ts_ns) + 315360000000000000, 1, 0 FROM metric_window_rows GROUP BY 1"
    )
    con.close()
    time.sleep(2.1)
    source = PrometheusSource(srv.url("/api_ok"), mx.Mapping(), step_s=1.0, backfill_s=20)
    step = Watcher(db, "prom", source).step()  # a new process (cron): follows from the stored windows
    assert step.n_windows >= 1
    newest = rows(db, "SELECT max(ts_ns) FROM metric_window_rows")[0][0]
    assert newest <= time.time_ns() + FUTURE_SLACK_NS


# --- 2: one deadline per request ---------------------------------------------------------------


@pytest.mark.parametrize("path", ["/slow_body?every=0.2", "/slow_headers?every=0.2"])
def test_2_a_slow_endpoint_costs_one_timeout(srv, path):
    t0 = time.monotonic()
    got = http_get(srv.url(path), 1.0)
    assert got.body is None and got.error == "timeout"
    assert time.monotonic() - t0 < 2.5  # a byte every 0.2 s never resets the deadline


def test_2_watch_once_returns_despite_a_slowloris(srv, tmp_path):
    t0 = time.monotonic()
    res = cli(
        "watch", "--scrape", srv.url("/slow_headers?every=0.1"), "--once", "--timeout", "1s", "--db", tmp_path / "w.db"
    )
    assert res.returncode == 0 and "timeout" in res.stdout, res.stdout + res.stderr
    assert time.monotonic() - t0 < 30


def test_2_oversized_answers_are_refused(srv):
    assert http_get(srv.url("/huge"), 10.0).error == "response over 32 MB"
    got = http_get(srv.url("/gzipbomb"), 10.0)  # never inflated: read as the bytes it is
    assert got.body is not None and len(got.body) < (1 << 20)


# --- 3: bounded work per collection --------------------------------------------------------------


@pytest.mark.parametrize("mode", ["many_200000", "grid_200000"])
def test_3_distinct_timestamps_make_at_most_the_asked_steps(srv, mode):
    source = PrometheusSource(srv.url(f"/api_{mode}"), mx.Mapping(), step_s=15.0, backfill_s=600)
    batches = list(source.collect(None))
    snaps = [s for b in batches for s in b[0]]
    statuses = [st for b in batches for st in b[1]]
    assert len(snaps) <= 600 / 15 + 1  # the asked grid, not one snapshot per distinct timestamp
    assert sum(s.dropped for s in statuses) + sum(s.samples for s in statuses) == 200_000
    assert all(s.ok for s in statuses)


_MAXRSS = PEAK_RSS_CHILD  # peak RSS of the child itself (conftest)


def _maxrss_mb(res) -> float:
    return int(res.stderr.rsplit("maxrss_kb=", 1)[1].split()[0]) / 1024


def test_3_a_30mb_answer_of_a_million_timestamps_stays_bounded(srv, tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", _MAXRSS, "watch", "--prometheus", srv.url("/api_many_1250000"), "--once"]
        + ["--interval", "15s", "--backfill", "2m", "--timeout", "30s", "--db", str(tmp_path / "w.duckdb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "1250000 sample(s) dropped" in res.stdout
    # measured 420 MB alone and 904 MB once inside a full CI run (successive 30 MB answers parsed
    # into the same process; freed memory is not handed back, so the peak grows by a parse); before
    # issue 31: 3 GB and no end at 600 s
    assert _maxrss_mb(res) < 1500


@pytest.mark.slow
def test_3_thousands_of_engines_stay_linear(srv, tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", _MAXRSS, "watch", "--scrape", srv.url("/ok?n=3000"), "--interval", "1s"]
        + ["--duration", "6s", "--timeout", "20s", "--db", str(tmp_path / "w.duckdb")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    n = rows(tmp_path / "w.duckdb", "SELECT count(DISTINCT ts_ns) FROM metric_window_rows")[0][0]
    assert n >= 2
    # each stored window made the next collections' verdict heavier by ~0.5 GB before issue 31
    assert _maxrss_mb(res) < 600


# --- 4: one bad sample is dropped and counted; the rest of the scrape is kept -------------------


@pytest.mark.parametrize("label", ["inf", "1e30", "-1", "1.5", "nan", "99999999999", "seven"])
def test_4_a_bad_rank_label_drops_its_sample_only(srv, tmp_path, label):
    db = tmp_path / "w.duckdb"
    steps = scrape_steps(db, srv.url(f"/label?engine={label}"))
    assert {r["dp_rank"] for r in steps[-1].windows} == {0, 1, None}
    assert all(st.ok and st.dropped == 1 and "DP label" in st.note for s in steps for st in s.statuses)
    assert rows(db, "SELECT sum(dropped), count(*) FROM metric_scrape_rows")[0] == (2, 2)


def test_4_non_finite_and_huge_values_are_dropped(srv, tmp_path):
    db = tmp_path / "w.duckdb"
    steps = scrape_steps(db, srv.url("/values"))
    assert all(st.dropped == 4 for st in steps[-1].statuses), steps[-1].statuses
    assert {r["dp_rank"] for r in steps[-1].windows} == {0, 1, None}
    assert stored_numbers_are_finite(db)


@pytest.mark.parametrize("value", ["inf", "nan", "1e300", "future", "ancient"])
def test_4_a_bad_timestamp_from_prometheus_drops_its_value(srv, value):
    source = PrometheusSource(srv.url(f"/api_ts_{value}"), mx.Mapping(), step_s=15.0, backfill_s=120)
    batches = list(source.collect(None))
    assert [st.dropped for b in batches for st in b[1]] == [2]  # one per engine, counted
    snaps = [s for b in batches for s in b[0]]
    assert len(snaps) == 1 and all(s.ts_ns <= time.time_ns() for s in snaps)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--scrape", "URL=3000000000"], "must be a number from 0 to"),
        (["--prometheus", "URL", "--dp-map", "node:1=99999999999"], "must be a number from 0 to"),
        (["--scrape", "URL", "--interval", "99999999999999d"], "--interval '99999999999999d'"),
        (["--scrape", "URL", "--timeout", "99999999999999d"], "--timeout '99999999999999d'"),
        (["--prometheus", "URL", "--backfill", "99999d"], "--backfill '99999d'"),
        (["--prometheus", "URL", "--backfill", "1000d"], "shorten --backfill"),  # 5.8 M steps of 15 s
        (["--scrape", "URL", "--interval", "nan"], "--interval 'nan'"),
    ],
)
def test_4_numbers_out_of_range_on_the_command_line_are_usage_errors(srv, tmp_path, args, words):
    args = [a.replace("URL", srv.url("/ok")) for a in args]
    t0 = time.monotonic()
    res = cli("watch", *args, "--once", "--db", tmp_path / "w.duckdb", timeout=60)
    assert res.returncode == 2 and words in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert time.monotonic() - t0 < 30


# --- 5: watch without the [metrics] extra ---------------------------------------------------------

_NO_PROMETHEUS_CLIENT = (
    "import sys; sys.modules['prometheus_client'] = None; sys.argv = ['slowcard'] + sys.argv[1:]; "
    "from slowcard.cli import main; main()"
)


def test_5_watch_without_prometheus_client_names_the_extra(srv, tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", _NO_PROMETHEUS_CLIENT, "watch", "--scrape", srv.url("/ok"), "--once"]
        + ["--db", str(tmp_path / "w.duckdb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "pip install 'slowcard[metrics]'" in res.stderr
    # the Prometheus API needs no exposition parser
    res = subprocess.run(
        [sys.executable, "-c", _NO_PROMETHEUS_CLIENT, "watch", "--prometheus", srv.url("/api_ok"), "--once"]
        + ["--interval", "5s", "--backfill", "1m", "--db", str(tmp_path / "p.duckdb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr


# --- 6: a reader never stops the watcher ---------------------------------------------------------


def test_6_a_reader_holding_the_database_past_the_lock_wait_does_not_end_the_watch(srv, tmp_path):
    db = tmp_path / "w.duckdb"
    proc = subprocess.Popen(
        CLI + ["watch", "--scrape", srv.url("/ok"), "--interval", "0.5s", "--duration", "9s", "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SLOWCARD_LOCK_WAIT": "1"},
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.3)
            try:
                if rows(db, "SELECT count(*) FROM metric_window_rows")[0][0]:
                    break
            except (duckdb.Error, OSError):
                continue  # not created yet, or the watcher writing
        con = None
        while con is None and time.monotonic() < deadline:  # between two of the watcher's writes
            try:
                con = duckdb.connect(str(db), read_only=True)  # a long query: 4 s, past SLOWCARD_LOCK_WAIT
            except duckdb.IOException:
                time.sleep(0.05)
        assert con is not None, "the watcher never let go of the database"
        held_from = time.time_ns()
        time.sleep(4)
        con.close()
        held_to = time.time_ns()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # its pipes closed whatever happened (an open one warns in a later test)
    assert proc.returncode == 0, err
    assert "database busy" in out
    # the windows collected meanwhile were written once the reader let go
    n = rows(
        db, "SELECT count(DISTINCT ts_ns) FROM metric_window_rows WHERE ts_ns BETWEEN ? AND ?", [held_from, held_to]
    )
    assert n[0][0] >= 1, out


# --- 7: the schema template never leaks and never refuses ----------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("SLOWCARD_CACHE_DIR", str(folder))
    return folder


def _new_db(path: Path) -> Path:
    store.open_db(path).close()
    return path


def _victim(tmp_path: Path) -> Path:
    """A slowcard database holding a run."""
    victim = tmp_path / "victim.duckdb"
    res = cli("ingest", EP4 / "rank0.pt.trace.json.gz", "--db", victim, "--run", "secret_run", "-q")
    assert res.returncode == 0, res.stderr
    return victim


@pytest.mark.parametrize("how", ["symlink", "copy"])
def test_7_a_database_at_the_template_path_never_seeds_new_ones(cache, tmp_path, how):
    victim = _victim(tmp_path)
    template = store.schema_template()
    template.unlink()
    if how == "symlink":
        template.symlink_to(victim)
    else:
        shutil.copyfile(victim, template)
    db = _new_db(tmp_path / "fresh.duckdb")
    assert rows(db, "SELECT count(*) FROM sources")[0][0] == 0
    assert rows(db, "SELECT count(*) FROM runs")[0][0] == 0
    assert rows(victim, "SELECT run FROM runs") == [("secret_run",)]  # the victim itself untouched


def test_7_a_template_with_its_taxonomy_emptied_is_not_used(cache, tmp_path):
    template = store.schema_template()
    con = duckdb.connect(str(template))
    con.execute("DELETE FROM op_taxonomy")
    con.execute("CHECKPOINT")
    con.close()
    res = cli("diagnose", EP4, "--db", tmp_path / "p.duckdb")
    plain = cli("diagnose", EP4, "--db", tmp_path / "nocache.duckdb", env={"SLOWCARD_CACHE_DIR": ""})
    assert res.stdout.splitlines()[:2] == plain.stdout.splitlines()[:2]
    assert res.stdout.splitlines()[0].endswith("FAIL") and res.stdout.splitlines()[1].startswith("Slow card: rank 1")


def test_7_someone_elses_duckdb_file_at_the_template_path_never_refuses_a_new_database(cache, tmp_path):
    template = store.schema_template()
    template.unlink()
    duckdb.connect(str(template)).execute("CREATE TABLE customers (id INTEGER)").close()
    for i in range(2):
        res = cli("ingest", EP4, "--db", tmp_path / f"new{i}.duckdb", "-q")
        assert res.returncode == 0, res.stderr
    # dropped (it did not hash to its name) and rebuilt: a template again, not their database
    again = store.schema_template()
    assert again is not None and rows(again, "SELECT count(*) FROM op_taxonomy")[0][0] > 0
    assert not rows(again, "SELECT table_name FROM duckdb_tables() WHERE table_name = 'customers'")


def test_7_pruning_removes_only_slowcards_own_templates(cache, tmp_path):
    cache.mkdir()
    user = []
    for v in range(1, 6):  # the user's own files in the cache folder
        p = cache / f"schema-v{v}.duckdb"
        p.write_text(f"user data {v}")
        os.utime(p, (1_700_000_000 + v, 1_700_000_000 + v))
        user.append(p)
    template = store.schema_template()
    folder = template.parent
    (folder / "notes.txt").write_text("mine")
    alien = folder / ("schema-" + "a" * 16 + "-" + "b" * 16 + ".duckdb")  # named like one, a link
    alien.symlink_to(tmp_path / "elsewhere.duckdb")
    old_keys = []
    for k in range(5):  # templates of older versions, written by slowcard
        p = folder / f"schema-{k:016x}-{k:016x}.duckdb"
        shutil.copyfile(template, p)
        os.utime(p, (1_600_000_000 + k, 1_600_000_000 + k))
        old_keys.append(p)
    template.unlink()
    assert store.schema_template() is not None  # builds this version's and prunes
    assert all(p.exists() for p in user) and (folder / "notes.txt").exists() and alien.is_symlink()
    assert [p.exists() for p in old_keys] == [False, False, True, True, True]  # 4 versions kept


# --- 8: temp ownership is a held lock, not a process id -------------------------------------------

_HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


def test_8_a_folder_whose_owner_lock_is_held_stays_whatever_its_pid(tmp_path):
    # a running slowcard in another PID namespace: its process id means nothing here
    folder = tmp_path / f"slowcard-part-{tempspace._host()}-999999999-tok123"
    folder.mkdir()
    owner = folder / tempspace.OWNER_FILE
    owner.write_text("slowcard temp folder tok123\npid 999999999\n")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(owner)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert tempspace.clean_stale([tmp_path]) == [] and folder.exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert tempspace.clean_stale([tmp_path]) == [folder] and not folder.exists()  # the owner is gone


def test_8_a_folder_without_owner_file_is_left_while_young(tmp_path):
    young = tmp_path / f"slowcard-part-{tempspace._host()}-999999999-young"
    old = tmp_path / f"slowcard-part-{tempspace._host()}-999999999-old"
    young.mkdir()
    old.mkdir()
    os.utime(old, (time.time() - 2 * tempspace.LEGACY_AGE_S,) * 2)
    assert tempspace.clean_stale([tmp_path]) == [old]
    assert young.exists()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare (PID namespaces)")
def test_8_a_slowcard_in_another_pid_namespace_leaves_a_live_folder(tmp_path):
    live = tempspace.make_dir("part", tmp_path)
    code = f"from slowcard import tempspace; print(len(tempspace.clean_stale([{str(tmp_path)!r}])))"
    res = subprocess.run(
        ["unshare", "-pf", "--mount-proc", sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    if res.returncode != 0 and "unshare" in res.stderr:
        pytest.skip(f"unshare failed here: {res.stderr.strip()[:100]}")
    assert res.stdout.strip() == "0" and live.exists(), res.stderr
    shutil.rmtree(live)


# --- 9: names that are not UTF-8 -------------------------------------------------------------------


def test_9_names_that_are_not_utf8_are_ingested_and_queried(tmp_path):
    t = os.fsencode(tmp_path)
    folder = t + b"/run\xff"
    os.mkdir(folder)
    for f in EP4.iterdir():
        shutil.copyfile(f, os.path.join(folder, os.fsencode(f.name)))
    res = cli("ingest", folder, "--db", tmp_path / "a.duckdb")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert rows(tmp_path / "a.duckdb", "SELECT run, count(*) FROM sources GROUP BY run") == [("run\\xff", 4)]
    # --run, and a file inside a folder
    os.rename(os.path.join(folder, b"rank3.pt.trace.json.gz"), os.path.join(folder, b"rank3\xfe.pt.trace.json.gz"))
    res = cli("ingest", folder, "--db", tmp_path / "b.duckdb", "--run", b"r\xff")
    assert res.returncode == 0, res.stderr
    got = rows(tmp_path / "b.duckdb", "SELECT run, path, status FROM sources ORDER BY path")
    assert [g[2] for g in got] == ["ok"] * 4 and {g[0] for g in got} == {"r\\xff"}
    assert got[3][1].endswith("/run\\xff/rank3\\xfe.pt.trace.json.gz")
    q = cli("query", "ep-slow-rank", "--db", tmp_path / "b.duckdb", "--run", b"r\xff")
    assert q.returncode in (0, 1) and "[run r\\xff]" in q.stdout, q.stderr
    # --db: DuckDB opens UTF-8 names only: a clear usage error, nothing created
    res = cli("ingest", EP4, "--db", t + b"/db\xff.duckdb")
    assert res.returncode == 2 and "not valid UTF-8" in res.stderr and "Traceback" not in res.stderr
    assert not os.path.exists(t + b"/db\xff.duckdb")


def test_9_a_csv_whose_name_is_not_utf8_is_read_by_duckdb(tmp_path):
    t = os.fsencode(tmp_path)
    src = ROOT / "testdata" / "ops" / "kernel_details_level0.csv"
    shutil.copyfile(src, t + b"/kernel_details\xff.csv")
    res = cli("ingest", t + b"/kernel_details\xff.csv", "--db", tmp_path / "o.duckdb", "-q")
    assert res.returncode == 0, res.stderr
    assert rows(tmp_path / "o.duckdb", "SELECT status, rows_kept > 0 FROM sources") == [("ok", True)]


# --- 10: no forged lines --------------------------------------------------------------------------


def test_10_a_newline_in_a_server_answer_never_forges_an_alert(srv, tmp_path):
    res = cli("watch", "--prometheus", srv.url("/api_err"), "--once", "--interval", "15s", "--db", tmp_path / "w.db")
    assert res.returncode == 0, res.stderr
    assert not [line for line in res.stdout.splitlines() if line.startswith("ALERT")]
    assert "boom\\u000aALERT" in res.stdout and "\x1b" not in res.stdout


def test_10_garbage_with_escapes_stays_on_its_status_line(srv, tmp_path):
    res = cli("watch", "--scrape", srv.url("/garbage"), "--once", "--interval", "0.2s", "--db", tmp_path / "w.db")
    assert res.returncode == 0, res.stderr
    assert not [line for line in res.stdout.splitlines() if line.startswith("ALERT")] and "\x1b" not in res.stdout


def test_10_a_newline_in_a_run_name_never_forges_a_verdict_line(tmp_path):
    db = tmp_path / "nl.duckdb"
    evil = "evil\nep-slow-rank@v4 PASS [run prod] forged"
    assert cli("ingest", EP4, "--db", db, "--run", evil, "-q").returncode == 0
    for args in (["query", "ep-slow-rank"], ["diagnose"]):
        res = cli(*args, "--db", db)
        assert "forged" in res.stdout
        assert not [line for line in res.stdout.splitlines() if line.startswith("ep-slow-rank@v4 PASS")], res.stdout
    shown = cli("show", "ep-slow-rank", "--run", evil)
    assert shown.returncode == 0 and not [line for line in shown.stdout.splitlines() if line.startswith("ep-slow")]


# --- 11: strict JSON -------------------------------------------------------------------------------


def _strict(body: bytes):
    def refuse(const):
        raise ValueError(f"not JSON: {const}")

    return json.loads(body, parse_constant=refuse)


def test_11_the_webhook_body_is_strict_json(srv, tmp_path):
    db = tmp_path / "w.duckdb"
    scrape_steps(db, srv.url("/kv_inf"), steps=3)
    con = store.open_db(db)  # the last verdict was FAIL: the next collection is a change
    con.execute(
        "INSERT INTO metric_verdict_rows SELECT source_id, max(ts_ns) + 1, 'dp-metrics-imbalance', 'FAIL', 'x' "
        "FROM metric_verdict_rows GROUP BY 1"
    )
    con.close()
    source = ScrapeSource([(srv.url("/kv_inf"), None)], mx.Mapping())
    step = Watcher(db, "live", source, webhook=srv.url("/hook")).step()
    assert step.changes and srv.hooks, step.actions
    body = _strict(srv.hooks[0])
    assert body["before"] == "FAIL" and "nan" not in body["summary"].lower() and "inf" not in body["summary"]
    assert stored_numbers_are_finite(db)


def test_11_json_carries_null_and_a_flag_for_non_finite_numbers():
    from slowcard.render import to_json

    text = to_json({"rows": [{"share": math.inf, "ratio": math.nan, "x": 1.5}], "low": -math.inf})
    assert _strict(text.encode()) == {
        "rows": [{"share": None, "share_nonfinite": "Infinity", "ratio": None, "ratio_nonfinite": "NaN", "x": 1.5}],
        "low": None,
        "low_nonfinite": "-Infinity",
    }


# --- 12: show refuses what query refuses ------------------------------------------------------------

_HEAD = "-- name: {name}\n-- version: 1\n-- description: files per rank\n-- requires: sources\n-- verdict: none\n"
_SELECT = "SELECT rank, count(*) AS files FROM sources WHERE run = $run GROUP BY rank"


@pytest.mark.parametrize(
    "body",
    [
        ".shell touch {pwned}\n" + _SELECT,
        _SELECT + ";\nCOPY (SELECT 42 AS x) TO '{pwned}'",
        "COPY (SELECT 42 AS x WHERE $run IS NOT NULL) TO '{pwned}'",
    ],
)
def test_12_show_refuses_a_query_that_query_refuses(tmp_path, body):
    pwned = tmp_path / "pwned"
    sql = tmp_path / "sql"
    sql.mkdir()
    (sql / "rank-files.sql").write_text(_HEAD.format(name="rank-files") + body.format(pwned=pwned) + "\n")
    db = tmp_path / "s.duckdb"
    assert cli("ingest", EP4 / "rank0.pt.trace.json.gz", "--db", db, "--run", "a", "-q").returncode == 0
    q = cli("query", "rank-files", "--db", db, "--sql-dir", sql)
    assert "rank-files@v1 ERROR" in q.stdout, q.stdout + q.stderr
    for raw in ([], ["--raw"]):
        shown = cli("show", "rank-files", "--sql-dir", sql, "--run", "a", *raw)
        assert shown.returncode == 2 and shown.stdout == "" and "refuses" in shown.stderr, shown.stderr
    assert not pwned.exists()


def test_12_a_shown_script_runs_in_the_sandbox_of_query(tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    sql = tmp_path / "sql"
    sql.mkdir()
    (sql / "leak.sql").write_text(
        _HEAD.format(name="leak") + f"SELECT * FROM read_csv('{secret}') WHERE $run IS NOT NULL\n"
    )
    db = tmp_path / "s.duckdb"
    assert cli("ingest", EP4 / "rank0.pt.trace.json.gz", "--db", db, "--run", "a", "-q").returncode == 0
    shown = cli("show", "leak", "--sql-dir", sql, "--run", "a")
    assert shown.returncode == 0
    con = duckdb.connect(str(db))
    try:
        with pytest.raises(duckdb.PermissionException):
            con.execute(shown.stdout)  # the script's first lines disable file access, as query does
    finally:
        con.close()
    assert "ERROR" in cli("query", "leak", "--db", db, "--sql-dir", sql).stdout


def test_4_a_bad_time_in_a_scraped_file_drops_its_sample_not_the_file(tmp_path):
    name = "vllm_profiling_eplb:expert_hotness:current_max"
    f = tmp_path / "m.prom"
    f.write_text(
        f"# TYPE {name} gauge\n"
        f'{name}{{rank="0",phase="all",dp="0"}} 1.5 99999999999999999999\n'  # ms: past year 2262
        f'{name}{{rank="1",phase="all",dp="0"}} 2.5 1700000000000\n'
        f'{name}{{rank="2",phase="all",dp="0"}} 3.5 -99999999999999999\n'
        "# scrape_ts=1e300\n"
        f'{name}{{rank="3",phase="all",dp="0"}} 4.5\n'
    )
    res = cli("ingest", f, "--db", tmp_path / "p.duckdb")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr  # 1: salvaged, see Exit codes
    db = tmp_path / "p.duckdb"
    assert rows(db, "SELECT status, rows_seen, rows_kept, rows_dropped FROM sources") == [("salvaged", 4, 2, 2)]
    assert rows(db, "SELECT value, ts_ns FROM metric_sample_rows ORDER BY value") == [
        (2.5, 1_700_000_000_000_000_000),
        (4.5, None),
    ]


@pytest.mark.parametrize("value", ["1e300", "inf", "99999999999999"])
def test_4_a_huge_query_timeout_means_no_limit(tmp_path, value):
    db = tmp_path / "q.duckdb"
    assert cli("ingest", EP4, "--db", db, "-q").returncode == 0
    res = cli("query", "ep-slow-rank", "--db", db, env={"SLOWCARD_QUERY_TIMEOUT": value})
    assert res.returncode == 1 and "Traceback" not in res.stderr and "ep-slow-rank@" in res.stdout, res.stderr
