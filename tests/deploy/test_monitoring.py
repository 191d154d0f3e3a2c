"""The Prometheus alert rules and the Grafana dashboard in deploy/ are valid, checked with
Prometheus' own promtool (Debian's `prometheus` package, installed by scripts/setup-test.sh).
That every metric they name is one a running server exports is checked against a real
server by crates/peregrine/tests/operations.rs."""

import json
import shutil
import subprocess
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yaml"
RULE_TESTS = DEPLOY / "prometheus" / "alerts_test.yaml"
DASHBOARD = DEPLOY / "grafana" / "peregrine.json"


def promtool(*args):
    tool = shutil.which("promtool")
    assert tool, "promtool not found: run scripts/setup-test.sh (Debian's prometheus package)"
    return subprocess.run([tool, *args], capture_output=True, text=True, check=False)


def test_the_alert_rules_are_valid():
    run = promtool("check", "rules", str(RULES))
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_alerts_fire_when_they_should():
    run = promtool("test", "rules", str(RULE_TESTS))
    assert run.returncode == 0, run.stdout + run.stderr


def test_promtool_rejects_a_broken_rule(tmp_path):
    broken = tmp_path / "alerts.yaml"
    broken.write_text(RULES.read_text().replace("> 0.01", "> > 0.01", 1))
    run = promtool("check", "rules", str(broken))
    assert run.returncode != 0


def test_every_dashboard_query_is_valid_promql(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert len(exprs) >= 20
    # promtool checks PromQL inside rules: each query becomes a recording rule, with
    # Grafana's variables replaced by what they expand to.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e.replace("$__rate_interval", "1m").replace("$model", ".*").replace("$stream", ".*")}
        for i, e in enumerate(exprs)
    ]}]}
    path = tmp_path / "dashboard-queries.json"
    path.write_text(json.dumps(rules))  # JSON is YAML
    run = promtool("check", "rules", str(path))
    assert run.returncode == 0, run.stdout + run.stderr
