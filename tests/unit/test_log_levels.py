"""The logging set-up keeps library DEBUG records (which hold message keys and values) out of
the log at every KP_LOG_LEVEL, and our own DEBUG lines in."""

from __future__ import annotations

import io
import logging
import logging.config
from collections.abc import Iterator

import pytest

from worker.logs import logging_config


@pytest.fixture
def configured() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    config = logging_config("DEBUG")
    config["handlers"]["stderr"]["stream"] = stream
    root = logging.getLogger()
    saved = root.level, list(root.handlers)
    logging.config.dictConfig(config)
    yield stream
    root.handlers[:] = saved[1]
    root.setLevel(saved[0])
    logging.getLogger("worker").setLevel(logging.NOTSET)


def test_library_debug_records_are_dropped_even_where_a_library_sets_debug(configured) -> None:
    chatty = logging.getLogger("aiokafka.producer.producer")
    chatty.setLevel(logging.DEBUG)  # a library that lowers its own logger's level
    try:
        chatty.debug("Sending (key=%r value=%r)", b"k", b"SECRET-VALUE")
        logging.getLogger("faust.transport").debug("event %r", b"SECRET-VALUE")
        logging.getLogger("mode.services").debug("SECRET-VALUE")
        chatty.info("Subscribed to topic(s)")
        logging.getLogger("worker.stream.processor").debug("record published")
    finally:
        chatty.setLevel(logging.NOTSET)
    text = configured.getvalue()
    assert "SECRET-VALUE" not in text
    assert "Subscribed to topic(s)" in text, "library INFO and up still pass"
    assert "record published" in text, "our own DEBUG lines pass"


def test_the_root_logger_is_never_below_info() -> None:
    assert logging_config("DEBUG")["root"]["level"] == "INFO"
    assert logging_config("WARNING")["root"]["level"] == "WARNING"
    assert logging_config("DEBUG")["loggers"]["worker"]["level"] == "DEBUG"
