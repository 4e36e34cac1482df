"""A headless Chromium over the DevTools protocol, standard library only.

Used to check that a report renders (console errors, network requests, element
sizes) and to take a full-page screenshot (`tokrecord report --screenshot`).
The protocol travels over a pipe (`--remote-debugging-pipe`: commands on fd 3,
replies and events on fd 4, NUL-separated JSON), so there is no port, no
websocket library and no browser download: the system's Chromium (Debian's
`chromium` package) is driven as it is.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokrecord.errors import ConfigError
from tokrecord.jsontypes import JSONObject

CHROMIUM_ENV = "TOKRECORD_CHROMIUM"
# Works from a wheel install too (scripts/ is only in a clone).
CHROMIUM_HINT = (f"install Debian's chromium package (`sudo apt-get install -y chromium`; in a "
                 f"clone, scripts/ensure-chromium does it) or name a browser in ${CHROMIUM_ENV}")
CANDIDATES = ("chromium", "chromium-browser", "google-chrome-stable", "google-chrome",
              "chrome-headless-shell")
# Moves the pipe ends onto fds 3 and 4 in the child (pass_fds keeps numbers, and
# fds 3 and 4 are usually taken in the parent), then becomes the browser.
_TRAMPOLINE = ("import os, sys; r, w = int(sys.argv[1]), int(sys.argv[2]); "
               "os.dup2(r, 3); os.dup2(w, 4); os.close(r); os.close(w); "
               "os.execvp(sys.argv[3], sys.argv[3:])")


class BrowserError(ConfigError):
    """No browser, or the browser did not answer as the protocol says."""


def find_chromium() -> str | None:
    """TOKRECORD_CHROMIUM, else the first Chromium-like browser on PATH."""
    named = os.environ.get(CHROMIUM_ENV)
    if named:
        return shutil.which(named)
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageLoad:
    """What a page did while it loaded."""

    url: str
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, itself included

    @property
    def external_requests(self) -> list[str]:
        return [u for u in self.requests if u != self.url and not u.startswith("data:")]


class Browser:
    """One headless Chromium; use as a context manager."""

    def __init__(self, executable: str | None = None, *, timeout_s: float = 60.0,
                 width: int = 1200, height: int = 900) -> None:
        exe = executable or find_chromium()
        if exe is None:
            raise BrowserError(
                f"no Chromium found: {CHROMIUM_HINT}")
        self.timeout_s = timeout_s
        self._profile = tempfile.TemporaryDirectory(prefix="tokrecord-chromium-")
        r_cmd, self._w_cmd = (_high(fd) for fd in os.pipe())
        self._r_evt, w_evt = (_high(fd) for fd in os.pipe())
        args = [
            "--headless", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
            "--no-default-browser-check", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-extensions",
            "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
            f"--user-data-dir={self._profile.name}", f"--window-size={width},{height}",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to run its sandbox as root
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _TRAMPOLINE, str(r_cmd), str(w_evt), exe, *args, "about:blank"],
                pass_fds=(r_cmd, w_evt), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(r_cmd)
            os.close(w_evt)
        self._buf = b""
        self._next_id = 0
        self._events: list[JSONObject] = []

    # ------------------------------------------------------------------ protocol

    def _send(self, method: str, params: JSONObject | None, session: str | None) -> int:
        self._next_id += 1
        msg: JSONObject = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w_cmd, json.dumps(msg).encode() + b"\0")
        return self._next_id

    def _read_until(self, done: Callable[[JSONObject], bool]) -> JSONObject:
        deadline = time.monotonic() + self.timeout_s
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                msg: JSONObject = json.loads(raw)
                if done(msg):
                    return msg
                self._events.append(msg)
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"Chromium did not answer within {self.timeout_s:g} s")
            ready, _, _ = select.select([self._r_evt], [], [], left)
            if ready:
                data = os.read(self._r_evt, 1 << 20)
                if not data:
                    raise BrowserError(f"Chromium exited (status {self._proc.poll()})")
                self._buf += data

    def call(self, method: str, params: JSONObject | None = None,
             session: str | None = None) -> JSONObject:
        ident = self._send(method, params, session)
        msg = self._read_until(lambda m: m.get("id") == ident)
        if "error" in msg:
            raise BrowserError(f"{method}: {msg['error']}")
        result: JSONObject = msg.get("result", {})
        return result

    def _wait_event(self, method: str, session: str) -> JSONObject:
        for i, ev in enumerate(self._events):
            if ev.get("method") == method and ev.get("sessionId") == session:
                return self._events.pop(i)
        return self._read_until(lambda m: m.get("method") == method and m.get("sessionId") == session)

    # ------------------------------------------------------------------ pages

    def open(self, url: str, *, width: int = 1200, height: int = 900) -> tuple[str, PageLoad]:
        """Load url in a new tab and wait for its load event; (session id, what it did)."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(f"{domain}.enable", session=session)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                  session=session)
        self._events.clear()
        self.call("Page.navigate", {"url": url}, session=session)
        self._wait_event("Page.loadEventFired", session)
        # Late console messages (a failed image, a CSP report) arrive just after load.
        with contextlib.suppress(BrowserError):
            self.evaluate(session, "new Promise(r => setTimeout(r, 200))", await_promise=True)
        load = PageLoad(url=url)
        for ev in self._events:
            if ev.get("sessionId") != session:
                continue
            method, p = ev.get("method"), ev.get("params", {})
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                load.console_errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                                    for a in p.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                details = p.get("exceptionDetails", {})
                load.console_errors.append(str(details.get("exception", {}).get("description")
                                               or details.get("text")))
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                load.console_errors.append(str(p["entry"].get("text")))
            elif method == "Network.requestWillBeSent":
                load.requests.append(str(p.get("request", {}).get("url")))
        return session, load

    def evaluate(self, session: str, expression: str, *, await_promise: bool = False) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": await_promise}, session=session)
        if "exceptionDetails" in result:
            raise BrowserError(f"evaluating {expression[:60]!r}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def screenshot(self, session: str, path: Path, *, width: int = 1200) -> Path:
        """The whole page, however long, as one PNG."""
        metrics = self.call("Page.getLayoutMetrics", session=session)
        size = metrics.get("cssContentSize") or metrics.get("contentSize") or {}
        height = max(int(-(-float(size.get("height", 900)) // 1)), 1)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                  session=session)
        shot = self.call("Page.captureScreenshot",
                         {"format": "png", "captureBeyondViewport": True,
                          "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}},
                         session=session)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        with contextlib.suppress(BrowserError, OSError):
            self.call("Browser.close")
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)  # its own session: its whole group
            self._proc.wait(timeout=10)
        for fd in (self._w_cmd, self._r_evt):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _high(fd: int) -> int:
    """fd moved above 9, close-on-exec (pass_fds re-enables it for the child)."""
    import fcntl

    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return new


def screenshot(html: Path, png: Path, *, width: int = 1200) -> PageLoad:
    """A full-page PNG of a local HTML file; what the page did while loading."""
    with Browser() as browser:
        session, load = browser.open(html.resolve().as_uri(), width=width)
        browser.screenshot(session, png, width=width)
    return load
