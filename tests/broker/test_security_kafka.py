"""Security as production runs it: Apache Kafka with a SASL_SSL client listener (SCRAM-SHA-512
users), ACLs deciding (StandardAuthorizer, ``allow.everyone.if.no.acl.found=false``), and the
worker's user granted exactly the table of docs/operations.md, "Permissions (ACLs)".

- With those ACLs the worker scores end to end over SASL_SSL: each input in exactly one output.
- Each of them left out, one at a time (and the two whose Describe an operator may have granted
  otherwise): one error line naming the operation and the resource, /readyz failing on it, the
  worker alive and asking again, and once it is granted every input in exactly one output.
- A wrong password, and a CA that did not sign the broker's certificate: one clear line each.
- The password is in no log line, no metric and no ``kp-scorer settings`` output.
- replay, rescore and report run with the ACLs documented for them.

One broker for the module (support/secure_kafka.py; ~10 s to start on 2 cores).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from worker.dev.process import WorkerProcess

from support.fixtures import chosen_broker
from support.paths import REPO
from support.secure_kafka import Acl, SecureKafka, start_secure_kafka
from support.tls import make_broker_certificates
from support.traces import make_trace
from support.workers import worker_topics

pytestmark = [
    pytest.mark.broker,
    pytest.mark.skipif(
        chosen_broker() == "embedded" or not (shutil.which("java") and shutil.which("mvn")),
        reason="SASL_SSL and ACLs are tested on Apache Kafka, which needs Java 17+ and Maven "
        "(mvn); run with KAFKA_TEST_BROKER=kafka",
    ),
]

PARTITIONS = 2
# Thresholds that route the three traces produced to the three outputs, one each.
THRESHOLDS = '{"accept-me": 0.0, "reject-me": 1.0}'
DECISIONS = ("accepted", "rejected", "dead-letter")
OUTPUT_VARIABLES = ("KP_ACCEPTED_TOPIC", "KP_REJECTED_TOPIC", "KP_DEAD_LETTER_TOPIC")


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    secured = start_secure_kafka(tmp_path_factory.mktemp("tls"))
    try:
        yield secured
    finally:
        secured.stop()


def documented_worker_acls(env: dict[str, str]) -> list[Acl]:
    """The worker's table of docs/operations.md, "Permissions (ACLs)", for these settings."""
    text = (REPO / "docs" / "operations.md").read_text()
    section = text.split("## Permissions (ACLs)", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (Topic|Group) \| `(KP_\w+)` \| (\w+) \|", section, re.MULTILINE)
    assert len(rows) == 7, rows
    return sorted(Acl(resource, env[variable], operation) for resource, variable, operation in rows)


def readiness(port: int) -> tuple[int, dict[str, str]]:
    """/readyz's status and checks (0 and none while the port does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return answer.status, json.loads(answer.read())["checks"]
    except urllib.error.HTTPError as failing:
        return failing.code, json.loads(failing.read())["checks"]
    except OSError:
        return 0, {}


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


class Setup:
    """A worker's topics (made by the admin), its three traces, and the worker itself."""

    def __init__(self, kafka: SecureKafka, name: str, **settings: str) -> None:
        self.kafka = kafka
        self.env, outputs = worker_topics(
            f"{name}-{uuid.uuid4().hex[:8]}",
            PARTITIONS,
            KP_DOMAIN_THRESHOLDS=THRESHOLDS,
            **{**kafka.worker_settings(), **settings},
        )
        self.input = self.env["KP_INPUT_TOPIC"]
        self.outputs = [self.env[variable] for variable in OUTPUT_VARIABLES]
        kafka.create_topics([self.input, *outputs, self.env["KP_CACHE_STORE_TOPIC"]], PARTITIONS)
        self.expected: dict[tuple[int, int], str] = {}
        self.worker: WorkerProcess | None = None

    def produce(self) -> None:
        """One trace for each output: accepted, rejected and a dead letter (not JSON)."""
        values = [
            orjson.dumps(make_trace(domain="accept-me", id=f"kp:trace:{uuid.uuid4()}")),
            orjson.dumps(make_trace(domain="reject-me", id=f"kp:trace:{uuid.uuid4()}")),
            b"{not json",
        ]
        placed = self.kafka.produce(self.input, values)
        self.expected = dict(zip(placed, self.outputs, strict=True))

    def start(self) -> WorkerProcess:
        self.worker = WorkerProcess(self.kafka.bootstrap_servers, **self.env).start()
        return self.worker

    def events(self, start: str) -> list[dict[str, object]]:
        assert self.worker is not None
        return [e for e in self.worker.events() if str(e.get("event", "")).startswith(start)]

    def check_every_input_has_exactly_one_output(self) -> None:
        found = self.kafka.outputs(self.outputs, set(self.expected))
        counts = Counter(output.source for output in found)
        assert counts == dict.fromkeys(self.expected, 1), counts
        assert {output.source: output.topic for output in found} == self.expected

    def check_no_secret(self) -> None:
        """The password in no log line and no metric."""
        assert self.worker is not None
        password = self.env["KP_SASL_PASSWORD"]
        assert password not in self.worker.log_text()
        url = f"http://127.0.0.1:{self.worker.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert password not in answer.read().decode()

    def command(self, *args: str) -> tuple[str, str]:
        """A kp-scorer command with these settings: its stdout and stderr (exit 0, no
        password in either)."""
        done = subprocess.run(
            [sys.executable, "-m", "worker.cli", *args],
            env={**os.environ, **self.env, "KAFKA_BOOTSTRAP_SERVERS": self.kafka.bootstrap_servers},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert self.env["KP_SASL_PASSWORD"] not in done.stdout + done.stderr
        return done.stdout, done.stderr

    def stop(self) -> int | None:
        return None if self.worker is None else self.worker.stop()


@pytest.fixture(scope="module")
def scored(kafka: SecureKafka) -> Iterator[tuple[Setup, int | None]]:
    """A worker with exactly the documented ACLs has scored three traces, and stopped."""
    setup = Setup(kafka, "acl")
    kafka.grant(documented_worker_acls(setup.env))
    setup.produce()
    worker = setup.start()
    try:
        setup.check_every_input_has_exactly_one_output()
        wait_until(lambda: readiness(worker.metrics_port)[0] == 200, 30, worker.tail())
        setup.check_no_secret()
    finally:
        code = setup.stop()
    yield setup, code


def test_the_worker_scores_over_sasl_ssl_with_exactly_the_documented_acls(
    scored: tuple[Setup, int | None],
) -> None:
    setup, code = scored
    assert setup.worker is not None
    assert code == 0, setup.worker.tail()
    assert not setup.events("not authorized"), setup.worker.tail()
    shown, _ = setup.command("settings")
    assert "KP_SASL_PASSWORD" in shown  # masked


def test_replay_rescore_and_report_run_with_their_documented_acls(
    kafka: SecureKafka, scored: tuple[Setup, int | None]
) -> None:
    setup = scored[0]
    kafka.revoke(documented_worker_acls(setup.env))
    accepted, rejected, dead = setup.outputs
    replayed, rescored = f"{setup.input}-replay", f"{setup.input}-rescore"

    def run(acls: list[Acl], *args: str) -> tuple[str, str]:
        kafka.grant(acls)
        try:
            return setup.command(*args)
        finally:
            kafka.revoke(acls)

    _, said = run(
        [
            Acl("Topic", setup.input, "Read"),
            Acl("Topic", accepted, "Read"),
            Acl("Topic", rejected, "Read"),
            *(Acl("Topic", f"{replayed}.{d}", op) for d in DECISIONS for op in ("Create", "Write")),
        ],
        *("replay", "--topic", setup.input, "--output-prefix", replayed),
    )
    assert "replayed 3 records" in said and "compared with the live outputs: 2 records" in said
    replay_topics = [f"{replayed}.{d}" for d in DECISIONS]
    assert {o.source for o in kafka.outputs(replay_topics, set(setup.expected))} == set(
        setup.expected
    )
    run(
        [
            Acl("Topic", accepted, "Read"),
            Acl("Topic", rejected, "Read"),
            *(Acl("Topic", f"{rescored}.{d}", "Create") for d in DECISIONS),
            *(Acl("Topic", f"{rescored}.{d}", "Write") for d in DECISIONS[:2]),
        ],
        *("rescore", "--from-topics", "--output-prefix", rescored, "--json", "--quiet"),
    )
    scored_inputs = {source for source, topic in setup.expected.items() if topic != dead}
    found = kafka.outputs([f"{rescored}.{d}" for d in DECISIONS[:2]], scored_inputs)
    assert {o.source for o in found} == scored_inputs
    numbers, _ = run(
        [Acl("Topic", topic, "Read") for topic in setup.outputs],
        *("report", "--from-topics", "--json", "--quiet"),
    )
    report = json.loads(numbers)
    assert (report["records"], report["scored"], report["dead_letters"]["total"]) == (3, 2, 1)


# (resource, settings variable naming it, operation left out, Describe granted otherwise)
LEFT_OUT = [
    ("Topic", "KP_INPUT_TOPIC", "Read", False),
    ("Group", "KP_GROUP_ID", "Read", False),
    ("Topic", "KP_ACCEPTED_TOPIC", "Write", False),
    ("Topic", "KP_REJECTED_TOPIC", "Write", False),
    ("Topic", "KP_DEAD_LETTER_TOPIC", "Write", False),
    ("Topic", "KP_CACHE_STORE_TOPIC", "Write", False),
    # The broker shows the topic, so the start goes through: the first fetch is refused (faust
    # crashed the worker on it), or the first dead letter's publish (/readyz said ready).
    ("Topic", "KP_INPUT_TOPIC", "Read", True),
    ("Topic", "KP_DEAD_LETTER_TOPIC", "Write", True),
]


@pytest.mark.parametrize(
    ("resource", "variable", "operation", "describe"),
    LEFT_OUT,
    ids=[f"{v}-{o}" + ("-describe-kept" if d else "") for _, v, o, d in LEFT_OUT],
)
def test_a_permission_left_out_is_named_and_nothing_is_lost_once_granted(
    kafka: SecureKafka, resource: str, variable: str, operation: str, describe: bool
) -> None:
    setup = Setup(kafka, "no-" + operation.lower())
    acls = documented_worker_acls(setup.env)
    missing = Acl(resource, setup.env[variable], operation)
    granted = [acl for acl in acls if acl != missing]
    assert len(granted) == len(acls) - 1
    if describe:
        granted.append(Acl(resource, missing.name, "Describe"))
    kafka.grant(granted)
    setup.produce()
    worker = setup.start()
    named = f"not authorized: {operation} on {resource.lower()} {missing.name!r}"
    try:
        wait_until(lambda: bool(setup.events(named)), 90, f"no {named!r} line:\n{worker.tail()}")
        status, checks = readiness(worker.metrics_port)
        assert status == 503 and checks["permissions"].startswith(named), checks
        time.sleep(2)  # asking again meanwhile: no crash, no second line
        assert worker.alive(), worker.tail()
        (line,) = setup.events(named)
        assert line["level"] == "error", line
        assert not [e for e in worker.events() if "exception" in e], worker.tail()
        assert readiness(worker.metrics_port)[0] == 503
        kafka.grant([missing])
        setup.check_every_input_has_exactly_one_output()
        wait_until(lambda: readiness(worker.metrics_port)[0] == 200, 30, worker.tail())
        assert setup.events(f"authorized: {operation} on {resource.lower()} {missing.name!r}")
        assert worker.alive()
        setup.check_no_secret()
    finally:
        code = setup.stop()
    assert code == 0, worker.tail()


@pytest.mark.parametrize("refused", ["password", "certificate"])
def test_a_refused_connection_is_one_clear_line(
    kafka: SecureKafka, refused: str, tmp_path: Path
) -> None:
    if refused == "password":
        settings = {"KP_SASL_PASSWORD": f"wrong-{uuid.uuid4().hex}"}
        line = "Kafka refused the SASL credentials of user 'scorer'; retrying"
        words = "invalid credentials"
    else:
        other_ca = make_broker_certificates(tmp_path).ca  # a CA that did not sign the broker's
        settings = {"KP_SSL_CAFILE": str(other_ca)}
        line = "the broker's TLS certificate is not trusted; retrying"
        words = "unable to get local issuer certificate"
    setup = Setup(kafka, "refused", **settings)
    kafka.grant(documented_worker_acls(setup.env))
    worker = setup.start()
    try:
        worker.wait_for_event(line, timeout=60)
        (first, *_) = setup.events(line)
        assert words in str(first["error"]), first
        status, checks = readiness(worker.metrics_port)
        assert status == 503 and words in checks["broker"], checks
        assert worker.alive()
        assert not setup.events("Kafka unreachable"), worker.tail()
        setup.check_no_secret()
    finally:
        setup.stop()
