"""The shipped Prometheus rules and Grafana dashboard name only metrics that exist.

promtool is not available here, so this reads the files and checks every metric, recording
rule, label matcher, grouping label and legend placeholder against a live :class:`Metrics`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.observability.metrics import OUTCOMES, STAGES, STATUSES, TOKEN_KINDS, WRITE_OUTCOMES, Metrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAME = re.compile(r"\bsmartcache[a-zA-Z0-9_:]*")
SELECTOR = re.compile(r"\b(smartcache_[a-z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
GROUPING = re.compile(r"\bby\s*\(([^)]*)\)")
AGGREGATION = re.compile(r"\b(sum|avg|min|max|count|topk|bottomk|quantile)\b\s*(by\s*\([^)]*\)\s*)?\(")
LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
CLOSED_VALUES = {"status": STATUSES, "outcome": OUTCOMES + WRITE_OUTCOMES, "kind": TOKEN_KINDS, "stage": STAGES}


@pytest.fixture(scope="module")
def series_labels() -> dict[str, set[str]]:
    """Sample name -> label names, from a Metrics where every metric has a series."""
    metrics = Metrics()
    metrics.observe_request("hit", "travel", "accept_zone", 0.01)
    metrics.eviction("ttl")
    metrics.upstream_error("timeout")
    labels: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text(encoding="utf-8"))
    return [rule for group in data["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def recorded(rules: list[dict[str, Any]]) -> dict[str, str]:
    return {rule["record"]: rule["expr"] for rule in rules if "record" in rule}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data = json.loads((DEPLOY / "grafana" / "dashboards" / "smartcache.json").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_targets(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (target["expr"], target.get("legendFormat", ""))
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


def labels_of(expr: str, series: dict[str, set[str]], recorded: dict[str, str]) -> set[str]:
    """Labels the result of ``expr`` carries: its grouping labels if it aggregates, else its inputs'."""
    if AGGREGATION.search(expr):
        return {label.strip() for group in GROUPING.findall(expr) for label in group.split(",")} - {"le", ""}
    found: set[str] = set()
    for name in NAME.findall(expr):
        found |= labels_of(recorded[name], series, recorded) if ":" in name else series[name]
    return found


def check_expr(expr: str, series: dict[str, set[str]], recorded: dict[str, str]) -> None:
    assert expr.count("(") == expr.count(")") and expr.count("[") == expr.count("]"), expr
    inputs: set[str] = set()
    for name in NAME.findall(expr):
        if ":" in name:
            assert name in recorded, f"{expr!r} uses recording rule {name}, which rules.yml does not define"
            inputs |= labels_of(recorded[name], series, recorded)
        else:
            assert name in series, f"{expr!r} uses {name}, which proxy.observability.metrics does not expose"
            inputs |= series[name]
    for name, matchers in SELECTOR.findall(expr):
        for label, op, value in MATCHER.findall(matchers):
            assert label in series[name], f"{name} has no label {label!r}"
            if op == "=" and label in CLOSED_VALUES:
                assert value in CLOSED_VALUES[label], f"{name}{{{label}={value!r}}} can never match"
    for group in GROUPING.findall(expr):
        for label in filter(None, (part.strip() for part in group.split(","))):
            assert label in inputs | {"le"}, f"{expr!r} groups by {label!r}, which its inputs lack"


def test_every_documented_metric_is_exposed(series_labels: dict[str, set[str]]) -> None:
    for name in (
        "smartcache_requests_total",
        "smartcache_hits_judged_total",
        "smartcache_saved_tokens_total",
        "smartcache_upstream_cached_tokens_total",
        "smartcache_stage_seconds_bucket",
        "smartcache_request_seconds_bucket",
        "smartcache_records",
        "smartcache_index_size",
        "smartcache_writes_total",
        "smartcache_evictions_total",
        "smartcache_upstream_errors_total",
    ):
        assert name in series_labels


def test_rules_name_only_existing_metrics_and_rules(
    rules: list[dict[str, Any]], recorded: dict[str, str], series_labels: dict[str, set[str]]
) -> None:
    assert len(recorded) == len([rule for rule in rules if "record" in rule]), "a rule is recorded twice"
    for rule in rules:
        check_expr(rule["expr"], series_labels, recorded)


def test_rules_include_the_four_numbers(recorded: dict[str, str]) -> None:
    for name in (
        "smartcache:hit_rate:rate5m",
        "smartcache:precision_hit:rate1h",
        "smartcache:cache_pollution:rate1h",
        "smartcache:saved_tokens:rate5m",
    ):
        assert name in recorded
    for name in recorded:
        assert re.fullmatch(r"smartcache:[a-z0-9_]+:[a-z0-9_]+", name), f"{name} is not level:metric:operation"


def test_alerts_are_complete(rules: list[dict[str, Any]]) -> None:
    alerts = [rule for rule in rules if "alert" in rule]
    assert alerts
    for alert in alerts:
        assert {"expr", "labels", "annotations"} <= set(alert) and "summary" in alert["annotations"]


def test_dashboard_names_only_existing_metrics_and_rules(
    dashboard: dict[str, Any], recorded: dict[str, str], series_labels: dict[str, set[str]]
) -> None:
    targets = dashboard_targets(dashboard)
    assert targets
    for expr, legend in targets:
        check_expr(expr, series_labels, recorded)
        for placeholder in LEGEND.findall(legend):
            assert placeholder in labels_of(expr, series_labels, recorded), f"{legend!r} on {expr!r}"


def test_dashboard_shows_hit_rate_precision_latency_and_savings(dashboard: dict[str, Any]) -> None:
    exprs = " ".join(expr for expr, _ in dashboard_targets(dashboard))
    for shown in (
        "smartcache:hit_rate:rate5m",
        "smartcache:precision_hit:rate1h",
        "smartcache:cache_pollution:rate1h",
        "smartcache:saved_tokens",
        "smartcache:request_seconds",
        "smartcache:stage_seconds",
        "smartcache:records:by_state",
    ):
        assert shown in exprs


def test_dashboard_layout_and_datasource(dashboard: dict[str, Any]) -> None:
    provisioned = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text(encoding="utf-8")
    )
    uid = provisioned["datasources"][0]["uid"]
    all_panels = list(panels(dashboard))
    assert len({panel["id"] for panel in all_panels}) == len(all_panels)
    boxes = []
    for panel in all_panels:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24
        boxes.append((box["x"], box["y"], box["x"] + box["w"], box["y"] + box["h"], panel["title"]))
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == uid
            assert all(target["datasource"]["uid"] == uid for target in panel["targets"])
    for i, (x0, y0, x1, y1, title) in enumerate(boxes):
        for a0, b0, a1, b1, other in boxes[i + 1 :]:
            assert x1 <= a0 or a1 <= x0 or y1 <= b0 or b1 <= y0, f"{title!r} overlaps {other!r}"


def test_prometheus_scrapes_smartcache_and_loads_the_rules() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "smartcache"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["smartcache:8080"]
    assert [Path(path).name for path in config["rule_files"]] == ["rules.yml"]


def test_dashboard_provider_points_at_a_directory() -> None:
    provider = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "smartcache.yml").read_text(encoding="utf-8")
    )
    (entry,) = provider["providers"]
    assert entry["type"] == "file" and entry["options"]["path"].startswith("/")
