"""A small Chrome DevTools Protocol client: headless Chromium, driven over its
debugging websocket with ``websocket-client`` (a dependency of Jupyter Server),
so the tests need no browser-driving package and download no browser.

Used by tests/site/test_site.py and tests/lab/test_lab.py. Only what those
tests need: open a page,
evaluate JavaScript (awaiting promises), wait for a condition, take a
screenshot, and collect uncaught exceptions and console errors.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-dev-shm-usage",
]


def chromium() -> str | None:
    """Path of the Chromium binary, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """One headless Chromium with one page, driven over CDP."""

    def __init__(
        self, width: int = 1400, height: int = 1000, flags: tuple[str, ...] = ()
    ) -> None:
        binary = chromium()
        if binary is None:
            raise RuntimeError("chromium is not installed")
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="lnorm-chromium-")
        self.process = subprocess.Popen(
            [
                binary,
                *FLAGS,
                *flags,
                f"--remote-debugging-port={self.port}",
                f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.events: list[dict[str, Any]] = []
        self._id = 0
        self.ws = websocket.create_connection(
            self._page_socket(), timeout=120, suppress_origin=True
        )
        self.call("Runtime.enable")
        self.call("Page.enable")
        # Behave as a focused window: JupyterLab tracks the notebook in front
        # through focus events, which a headless page does not get otherwise.
        self.call("Emulation.setFocusEmulationEnabled", enabled=True)

    def _page_socket(self) -> str:
        deadline = time.monotonic() + 30
        while True:
            try:
                url = f"http://127.0.0.1:{self.port}/json"
                with urllib.request.urlopen(url, timeout=2) as r:
                    pages = [t for t in json.load(r) if t["type"] == "page"]
                if pages:
                    return pages[0]["webSocketDebuggerUrl"]
            except OSError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("chromium did not open its debugging port")
            time.sleep(0.1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one CDP command and return its result (events are kept)."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if "method" in message:
                self.events.append(message)
            elif message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression: str) -> Any:
        """Value of a JavaScript expression (a promise is awaited)."""
        result = self.call(
            "Runtime.evaluate",
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details["text"]
            raise RuntimeError(f"JavaScript error: {text}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        """Poll ``expression`` until it is truthy; fail after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:.0f} s for {what}")
            time.sleep(0.05)

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def load(self, url: str, timeout: float = 60) -> None:
        """Open ``url`` and wait until the page and its scripts have loaded."""
        self.call("Page.navigate", url=url)
        self.wait_for(
            "document.readyState === 'complete' && "
            f"location.href === {json.dumps(url)}",
            timeout,
            f"{url} to load",
        )

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def exceptions(self) -> list[str]:
        """Uncaught JavaScript exceptions seen so far."""
        found = []
        for e in self.events:
            if e["method"] == "Runtime.exceptionThrown":
                details = e["params"]["exceptionDetails"]
                found.append(
                    details.get("exception", {}).get("description") or details["text"]
                )
        return found

    def errors(self) -> list[str]:
        """Uncaught exceptions and console errors seen so far."""
        found = self.exceptions()
        for e in self.events:
            if (
                e["method"] == "Runtime.consoleAPICalled"
                and e["params"]["type"] == "error"
            ):
                found.append(
                    " ".join(
                        str(a.get("value", a.get("description", "")))
                        for a in e["params"]["args"]
                    )
                )
        return found

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.process.kill()
            self.process.wait()
            shutil.rmtree(self.profile, ignore_errors=True)
