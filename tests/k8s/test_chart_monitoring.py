"""The chart's monitoring extras, both off by default: the PrometheusRule alerts (promtool checks
them and its unit tests, ``prometheus_rules_test.yaml`` beside this file, prove each alert fires on
a synthetic series and stays quiet below its threshold) and the Grafana dashboard ConfigMap (valid
JSON whose queries name only metrics the programs define).

promtool is Debian's ``prometheus`` package; ``.ci/run`` installs it when it runs as root.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

import authstore.metrics  # noqa: F401  (registers the store's metrics)
import proxy.metrics  # noqa: F401  (registers the proxy's metrics)
from tests.support.chart_support import NAMESPACE, lint, render, validate

FULLNAME = "rg-raftgate"
HERE = Path(__file__).resolve().parent
RULES_TEST = HERE / "prometheus_rules_test.yaml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`; .ci/run installs it as root)"
)
METRIC = re.compile(r"\braftgate_[a-z0-9_]+")
#: Labels Prometheus (the Operator's ServiceMonitor) puts on every scraped series, and histograms' le.
TARGET_LABELS = {"namespace", "service", "pod", "instance", "job", "endpoint", "container", "le"}

RULES_ON = {"metrics": {"prometheusRule": {"enabled": True}}}
DASHBOARD_ON = {"metrics": {"dashboard": {"enabled": True}}}


def defined_series() -> dict[str, set[str]]:
    """Every series name the two programs can export → its label names (histograms: with le)."""
    out: dict[str, set[str]] = {}
    for name, collector in REGISTRY._names_to_collectors.items():  # type: ignore[attr-defined]
        if name.startswith("raftgate_"):
            labels = set(getattr(collector, "_labelnames", ()))
            if name.endswith("_bucket"):
                labels.add("le")
            out[name] = labels
    return out


def check_queries(exprs: list[str]) -> None:
    """Every metric a query names is defined, and every label it matches on is one that series has."""
    series = defined_series()
    used: set[str] = set()
    for expr in exprs:
        for m in METRIC.finditer(expr):
            name = m.group(0)
            assert name in series, f"{name} (in {expr!r}) is not a metric either program defines"
            used.add(name)
            rest = expr[m.end():]
            if rest.startswith("{"):
                matchers = rest[1:rest.index("}")]
                for label in re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=)", matchers):
                    assert label in series[name] | TARGET_LABELS, f"{name} has no label {label} ({expr!r})"
    assert used, "no query names a raftgate metric"


def rule(values: dict[str, Any] | None = None) -> dict[str, Any]:
    r = render(values or RULES_ON)
    (doc,) = r.all("PrometheusRule")
    return doc


def alerts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in doc["spec"]["groups"] for r in g["rules"] if "alert" in r]


def test_rules_and_dashboard_are_off_by_default() -> None:
    r = render({})
    assert not r.all("PrometheusRule")
    assert not [c for c in r.all("ConfigMap") if "grafana_dashboard" in c["metadata"].get("labels", {})]
    both = {"metrics": {"enabled": False, "prometheusRule": {"enabled": True}, "dashboard": {"enabled": True}}}
    assert not render(both).all("PrometheusRule"), "no metrics served: nothing to alert on"
    assert not render({"deploy": False, **RULES_ON}).all("PrometheusRule")


def test_prometheus_rule_validates_and_covers_the_auth_and_raft_alerts() -> None:
    doc = rule({"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}}}})
    validate(doc)
    assert doc["metadata"]["name"] == FULLNAME
    assert doc["metadata"]["namespace"] == NAMESPACE
    assert doc["metadata"]["labels"]["release"] == "prometheus"
    names = {a["alert"] for a in alerts(doc)}
    assert names == {
        "RaftgateAuthenticationFailureBurst", "RaftgateNoLeader", "RaftgateLeaderFlapping", "RaftgateApplyLag",
        "RaftgateWalFsyncSlow", "RaftgateNoSpace",
    }
    for a in alerts(doc):
        assert a["labels"]["severity"] in ("warning", "critical"), a
        assert a["annotations"]["summary"] and a["annotations"]["description"], a
        # Scoped to this release's targets: another release's series never fire these alerts.
        assert f'namespace="{NAMESPACE}"' in a["expr"] and FULLNAME in a["expr"], a["expr"]
    check_queries([a["expr"] for a in alerts(doc)])
    other = rule({"metrics": {"prometheusRule": {"enabled": True, "namespace": "monitoring",
                                                 "selector": 'job="raftgate"'}}})
    assert other["metadata"]["namespace"] == "monitoring"
    assert all('{job="raftgate"' in a["expr"] or ',job="raftgate"' in a["expr"] for a in alerts(other))


@needs_promtool
def test_promtool_checks_the_rules_and_its_unit_tests_fire_every_alert(tmp_path: Path) -> None:
    doc = rule()
    rules_file = tmp_path / "raftgate-rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}, sort_keys=False))
    check = subprocess.run([PROMTOOL, "check", "rules", str(rules_file)], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr

    unit = yaml.safe_load(RULES_TEST.read_text())
    assert unit["rule_files"] == [rules_file.name]
    tested = {t["alertname"] for case in unit["tests"] for t in case.get("alert_rule_test", [])
              if t.get("exp_alerts")}
    assert tested == {a["alert"] for a in alerts(doc)}, "every alert needs a unit test that fires it"
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    test = subprocess.run([PROMTOOL, "test", "rules", RULES_TEST.name], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert test.returncode == 0, test.stdout + test.stderr


def dashboard_configmap(values: dict[str, Any] | None = None) -> dict[str, Any]:
    r = render(values or DASHBOARD_ON)
    found = [c for c in r.all("ConfigMap") if c["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert len(found) == 1, found
    return found[0]


def panel_exprs(dashboard: dict[str, Any]) -> dict[str, list[str]]:
    """Panel title → its query expressions (rows' nested panels included)."""
    out: dict[str, list[str]] = {}
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        exprs = [t["expr"] for t in panel.get("targets", []) if t.get("expr")]
        if exprs:
            out[panel["title"]] = exprs
    return out


def test_dashboard_configmap_holds_a_dashboard_of_the_auth_path() -> None:
    cm = dashboard_configmap({"metrics": {"dashboard": {"enabled": True, "labels": {"team": "db"}}}})
    validate(cm)
    assert cm["metadata"]["labels"]["team"] == "db"
    (name,) = cm["data"]
    assert name.endswith(".json")
    dashboard = json.loads(cm["data"][name])
    assert dashboard["title"] and dashboard["uid"]
    exprs = panel_exprs(dashboard)
    joined = "\n".join(e for es in exprs.values() for e in es)
    for metric in ("raftgate_proxy_authentications_total", "raftgate_proxy_permission_denials_total",
                   "raftgate_store_permission_denials_total", "raftgate_proxy_bcrypt_queue_depth",
                   "raftgate_proxy_bcrypt_duration_seconds_bucket", "raftgate_proxy_token_validations_total",
                   "raftgate_store_is_leader", "raftgate_store_leader_changes_total",
                   "raftgate_store_apply_lag_entries", "raftgate_store_wal_fsync_duration_seconds_bucket"):
        assert metric in joined, f"the dashboard shows no {metric}"
    check_queries([e for es in exprs.values() for e in es])
    # Every query goes to the dashboard's data source variable, so it works on any Grafana.
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert "namespace" in variables


def test_helm_lint_is_clean_with_rules_and_dashboard() -> None:
    values = {"metrics": {"prometheusRule": {"enabled": True}, "dashboard": {"enabled": True}},
              "commonAnnotations": {"owner": "db-team"}}
    report = lint(values)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    for doc in render(values).docs:
        validate(doc)
