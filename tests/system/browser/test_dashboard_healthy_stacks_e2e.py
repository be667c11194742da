"""Dump stacks on a healthy 2-worker `fit` job, in Chromium against the shared real cluster: the coordinator
takes 3 snapshots of each worker over about a second, and neither worker is marked "NOT in collective"
(one snapshot caught the loop between two collectives often enough to cry wolf)."""

from __future__ import annotations

import pytest

from mwms_testkit import PROGRAMS
from mwms_testkit.cluster import pack_dir, wait_until

from .conftest import WIDE

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.tf]

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

HEALTHY_FIT = pack_dir(PROGRAMS / "healthy_fit")


def test_a_healthy_fit_job_is_in_a_collective_over_three_snapshots(cluster, new_page) -> None:
    job_id = cluster.submit(HEALTHY_FIT, ["python", "train.py"], workers=2, name="healthy-fit")
    try:
        wait_until(
            lambda: (
                all("FITTING" in cluster.logs_text(job_id, i) for i in (0, 1))
                or cluster.job(job_id)["state"] in {"FAILED", "CANCELLED", "SUCCEEDED"}
            ),
            240,
            f"both workers of {job_id} fitting",
        )
        assert cluster.job(job_id)["state"] == "RUNNING", cluster.logs_text(job_id)
        watched = new_page(WIDE)
        page = watched.page
        assert (
            page.request.post(f"{cluster.api}/api/v1/session", data={"token": cluster.admin_token}).status
            == 200
        )
        page.goto(f"{cluster.api}/#/jobs/{job_id}")
        expect(page.locator("[data-testid=job-state]")).to_have_text("RUNNING")
        page.locator("[data-testid=dump-stacks]").click()
        tasks = page.locator("[data-testid=stacks-task]")
        expect(tasks).to_have_count(2, timeout=30_000)
        for index in (0, 1):
            worker = page.locator(f"[data-testid=stacks-task][data-task-index='{index}']")
            expect(worker.locator("[data-testid=stacks-collective]")).to_have_text("in collective")
            expect(worker.locator("[data-testid=stacks-snapshots]")).to_contain_text(
                "in a collective in", timeout=1_000
            )
            expect(worker.locator("[data-testid=stacks-snapshots]")).to_contain_text("of 3 snapshots")
        summary = page.locator("[data-testid=stacks-summary]")
        expect(summary).to_contain_text("3 snapshots of each worker")
        expect(summary).not_to_contain_text("Not in a collective")
        watched.screenshot("job-stacks-healthy-fit")

        # The API says the same: in a collective in some of 3 snapshots, each of them stored in the text.
        dump = cluster.http.get(f"/api/v1/jobs/{job_id}/stacks").json()
        for task in dump["tasks"]:
            assert task["in_collective"] is True and task["snapshots"] == 3, task["error"]
            assert 1 <= task["snapshots_in_collective"] <= 3
            assert task["text"].count("=== mwms snapshot ") == 3
            assert any(thread["in_collective"] for thread in task["threads"])
        watched.assert_clean()
    finally:
        cluster.http.post(f"/api/v1/jobs/{job_id}/cancel")
        cluster.wait_for(job_id, {"CANCELLED", "FAILED", "SUCCEEDED"})
