"""A user's first hour on the dashboard against the shared real cluster (tests/conftest.py `cluster`): /docs
and unknown pages send a browser without a login to the login page and back, the login page words its
refusals for the page, and a real job's artifacts with long paths fit the job page at 1280 px."""

from __future__ import annotations

import pytest

from .conftest import WIDE

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

LONG_FILES = [
    "checkpoints/ckpt-epoch-0001-val_loss-0.123456-val_accuracy-0.987654-with-a-long-suffix.weights.h5",
    "saved_model/variables/variables.data-00000-of-00001_and_a_name_without_any_place_to_break_it_at_all",
]
SAVE_LONG_NAMES = f"""
import os
out = os.environ["MWMS_OUTPUT_DIR"]
if os.environ["MWMS_TASK_INDEX"] == "0":
    for name in {LONG_FILES!r}:
        os.makedirs(os.path.dirname(os.path.join(out, name)), exist_ok=True)
        with open(os.path.join(out, name), "w") as f:
            f.write("x" * 1000)
print("saved", flush=True)
"""


def log_in_with_form(page, token: str) -> None:
    expect(page.locator("[data-testid=login]")).to_be_visible()
    page.locator("[data-testid=login-token]").fill(token)
    page.locator("[data-testid=login-submit]").click()


def test_docs_before_login_goes_to_the_login_page_and_back(cluster, new_page) -> None:
    watched = new_page(WIDE)
    page = watched.page
    page.goto(f"{cluster.api}/docs")
    assert page.url == f"{cluster.api}/?next=/docs", page.url
    expect(page.locator("[data-testid=login-next]")).to_have_text("Log in to open /docs.")
    assert "authentication required" not in page.content()  # no raw 401 JSON
    log_in_with_form(page, cluster.admin_token)
    page.wait_for_url(f"{cluster.api}/docs")
    expect(page.locator("#swagger-ui .info .title")).to_contain_text("mwms", timeout=20_000)
    watched.assert_clean()


def test_an_unknown_page_before_login_goes_to_the_login_page_then_the_dashboard(cluster, new_page) -> None:
    watched = new_page(WIDE)
    page = watched.page
    page.goto(f"{cluster.api}/jobs/no-such-page")
    assert page.url == f"{cluster.api}/", page.url
    expect(page.locator("[data-testid=login-next]")).to_be_hidden()
    log_in_with_form(page, cluster.admin_token)
    expect(page.locator("[data-testid=jobs-table], [data-testid=empty]").first).to_be_visible()
    assert page.url.startswith(f"{cluster.api}/"), page.url
    watched.assert_clean()


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/x", "/\\evil.example"])
def test_a_way_back_to_another_site_is_not_followed(cluster, new_page, target: str) -> None:
    watched = new_page(WIDE)
    page = watched.page
    page.goto(f"{cluster.api}/?next={target}")
    expect(page.locator("[data-testid=login-next]")).to_be_hidden()
    log_in_with_form(page, cluster.admin_token)
    expect(page.locator("[data-testid=session-role]")).to_have_text("admin")
    assert page.url.startswith(f"{cluster.api}/"), page.url
    watched.assert_clean()


def test_the_login_page_says_what_to_do_here_not_on_the_command_line(cluster, new_page) -> None:
    watched = new_page(WIDE)
    page = watched.page
    page.goto(f"{cluster.api}/")
    log_in_with_form(page, "mwms_not-a-real-token")
    error = page.locator("[data-testid=login-error]")
    expect(error).to_contain_text(
        "That token was not accepted: the token is unknown, revoked or expired. Paste a current token here;"
    )
    expect(error).to_contain_text("mwms token create")
    text = error.inner_text()
    assert "--token" not in text and "MWMS_TOKEN" not in text and "mwms login" not in text, text
    watched.assert_clean()


def test_a_real_jobs_long_artifact_paths_fit_the_job_page(cluster, new_page) -> None:
    job_id = cluster.submit(
        {"main.py": SAVE_LONG_NAMES}, ["python", "main.py"], workers=2, name="long-artifacts"
    )
    cluster.wait_for(job_id, {"SUCCEEDED"})
    watched = new_page(WIDE)
    page = watched.page
    assert (
        page.request.post(f"{cluster.api}/api/v1/session", data={"token": cluster.admin_token}).status == 200
    )
    page.goto(f"{cluster.api}/#/jobs/{job_id}")
    rows = page.locator("[data-testid=artifacts-table] tbody tr")
    expect(rows).to_have_count(2, timeout=30_000)
    clipped = page.evaluate(
        """() => [...document.querySelectorAll('.table-wrap')]
            .filter((wrap) => wrap.scrollWidth > wrap.clientWidth + 1)
            .map((wrap) => `${wrap.closest('section')?.getAttribute('aria-label')}: ${wrap.scrollWidth} > ${wrap.clientWidth}`)"""
    )
    assert clipped == [], clipped
    for path in LONG_FILES:
        link = page.locator(f"[data-testid=artifacts-table] a[title='{path}']")
        expect(link).to_have_text(path)
    watched.screenshot("job-long-artifacts-e2e")
    watched.assert_clean()
