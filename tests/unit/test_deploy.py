"""Deployment files agree with the worker: compose, Dockerfile, Prometheus, Grafana, k8s.
(The Dockerfile's build steps and its lock file: ``tests/unit/test_image.py``.)

No Docker here. The static tests parse every file and cross-check names, ports, paths and
settings against ``worker.settings``. The live-worker half (every metric named by the
dashboard, the alert rules and the autoscaler is one a real worker exports) is
``tests/broker/test_deploy_live.py``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import AliasChoices

from worker.core.scorer import build_scorer
from worker.core.scoring import BUILTIN_PROFILES, profiles_from_mapping
from worker.io import kafka
from worker.settings import Settings, load_settings

from support.apache_kafka import kafka_version
from support.deploy_files import (
    COMPOSE,
    DASHBOARD,
    GRAFANA_DASHBOARDS,
    GRAFANA_DATASOURCES,
    K8S,
    MONITORING,
    PROMETHEUS,
    alert_rules,
    autoscaler_queries,
    dashboard_queries,
    dockerfile_env,
    dockerfile_instructions,
    k8s,
    k8s_documents,
    load_yaml,
    monitoring_documents,
    promql_label_matchers,
    promql_metric_names,
    promql_numbers,
)
from support.metric_families import exported_metrics
from support.paths import REPO

DEFAULTS = Settings()
DEFAULT_TOPICS = {
    DEFAULTS.input_topic,
    DEFAULTS.accepted_topic,
    DEFAULTS.rejected_topic,
    DEFAULTS.dead_letter_topic,
}
# What the dashboard must show (the brief of the dashboard), by the series it reads.
DASHBOARD_MUST_USE = {
    "kp_broker_reachable",
    "kp_seconds_since_last_fetch",
    "kp_seconds_since_last_publish",
    "kp_records_total",
    "kp_trace_latency_seconds_bucket",
    "kp_trace_latency_seconds_count",
    "kp_budget_breaches_total",
    "kp_stage_latency_seconds_bucket",
    "kp_score_bucket",
    "kp_score_dimension_bucket",
    "kp_consumer_lag_records",
    "kp_consumer_lag_seconds",
    "kp_cache_entries",
    "kp_embedder_up",
    "kp_dead_letters_total",
    "kp_latency_budget_seconds",
    "kp_accept_threshold",
    "kp_domain_accept_threshold",
    "kp_build_info",
    "kp_fetch_paused_partitions",
    "kp_fetch_pauses_total",
    "kp_future_timestamps_total",
}
ALERTS_MUST_USE = {
    "kp_broker_reachable",
    "kp_seconds_since_last_fetch",
    "kp_budget_breaches_total",
    "kp_trace_latency_seconds_bucket",
    "kp_dead_letters_total",
    "kp_consumer_lag_records",
    "kp_consumer_lag_seconds",
    "kp_embedder_up",
    "kp_latency_budget_seconds",
    "kp_accept_threshold",
    "kp_domain_accept_threshold",
    "kp_build_info",
    "up",
}
# Configured values that the dashboard and the alerts read from the worker's gauges
# (kp_latency_budget_seconds, kp_accept_threshold, kp_domain_accept_threshold), never write in.
CONFIGURED_VALUES = {
    DEFAULTS.latency_budget_seconds,
    DEFAULTS.accept_threshold,
    *DEFAULTS.domain_thresholds.values(),
    0.8,  # the medical threshold of deploy/k8s/configmap.yaml
}


# -- loading ------------------------------------------------------------------------------
def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)  # type: ignore[no-any-return]


def service(name: str) -> dict[str, Any]:
    return compose()["services"][name]  # type: ignore[no-any-return]


def setting_env_names() -> set[str]:
    """Every environment variable the worker reads: KP_<FIELD> and explicit aliases."""
    names = set()
    for field_name, field in Settings.model_fields.items():
        names.add(f"KP_{field_name.upper()}")
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(c.upper() for c in alias.choices if isinstance(c, str))
        elif isinstance(alias, str):
            names.add(alias.upper())
    return names


def container_port(mapping: str | int | dict[str, Any]) -> int:
    """The container side of a compose port mapping ("9464-9467:9464", "3000:3000", 80)."""
    if isinstance(mapping, dict):
        return int(mapping["target"])
    return int(str(mapping).split("/")[0].rsplit(":", 1)[-1])


def host_volumes(svc: dict[str, Any]) -> list[tuple[str, str]]:
    """(host path, container path) of a service's bind mounts."""
    out = []
    for volume in svc.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                out.append((volume["source"], volume["target"]))
            continue
        parts = volume.split(":")
        if parts[0].startswith((".", "/")):
            out.append((parts[0], parts[1]))
    return out


def topic_commands(script: str) -> dict[str, dict[str, Any]]:
    """Topic -> {"partitions": int, "configs": {name: value}} of each ``kafka-topics.sh
    --create`` in a shell script; a ``for topic in ...`` loop creates each topic it lists."""
    script = script.replace("\\\n", " ")
    loop = re.search(r"for topic in ([^;]+);", script)
    created: dict[str, dict[str, Any]] = {}
    for command in re.findall(r"kafka-topics\.sh[^\n]*--create[^\n]*", script):
        topic = re.search(r"--topic (\S+)", command)[1]  # type: ignore[index]
        topics = loop[1].split() if loop and "topic}" in topic else [topic]
        partitions = int(re.search(r"--partitions (\d+)", command)[1])  # type: ignore[index]
        configs = dict(c.split("=", 1) for c in re.findall(r"--config (\S+)", command))
        for name in topics:
            assert name not in created, f"{name} created twice"
            created[name] = {"partitions": partitions, "configs": configs}
    return created


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings exactly as the worker would load them from ``env`` (nothing else set)."""
    for name in list(os.environ):
        if name.startswith("KP_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    return load_settings()


def test_promql_metric_names_reads_nested_expressions() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(a_bucket{x=~"$x",le="0.1"}[$__rate_interval])))'
        " / on() group_left sum(b_total) > 0.1 and max_over_time(c[5m:1m]) unless -d"
    )
    assert promql_metric_names(expr) == {"a_bucket", "b_total", "c", "d"}
    assert promql_numbers(expr) == {0.99, 0.1}
    assert promql_label_matchers(expr) == {("a_bucket", "x", "$x"), ("a_bucket", "le", "0.1")}
    assert promql_metric_names('label_values(kp_score_count{i=~"$i"}, domain)') == {
        "kp_score_count"
    }
    with pytest.raises(AssertionError, match="invalid PromQL"):
        promql_metric_names("sum(rate(x[5m])")


# -- docker-compose -----------------------------------------------------------------------
def test_compose_has_the_services_and_ports() -> None:
    services = compose()["services"]
    assert {"kafka", "topics", "worker", "producer", "prometheus", "grafana"} <= set(services)
    # The version the broker tests run on Apache Kafka's own jars.
    assert service("kafka")["image"] == f"apache/kafka:{kafka_version()}"
    assert service("kafka")["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert service("worker")["build"] == "."
    ports = {name: {container_port(p) for p in s.get("ports", [])} for name, s in services.items()}
    assert 9092 in ports["kafka"]
    assert ports["worker"] == {DEFAULTS.metrics_port}
    assert 9090 in ports["prometheus"]
    assert 3000 in ports["grafana"]
    assert service("topics")["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert (
        service("worker")["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    )


def test_compose_worker_sets_only_real_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    env = service("worker")["environment"]
    unknown = set(env) - setting_env_names()
    assert not unknown, f"not worker settings: {sorted(unknown)}"
    settings = settings_from(env, monkeypatch)
    assert settings.kafka_bootstrap_servers.split(":")[0] == "kafka"
    kafka_listeners = service("kafka")["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert f"//{settings.kafka_bootstrap_servers}" in kafka_listeners
    assert service("producer")["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == (
        settings.kafka_bootstrap_servers
    )


def test_compose_volume_host_paths_exist() -> None:
    mounts = [
        (name, host) for name, s in compose()["services"].items() for host, _ in host_volumes(s)
    ]
    assert mounts, "compose mounts the examples and the deploy configuration"
    for name, host in mounts:
        assert (REPO / host).exists(), f"service {name} mounts missing {host}"
    assert (REPO / service("worker")["build"] / "Dockerfile").is_file()


def test_compose_topics_agree_with_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from(service("worker")["environment"], monkeypatch)
    assert {
        settings.input_topic,
        settings.accepted_topic,
        settings.rejected_topic,
        settings.dead_letter_topic,
    } == DEFAULT_TOPICS
    assert settings.input_topic == DEFAULTS.input_topic
    assert settings.group_id == DEFAULTS.group_id
    created = topic_commands("\n".join(service("topics")["command"]))
    assert set(created) == DEFAULT_TOPICS | {settings.cache_store_topic}
    assert {c["partitions"] for c in created.values()} == {settings.input_partitions}
    assert service("producer")["environment"]["TOPIC"] == DEFAULTS.input_topic
    producer_file = service("producer")["environment"]["TRACES_FILE"]
    mounted = {target: host for host, target in host_volumes(service("producer"))}
    directory, name = producer_file.rsplit("/", 1)
    assert (REPO / mounted[directory] / name).is_file()


def test_compose_output_topics_take_the_worker_record_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The topics service creates the output topics as the worker's ensure_topics would: with
    max.message.bytes = Settings.output_record_limit, so an output as large as
    KP_MAX_OUTPUT_BYTES is accepted by the broker instead of failing the publish."""
    settings = settings_from(service("worker")["environment"], monkeypatch)
    created = topic_commands("\n".join(service("topics")["command"]))
    outputs = {settings.accepted_topic, settings.rejected_topic, settings.dead_letter_topic}
    for topic in outputs:
        configs = created[topic]["configs"]
        assert configs.get("max.message.bytes") == str(settings.output_record_limit), topic
    assert settings.output_record_limit > 1_048_588, "above Kafka's default record limit"
    # The input topic keeps the broker's default, which is above what the worker reads.
    input_limit = created[settings.input_topic]["configs"].get("max.message.bytes", 1_048_588)
    assert int(input_limit) >= settings.max_message_bytes


def test_compose_topic_configs_are_the_ones_the_worker_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The topics service gives each topic it creates the configs the worker's own
    ensure_topics would (a misspelt name would be rejected by kafka-topics.sh only at run
    time, a wrong value never)."""
    settings = settings_from(service("worker")["environment"], monkeypatch)
    created = topic_commands("\n".join(service("topics")["command"]))
    for name in (settings.accepted_topic, settings.rejected_topic, settings.dead_letter_topic):
        wanted = kafka.output_topic_spec(name, 4, settings).topic_configs
        assert created[name]["configs"] == wanted, name
    store = kafka.store_topic_spec(settings.cache_store_topic, 4, settings)
    assert created[settings.cache_store_topic]["configs"] == store.topic_configs
    assert created[settings.input_topic]["configs"] == {}


def test_metrics_port_agrees_everywhere() -> None:
    port = DEFAULTS.metrics_port
    assert port == 9464
    worker = service("worker")
    assert int(worker["environment"]["KP_METRICS_PORT"]) == port
    assert {container_port(p) for p in worker["ports"]} == {port}
    assert f"127.0.0.1:{port}/readyz" in " ".join(worker["healthcheck"]["test"])
    exposed = [i.arguments for i in dockerfile_instructions() if i.keyword == "EXPOSE"]
    assert exposed == [str(port)]
    assert dockerfile_env()["KP_METRICS_PORT"] == str(port)
    (job,) = load_yaml(PROMETHEUS)["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    targets = [(name, sd["port"]) for sd in job["dns_sd_configs"] for name in sd["names"]]
    assert targets == [("worker", port)], "Prometheus scrapes the compose worker service"
    container = k8s("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    assert int(k8s("ConfigMap", "kp-scorer-env")["data"]["KP_METRICS_PORT"]) == port
    assert k8s("Service")["spec"]["ports"][0]["port"] == port


# -- Prometheus and Grafana ---------------------------------------------------------------
def test_prometheus_loads_the_alert_rules() -> None:
    config = load_yaml(PROMETHEUS)
    assert config["rule_files"] == ["alerts.yml"]
    assert (PROMETHEUS.parent / "alerts.yml").is_file()
    mounts = dict(host_volumes(service("prometheus")))
    assert mounts["./deploy/prometheus"] == "/etc/prometheus"
    assert "--config.file=/etc/prometheus/prometheus.yml" in service("prometheus")["command"]


def test_alert_rules_parse_and_cover_the_brief() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    used: set[str] = set()
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]
        used |= promql_metric_names(rule["expr"])
    assert used >= ALERTS_MUST_USE, sorted(ALERTS_MUST_USE - used)
    by_name = {rule["alert"]: rule["expr"] for rule in rules}
    p99 = by_name["KpScorerLatencyP99OverBudget"]
    assert "histogram_quantile(0.99" in p99
    assert re.sub(r"\s", "", p99).endswith(">on()max(kp_latency_budget_seconds)")
    # Down once the worker tried to load the model (its reason says why), not before.
    assert re.sub(r"\s", "", by_name["KpScorerEmbedderDown"]) == (
        'kp_embedder_up==0andon(job,instance)kp_embedder_info{reason!=""}'
    )
    assert re.sub(r"\s", "", by_name["KpScorerBrokerUnreachable"]) == "kp_broker_reachable==0"
    # Down = no target of the job answers, including when none is discovered any more.
    assert re.sub(r"\s", "", by_name["KpScorerDown"]) == 'absent(up{job="kp-scorer"}==1)'


def test_alert_rules_read_configured_values_from_the_worker() -> None:
    """Budget and thresholds come from the worker's gauges, so a deployment that changes
    KP_LATENCY_BUDGET_SECONDS or KP_ACCEPT_THRESHOLD needs no edit of the rules."""
    for rule in alert_rules():
        written_in = promql_numbers(rule["expr"]) & CONFIGURED_VALUES
        assert not written_in, f"{rule['alert']} writes in {sorted(written_in)}"
        buckets = {m for m in promql_label_matchers(rule["expr"]) if m[1] == "le"}
        assert not buckets, f"{rule['alert']} selects a bucket: {buckets}"


def test_alert_rules_select_the_scrape_job_prometheus_uses() -> None:
    """``up{job=...}`` in the rules names the job of prometheus.yml and of the ServiceMonitor
    (whose job label is the value of the Service label named by jobLabel)."""
    (scrape,) = load_yaml(PROMETHEUS)["scrape_configs"]
    monitor = k8s("ServiceMonitor")
    service_labels = k8s("Service")["metadata"]["labels"]
    assert service_labels[monitor["spec"]["jobLabel"]] == scrape["job_name"]
    jobs = {
        value
        for rule in alert_rules()
        for metric, label, value in promql_label_matchers(rule["expr"])
        if metric == "up" and label == "job"
    }
    assert jobs == {scrape["job_name"]}


def datasource_references(node: Any) -> list[dict[str, Any]]:
    """Every ``datasource`` object in a dashboard (panels, targets, variables, annotations)."""
    found = []
    if isinstance(node, dict):
        if isinstance(node.get("datasource"), dict):
            found.append(node["datasource"])
        for value in node.values():
            found += datasource_references(value)
    elif isinstance(node, list):
        for value in node:
            found += datasource_references(value)
    return found


def test_grafana_provisioning_matches_compose_and_dashboard() -> None:
    (datasource,) = load_yaml(GRAFANA_DATASOURCES)["datasources"]
    assert datasource["type"] == "prometheus"
    # The dashboard's datasource variable starts on the default data source.
    assert datasource["isDefault"] is True
    host_port = datasource["url"].removeprefix("http://")
    host, port = host_port.split(":")
    assert host in compose()["services"]
    assert int(port) in {container_port(p) for p in service(host)["ports"]}
    (provider,) = load_yaml(GRAFANA_DASHBOARDS)["providers"]
    mounts = dict(host_volumes(service("grafana")))
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"


def test_dashboard_takes_its_datasource_from_a_variable() -> None:
    """Importable into any Grafana: every query goes to the data source picked in the
    ``datasource`` variable (a Prometheus one), none to a fixed uid."""
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    variable = variables["datasource"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    assert not variable.get("current"), "no fixed choice: Grafana starts on its default"
    assert dashboard["templating"]["list"][0] is variable, "queries of later variables use it"
    expected = {"type": "prometheus", "uid": "${datasource}"}
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == expected, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == expected, panel["title"]
    for other in [*variables.values(), *dashboard["annotations"]["list"]]:
        if other.get("type") == "query" or "expr" in other:
            assert other["datasource"] == expected, other["name"]
    assert {json.dumps(ref, sort_keys=True) for ref in datasource_references(dashboard)} == {
        json.dumps(expected, sort_keys=True)
    }


def test_dashboard_parses_and_covers_the_brief() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "kp-scorer"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"], f"panel {panel['title']!r} has no query"
    used: set[str] = set()
    for query in dashboard_queries():
        used |= promql_metric_names(query)
    assert used >= DASHBOARD_MUST_USE, sorted(DASHBOARD_MUST_USE - used)


def panel_queries(panel: dict[str, Any]) -> list[str]:
    return [target["expr"] for target in panel.get("targets", []) if "expr" in target]


def threshold_steps(node: Any) -> list[float]:
    """Every threshold step value in a panel's field config (defaults and overrides)."""
    if isinstance(node, dict):
        steps = [s["value"] for s in node.get("steps", []) if s.get("value") is not None]
        return steps + [v for value in node.values() for v in threshold_steps(value)]
    if isinstance(node, list):
        return [v for value in node for v in threshold_steps(value)]
    return []


def test_dashboard_reads_budget_and_thresholds_from_the_worker() -> None:
    """No configured value is written into the dashboard: the within-budget share comes from
    kp_budget_breaches_total (counted against the configured budget), budget lines from
    kp_latency_budget_seconds and accept-threshold lines from the threshold gauges."""
    dashboard = json.loads(DASHBOARD.read_text())
    for query in dashboard_queries():
        assert not promql_numbers(query) & CONFIGURED_VALUES, query
        assert not {m for m in promql_label_matchers(query) if m[1] == "le"}, query
    for panel in dashboard["panels"]:
        steps = set(threshold_steps(panel.get("fieldConfig", {})))
        assert not steps & CONFIGURED_VALUES, panel["title"]
    panels = {panel["title"]: panel for panel in dashboard["panels"]}
    within = panel_queries(panels["Within latency budget"])
    assert within and all(
        {"kp_budget_breaches_total", "kp_trace_latency_seconds_count"} <= promql_metric_names(q)
        for q in within
    )
    for title in (
        "Trace latency p50 / p99 (receipt and end-to-end) vs latency budget",
        "Stage latency p99",
    ):
        assert any(
            promql_metric_names(q) == {"kp_latency_budget_seconds"}
            for q in panel_queries(panels[title])
        ), title
    p99 = panel_queries(panels["p99 latency / budget"])
    assert len(p99) == 1 and "kp_latency_budget_seconds" in promql_metric_names(p99[0])
    acceptance = {
        name
        for q in panel_queries(panels["Mean score and acceptance by domain"])
        for name in promql_metric_names(q)
    }
    assert {"kp_accept_threshold", "kp_domain_accept_threshold"} <= acceptance


def test_dashboard_shows_builds() -> None:
    """A table of each worker's version and model, and an annotation when a build appears."""
    dashboard = json.loads(DASHBOARD.read_text())
    tables = [
        p
        for p in dashboard["panels"]
        if any("kp_build_info" in promql_metric_names(q) for q in panel_queries(p))
    ]
    (table,) = tables
    assert table["type"] == "table"
    (build,) = [q for q in panel_queries(table) if "kp_build_info" in promql_metric_names(q)]
    assert re.search(r"by \(instance, version, model\)", build)
    (annotation,) = dashboard["annotations"]["list"]
    assert promql_metric_names(annotation["expr"]) == {"kp_build_info"}
    assert "{{version}}" in annotation["titleFormat"] and "{{model}}" in annotation["textFormat"]


# -- Kubernetes ---------------------------------------------------------------------------
def test_k8s_manifests_parse_without_namespaces() -> None:
    docs = k8s_documents()
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "PodDisruptionBudget", "ScaledObject", "ConfigMap", "Service"} <= kinds
    for doc in docs:
        assert doc["apiVersion"] and doc["metadata"]["name"]
        assert "namespace" not in doc["metadata"], "manifests are namespace-less"
    kustomization = load_yaml(K8S / "kustomization.yaml")
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_k8s_monitoring_is_a_kustomization_of_its_own() -> None:
    """ServiceMonitor and PrometheusRule need the Prometheus Operator's CRDs: a separate
    kustomization, which the base does not include."""
    base = load_yaml(K8S / "kustomization.yaml")
    assert not any(
        "monitoring" in entry for key in ("resources", "components") for entry in base.get(key, [])
    )
    kustomization = load_yaml(MONITORING / "kustomization.yaml")
    assert set(kustomization["resources"]) == {p.name for p in MONITORING.glob("*.yaml")} - {
        "kustomization.yaml"
    }
    docs = monitoring_documents()
    assert sorted(d["kind"] for d in docs) == ["PrometheusRule", "ServiceMonitor"]
    for doc in docs:
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        assert "namespace" not in doc["metadata"], "manifests are namespace-less"


def test_k8s_service_monitor_scrapes_the_metrics_service() -> None:
    monitor = k8s("ServiceMonitor")
    service_ = k8s("Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service_["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service_["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert monitor["spec"]["jobLabel"] in service_["metadata"]["labels"]


def test_k8s_deployment_probes_and_wiring() -> None:
    deployment = k8s("Deployment")
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    paths = {}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        http = container[probe]["httpGet"]
        paths[probe] = http["path"]
        assert ports.get(http["port"], http["port"]) == DEFAULTS.metrics_port, probe
    # Restart on a hung worker (/healthz), route and roll out on a ready one (/readyz). The
    # startup probe only holds off liveness: it asks /healthz, since a replica left without
    # partitions is alive but never ready.
    assert paths == {
        "startupProbe": "/healthz",
        "readinessProbe": "/readyz",
        "livenessProbe": "/healthz",
    }
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, (
        "model load and Kafka retries get minutes before liveness counts"
    )
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60
    (env_from,) = container["envFrom"]
    assert k8s("ConfigMap", env_from["configMapRef"]["name"])
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for volume in volumes.values():
        if "configMap" in volume:
            assert k8s("ConfigMap", volume["configMap"]["name"])
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])
    env = k8s("ConfigMap", "kp-scorer-env")["data"]
    assert int(env["KP_EMBED_CONCURRENCY"]) == int(resources["limits"]["cpu"])

    service_ = k8s("Service")
    assert service_["spec"]["selector"].items() <= labels.items()
    assert service_["spec"]["ports"][0]["targetPort"] in (*ports, DEFAULTS.metrics_port)
    pdb = k8s("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


# Peak RSS of a worker fed one gzip batch holding a 1 GiB value (within Kafka's default
# 1 MiB message.max.bytes), decompressed no further than KP_MAX_BATCH_BYTES:
# `python bench/compression_bomb.py`, docs/operations.md "Memory".
GZIP_BOMB_PEAK_MIB = 392


def test_k8s_memory_limit_covers_a_compression_bomb() -> None:
    container = k8s("Deployment")["spec"]["template"]["spec"]["containers"][0]
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Gi"), limit
    assert int(limit[:-2]) * 1024 >= 1.25 * GZIP_BOMB_PEAK_MIB
    operations = (REPO / "docs" / "operations.md").read_text()
    memory = operations.split("\n## Memory\n", 1)[1].split("\n## ", 1)[0]
    assert f"{GZIP_BOMB_PEAK_MIB:,} MiB" in memory


def test_k8s_configmaps_are_real_settings_and_profiles(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = dict(k8s("ConfigMap", "kp-scorer-env")["data"])
    unknown = set(env) - setting_env_names()
    assert not unknown, f"not worker settings: {sorted(unknown)}"
    assert {env[k] for k in env if k.endswith("_TOPIC")} == DEFAULT_TOPICS
    assert env["KP_GROUP_ID"] == DEFAULTS.group_id

    profiles_map = k8s("ConfigMap", "kp-scorer-profiles")["data"]
    raw = json.loads(profiles_map["profiles.json"])
    profiles = profiles_from_mapping(raw)
    assert dict(profiles.profiles) == dict(BUILTIN_PROFILES), "the five built-in profiles"

    # Where the Deployment mounts the profiles is where KP_PROFILES_FILE points.
    container = k8s("Deployment")["spec"]["template"]["spec"]["containers"][0]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "profiles"]
    directory, name = env["KP_PROFILES_FILE"].rsplit("/", 1)
    assert mount["mountPath"] == directory and name in profiles_map

    local = tmp_path / name
    local.write_text(profiles_map[name])
    settings = settings_from({**env, "KP_PROFILES_FILE": str(local)}, monkeypatch)
    scorer = build_scorer(settings, use_embedder=False)
    assert set(scorer.profiles.names) == set(BUILTIN_PROFILES)
    assert scorer.thresholds.for_domain("medical") == 0.8
    assert scorer.thresholds.for_domain("code") == settings.accept_threshold == 0.75


def test_k8s_autoscaler_is_capped_at_the_partition_count() -> None:
    scaled = k8s("ScaledObject")
    deployment = k8s("Deployment")
    env = k8s("ConfigMap", "kp-scorer-env")["data"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["spec"]["maxReplicaCount"] == int(env["KP_INPUT_PARTITIONS"])
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
    (kafka,) = [t for t in scaled["spec"]["triggers"] if t["type"] == "kafka"]
    assert kafka["metadata"]["topic"] == env["KP_INPUT_TOPIC"]
    assert kafka["metadata"]["consumerGroup"] == env["KP_GROUP_ID"]
    assert kafka["metadata"]["bootstrapServers"] == env["KAFKA_BOOTSTRAP_SERVERS"]
    assert kafka["metadata"]["allowIdleConsumers"] == "false"
    for query in autoscaler_queries():
        assert f'topic="{env["KP_INPUT_TOPIC"]}"' in query
        assert promql_metric_names(query)


def metrics_section() -> str:
    operations = (REPO / "docs" / "operations.md").read_text()
    return operations.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]


# `kp_name` or `kp_name{label,label}` as the Metrics section writes a metric.
METRIC_MENTION = re.compile(r"`(kp_[a-z_]+)(?:\{([a-z_,]*)\})?`")
# The series a histogram exports besides its name.
HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")


def test_the_operations_page_names_every_metric_with_its_labels() -> None:
    """Each exported metric is named in the Metrics section with its labels as the code
    gives them (`kp_records_total{decision,domain}`); a label list written there is the
    code's, and the section names no metric that the worker does not export."""
    exported = exported_metrics()
    assert exported["kp_records_total"] == ("decision", "domain")
    mentions = [(m[1], m[2]) for m in METRIC_MENTION.finditer(metrics_section())]
    unknown = sorted({name for name, _ in mentions if name not in exported})
    assert not unknown, f"docs/operations.md's Metrics section names no such metric: {unknown}"
    wrong = sorted(
        f"{name}{{{labels}}} (the code's: {{{','.join(exported[name])}}})"
        for name, labels in mentions
        if labels is not None and tuple(labels.split(",")) != exported[name]
    )
    assert not wrong, f"labels in docs/operations.md's Metrics section: {wrong}"
    named = {name for name, labels in mentions if labels is not None or not exported[name]}
    missing = sorted(
        f"{name}{{{','.join(labels)}}}" if labels else name
        for name, labels in exported.items()
        if name not in named
    )
    assert not missing, f"docs/operations.md's Metrics section does not name: {missing}"


def test_every_metric_the_docs_name_is_exported() -> None:
    """Anywhere in docs/: a metric named is one the worker exports (or a histogram's series);
    a package of this repository (`kp_model_build`) is not a metric."""
    exported = exported_metrics()
    known = {*exported, *(n + s for n in exported for s in HISTOGRAM_SERIES)}
    known |= {path.name for path in REPO.glob("kp_*") if path.is_dir()}
    stale = {
        f"{page.name}: {name}"
        for page in sorted((REPO / "docs").glob("*.md"))
        for name in re.findall(r"\bkp_[a-z_]+[a-z]\b", page.read_text())
        if name not in known
    }
    assert not stale, sorted(stale)
