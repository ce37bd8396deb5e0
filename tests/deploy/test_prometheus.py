"""The Prometheus alert rules and the Grafana dashboard in deploy/: promtool accepts them, the rule
unit tests pass, and every metric they use is one the sidecar exports (a rename breaks this)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy._tools import (
    CHART,
    DEPLOY,
    describe,
    grafana_query_metric_names,
    promql_metric_names,
    run,
    tool,
    unknown_metric_names,
)

ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERTS_TEST = DEPLOY / "prometheus" / "alerts_test.yml"
DASHBOARD = DEPLOY / "grafana" / "kafka-tiered-sidecar.json"

# Series the rules and the dashboard may use that the sidecar does not export itself.
EXTERNAL_METRICS = {"up"}  # Prometheus' own scrape health


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_panels() -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    for panel in dashboard()["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # panels of collapsed rows
    return panels


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target."""
    return [
        (f"panel {panel['id']} {panel['title']!r} target {target['refId']}", target["expr"])
        for panel in dashboard_panels()
        for target in panel.get("targets", [])
    ]


def as_plain_promql(expr: str) -> str:
    """The dashboard's PromQL with Grafana's variables replaced by values promtool accepts."""
    for variable, value in {
        "$__rate_interval": "5m",
        "$__interval": "1m",
        "$__range": "1h",
        "$job": ".*",
        "$instance": ".*",
        "$topic": ".*",
    }.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unhandled Grafana variable in {expr!r}"
    return expr


class TestAlertRules:
    """The alert rules of deploy/prometheus/alerts.yml and their unit tests."""

    def test_promtool_check_rules(self):
        """promtool accepts the rule file."""
        result = run([tool("promtool"), "check", "rules", str(ALERTS)])
        assert result.returncode == 0, describe(result)
        assert "SUCCESS" in result.stdout, describe(result)

    def test_promtool_rule_unit_tests_pass(self):
        """The unit tests in alerts_test.yml pass: each alert fires, and its look-alike does not."""
        result = run([tool("promtool"), "test", "rules", ALERTS_TEST.name], cwd=ALERTS_TEST.parent)
        assert result.returncode == 0, describe(result)
        assert "SUCCESS" in result.stdout, describe(result)

    def test_every_alert_has_a_unit_test(self):
        """Each alert name appears in an alert_rule_test of alerts_test.yml."""
        tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
        tested = {case["alertname"] for test in tests for case in test["alert_rule_test"]}
        assert {rule["alert"] for rule in alert_rules()} <= tested

    def test_metric_names_exist_in_the_sidecar(self):
        """Every metric in an alert expression is exported by ``Metrics`` (or is ``up``)."""
        used = {name for rule in alert_rules() for name in promql_metric_names(rule["expr"])}
        assert used, "no metric names found in the rules"
        assert not unknown_metric_names(used, external=EXTERNAL_METRICS)

    def test_alerts_cover_the_issue(self):
        """The rules alert on down, not ready, copy lag, upload errors, quarantine and metadata."""
        names = {rule["alert"] for rule in alert_rules()}
        assert {
            "KafkaTieredSidecarDown",
            "KafkaTieredSidecarNotReady",
            "KafkaTieredSidecarCopyLagGrowing",
            "KafkaTieredSidecarCopyLagTooOld",
            "KafkaTieredSidecarUploadErrors",
            "KafkaTieredSidecarQuarantinedSegments",
            "KafkaTieredSidecarMetadataUndecodableRecords",
        } <= names

    @pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: r["alert"])
    def test_alert_has_severity_and_text(self, rule):
        """Each alert routes by severity and explains itself in a summary and a description."""
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"].strip()
        assert rule["annotations"]["description"].strip()

    def test_chart_readme_names_every_alert(self):
        """The chart README's list of the alerts its PrometheusRule installs is complete."""
        readme = (CHART / "README.md").read_text()
        missing = {rule["alert"] for rule in alert_rules()} - set(re.findall(r"`(\w+)`", readme))
        assert not missing, f"helm/kafka-tiered-sidecar/README.md does not name {sorted(missing)}"

    def test_chart_copy_is_identical(self):
        """The Helm chart ships the same rules (files/alerts.yml) as its PrometheusRule."""
        copy = CHART / "files" / "alerts.yml"
        assert copy.read_bytes() == ALERTS.read_bytes(), (
            f"{copy} differs from {ALERTS}; copy it: cp {ALERTS} {copy}"
        )


class TestDashboard:
    """The Grafana dashboard deploy/grafana/kafka-tiered-sidecar.json."""

    def test_identity_and_datasource_variable(self):
        """The dashboard has a stable uid and picks its Prometheus through a variable."""
        data = dashboard()
        assert data["uid"] == "kafka-tiered-sidecar"
        assert data["title"]
        variables = {v["name"]: v for v in data["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"

    def test_panels_are_well_formed(self):
        """Panel ids are unique, panels fit the 24-column grid, targets use the variable."""
        panels = dashboard_panels()
        ids = [panel["id"] for panel in panels]
        assert len(ids) == len(set(ids))
        for panel in panels:
            grid = panel["gridPos"]
            assert grid["x"] >= 0, panel["title"]
            assert grid["x"] + grid["w"] <= 24, panel["title"]
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
            refs = [target["refId"] for target in panel["targets"]]
            assert len(refs) == len(set(refs)), panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", panel["title"]

    def test_metric_names_exist_in_the_sidecar(self):
        """Every metric in a panel or variable query is exported by ``Metrics`` (or is ``up``)."""
        used: set[str] = set()
        for _, expr in dashboard_exprs():
            used |= promql_metric_names(expr)
        for variable in dashboard()["templating"]["list"]:
            if variable["type"] == "query":
                used |= grafana_query_metric_names(variable["query"]["query"])
        assert used
        assert not unknown_metric_names(used, external=EXTERNAL_METRICS)

    def test_queries_are_valid_promql(self, tmp_path: Path):
        """promtool parses every panel query (as recording rules, with variables substituted)."""
        rules = [
            {"record": f"dashboard:query_{index}", "expr": as_plain_promql(expr)}
            for index, (_, expr) in enumerate(dashboard_exprs())
        ]
        path = tmp_path / "dashboard-queries.yml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
        result = run([tool("promtool"), "check", "rules", str(path)])
        assert result.returncode == 0, describe(result)

    def test_queries_filter_by_job_and_instance(self):
        """Every series a panel query reads is selected by the job and instance variables: a
        metric without a selector would sum every sidecar Prometheus scrapes."""
        exprs = dashboard_exprs()
        assert exprs
        for where, expr in exprs:
            names = promql_metric_names(expr)
            assert names, where
            for name in names:
                uses = re.findall(
                    rf"(?<![\w:]){re.escape(name)}(?![\w:])\s*(\{{[^{{}}]*\}})?", expr
                )
                assert uses, (where, name)
                for selector in uses:
                    assert 'job=~"$job"' in selector, (where, name)
                    assert 'instance=~"$instance"' in selector, (where, name)
