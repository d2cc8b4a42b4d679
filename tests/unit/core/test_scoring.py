"""The KnowledgePulse score: formulas, profiles, overrides, profile validation (SPEC "Score")."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from worker.core.scoring import (
    BUILTIN_PROFILES,
    DEFAULT_PROFILE,
    NOVELTY_FALLBACK,
    Novelty,
    NoveltySource,
    Override,
    Profile,
    ProfileError,
    ProfileSet,
    complexity,
    load_profiles,
    outcome,
    profiles_from_mapping,
    score_trace,
    tool_diversity,
)

from support.traces import (
    CODE_REVIEW_EXPECTED_SCORE,
    FINANCE_EXPECTED_SCORE,
    as_trace,
    code_review_example,
    finance_example,
    make_trace,
    score_of,
    step,
    steps_of,
)

TOL = 1e-9


def weights(c: float, n: float, d: float, o: float) -> dict[str, float]:
    return {"complexity": c, "novelty": n, "tool_diversity": d, "outcome": o}


def only_default(c: float, n: float, d: float, o: float) -> ProfileSet:
    return ProfileSet({"default": Profile("default", c, n, d, o)})


def nov(value: float) -> Novelty:
    return Novelty(value, NoveltySource.EMBEDDING)


# --- the seeds' examples ------------------------------------------------------------------


def test_seed_code_review_example_scores_0_66875() -> None:
    breakdown = score_of(code_review_example(), Novelty.unavailable())
    # C = 3/4*0.5 + 0 + 5/20*0.2 = 0.425; N = 0.5; D = min(1, 2/5*3) = 1; O = 0.95
    assert breakdown.dimensions.complexity == pytest.approx(0.425, abs=TOL)
    assert breakdown.dimensions.novelty == 0.5
    assert breakdown.dimensions.tool_diversity == 1.0
    assert breakdown.dimensions.outcome == pytest.approx(0.95, abs=TOL)
    assert breakdown.profile.name == "default"  # "code-review" is not a profile
    assert breakdown.overrides == ()
    assert breakdown.novelty_source is NoveltySource.NO_EMBEDDER
    assert breakdown.score == pytest.approx(CODE_REVIEW_EXPECTED_SCORE, abs=TOL)


def test_seed_finance_example_scores_0_724() -> None:
    breakdown = score_of(finance_example(), Novelty.unavailable())
    # 0.425*0.20 + 0.5*0.25 + 1*0.10 + 0.92*0.45 = 0.085 + 0.125 + 0.1 + 0.414
    assert breakdown.profile.name == "finance"
    assert breakdown.overrides == ()
    assert breakdown.score == pytest.approx(FINANCE_EXPECTED_SCORE, abs=TOL)


# --- complexity ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("types", "expected"),
    [
        # uniqueTypes/4*0.5 + (errorRecoveries > 0 ? 0.3 : 0) + len/20*0.2
        (("thought",), 0.125 + 0.01),
        (("thought", "thought"), 0.125 + 0.02),
        (("thought", "tool_call", "observation"), 0.375 + 0.03),
        (("thought", "error_recovery"), 0.25 + 0.3 + 0.02),
        (("thought", "tool_call", "observation", "error_recovery"), 0.5 + 0.3 + 0.04),
        (("observation",) * 20, 0.125 + 0.2),
        (("thought", "observation") * 10, 0.25 + 0.2),
        (("thought", "observation", "tool_call") * 10, 0.375 + 0.3),
        # capped at 1: 0.5 + 0.3 + 0.4 = 1.2
        (("thought", "tool_call", "observation", "error_recovery") * 10, 1.0),
        # exactly at the cap without exceeding it: 0.5 + 0.3 + 0.2 = 1.0
        (("thought", "tool_call", "observation", "error_recovery") * 5, 1.0),
    ],
)
def test_complexity_formula(types: tuple[str, ...], expected: float) -> None:
    trace = as_trace(make_trace(steps=steps_of(*types)))
    assert complexity(trace) == pytest.approx(expected, abs=TOL)


def test_complexity_never_exceeds_one() -> None:
    types = ("error_recovery", "thought", "tool_call", "observation") * 10
    assert complexity(as_trace(make_trace(steps=steps_of(*types)))) == 1.0


# --- novelty ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"), [(0.0, 0.0), (0.3, 0.3), (1.0, 1.0), (1.7, 1.0), (-0.4, 0.0)]
)
def test_novelty_is_clamped_to_unit_interval(value: float, expected: float) -> None:
    breakdown = score_of(make_trace(), nov(value))
    assert breakdown.dimensions.novelty == expected


@pytest.mark.parametrize(
    ("similarity", "expected"),
    [(1.0, 0.0), (0.25, 0.75), (0.0, 1.0), (-0.5, 1.0), (1.0000001, 0.0)],
)
def test_novelty_from_similarity_is_one_minus_similarity_clamped(
    similarity: float, expected: float
) -> None:
    novelty = Novelty.from_similarity(similarity)
    assert novelty.value == pytest.approx(expected, abs=TOL)
    assert 0.0 <= novelty.value <= 1.0
    assert novelty.source is NoveltySource.EMBEDDING


def test_novelty_fallbacks_are_one_half_with_their_source() -> None:
    assert NOVELTY_FALLBACK == 0.5
    assert Novelty.unavailable() == Novelty(0.5, NoveltySource.NO_EMBEDDER)
    assert Novelty.empty_cache() == Novelty(0.5, NoveltySource.EMPTY_CACHE)
    assert score_of(make_trace(), Novelty.empty_cache()).novelty_source is (
        NoveltySource.EMPTY_CACHE
    )


# --- tool diversity -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("types", "tools", "expected"),
    [
        # min(1, uniqueToolNames / max(1, len(steps)) * 3)
        (("thought", "observation"), {}, 0.0),
        (("tool_call", "observation", "thought"), {0: "a"}, 1.0),
        (("tool_call",) + ("observation",) * 5, {0: "a"}, 0.5),
        (("tool_call",) * 10, {0: "a", 1: "b"}, 0.6),
        # duplicate names count once
        (("tool_call",) * 10, {0: "a", 1: "a", 2: "b", 3: "b"}, 0.6),
        (("tool_call",) * 12, {i: "same" for i in range(12)}, 0.25),
        # capped: 3 tools over 4 steps = 2.25
        (("tool_call",) * 4, {0: "a", 1: "b", 2: "c"}, 1.0),
        # tool names are case-sensitive strings
        (("tool_call",) * 10, {0: "grep", 1: "Grep"}, 0.6),
    ],
)
def test_tool_diversity_formula(
    types: tuple[str, ...], tools: dict[int, str], expected: float
) -> None:
    trace = as_trace(make_trace(steps=steps_of(*types, tools=tools)))
    assert tool_diversity(trace) == pytest.approx(expected, abs=TOL)


def test_tool_on_any_step_type_counts() -> None:
    # The seeds count `tool` wherever it appears, not only on tool_call steps.
    steps = [
        step(0, "thought", tool="a"),
        step(1, "observation", tool="b"),
        *steps_of("observation", "observation", "observation", "observation"),
    ]
    assert tool_diversity(as_trace(make_trace(steps=steps))) == pytest.approx(1.0)


# --- outcome ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("success", "confidence", "expected"),
    [(True, 0.8, 0.8), (False, 0.8, 0.24), (True, 0.0, 0.0), (False, 1.0, 0.3), (True, 1, 1.0)],
)
def test_outcome_formula(success: bool, confidence: float, expected: float) -> None:
    trace = as_trace(make_trace(success=success, confidence=confidence))
    assert outcome(trace) == pytest.approx(expected, abs=TOL)


# --- builtin profiles and composites ------------------------------------------------------


BUILTIN_TABLE = {
    "default": (0.25, 0.35, 0.15, 0.25),
    "finance": (0.20, 0.25, 0.10, 0.45),
    "code": (0.20, 0.30, 0.30, 0.20),
    "medical": (0.15, 0.20, 0.10, 0.55),
    "customer_service": (0.20, 0.30, 0.20, 0.30),
}


def test_builtin_profiles_match_the_spec_table() -> None:
    assert set(BUILTIN_PROFILES) == set(BUILTIN_TABLE)
    for name, (c, n, d, o) in BUILTIN_TABLE.items():
        profile = BUILTIN_PROFILES[name]
        assert profile.name == name
        assert profile.as_dict() == weights(c, n, d, o)
        assert math.fsum(profile.as_dict().values()) == pytest.approx(1.0, abs=1e-12)


def composite_trace(domain: str) -> dict[str, Any]:
    """8 steps, all four types, one error recovery, tools search + calc, success, conf 0.8.

    C = 4/4*0.5 + 0.3 + 8/20*0.2 = 0.88; D = 2/8*3 = 0.75; O = 0.8; with N = 0.4.
    """
    steps = steps_of(
        "thought",
        "tool_call",
        "observation",
        "tool_call",
        "observation",
        "error_recovery",
        "thought",
        "observation",
        tools={1: "search", 3: "calc"},
    )
    return make_trace(domain=domain, steps=steps, success=True, confidence=0.8)


@pytest.mark.parametrize(
    ("domain", "expected"),
    [
        # 0.88*wC + 0.4*wN + 0.75*wD + 0.8*wO
        ("default", 0.22 + 0.14 + 0.1125 + 0.2),  # 0.6725
        ("finance", 0.176 + 0.10 + 0.075 + 0.36),  # 0.711
        ("code", 0.176 + 0.12 + 0.225 + 0.16),  # 0.681
        ("medical", 0.132 + 0.08 + 0.075 + 0.44),  # 0.727
        ("customer_service", 0.176 + 0.12 + 0.15 + 0.24),  # 0.686
    ],
)
def test_composite_by_hand_for_every_builtin_profile(domain: str, expected: float) -> None:
    breakdown = score_of(composite_trace(domain), nov(0.4))
    assert breakdown.dimensions.complexity == pytest.approx(0.88, abs=TOL)
    assert breakdown.dimensions.tool_diversity == pytest.approx(0.75, abs=TOL)
    assert breakdown.dimensions.outcome == pytest.approx(0.8, abs=TOL)
    assert breakdown.profile is BUILTIN_PROFILES[domain]
    assert breakdown.overrides == ()
    assert breakdown.composite == pytest.approx(expected, abs=TOL)
    assert breakdown.score == pytest.approx(expected, abs=TOL)


@pytest.mark.parametrize("domain", ["legal", "Finance", "finance ", "code-review", "other", "x"])
def test_unknown_domains_use_default_weights(domain: str) -> None:
    breakdown = score_of(composite_trace(domain), nov(0.4))
    assert breakdown.profile.name == DEFAULT_PROFILE
    assert breakdown.score == pytest.approx(0.6725, abs=TOL)


def test_same_trace_different_domains_differ() -> None:
    scores = {d: score_of(composite_trace(d), nov(0.4)).score for d in BUILTIN_TABLE}
    assert len(set(scores.values())) == len(scores)


# --- overrides ----------------------------------------------------------------------------


def test_single_thought_step_scores_0_1() -> None:
    breakdown = score_of(make_trace(steps=steps_of("thought"), confidence=1.0), nov(1.0))
    assert breakdown.composite > 0.1
    assert breakdown.score == 0.1
    assert breakdown.overrides == (Override.SINGLE_THOUGHT,)


def test_single_thought_with_tool_gets_0_1_then_low_diversity_penalty() -> None:
    document = make_trace(steps=[step(0, "thought", "hm", tool="calc")], confidence=1.0)
    breakdown = score_of(document, nov(1.0))
    assert breakdown.overrides == (Override.SINGLE_THOUGHT, Override.LOW_TOOL_DIVERSITY)
    assert breakdown.score == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("kind", ["observation", "tool_call", "error_recovery"])
def test_single_non_thought_step_is_not_overridden(kind: str) -> None:
    breakdown = score_of(make_trace(steps=steps_of(kind)), nov(0.5))
    assert Override.SINGLE_THOUGHT not in breakdown.overrides
    assert breakdown.score == pytest.approx(breakdown.composite, abs=TOL)


def test_two_thought_steps_are_not_single_thought() -> None:
    breakdown = score_of(make_trace(steps=steps_of("thought", "thought")), nov(0.5))
    assert breakdown.overrides == ()
    # C = 0.125 + 0.02; default: 0.145*0.25 + 0.5*0.35 + 0 + 0.9*0.25
    assert breakdown.score == pytest.approx(0.03625 + 0.175 + 0.225, abs=TOL)


def test_three_error_recoveries_with_success_add_0_1() -> None:
    document = make_trace(steps=steps_of("thought", *["error_recovery"] * 3), confidence=0.9)
    breakdown = score_of(document, nov(0.5))
    # C = 2/4*0.5 + 0.3 + 4/20*0.2 = 0.59; 0.59*0.25 + 0.175 + 0 + 0.9*0.25 = 0.5475
    assert breakdown.composite == pytest.approx(0.5475, abs=TOL)
    assert breakdown.overrides == (Override.ERROR_RECOVERY_BONUS,)
    assert breakdown.score == pytest.approx(0.6475, abs=TOL)


def test_exactly_two_error_recoveries_get_no_bonus() -> None:
    document = make_trace(steps=steps_of("thought", "error_recovery", "error_recovery"))
    breakdown = score_of(document, nov(0.5))
    # > 2, not >= 2. C = 0.25 + 0.3 + 0.03 = 0.58 -> 0.145 + 0.175 + 0.225
    assert breakdown.overrides == ()
    assert breakdown.score == pytest.approx(0.545, abs=TOL)


def test_error_recovery_bonus_needs_success() -> None:
    document = make_trace(steps=steps_of(*["error_recovery"] * 4), success=False)
    breakdown = score_of(document, nov(0.5))
    assert breakdown.overrides == ()
    assert breakdown.score == pytest.approx(breakdown.composite, abs=TOL)


def test_error_recovery_bonus_is_capped_at_one() -> None:
    profiles = only_default(0.0, 0.0, 0.0, 1.0)
    document = make_trace(steps=steps_of(*["error_recovery"] * 3), confidence=0.95)
    breakdown = score_trace(as_trace(document), nov(0.5), profiles)
    assert breakdown.composite == pytest.approx(0.95, abs=TOL)
    assert breakdown.overrides == (Override.ERROR_RECOVERY_BONUS,)
    assert breakdown.score == 1.0


def test_single_tool_name_subtracts_0_1() -> None:
    document = make_trace(
        steps=steps_of("tool_call", "observation", "tool_call", tools={0: "grep", 2: "grep"})
    )
    breakdown = score_of(document, nov(0.5))
    assert breakdown.overrides == (Override.LOW_TOOL_DIVERSITY,)
    assert breakdown.score == pytest.approx(breakdown.composite - 0.1, abs=TOL)


def test_no_tools_at_all_is_not_penalised() -> None:
    document = make_trace(steps=steps_of("thought", "observation", "thought"))
    breakdown = score_of(document, nov(0.5))
    assert breakdown.dimensions.tool_diversity == 0.0
    assert breakdown.overrides == ()
    assert breakdown.score == pytest.approx(breakdown.composite, abs=TOL)


def test_two_tool_names_are_not_penalised() -> None:
    document = make_trace(steps=steps_of("tool_call", "tool_call", tools={0: "a", 1: "b"}))
    assert score_of(document, nov(0.5)).overrides == ()


def test_low_tool_diversity_penalty_is_floored_at_zero() -> None:
    profiles = only_default(0.0, 0.0, 0.0, 1.0)
    document = make_trace(
        steps=steps_of("tool_call", "observation", tools={0: "x"}), success=False, confidence=0.1
    )
    breakdown = score_trace(as_trace(document), nov(0.5), profiles)
    assert breakdown.composite == pytest.approx(0.03, abs=TOL)
    assert breakdown.overrides == (Override.LOW_TOOL_DIVERSITY,)
    assert breakdown.score == 0.0


def test_bonus_and_penalty_combined_in_order() -> None:
    steps = steps_of(
        "tool_call",
        "error_recovery",
        "error_recovery",
        "error_recovery",
        "observation",
        tools={0: "retry"},
    )
    breakdown = score_of(make_trace(steps=steps), nov(0.5))
    assert breakdown.overrides == (Override.ERROR_RECOVERY_BONUS, Override.LOW_TOOL_DIVERSITY)
    # C = 3/4*0.5 + 0.3 + 5/20*0.2 = 0.725; D = 1/5*3 = 0.6; O = 0.9
    expected = 0.725 * 0.25 + 0.5 * 0.35 + 0.6 * 0.15 + 0.9 * 0.25
    assert breakdown.composite == pytest.approx(expected, abs=TOL)
    assert breakdown.score == pytest.approx(expected, abs=TOL)


def test_bonus_capped_then_penalty_applies() -> None:
    # Order matters: min(1, 0.95 + 0.1) = 1.0, then - 0.1 = 0.9 (not 0.95).
    profiles = only_default(0.0, 0.0, 0.0, 1.0)
    steps = steps_of("error_recovery", "error_recovery", "error_recovery", tools={0: "t"})
    breakdown = score_trace(as_trace(make_trace(steps=steps, confidence=0.95)), nov(0.5), profiles)
    assert breakdown.overrides == (Override.ERROR_RECOVERY_BONUS, Override.LOW_TOOL_DIVERSITY)
    assert breakdown.score == pytest.approx(0.9, abs=TOL)


def test_score_is_clamped_to_one_when_weights_sum_slightly_above() -> None:
    # weights may sum to 1 within 1e-9; all dimensions 1 then give a composite above 1
    profiles = only_default(0.25, 0.35, 0.15, 0.25 + 9e-10)
    steps = steps_of(
        "thought",
        "observation",
        "error_recovery",
        *["tool_call"] * 21,
        tools={i: f"tool{i}" for i in range(3, 24)},
    )
    breakdown = score_trace(as_trace(make_trace(steps=steps, confidence=1.0)), nov(1.0), profiles)
    assert breakdown.dimensions.complexity == 1.0
    assert breakdown.dimensions.tool_diversity == 1.0
    assert breakdown.composite > 1.0
    assert breakdown.overrides == ()
    assert breakdown.score == 1.0


def test_score_is_clamped_to_zero_when_weights_sum_slightly_below() -> None:
    profiles = only_default(0.25, 0.35, 0.15, 0.25 - 9e-10)
    steps = steps_of("observation", "observation")
    breakdown = score_trace(
        as_trace(make_trace(steps=steps, success=False, confidence=0.0)), nov(0.0), profiles
    )
    # C = 0.125 + 0.02 = 0.145 -> composite 0.03625: no clamping needed, but never negative
    assert breakdown.score == pytest.approx(0.03625, abs=TOL)
    assert breakdown.score >= 0.0


def test_breakdown_to_json() -> None:
    breakdown = score_of(composite_trace("code"), nov(0.4))
    payload = breakdown.to_json()
    assert set(payload) == {
        "dimensions",
        "profile",
        "weights",
        "composite",
        "overrides",
        "score",
        "novelty_source",
    }
    assert payload["dimensions"]["complexity"] == pytest.approx(0.88)
    assert payload["dimensions"]["novelty"] == 0.4
    assert payload["profile"] == "code"
    assert payload["weights"] == weights(0.20, 0.30, 0.30, 0.20)
    assert payload["overrides"] == []
    assert payload["novelty_source"] == "embedding"
    assert orjson.loads(orjson.dumps(payload)) == payload
    single = score_of(make_trace(steps=[step(0, "thought", tool="t")])).to_json()
    assert single["overrides"] == ["single_thought", "low_tool_diversity"]


# --- profile validation -------------------------------------------------------------------


def good_mapping() -> dict[str, Any]:
    return {name: weights(*ws) for name, ws in BUILTIN_TABLE.items()}


def test_profiles_from_mapping_builds_every_profile() -> None:
    profiles = profiles_from_mapping(good_mapping())
    assert profiles.names == frozenset(BUILTIN_TABLE)
    assert profiles.for_domain("medical").outcome == 0.55
    assert profiles.for_domain("nope").name == "default"


def test_weights_within_tolerance_of_one_are_accepted() -> None:
    Profile("default", 0.25, 0.35, 0.15, 0.25 + 5e-10)
    Profile("default", 0.25, 0.35, 0.15, 0.25 - 5e-10)
    Profile("default", 1, 0, 0, 0)


@pytest.mark.parametrize(
    ("raw", "fragments"),
    [
        ({"default": weights(0.25, 0.35, 0.15, 0.30)}, ["'default'", "sum to 1.05", "not 1.0"]),
        ({"default": weights(0.25, 0.35, 0.15, 0.25 + 2e-9)}, ["'default'", "sum to"]),
        ({"default": weights(0.2, 0.2, 0.2, 0.2)}, ["'default'", "sum to 0.8"]),
        (
            {"default": weights(0.25, 0.35, 0.15, 0.25), "finance": weights(0.5, 0.5, 0.5, 0.5)},
            ["'finance'", "sum to 2.0"],
        ),
        ({"default": weights(0.5, 0.6, -0.1, 0.0)}, ["'default'", "tool_diversity=-0.1", "[0, 1]"]),
        ({"default": weights(1.5, -0.5, 0.0, 0.0)}, ["'default'", "complexity=1.5", "[0, 1]"]),
        ({"default": weights(math.nan, 0.5, 0.25, 0.25)}, ["'default'", "complexity=nan"]),
        ({"default": weights(math.inf, 0.5, 0.25, 0.25)}, ["'default'", "complexity=inf"]),
        ({"finance": weights(0.25, 0.35, 0.15, 0.25)}, ["'default' profile"]),
        (
            {"default": {"complexity": 0.25, "novelty": 0.35, "tool_diversity": 0.4}},
            ["'default'", "expected exactly the keys", "outcome"],
        ),
        (
            {"default": {**weights(0.25, 0.35, 0.15, 0.25), "speed": 0.0}},
            ["'default'", "expected exactly the keys", "speed"],
        ),
        (
            {"default": {"C": 0.25, "N": 0.35, "D": 0.15, "O": 0.25}},
            ["'default'", "expected exactly the keys"],
        ),
        ({"default": {**weights(0.25, 0.35, 0.15, 0.0), "outcome": "0.25"}}, ["outcome", "number"]),
        ({"default": {**weights(0.25, 0.35, 0.15, 0.0), "outcome": None}}, ["outcome", "number"]),
        ({"default": weights(True, 0.0, 0.0, 0.0)}, ["complexity", "must be a number"]),  # type: ignore[arg-type]
        ({"default": [0.25, 0.35, 0.15, 0.25]}, ["'default'", "list"]),
        ({"default": 1.0}, ["'default'", "float"]),
        ({}, ["non-empty JSON object"]),
        ([], ["non-empty JSON object"]),
        ("default", ["non-empty JSON object"]),
        (None, ["non-empty JSON object"]),
    ],
)
def test_invalid_profiles_raise_profile_error_with_clear_message(
    raw: Any, fragments: list[str]
) -> None:
    with pytest.raises(ProfileError) as excinfo:
        profiles_from_mapping(raw)
    message = str(excinfo.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_profile_error_is_a_value_error() -> None:
    assert issubclass(ProfileError, ValueError)


def test_profile_set_requires_default() -> None:
    with pytest.raises(ProfileError, match="'default'"):
        ProfileSet({"code": BUILTIN_PROFILES["code"]})


def test_load_profiles_none_gives_builtins() -> None:
    profiles = load_profiles(None)
    assert dict(profiles.profiles) == dict(BUILTIN_PROFILES)


def test_load_profiles_from_json_file_replaces_builtins(tmp_path: Path) -> None:
    path = tmp_path / "profiles.json"
    path.write_bytes(
        orjson.dumps(
            {
                "default": weights(0.25, 0.25, 0.25, 0.25),
                "legal": weights(0.1, 0.1, 0.1, 0.7),
            }
        )
    )
    profiles = load_profiles(path)
    assert profiles.names == frozenset({"default", "legal"})
    assert profiles.for_domain("legal").as_dict() == weights(0.1, 0.1, 0.1, 0.7)
    # finance is no longer configured: it falls back to the file's default
    assert profiles.for_domain("finance").name == "default"
    document = composite_trace("legal")
    breakdown = score_trace(as_trace(document), nov(0.4), profiles)
    assert breakdown.score == pytest.approx(0.088 + 0.04 + 0.075 + 0.56, abs=TOL)
    breakdown = score_trace(as_trace(composite_trace("finance")), nov(0.4), profiles)
    assert breakdown.score == pytest.approx((0.88 + 0.4 + 0.75 + 0.8) / 4, abs=TOL)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"{not json", "cannot read profiles file"),
        (b"", "cannot read profiles file"),
        (b'{"default": {"complexity": NaN}}', "cannot read profiles file"),
        (b"\xff\xfe", "cannot read profiles file"),
        (b"[1, 2]", "non-empty JSON object"),
        (b'{"default": {"complexity": 1, "novelty": 1, "tool_diversity": 1, "outcome": 1}}', "sum"),
        # A key given twice: JSON decoders keep the last, and which one was meant is unknown.
        (
            b'{"default": {"complexity": 0.25, "novelty": 0.35, "tool_diversity": 0.15, '
            b'"outcome": 0.25}, "default": {"complexity": 1, "novelty": 0, "tool_diversity": 0,'
            b' "outcome": 0}}',
            "key 'default' appears twice",
        ),
        (
            b'{"default": {"complexity": 0.25, "novelty": 0.35, "tool_diversity": 0.15, '
            b'"outcome": 0.25, "outcome": 0.25}}',
            "key 'outcome' appears twice",
        ),
    ],
)
def test_load_profiles_bad_file_content(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "profiles.json"
    path.write_bytes(content)
    with pytest.raises(ProfileError, match=fragment):
        load_profiles(path)


def test_load_profiles_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.json"
    with pytest.raises(ProfileError) as excinfo:
        load_profiles(path)
    assert "cannot read profiles file" in str(excinfo.value)
    assert str(path) in str(excinfo.value)


def test_load_profiles_directory_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read profiles file"):
        load_profiles(tmp_path)
