"""The dashboard in Chromium against a real coordinator and two real agents running real 2-worker jobs.

Uses the session-wide `cluster` fixture of tests/conftest.py; every page logs in with the cluster's admin token
(test_dashboard_auth_e2e.py tests the login itself). Saves a screenshot of every page, at desktop and phone
widths, under build/screenshots/.
"""

from __future__ import annotations

import pytest

from .conftest import NARROW, WIDE, WatchedPage

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.tf]

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

STEPS = 30
TRAIN_PROGRAM = f"""
import os, time
import mwms_runtime

strategy = mwms_runtime.strategy()
ctx = mwms_runtime.context()
for step in range({STEPS}):
    loss = 2.0 * 0.85 ** step + 0.05
    mwms_runtime.report(step, {{"loss": loss, "accuracy": 1.0 - loss / 2.5}})
    print(f"worker {{ctx.task_index}} step {{step}} loss {{loss:.4f}}", flush=True)
    time.sleep(0.25)
print("<b>training finished</b>", flush=True)
if ctx.is_chief:
    with open(os.path.join(mwms_runtime.output_dir(), "summary.txt"), "w") as out:
        out.write("final loss %.4f\\n" % loss)
mwms_runtime.flush()
"""
XSS_NAME = "<img src=x onerror=alert(1)>"
SLEEP_PROGRAM = "import time\nprint('waiting to be cancelled', flush=True)\ntime.sleep(600)\n"


def admin_page(new_page, cluster, viewport: dict[str, int] = WIDE) -> WatchedPage:
    """A watched page whose browser context is logged in to the dashboard with the admin token."""
    watched = new_page(viewport)
    response = watched.page.request.post(f"{cluster.api}/api/v1/session", data={"token": cluster.admin_token})
    assert response.status == 200, response.text()
    return watched


def test_training_job_is_followed_live_to_success(cluster, new_page) -> None:
    watched = admin_page(new_page, cluster)
    page = watched.page
    page.goto(f"{cluster.api}/#/jobs")
    expect(page.locator("#overview [data-stat=agents_online]")).not_to_have_text("–")
    page.evaluate("window.__sameDocument = true")

    job_id = cluster.submit(
        {"train.py": TRAIN_PROGRAM}, ["python", "train.py"], workers=2, name="browser-train"
    )
    row = page.locator(f"tr[data-job-id='{job_id}']")
    expect(row.locator(".job-link")).to_have_text("browser-train")
    expect(row.locator(".cell-shape")).to_have_text("2 × CPU")
    expect(row.locator(".cell-user")).to_have_text(cluster.http.get("/api/v1/whoami").json()["user"])
    expect(row.locator(".badge")).to_have_text("SUCCEEDED", timeout=240_000)
    assert page.evaluate("window.__sameDocument") is True, "the jobs page reloaded"
    expect(row.locator(".cell-step")).to_have_text(str(STEPS - 1))
    job = cluster.job(job_id)
    assert job["state"] == "SUCCEEDED", job["reason"]
    watched.screenshot("jobs-wide")
    page.locator("[data-filter=SUCCEEDED]").click()
    expect(row).to_be_visible()
    page.locator("[data-filter=CANCELLED]").click()
    expect(row).to_have_count(0)
    page.locator("[data-filter=ALL]").click()

    row.locator(".job-link").click()
    expect(page.locator("[data-testid=job-name]")).to_have_text("browser-train")
    expect(page.locator("[data-testid=job-state]")).to_have_text("SUCCEEDED")
    loss = page.locator("figure.chart[data-metric=loss]")
    expect(loss).to_have_attribute("data-points", str(STEPS), timeout=30_000)
    expect(loss).to_have_attribute("data-attempts", "1")
    expect(page.locator("[data-testid=tasks-table] tbody tr")).to_have_count(2)
    expect(page.locator("[data-testid=tasks-table] tbody .badge")).to_have_text(["SUCCEEDED", "SUCCEEDED"])

    log_view = page.locator("[data-testid=log-view]")
    expect(log_view).to_contain_text(f"worker 0 step {STEPS - 1} loss")
    expect(log_view.locator(".log-text", has_text="training finished")).to_have_text(
        "<b>training finished</b>"
    )
    assert log_view.locator("b").count() == 0
    page.locator("[data-testid=log-task]").select_option("1")
    expect(log_view).to_contain_text(f"worker 1 step {STEPS - 1} loss")
    expect(page.locator("[data-testid=artifacts-table] a", has_text="summary.txt")).to_be_visible(
        timeout=30_000
    )
    watched.screenshot("job-wide")

    page.goto(f"{cluster.api}/#/agents")
    # Other end-to-end tests may add agents to the shared cluster; the fixture's two are always there.
    for name in ("e2e-1", "e2e-2"):
        agent_row = page.locator("[data-testid=agents-table] tbody tr", has_text=name)
        expect(agent_row.locator(".badge")).to_have_text("online")
        expect(agent_row).to_contain_text("1 slot")
    # An admin also sees the coordinator's replicas: this one, alive, serving both, holding the streams.
    replica_row = page.locator("[data-testid=replicas-table] tbody tr[data-alive=true]")
    expect(replica_row).to_have_count(1)
    expect(replica_row.locator(".badge")).to_have_text("alive")
    expect(replica_row).to_contain_text("both")
    expect(replica_row.locator(".cell-loops")).to_contain_text("scheduler")
    watched.screenshot("agents-wide")

    narrow = admin_page(new_page, cluster, NARROW)
    for name, path, ready in [
        ("jobs", "#/jobs", f"tr[data-job-id='{job_id}']"),
        ("job", f"#/jobs/{job_id}", f"figure.chart[data-metric=loss][data-points='{STEPS}']"),
        ("agents", "#/agents", "[data-testid=agents-table] tbody tr"),
    ]:
        narrow.page.goto(f"{cluster.api}/{path}")
        expect(narrow.page.locator(ready).first).to_be_visible()
        overflow = narrow.page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{name}: the page is {overflow}px wider than a phone screen"
        narrow.screenshot(f"{name}-narrow")
    watched.assert_clean()
    narrow.assert_clean()


def test_hostile_job_name_is_shown_as_text(cluster, new_page) -> None:
    program = "print('<script>alert(2)</script>', flush=True)\n"
    job_id = cluster.submit({"p.py": program}, ["python", "p.py"], workers=1, name=XSS_NAME)
    watched = admin_page(new_page, cluster)
    page = watched.page
    page.goto(f"{cluster.api}/#/jobs")
    expect(page.locator(f"tr[data-job-id='{job_id}'] .job-link")).to_have_text(XSS_NAME)
    page.goto(f"{cluster.api}/#/jobs/{job_id}")
    expect(page.locator("[data-testid=job-name]")).to_have_text(XSS_NAME)
    expect(page.locator("[data-testid=job-state]")).to_have_text("SUCCEEDED", timeout=120_000)
    expect(page.locator("[data-testid=log-view] .log-text").first).to_have_text("<script>alert(2)</script>")
    assert page.locator("#view img, #view script").count() == 0
    watched.assert_clean()


def test_cancel_from_the_page(cluster, new_page) -> None:
    job_id = cluster.submit(
        {"sleep.py": SLEEP_PROGRAM}, ["python", "sleep.py"], workers=2, name="browser-cancel"
    )
    watched = admin_page(new_page, cluster)
    page = watched.page
    page.goto(f"{cluster.api}/#/jobs/{job_id}")
    expect(page.locator("[data-testid=job-state]")).to_have_text("RUNNING", timeout=120_000)
    expect(page.locator("[data-testid=log-view]")).to_contain_text("waiting to be cancelled")
    page.locator("[data-testid=cancel-job]").click()
    expect(page.locator("#confirm-dialog")).to_be_visible()
    page.locator("[data-testid=confirm-yes]").click()
    expect(page.locator("[data-testid=job-state]")).to_have_text("CANCELLED", timeout=60_000)
    admin = cluster.http.get("/api/v1/whoami").json()["user"]
    expect(page.locator("[data-testid=job-cancelled-by]")).to_have_text(admin)
    job = cluster.job(job_id)
    assert job["state"] == "CANCELLED" and job["cancelled_by"] == admin
    watched.assert_clean()


RESTART_PROGRAM = """
import os, signal, time
import mwms_runtime

strategy = mwms_runtime.strategy()
ctx = mwms_runtime.context()
first = ctx.attempt <= 1
for step in range(0, 8) if first else range(4, 12):
    mwms_runtime.report(step, {"loss": 1.0 / (step + 1) + (0.2 if first else 0.0)})
    time.sleep(0.1)
mwms_runtime.flush()
if first:
    if ctx.task_index == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # a retryable failure: the job restarts
    time.sleep(300)
"""


def test_chart_tells_attempts_apart_after_a_restart(cluster, new_page) -> None:
    job_id = cluster.submit(
        {"train.py": RESTART_PROGRAM}, ["python", "train.py"], workers=2, name="browser-restart"
    )
    watched = admin_page(new_page, cluster)
    page = watched.page
    page.goto(f"{cluster.api}/#/jobs/{job_id}")
    expect(page.locator("[data-testid=job-state]")).to_have_text("SUCCEEDED", timeout=240_000)
    loss = page.locator("figure.chart[data-metric=loss]")
    expect(loss).to_have_attribute("data-attempts", "2", timeout=30_000)
    expect(loss).to_have_attribute("data-points", "16")
    expect(loss.locator(".restart-line")).to_have_count(1)
    expect(page.locator("[data-testid=job-attempts]")).to_have_text("2 (1 restart)")
    watched.screenshot("job-restarted-wide")
    watched.assert_clean()
