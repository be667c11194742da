"""The dashboard in Chromium against a fake coordinator (testkit/mwms_testkit/fake_api/): login and roles,
rendering, escaping, live updates, charts, logs, cancel, empty and error states, and layout at desktop and
phone widths."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from mwms_testkit.fake_api import (
    ADMIN_TOKEN,
    USER_TOKEN,
    VIEWER_TOKEN,
    XSS_LOG,
    XSS_NAME,
    FakeState,
    serve_fake_api,
)

from .conftest import NARROW, WIDE

pytestmark = pytest.mark.browser

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

RESNET = "7f3c2a91d0b44c7e9a61b0c3d5e8f201"
XSS_JOB = "0b1e2d3c4f5a69788796a5b4c3d2e1f0"


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeState, str]]:
    cluster = FakeState(seeded=True)
    with serve_fake_api(state=cluster) as (url, _):
        yield cluster, url


@pytest.fixture
def cluster_url(fake: tuple[FakeState, str]) -> Iterator[tuple[FakeState, str]]:
    cluster, url = fake
    cluster.reset()
    yield cluster, url
    cluster.reset()


def logged_in(new_page, url: str, viewport: dict[str, int] = WIDE, token: str = ADMIN_TOKEN):
    """A watched page whose context holds a session for token (logged in through the API, not the form)."""
    watched = new_page(viewport)
    response = watched.page.request.post(f"{url}/api/v1/session", data={"token": token})
    assert response.status == 200, response.text()
    return watched


def assert_fits_width(page) -> None:
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page is {overflow}px wider than the window"


def test_jobs_list_renders_updates_live_and_escapes_names(new_page, cluster_url) -> None:
    cluster, url = cluster_url
    watched = logged_in(new_page, url)
    page = watched.page
    page.goto(f"{url}/#/jobs")
    rows = page.locator("[data-testid=jobs-table] tbody tr")
    expect(rows).to_have_count(4)
    # Newest first.
    expect(rows.locator(".job-link")).to_have_text(
        ["waiting-for-gpus", "resnet50-imagenet", XSS_NAME, "bert-finetune"]
    )
    assert page.locator("[data-testid=jobs-table] img").count() == 0
    page.evaluate("window.__sameDocument = true")

    resnet = page.locator(f"tr[data-job-id='{RESNET}']")
    expect(resnet.locator(".cell-shape")).to_have_text("2 × 1 GPU")
    expect(resnet.locator(".cell-attempts")).to_have_text("2")
    expect(resnet.locator(".cell-user")).to_have_text("bob")
    # The fake job finishes after a few polls: the row changes without a reload.
    expect(resnet.locator(".badge")).to_have_text("SUCCEEDED", timeout=15_000)
    assert page.evaluate("window.__sameDocument") is True

    expect(page.locator("[data-stat=agents_online]")).to_have_text("1")
    expect(page.locator("[data-stat=agents_lost]")).to_have_text("1")
    expect(page.locator("[data-stat=devices_free]")).to_have_text("5")
    expect(page.locator("[data-stat=jobs_pending]")).to_have_text("1")
    watched.screenshot("fixture-jobs-wide")

    page.locator("[data-filter=SUCCEEDED]").click()
    expect(page.locator("[data-testid=jobs-table] tbody tr")).to_have_count(2)
    expect(page.locator("[data-testid=jobs-table] tbody .badge")).to_have_text(["SUCCEEDED", "SUCCEEDED"])
    page.locator("[data-filter=FAILED]").click()
    expect(page.locator("[data-testid=empty]")).to_contain_text("No failed jobs")
    watched.assert_clean()


def test_job_page_shows_charts_tasks_logs_and_artifacts(new_page, cluster_url) -> None:
    cluster, url = cluster_url
    cluster.jobs[RESNET].state = "SUCCEEDED"
    watched = logged_in(new_page, url)
    page = watched.page
    page.goto(f"{url}/#/jobs/{RESNET}")
    expect(page.locator("[data-testid=job-name]")).to_have_text("resnet50-imagenet")
    expect(page.locator("[data-testid=job-state]")).to_have_text("SUCCEEDED")
    # Two attempts of 40 steps each, told apart, with the restart marked.
    loss = page.locator("figure.chart[data-metric=loss]")
    expect(loss).to_have_attribute("data-points", "80")
    expect(loss).to_have_attribute("data-attempts", "2")
    expect(loss.locator(".restart-line")).to_have_count(1)
    expect(loss.locator(".chart-legend")).to_contain_text("attempt 2")
    expect(page.locator("figure.chart[data-metric=accuracy]")).to_have_attribute("data-points", "80")
    expect(page.locator("figure.chart").first).to_have_attribute("data-metric", "loss")

    tasks = page.locator("[data-testid=tasks-table] tbody tr")
    expect(tasks).to_have_count(2)
    memory = tasks.locator("[data-testid=task-peak-memory]")
    expect(memory).to_have_text(["1.2 GiB", "–"])
    expect(memory.first).to_have_attribute("title", "peak 1.2 GiB of its 8.0 GiB limit")
    config = tasks.first.locator("details.tf-config")
    expect(config.locator("pre")).not_to_be_visible()
    config.locator("summary").click()
    expect(config.locator("pre")).to_contain_text('"worker"')

    log_view = page.locator("[data-testid=log-view]")
    expect(log_view).to_have_attribute("data-lines", "60")
    expect(log_view).to_contain_text("Epoch 1/3 - step 59/60")
    expect(log_view.locator(".log-text", has_text="<script>")).to_have_text(XSS_LOG)
    page.locator("[data-testid=log-search]").fill("step 5")
    expect(log_view).to_have_attribute("data-shown", "11")  # step 5, 50..59
    with page.expect_download() as download_info:
        page.locator("[data-testid=log-download]").click()
    download = download_info.value
    assert download.suggested_filename == "resnet50-imagenet-task0.txt"
    text = open(download.path(), encoding="utf-8").read()
    assert text.count("\n") == 60 and XSS_LOG in text
    page.locator("[data-testid=log-search]").fill("")
    page.locator("[data-testid=log-task]").select_option("1")
    expect(log_view).to_have_attribute("data-lines", "60")

    links = page.locator("[data-testid=artifacts-table] a")
    expect(links).to_have_count(2)
    expect(links.nth(1)).to_have_attribute(
        "href", f"/api/v1/jobs/{RESNET}/artifacts/metrics%20%3Cfinal%3E.json"
    )
    expect(page.locator("[data-testid=events] li")).to_have_count(4)
    long_reason = page.locator("#attempts details.clamped")
    expect(long_reason.locator(".clamped-full")).not_to_be_visible()
    long_reason.locator("summary").click()
    expect(long_reason.locator(".clamped-full")).to_contain_text("worker log line 11 <tag>")
    expect(page.locator("#spec")).to_contain_text("python train.py --epochs 3 --note 'it'\\''s quoted'")
    expect(page.locator("[data-testid=cancel-job]")).to_be_hidden()
    page.locator("figure.chart[data-metric=loss] svg.chart-svg").hover()
    expect(page.locator("figure.chart[data-metric=loss] .chart-tooltip")).to_be_visible()
    watched.screenshot("fixture-job-wide")
    watched.assert_clean()


def test_hostile_names_and_log_lines_stay_text_and_cancel_asks_first(new_page, cluster_url) -> None:
    cluster, url = cluster_url
    watched = logged_in(new_page, url)
    page = watched.page
    page.goto(f"{url}/#/jobs/{XSS_JOB}")
    expect(page.locator("[data-testid=job-name]")).to_have_text(XSS_NAME)
    expect(page.locator("[data-testid=log-view] .log-text", has_text="<script>")).to_have_text(XSS_LOG)
    assert page.locator("#view img, #view script, #view b").count() == 0

    cancel = page.locator("[data-testid=cancel-job]")
    cancel.click()
    dialog = page.locator("#confirm-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(XSS_NAME)
    page.locator("[data-testid=confirm-no]").click()
    expect(dialog).to_be_hidden()
    assert cluster.jobs[XSS_JOB].state == "RUNNING"

    cancel.click()
    page.locator("[data-testid=confirm-yes]").click()
    expect(page.locator("[data-testid=job-state]")).to_have_text("CANCELLED")
    expect(cancel).to_be_hidden()
    assert cluster.jobs[XSS_JOB].state == "CANCELLED"
    watched.assert_clean()


def test_agents_page(new_page, cluster_url) -> None:
    _, url = cluster_url
    watched = logged_in(new_page, url)
    page = watched.page
    page.goto(f"{url}/#/agents")
    rows = page.locator("[data-testid=agents-table] tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("4 × NVIDIA H100 80GB HBM3 · 79.6 GiB")
    expect(rows.first).to_contain_text("1 / 4")
    expect(rows.first).to_contain_text("resnet50-imagenet")
    expect(rows.first.locator(".badge")).to_have_text("online")
    expect(rows.nth(1).locator(".cell-name .strong")).to_have_text(XSS_NAME)
    expect(rows.nth(1)).to_contain_text("2 slots")
    expect(rows.nth(1).locator(".badge")).to_have_text("lost")
    expect(page.locator(".nav a.active")).to_have_text("Agents")
    watched.screenshot("fixture-agents-wide")
    watched.assert_clean()


def test_empty_states_say_what_to_do(new_page, cluster_url) -> None:
    cluster, url = cluster_url
    cluster.empty = True
    watched = logged_in(new_page, url)
    page = watched.page
    page.goto(f"{url}/#/jobs")
    expect(page.locator("[data-testid=empty]")).to_contain_text(
        "mwms submit DIR --workers 2 -- python train.py"
    )
    page.goto(f"{url}/#/agents")
    expect(page.locator("[data-testid=empty]")).to_contain_text("mwms agent --server HOST:50051 --name NAME")
    page.goto(f"{url}/#/jobs/does-not-exist")
    expect(page.locator("#view")).to_contain_text("does not exist")
    watched.assert_clean()


def test_unreachable_coordinator_shows_a_banner_that_retries(new_page, cluster_url) -> None:
    cluster, url = cluster_url
    watched = logged_in(new_page, url)
    page = watched.page
    page.goto(f"{url}/#/jobs")
    expect(page.locator("[data-testid=jobs-table] tbody tr")).to_have_count(4)
    banner = page.locator("#banner")
    expect(banner).to_be_hidden()
    cluster.unreachable = True
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("Cannot reach the coordinator")
    watched.screenshot("fixture-unreachable-wide")
    cluster.unreachable = False
    expect(banner).to_be_hidden()
    watched.assert_clean()


@pytest.mark.parametrize("route", ["jobs", "job", "agents"])
def test_pages_fit_a_phone_screen(new_page, cluster_url, route: str) -> None:
    _, url = cluster_url
    watched = logged_in(new_page, url, NARROW)
    page = watched.page
    path = {"jobs": "#/jobs", "job": f"#/jobs/{RESNET}", "agents": "#/agents"}[route]
    page.goto(f"{url}/{path}")
    ready = {
        "jobs": "[data-testid=jobs-table] tbody tr",
        "job": "figure.chart[data-metric=loss][data-points='80']",
        "agents": "[data-testid=agents-table] tbody tr",
    }[route]
    expect(page.locator(ready).first).to_be_visible()
    if route == "job":
        expect(page.locator("[data-testid=log-view]")).to_have_attribute("data-lines", "60")
    assert_fits_width(page)
    # Wide tables scroll inside their own box instead of widening the page.
    wrap = page.locator(".table-wrap").first
    assert wrap.evaluate("el => el.scrollWidth > el.clientWidth"), "expected the table to scroll sideways"
    watched.screenshot(f"fixture-{route}-narrow")
    watched.assert_clean()


def test_csp_blocks_injected_inline_script(new_page, cluster_url) -> None:
    """The header is in force: an inline script added to the page does not run."""
    _, url = cluster_url
    watched = logged_in(new_page, url)
    page = watched.page
    response = page.goto(f"{url}/#/jobs")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.evaluate(
        "() => { const s = document.createElement('script'); s.textContent = 'window.__ran = 1'; document.body.append(s); }"
    )
    assert page.evaluate("window.__ran") is None
    assert any(re.search("Content Security Policy", e) for e in watched.errors)


def page_fetch(page, path: str, method: str = "GET") -> int:
    """The status of a fetch() made by the page itself (its cookies, its Origin)."""
    return page.evaluate(
        "async ([path, method]) => (await fetch(path, {method, headers: {Accept: 'application/json'}})).status",
        [path, method],
    )


def test_nothing_is_shown_before_login_and_the_token_is_not_kept(new_page, cluster_url) -> None:
    _, url = cluster_url
    watched = new_page(WIDE)
    page = watched.page
    page.goto(f"{url}/#/jobs/{RESNET}")
    form = page.locator("[data-testid=login]")
    expect(form).to_be_visible()
    expect(form).to_contain_text("admin-token")
    expect(form).to_contain_text("mwms token create")
    for hidden in ("#overview", "#view", ".nav", "[data-testid=logout]"):
        expect(page.locator(hidden)).to_be_hidden()
    assert page.locator("[data-testid=jobs-table], [data-testid=job-name]").count() == 0
    assert page_fetch(page, "/api/v1/jobs") == 401
    watched.screenshot("fixture-login-wide")

    page.locator("[data-testid=login-token]").fill("not-a-token")
    page.locator("[data-testid=login-submit]").click()
    error = page.locator("[data-testid=login-error]")
    expect(error).to_be_visible()
    expect(error).to_contain_text("not accepted")
    expect(page.locator("#view")).to_be_hidden()

    page.locator("[data-testid=login-token]").fill(ADMIN_TOKEN)
    page.locator("[data-testid=login-token]").press("Enter")
    # The deep link survives the detour through the login form.
    expect(page.locator("[data-testid=job-name]")).to_have_text("resnet50-imagenet")
    expect(form).to_be_hidden()
    expect(page.locator("[data-testid=session-user]")).to_have_text("alice")
    expect(page.locator("[data-testid=session-role]")).to_have_text("admin")
    expect(page.locator("[data-testid=job-submitted-by]")).to_have_text("bob")
    expect(page.locator("[data-testid=cancel-job]")).to_be_visible()  # admins cancel anyone's job
    assert page.locator("[data-testid=login-token]").input_value() == ""
    stored = page.evaluate(
        "() => JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage), document.cookie])"
    )
    assert ADMIN_TOKEN not in stored and "mwms_session" not in stored, stored  # HttpOnly cookie, no storage
    assert ADMIN_TOKEN not in page.content()
    assert page_fetch(page, "/api/v1/jobs") == 200

    page.locator("[data-testid=logout]").click()
    expect(form).to_be_visible()
    expect(page.locator("[data-testid=login-error]")).to_be_hidden()
    expect(page.locator("#view")).to_be_hidden()
    assert page.locator("[data-testid=job-name]").count() == 0
    assert page_fetch(page, "/api/v1/jobs") == 401
    page.reload()
    expect(form).to_be_visible()
    watched.assert_clean()


def test_viewer_sees_no_cancel_and_the_api_refuses_it(new_page, cluster_url) -> None:
    cluster, url = cluster_url
    watched = logged_in(new_page, url, token=VIEWER_TOKEN)
    page = watched.page
    page.goto(f"{url}/#/jobs/{XSS_JOB}")
    expect(page.locator("[data-testid=session-user]")).to_have_text("carol")
    expect(page.locator("[data-testid=session-role]")).to_have_text("viewer")
    expect(page.locator("[data-testid=job-state]")).to_have_text("RUNNING")
    expect(page.locator("[data-testid=job-submitted-by]")).to_have_text("alice")
    expect(page.locator("[data-testid=cancel-job]")).to_be_hidden()
    assert page_fetch(page, f"/api/v1/jobs/{XSS_JOB}/cancel", "POST") == 403
    assert cluster.jobs[XSS_JOB].state == "RUNNING"
    watched.assert_clean()


def test_user_cancels_only_own_jobs_and_sees_refusals(new_page, cluster_url) -> None:
    cluster, url = cluster_url
    watched = logged_in(new_page, url, token=USER_TOKEN)
    page = watched.page
    page.goto(f"{url}/#/jobs/{XSS_JOB}")
    expect(page.locator("[data-testid=job-submitted-by]")).to_have_text("alice")
    expect(page.locator("[data-testid=job-state]")).to_have_text("RUNNING")
    expect(page.locator("[data-testid=cancel-job]")).to_be_hidden()

    cluster.jobs[RESNET].finish_after_polls = None
    page.goto(f"{url}/#/jobs/{RESNET}")
    expect(page.locator("[data-testid=job-submitted-by]")).to_have_text("bob")
    cancel = page.locator("[data-testid=cancel-job]")
    expect(cancel).to_be_visible()
    # A 403 from the coordinator is shown with its detail.
    cluster.cancel_refusal = "cancelling is switched off for this test"
    cancel.click()
    page.locator("[data-testid=confirm-yes]").click()
    expect(page.locator(".inline-error", has_text="Not allowed")).to_contain_text(
        "cancelling is switched off for this test"
    )
    assert cluster.jobs[RESNET].state == "RUNNING"
    cluster.cancel_refusal = None
    cancel.click()
    page.locator("[data-testid=confirm-yes]").click()
    expect(page.locator("[data-testid=job-state]")).to_have_text("CANCELLED")
    expect(page.locator("[data-testid=job-cancelled-by]")).to_have_text("bob")
    page.goto(f"{url}/#/jobs?state=CANCELLED")
    expect(page.locator(f"tr[data-job-id='{RESNET}'] .cell-user")).to_have_text("bobcancelled by bob")
    watched.assert_clean()


def test_an_ended_session_returns_to_the_login_form(new_page, cluster_url) -> None:
    cluster, url = cluster_url
    watched = logged_in(new_page, url)
    page = watched.page
    page.goto(f"{url}/#/jobs")
    expect(page.locator("[data-testid=jobs-table] tbody tr")).to_have_count(4)
    cluster.sessions.clear()  # expired or revoked on the coordinator
    expect(page.locator("[data-testid=login]")).to_be_visible()
    expect(page.locator("[data-testid=login-error]")).to_contain_text("session has ended")
    assert page.locator("[data-testid=jobs-table]").count() == 0
    page.locator("[data-testid=login-token]").fill(USER_TOKEN)
    page.locator("[data-testid=login-submit]").click()
    expect(page.locator("[data-testid=jobs-table] tbody tr")).to_have_count(4)
    expect(page.locator("[data-testid=session-user]")).to_have_text("bob")
    watched.assert_clean()


def test_a_request_left_unanswered_is_given_up_and_asked_again(new_page, cluster_url) -> None:
    """A stalled connection (the first /whoami is never answered) does not leave the page blank: after 30 s
    (web/js/api.js GET_TIMEOUT_MS, on the page's fake clock) the banner says so, and the next try goes in."""
    _, url = cluster_url
    watched = logged_in(new_page, url)
    page = watched.page
    stalled: list[object] = []

    def stall_the_first(route) -> None:
        if stalled:
            route.continue_()
        else:
            stalled.append(route)  # never answered

    page.route("**/api/v1/whoami", stall_the_first)
    page.clock.install()
    page.goto(f"{url}/#/jobs")
    expect(page.locator("[data-testid=jobs-table]")).to_have_count(0)
    assert len(stalled) == 1
    page.clock.run_for(29_000)
    expect(page.locator("#banner")).to_be_hidden()
    page.clock.run_for(1_100)
    expect(page.locator("#banner")).to_be_visible()
    expect(page.locator("#banner-text")).to_contain_text("No answer in 30 s")
    page.clock.run_for(2_100)  # the retry, POLL_INTERVAL_MS later
    expect(page.locator("[data-testid=jobs-table] tbody tr")).to_have_count(4)
    expect(page.locator("#banner")).to_be_hidden()
    watched.assert_clean()


def test_login_waits_for_an_unreachable_coordinator_and_fits_a_phone(new_page, cluster_url) -> None:
    cluster, url = cluster_url
    cluster.unreachable = True
    watched = new_page(NARROW)
    page = watched.page
    page.goto(f"{url}/#/jobs")
    expect(page.locator("#banner")).to_be_visible()
    expect(page.locator("[data-testid=login]")).to_be_hidden()
    expect(page.locator("#view")).to_be_hidden()
    cluster.unreachable = False
    expect(page.locator("[data-testid=login]")).to_be_visible()
    expect(page.locator("#banner")).to_be_hidden()
    assert_fits_width(page)
    watched.screenshot("fixture-login-narrow")
    page.locator("[data-testid=login-token]").fill(VIEWER_TOKEN)
    page.locator("[data-testid=login-submit]").click()
    expect(page.locator("[data-testid=jobs-table] tbody tr")).to_have_count(4)
    assert_fits_width(page)
    watched.assert_clean()
