"""Deployment files against a live worker: it scores the sample traces plus a malformed
record, its /metrics is scraped, and both the values and that every metric named by the
dashboard, the alert rules and the autoscaler is one the worker exports are checked. The
static half is ``tests/unit/test_deploy.py``.
"""

from __future__ import annotations

import os
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from worker.core.records import OTHER_DOMAIN
from worker.core.scoring import BUILTIN_PROFILES
from worker.dev.process import WorkerProcess

from support.deploy_files import (
    alert_rules,
    autoscaler_queries,
    dashboard_queries,
    promql_metric_names,
)
from support.kafka_helpers import create_topics, produce
from support.outputs import collect_outputs
from support.paths import EXAMPLES
from support.workers import worker_topics

# Series Prometheus records itself for every target; alerts may use them.
PROMETHEUS_SERIES = {"up"}


# -- a live worker ------------------------------------------------------------------------
@dataclass(frozen=True)
class LiveWorker:
    inputs: int
    valid: int
    samples: dict[str, list[tuple[dict[str, str], float]]]  # sample name -> (labels, value)
    series: set[str]  # every series name the worker exports (suffixes included)
    rss_mib: float
    hwm_mib: float
    cpu_seconds: float

    def value(self, name: str, **labels: str) -> float:
        return sum(v for got, v in self.samples.get(name, []) if labels.items() <= got.items())


def exported_series(text: str) -> tuple[set[str], dict[str, list[tuple[dict[str, str], float]]]]:
    """Series names in an exposition, including those of families with no samples yet."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("_count", "_sum", "_created", ""),
        "info": ("_info",),
        "gauge": ("",),
    }
    names: set[str] = set()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        for sample in family.samples:
            names.add(sample.name)
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return names, samples


def process_figures(pid: int) -> tuple[float, float, float]:
    """(VmRSS MiB, VmHWM MiB, CPU seconds user+system) of a process, from /proc."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (
        int(status["VmRSS"].split()[0]) / 1024,
        int(status["VmHWM"].split()[0]) / 1024,
        (int(fields[11]) + int(fields[12])) / ticks,
    )


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def live_worker(kafka_bootstrap: str) -> Iterator[LiveWorker]:
    prefix = f"deploy-{uuid.uuid4().hex[:8]}"
    env, outputs = worker_topics(prefix, 4)
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"]], partitions=4)
    lines = [line for line in EXAMPLES.read_bytes().splitlines() if line.strip()]
    records = [
        (orjson.loads(line)["metadata"]["task_domain"].encode(), line, None, None) for line in lines
    ]
    records.append((b"bad", b"{not json", None, None))

    with WorkerProcess(kafka_bootstrap, **env) as worker:
        worker.wait_ready()
        assert worker.process is not None
        produced = produce(kafka_bootstrap, env["KP_INPUT_TOPIC"], records)
        collect_outputs(kafka_bootstrap, outputs, {(p.partition, p.offset) for p in produced})
        # Metrics are observed right after the publish is acknowledged: wait for the last.
        deadline = time.monotonic() + 10
        while True:
            text = scrape(worker.metrics_port)
            series, samples = exported_series(text)
            count = sum(v for _, v in samples.get("kp_trace_latency_seconds_count", []))
            if count >= len(records) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        rss, hwm, cpu = process_figures(worker.process.pid)
        print(
            f"\nworker after scoring {len(records)} records: VmRSS {rss:.0f} MiB, "
            f"VmHWM {hwm:.0f} MiB, CPU {cpu:.1f} s since start"
        )
        yield LiveWorker(len(records), len(lines), samples, series, rss, hwm, cpu)


@pytest.mark.broker
def test_live_worker_metric_values(live_worker: LiveWorker) -> None:
    live = live_worker
    assert live.value("kp_records_total") == live.inputs
    assert live.value("kp_records_total", decision="dead_letter") == 1
    assert live.value("kp_dead_letters_total", kind="invalid_json") == 1
    assert live.value("kp_trace_latency_seconds_count") == live.inputs
    buckets = {labels["le"] for labels, _ in live.samples["kp_trace_latency_seconds_bucket"]}
    assert "0.1" in buckets, "a bucket boundary exactly at the 100 ms budget"
    assert live.value("kp_trace_latency_seconds_bucket", le="+Inf") == live.inputs
    breaches = live.value("kp_budget_breaches_total")
    within = live.value("kp_trace_latency_seconds_bucket", le="0.1")
    assert breaches == live.inputs - within, "breaches = traces above the 0.1 s bucket"
    assert live.value("kp_embedder_up") == 1
    assert live.value("kp_batch_size_count") == live.inputs, "pipeline depth seen by each record"
    assert live.value("kp_end_to_end_latency_seconds_count") == live.inputs
    assert live.samples.get("kp_cache_entries"), "kp_cache_entries is exported"
    assert live.value("kp_cache_entries") == live.valid, "every scored trace enters a cache"
    assert live.value("kp_score_count") == live.valid
    for dimension in ("complexity", "novelty", "tool_diversity", "outcome"):
        assert live.value("kp_score_dimension_count", dimension=dimension) == live.valid
    domains = {labels["domain"] for labels, _ in live.samples["kp_records_total"]}
    assert domains <= set(BUILTIN_PROFILES) | {OTHER_DOMAIN}
    assert live.samples.get("kp_consumer_lag_records")
    assert live.samples.get("kp_consumer_lag_seconds")
    print(
        f"latency: {within:.0f} of {live.inputs} within 0.1 s, {breaches:.0f} breaches "
        "(a burst of 51 on a cold worker)"
    )


@pytest.mark.broker
def test_dashboard_uses_only_exported_metrics(live_worker: LiveWorker) -> None:
    used: set[str] = set()
    for query in dashboard_queries():
        used |= promql_metric_names(query)
    assert used - live_worker.series == set()


@pytest.mark.broker
def test_alerts_use_only_exported_metrics(live_worker: LiveWorker) -> None:
    for rule in alert_rules():
        unknown = promql_metric_names(rule["expr"]) - live_worker.series - PROMETHEUS_SERIES
        assert not unknown, f"{rule['alert']} uses {sorted(unknown)}"


@pytest.mark.broker
def test_autoscaler_uses_only_exported_metrics(live_worker: LiveWorker) -> None:
    queries = autoscaler_queries()
    assert queries
    for query in queries:
        assert promql_metric_names(query) - live_worker.series == set()
