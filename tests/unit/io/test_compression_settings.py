"""KP_COMPRESSION_TYPE: validated at start-up, and the codec of every producer the worker
builds (its Publisher and faust's own producer)."""

from __future__ import annotations

import asyncio

import pytest

from worker.io.app import ScorerApp
from worker.io.publisher import Publisher
from worker.settings import SettingsError, load_settings


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

    async def publisher_codecs() -> tuple[str | None, str | None]:
        publisher = Publisher(settings)
        # The producer it starts with, and the plain one it falls back to.
        return publisher._producer._compression_type, publisher._new_producer()._compression_type

    assert asyncio.run(publisher_codecs()) == (codec, codec)
    app = ScorerApp(settings)
    assert app.conf.producer_compression_type == codec
    assert app.producer._settings_default()["compression_type"] == codec


def test_an_unknown_codec_stops_start_up_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KP_COMPRESSION_TYPE", "brotli")
    with pytest.raises(SettingsError, match=r"KP_COMPRESSION_TYPE.*'lz4'"):
        load_settings()
