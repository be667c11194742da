"""The scheduler's invariant (server/services/scheduler/pass_check.py) over plain data: a job left waiting beside
devices that fit it is a violation unless its reason names a quota, a reservation or a hold; one that fits
only once connecting agents connect must say so."""

from __future__ import annotations

import pytest
from test_queue_plan import NOW, agent, running, waiting

from mwms.server.services.scheduler import pass_check, wait_reasons
from mwms.server.services.scheduler.queue_order import queue_order
from mwms.server.services.scheduler.queue_plan import Plan, PlanInputs, plan_pass


def inputs(jobs, offer, connecting=(), running_jobs=()) -> PlanInputs:  # type: ignore[no-untyped-def]
    return PlanInputs(
        order=queue_order(jobs, {}, {"cpu": 64}, {}),
        offer=offer,
        cordoned=[],
        running=list(running_jobs),
        usage={},
        quotas={},
        now=NOW,
        connecting=list(connecting),
    )


def test_a_plan_that_places_what_fits_and_reserves_for_what_does_not_keeps_the_invariant() -> None:
    jobs = [waiting("big", workers=5, priority=900), waiting("small", workers=2, priority=100)]
    offer = [agent(f"a{i}") for i in range(3)]
    given = inputs(jobs, offer, running_jobs=[running("r", {"x": (0,)}, priority=950, preemptable=False)])
    plan = plan_pass(given)
    assert plan.waiting["big"]["kind"] in ("head", "no_fit")
    assert pass_check.violations(given, plan) == []


def test_a_job_told_no_fit_beside_devices_that_fit_it_is_a_violation() -> None:
    job = waiting("j", workers=2)
    given = inputs([job], [agent("a"), agent("b")])
    plan = Plan(waiting={"j": wait_reasons.no_fit(job, "")})  # what a broken planner would say
    [violation] = pass_check.violations(given, plan)
    assert violation.job_id == "j" and violation.fits_on_offer and violation.reason_kind == "no_fit"
    with pytest.raises(pass_check.SchedulerInvariantError, match="job j waits beside free devices"):
        pass_check.check(given, plan)


def test_reserved_over_quota_and_held_reasons_explain_a_fitting_job() -> None:
    job = waiting("j", workers=1)
    given = inputs([job], [agent("a")])
    for reason in (
        wait_reasons.reserved_for(job, "head"),
        wait_reasons.over_quota(job, 3, 3, borrowable=False),
        wait_reasons.behind_priority(job, "p"),
    ):
        assert pass_check.violations(given, Plan(waiting={"j": reason})) == []


def test_devices_the_pass_placed_or_held_are_not_counted_free() -> None:
    first, second = waiting("first", workers=2, priority=900), waiting("second", workers=1, priority=100)
    given = inputs([first, second], [agent("a"), agent("b")])
    plan = plan_pass(given)
    assert [p.job.job_id for p in plan.placements] == ["first"]
    assert plan.waiting["second"]["kind"] == "no_fit"
    assert pass_check.violations(given, plan) == []
    held = waiting("held", workers=1, priority=100, hold={"a": (0,)})
    other = waiting("other", workers=1, priority=50)
    given = inputs([held, other], [agent("a")])
    plan = Plan(waiting={"held": wait_reasons.preempting_for(held), "other": wait_reasons.no_fit(other, "")})
    assert pass_check.violations(given, plan) == []


def test_a_head_that_fits_only_once_agents_connect_must_say_it_waits_for_them() -> None:
    """The offer holds connected agents only; a head reserved 'when running jobs finish' while the
    devices it needs sit on agents that are online but not connected here waits unexplained."""
    job = waiting("gang", workers=3, priority=900)
    offer = [agent("a"), agent("b")]
    connecting = [agent("c")]
    given = inputs([job], offer, connecting=connecting)
    told_head = Plan(waiting={"gang": wait_reasons.reserved_head(job, None)})
    [violation] = pass_check.violations(given, told_head)
    assert not violation.fits_on_offer and violation.unoffered == ("c",)
    told_connecting = Plan(waiting={"gang": wait_reasons.connecting(job, ["c"])})
    assert pass_check.violations(given, told_connecting) == []


def test_the_planner_tells_a_head_that_fits_with_connecting_agents_to_wait_for_them() -> None:
    """The bug the check found: with a running job that never ends, a gang that fits once an online agent
    connects was made head of a reservation on the running job's devices ("it starts when running jobs
    without a max_runtime finish") and could preempt; it now waits for the agent, says so, and the free
    devices it will take are kept from the jobs behind it."""
    gang = waiting("gang", workers=3, priority=900)
    later = waiting("later", workers=1, priority=100)
    busy = agent("x", free=())
    given = inputs(
        [gang, later],
        [agent("a"), agent("b"), busy],
        connecting=[agent("c")],
        running_jobs=[running("r", {"x": (0,)}, priority=100, preemptable=True)],
    )
    plan = plan_pass(given)
    assert plan.waiting["gang"]["kind"] == "connecting", plan.waiting["gang"]
    assert "c" in plan.waiting["gang"]["message"]
    assert plan.preemptions == []
    assert plan.placements == []
    assert plan.waiting["later"]["kind"] == "reserved" and plan.waiting["later"]["for_job"] == "gang"
    assert pass_check.violations(given, plan) == []
