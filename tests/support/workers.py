"""Settings giving a worker subprocess (``worker.dev.process.WorkerProcess``) its own topics."""

from __future__ import annotations


def worker_topics(
    prefix: str, partitions: int, **extra: str
) -> tuple[dict[str, str], dict[str, str]]:
    """Settings giving a worker its own topics and group, and its output topic -> decision."""
    env = {
        "KP_INPUT_TOPIC": f"{prefix}.raw",
        "KP_ACCEPTED_TOPIC": f"{prefix}.accepted",
        "KP_REJECTED_TOPIC": f"{prefix}.rejected",
        "KP_DEAD_LETTER_TOPIC": f"{prefix}.dead-letter",
        "KP_GROUP_ID": f"{prefix}-group",
        "KP_INPUT_PARTITIONS": str(partitions),
        **extra,
    }
    outputs = {
        env["KP_ACCEPTED_TOPIC"]: "accepted",
        env["KP_REJECTED_TOPIC"]: "rejected",
        env["KP_DEAD_LETTER_TOPIC"]: "dead_letter",
    }
    return env, outputs
