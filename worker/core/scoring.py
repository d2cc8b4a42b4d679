"""The KnowledgePulse score: four dimensions, a domain weight profile, three overrides. Pure.

Formulas, profiles and override order follow SPEC.md ("Score"); nothing here does I/O
except ``load_profiles``, which reads the operator's profile file once at start-up.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson

from worker.core.trace import Trace
from worker.settings import RepeatedKeyError, unique_keys

NOVELTY_FALLBACK = 0.5
WEIGHT_SUM_TOLERANCE = 1e-9
DEFAULT_PROFILE = "default"
DIMENSION_NAMES = ("complexity", "novelty", "tool_diversity", "outcome")


class NoveltySource(StrEnum):
    EMBEDDING = "embedding"
    EMPTY_CACHE = "empty_cache"
    NO_EMBEDDER = "no_embedder"


class Override(StrEnum):
    SINGLE_THOUGHT = "single_thought"
    ERROR_RECOVERY_BONUS = "error_recovery_bonus"
    LOW_TOOL_DIVERSITY = "low_tool_diversity"


@dataclass(frozen=True, slots=True)
class Novelty:
    value: float
    source: NoveltySource

    @classmethod
    def unavailable(cls) -> Novelty:
        return cls(NOVELTY_FALLBACK, NoveltySource.NO_EMBEDDER)

    @classmethod
    def empty_cache(cls) -> Novelty:
        return cls(NOVELTY_FALLBACK, NoveltySource.EMPTY_CACHE)

    @classmethod
    def from_similarity(cls, max_cosine: float) -> Novelty:
        return cls(_clamp(1.0 - max_cosine), NoveltySource.EMBEDDING)


class ProfileError(ValueError):
    """A weight profile is unusable; raised at start-up with the profile and the problem."""


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    complexity: float
    novelty: float
    tool_diversity: float
    outcome: float

    def __post_init__(self) -> None:
        weights = self.as_dict()
        for weight_name, weight in weights.items():
            if not isinstance(weight, int | float) or isinstance(weight, bool):
                raise ProfileError(f"profile {self.name!r}: {weight_name} must be a number")
            if not 0.0 <= weight <= 1.0:
                raise ProfileError(
                    f"profile {self.name!r}: {weight_name}={weight} is not in [0, 1]"
                )
        total = math.fsum(weights.values())
        if abs(total - 1.0) > WEIGHT_SUM_TOLERANCE:
            raise ProfileError(f"profile {self.name!r}: weights sum to {total!r}, not 1.0")

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in DIMENSION_NAMES}


BUILTIN_PROFILES: Mapping[str, Profile] = {
    p.name: p
    for p in (
        Profile("default", 0.25, 0.35, 0.15, 0.25),
        Profile("finance", 0.20, 0.25, 0.10, 0.45),
        Profile("code", 0.20, 0.30, 0.30, 0.20),
        Profile("medical", 0.15, 0.20, 0.10, 0.55),
        Profile("customer_service", 0.20, 0.30, 0.20, 0.30),
    )
}


@dataclass(frozen=True)
class ProfileSet:
    """Domain -> weights. Exact domain match; anything else uses ``default``."""

    profiles: Mapping[str, Profile]

    def __post_init__(self) -> None:
        if DEFAULT_PROFILE not in self.profiles:
            raise ProfileError("profiles must include a 'default' profile")

    def for_domain(self, domain: str) -> Profile:
        return self.profiles.get(domain) or self.profiles[DEFAULT_PROFILE]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.profiles)


def profiles_from_mapping(raw: Any) -> ProfileSet:
    """Build profiles from ``{"domain": {"complexity": .., "novelty": .., ...}}``."""
    if not isinstance(raw, dict) or not raw:
        raise ProfileError("profiles must be a non-empty JSON object of domain -> weights")
    expected = set(DIMENSION_NAMES)
    profiles = {}
    for name, weights in raw.items():
        if not isinstance(weights, dict) or set(weights) != expected:
            raise ProfileError(
                f"profile {name!r}: expected exactly the keys {sorted(expected)}, "
                f"got {sorted(weights) if isinstance(weights, dict) else type(weights).__name__}"
            )
        profiles[name] = Profile(name=name, **weights)
    return ProfileSet(profiles)


def load_profiles(path: Path | None) -> ProfileSet:
    """The built-in profiles, or the operator's file (JSON) replacing them entirely."""
    if path is None:
        return ProfileSet(BUILTIN_PROFILES)
    try:
        data = path.read_bytes()
        raw = orjson.loads(data)
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ProfileError(f"cannot read profiles file {path}: {exc}") from None
    try:
        json.loads(data, object_pairs_hook=unique_keys)
    except RepeatedKeyError as exc:
        raise ProfileError(
            f"key {exc.key!r} appears twice in one object of the profiles file"
        ) from None
    except RecursionError:  # nested that deep, it has no profile's shape anyway
        pass
    return profiles_from_mapping(raw)


@dataclass(frozen=True, slots=True)
class Dimensions:
    complexity: float
    novelty: float
    tool_diversity: float
    outcome: float


@dataclass(frozen=True, slots=True)
class ScoreBreakdown:
    dimensions: Dimensions
    profile: Profile
    composite: float
    overrides: tuple[Override, ...]
    score: float
    novelty_source: NoveltySource

    def to_json(self) -> dict[str, Any]:
        return {
            "dimensions": {name: getattr(self.dimensions, name) for name in DIMENSION_NAMES},
            "profile": self.profile.name,
            "weights": self.profile.as_dict(),
            "composite": self.composite,
            "overrides": [str(o) for o in self.overrides],
            "score": self.score,
            "novelty_source": str(self.novelty_source),
        }


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, value))


def complexity(trace: Trace) -> float:
    steps = trace.steps
    unique_types = len({step["type"] for step in steps})
    bonus = 0.3 if any(step["type"] == "error_recovery" for step in steps) else 0.0
    return min(1.0, (unique_types / 4) * 0.5 + bonus + (len(steps) / 20) * 0.2)


def _unique_tool_names(trace: Trace) -> set[str]:
    return {step["tool"]["name"] for step in trace.steps if "tool" in step}


def tool_diversity(trace: Trace) -> float:
    return min(1.0, (len(_unique_tool_names(trace)) / max(1, len(trace.steps))) * 3)


def outcome(trace: Trace) -> float:
    return trace.confidence * (1.0 if trace.success else 0.3)


def score_trace(trace: Trace, novelty: Novelty, profiles: ProfileSet) -> ScoreBreakdown:
    """Composite of the four dimensions with the domain's weights, then the overrides in order."""
    dims = Dimensions(
        complexity=complexity(trace),
        novelty=_clamp(novelty.value),
        tool_diversity=tool_diversity(trace),
        outcome=outcome(trace),
    )
    profile = profiles.for_domain(trace.domain)
    composite = (
        dims.complexity * profile.complexity
        + dims.novelty * profile.novelty
        + dims.tool_diversity * profile.tool_diversity
        + dims.outcome * profile.outcome
    )
    steps = trace.steps
    score = composite
    fired: list[Override] = []
    if len(steps) == 1 and steps[0]["type"] == "thought":
        score = 0.1
        fired.append(Override.SINGLE_THOUGHT)
    error_recoveries = sum(1 for step in steps if step["type"] == "error_recovery")
    if error_recoveries > 2 and trace.success:
        score = min(1.0, score + 0.1)
        fired.append(Override.ERROR_RECOVERY_BONUS)
    uses_tools = any("tool" in step for step in steps)
    if uses_tools and len(_unique_tool_names(trace)) <= 1:
        score = max(0.0, score - 0.1)
        fired.append(Override.LOW_TOOL_DIVERSITY)
    return ScoreBreakdown(
        dimensions=dims,
        profile=profile,
        composite=composite,
        overrides=tuple(fired),
        score=_clamp(score),
        novelty_source=novelty.source,
    )
