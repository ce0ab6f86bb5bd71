"""Debian's Chromium, headless, driven through the DevTools protocol over a pipe (standard
library only: ``--remote-debugging-pipe`` reads NUL-terminated JSON commands on fd 3 and
writes its answers on fd 4). Enough to open a page, evaluate JavaScript in it, give it a
viewport and take a full-page screenshot of it."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

BINARY_NAMES = ("chromium", "chromium-browser")


def binary() -> str | None:
    return next((found for name in BINARY_NAMES if (found := shutil.which(name))), None)


class Browser:
    """One headless Chromium; ``with Browser() as b: page = b.open(url); b.evaluate(page, js)``."""

    def __init__(self, timeout: float = 30.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="hpcsuite-chromium-")
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()
        self._buffer = b""
        self._next_id = 0

        def fds_3_and_4():   # in the child: its fd 3 reads our commands, fd 4 writes answers
            reads, writes = os.dup(to_child), os.dup(from_child)   # above 4: none is clobbered
            os.dup2(reads, 3)
            os.dup2(writes, 4)

        self.process = subprocess.Popen(
            [binary() or "chromium", "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--remote-debugging-pipe",
             f"--user-data-dir={self.profile}", "about:blank"],
            preexec_fn=fds_3_and_4, pass_fds=(3, 4),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for fd in (self._write, self._read):
            try:
                os.close(fd)
            except OSError:
                pass
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """One DevTools command; its result (events arriving meanwhile are skipped)."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._receive()
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]

    def _receive(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("Chromium did not answer (exit status "
                                   f"{self.process.poll()})")
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def open(self, url: str) -> str:
        """A new tab at ``url``; its session id."""
        target = self.send("Target.createTarget", {"url": url})["targetId"]
        return self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def evaluate(self, session: str, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, session: str, expression: str, timeout: float = 20.0):
        """Evaluate ``expression`` until it is truthy; its value (the last one on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(session, expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.1)

    def navigate(self, session: str, url: str, timeout: float = 20.0) -> None:
        """Load ``url`` in the tab and wait until the document (and what it loads) is complete."""
        self.send("Page.navigate", {"url": url}, session)
        loaded = f"location.href === {json.dumps(url)} && document.readyState === 'complete'"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.evaluate(session, loaded):
                    return
            except RuntimeError:        # the old document went away while we asked it
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{url} did not load in {timeout:.0f} s")

    def set_viewport(self, session: str, width: int, height: int, scale: float = 1) -> None:
        """Lay the tab out as a ``width`` x ``height`` CSS-pixel desktop window (media queries,
        ``window.innerWidth`` and the layout all see that size)."""
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": scale,
                   "mobile": False}, session)

    def screenshot(self, session: str, full_page: bool = True) -> bytes:
        """The tab as PNG bytes: the whole document (laid out at the viewport's width, beyond
        its height) or only what the viewport shows."""
        params: dict = {"format": "png"}
        if full_page:
            size = self.send("Page.getLayoutMetrics", {}, session)["cssContentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size["width"],
                                "height": size["height"], "scale": 1})
        data = base64.b64decode(self.send("Page.captureScreenshot", params, session)["data"])
        if not data.startswith(b"\x89PNG\r\n\x1a\n"):
            raise RuntimeError("Page.captureScreenshot returned no PNG")
        return data


def site_pages(root: Path) -> list[str]:
    """Every page of a static site built into ``root`` (mkdocs' directory URLs: each page is
    a folder's index.html), as the URL paths a server of ``root`` answers: "/", "/user/gpus/"."""
    return sorted("/" + "".join(f"{part}/" for part in p.relative_to(root).parent.parts)
                  for p in Path(root).rglob("index.html"))
