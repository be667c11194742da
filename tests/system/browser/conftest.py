"""Browser fixtures: Debian's chromium driven by Playwright, with every page watched for dialogs and CSP errors.

The Playwright driver (one per module) and the chromium binary are fixtures of tests/conftest.py, shared
with the TLS test that launches its own pinned browser.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mwms_testkit import REPO

REPO = REPO
SCREENSHOTS = REPO / "build" / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WIDE = {"width": 1280, "height": 900}
NARROW = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def browser(playwright_instance: object, chromium_executable: str) -> Iterator[object]:
    instance = playwright_instance.chromium.launch(executable_path=chromium_executable, args=CHROMIUM_ARGS)
    yield instance
    instance.close()


@dataclass
class WatchedPage:
    """A page plus what it did that a test should fail on: dialogs, script errors, CSP violations."""

    page: object
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert not self.dialogs, f"the page opened dialogs: {self.dialogs}"
        assert not self.errors, f"the page logged errors: {self.errors}"

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.evaluate("window.scrollTo(0, 0)")
        self.page.screenshot(path=str(path), full_page=True)
        return path


def _is_expected_console_error(text: str) -> bool:
    # Chromium logs every failed fetch (e.g. the 503 of the "unreachable" test) as a console error.
    return "Failed to load resource" in text


@pytest.fixture
def new_page(browser: object) -> Iterator[object]:
    """new_page(viewport) -> WatchedPage; dialogs are recorded and dismissed, so a test can never hang on one."""
    contexts = []

    def make(viewport: dict[str, int] = WIDE) -> WatchedPage:
        context = browser.new_context(viewport=viewport, accept_downloads=True)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        watched = WatchedPage(page)

        def on_dialog(dialog: object) -> None:
            watched.dialogs.append(f"{dialog.type}: {dialog.message}")
            dialog.dismiss()

        page.on("dialog", on_dialog)
        page.on("pageerror", lambda error: watched.errors.append(f"pageerror: {error}"))
        page.on(
            "console",
            lambda message: (
                watched.errors.append(f"console: {message.text}")
                if message.type == "error" and not _is_expected_console_error(message.text)
                else None
            ),
        )
        return watched

    yield make
    for context in contexts:
        context.close()
