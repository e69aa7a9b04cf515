"""A headless Chromium driven over the Chrome DevTools Protocol (CDP), for the browser tests.

No tests here, and no browser package from PyPI: Debian's ``chromium`` (``make test-deps``) with
``--remote-debugging-port``, spoken to over one WebSocket (``websockets``, which Airflow's
server stack already installs)::

    with Chromium(binary, profile) as page:
        page.go("http://localhost:8080/auth/login")
        page.type_into("input[name=username]", "reviewer")
        page.click("button[type=submit]")
        page.wait_for("location.pathname === '/'")
        page.screenshot(Path("shot.png"))
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect


class BrowserError(RuntimeError):
    """Chromium did not start, a command failed, or a condition never became true."""


class Chromium:
    """One headless Chromium with one page, driven by CDP commands."""

    def __init__(self, binary: str, profile: Path, *, width: int = 1400, height: int = 900) -> None:
        self.profile = profile
        profile.mkdir(parents=True, exist_ok=True)
        flags = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        self.process = subprocess.Popen([binary, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._next_id = 0
        self.ws = self._connect()
        self.send("Page.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def _connect(self) -> ClientConnection:
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not active.exists() or not active.read_text().strip():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise BrowserError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(active.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            targets = json.loads(response.read())
        page = next(t for t in targets if t["type"] == "page")
        return connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        wanted = self._next_id
        self.ws.send(json.dumps({"id": wanted, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == wanted:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> None:
        """Poll until ``expression`` is truthy in the page (an element found counts)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(f"Boolean({expression})")
            except BrowserError:  # between two documents: the context is gone for a moment
                value = None
            if value:
                return
            if time.monotonic() > deadline:
                raise BrowserError(f"not true after {timeout:.0f}s: {expression} (at {self.url()})")
            time.sleep(0.2)

    def url(self) -> str:
        try:
            return str(self.evaluate("location.href"))
        except BrowserError:
            return "?"

    def go(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'")

    def click_and_wait(self, selector: str, timeout: float = 30) -> None:
        """Click what ``selector`` finds and wait for the next document to load."""
        self.evaluate("window.__leaving = true")
        self.click(selector)
        self.wait_for("window.__leaving === undefined && document.readyState === 'complete'", timeout)

    def click(self, selector: str) -> None:
        if not self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e && e.click(); return !!e; }})()"
        ):
            raise BrowserError(f"nothing to click at {selector} on {self.url()}")

    def type_into(self, selector: str, text: str) -> None:
        """Focus the field and type ``text`` as keystrokes would (frameworks see input events)."""
        if not self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e && e.focus(); return !!e; }})()"
        ):
            raise BrowserError(f"no field {selector} on {self.url()}")
        self.send("Input.insertText", text=text)

    def press(self, key: str) -> None:
        """Press and release one printable key (a letter or digit) as a keyboard would: the page's
        ``keydown`` listeners see it with its ``key`` and ``code``."""
        code = f"Digit{key}" if key.isdigit() else f"Key{key.upper()}"
        common = {"key": key, "code": code, "windowsVirtualKeyCode": ord(key.upper())}
        self.send("Input.dispatchKeyEvent", type="keyDown", text=key, **common)
        self.send("Input.dispatchKeyEvent", type="keyUp", **common)

    def text(self, selector: str = "body") -> str:
        return str(self.evaluate(f"document.querySelector({json.dumps(selector)})?.innerText ?? ''"))

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return data

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
