"""The dashboard shows untrusted text as text: in Chromium, against the fake coordinator
(testkit/mwms_testkit/fake_api/) holding one more job, of its own, whose name and log line are HTML that would run
script if the page parsed it. Neither runs, nothing is made of them in the page, and both read literally."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from mwms_testkit.fake_api import (
    ADMIN_TOKEN,
    T0,
    FakeJob,
    FakeState,
    serve_fake_api,
)

from .conftest import WIDE

pytestmark = pytest.mark.browser

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

PWN_JOB = "d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0"
PWN_NAME = "<img src=x onerror=window.__pwned=1>"
PWN_LOG = "<script>window.__pwned=2</script>"


@pytest.fixture(scope="module")
def hostile_url() -> Iterator[str]:
    """A fake coordinator of its own (the other tests' cluster is untouched), with the hostile job added."""
    cluster = FakeState(seeded=True)
    lines = [
        {
            "id": seq + 1,
            "task": 0,
            "attempt": 1,
            "seq": seq,
            "stream": "stdout",
            "text": text,
            "at": (T0 + timedelta(seconds=seq)).isoformat(),
        }
        for seq, text in enumerate(["before", PWN_LOG, "after"])
    ]
    cluster.jobs[PWN_JOB] = FakeJob(PWN_JOB, PWN_NAME, "RUNNING", T0 + timedelta(minutes=50), logs=lines)
    with serve_fake_api(state=cluster) as (url, _):
        yield url


def test_a_hostile_job_name_and_log_line_stay_text(new_page, hostile_url: str) -> None:
    watched = new_page(WIDE)
    page = watched.page
    response = page.request.post(f"{hostile_url}/api/v1/session", data={"token": ADMIN_TOKEN})
    assert response.status == 200, response.text()

    page.goto(f"{hostile_url}/#/jobs")
    row = page.locator(f"tr[data-job-id='{PWN_JOB}']")
    expect(row.locator(".job-link")).to_have_text(PWN_NAME)
    assert page.locator("#view img").count() == 0

    page.goto(f"{hostile_url}/#/jobs/{PWN_JOB}")
    expect(page.locator("[data-testid=job-name]")).to_have_text(PWN_NAME)
    log_view = page.locator("[data-testid=log-view]")
    expect(log_view).to_have_attribute("data-lines", "3")
    expect(log_view.locator(".log-text", has_text="<script>")).to_have_text(PWN_LOG)
    assert page.locator("#view img, #view script").count() == 0
    assert page.evaluate("typeof window.__pwned") == "undefined"
    # Nothing was refused by the CSP either: the page never made an element of the text to begin with.
    watched.assert_clean()
