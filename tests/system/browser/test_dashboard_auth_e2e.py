"""Dashboard login against a real coordinator: nothing before login, roles in the UI and in the API, logout,
and the cookie refused for cross-site writes.

Uses the session-wide `cluster` fixture of tests/conftest.py. The jobs here ask for more devices than any agent
has, so they stay PENDING (and cancellable) without running anything.
"""

from __future__ import annotations

import httpx
import pytest

from mwms_testkit.cluster import pack

from .conftest import WIDE

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

SESSION_COOKIE = "mwms_session"


def submit_unplaceable(cluster, client: httpx.Client, name: str) -> str:
    """A job as the caller of client that no agent can fit: it waits PENDING until cancelled."""
    digest = cluster.upload(pack({"idle.py": "import time; time.sleep(600)"}))
    body = {
        "bundle_digest": digest,
        "command": ["python", "idle.py"],
        "workers": 1,
        "agents": ["not-joined-yet"],
    }
    response = client.post("/api/v1/jobs", json={**body, "name": name})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def page_fetch(page, path: str, method: str = "GET") -> int:
    """The status of a fetch() made by the page itself (its cookie, its Origin)."""
    return page.evaluate(
        "async ([path, method]) => (await fetch(path, {method, headers: {Accept: 'application/json'}})).status",
        [path, method],
    )


def log_in_with_form(page, token: str) -> None:
    expect(page.locator("[data-testid=login]")).to_be_visible()
    page.locator("[data-testid=login-token]").fill(token)
    page.locator("[data-testid=login-submit]").click()
    expect(page.locator("[data-testid=login]")).to_be_hidden()


def session_cookie(page) -> str:
    values = [c["value"] for c in page.context.cookies() if c["name"] == SESSION_COOKIE]
    assert values, "no session cookie after logging in"
    return values[0]


def test_admin_logs_in_and_out_and_the_cookie_is_refused_cross_site(cluster, new_page) -> None:
    admin = cluster.http.get("/api/v1/whoami").json()["user"]
    job_id = submit_unplaceable(cluster, cluster.http, "auth-admin-job")
    watched = new_page(WIDE)
    page = watched.page
    page.goto(f"{cluster.api}/#/jobs")
    expect(page.locator("[data-testid=login]")).to_be_visible()
    expect(page.locator("#view")).to_be_hidden()
    assert page.locator("[data-testid=jobs-table]").count() == 0
    assert page_fetch(page, "/api/v1/jobs") == 401
    assert page_fetch(page, "/api/v1/whoami") == 401

    page.locator("[data-testid=login-token]").fill("mwms_not-a-real-token")
    page.locator("[data-testid=login-submit]").click()
    expect(page.locator("[data-testid=login-error]")).to_contain_text("not accepted")
    assert page.locator("[data-testid=jobs-table]").count() == 0

    log_in_with_form(page, cluster.admin_token)
    row = page.locator(f"tr[data-job-id='{job_id}']")
    expect(row.locator(".job-link")).to_have_text("auth-admin-job")
    expect(row.locator(".cell-user")).to_have_text(admin)
    expect(page.locator("[data-testid=session-user]")).to_have_text(admin)
    expect(page.locator("[data-testid=session-role]")).to_have_text("admin")
    stored = page.evaluate(
        "() => JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage), document.cookie])"
    )
    assert cluster.admin_token not in stored and SESSION_COOKIE not in stored, stored
    assert cluster.admin_token not in page.content()
    cookie = session_cookie(page)
    assert [c["httpOnly"] for c in page.context.cookies()] == [True]

    # The cookie with a foreign Origin cannot change anything (CSRF); from the page itself it can read.
    refused = page.request.post(
        f"{cluster.api}/api/v1/jobs/{job_id}/cancel", headers={"Origin": "http://evil.example"}
    )
    assert refused.status == 403, refused.text()
    assert "cross-site" in refused.json()["detail"]
    assert cluster.job(job_id)["state"] == "PENDING"
    assert page_fetch(page, f"/api/v1/jobs/{job_id}") == 200

    page.locator("[data-testid=logout]").click()
    expect(page.locator("[data-testid=login]")).to_be_visible()
    expect(page.locator("#view")).to_be_hidden()
    assert page.locator("[data-testid=jobs-table]").count() == 0
    assert page_fetch(page, "/api/v1/jobs") == 401
    # The old cookie is dead on the coordinator, not only deleted from the browser.
    stale = cluster.client(None).get("/api/v1/jobs", headers={"Cookie": f"{SESSION_COOKIE}={cookie}"})
    assert stale.status_code == 401
    page.reload()
    expect(page.locator("[data-testid=login]")).to_be_visible()
    assert cluster.http.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    watched.assert_clean()


def test_viewer_and_user_see_cancel_only_where_the_coordinator_allows_it(cluster, new_page) -> None:
    uma_token = cluster.create_token("uma", "user")
    admins_job = submit_unplaceable(cluster, cluster.http, "auth-admins-job")
    umas_job = submit_unplaceable(cluster, cluster.client(uma_token), "auth-umas-job")

    viewer = new_page(WIDE)
    page = viewer.page
    page.goto(f"{cluster.api}/#/jobs/{admins_job}")
    log_in_with_form(page, cluster.create_token("vera", "viewer"))
    expect(page.locator("[data-testid=session-user]")).to_have_text("vera")
    expect(page.locator("[data-testid=session-role]")).to_have_text("viewer")
    expect(page.locator("[data-testid=job-name]")).to_have_text("auth-admins-job")
    expect(page.locator("[data-testid=job-state]")).to_have_text("PENDING")
    expect(page.locator("[data-testid=cancel-job]")).to_be_hidden()
    assert page_fetch(page, f"/api/v1/jobs/{admins_job}/cancel", "POST") == 403
    assert cluster.job(admins_job)["state"] == "PENDING"
    page.goto(f"{cluster.api}/#/jobs/{umas_job}")
    expect(page.locator("[data-testid=job-submitted-by]")).to_have_text("uma")
    expect(page.locator("[data-testid=cancel-job]")).to_be_hidden()
    viewer.screenshot("auth-viewer-job-wide")

    user = new_page(WIDE)
    page = user.page
    page.goto(f"{cluster.api}/#/jobs/{admins_job}")
    log_in_with_form(page, uma_token)
    expect(page.locator("[data-testid=job-state]")).to_have_text("PENDING")
    expect(page.locator("[data-testid=cancel-job]")).to_be_hidden()  # someone else's job
    assert page_fetch(page, f"/api/v1/jobs/{admins_job}/cancel", "POST") == 403
    page.goto(f"{cluster.api}/#/jobs/{umas_job}")
    expect(page.locator("[data-testid=job-state]")).to_have_text("PENDING")
    page.locator("[data-testid=cancel-job]").click()
    page.locator("[data-testid=confirm-yes]").click()
    expect(page.locator("[data-testid=job-state]")).to_have_text("CANCELLED")
    expect(page.locator("[data-testid=job-cancelled-by]")).to_have_text("uma")
    job = cluster.job(umas_job)
    assert job["state"] == "CANCELLED" and job["cancelled_by"] == "uma"
    assert cluster.job(admins_job)["state"] == "PENDING"
    assert cluster.http.post(f"/api/v1/jobs/{admins_job}/cancel").status_code == 200
    viewer.assert_clean()
    user.assert_clean()
