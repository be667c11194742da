"""Sharing the cluster in the dashboard (issue 18), in Chromium against the fake coordinator
(testkit/mwms_testkit/fake_api/): the queue in the scheduler's order with each job's reason and estimated start,
the teams' quotas against their use, cordoned, draining and drained agents with who, when and why, the
PREEMPTING state's own style, and a job page's priority, team and waiting reason. Hostile names, teams,
users and reasons read literally and never become elements."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from mwms_testkit.fake_api import (
    ADMIN_TOKEN,
    NO_FIT,
    T0,
    FakeJob,
    FakeState,
    _iso,
    serve_fake_api,
)

from .conftest import NARROW, WIDE

pytestmark = pytest.mark.browser

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)").expect

PENDING_JOB = "aa55aa55aa55aa55aa55aa55aa55aa55"  # the fake cluster's own waiting job
URGENT = "1111aaaa2222bbbb3333cccc4444dddd"
PREEMPTED = "5555eeee6666ffff7777aaaa8888bbbb"
OVER_QUOTA = "9999cccc0000dddd1111eeee2222ffff"
HOSTILE = "abababababababababababababababab"

PWN_NAME = "<img src=x onerror=window.__pwned=1>"
PWN_TEAM = "<b onmouseover=window.__pwned=2>team</b>"
PWN_USER = "<svg onload=window.__pwned=3>"
PWN_REASON = "<script>window.__pwned=4</script> waits <i>here</i>"
PWN_KIND = "<iframe src=javascript:window.__pwned=5>"
RESERVED = "capacity on gpu-node-1 is held for this job while resnet50-imagenet saves"
SAVING = "its workers got SIGTERM and are saving a checkpoint (grace 120 s)"
QUOTA = "team carol holds 4 of its 4 GPUs; this job needs 2 more"


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeState, str]]:
    cluster = FakeState(seeded=True)
    with serve_fake_api(state=cluster) as (url, _):
        yield cluster, url


def populate(cluster: FakeState) -> None:
    """Four more waiting jobs around the fake cluster's own, one hostile, and a hostile team over quota."""
    now = datetime.now(timezone.utc)
    soon = _iso(now + timedelta(minutes=10))
    jobs = [
        FakeJob(
            URGENT,
            "urgent-eval",
            "PENDING",
            T0 + timedelta(minutes=45),
            priority=900,
            preemptible=False,
            waiting={"kind": "reserved", "message": RESERVED, "estimated_start": soon},
            estimated_start=now + timedelta(minutes=10),
            estimate_basis="max_runtime",
        ),
        FakeJob(
            PREEMPTED,
            "resnet-preempted",
            "PREEMPTING",
            T0 + timedelta(minutes=10),
            submitted_by="bob",
            waiting={"kind": "preempting", "message": SAVING, "estimated_start": None},
        ),
        FakeJob(
            OVER_QUOTA,
            "carol-sweep",
            "PENDING",
            T0 + timedelta(minutes=5),
            priority=300,
            team="carol",
            submitted_by="carol",
            waiting={"kind": "over_quota", "message": QUOTA, "estimated_start": None, "team": "carol"},
        ),
        FakeJob(
            HOSTILE,
            PWN_NAME,
            "RESTARTING",
            T0 + timedelta(minutes=1),
            priority=100,
            team=PWN_TEAM,
            submitted_by=PWN_USER,
            waiting={"kind": PWN_KIND, "message": PWN_REASON, "estimated_start": None},
        ),
    ]
    with cluster.lock:
        cluster.jobs.update({job.id: job for job in jobs})
        # The fake cluster's own waiting job: from how long its user's jobs of its shape ran.
        cluster.jobs[PENDING_JOB].estimated_start = now + timedelta(minutes=12, seconds=10)
        cluster.jobs[PENDING_JOB].estimate_basis = "similar_jobs"
        cluster.teams.append(
            {
                "team": PWN_TEAM,
                "members": [PWN_USER],
                "quota": {"gpus": 2, "cpu_slots": 1},
                "in_use": {"gpus": 3, "cpu_slots": 0},
                "usage_device_hours": {"gpus": 30.25, "cpu_slots": 1.5},
                "share": {"gpus": 2.0, "cpu_slots": 1.0},
                "standing": 15.125,
            }
        )


@pytest.fixture
def cluster_url(fake: tuple[FakeState, str]) -> Iterator[tuple[FakeState, str]]:
    cluster, url = fake
    cluster.reset()
    populate(cluster)
    yield cluster, url
    cluster.reset()


def logged_in(new_page, url: str, viewport: dict[str, int] = WIDE):
    watched = new_page(viewport)
    response = watched.page.request.post(f"{url}/api/v1/session", data={"token": ADMIN_TOKEN})
    assert response.status == 200, response.text()
    return watched


def assert_nothing_hostile_ran(page) -> None:
    assert page.locator("#view img, #view script, #view svg, #view iframe, #view b, #view i").count() == 0
    assert page.evaluate("typeof window.__pwned") == "undefined"


def test_the_queue_lists_waiting_jobs_in_order_with_reasons_and_estimated_starts(
    new_page, cluster_url
) -> None:
    cluster, url = cluster_url
    watched = logged_in(new_page, url)
    page = watched.page
    page.goto(f"{url}/#/queue")
    expect(page.locator(".nav a.active")).to_have_text("Queue")
    rows = page.locator("[data-testid=queue-table] tbody tr")
    expect(rows).to_have_count(5)
    # The API's order: highest priority first, then oldest; not re-sorted by the page.
    expect(rows.locator(".cell-position")).to_have_text(["1", "2", "3", "4", "5"])
    expect(rows.locator(".job-link")).to_have_text(
        ["urgent-eval", "resnet-preempted", "waiting-for-gpus", "carol-sweep", PWN_NAME]
    )
    expect(page.locator("[data-testid=queue-total]")).to_have_text("5 jobs waiting")

    urgent = page.locator(f"tr[data-job-id='{URGENT}']")
    expect(urgent.locator(".job-link")).to_have_attribute("href", f"#/jobs/{URGENT}")
    expect(urgent.locator(".cell-team")).to_have_text("vision")
    expect(urgent.locator(".cell-user")).to_have_text("alice")
    expect(urgent.locator(".priority")).to_have_text("900 · high")
    expect(urgent.locator(".cell-priority")).to_contain_text("not preemptible")
    expect(urgent.locator(".cell-shape")).to_have_text("2 × 1 GPU")
    expect(urgent.locator(".wait-kind")).to_have_text("reserved")
    expect(urgent.locator(".wait-message")).to_have_text(RESERVED)
    expect(urgent.locator(".estimated-start")).to_have_text(re.compile(r"^about (9|10) min \(.+\)$"))
    expect(urgent.locator(".estimate-basis")).to_have_text("from max_runtime")

    preempted = page.locator(f"tr[data-job-id='{PREEMPTED}']")
    expect(preempted.locator(".badge")).to_have_text("PREEMPTING")
    expect(preempted.locator(".wait-kind")).to_have_text("preempting")
    expect(preempted.locator(".wait-message")).to_have_text(SAVING)
    expect(preempted.locator(".estimated-start")).to_have_text("unknown")
    expect(preempted.locator(".estimate-basis")).to_have_count(0)
    expect(page.locator(f"tr[data-job-id='{PENDING_JOB}'] .wait-kind")).to_have_text("no fit")
    expect(page.locator(f"tr[data-job-id='{PENDING_JOB}'] .wait-message")).to_have_text(NO_FIT["message"])
    similar = page.locator(f"tr[data-job-id='{PENDING_JOB}'] .cell-start")
    expect(similar.locator(".estimated-start")).to_have_text(re.compile(r"^about 1[12] min \("))
    expect(similar.locator(".estimate-basis")).to_have_text("from similar jobs")
    expect(similar.locator(".estimate")).to_have_attribute("data-basis", "similar_jobs")
    quota = page.locator(f"tr[data-job-id='{OVER_QUOTA}']")
    expect(quota.locator(".wait-kind")).to_have_text("over quota")
    expect(quota.locator(".priority")).to_have_text("300 · normal")
    expect(quota.locator(".cell-team")).to_have_text("carol")

    # The hostile job: every field as text, an unknown kind shown as it came under a fixed class.
    hostile = page.locator(f"tr[data-job-id='{HOSTILE}']")
    expect(hostile.locator(".job-link")).to_have_text(PWN_NAME)
    expect(hostile.locator(".cell-team")).to_have_text(PWN_TEAM)
    expect(hostile.locator(".cell-user")).to_have_text(PWN_USER)
    expect(hostile.locator(".wait-kind")).to_have_text(PWN_KIND)
    expect(hostile.locator(".wait-kind")).to_have_attribute("class", "wait-kind wait-other")
    expect(hostile.locator(".wait-message")).to_have_text(PWN_REASON)
    expect(hostile.locator(".priority")).to_have_text("100 · low")
    assert_nothing_hostile_ran(page)
    page.evaluate("window.__sameDocument = true")

    # Refreshed without a reload: the jobs it waits for ran past their similar jobs' time...
    cluster.jobs[PENDING_JOB].estimate_basis = "overdue"
    expect(similar.locator(".estimated-start")).to_have_text("any time now")
    expect(similar.locator(".estimate-basis")).to_have_text("running jobs it waits for are overdue")
    # ... and the urgent job is placed and leaves the queue.
    cluster.jobs[URGENT].state = "SCHEDULED"
    expect(rows).to_have_count(4)
    expect(rows.first.locator(".job-link")).to_have_text("resnet-preempted")
    expect(rows.first.locator(".cell-position")).to_have_text("1")
    assert page.evaluate("window.__sameDocument") is True
    watched.screenshot("fixture-queue-wide")
    watched.assert_clean()


def test_the_teams_panel_shows_quota_against_use(new_page, cluster_url) -> None:
    cluster, url = cluster_url
    watched = logged_in(new_page, url)
    page = watched.page
    page.goto(f"{url}/#/queue")
    teams = page.locator("[data-testid=teams-table] tbody tr")
    expect(teams).to_have_count(3)
    vision = page.locator("tr.team-row[data-team='vision']")
    expect(vision.locator(".cell-gpus .quota-text")).to_have_text("1 / 4 GPUs")
    expect(vision.locator(".cell-gpus meter")).to_have_attribute("value", "1")
    expect(vision.locator(".cell-cpus")).to_have_text("0 slots · no cap")
    expect(vision.locator(".cell-members .tag")).to_have_text(["alice", "bob"])
    carol = page.locator("tr.team-row[data-team='carol']")
    expect(carol.locator(".cell-name")).to_contain_text("no quota")
    expect(carol.locator(".cell-members")).to_have_text("a team of one")
    hostile = teams.nth(2)
    expect(hostile.locator(".team-name")).to_have_text(PWN_TEAM)
    expect(hostile.locator(".cell-members .tag")).to_have_text(PWN_USER)
    expect(hostile.locator(".cell-gpus .quota")).to_have_class(re.compile(r"\bover\b"))
    expect(hostile.locator(".cell-gpus")).to_contain_text("3 / 2 GPUs")
    expect(hostile.locator(".cell-gpus")).to_contain_text("borrowing idle capacity")
    # Fair share over time: each team's standing and the recent use and share it rests on.
    expect(vision.locator(".standing")).to_have_text("standing 2.625 h")
    expect(vision.locator(".fair-share-basis")).to_have_text("10.5 GPU·h of a share of 4 GPUs, 2 slots")
    expect(carol.locator(".standing")).to_have_text("standing 0 h")
    expect(carol.locator(".fair-share-basis")).to_have_text("no recent use of a share of 2 GPUs, 2 slots")
    expect(hostile.locator(".fair-share")).to_have_attribute("data-standing", "15.125")
    expect(hostile.locator(".fair-share-basis")).to_have_text(
        "30.25 GPU·h, 1.5 slot·h of a share of 2 GPUs, 1 slot"
    )
    assert "lowest standing" in (vision.locator(".fair-share").get_attribute("title") or "")
    # The panel still fits a 1280 px window, the hostile team's long name included.
    wrap = page.locator("#teams .table-wrap")
    assert wrap.evaluate("(box) => box.scrollWidth <= box.clientWidth + 1")
    assert_nothing_hostile_ran(page)

    # The queue stays when the teams cannot be read, and the panel says why.
    cluster.teams_refusal = "teams are switched off for this test"
    expect(page.locator(".teams-note")).to_contain_text("teams are switched off for this test")
    expect(page.locator("[data-testid=queue-table] tbody tr")).to_have_count(5)
    cluster.teams_refusal = None
    expect(page.locator(".teams-note")).to_be_hidden()
    watched.assert_clean()


def test_preempting_has_a_style_of_its_own(new_page, cluster_url) -> None:
    _, url = cluster_url
    watched = logged_in(new_page, url)
    page = watched.page
    page.goto(f"{url}/#/jobs?state=PREEMPTING")
    expect(page.locator("[data-filter=PREEMPTING]")).to_have_class(re.compile(r"\bactive\b"))
    badge = page.locator(f"tr[data-job-id='{PREEMPTED}'] .badge")
    expect(badge).to_have_text("PREEMPTING")
    expect(badge).to_have_class(re.compile(r"\bstate-preempting\b"))
    expect(page.locator("[data-testid=jobs-table] tbody tr")).to_have_count(1)
    page.goto(f"{url}/#/jobs")
    expect(page.locator("[data-testid=jobs-table] tbody tr")).to_have_count(8)

    def colours(state: str) -> tuple[str, str]:
        return page.locator(f".badge[data-state={state}]").first.evaluate(
            "el => [getComputedStyle(el).color, getComputedStyle(el).backgroundColor]"
        )

    preempting = colours("PREEMPTING")
    others = {state: colours(state) for state in ("PENDING", "RESTARTING", "RUNNING", "SUCCEEDED")}
    assert all(preempting != other for other in others.values()), (preempting, others)
    marker = page.locator(".badge[data-state=PREEMPTING]").first.evaluate(
        "el => getComputedStyle(el, '::before').content"
    )
    assert marker == '""', marker
    watched.assert_clean()


def test_agents_show_cordoned_draining_and_drained_with_who_when_and_why(new_page, cluster_url) -> None:
    cluster, url = cluster_url
    five_minutes_ago = _iso(datetime.now(timezone.utc) - timedelta(minutes=5))
    cluster.agent_cordons["agent-1"] = {
        "cordoned": True,
        "cordoned_at": five_minutes_ago,
        "cordoned_by": "alice",
        "cordon_reason": "replacing a fan",
        "draining": True,
    }
    cluster.agent_cordons["agent-2"] = {
        "cordoned": True,
        "cordoned_at": five_minutes_ago,
        "cordoned_by": PWN_USER,
        "cordon_reason": PWN_REASON,
        "drained": True,
    }
    watched = logged_in(new_page, url)
    page = watched.page
    page.goto(f"{url}/#/agents")
    rows = page.locator("[data-testid=agents-table] tbody tr")
    expect(rows).to_have_count(2)
    first = page.locator("tr[data-agent-id='agent-1'] [data-testid=agent-cordon]")
    expect(first).to_have_attribute("data-cordon", "draining")
    expect(first.locator(".cordon-tag")).to_have_text("draining")
    expect(first.locator(".cordon-who")).to_have_text("by alice · 5 min ago")
    expect(first.locator(".cordon-reason")).to_have_text("replacing a fan")
    # The online/lost status stays the row's one badge.
    expect(page.locator("tr[data-agent-id='agent-1'] .badge")).to_have_text("online")
    second = page.locator("tr[data-agent-id='agent-2'] [data-testid=agent-cordon]")
    expect(second.locator(".cordon-tag")).to_have_text("drained")
    expect(second.locator(".cordon-who")).to_have_text(f"by {PWN_USER} · 5 min ago")
    expect(second.locator(".cordon-reason")).to_have_text(PWN_REASON)
    assert_nothing_hostile_ran(page)
    watched.screenshot("fixture-agents-cordoned-wide")

    # Live: the drain ends in a plain cordon, then the cordon is lifted.
    cluster.agent_cordons["agent-1"] = dict(cluster.agent_cordons["agent-1"], draining=False)
    expect(first.locator(".cordon-tag")).to_have_text("cordoned")
    cluster.agent_cordons.pop("agent-1")
    expect(page.locator("tr[data-agent-id='agent-1'] [data-testid=agent-cordon]")).to_have_count(0)
    watched.assert_clean()


def test_a_job_page_shows_priority_team_and_why_it_waits(new_page, cluster_url) -> None:
    cluster, url = cluster_url
    watched = logged_in(new_page, url)
    page = watched.page
    page.goto(f"{url}/#/jobs/{URGENT}")
    expect(page.locator("[data-testid=job-name]")).to_have_text("urgent-eval")
    expect(page.locator("[data-testid=job-priority]")).to_have_text("900 · high")
    expect(page.locator("[data-testid=job-team]")).to_have_text("vision")
    expect(page.locator("[data-testid=job-preemptible]")).to_have_text("no")
    waiting = page.locator("[data-testid=job-waiting]")
    expect(waiting).to_be_visible()
    expect(waiting.locator(".wait-kind")).to_have_text("reserved")
    expect(page.locator("[data-testid=job-waiting-message]")).to_have_text(RESERVED)
    expect(page.locator("[data-testid=job-estimated-start]")).to_have_text(
        re.compile(r"^in (9|10)m \d\ds \(")
    )
    watched.screenshot("fixture-job-waiting-wide")

    # Placed: the reason goes away without a reload.
    cluster.jobs[URGENT].state = "SCHEDULED"
    expect(page.locator("[data-testid=job-state]")).to_have_text("SCHEDULED")
    expect(waiting).to_be_hidden()

    page.goto(f"{url}/#/jobs/{PREEMPTED}")
    expect(page.locator("[data-testid=job-state] .badge")).to_have_class(re.compile(r"\bstate-preempting\b"))
    expect(page.locator("[data-testid=job-preemptible]")).to_have_text("yes")
    expect(page.locator("[data-testid=job-waiting] .wait-kind")).to_have_text("preempting")
    expect(page.locator("[data-testid=job-estimated-start]")).to_have_text("unknown")

    page.goto(f"{url}/#/jobs/{HOSTILE}")
    expect(page.locator("[data-testid=job-name]")).to_have_text(PWN_NAME)
    expect(page.locator("[data-testid=job-team]")).to_have_text(PWN_TEAM)
    expect(page.locator("[data-testid=job-submitted-by]")).to_have_text(PWN_USER)
    expect(page.locator("[data-testid=job-waiting] .wait-kind")).to_have_text(PWN_KIND)
    expect(page.locator("[data-testid=job-waiting-message]")).to_have_text(PWN_REASON)
    assert_nothing_hostile_ran(page)

    # A running job waits for nothing.
    page.goto(f"{url}/#/jobs/7f3c2a91d0b44c7e9a61b0c3d5e8f201")
    expect(page.locator("[data-testid=job-priority]")).to_have_text("500 · normal")
    expect(page.locator("[data-testid=job-waiting]")).to_be_hidden()
    watched.assert_clean()


def test_an_empty_queue_says_so_and_the_page_fits_a_phone(new_page, cluster_url) -> None:
    cluster, url = cluster_url
    watched = logged_in(new_page, url, NARROW)
    page = watched.page
    page.goto(f"{url}/#/queue")
    expect(page.locator("[data-testid=queue-table] tbody tr")).to_have_count(5)
    page.evaluate("window.scrollTo(0, 0)")
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    watched.screenshot("fixture-queue-narrow")
    cluster.empty = True
    expect(page.locator("#queue [data-testid=empty]")).to_contain_text("Nothing is waiting.")
    expect(page.locator("#teams [data-testid=empty]")).to_contain_text("mwms team add TEAM USER")
    expect(page.locator("[data-testid=queue-total]")).to_have_text("0 jobs waiting")
    watched.assert_clean()
