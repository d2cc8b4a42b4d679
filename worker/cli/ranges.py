"""The range flags of `replay`, `rescore` and `report` and the :class:`TopicRange` they make.
Their values (offsets, times, partitions) are each checked as the flags are read: a bad one
is a usage error naming the flag, said before a broker is asked."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from worker.cli.main import F, options

if TYPE_CHECKING:
    from worker.io.kafka import PartitionLogReader


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


def _exclusive_with(other: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A callback that refuses its flag next to ``other`` (one start, one end of a range), and
    an offset range with no offset in it (it read nothing, and replay made its topics)."""

    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None and ctx.params.get(other[2:].replace("-", "_")) is not None:
            raise click.UsageError(f"{param.opts[0]} is not allowed with {other}", ctx)
        given = {**ctx.params, str(param.name): value}  # the flags read so far, and this one
        start, end = given.get("from_offset"), given.get("to_offset")
        if start is not None and end is not None and end <= start:
            raise click.UsageError(f"--to-offset {end} is not after --from-offset {start}", ctx)
        return value

    return check


def range_options(what: str) -> Callable[[F], F]:
    """The offsets or times, and partitions, of the topics a command reads (``what`` names its
    records: the traces replay reads, or the outputs rescore and report read)."""
    bounds = [
        ("--from-offset", offset, "--from-time", "first offset (default: the beginning)"),
        ("--from-time", iso_time, "--from-offset", f"first {what} at or after this ISO time"),
        ("--to-offset", offset, "--to-time", "stop before this offset"),
        ("--to-time", iso_time, "--to-offset", f"stop at the first {what} at or after this"),
    ]
    return options(
        *(
            click.option(
                flag,
                type=kind,
                metavar="TIME" if kind is iso_time else "OFFSET",
                callback=_exclusive_with(other),
                help=text,
            )
            for flag, kind, other, text in bounds
        ),
        click.option(
            "--partitions", type=partition_list, metavar="LIST", help="e.g. 0,2 (default: all)"
        ),
    )


@dataclass(frozen=True, kw_only=True)
class TopicRange:
    """What `replay`, `rescore` and `report` read of each partition of their topics (the range
    flags): an offset or time range (times are the records', when they were published)."""

    topics: Sequence[str]
    partitions: Sequence[int] | None = None
    from_offset: int | None = None
    from_time: datetime | None = None
    to_offset: int | None = None  # exclusive
    to_time: datetime | None = None  # exclusive

    async def plan(self, reader: PartitionLogReader) -> tuple[list[tuple[str, int, int]], int]:
        """(topic, partition, start offset) of each partition read, leaving out those with no
        record at or after --from-time, and the most partitions a topic has; a topic or a
        partition that does not exist is a ValueError (a bad range: exit 2)."""
        plan = []
        widest, from_ms = 1, epoch_ms(self.from_time)
        for topic in self.topics:
            available = await reader.partitions(topic)
            if not available:
                raise ValueError(f"topic {topic!r} does not exist or has no partitions")
            missing = sorted(set(self.partitions or ()) - set(available))
            if missing:
                raise ValueError(f"topic {topic!r} has no partitions {missing}")
            widest = max(widest, len(available))
            for partition in self.partitions or available:
                start = await reader.range_start(topic, partition, self.from_offset, from_ms)
                if start is not None:
                    plan.append((topic, partition, start))
        return plan, widest

    def total(self, plan: list[tuple[str, int, int]]) -> int | None:
        """How many records the plan reads, known when the range ends at an offset."""
        if self.to_offset is None:
            return None
        return sum(max(0, self.to_offset - start) for _, _, start in plan)


RANGE_FLAGS = tuple(field.name for field in fields(TopicRange) if field.name != "topics")


def epoch_ms(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)
