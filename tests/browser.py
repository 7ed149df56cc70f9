"""Headless Chromium for page tests: Debian's /usr/bin/chromium driven by Playwright (no browser download).

A missing browser is a failure with the install command, never a skip: the pages are part of the product.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = os.environ.get("KINETIC_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"  # screenshots kept for people to look at (gitignored)


def require_chromium() -> str:
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)) and not shutil.which(CHROMIUM):
        raise AssertionError(f"Chromium not found at {CHROMIUM}: install it with "
                             "`apt-get update && apt-get install -y chromium` (or set KINETIC_CHROMIUM)")
    return CHROMIUM


@contextmanager
def chromium_context() -> Iterator[object]:
    """A Playwright browser context on a fresh profile; closed (and the profile removed) afterwards."""
    from playwright.sync_api import sync_playwright

    executable = require_chromium()
    with tempfile.TemporaryDirectory(prefix="kinetic-chromium-") as profile, sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(profile, executable_path=executable,
                                                                 args=CHROMIUM_ARGS, headless=True,
                                                                 viewport={"width": 1280, "height": 900})
        try:
            yield context
        finally:
            context.close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # keep pytest's output clean
        pass


@contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """A static file server on a free port in a thread; yields its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
