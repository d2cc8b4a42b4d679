"""A worker at INFO never writes a trace's contents to its log (a unique marker is planted
in every text field of valid and malformed traces). The rest of the configuration and
security tests, which need no broker, are ``tests/unit/test_config_security.py``.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import orjson
import pytest

from worker.dev.process import WorkerProcess

from support.kafka_helpers import consume_all, create_topics, produce
from support.workers import worker_topics


@pytest.mark.broker
def test_worker_log_never_contains_trace_contents(kafka_bootstrap: str) -> None:
    marker = f"MARKER{uuid.uuid4().hex}"
    prefix = f"logs-{uuid.uuid4().hex[:8]}"
    env, _ = worker_topics(prefix, 1, KP_LOG_LEVEL="INFO")
    valid = {
        "@context": "https://openknowledgepulse.org/schema/v1",
        "@type": "ReasoningTrace",
        "id": f"kp:trace:{marker}",
        "metadata": {
            "created_at": "2025-01-15T12:00:00Z",
            "task_domain": f"{marker}-domain",
            "success": True,
            "quality_score": 0,
            "visibility": "private",
            "privacy_level": "private",
            "agent_id": marker,
            "framework": marker,
        },
        "task": {"objective": f"Objective {marker}", "input_schema": {marker: marker}},
        "steps": [
            {"step_id": 0, "type": "thought", "content": f"secret thought {marker}"},
            {
                "step_id": 1,
                "type": "tool_call",
                "tool": {"name": marker, "mcp_server": marker},
                "input": {"q": marker},
                "output_summary": marker,
            },
        ],
        "outcome": {"result_summary": marker, "confidence": 0.7},
        "x_extra": marker,
    }
    schema_invalid = {**valid, "metadata": {**valid["metadata"], "visibility": marker}}
    inputs = [
        orjson.dumps(valid),
        orjson.dumps(schema_invalid),
        f'{{"id": "{marker}", '.encode(),  # invalid JSON
        f'{{"{marker}": 1, "{marker}": 2}}'.encode(),  # duplicate key
        orjson.dumps({**valid, "steps": [{"step_id": -1, "type": marker}]}),
    ]
    create_topics(kafka_bootstrap, [env["KP_INPUT_TOPIC"]], partitions=1)
    produce(kafka_bootstrap, env["KP_INPUT_TOPIC"], [(b"k", v, 0, None) for v in inputs])
    with WorkerProcess(kafka_bootstrap, **env) as worker:
        dead = consume_all(kafka_bootstrap, env["KP_DEAD_LETTER_TOPIC"], 4, timeout=90)
        scored = []
        deadline = time.monotonic() + 30
        while not scored and time.monotonic() < deadline:
            for topic in (env["KP_ACCEPTED_TOPIC"], env["KP_REJECTED_TOPIC"]):
                scored += consume_all(kafka_bootstrap, topic, 0, extra_wait=0.5)
        worker.stop()
        log = worker.log_text()
    assert len(dead) == 4 and len(scored) == 1, "every input was processed"
    assert marker.encode() in scored[0].value, "the output does carry the contents"
    lines = [line for line in log.splitlines() if marker in line]
    print(
        f"\nworker log: {len(log.splitlines())} lines, {len(log):,} chars at INFO; "
        f"lines containing the marker: {len(lines)}"
    )
    assert not lines, "trace contents in the log:\n" + "\n".join(lines[:5])


@pytest.mark.broker
def test_producer_idempotence_auto_falls_back_and_on_refuses_a_broker_without_it(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Whether the broker grants producer ids decides "auto"; "on" never publishes without."""
    from worker.io.publisher import KafkaError, Publisher
    from worker.settings import load_settings

    async def start(mode: str) -> bool:
        publisher = Publisher(
            load_settings(kafka_bootstrap_servers=kafka_bootstrap, producer_idempotence=mode)
        )
        try:
            await publisher.start()
            return publisher.idempotent
        finally:
            await publisher.stop()

    granted = asyncio.run(start("auto"))
    assert asyncio.run(start("off")) is False
    if granted:  # Apache Kafka: idempotent, and "on" starts too
        assert asyncio.run(start("on")) is True
        return
    assert "publishing without idempotence" in caplog.text
    with pytest.raises(KafkaError, match="KP_PRODUCER_IDEMPOTENCE=on but the broker refused"):
        asyncio.run(start("on"))
