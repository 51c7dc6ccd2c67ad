"""`slowcard watch --serve HOST:PORT` (issue 45): the current verdicts as Prometheus metrics, read
by prometheus_client's own parser and scraped by a real Prometheus, with the alert rule and the
Grafana dashboard of docs/prometheus/ loaded in it.

Every process started here stops by itself (--duration) and is killed in a finally."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prom_server import NO_PROMETHEUS, NO_PROMTOOL, PROMETHEUS, PROMTOOL, Prometheus
from prometheus_client.parser import text_string_to_metric_families
from sim_procs import Sims

from slowcard import queries
from slowcard.errors import UsageError
from slowcard.exporter import Exporter, parse_host_port
from slowcard.verdict import evaluate
from slowcard.watch import Step, http_get

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "prometheus"
QUERY = "dp-metrics-imbalance"


def result(rows):
    q = queries.load_catalog()[QUERY]
    return queries.Result(
        query=q.name,
        version=q.version,
        run="live",
        status=evaluate(rows, q.rule),
        summary="",
        params={},
        rule=q.rule_text,
        spec=q,
        rows=rows,
    )


def samples(text: str) -> dict:
    """(metric, frozenset of labels) -> value, as prometheus_client's parser reads the text."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def key(name, subject="", cause="", query=QUERY):
    return (name, frozenset({"run": "live", "query": query, "subject": subject, "cause": cause}.items()))


def test_served_metrics_parse_and_follow_the_verdicts():
    exp = Exporter("live", "127.0.0.1", 0)
    try:
        assert exp.port > 0
        hot = [
            {"dp_rank": 2, "latency_rising": 1, "cause": "hot DP domain", "cost_pct": 12.5},
            {"dp_rank": 1, "latency_rising": 0, "cause": "busier DP domain"},
        ]
        exp.update(
            Step(
                ts_ns=1_800_000_000_000_000_000,
                windows=[{"ts_ns": 1_799_999_990_000_000_000}],
                results={QUERY: result(hot)},
            )
        )
        got = samples(http_get(exp.url, 2.0).body)
        assert got[key("slowcard_verdict")] == 2  # the query's status: FAIL
        assert got[key("slowcard_verdict", "DP domain 2", "hot DP domain")] == 2
        assert got[key("slowcard_verdict", "DP domain 1", "busier DP domain")] == 1  # WARN
        assert got[key("slowcard_cost_pct", "DP domain 2", "hot DP domain")] == 12.5
        assert key("slowcard_cost_pct", "DP domain 1", "busier DP domain") not in got  # no cost given
        run = frozenset({"run": "live"}.items())
        assert got[("slowcard_last_window_timestamp_seconds", run)] == pytest.approx(1_799_999_990.0)
        assert got[("slowcard_last_judged_timestamp_seconds", run)] == pytest.approx(1_800_000_000.0)
        # a step that judged nothing (database busy) keeps the verdicts; a PASS clears the findings
        exp.update(Step(ts_ns=1))
        assert samples(exp.text()) == got
        exp.update(Step(ts_ns=1_800_000_015_000_000_000, results={QUERY: result([])}))
        cooled = samples(exp.text())
        assert cooled[key("slowcard_verdict")] == 0
        assert not [k for k in cooled if dict(k[1]).get("subject")]
    finally:
        exp.close()


def test_serve_address_is_checked():
    assert parse_host_port("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_host_port("[::1]:0") == ("::1", 0)
    for bad in ("9464", "127.0.0.1", "127.0.0.1:http", ":9464", "h:70000"):
        with pytest.raises(UsageError, match="expected HOST:PORT"):
            parse_host_port(bad)
    exp = Exporter("live", "127.0.0.1", 0)
    try:
        with pytest.raises(UsageError, match="cannot listen there"):
            Exporter("live", "127.0.0.1", exp.port)  # taken
    finally:
        exp.close()


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_checks_and_unit_tests_the_alert_rule():
    check = subprocess.run(
        [PROMTOOL, "check", "rules", str(DOCS / "slowcard-alerts.yml")], capture_output=True, text=True
    )
    assert check.returncode == 0 and "SUCCESS: 3 rules found" in check.stdout, check.stdout + check.stderr
    unit = subprocess.run(
        [PROMTOOL, "test", "rules", "slowcard-alerts.test.yml"], cwd=DOCS, capture_output=True, text=True
    )
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr


def dashboard_exprs() -> list[str]:
    dash = json.loads((DOCS / "slowcard-dp-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
    return [e.replace("$job", ".*").replace("$__rate_interval", "5s") for e in exprs]


@pytest.mark.skipif(PROMETHEUS is None, reason=NO_PROMETHEUS)
def test_a_real_prometheus_scrapes_the_watch_and_the_rule_fires(tmp_path):
    sims = Sims()
    watch = None
    prom = None
    try:
        sim_port = sims.start("--hot-engine", "3", duration=60)
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        watch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "slowcard",
                "watch",
                "--scrape",
                f"http://127.0.0.1:{sim_port}/metrics",
                "--interval",
                "1s",
                "--duration",
                "50s",
                "--db",
                str(tmp_path / "live.duckdb"),
                "--run",
                "live",
                "--serve",
                "127.0.0.1:0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(watch.stderr.readline()), daemon=True)
        reader.start()
        reader.join(30)
        m = re.search(r"on (http://127\.0\.0\.1:(\d+)/metrics)", first[0] if first else "")
        assert m, first
        prom = Prometheus(
            tmp_path, [f"127.0.0.1:{m.group(2)}", f"127.0.0.1:{sim_port}"], [DOCS / "slowcard-alerts.yml"]
        )
        fail = prom.wait_for(f'slowcard_verdict{{query="{QUERY}", subject="DP domain 3"}} == 2', bound_s=40)
        assert fail and fail[0]["metric"]["cause"], "the scraped verdicts never named DP domain 3"
        # the alert rule, loaded from docs/, is evaluated on the scraped series (pending: for 2m)
        pending = prom.wait_for('ALERTS{alertname="SlowcardSlowCard", subject="DP domain 3"}', bound_s=10)
        assert pending and pending[0]["metric"]["alertstate"] in ("pending", "firing")
        groups = prom.api("rules")["data"]["groups"]
        assert [(r["name"], r["health"]) for g in groups for r in g["rules"]] == [
            ("SlowcardSlowCard", "ok"),
            ("SlowcardSlowCardWarning", "ok"),
            ("SlowcardStale", "ok"),
        ]
        # every PromQL of the Grafana dashboard runs on the real server; the DP panels have every domain
        for expr in dashboard_exprs():
            assert prom.api("query", query=expr).get("status") == "success", expr
        exprs = dashboard_exprs()
        for expr in (exprs[0], exprs[1], exprs[4]):  # requests running / waiting, KV usage: per DP domain
            assert {r["metric"]["engine"] for r in prom.query(expr)} == {"0", "1", "2", "3"}, expr
    finally:
        if prom is not None:
            prom.close()
        if watch is not None:
            watch.kill()
            watch.wait(10)
            watch.stderr.close()
        sims.close()
