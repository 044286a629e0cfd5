"""Headless Chromium driven by Playwright, for the report viewer's tests and its screenshot.

The browser is Debian's chromium (`make test` installs it when /usr/bin/chromium is
missing): Playwright cannot download its own here. The flags keep it off the network it
cannot reach (background updates, sync, QUIC) and sandbox-free, as CI runs it as root;
each start gets a fresh profile folder.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def missing_browser() -> str:
    """Why the browser cannot start here, or "" if it can."""
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is missing: pip install -e '.[dev]'"
    if not CHROMIUM.is_file():
        return f"{CHROMIUM} is missing: apt-get install chromium (`make test` does, where apt-get runs as root)"
    return ""


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator:
    """A Playwright browser context of a fresh headless Chromium profile."""
    from playwright.sync_api import sync_playwright

    profile = Path(tempfile.mkdtemp(prefix="toolpolicy-chromium-"))
    try:
        with sync_playwright() as driver:
            context = driver.chromium.launch_persistent_context(
                str(profile), executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True,
                viewport={"width": width, "height": height},
            )
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
