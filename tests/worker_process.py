"""Run `kp-scorer worker` as a real subprocess against a test broker, and read its log."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class WorkerProcess:
    """One worker process; `env` overrides settings (KP_* variables)."""

    def __init__(self, bootstrap: str, **env: str) -> None:
        self.bootstrap = bootstrap
        self.metrics_port = int(env.pop("KP_METRICS_PORT", free_port()))
        self.env = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "KP_METRICS_PORT": str(self.metrics_port),
            "KP_SESSION_TIMEOUT_SECONDS": "6",
            "KP_HEARTBEAT_INTERVAL_SECONDS": "1",
            "KP_COMMIT_INTERVAL_SECONDS": "0.5",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        handle, name = tempfile.mkstemp(prefix="kp-worker-", suffix=".log")
        os.close(handle)
        self.log_path = Path(name)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "worker"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        return self

    def events(self) -> list[dict[str, object]]:
        """The worker's structured log lines, parsed."""
        out = []
        for line in self.log_path.read_bytes().splitlines():
            if line.startswith(b"{"):
                try:
                    out.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    continue
        return out

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_event(self, event: str, timeout: float = 60.0, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(1 for e in self.events() if e.get("event") == event) >= count:
                return
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"worker exited ({self.process.returncode}):\n{self.tail()}")
            time.sleep(0.1)
        raise TimeoutError(f"worker did not log {event!r} within {timeout} s:\n{self.tail()}")

    def wait_ready(self, timeout: float = 90.0) -> WorkerProcess:
        """Started, and holding partitions (a group join on the test broker takes a few s)."""
        self.wait_for_event("partitions assigned", timeout)
        return self

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final commit."""
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(10)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.process is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.returncode

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
