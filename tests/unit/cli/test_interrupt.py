"""Ctrl-C on a command that reads topics is an interruption (exit 130), whatever the Kafka
client turns its cancellation into."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from aiokafka.errors import KafkaConnectionError

from worker.cli.progress import run_interruptible


async def connect_then_fail_on_cancel(cleaned_up: list[str]) -> None:
    """A client cancelled while it connects that reports its own error instead (as aiokafka
    can during bootstrap); its clean-up runs."""
    asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        raise KafkaConnectionError("Unable to bootstrap") from None
    finally:
        cleaned_up.append("client closed")


def test_plain_asyncio_run_reports_the_interruption_as_the_client_error() -> None:
    """Why the helper exists: the cancellation is lost in the client's error."""
    with pytest.raises(KafkaConnectionError):
        asyncio.run(connect_then_fail_on_cancel([]))


def test_ctrl_c_is_an_interruption_after_the_clean_up() -> None:
    cleaned_up: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run_interruptible(connect_then_fail_on_cancel(cleaned_up))
    assert cleaned_up == ["client closed"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_ctrl_c_errors_and_results_pass_through() -> None:
    async def unreachable() -> None:
        raise KafkaConnectionError("Unable to bootstrap")

    async def answer() -> int:
        return 42

    with pytest.raises(KafkaConnectionError):
        run_interruptible(unreachable())
    assert run_interruptible(answer()) == 42
