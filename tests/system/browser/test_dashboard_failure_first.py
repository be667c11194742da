"""A job page shows a failure first, against the fake coordinator: a failed job's failing worker, its
reason and its last log lines are open on the page (no click), the worker that failed reads FAILED with its
exit code while its peers read "stopped because worker N failed", and opening a running, a failed or a
succeeded job's page makes no request that fails and logs no console error (issue 31)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from mwms.server.schemas import JobOut, TaskOut
from mwms_testkit.fake_api import (
    ADMIN_TOKEN,
    T0,
    FakeJob,
    FakeState,
    attempt_ending,
    serve_fake_api,
)

from .conftest import WIDE

pytestmark = pytest.mark.browser

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

FAILED = "fa11edfa11edfa11edfa11edfa11ed00"
RUNNING = "7f3c2a91d0b44c7e9a61b0c3d5e8f201"  # the fake's resnet50-imagenet
SUCCEEDED = "c0ffee00c0ffee00c0ffee00c0ffee00"  # the fake's bert-finetune
LAST_LINES = [f"worker 1 line {i}: Traceback or not, " + "y" * 90 for i in range(8)] + [
    "ValueError: the batch has 3 dimensions, the model wants 4"
]
# As the coordinator words it (server/services/job_life/lifecycle.py fail_attempt, describe_task_failure).
FAILED_REASON = (
    "task 1 on agent gpu-node-2: exited with code 1 (not retryable: exit codes 1-127 are permanent unless "
    "restart_on is 'any')\nlast log lines:\n" + "\n".join(LAST_LINES)
)


class FailedJob(FakeJob):
    """A job whose worker 1 exited with code 1 on its own; worker 0 was stopped because of it (its agent
    reports the stop's reason as its message, and the exit code its collective ended with)."""

    def ending(self, number: int, state: str) -> dict[str, Any]:
        return attempt_ending(
            "task_failed",
            "task 1 failed on agent gpu-node-2: exit code 1",
            task=1,
            agent="gpu-node-2",
            agent_id="agent-2",
            exit_code=1,
        )

    def detail(self) -> dict[str, Any]:
        detail = super().detail()
        worker0, worker1 = detail["tasks"]
        worker0.update(state="STOPPED", exit_code=1, message="stopped because worker 1 failed")
        worker1.update(state="FAILED", exit_code=1, message="exited with code 1", ended_attempt=True)
        for task in detail["tasks"]:
            task["ended_at"] = task["ended_at"] or task["started_at"]
        return detail


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeState, str]]:
    cluster = FakeState(seeded=True)
    with cluster.lock:
        cluster.jobs[FAILED] = FailedJob(FAILED, "broken-input", "FAILED", T0, reason=FAILED_REASON)
    with serve_fake_api(state=cluster) as (url, _):
        yield cluster, url


def logged_in(new_page, url: str, width: int = 1280):
    watched = new_page({**WIDE, "width": width})
    assert watched.page.request.post(f"{url}/api/v1/session", data={"token": ADMIN_TOKEN}).status == 200
    return watched


def test_the_fakes_jobs_have_the_coordinators_fields(fake) -> None:
    cluster, _ = fake
    for job in cluster.jobs.values():
        detail = job.detail()
        assert set(detail) <= set(JobOut.model_fields), set(detail) - set(JobOut.model_fields)
        assert "latest_stacks" in detail
        for task in detail["tasks"]:
            assert TaskOut.model_validate(task).model_dump(mode="json") == task


@pytest.mark.parametrize("width", [1280, 800])
def test_a_failed_jobs_failure_is_open_on_its_page(new_page, fake, width: int) -> None:
    _, url = fake
    watched = logged_in(new_page, url, width)
    page = watched.page
    page.goto(f"{url}/#/jobs/{FAILED}")

    failure = page.locator("[data-testid=job-failure]")
    expect(failure).to_be_visible()
    expect(page.locator("[data-testid=job-failure-title]")).to_have_text("Worker 1 failed with exit code 1")
    expect(page.locator("[data-testid=job-failure-reason]")).to_have_text(FAILED_REASON.split("\n")[0])
    log = page.locator("[data-testid=job-failure-log]")
    expect(log).to_be_visible()
    expect(log).to_have_text("\n".join(LAST_LINES))
    # Open: nothing of it is behind a disclosure, and its last line is in view without a click.
    assert failure.locator("details").count() == 0
    last = log.evaluate(
        "(el) => { el.scrollTop = el.scrollHeight; return el.scrollWidth <= el.clientWidth; }"
    )
    assert last, "the log lines wrap inside the box"

    tasks = page.locator("[data-testid=tasks-table] tbody tr")
    expect(tasks).to_have_count(2)
    failed, stopped = tasks.nth(1), tasks.nth(0)
    expect(failed).to_have_attribute("data-ended-attempt", "true")
    expect(failed.locator("[data-testid=task-state] .badge")).to_have_text("FAILED")
    expect(failed.locator("[data-testid=task-exit-code]")).to_have_text("1")
    expect(failed.locator("[data-testid=task-message]")).to_have_text("exited with code 1")
    expect(stopped.locator("[data-testid=task-state] .badge")).to_have_text("STOPPED")
    expect(stopped.locator("[data-testid=task-message]")).to_have_text("stopped because worker 1 failed")
    for row in (failed, stopped):
        for cell in ("task-state", "task-exit-code", "task-message"):
            box = row.locator(f"[data-testid={cell}]").bounding_box()
            assert box is not None and box["x"] + box["width"] <= width, (cell, box)
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    watched.screenshot(f"job-failed-{width}")
    watched.assert_clean()


@pytest.mark.parametrize("job_id", [RUNNING, FAILED, SUCCEEDED])
def test_a_job_page_makes_no_request_that_fails(new_page, fake, job_id: str) -> None:
    _, url = fake
    watched = logged_in(new_page, url)
    page = watched.page
    failures: list[str] = []
    requests: list[str] = []
    page.on("response", lambda r: failures.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.on("console", lambda m: failures.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("requestfailed", lambda r: failures.append(f"failed: {r.url}"))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(f"{url}/#/jobs/{job_id}")
    expect(page.locator("[data-testid=tasks-table] tbody tr")).to_have_count(2)
    # Two full polls of the job (each reads the job, then its metrics, artifacts, devices and preflight).
    detail = f"{url}/api/v1/jobs/{job_id}"
    for _ in range(100):  # polls every 2 s: up to 10 s
        if sum(1 for r in requests if r == detail) >= 2:
            break
        page.wait_for_timeout(100)
    assert sum(1 for r in requests if r == detail) >= 2, requests
    page.wait_for_load_state("networkidle")
    assert failures == [], failures
    assert not [r for r in requests if r.endswith("/stacks")], "no stack dump exists: none is asked for"
    watched.assert_clean()
