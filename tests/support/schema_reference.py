"""The pure-Python ``jsonschema`` validator the schema errors' reasons were first defined with,
as the reference the faster validation is checked against."""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import best_match

from worker.core import schema as schema_module


@cache
def reference_validator() -> Draft202012Validator:
    schema = orjson.loads(schema_module.TRACE_SCHEMA_PATH.read_bytes())
    checker = FormatChecker(formats=())
    checker.checks("date-time")(schema_module._is_date_time)
    return Draft202012Validator(schema, format_checker=checker)


def reference_reason(document: dict[str, Any]) -> str | None:
    """The reason of the error ``best_match`` picks, or None for a valid document."""
    error = best_match(reference_validator().iter_errors(document))
    if error is None:
        return None
    path = list(error.absolute_path)
    return schema_module._describe(path, error.validator, error.validator_value, error.instance)
