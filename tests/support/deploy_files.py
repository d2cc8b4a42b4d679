"""The deployment files (compose, Dockerfile, Prometheus, Grafana, k8s) as the deploy tests
read them, and the metric names their PromQL queries select."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import yaml

from support.paths import REPO

COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
PROMETHEUS = REPO / "deploy" / "prometheus" / "prometheus.yml"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "kp-scorer.json"
GRAFANA_DATASOURCES = (
    REPO / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
)
GRAFANA_DASHBOARDS = REPO / "deploy" / "grafana" / "provisioning" / "dashboards" / "dashboards.yml"
K8S = REPO / "deploy" / "k8s"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def k8s_documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def k8s(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for d in k8s_documents()
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


# -- PromQL -------------------------------------------------------------------------------
GRAFANA_INTERVALS = re.compile(r"\$__(rate_interval|interval|range)\b")
LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.+),\s*\w+\s*\)\s*$")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names selected by a PromQL expression (parsed, so a syntax error fails loudly).

    Grafana's interval variables become a duration; ``label_values(selector, label)`` (a
    Grafana template query) contributes its selector.
    """
    expr = GRAFANA_INTERVALS.sub("5m", expr)
    match = LABEL_VALUES.match(expr)
    if match:
        expr = match["selector"]
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"selector without a metric name in {expr!r}"
            names.add(node.name)
            return
        for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
            child = getattr(node, attr, None)
            if isinstance(child, promql_parser.Expr):
                walk(child)
        for arg in getattr(node, "args", None) or ():
            walk(arg)

    try:
        walk(promql_parser.parse(expr))
    except ValueError as exc:
        raise AssertionError(f"invalid PromQL {expr!r}: {exc}") from None
    return names


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            queries.append(query["query"] if isinstance(query, dict) else query)
    return queries


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def autoscaler_queries() -> list[str]:
    scaled = k8s("ScaledObject")
    return [t["metadata"]["query"] for t in scaled["spec"]["triggers"] if t["type"] == "prometheus"]
