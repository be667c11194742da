"""A user's first hour on the dashboard, against the fake coordinator (testkit/mwms_testkit/fake_api/): the charts
follow a job to its last point after it ends (a cancelled job's workers train on while they stop), and the
job page's tables and the jobs, agents and queue tables fit 1280 and 800 px windows with long artifact
paths, agent names and messages."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.routing import APIRoute

from mwms.server.schemas import ArtifactOut
from mwms_testkit.fake_api import (
    ADMIN_TOKEN,
    T0,
    FakeJob,
    FakeState,
    _iso,
    create_app,
)
from mwms_testkit.served_app import served

from .conftest import WIDE

pytestmark = pytest.mark.browser

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

STOPPING = "5ca1ab1e5ca1ab1e5ca1ab1e5ca1ab1e"
LONG_NAMES = "10ad10ad10ad10ad10ad10ad10ad10ad"
LONG_AGENT = "gpu-node-with-a-rather-long-hostname-0042.datacenter-east.example.internal"
LONG_PATHS = [
    "checkpoints/ckpt-epoch-0001-val_loss-0.123456-val_accuracy-0.987654-with-a-long-suffix.weights.h5",
    "saved_model/variables/variables.data-00000-of-00001_and_a_name_without_any_place_to_break_it_at_all",
    "logs/train/events.out.tfevents.1733170000.gpu-node-with-a-rather-long-hostname.12345.0.v2",
]


class StoppingJob(FakeJob):
    """A job whose state may be ended while its tasks still run (they report until they have stopped),
    and whose tasks may carry long agent names and messages."""

    tasks_running: bool = True
    agent: str = "gpu-node-1"
    message: str = ""

    def detail(self) -> dict[str, Any]:
        detail = super().detail()
        for task in detail["tasks"]:
            task["agent_name"] = self.agent
            task["message"] = self.message or task["message"]
            if self.tasks_running:
                task["state"], task["exit_code"], task["ended_at"] = "RUNNING", None, None
            else:
                task["state"], task["exit_code"] = "STOPPED", -15
                task["ended_at"] = task["ended_at"] or _iso(T0)
        return detail


def points(start: int, stop: int) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "step": step,
            "value": value,
            "wall_time": _iso(T0 + timedelta(seconds=step)),
            "attempt": 1,
        }
        for step in range(start, stop)
        for name, value in (("loss", 2.0 / (1 + step)), ("accuracy", step / (step + 10)))
    ]


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeState, str]]:
    cluster = FakeState(seeded=True)
    app = create_app(cluster)

    def long_artifacts(job_id: str) -> list[dict[str, Any]]:
        if job_id != LONG_NAMES:
            return []
        return [
            {"path": path, "size": 10**9 + i, "sha256": "ab" * 32, "attempt": 12, "created_at": _iso(T0)}
            for i, path in enumerate(LONG_PATHS)
        ]

    # Answers before the fake's own artifacts route, which lists fixed short names.
    route = APIRoute(
        "/api/v1/jobs/{job_id}/artifacts", long_artifacts, methods=["GET"], response_model=list[ArtifactOut]
    )
    app.router.routes.insert(0, route)
    with served(app) as url:
        yield cluster, url


@pytest.fixture
def cluster_url(fake: tuple[FakeState, str]) -> Iterator[tuple[FakeState, str]]:
    cluster, url = fake
    cluster.reset()
    yield cluster, url
    cluster.reset()


def logged_in(new_page, url: str, viewport: dict[str, int] = WIDE):
    watched = new_page(viewport)
    response = watched.page.request.post(f"{url}/api/v1/session", data={"token": ADMIN_TOKEN})
    assert response.status == 200, response.text()
    return watched


POLL_MS = 2000  # web/js/poll.js POLL_INTERVAL_MS


def run_polls(page, job_reads: list[str], count: int) -> None:
    """Lets the job page poll `count` more times on the page's fake clock (page.clock.install): each turn
    moves the clock one interval and gives the poll real time to be answered, until the page has read the
    job `count` more times. The page's own cadence decides what each poll reads; no real seconds pass
    waiting for it."""
    target = len(job_reads) + count
    deadline = time.monotonic() + 30 + count
    while len(job_reads) < target:
        assert time.monotonic() < deadline, f"{len(job_reads)} of {target} reads of the job"
        page.clock.run_for(POLL_MS)
        page.wait_for_timeout(50)


def test_the_charts_follow_an_ended_job_until_its_last_point(new_page, cluster_url) -> None:
    cluster, url = cluster_url
    job = StoppingJob(STOPPING, "cancelled-while-training", "RUNNING", T0, metrics=points(0, 30))
    with cluster.lock:
        cluster.jobs[job.id] = job
    watched = logged_in(new_page, url)
    page = watched.page
    job_reads: list[str] = []
    metric_reads: list[str] = []

    def on_request(request) -> None:
        if request.url.endswith(f"/jobs/{STOPPING}"):
            job_reads.append(request.url)
        elif f"/jobs/{STOPPING}/metrics?" in request.url:
            metric_reads.append(request.url)

    page.on("request", on_request)
    page.clock.install()
    page.goto(f"{url}/#/jobs/{STOPPING}")
    loss = page.locator("figure[data-metric=loss] .chart-latest")
    expect(loss).to_contain_text("@ step 29")

    # Cancelled: the job's state is final at once, while its workers train on until they have stopped.
    with cluster.lock:
        job.state, job.reason, job.cancelled_by = "CANCELLED", "cancelled by alice", "alice"
    run_polls(page, job_reads, 1)
    expect(page.locator("[data-testid=job-state]")).to_have_text("CANCELLED")
    # More than the five polls after the end that the charts used to follow an ended job for.
    run_polls(page, job_reads, 6)
    with cluster.lock:
        job.metrics.extend(points(30, 60))
    run_polls(page, job_reads, 2)  # the second one read the job after the new points
    expect(page.locator("[data-testid=job-step]")).to_have_text("59")
    expect(loss).to_contain_text("@ step 59")

    # The tasks have stopped, and their last reports land after that: the chart still reaches them.
    with cluster.lock:
        job.tasks_running = False
    run_polls(page, job_reads, 5)  # past the few polls after the job has settled
    with cluster.lock:
        job.metrics.extend(points(60, 62))
    run_polls(page, job_reads, 2)
    expect(page.locator("[data-testid=job-step]")).to_have_text("61")
    expect(loss).to_contain_text("@ step 61")
    expect(page.locator("figure[data-metric=accuracy] .chart-latest")).to_contain_text("@ step 61")
    # Each poll read only the points stored since the one before: every point crossed the wire once.
    with cluster.lock:
        served, stored = sum(read["points"] for read in cluster.metric_reads), len(job.metrics)
        cursors = [read["after"] for read in cluster.metric_reads]
    assert served == stored == 2 * 62, (served, stored)
    assert cursors[0] == 0 and cursors == sorted(cursors) and cursors[-1] == stored, cursors

    # Settled (every task ended, the charts at the job's step): a few more reads, then one every tenth poll.
    run_polls(page, job_reads, 4)
    before = len(metric_reads)
    run_polls(page, job_reads, 4)
    assert len(metric_reads) - before <= 1, metric_reads
    watched.assert_clean()


def overflowing_tables(page) -> list[str]:
    """The tables on the page wider than their box (clipped, or scrolled sideways), by their panel."""
    return page.evaluate(
        """() => [...document.querySelectorAll('.table-wrap')]
            .filter((wrap) => wrap.scrollWidth > wrap.clientWidth + 1)
            .map((wrap) => `${wrap.closest('section')?.getAttribute('aria-label')}: ${wrap.scrollWidth} > ${wrap.clientWidth}`)"""
    )


def assert_in_view(page, table: str, headings: list[str]) -> None:
    """The table's first columns are `headings`, and they are inside its panel's visible box."""
    found = page.locator(table).evaluate(
        """(table) => {
            const box = table.closest('.table-wrap').getBoundingClientRect();
            return [...table.querySelectorAll('thead th')].map((th) => {
                const cell = th.getBoundingClientRect();
                return [th.textContent, cell.left >= box.left - 1 && cell.right <= box.right + 1];
            });
        }"""
    )
    assert found[: len(headings)] == [[heading, True] for heading in headings], found


@pytest.mark.parametrize("width", [1280, 800])
def test_the_job_pages_tables_fit_1280_and_800_px_windows(new_page, cluster_url, width: int) -> None:
    cluster, url = cluster_url
    # Submitted yesterday: its tasks' Started cells show the date as well as the time (the widest they get).
    job = StoppingJob(
        LONG_NAMES,
        "long-names",
        "SUCCEEDED",
        T0 - timedelta(days=1),
        metrics=points(0, 5),
        reason="all tasks exited 0",
    )
    job.tasks_running = False
    job.agent = LONG_AGENT
    job.message = "exited with code 0 after writing " + "/a/path/without/spaces" * 8
    with cluster.lock:
        cluster.jobs[job.id] = job
    watched = logged_in(new_page, url, {**WIDE, "width": width})
    page = watched.page
    page.goto(f"{url}/#/jobs/{LONG_NAMES}")
    artifacts = page.locator("[data-testid=artifacts-table]")
    expect(artifacts.locator("tbody tr")).to_have_count(3)
    expect(page.locator("[data-testid=tasks-table] tbody tr")).to_have_count(2)
    # At 800 px only the tasks table scrolls, inside its panel: its first columns (how each worker fares)
    # are in view.
    scrolling = [] if width >= 1280 else ["Tasks"]
    assert [found.split(":")[0] for found in overflowing_tables(page)] in ([], scrolling)
    assert_in_view(page, "[data-testid=tasks-table]", ["#", "State", "Exit", "Message"])
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    # Long paths wrap inside their cell (nothing cut off), and say in full what they are on hover.
    link = artifacts.locator("a", has_text="ckpt-epoch-0001")
    assert link.get_attribute("title") == LONG_PATHS[0]
    box, cell = link.bounding_box(), artifacts.locator("td.cell-path").first.bounding_box()
    assert box["x"] + box["width"] <= cell["x"] + cell["width"] + 1, (box, cell)
    # Every column stays readable: none is squeezed below a few characters.
    widths = artifacts.locator("th").evaluate_all(
        "(cells) => cells.map((c) => c.getBoundingClientRect().width)"
    )
    assert min(widths) >= 48, widths
    # An opened TF_CONFIG fits too (at 800 px, inside the tasks table's scrolling panel).
    page.locator("[data-testid=tasks-table] details.tf-config summary").first.click()
    assert [found.split(":")[0] for found in overflowing_tables(page)] in ([], scrolling)
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    watched.screenshot(f"job-long-names-{width}")

    page.goto(f"{url}/#/jobs")
    expect(page.locator("[data-testid=jobs-table] tbody tr")).to_have_count(5)
    page.goto(f"{url}/#/agents")
    expect(page.locator("[data-testid=agents-table] tbody tr")).to_have_count(2)
    page.goto(f"{url}/#/queue")
    expect(page.locator("[data-testid=queue-table]")).to_be_visible()
    for where in ("jobs", "agents", "queue"):
        page.goto(f"{url}/#/{where}")
        page.wait_for_timeout(500)
        assert overflowing_tables(page) == [], where
        assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0, where
        watched.screenshot(f"{where}-{width}")
    # Every state filter is in view (none scrolled out of the chips' row).
    page.goto(f"{url}/#/jobs")
    chips = page.locator(".chips .chip")
    expect(chips.last).to_have_text("Cancelled")
    assert chips.evaluate_all(
        """(chips) => chips.every((chip) => {
            const row = chip.parentElement.getBoundingClientRect(), box = chip.getBoundingClientRect();
            return box.left >= row.left - 1 && box.right <= row.right + 1 && box.right <= window.innerWidth;
        })"""
    )
    watched.assert_clean()
