"""The Kafka clients a worker object builds, seen from outside it.

``built_clients(monkeypatch, module, "AIOKafkaProducer")`` replaces the client class that
``module`` builds its clients with by a subclass that keeps each instance and the keywords it
was built with: a test reads what the worker asked of its client without reaching into the
object that holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest


@dataclass(frozen=True)
class Built:
    """One client built: the client itself and the keywords it was built with."""

    client: Any
    kwargs: dict[str, Any]


def built_clients(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str) -> list[Built]:
    """Each client of class ``module.name`` built from now on, in order (the real class
    builds it: only the recording is added)."""
    built: list[Built] = []
    base = getattr(module, name)

    class Recording(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(Built(self, kwargs))

    Recording.__name__ = base.__name__
    monkeypatch.setattr(module, name, Recording)
    return built
