"""Settings giving a worker subprocess (``worker.dev.process.WorkerProcess``) its own topics,
and reading its /metrics."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def worker_topics(
    prefix: str, partitions: int, **extra: str
) -> tuple[dict[str, str], dict[str, str]]:
    """Settings giving a worker its own topics and group, and its output topic -> decision."""
    env = {
        "KP_INPUT_TOPIC": f"{prefix}.raw",
        "KP_ACCEPTED_TOPIC": f"{prefix}.accepted",
        "KP_REJECTED_TOPIC": f"{prefix}.rejected",
        "KP_DEAD_LETTER_TOPIC": f"{prefix}.dead-letter",
        "KP_GROUP_ID": f"{prefix}-group",
        "KP_CACHE_STORE_TOPIC": f"{prefix}.novelty-cache",
        "KP_INPUT_PARTITIONS": str(partitions),
        **extra,
    }
    outputs = {
        env["KP_ACCEPTED_TOPIC"]: "accepted",
        env["KP_REJECTED_TOPIC"]: "rejected",
        env["KP_DEAD_LETTER_TOPIC"]: "dead_letter",
    }
    return env, outputs


def metric_total(metrics_port: int, name: str, timeout: float = 5.0) -> float:
    """The samples of metric ``name`` summed over their labels, scraped from a worker's /metrics
    (raises OSError when it does not answer)."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == name
    )
