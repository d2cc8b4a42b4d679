"""The values the range flags of `replay`, `rescore` and `report` take (offsets, times,
partitions), each checked as the flags are read: a bad one is a usage error naming the flag,
said before a broker is asked."""

from __future__ import annotations

from datetime import UTC, datetime

import click


def iso_time(value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"not an ISO-8601 time: {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _whole_number(value: str) -> int | None:
    """0, 1, 2, ... in plain digits, else None: int() also reads "1_0" as 10, "+1" as 1 and
    "-1" (a negative start read the log from its beginning, a negative end read nothing)."""
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() else None


def offset(value: str) -> int:
    found = _whole_number(value)
    if found is None:
        raise click.BadParameter(f"expected an offset like 0 or 1000: {value!r}")
    return found


def partition_list(value: str) -> list[int]:
    """The partitions named, each once (one named twice would be read, and counted, twice);
    none named (``--partitions ,``) is refused, where it would read them all, and one not in
    plain digits ("-1", "1_0") before the broker is asked."""
    named = [_whole_number(p) for p in value.split(",") if p.strip()]
    partitions = [p for p in dict.fromkeys(named) if p is not None]
    if not partitions or None in named:
        raise click.BadParameter(f"expected partitions like 0,1,2: {value!r}")
    return partitions
