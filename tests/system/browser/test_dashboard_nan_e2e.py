"""The chart marks non-finite metric values: a real 2-worker job reports NaN, +Infinity and -Infinity."""

from __future__ import annotations

import pytest

from .conftest import WIDE, WatchedPage

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.tf]

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

PROGRAM = """
import math
import mwms_runtime

strategy = mwms_runtime.strategy()
for step, loss in {1: 1.0, 2: 0.5, 3: math.nan, 4: math.inf, 5: -math.inf, 6: 0.25}.items():
    mwms_runtime.report(step, {"loss": loss})
mwms_runtime.flush()
"""


def test_chart_marks_nan_and_infinities_at_their_steps(cluster, new_page) -> None:
    job_id = cluster.submit({"train.py": PROGRAM}, ["python", "train.py"], workers=2, name="browser-nan")
    watched: WatchedPage = new_page(WIDE)
    response = watched.page.request.post(f"{cluster.api}/api/v1/session", data={"token": cluster.admin_token})
    assert response.status == 200, response.text()
    page = watched.page
    page.goto(f"{cluster.api}/#/jobs/{job_id}")
    expect(page.locator("[data-testid=job-state]")).to_have_text("SUCCEEDED", timeout=180_000)
    loss = page.locator("figure.chart[data-metric=loss]")
    expect(loss).to_have_attribute("data-points", "6", timeout=30_000)
    expect(loss).to_have_attribute("data-nonfinite", "3")
    markers = loss.locator(".nonfinite-marker")
    expect(markers).to_have_count(3)
    assert [(m.get_attribute("data-step"), m.get_attribute("data-value")) for m in markers.all()] == [
        ("3", "NaN"),
        ("4", "Infinity"),
        ("5", "-Infinity"),
    ]
    expect(markers.first.locator("title")).to_have_text("step 3: NaN (attempt 1)")
    expect(loss.locator(".chart-latest")).to_have_text("0.25 @ step 6")
    watched.screenshot("job-nan-loss-wide")
    watched.assert_clean()
