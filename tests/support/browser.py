"""A page opened in headless Chromium, driven over the DevTools protocol on a pipe (no
WebDriver, no extra package): what it logged, what a script measured in it, a screenshot.

Chromium's ``--remote-debugging-pipe`` reads commands on its file descriptor 3 and writes
answers and events on 4, each a JSON object ended by a NUL byte.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import select
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

TIMEOUT_SECONDS = 60.0


@dataclass
class PageVisit:
    """What opening a page gave: the value of a script run after load, the errors the page
    logged (console, uncaught exceptions, failed loads), and a PNG of the whole page."""

    value: Any = None
    errors: list[str] = field(default_factory=list)
    png: bytes = b""


class DevTools:
    def __init__(self, browser: Path, profile: Path) -> None:
        to_browser_r, self._write = os.pipe()
        self._read, from_browser_w = os.pipe()

        def child_fds() -> None:
            """The browser's fds 3 and 4 are its ends of the pipes (moved out of the way
            first: either end may itself be fd 3 or 4)."""
            reading = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            writing = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(reading, 3)
            os.dup2(writing, 4)

        self.process = subprocess.Popen(
            [
                str(browser),
                "--headless",
                "--no-sandbox",  # as root (CI), Chromium refuses its sandbox
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=child_fds,  # the tests start no threads that could hold a lock here
            close_fds=False,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send a command and wait for its answer (events that arrive meanwhile are kept)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._write, orjson.dumps(message) + b"\0")
        while True:
            answer = self._receive()
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_event(self, method: str, timeout: float = TIMEOUT_SECONDS) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event.get("method") == method:
                    return event
            self.events.append(self._receive(deadline - time.monotonic()))

    def _receive(self, timeout: float = TIMEOUT_SECONDS) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._read], [], [], left)[0]:
                raise TimeoutError(f"no answer from the browser within {timeout:.0f} s")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                stderr = (
                    self.process.stderr.read().decode(errors="replace")
                    if (self.process.stderr)
                    else ""
                )
                raise RuntimeError(f"the browser closed its pipe:\n{stderr[-2000:]}")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return orjson.loads(message)  # type: ignore[no-any-return]

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.send("Browser.close")
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        os.close(self._write)
        os.close(self._read)


def visit(browser: Path, url: str, script: str, width: int = 1100) -> PageVisit:
    """Open ``url`` (e.g. a local file's ``Path.as_uri()``), run ``script`` once it has
    loaded, screenshot the whole page."""
    with tempfile.TemporaryDirectory(prefix="kp-browser-") as profile:
        tools = DevTools(browser, Path(profile))
        try:
            target = tools.send("Target.createTarget", url="about:blank")["targetId"]
            session = tools.send("Target.attachToTarget", targetId=target, flatten=True)[
                "sessionId"
            ]
            for domain in ("Page", "Runtime", "Log"):
                tools.send(f"{domain}.enable", session)
            tools.send(
                "Emulation.setDeviceMetricsOverride",
                session,
                width=width,
                height=900,
                deviceScaleFactor=1,
                mobile=False,
            )
            tools.events.clear()
            navigation = tools.send("Page.navigate", session, url=url)
            result = PageVisit()
            if navigation.get("errorText"):
                result.errors.append(f"navigation: {navigation['errorText']}")
                return result
            tools.wait_event("Page.loadEventFired")
            evaluated = tools.send(
                "Runtime.evaluate", session, expression=script, returnByValue=True
            )
            if "exceptionDetails" in evaluated:
                raise RuntimeError(f"the check script failed: {evaluated['exceptionDetails']}")
            result.value = evaluated["result"].get("value")
            size = tools.send("Page.getLayoutMetrics", session)["cssContentSize"]
            shot = tools.send(
                "Page.captureScreenshot",
                session,
                format="png",
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1},
            )
            result.png = base64.b64decode(shot["data"])
            result.errors += page_errors(tools.events)
            return result
        finally:
            tools.close()


def page_errors(events: list[dict[str, Any]]) -> list[str]:
    """Console errors, uncaught exceptions and error log entries (e.g. a failed load)."""
    errors = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            errors.append(f"exception: {details.get('exception', {}).get('description', details)}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(f"console.{params['type']}: {params.get('args')}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            errors.append(
                f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}"
            )
    return errors
