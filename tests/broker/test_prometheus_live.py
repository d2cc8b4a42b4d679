"""The dashboard and the alert rules on a real Prometheus scraping a real worker.

Prometheus (the server of Debian's ``prometheus`` package; tests/support/debian.py) runs with
the compose configuration, deploy/prometheus/prometheus.yml, changed in three places only: the
scrape target (the worker's metrics port instead of Docker's DNS) and the scrape and rule
evaluation intervals (1 s, so a few seconds of traffic make rates). Its rule file is the
deployed alerts.yml, unchanged. The worker scores traces of two domains while Prometheus
scrapes it: accepted, rejected and dead-lettered ones.

Then every expression of every dashboard panel, variable and annotation, read from the
dashboard JSON as it is, is queried through Prometheus's HTTP API with Grafana's variables
set to "All" and must return a number, except the few listed in ``EMPTY_BY_DESIGN`` (each
says why), and every label it names must be on the series. So a renamed metric or label (a
panel reading "No data", or a blank legend) fails here. Every alert rule must evaluate with
health ``ok`` over metrics that exist, and stopping the broker must make
KpScorerBrokerUnreachable pending (its expression and ``for:`` as deployed).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson
import promql_parser
import pytest
import yaml

from worker.dev.embedded_broker import EmbeddedBroker
from worker.dev.process import WorkerProcess, free_loopback_port

from support.apache_kafka import ApacheKafka
from support.debian import debian_program
from support.deploy_files import (
    ALERTS,
    DASHBOARD,
    PROMETHEUS,
    alert_rules,
    load_yaml,
    promql_metric_names,
    promql_nodes,
    promql_selectors,
)
from support.fixtures import dedicated_broker
from support.kafka_helpers import create_topics, produce
from support.outputs import collect_outputs
from support.traces import make_trace
from support.workers import metric_total, worker_topics

pytestmark = pytest.mark.broker

T = TypeVar("T")
INTERVAL = "1s"  # scrape and rule evaluation
# Grafana's variables: every multi-value variable at "All" (its allValue), the interval
# variables as Grafana computes them for a 1 s scrape interval and the last 10 minutes.
GRAFANA_VARIABLES = {"__rate_interval": "15s", "__interval": "1s", "__range": "10m"}
LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.+),\s*(?P<label>\w+)\s*\)\s*$")
DOMAINS = ("finance", "code")  # two domains with profiles of their own: their own labels
WAVES = 3  # of traffic, a few seconds apart, so that rates over 15 s are not zero
# Metrics whose panels may read "No data" (or NaN) on this workload, each with why; any
# other expression without data (NaN alone counts as none) fails.
EMPTY_BY_DESIGN: dict[str, str] = {
    # Its p95 is NaN until a partition's novelty cache is rebuilt from its history, which
    # happens when a worker takes over a partition that already has records (a restart or
    # a rebalance); this workload starts from empty topics with one worker.
    "kp_cache_rebuild_seconds_bucket": "no cache rebuild in a single worker's first run",
}
# Exactly-once only: the worker runs with it where the broker is Apache Kafka.
TRANSACTION_METRICS = ("kp_transactions_total", "kp_transaction_commit_seconds_bucket")
# Labels that a healthy worker's series lack, by design; a ``by`` of them, or a matcher on
# them, is not flagged.
ABSENT_LABELS = {
    # kp_embedder_info{reason} says why there is no model: empty while the model is loaded,
    # and Prometheus stores no empty label. The "Embedder per worker" table shows it then.
    "reason": "kp_embedder_info",
}


# -- the dashboard's queries ------------------------------------------------------------------
@dataclass(frozen=True)
class DashboardQuery:
    where: str  # panel title and refId, variable or annotation name
    expr: str  # as written in the dashboard


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])  # a collapsed row holds its panels


def dashboard_queries() -> list[DashboardQuery]:
    """Every PromQL expression of the dashboard: panels (in collapsed rows too), query
    variables and annotations."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [
        DashboardQuery(f"panel {panel.get('title')!r} {target.get('refId', '')}", target["expr"])
        for panel in _panels(dashboard.get("panels", []))
        for target in panel.get("targets", [])
        if target.get("expr")
    ]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            expr = query["query"] if isinstance(query, dict) else query
            queries.append(DashboardQuery(f"variable {variable['name']}", expr))
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            queries.append(DashboardQuery(f"annotation {annotation['name']!r}", annotation["expr"]))
    return queries


def variable_values() -> dict[str, str]:
    """Grafana's variables as a dashboard opened with its defaults sets them."""
    dashboard = json.loads(DASHBOARD.read_text())
    values = dict(GRAFANA_VARIABLES)
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("includeAll"):
            values[variable["name"]] = variable.get("allValue") or ".*"
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's ``$name``, ``${name}`` and ``[[name]]`` replaced; an unknown one fails."""

    def value(match: re.Match[str]) -> str:
        name = match["a"] or match["b"] or match["c"]
        assert name in values, f"dashboard variable ${name} has no value here: {expr!r}"
        return values[name]

    return re.sub(r"\$\{(?P<a>\w+)(?::\w+)?\}|\$(?P<b>\w+)|\[\[(?P<c>\w+)\]\]", value, expr)


# -- Prometheus -------------------------------------------------------------------------------
class Prometheus:
    """A Prometheus server process on a loopback port, and its HTTP API."""

    def __init__(self, binary: Path, directory: Path, metrics_port: int) -> None:
        self.port = free_loopback_port()
        self.directory = directory
        config = load_yaml(PROMETHEUS)
        config["global"]["scrape_interval"] = INTERVAL
        config["global"]["evaluation_interval"] = INTERVAL
        (job,) = config["scrape_configs"]
        job.pop("dns_sd_configs")
        job["static_configs"] = [{"targets": [f"127.0.0.1:{metrics_port}"]}]
        (directory / PROMETHEUS.name).write_text(yaml.safe_dump(config, sort_keys=False))
        for rule_file in config["rule_files"]:  # relative to prometheus.yml, as in compose
            (directory / rule_file).write_bytes((PROMETHEUS.parent / rule_file).read_bytes())
        self.log_path = directory / "prometheus.log"
        self.command = [
            str(binary),
            f"--config.file={directory / PROMETHEUS.name}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Prometheus:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        wait_for(lambda: self.ready(), 60, "Prometheus ready", self.tail)
        return self

    def ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"Prometheus exited ({self.process.returncode}):\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a successful API answer; an error answer fails with its message."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = orjson.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = orjson.loads(exc.read() or b"{}")
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result = data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return result

    def series(self, selector: str) -> list[dict[str, str]]:
        return self.api("series", **{"match[]": selector, "start": str(time.time() - 600)})

    def alerts(self) -> list[dict[str, Any]]:
        return self.api("alerts")["alerts"]

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]


def wait_for(
    check: Callable[[], T], timeout: float, what: str, context: Callable[[], str] = str
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s\n{context()}")
        time.sleep(0.5)


# -- the workload -----------------------------------------------------------------------------
def traces(wave: int) -> list[tuple[bytes, bytes]]:
    """(key, value) of one wave: per domain, traces that pass and that fail the threshold,
    plus a record that is not JSON and one that breaks the schema (dead letters)."""
    records = []
    for domain in DOMAINS:
        for index, (success, confidence) in enumerate([(True, 0.95), (False, 0.2), (True, 0.4)]):
            document = make_trace(
                domain=domain,
                success=success,
                confidence=confidence,
                id=f"kp:trace:prom-{wave}-{domain}-{index}",
                objective=f"Wave {wave}: review the {domain} change number {index}",
            )
            records.append((f"{domain}-{index}".encode(), orjson.dumps(document)))
    records.append((b"bad-json", b"{not json"))
    records.append((b"bad-schema", orjson.dumps(make_trace(steps=[]))))
    return records


@dataclass
class Stack:
    broker: ApacheKafka | EmbeddedBroker
    worker: WorkerProcess
    prometheus: Prometheus
    decisions: set[str]

    def context(self) -> str:
        return f"worker log:\n{self.worker.tail()}\nPrometheus log:\n{self.prometheus.tail()}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Broker, worker and Prometheus, after a few waves of traffic have been scraped."""
    binary = debian_program("prometheus", "prometheus", "PROMETHEUS")
    directory = tmp_path_factory.mktemp("prometheus")
    # The outage test stops this broker, so it is the module's own, not the session's.
    with dedicated_broker() as broker:
        bootstrap = broker.bootstrap_servers
        env, outputs = worker_topics(
            "prom",
            1,
            KP_ACCEPT_THRESHOLD="0.45",
            KP_DOMAIN_THRESHOLDS=json.dumps({DOMAINS[0]: 0.5}),
            # The latency alerts read the budget from the worker: a generous one keeps them
            # quiet on a machine busy with other tests (the alert test expects exactly one).
            KP_LATENCY_BUDGET_SECONDS="5",
            # The transactions panel has data only with exactly-once, which Apache Kafka has.
            **(
                {"KP_PROCESSING_GUARANTEE": "exactly_once"}
                if isinstance(broker, ApacheKafka)
                else {}
            ),
        )
        create_topics(bootstrap, [env["KP_INPUT_TOPIC"], *outputs], 1)
        with WorkerProcess(bootstrap, directory / "worker.log", **env) as worker:
            worker.wait_ready()
            prometheus = Prometheus(binary, directory, worker.metrics_port).start()
            try:
                sent: set[tuple[int, int]] = set()
                for wave in range(WAVES):
                    if wave:
                        time.sleep(3)  # several scrapes apart
                    batch = traces(wave)
                    records = [(k, v, None, ()) for k, v in batch]
                    produced = produce(bootstrap, env["KP_INPUT_TOPIC"], records)
                    sent |= {(p.partition, p.offset) for p in produced}
                    scored = len(sent)
                    wait_for(
                        lambda n=scored: metric_total(worker.metrics_port, "kp_records_total") >= n,
                        60,
                        f"{scored} records scored",
                        worker.tail,
                    )
                got = collect_outputs(bootstrap, outputs, sent, timeout=30)
                # Scraped after the last wave: Prometheus has the final counts.
                wait_for(
                    lambda: prometheus.query(f"sum(kp_records_total) >= {len(sent)}"),
                    30,
                    "the last wave scraped",
                    prometheus.tail,
                )
                yield Stack(broker, worker, prometheus, {o.decision for o in got})
            finally:
                prometheus.stop()


# -- tests ------------------------------------------------------------------------------------
def test_the_workload_makes_every_decision(stack: Stack) -> None:
    assert stack.decisions == {"accepted", "rejected", "dead_letter"}, stack.context()
    domains = {s["domain"] for s in stack.prometheus.series("kp_score_count")}
    assert set(DOMAINS) <= domains, domains


def returns_data(prometheus: Prometheus, expr: str) -> bool:
    """The expression has a value to show: a series whose value is a number (a panel shows
    NaN alone as "No data" or "NaN"), or a template query's label values."""
    match = LABEL_VALUES.match(expr)
    if match:  # a Grafana template query: the label's values among the selector's series
        return any(match["label"] in s for s in prometheus.series(match["selector"]))
    return any(result["value"][1] != "NaN" for result in prometheus.query(expr))


def unknown_labels(prometheus: Prometheus, expr: str) -> list[str]:
    """Labels an expression names that no series of its metrics has. A matcher such as
    ``domain=~".*"`` (a variable at "All") also matches series without the label, and a
    ``by (label)`` of an absent label gives one blank series: neither reads "No data"."""
    label_sets: dict[str, set[str]] = {}
    for name in promql_metric_names(expr):
        label_sets[name] = {label for s in prometheus.series(name) for label in s}
    everywhere = set().union(*label_sets.values())
    unknown = [
        f"{selector.name}{{{matcher.name}}}"
        for selector in promql_selectors(expr)
        for matcher in selector.matchers.matchers
        if matcher.name not in label_sets[selector.name]
        and ABSENT_LABELS.get(matcher.name) != selector.name
    ]
    for node in promql_nodes(expr):
        modifier = getattr(node, "modifier", None)
        if (
            isinstance(node, promql_parser.AggregateExpr)
            and modifier is not None
            and modifier.type == promql_parser.AggModifierType.By
        ):
            unknown += [
                f"by ({label})"
                for label in modifier.labels
                if label not in everywhere and ABSENT_LABELS.get(label) not in label_sets
            ]
    return unknown


def test_every_dashboard_expression_returns_data(stack: Stack) -> None:
    queries = dashboard_queries()
    assert len(queries) > 40, "the dashboard's queries were not found"
    values = variable_values()
    wrong = []
    for query in queries:
        expr = substitute(query.expr, values)
        may_be_empty = promql_metric_names(expr) & set(EMPTY_BY_DESIGN)
        transactions = promql_metric_names(expr) & set(TRANSACTION_METRICS)
        if transactions and not isinstance(stack.broker, ApacheKafka):
            continue  # no transactions on the embedded broker
        if not may_be_empty and not returns_data(stack.prometheus, expr):
            wrong.append(f"{query.where}: no data: {expr}")
        unknown = unknown_labels(stack.prometheus, expr)
        if unknown:
            wrong.append(f"{query.where}: labels no series has: {unknown}: {expr}")
    assert not wrong, (
        "dashboard expressions that name a metric or label the worker does not export:\n"
        + "\n".join(wrong)
    )


def test_a_renamed_metric_or_label_is_caught(stack: Stack) -> None:
    """The checks above tell a panel with data from one without: the same query with a
    metric name or a label name changed is caught."""
    prometheus = stack.prometheus
    expr = 'sum by (decision) (rate(kp_records_total{instance=~".*", domain=~".*"}[1m]))'
    assert returns_data(prometheus, expr)
    assert not unknown_labels(prometheus, expr)
    assert not returns_data(prometheus, expr.replace("kp_records_total", "kp_record_total"))
    assert unknown_labels(prometheus, expr.replace("domain=~", "task_domain=~"))
    assert unknown_labels(prometheus, expr.replace("by (decision)", "by (route)"))
    assert not returns_data(prometheus, "label_values(kp_score_count, task_domain)")


def test_every_alert_rule_evaluates_ok(stack: Stack) -> None:
    prometheus = stack.prometheus
    deployed = {rule["alert"] for rule in alert_rules()}

    def evaluated() -> list[dict[str, Any]]:
        rules = prometheus.rules()
        done = all(not r.get("lastEvaluation", "").startswith("0001-") for r in rules)
        return rules if done and rules else []

    rules = wait_for(evaluated, 30, "rule evaluation", prometheus.tail)
    assert {rule["name"] for rule in rules} == deployed, f"{ALERTS.name} not loaded as deployed"
    unhealthy = {r["name"]: (r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"}
    assert not unhealthy, unhealthy
    # A rule over a metric the worker does not export evaluates "ok" too, and never fires.
    for rule in rules:
        missing = [m for m in promql_metric_names(rule["query"]) if not prometheus.series(m)]
        assert not missing, f"{rule['name']}: no series of {missing}"
        assert not unknown_labels(prometheus, rule["query"]), rule["name"]

    # A quarter of the workload is dead-lettered on purpose: far above the 5% of the rule. Its
    # rate needs two scrapes of the dead letters, and an evaluation after them: on a busy
    # machine the first evaluations can come before (none was active once, on 2 cores).
    def active() -> set[str]:
        return {a["labels"]["alertname"] for a in prometheus.alerts()}

    wait_for(active, 30, "active alert", stack.context)
    assert active() == {"KpScorerDeadLetterRate"}, stack.context()


def test_a_broker_outage_makes_broker_unreachable_pending(stack: Stack) -> None:
    """With the deployed expression and its ``for:`` of a minute: pending within seconds of
    the broker stopping (firing would follow after the minute)."""
    (rule,) = [r for r in alert_rules() if r["alert"] == "KpScorerBrokerUnreachable"]
    stack.broker.stop()

    def pending() -> list[dict[str, Any]]:
        return [
            a
            for a in stack.prometheus.alerts()
            if a["labels"]["alertname"] == rule["alert"] and a["state"] in ("pending", "firing")
        ]

    (alert,) = wait_for(pending, 60, f"{rule['alert']} pending", stack.context)
    assert alert["state"] == "pending", alert  # before its `for:` of a minute has passed
    assert alert["labels"]["instance"] == f"127.0.0.1:{stack.worker.metrics_port}"
