"""A trace's score is a pure function of its partition's log (SPEC "Stream decisions").

One input topic (``support/determinism.py``), five ways of scoring it, every per-record score
compared for exact float equality: (a) one continuous worker, (b) a worker SIGKILLed and
restarted twice mid-stream, (c) a second worker joining and leaving mid-stream, (d)
`kp-scorer replay`, and (e) the offline scorer run per partition. Here: (a) equals (e), and
(d) reproduces (a); (b) and (c), each compared with (e), are ``test_determinism_restarts.py``
and ``test_determinism_rebalance.py`` (separate files, so that xdist runs them side by side).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.determinism import TRACES, Run, scores_of

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def continuous(kafka_bootstrap: str, scenario):
    input_topic, _, expected = scenario
    run = Run(kafka_bootstrap, input_topic, "a")
    worker = run.worker()
    try:
        return scores_of(run.collect(expected))
    finally:
        worker.stop()


def test_continuous_run_equals_offline_scorer(continuous, offline) -> None:
    assert len(continuous) == TRACES
    mismatched = [k for k in offline if continuous[k] != offline[k]]
    novelty_spread = len(set(continuous.values()))
    print(f"\n{TRACES} traces, {novelty_spread} distinct scores; mismatches: {len(mismatched)}")
    assert not mismatched, [(k, continuous[k], offline[k]) for k in mismatched[:5]]


def test_replay_reproduces_the_live_scores(kafka_bootstrap: str, scenario, continuous) -> None:
    input_topic, _, expected = scenario
    run = Run(kafka_bootstrap, input_topic, "d")
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        **run.env,
        # compare with the continuous run's outputs
        "KP_ACCEPTED_TOPIC": f"{input_topic}.a.accepted",
        "KP_REJECTED_TOPIC": f"{input_topic}.a.rejected",
        "KP_DEAD_LETTER_TOPIC": f"{input_topic}.a.dead-letter",
    }
    stderr = replay(env, "--topic", input_topic, "--output-prefix", f"{input_topic}.d")
    assert f"compared with the live outputs: {TRACES} records, 0 flipped" in stderr
    assert scores_of(run.collect(expected)) == continuous


def test_replay_from_a_time_after_the_last_record_replays_nothing(
    kafka_bootstrap: str, scenario
) -> None:
    """No record of any partition is at or after --from-time: no partition is replayed from
    its start."""
    input_topic, _, _ = scenario
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}
    stderr = replay(
        env,
        *("--topic", input_topic, "--from-time", "2100-01-01T00:00:00Z"),
        *("--output-prefix", f"{input_topic}.late"),
    )
    assert f"replayed 0 records into {input_topic}.late.*" in stderr


def replay(env: dict[str, str], *argv: str) -> str:
    """`kp-scorer replay ARGV`'s stderr; it must exit 0."""
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "replay", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stderr
