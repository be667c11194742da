"""The job page's "Dump stacks" button and stacks panel in Chromium, against the shared real cluster: a
2-worker job whose worker 1 sleeps in a named function; viewers see the panel but no button."""

from __future__ import annotations

import pytest

from mwms_testkit import PROGRAMS

from .conftest import WIDE, WatchedPage

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

# Both workers print WAITING, then stay where they are: worker 1 sleeps in a named function.
SLEEPERS = (PROGRAMS / "sleepers" / "main.py").read_text()


def logged_in_page(new_page, cluster, token: str) -> WatchedPage:
    watched = new_page(WIDE)
    response = watched.page.request.post(f"{cluster.api}/api/v1/session", data={"token": token})
    assert response.status == 200, response.text()
    return watched


def test_dump_stacks_shows_every_worker_side_by_side(cluster, new_page) -> None:
    job_id = cluster.submit({"main.py": SLEEPERS}, ["python", "main.py"], workers=2, name="browser-stacks")
    try:
        watched = logged_in_page(new_page, cluster, cluster.admin_token)
        page = watched.page
        page.goto(f"{cluster.api}/#/jobs/{job_id}")
        expect(page.locator("[data-testid=job-state]")).to_have_text("RUNNING", timeout=60_000)
        log_view = page.locator("[data-testid=log-view]")
        expect(log_view).to_contain_text("WAITING", timeout=30_000)
        page.locator("[data-testid=log-task]").select_option("1")
        expect(log_view).to_contain_text("WAITING", timeout=30_000)

        button = page.locator("[data-testid=dump-stacks]")
        expect(button).to_be_visible()
        button.click()
        tasks = page.locator("[data-testid=stacks-task]")
        expect(tasks).to_have_count(2, timeout=20_000)
        worker1 = page.locator("[data-testid=stacks-task][data-task-index='1']")
        expect(worker1.locator("[data-testid=stacks-collective]")).to_have_text("NOT in collective")
        expect(worker1.locator("[data-testid=stacks-thread][open] pre").first).to_contain_text(
            "wait_before_first_allreduce"
        )
        expect(page.locator("[data-testid=stacks-summary]")).to_contain_text(
            "Not in a collective: worker 0, worker 1"
        )
        boxes = [tasks.nth(i).bounding_box() for i in range(2)]
        assert boxes[0]["y"] == boxes[1]["y"] and boxes[0]["x"] < boxes[1]["x"], boxes  # side by side
        watched.screenshot("job-stacks-wide")
        watched.assert_clean()

        viewer = logged_in_page(
            new_page, cluster, cluster.create_token("stacks-browser-viewer", role="viewer")
        )
        viewer.page.goto(f"{cluster.api}/#/jobs/{job_id}")
        expect(viewer.page.locator("[data-testid=stacks-task]")).to_have_count(2)  # the stored dump
        expect(viewer.page.locator("[data-testid=dump-stacks]")).to_be_hidden()
        viewer.assert_clean()
    finally:
        cluster.http.post(f"/api/v1/jobs/{job_id}/cancel")
        cluster.wait_for(job_id, {"CANCELLED", "FAILED", "SUCCEEDED"})
