"""The deployment files (compose, Dockerfile, Prometheus, Grafana, k8s) as the deploy tests
read them, and the metric names their PromQL queries select.

``deploy/k8s/monitoring/prometheusrule.yaml`` is rendered from ``deploy/prometheus/alerts.yml``
by ``prometheus_rule_manifest``; after changing the alerts, regenerate it with

    PYTHONPATH=tests python -m support.deploy_files > deploy/k8s/monitoring/prometheusrule.yaml
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
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
# Prometheus Operator resources: a kustomization of their own, outside the base (the CRDs may
# be absent from a cluster).
MONITORING = K8S / "monitoring"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
SERVICE_MONITOR = MONITORING / "servicemonitor.yaml"
PROMTOOL_TESTS = REPO / "tests" / "unit" / "promtool"


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: its keyword (upper case) and its arguments as written."""

    keyword: str
    arguments: str

    def words(self) -> list[str]:
        """The arguments split as a shell would (COPY sources and destination, ENV pairs)."""
        return shlex.split(self.arguments)


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[Instruction]:
    """The instructions of a Dockerfile, continuation lines joined and comments left out."""
    instructions = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1].strip() + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
        pending = ""
    assert not pending, f"{path} ends inside a continued instruction"
    return instructions


def dockerfile_install_steps(path: Path = DOCKERFILE) -> list[str]:
    """The RUN steps that install and check kp-scorer: every RUN after the first COPY (those
    before it only prepare the image, e.g. its user). `.ci/production-install` runs exactly
    these, in a fresh virtual environment."""
    instructions = dockerfile_instructions(path)
    first_copy = next(i for i, ins in enumerate(instructions) if ins.keyword == "COPY")
    return [ins.arguments for ins in instructions[first_copy:] if ins.keyword == "RUN"]


def dockerfile_env(path: Path = DOCKERFILE) -> dict[str, str]:
    """Every variable the Dockerfile's ENV instructions set (KEY=VALUE form)."""
    env = {}
    for instruction in dockerfile_instructions(path):
        if instruction.keyword == "ENV":
            for pair in instruction.words():
                name, _, value = pair.partition("=")
                env[name] = value
    return env


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def k8s_documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def monitoring_documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(MONITORING.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def k8s(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for d in k8s_documents() + monitoring_documents()
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


# -- PromQL -------------------------------------------------------------------------------
GRAFANA_INTERVALS = re.compile(r"\$__(rate_interval|interval|range)\b")
LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.+),\s*\w+\s*\)\s*$")


def promql_nodes(expr: str) -> Iterator[Any]:
    """Every node of a PromQL expression, parsed (so a syntax error fails loudly).

    Grafana's interval variables become a duration; ``label_values(selector, label)`` (a
    Grafana template query) stands for its selector.
    """
    expr = GRAFANA_INTERVALS.sub("5m", expr)
    match = LABEL_VALUES.match(expr)
    if match:
        expr = match["selector"]
    try:
        root = promql_parser.parse(expr)
    except ValueError as exc:
        raise AssertionError(f"invalid PromQL {expr!r}: {exc}") from None

    def walk(node: Any) -> Iterator[Any]:
        yield node
        for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
            child = getattr(node, attr, None)
            if isinstance(child, promql_parser.Expr):
                yield from walk(child)
        for arg in getattr(node, "args", None) or ():
            yield from walk(arg)

    return walk(root)


def promql_selectors(expr: str) -> list[Any]:
    """The vector selectors of a PromQL expression (each with ``name`` and ``matchers``)."""
    selectors = [n for n in promql_nodes(expr) if isinstance(n, promql_parser.VectorSelector)]
    for selector in selectors:
        assert selector.name, f"selector without a metric name in {expr!r}"
    return selectors


def promql_metric_names(expr: str) -> set[str]:
    """Metric names selected by a PromQL expression."""
    return {selector.name for selector in promql_selectors(expr)}


def promql_label_matchers(expr: str) -> set[tuple[str, str, str]]:
    """(metric, label, value) of every label matcher in a PromQL expression."""
    return {
        (selector.name, matcher.name, matcher.value)
        for selector in promql_selectors(expr)
        for matcher in selector.matchers.matchers
    }


def promql_numbers(expr: str) -> set[float]:
    """Number literals of a PromQL expression (function parameters included)."""
    return {n.val for n in promql_nodes(expr) if isinstance(n, promql_parser.NumberLiteral)}


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
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation:
            queries.append(annotation["expr"])
    return queries


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


class _BlockStrings(yaml.SafeDumper):
    """Multi-line strings (PromQL expressions) as ``|`` blocks, as they are in alerts.yml."""


_BlockStrings.add_representer(
    str,
    lambda dumper, value: dumper.represent_scalar(
        "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None
    ),
)


def prometheus_rule_manifest() -> str:
    """deploy/k8s/monitoring/prometheusrule.yaml: the groups of alerts.yml as a PrometheusRule."""
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "kp-scorer", "labels": {"app.kubernetes.io/name": "kp-scorer"}},
        "spec": {"groups": load_yaml(ALERTS)["groups"]},
    }
    header = (
        "# The alert rules of deploy/prometheus/alerts.yml for the Prometheus Operator. Generated\n"
        "# from that file (tests/support/deploy_files.py says how); do not edit by hand:\n"
        "# tests/unit/test_alert_rules.py fails when the two differ. The comments on each rule\n"
        "# are in alerts.yml. A Prometheus that selects rules by label (ruleSelector) needs its\n"
        "# label added in an overlay, e.g. `release: <name>` for kube-prometheus-stack.\n"
    )
    body = yaml.dump(rule, Dumper=_BlockStrings, sort_keys=False, width=100, allow_unicode=True)
    return header + body


def autoscaler_queries() -> list[str]:
    scaled = k8s("ScaledObject")
    return [t["metadata"]["query"] for t in scaled["spec"]["triggers"] if t["type"] == "prometheus"]


if __name__ == "__main__":
    sys.stdout.write(prometheus_rule_manifest())
