"""KP_COMPRESSION_TYPE: validated at start-up, and the codec of every producer the worker
builds (its Publisher's, idempotent or plain)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import UnsupportedVersionError

from worker.io import publisher as publisher_module
from worker.io.publisher import Publisher
from worker.settings import SettingsError, load_settings

from support.clients import built_clients


@pytest.fixture(autouse=True)
def isolated(isolated_settings: None) -> None:
    """Every test here runs with settings isolated from the environment."""


def test_outputs_are_uncompressed_by_default() -> None:
    settings = load_settings()
    assert settings.compression_type == "none" and settings.producer_compression is None


@pytest.mark.parametrize(
    ("value", "codec"),
    [("none", None), ("GZIP", "gzip"), (" zstd ", "zstd"), ("snappy", "snappy"), ("lz4", "lz4")],
)
def test_every_producer_uses_the_chosen_codec(
    monkeypatch: pytest.MonkeyPatch, value: str, codec: str | None
) -> None:
    monkeypatch.setenv("KP_COMPRESSION_TYPE", value)
    settings = load_settings()
    assert settings.producer_compression == codec

    producers = built_clients(monkeypatch, publisher_module, "AIOKafkaProducer")

    class GrantsNoProducerIds(publisher_module.AIOKafkaProducer):  # type: ignore[name-defined]
        """A broker without producer ids: an idempotent producer cannot start."""

        async def start(self) -> None:
            if producers[-1].kwargs["enable_idempotence"]:
                raise UnsupportedVersionError("no producer ids")

    monkeypatch.setattr(publisher_module, "AIOKafkaProducer", GrantsNoProducerIds)

    async def start_and_stop() -> None:
        publisher = Publisher(settings)
        await publisher.start()
        await publisher.stop()

    asyncio.run(start_and_stop())
    # The producer it starts with, and the plain one it falls back to.
    assert [built.kwargs["enable_idempotence"] for built in producers] == [True, False]
    assert [built.kwargs["compression_type"] for built in producers] == [codec, codec]


def test_an_unknown_codec_stops_start_up_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KP_COMPRESSION_TYPE", "brotli")
    with pytest.raises(SettingsError, match=r"KP_COMPRESSION_TYPE.*'lz4'"):
        load_settings()
