"""The job page of a job with its own Python environment (submit --requirements), against the fake
coordinator: its file, Python and package count, where each worker's build stands, and the resolved
packages behind a disclosure; a job without one says it runs in the agents' own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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

WITH_ENV = "e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1"
WITHOUT_ENV = "a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0"
PACKAGES = [
    "numpy==2.4.6 ; python_full_version < '3.12'",
    "numpy==2.5.5 ; python_full_version >= '3.12'",
    "tabulate==0.9.0",
]


class EnvironmentJob(FakeJob):
    """A running job whose worker 0 built its environment and worker 1 is still building it."""

    def detail(self) -> dict[str, Any]:
        detail = super().detail()
        detail["environment"] = {
            "requirements": "requirements.txt",
            "python": "3.11",
            "isolated": False,
            "packages": PACKAGES,
        }
        for task, (state, seconds) in zip(
            detail["tasks"], [("ready", 12.34), ("building", None)], strict=True
        ):
            task["environment"], task["environment_build_seconds"] = state, seconds
        return detail


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeState, str]]:
    cluster = FakeState(seeded=True)
    with serve_fake_api(state=cluster) as (url, _):
        yield cluster, url


def test_the_job_page_shows_the_jobs_own_environment(new_page, fake) -> None:
    cluster, url = fake
    with cluster.lock:
        cluster.jobs[WITH_ENV] = EnvironmentJob(WITH_ENV, "with-env", "RUNNING", T0)
        cluster.jobs[WITHOUT_ENV] = FakeJob(WITHOUT_ENV, "without-env", "RUNNING", T0)
    watched = new_page(WIDE)
    page = watched.page
    assert page.request.post(f"{url}/api/v1/session", data={"token": ADMIN_TOKEN}).status == 200

    page.goto(f"{url}/#/jobs/{WITH_ENV}")
    panel = page.locator("[data-testid=python-environment]")
    expect(panel).to_contain_text("requirements.txt · Python 3.11 · 2 packages")
    expect(page.locator("[data-testid=python-environment-builds]")).to_have_text(
        "worker 0: built in 12.3 s · worker 1: building"
    )
    packages = page.locator("[data-testid=python-environment-packages] li")
    expect(packages).to_have_count(3)
    expect(packages.nth(0)).to_be_hidden()  # behind the disclosure until asked for
    panel.locator("summary").click()
    expect(packages.nth(2)).to_have_text("tabulate==0.9.0")

    page.goto(f"{url}/#/jobs/{WITHOUT_ENV}")
    expect(page.locator("[data-testid=python-environment]")).to_have_text("the agents' own")
