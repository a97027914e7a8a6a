"""Headless Chromium driven over its DevTools pipe (``--remote-debugging-pipe``: JSON messages on file descriptors 3
and 4, each ended by a NUL byte), so that the docs' pages can be measured as a browser lays them out, with no
package beyond the browser itself.

:func:`page_widths` opens each page in a window of the given size and reads how wide the document scrolls
(``document.documentElement.scrollWidth``), the widest elements that run past the window's right edge, and the
error messages of code blocks that run past their block's edge.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--remote-debugging-pipe")

# What a page reports: how wide it scrolls, and the elements that stick out past the window (widest first).
_MEASURE = """(() => {
  const width = window.innerWidth;
  const out = [];
  for (const e of document.querySelectorAll('body *')) {
    const box = e.getBoundingClientRect();
    if (box.right > width + 1 && box.width > 0 && !e.closest('.toc-drawer') &&
        getComputedStyle(e).visibility !== 'hidden') {
      out.push([e.tagName.toLowerCase() + (e.className && typeof e.className === 'string' ?
                '.' + e.className.trim().split(/\\s+/).join('.') : ''), Math.round(box.right),
                (e.textContent || '').trim().slice(0, 60)]);
    }
  }
  out.sort((a, b) => b[1] - a[1]);
  // An error message (the text after an exception's name in a code block) must be seen whole, not scrolled to.
  const cut = [];
  for (const e of document.querySelectorAll('.highlight .gr + *')) {
    const pre = e.closest('pre');
    if (pre && e.getBoundingClientRect().right > pre.getBoundingClientRect().left + pre.clientWidth + 1) {
      cut.push(e.textContent.trim().slice(0, 80));
    }
  }
  return JSON.stringify({scroll: document.documentElement.scrollWidth, window: width, out: out.slice(0, 8),
                         cut: cut});
})()"""


def browser() -> str | None:
    """The path of a Chromium (Debian's ``chromium`` package, or Google's), ``None`` where none is installed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@attrs.frozen
class Width:
    """One page's layout: how wide its document scrolls, the window's width, what sticks out (tag.class, right edge
    in pixels, start of its text), and the error messages cut off at their code block's edge."""

    scroll: int
    window: int
    sticking_out: tuple[tuple[str, int, str], ...]
    errors_cut: tuple[str, ...]


class _Pipe:
    """Commands to the browser and their answers (events are skipped), over the two pipe descriptors."""

    def __init__(self, to_browser: int, from_browser: int, patience: float) -> None:
        self.to_browser, self.from_browser, self.patience = to_browser, from_browser, patience
        self.buffer = b""
        self.next_id = 0

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.patience
        while True:
            while b"\0" not in self.buffer:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"chromium did not answer {method} in {self.patience:.0f} s")
                chunk = os.read(self.from_browser, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"chromium closed its pipe while answering {method}")
                self.buffer += chunk
            raw, _, self.buffer = self.buffer.partition(b"\0")
            answer = json.loads(raw)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"chromium refused {method}: {answer['error']}")
                return dict(answer.get("result", {}))


@contextmanager
def _chromium(path: str, patience: float) -> Iterator[_Pipe]:
    """A headless Chromium with a fresh profile, and the pipe to it; closed (and its profile removed) after."""
    with tempfile.TemporaryDirectory(prefix="fmesh-chromium-") as profile:
        to_read, to_browser = os.pipe()  # the browser reads commands on its fd 3
        from_browser, to_write = os.pipe()  # and writes answers on its fd 4
        # bash renumbers the two ends to 3 and 4 (subprocess keeps descriptors, it does not move them): first away
        # from 3 and 4, which the pipes themselves may hold, then onto them (dash's sh takes one-digit numbers only)
        a, b = max(to_read, to_write, 4) + 1, max(to_read, to_write, 4) + 2
        move = f'exec "$0" "$@" {a}<&{to_read} {b}>&{to_write} 3<&{a} 4>&{b} {a}<&- {b}>&-'
        process = subprocess.Popen(
            ["bash", "-c", move, path, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(to_read, to_write), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_read)
        os.close(to_write)
        try:
            yield _Pipe(to_browser, from_browser, patience)
        finally:
            os.close(to_browser)
            try:
                process.wait(timeout=patience)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            os.close(from_browser)


def page_widths(pages: Iterable[pathlib.Path], width: int = 1280, height: int = 900, *,
                patience: float = 60.0) -> dict[pathlib.Path, Width]:
    """Each page's layout in a ``width`` x ``height`` window of one headless Chromium (``patience`` seconds at most
    for any one answer)."""
    path = browser()
    if path is None:
        raise FileNotFoundError("no chromium on PATH (apt-get install -y chromium)")
    found: dict[pathlib.Path, Width] = {}
    with _chromium(path, patience) as pipe:
        target = pipe.call("Target.createTarget", url="about:blank")["targetId"]
        session = pipe.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        pipe.call("Emulation.setDeviceMetricsOverride", session, width=width, height=height, deviceScaleFactor=1,
                  mobile=False)
        for page in pages:
            pipe.call("Page.navigate", session, url=page.resolve().as_uri())
            deadline = time.monotonic() + patience
            while pipe.call("Runtime.evaluate", session, expression="document.readyState")["result"]["value"] \
                    != "complete":
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{page} did not finish loading in {patience:.0f} s")
                time.sleep(0.02)
            # fonts and images settle the layout: wait for the fonts, then measure
            pipe.call("Runtime.evaluate", session, expression="document.fonts.ready.then(() => 1)", awaitPromise=True)
            measured = json.loads(pipe.call("Runtime.evaluate", session, expression=_MEASURE)["result"]["value"])
            found[page] = Width(measured["scroll"], measured["window"],
                                tuple((tag, right, text) for tag, right, text in measured["out"]),
                                tuple(measured["cut"]))
        pipe.call("Browser.close")
    return found
