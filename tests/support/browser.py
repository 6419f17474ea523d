"""The browser the UI tests drive: Debian's Chromium through Playwright's sync API, headless."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

CHROMIUM = "/usr/bin/chromium"
# No sandbox (the tests run as root) and none of Chromium's own background traffic (updates, sync): the
# sub-path test lists the requests a page makes.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


@contextlib.contextmanager
def chromium() -> Iterator:
    """A launched Chromium, closed on leaving. Playwright is imported here: only the UI tests need it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
