"""The browser the UI tests drive: Debian's Chromium through Playwright's sync API, headless."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from harness.tasks import HUNG_S

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


def new_context(browser, **kwargs):
    """A browser context whose waits (a page's load, an element's showing) last as long as a test waits on
    anything (HUNG_S): they end as soon as what they wait for is there, and a loaded machine is slower."""
    context = browser.new_context(**kwargs)
    context.set_default_timeout(HUNG_S * 1000)
    context.set_default_navigation_timeout(HUNG_S * 1000)
    return context
