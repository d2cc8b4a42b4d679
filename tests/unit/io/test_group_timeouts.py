"""The consumer group's timings reach the group consumer, for any session timeout an
Apache Kafka broker accepts (its default group.max.session.timeout.ms is 30 minutes)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer

from worker.io.group_consumer import group_consumer_config
from worker.settings import load_settings


@pytest.fixture(autouse=True)
def isolated(isolated_settings: None) -> None:
    """Every test here runs with settings isolated from the environment."""


@pytest.mark.parametrize("session_seconds", ["10", "120", "1800"])
def test_the_group_consumer_is_built_with_the_session_timeout(
    monkeypatch: pytest.MonkeyPatch, session_seconds: str
) -> None:
    monkeypatch.setenv("KP_SESSION_TIMEOUT_SECONDS", session_seconds)
    settings = load_settings()

    async def timeouts() -> tuple[int, int]:
        group = AIOKafkaConsumer(**group_consumer_config(settings))
        try:
            return group._session_timeout_ms, group._request_timeout_ms
        finally:
            await group.stop()

    session_ms, request_ms = asyncio.run(timeouts())
    assert session_ms == int(float(session_seconds) * 1000)
    assert request_ms >= session_ms
