"""The pure-Python ``jsonschema`` validator the schema errors' reasons were first defined with,
as the reference the faster validation is checked against."""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema_rs
import orjson
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import best_match

from worker.core import schema as schema_module


@cache
def reference_validator() -> Draft202012Validator:
    schema = orjson.loads(schema_module.TRACE_SCHEMA_PATH.read_bytes())
    checker = FormatChecker(formats=())
    checker.checks("date-time")(_is_date_time)
    return Draft202012Validator(schema, format_checker=checker)


@cache
def _date_time() -> jsonschema_rs.Validator:
    # RFC 3339 as the worker checks it. The reference's own (the rfc3339-validator package)
    # refuses a lower-case t or z and leap seconds, and accepts a trailing newline.
    return jsonschema_rs.validator_for({"format": "date-time"}, validate_formats=True)


def _is_date_time(value: object) -> bool:
    return not isinstance(value, str) or _date_time().is_valid(value)


def reference_reason(document: dict[str, Any]) -> str | None:
    """The reason of the error ``best_match`` picks, or None for a valid document."""
    error = best_match(reference_validator().iter_errors(document))
    if error is None:
        return None
    path = list(error.absolute_path)
    return schema_module._describe(path, error.validator, error.validator_value, error.instance)
