"""The job page tells each attempt's story, against the fake coordinator: why it ended and what acted on it
(a task's failure, a preemption by another job, linked, a drain, a lost agent), in full, newest first, as
text (a hostile agent name stays text), and it fits windows from 800 to 1280 px wide."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mwms.server.schemas import AttemptEndingOut, AttemptEventOut
from mwms_testkit.fake_api import (
    ADMIN_TOKEN,
    T0,
    XSS_NAME,
    FakeJob,
    FakeState,
    attempt_ending,
    attempt_events,
    serve_fake_api,
)

from .conftest import WIDE

pytestmark = pytest.mark.browser

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

STORIES = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
MANY = "6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b"
URGENT = "900d900d900d900d900d900d900d900d"
DRAIN_NOTE = "kernel update on the whole rack, back in about twenty minutes " * 2


class StoryJob(FakeJob):
    """A running job in its fifth attempt: a task failed, then a job of priority 900 preempted it, then an
    admin drained its agent, then an agent was lost."""

    def ending(self, number: int, state: str) -> dict[str, Any]:
        if number == 2:
            return attempt_ending(
                "preempted", f"preempted by job {URGENT} (priority 900)", job_id=URGENT, priority=900
            )
        if number == 3:
            return attempt_ending(
                "drained",
                f"drained from agent {XSS_NAME} by alice ({DRAIN_NOTE.strip()})",
                {"note": DRAIN_NOTE.strip()},
                agent=XSS_NAME,
                agent_id="agent-2",
                by="alice",
            )
        if number == 4:
            return attempt_ending(
                "agent_lost",
                "lost agent gpu-node-1 (task 0): it stopped heartbeating; restart 2 of 3",
                {"how": "silent", "max_restarts": 3},
                agent="gpu-node-1",
                agent_id="agent-1",
                task=0,
                restart=2,
                restart_cause="agent_lost",
            )
        return super().ending(number, state)

    def detail(self) -> dict[str, Any]:
        detail = super().detail()
        for attempt in detail["attempt_history"]:
            if attempt["number"] in (2, 3):
                attempt["state"], attempt["reason"] = "PREEMPTED", "preempted: see its ending"
                attempt["events"] = attempt_events(
                    "PREEMPTED", T0, T0, self.ending(attempt["number"], "PREEMPTED")["kind"]
                )
        return detail


class ManyAttemptsJob(FakeJob):
    """A job in its 25th attempt, of which the coordinator lists the newest 20."""

    def detail(self) -> dict[str, Any]:
        detail = super().detail()
        detail["attempt_history"] = detail["attempt_history"][-20:]
        return detail


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeState, str]]:
    cluster = FakeState(seeded=True)
    with cluster.lock:
        cluster.jobs[STORIES] = StoryJob(STORIES, "stories", "RUNNING", T0, attempts=5)
        cluster.jobs[MANY] = ManyAttemptsJob(MANY, "many", "RUNNING", T0, attempts=25)
    with serve_fake_api(state=cluster) as (url, _):
        yield cluster, url


def test_the_fakes_stories_have_the_coordinators_shape(fake) -> None:
    cluster, _ = fake
    for attempt in cluster.jobs[STORIES].detail()["attempt_history"]:
        for event in attempt["events"]:
            assert AttemptEventOut.model_validate(event).model_dump(mode="json") == event
        if attempt["ended"] is not None:
            assert (
                AttemptEndingOut.model_validate(attempt["ended"]).model_dump(mode="json") == attempt["ended"]
            )


@pytest.mark.parametrize("width", [1280, 800])
def test_each_attempts_story_is_shown_in_full_newest_first(new_page, fake, width: int) -> None:
    _, url = fake
    watched = new_page({**WIDE, "width": width})
    page = watched.page
    assert page.request.post(f"{url}/api/v1/session", data={"token": ADMIN_TOKEN}).status == 200
    page.goto(f"{url}/#/jobs/{STORIES}")

    stories = page.locator("[data-testid=attempt-story]")
    expect(stories).to_have_count(5)
    assert [stories.nth(i).get_attribute("data-attempt") for i in range(5)] == ["5", "4", "3", "2", "1"]
    endings = page.locator("[data-testid=story-ending]")
    expect(endings.nth(0)).to_have_text("still going")
    expect(endings.nth(1)).to_have_text(
        "lost agent gpu-node-1 (task 0): it stopped heartbeating; restart 2 of 3"
    )
    expect(endings.nth(2)).to_have_text(f"drained from agent {XSS_NAME} by alice ({DRAIN_NOTE.strip()})")
    expect(endings.nth(3)).to_have_text(f"preempted by job {URGENT} (priority 900)")
    expect(endings.nth(4)).to_have_text(
        "task 1 failed on agent gpu-node-2: exit code 137 (SIGKILL); restart 1 of 3"
    )
    assert [endings.nth(i).get_attribute("data-kind") for i in range(5)] == [
        "",
        "agent_lost",
        "drained",
        "preempted",
        "task_failed",
    ]
    # In full: nothing of a story is behind a disclosure or cut off; the failure's log tail may be.
    for i in range(5):
        expect(endings.nth(i)).to_be_visible()
        assert endings.nth(i).evaluate(
            "el => el.closest('details') === null && el.scrollWidth <= el.clientWidth"
        )
    expect(stories.nth(4).locator("details.clamped")).to_have_count(1)
    # The job that preempted it is a link to its page; the hostile agent name is text.
    link = stories.nth(3).locator("[data-testid=story-job-link]")
    expect(link).to_have_attribute("href", f"#/jobs/{URGENT}")
    assert page.locator("#attempts img").count() == 0
    expect(stories.nth(3).locator(".story-trail")).to_contain_text("ACTIVE")
    expect(stories.nth(3).locator(".story-trail")).to_contain_text("PREEMPTED")

    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    panel = page.locator("#attempts")
    assert panel.evaluate("el => el.scrollWidth <= el.clientWidth")
    watched.screenshot(f"attempt-stories-{width}")
    watched.assert_clean()


def test_older_attempts_left_out_are_counted(new_page, fake) -> None:
    _, url = fake
    watched = new_page(WIDE)
    page = watched.page
    assert page.request.post(f"{url}/api/v1/session", data={"token": ADMIN_TOKEN}).status == 200
    page.goto(f"{url}/#/jobs/{MANY}")
    expect(page.locator("[data-testid=attempt-story]")).to_have_count(20)
    expect(page.locator(".stories-older")).to_have_text(
        "5 older attempts not listed: the job lists its newest 20."
    )
    watched.assert_clean()
