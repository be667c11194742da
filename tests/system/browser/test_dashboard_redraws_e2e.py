"""The dashboard's log view of a job whose program redraws a progress line with `\\r` (Keras, tqdm), against
the shared real cluster: the bar shows as one line that moves while the job runs, and ends as its final state
in place, with no stale states left behind (web/js/logs.js)."""

from __future__ import annotations

import pytest

from .conftest import WatchedPage

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

# A bar redrawn every 0.5 s for 6 s (the dashboard polls every few seconds), backspaces first as Keras writes.
PROGRESS = r"""
import sys, time
print("Epoch 1/1", flush=True)
width = 0
for step in range(1, 13):
    bar = f"{step}/12 [" + "=" * step + "." * (12 - step) + "]"
    sys.stdout.write("\b" * width + "\r" + bar)
    sys.stdout.flush()
    width = len(bar)
    if step == 2:
        print("a warning", file=sys.stderr, flush=True)
    time.sleep(0.5)
sys.stdout.write("\b" * width + "\r12/12 - loss: 0.1\n")
print("done", flush=True)
"""


def test_a_redrawn_line_moves_in_place_and_ends_as_its_final_state(cluster, new_page) -> None:
    watched: WatchedPage = new_page()
    page = watched.page
    response = page.request.post(f"{cluster.api}/api/v1/session", data={"token": cluster.admin_token})
    assert response.status == 200, response.text()
    job_id = cluster.submit({"progress.py": PROGRESS}, ["python", "progress.py"], workers=1)
    page.goto(f"{cluster.api}/#/jobs/{job_id}")
    texts = page.locator("[data-testid=log-view] .log-line:not(.stderr) .log-text")
    # While the job runs: the bar is one line after "Epoch 1/1", showing some state of it.
    expect(texts.nth(1)).to_contain_text("/12 [", timeout=60_000)
    expect(texts).to_have_count(2)
    expect(page.locator("[data-testid=job-state]")).to_have_text("SUCCEEDED", timeout=60_000)
    expect(texts).to_have_text(["Epoch 1/1", "12/12 - loss: 0.1", "done"], timeout=15_000)
    expect(page.locator("[data-testid=log-view] .log-line.stderr .log-text")).to_have_text(["a warning"])
    watched.assert_clean()
