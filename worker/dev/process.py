"""``kp-scorer worker`` as a subprocess on a local broker: the demo, the tests and the benches
start their workers here, with the same settings and the same log handling."""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

# Group timings for a local broker: a join there waits about half the session timeout.
LOCAL_GROUP_SETTINGS = {
    "KP_SESSION_TIMEOUT_SECONDS": "6",
    "KP_HEARTBEAT_INTERVAL_SECONDS": "1",
    "KP_COMMIT_INTERVAL_SECONDS": "0.5",
}


# Workers still running when the process that started them exits are killed: a test that
# failed before stopping its worker left it retrying a broker that was gone, for good.
_started: list[subprocess.Popen[bytes]] = []


@atexit.register
def _kill_started() -> None:
    for process in _started:
        if process.poll() is None:
            process.kill()


def free_loopback_port() -> int:
    """A port free on 127.0.0.1 right now (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def temporary_log(prefix: str) -> Path:
    """A new empty log file in the temporary directory, for a process's output."""
    handle, name = tempfile.mkstemp(prefix=prefix, suffix=".log")
    os.close(handle)
    return Path(name)


def terminate(process: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM, then SIGKILL when it has not exited within ``timeout`` seconds; its exit
    status. A process that has already exited is only reaped."""
    process.terminate()
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


class WorkerProcess:
    """One worker process with its log in a file; ``env`` overrides settings (KP_* variables)."""

    def __init__(self, bootstrap: str, log_path: Path | None = None, **env: str) -> None:
        self.metrics_port = int(env.pop("KP_METRICS_PORT", free_loopback_port()))
        self.env = {
            **os.environ,
            **LOCAL_GROUP_SETTINGS,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "KP_METRICS_PORT": str(self.metrics_port),
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self.log_path = log_path or temporary_log("kp-worker-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> WorkerProcess:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "worker.cli", "worker"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        _started.append(self.process)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def events(self) -> list[dict[str, object]]:
        """The worker's structured log lines, parsed."""
        out = []
        for line in self.log_path.read_bytes().splitlines():
            if line.startswith(b"{"):
                with contextlib.suppress(orjson.JSONDecodeError):
                    out.append(orjson.loads(line))
        return out

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_for_event(
        self,
        event: str,
        timeout: float = 60.0,
        count: int = 1,
        where: Callable[[dict[str, object]], object] | None = None,
    ) -> None:
        """Until the log holds ``count`` ``event`` lines (those for which ``where`` is true)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.events() if e.get("event") == event]
            if sum(1 for e in found if where is None or where(e)) >= count:
                return
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"worker exited ({self.process.returncode}):\n{self.tail()}")
            time.sleep(0.1)
        raise TimeoutError(f"worker did not log {event!r} within {timeout} s:\n{self.tail()}")

    def wait_ready(self, timeout: float = 90.0) -> WorkerProcess:
        """Started and holding partitions (a group join on a local broker takes a few s): a
        join may assign none (a group of more workers than partitions, a broker still busy)."""
        self.wait_for_event("partitions assigned", timeout, where=lambda e: e.get("partitions"))
        return self

    def signal(self, signum: int) -> None:
        """Send ``signum`` (Popen sends nothing to a process that has exited)."""
        if self.process is not None:
            self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final commit."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        return None if self.process is None else terminate(self.process, timeout)

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
