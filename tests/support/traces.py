"""Shared test helpers: valid ReasoningTrace documents, the seeds' examples, records.

``make_trace()`` returns a fresh, schema-valid document; keyword overrides replace whole
top-level fields, and the ``domain`` / ``success`` / ``confidence`` / ``steps`` shortcuts
cover what the scoring tests vary most.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from worker.core.scoring import BUILTIN_PROFILES, Novelty, ProfileSet, ScoreBreakdown, score_trace
from worker.core.trace import Trace, validate_trace

CONTEXT_ORG = "https://openknowledgepulse.org/schema/v1"
CONTEXT_DEV = "https://knowledgepulse.dev/schema/v1"
FIXED_CREATED_AT = "2025-01-15T12:00:00+00:00"
FIXED_CREATED_AT_MS = 1_736_942_400_000
BUILTIN = ProfileSet(BUILTIN_PROFILES)
DELETE: Any = object()
"""Pass as a ``make_trace`` keyword value to remove that top-level field."""


def step(
    step_id: int,
    type_: str,
    content: str | None = None,
    tool: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One step; ``tool`` is the tool name (a ``tool`` object is added only when given)."""
    out: dict[str, Any] = {"step_id": step_id, "type": type_}
    if content is not None:
        out["content"] = content
    if tool is not None:
        out["tool"] = {"name": tool}
    out.update(extra)
    return out


def steps_of(*types: str, tools: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """Steps with the given types in order; ``tools`` maps a step index to its tool name."""
    tools = tools or {}
    return [step(i, t, content=f"{t} {i}", tool=tools.get(i)) for i, t in enumerate(types)]


def thin_steps(count: int) -> list[dict[str, Any]]:
    """``count`` minimal thoughts: a big trace that costs little to build."""
    return [{"step_id": i, "type": "thought"} for i in range(count)]


def default_steps() -> list[dict[str, Any]]:
    return [
        step(0, "thought", "Plan the lookup"),
        step(1, "tool_call", tool="search", input={"q": "kafka"}),
        step(2, "observation", "Found three results"),
    ]


def make_trace(
    *,
    domain: str = "general",
    success: bool = True,
    confidence: float = 0.9,
    steps: list[dict[str, Any]] | None = None,
    objective: str = "Summarise the Kafka consumer docs",
    metadata: dict[str, Any] | None = None,
    **top: Any,
) -> dict[str, Any]:
    """A valid trace document; ``metadata`` entries are merged, other keywords replace fields.

    A keyword whose value is ``DELETE`` removes that top-level field.
    """
    document: dict[str, Any] = {
        "@context": CONTEXT_ORG,
        "@type": "ReasoningTrace",
        "id": "kp:trace:test-0001",
        "metadata": {
            "created_at": FIXED_CREATED_AT,
            "task_domain": domain,
            "success": success,
            "quality_score": 0,
            "visibility": "network",
            "privacy_level": "aggregated",
        },
        "task": {"objective": objective},
        "steps": default_steps() if steps is None else steps,
        "outcome": {"result_summary": "done", "confidence": confidence},
    }
    if metadata:
        document["metadata"].update(metadata)
    for name, value in top.items():
        key = {"context": "@context", "type_": "@type"}.get(name, name)
        if value is DELETE:
            document.pop(key, None)
        else:
            document[key] = value
    return document


def trace_bytes(document: dict[str, Any] | None = None, **overrides: Any) -> bytes:
    """Serialized trace: the given document, or ``make_trace(**overrides)``."""
    return orjson.dumps(make_trace(**overrides) if document is None else document)


def as_trace(document: dict[str, Any]) -> Trace:
    """Validate a document (raises if the helper built an invalid one)."""
    return validate_trace(document)


def score_of(
    document: dict[str, Any],
    novelty: Novelty | None = None,
    profiles: ProfileSet = BUILTIN,
) -> ScoreBreakdown:
    return score_trace(as_trace(document), novelty or Novelty.unavailable(), profiles)


def code_review_example() -> dict[str, Any]:
    """The example trace of the English scoring page (seed 002), created_at fixed."""
    return copy.deepcopy(
        {
            "@context": CONTEXT_DEV,
            "@type": "ReasoningTrace",
            "id": "kp:trace:550e8400-e29b-41d4-a716-446655440000",
            "metadata": {
                "created_at": FIXED_CREATED_AT,
                "task_domain": "code-review",
                "success": True,
                "quality_score": 0,
                "visibility": "network",
                "privacy_level": "aggregated",
            },
            "task": {"objective": "Review PR #42 for security issues"},
            "steps": [
                {
                    "step_id": 0,
                    "type": "thought",
                    "content": "Analyzing diff for injection vectors",
                },
                {
                    "step_id": 1,
                    "type": "tool_call",
                    "tool": {"name": "github_pr_read"},
                    "input": {"pr": 42},
                },
                {
                    "step_id": 2,
                    "type": "observation",
                    "content": "Found unsanitized SQL in handler.ts",
                },
                {
                    "step_id": 3,
                    "type": "tool_call",
                    "tool": {"name": "static_analysis"},
                    "input": {"file": "handler.ts"},
                },
                {
                    "step_id": 4,
                    "type": "observation",
                    "content": "Confirmed SQL injection vulnerability",
                },
            ],
            "outcome": {
                "result_summary": "Identified 1 critical SQL injection vulnerability",
                "confidence": 0.95,
            },
        }
    )


def finance_example() -> dict[str, Any]:
    """The finance example of the Spanish Phase 2 page (seed 003), created_at fixed."""
    return copy.deepcopy(
        {
            "@context": CONTEXT_ORG,
            "@type": "ReasoningTrace",
            "id": "kp:trace:finance-demo-001",
            "metadata": {
                "created_at": FIXED_CREATED_AT,
                "task_domain": "finance",
                "success": True,
                "quality_score": 0,
                "visibility": "network",
                "privacy_level": "aggregated",
            },
            "task": {"objective": "Analyze TSMC Q4 earnings report"},
            "steps": [
                {"step_id": 0, "type": "thought", "content": "Extracting revenue and margin data"},
                {
                    "step_id": 1,
                    "type": "tool_call",
                    "tool": {"name": "financial_data_api"},
                    "input": {"ticker": "TSM"},
                },
                {"step_id": 2, "type": "observation", "content": "Revenue: $26.3B, up 14.3% YoY"},
                {
                    "step_id": 3,
                    "type": "tool_call",
                    "tool": {"name": "comparison_tool"},
                    "input": {"metric": "gross_margin"},
                },
                {
                    "step_id": 4,
                    "type": "observation",
                    "content": "Gross margin 57.9%, above industry average",
                },
            ],
            "outcome": {
                "result_summary": "Strong quarterly performance driven by AI chip demand",
                "confidence": 0.92,
            },
        }
    )


CODE_REVIEW_EXPECTED_SCORE = 0.66875
FINANCE_EXPECTED_SCORE = 0.724


def varied_traces(count: int) -> list[dict[str, Any]]:
    """``count`` valid, distinct documents over several domains, outcomes and tools: the two
    seed examples, then made traces (some accepted, some rejected at the default threshold)."""
    documents = [code_review_example(), finance_example()]
    tools = ("search", "shell", "github_pr_read", "sql")
    for i in range(count - len(documents)):
        documents.append(
            make_trace(
                id=f"kp:trace:varied-{i:04d}",
                domain=("general", "code-review", "finance")[i % 3],
                success=i % 4 != 3,
                confidence=0.5 + (i % 5) / 10,
                objective=f"Task {i}: find why the nightly build {i % 7} fails",
                steps=steps_of(
                    *("thought", "tool_call", "observation", "tool_call", "observation")[
                        : 2 + i % 4
                    ],
                    tools={1: tools[i % 4], 3: tools[(i + 1) % 4]},
                ),
            )
        )
    return documents[:count]
