"""Structured (one JSON object per line) logs on stderr. Trace contents are never logged.

Our own code logs no record's value, key or headers at any level. The libraries do at DEBUG
(aiokafka's producer logs every record it sends, value and key in full), so below INFO only
the ``worker`` loggers speak: ``KP_LOG_LEVEL=DEBUG`` is our debug lines plus the libraries'
INFO and up.
"""

from __future__ import annotations

import logging
import logging.config
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "_kp_collapsed",
}


def one_line(exc: BaseException) -> str:
    """An exception's message as one line: onnxruntime, tokenizers and onnx errors span lines,
    and a reason should fit one log line."""
    return _flat(exc)[:300] or type(exc).__name__


def error_line(exc: BaseException, limit: int = 300) -> str:
    """``ClassName: message`` on one line, the class named once: aiokafka's errors already
    begin their ``str()`` with it (``KafkaConnectionError: Unable to bootstrap ...``), and
    prefixing it again would write it twice."""
    name = type(exc).__name__
    text = _flat(exc)
    if not text or text == name:
        return name
    return (text if text.startswith(f"{name}: ") else f"{name}: {text}")[:limit]


def _within(name: str, loggers: tuple[str, ...]) -> bool:
    """Whether logger ``name`` is one of ``loggers`` or a child of one."""
    return any(name == p or name.startswith(p + ".") for p in loggers)


def _flat(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a call gave with ``extra=``."""
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """The worker's log: one JSON object a line, for log pipelines."""

    def format(self, record: logging.LogRecord) -> str:
        # ISO 8601 in UTC with milliseconds: lines from pods in different zones sort and
        # compare as they are, and a burst within one second stays in order.
        moment = datetime.fromtimestamp(record.created, UTC)
        entry: dict[str, Any] = {
            "ts": moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class HumanFormatter(logging.Formatter):
    """The commands a person runs (score, replay, rescore, check, demo) write lines a person
    reads on a terminal, no JSON: ``kp-scorer warning: <message> (field=value)`` for ours,
    ``aiokafka error: <message>`` for a library's, so that the command's own verdict
    (``kp-scorer: Kafka unreachable ...``) stays the one line that starts ``kp-scorer:``."""

    def format(self, record: logging.LogRecord) -> str:
        # A collapsed line says "(repeated N times ...)" in words: no `repeated` field.
        fields = ", ".join(f"{k}={v}" for k, v in _fields(record).items() if k != "repeated")
        top = record.name.partition(".")[0]
        source = "kp-scorer" if top == OWN_LOGGER else top
        line = f"{source} {record.levelname.lower()}: {record.getMessage()}"
        if fields:
            line += f" ({fields})"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


# Kafka client loggers whose warnings and errors repeat many times a second during an outage.
COLLAPSED_LOGGERS = ("aiokafka", "kafka")


class RepeatCollapser(logging.Filter):
    """Collapses repeated warnings/errors of the Kafka client loggers.

    The first record of each distinct message (logger, level and message template) passes;
    the same message again within ``interval`` seconds is only counted, and when the interval
    is over one line says how often it came, ``"<message> (repeated N times in the last S s)"``
    with the structured field ``repeated``. So each distinct error costs at most one line per
    interval however often the client logs it. Thread-safe.
    """

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval = float(interval)
        self.clock = clock
        self._lock = threading.Lock()
        # key -> [window start, records counted in it, last such record]
        self._windows: dict[tuple[str, int, str], list[Any]] = {}

    def _collapsible(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or getattr(record, "_kp_collapsed", False):
            return False
        return _within(record.name, COLLAPSED_LOGGERS)

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        summaries: list[logging.LogRecord] = []
        passes = True
        with self._lock:
            for key, window in list(self._windows.items()):
                start, count, last = window
                if now - start < self.interval:
                    continue
                if count:
                    # Still repeating: say how often, and keep counting in a new window.
                    summaries.append(self._summary(last, count, now - start))
                    window[:] = [now, 0, last]
                else:
                    del self._windows[key]
            if self._collapsible(record):
                key = (record.name, record.levelno, str(record.msg)[:300])
                counting = self._windows.get(key)
                if counting is None:
                    self._windows[key] = [now, 0, record]
                else:
                    counting[1] += 1
                    counting[2] = record
                    passes = False
        for summary in summaries:
            logging.getLogger(summary.name).handle(summary)
        return passes

    def _summary(self, last: logging.LogRecord, count: int, span: float) -> logging.LogRecord:
        fields = dict(last.__dict__)
        fields.update(
            msg=f"{last.getMessage()} (repeated {count} times in the last {span:.0f} s)",
            args=None,
            exc_info=None,
            exc_text=None,
            stack_info=None,
            repeated=count,
            _kp_collapsed=True,
        )
        return logging.makeLogRecord(fields)


# The loggers of our own code: the only ones heard below INFO.
OWN_LOGGER = "worker"


class LibraryDebugFilter(logging.Filter):
    """Drops records below INFO from every logger outside ``worker`` (see the module docstring),
    whatever level a library sets on its own loggers; the root logger's INFO silences the
    others before their messages are even formatted."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.INFO or _within(record.name, (OWN_LOGGER,))


# What mode's services (faust's app, worker, ...) prefix to every line they log:
# "[^-ScorerApp]: Stopping...".
_SERVICE_LINE = re.compile(r"^\[\^-*.*?\]: ")


class ServiceChatterFilter(logging.Filter):
    """Demotes to DEBUG the INFO lines in which faust's services narrate their life cycle.

    A clean start and stop would otherwise write "[^-ScorerApp]: Starting...", "Stopping..."
    and the like around the worker's own few; an operator reads "scorer ready", "shutting
    down" and "stopped" instead. Warnings and errors are never touched; with
    ``KP_LOG_LEVEL=DEBUG`` the demoted lines are still written, at DEBUG.
    """

    def __init__(self, level: str = "INFO") -> None:
        super().__init__()
        self.keep_debug = level.upper() == "DEBUG"

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        message = record.getMessage()
        if not _SERVICE_LINE.match(message):
            return True
        if not self.keep_debug:
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def logging_config(
    level: str = "INFO", repeat_interval: float = 10.0, human: bool = False
) -> dict[str, Any]:
    """The one logging configuration (the Faust app is given it too): JSON lines on stderr,
    or plain ones (``human``) for the commands a person runs, through the three filters."""
    library_level = max(logging.getLevelName(level), logging.INFO)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "json": {"()": "worker.logs.JsonFormatter"},
            "human": {"()": "worker.logs.HumanFormatter"},
        },
        "filters": {
            "collapse": {"()": "worker.logs.RepeatCollapser", "interval": repeat_interval},
            "library_debug": {"()": "worker.logs.LibraryDebugFilter"},
            "service_chatter": {"()": "worker.logs.ServiceChatterFilter", "level": level},
        },
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "human" if human else "json",
                "stream": "ext://sys.stderr",
                "filters": ["service_chatter", "library_debug", "collapse"],
            }
        },
        "loggers": {OWN_LOGGER: {"level": level}},
        "root": {"handlers": ["stderr"], "level": logging.getLevelName(library_level)},
    }


def configure_logging(
    level: str = "INFO", repeat_interval: float = 10.0, human: bool = False
) -> None:
    logging.config.dictConfig(logging_config(level, repeat_interval, human))
