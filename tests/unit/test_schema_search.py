"""The error search over many steps reports what best_match reports, however it skips ahead.

The whole-document check takes a trace's steps a run of items at a time and the search skips
the runs before the first invalid one, then looks for the last invalid item in doubling runs
from the end: these place errors in several runs, at several depths, against the pure-Python
validator's ``best_match``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.core.errors import SchemaViolationError
from worker.core.trace import validate_trace

from support.schema_reference import reference_reason
from support.traces import make_trace

STEPS = 2_600  # three runs of items, the last one short
BREAKS: dict[str, tuple[str, Any]] = {
    "no type": ("type", None),  # a missing required field: at the step itself
    "bad type": ("type", "thougxt"),  # one level below the step
    "bad id": ("step_id", -1),
    "not an object": ("", "x"),  # the step is a string
    "empty tool name": ("tool", {"name": ""}),  # two levels below the step
}


def broken(breaks: list[tuple[int, str]]) -> dict[str, Any]:
    steps: list[Any] = [{"step_id": index, "type": "thought"} for index in range(STEPS)]
    for index, name in breaks:
        field, value = BREAKS[name]
        if not field:
            steps[index] = value
        elif not isinstance(steps[index], dict):
            continue
        elif value is None:
            steps[index].pop(field, None)
        else:
            steps[index][field] = value
    return make_trace(steps=steps)


def check(document: dict[str, Any]) -> None:
    expected = reference_reason(document)
    assert expected is not None
    with pytest.raises(SchemaViolationError) as excinfo:
        validate_trace(document)
    assert excinfo.value.reason == expected


@pytest.mark.parametrize(
    "breaks",
    [
        [(STEPS - 1, "bad type")],
        [(0, "bad type")],
        [(1_300, "bad type")],
        [(5, "bad type"), (STEPS - 1, "no type")],
        [(5, "no type"), (STEPS - 1, "bad type")],
        [(1_100, "empty tool name"), (2_100, "bad id"), (2_500, "empty tool name")],
        [(1_023, "bad type"), (1_024, "not an object")],
        [(2_047, "no type"), (2_048, "bad type"), (STEPS - 2, "no type")],
    ],
)
def test_errors_in_several_runs_of_steps(breaks: list[tuple[int, str]]) -> None:
    check(broken(breaks))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    breaks=st.lists(
        st.tuples(st.integers(0, STEPS - 1), st.sampled_from(sorted(BREAKS))),
        min_size=1,
        max_size=4,
    )
)
def test_the_error_reported_is_the_one_best_match_picks(breaks: list[tuple[int, str]]) -> None:
    check(broken(breaks))
