"""The job page's Preflight panel in Chromium: a real 2-worker job with the check on, against the shared cluster."""

from __future__ import annotations

import pytest

from .conftest import WIDE
from .test_dashboard_e2e import admin_page

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.tf]

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

PROGRAM = "import mwms_runtime\nmwms_runtime.strategy()\nprint('program ran', flush=True)\n"


def test_preflight_results_are_shown_per_task(cluster, new_page) -> None:
    job_id = cluster.submit(
        {"p.py": PROGRAM}, ["python", "p.py"], workers=2, name="preflight-page", preflight=True
    )
    plain_id = cluster.submit(
        {"p.py": "print('no check')\n"}, ["python", "p.py"], workers=1, name="no-preflight"
    )
    watched = admin_page(new_page, cluster, WIDE)
    page = watched.page
    page.goto(f"{cluster.api}/#/jobs/{job_id}")
    expect(page.locator("[data-testid=job-state]")).to_have_text("SUCCEEDED", timeout=240_000)
    panel = page.locator("[data-testid=job-preflight]")
    expect(panel).to_be_visible(timeout=15_000)
    rows = panel.locator("[data-testid=preflight-table] tbody tr")
    expect(rows).to_have_count(2)
    expect(panel.locator("tr[data-ok=true]")).to_have_count(2)
    header = panel.locator("thead").text_content() or ""
    assert "64 MB busbw GB/s" in header and "1 MB algbw GB/s" in header, header
    for i in range(2):
        cells = rows.nth(i).locator("td")
        assert cells.nth(1).inner_text().strip() == "passed"
        assert float(cells.nth(cells.count() - 1).inner_text()) > 0  # 64 MB busbw
    spec = page.locator("#spec").inner_text()
    assert "Preflight check\non" in spec or "Preflight check\ton" in spec, spec
    watched.screenshot("job-preflight")

    page.goto(f"{cluster.api}/#/jobs/{plain_id}")
    expect(page.locator("[data-testid=job-state]")).to_have_text("SUCCEEDED", timeout=120_000)
    expect(page.locator("[data-testid=job-preflight]")).to_be_hidden()
    watched.assert_clean()
