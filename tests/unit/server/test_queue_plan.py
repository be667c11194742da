"""The sharing rules over plain data: queue order, quotas and borrowing, reservations and backfill,
preemption. The same planner runs in every scheduler pass (server/services/scheduler/scheduling.py)."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from mwms.server.services.scheduler.placement import AgentCapacity
from mwms.server.services.scheduler.queue_order import WaitingJob, queue_order
from mwms.server.services.scheduler.queue_plan import PlanInputs, RunningJob, plan_pass

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)


def agent(name: str, slots: int = 1, free: tuple[int, ...] | None = None, kind: str = "cpu") -> AgentCapacity:
    devices = tuple(range(slots))
    return AgentCapacity(
        agent_id=name,
        name=name,
        address=f"{name}.local",
        device_kind=kind,
        all_devices=devices,
        free_devices=devices if free is None else free,
        port_low=20000,
        port_high=20100,
    )


def waiting(
    job_id: str,
    workers: int = 1,
    priority: int = 500,
    team: str = "t",
    age_s: float = 0,
    gpus: int = 0,
    preemptible: bool = True,
    max_runtime_s: float | None = None,
    hold: dict[str, tuple[int, ...]] | None = None,
    state: str = "PENDING",
) -> WaitingJob:
    return WaitingJob(
        job_id=job_id,
        state=state,
        priority=priority,
        team=team,
        created_at=NOW - timedelta(seconds=age_s),
        workers=workers,
        gpus_per_worker=gpus,
        preemptible=preemptible,
        max_runtime_s=max_runtime_s,
        hold=hold,
    )


def running(
    job_id: str,
    devices: dict[str, tuple[int, ...]],
    priority: int = 500,
    team: str = "t",
    ends_in_s: float | None = None,
    ran_s: float = 600,
    borrowed: bool = False,
    preemptable: bool = True,
    kind: str = "cpu",
) -> RunningJob:
    return RunningJob(
        job_id=job_id,
        priority=priority,
        team=team,
        kind=kind,
        devices=devices,
        started_at=NOW - timedelta(seconds=ran_s),
        ends_at=NOW + timedelta(seconds=ends_in_s) if ends_in_s is not None else None,
        borrowed=borrowed,
        preemptable=preemptable,
        grace_s=20,
    )


def inputs_of(order, offer, run=(), quotas=None, cordoned=(), seed=1) -> PlanInputs:
    usage: dict[str, dict[str, int]] = {}
    for r in run:
        usage.setdefault(r.team, {"gpu": 0, "cpu": 0})[r.kind] += r.size
    return PlanInputs(
        order=order,
        offer=offer,
        cordoned=list(cordoned),
        running=list(run),
        usage=usage,
        quotas=quotas or {},
        now=NOW,
        rng=random.Random(seed),
    )


def plan(order, offer, run=(), quotas=None, cordoned=()):
    return plan_pass(inputs_of(order, offer, run, quotas, cordoned))


def placed(result) -> list[str]:
    return [p.job.job_id for p in result.placements]


# -- order -----------------------------------------------------------------------------------------------


def test_priority_comes_first_then_age():
    jobs = [
        waiting("old-low", priority=100, age_s=100),
        waiting("new-high", priority=900),
        waiting("mid", age_s=50),
    ]
    order = queue_order(jobs, {}, {"cpu": 4}, {})
    assert [j.job_id for j in order] == ["new-high", "mid", "old-low"]


def test_fair_share_lets_a_team_below_its_share_go_first_and_teams_take_turns():
    jobs = [waiting(f"a{i}", team="a", age_s=100 - i) for i in range(3)] + [
        waiting(f"b{i}", team="b", age_s=10 - i) for i in range(3)
    ]
    # Team a already uses 4 of 8 CPU slots (its whole even share), b none: b's younger jobs go first until
    # b's projected use would pass a's.
    order = queue_order(jobs, {"a": {"cpu": 4}}, {"cpu": 8}, {})
    assert [j.job_id for j in order] == ["b0", "b1", "b2", "a0", "a1", "a2"]
    # With equal use the teams alternate, each team's jobs oldest first (ties go to the older job).
    order = queue_order(jobs, {}, {"cpu": 8}, {})
    assert [j.job_id for j in order] == ["a0", "b0", "a1", "b1", "a2", "b2"]


def _turns_one_job_at_a_time(jobs, usage, totals, quotas, history):
    """The rule as written: band by band, the team with the lowest key gives its oldest job next."""
    from mwms.server.services.scheduler.queue_order import share_ratio, shares, standing_hours

    team_shares = shares([j.team for j in jobs] + list(usage), totals, quotas)
    projected = {team: dict(used) for team, used in usage.items()}
    ordered = []
    for priority in sorted({j.priority for j in jobs}, reverse=True):
        left = sorted((j for j in jobs if j.priority == priority), key=lambda j: (j.created_at, j.job_id))
        while left:

            def key(job):
                share = team_shares[job.team]
                standing = standing_hours(history.get(job.team, {}), share)
                return (
                    standing + share_ratio(projected.get(job.team, {}), share),
                    job.created_at,
                    job.job_id,
                )

            heads = {}
            for job in left:
                heads.setdefault(job.team, job)
            job = min(heads.values(), key=key)
            left.remove(job)
            ordered.append(job)
            used = projected.setdefault(job.team, {})
            used[job.kind] = used.get(job.kind, 0) + job.need
    return ordered


def test_teams_runs_merged_are_the_turns_taken_one_job_at_a_time_and_the_memo_changes_nothing():
    memo: dict = {}
    for seed in range(40):
        rng = random.Random(seed)
        jobs = [
            waiting(
                f"j{i}",
                workers=rng.choice([1, 2, 4]),
                gpus=rng.choice([0, 0, 1]),
                priority=rng.choice([100, 500, 900]),
                team=rng.choice("abcd"),
                age_s=rng.choice([0, 5, 10, 20]),  # ties in age go to the lower id
            )
            for i in range(rng.randint(0, 40))
        ]
        usage = {t: {"gpu": rng.randint(0, 3), "cpu": rng.randint(0, 6)} for t in "ab" if rng.random() < 0.7}
        quotas = {"c": {"gpu": None, "cpu": rng.choice([None, 2])}}
        history = {"d": {"cpu": rng.random() * 3600 * 8}} if seed % 2 else {}
        totals = {"gpu": 4, "cpu": 16}
        expected = [j.job_id for j in _turns_one_job_at_a_time(jobs, usage, totals, quotas, history)]
        assert [j.job_id for j in queue_order(jobs, usage, totals, quotas, history)] == expected, seed
        # Kept between calls (as the scheduler keeps it), whatever came before: the same order, and the
        # job objects handed out are this call's.
        got = queue_order(jobs, usage, totals, quotas, history, memo=memo)
        assert [j.job_id for j in got] == expected and {id(j) for j in got} == {id(j) for j in jobs}, seed
        again = [replace(j) for j in jobs]
        got = queue_order(again, usage, totals, quotas, history, memo=memo)
        assert {id(j) for j in got} == {id(j) for j in again}, seed


def test_a_quota_is_a_teams_share():
    # Both teams use 2 slots; a's quota is 8 (ratio 0.25), b's is 2 (ratio 1): a goes first.
    order = queue_order(
        [waiting("b-job", team="b", age_s=10), waiting("a-job", team="a")],
        {"a": {"cpu": 2}, "b": {"cpu": 2}},
        {"cpu": 10},
        {"a": {"cpu": 8, "gpu": None}, "b": {"cpu": 2, "gpu": None}},
    )
    assert [j.job_id for j in order] == ["a-job", "b-job"]


# -- quotas and borrowing --------------------------------------------------------------------------------


def test_over_quota_waits_unless_preemptible_on_idle_capacity_then_it_borrows():
    offer = [agent("a1", 4)]
    quotas = {"t": {"cpu": 2, "gpu": None}}
    fixed = plan([waiting("fixed", workers=3, preemptible=False)], offer, quotas=quotas)
    assert placed(fixed) == []
    reason = fixed.waiting["fixed"]
    assert reason["kind"] == "over_quota" and (reason["need"], reason["in_use"], reason["quota"]) == (3, 0, 2)
    assert "never borrows" in reason["message"]
    borrow = plan([waiting("flex", workers=3)], offer, quotas=quotas)
    assert placed(borrow) == ["flex"] and borrow.placements[0].borrowed


def test_borrowing_never_preempts():
    offer = [agent("a1", 2, free=())]
    run = [running("low", {"a1": (0, 1)}, priority=100, team="other")]
    result = plan(
        [waiting("over", workers=2, priority=900)], offer, run, quotas={"t": {"cpu": 1, "gpu": None}}
    )
    assert result.preemptions == [] and result.waiting["over"]["kind"] == "over_quota"


# -- reservations and backfill ---------------------------------------------------------------------------


def starving_cluster():
    """4 agents x 1 slot: three busy with small jobs ending in 1, 2 and 3 s, one free."""
    offer = [agent("a1", free=()), agent("a2", free=()), agent("a3", free=()), agent("a4")]
    run = [running(f"s{i}", {f"a{i}": (0,)}, ends_in_s=i) for i in (1, 2, 3)]
    return offer, run


def test_the_gang_at_the_head_reserves_and_small_jobs_behind_it_do_not_take_its_slots():
    offer, run = starving_cluster()
    result = plan([waiting("gang", workers=4, age_s=10), waiting("small", age_s=5)], offer, run)
    assert placed(result) == []
    head = result.waiting["gang"]
    assert head["kind"] == "head" and head["estimated_start"] == (NOW + timedelta(seconds=3)).isoformat()
    assert result.waiting["small"] == {
        "kind": "reserved",
        "message": result.waiting["small"]["message"],
        "estimated_start": None,
        "for_job": "gang",
    }


def test_a_backfill_job_that_ends_before_the_reservation_starts_uses_the_idle_slot():
    offer, run = starving_cluster()
    result = plan(
        [
            waiting("gang", workers=4, age_s=10),
            waiting("long", max_runtime_s=60),
            waiting("short", max_runtime_s=2),
        ],
        offer,
        run,
    )
    assert placed(result) == ["short"]
    assert result.waiting["long"]["kind"] == "reserved"


def test_capacity_the_reservation_does_not_need_is_used():
    # The gang needs 2 workers x 2 GPUs. g1 has 1 GPU free, 3 held by a job ending in 5 s; g2 has 3 free.
    offer = [agent("g1", 4, free=(3,), kind="gpu"), agent("g2", 4, free=(1, 2, 3), kind="gpu")]
    run = [running("busy", {"g1": (0, 1, 2), "g2": (0,)}, ends_in_s=5, kind="gpu")]
    order = [waiting("gang", workers=2, gpus=2, age_s=10), waiting("one-gpu", gpus=1)]
    result = plan(order, offer, run)
    assert result.waiting["gang"]["estimated_start"] == (NOW + timedelta(seconds=5)).isoformat()
    # Of g2's three free GPUs the reservation needs two; the third takes the job behind it.
    assert placed(result) == ["one-gpu"]
    assert result.placements[0].tasks[0].agent_id == "g2"


def test_running_jobs_without_a_max_runtime_never_end_so_the_reservation_has_no_start_time():
    offer = [agent("a1", free=()), agent("a2")]
    run = [running("forever", {"a1": (0,)})]
    result = plan(
        [waiting("gang", workers=2, age_s=10), waiting("no-limit"), waiting("bounded", max_runtime_s=30)],
        offer,
        run,
    )
    assert result.waiting["gang"]["kind"] == "head" and result.waiting["gang"]["estimated_start"] is None
    assert placed(result) == ["bounded"] and result.waiting["no-limit"]["kind"] == "reserved"


def test_a_job_that_could_never_fit_says_so_and_does_not_block_others():
    offer = [agent("a1"), agent("a2")]
    result = plan([waiting("huge", workers=5, age_s=10), waiting("small")], offer)
    assert placed(result) == ["small"]
    assert (
        result.waiting["huge"]["kind"] == "no_fit" and "even when idle" in result.waiting["huge"]["message"]
    )


# -- preemption ------------------------------------------------------------------------------------------


def test_a_high_priority_job_preempts_the_cheapest_whole_gangs_and_holds_the_capacity():
    offer = [agent("a1", 2, free=()), agent("a2", 2, free=())]
    run = [
        running("old-pair", {"a1": (0, 1)}, priority=100, ran_s=3600),
        running("young-pair", {"a2": (0,), "a1": ()}, priority=100, ran_s=60),
        running("young-single", {"a2": (1,)}, priority=100, ran_s=30),
    ]
    result = plan([waiting("urgent", workers=2, priority=900)], offer, run)
    assert placed(result) == [] and len(result.preemptions) == 1
    decision = result.preemptions[0]
    # Two slots are needed: the two young jobs cost 60 + 30 slot-seconds, the old pair 7200.
    assert sorted(v.job_id for v in decision.victims) == ["young-pair", "young-single"]
    assert decision.cause == "priority" and decision.hold == {"a2": (0, 1)} and decision.hold_s == 50
    assert result.waiting["urgent"]["kind"] == "preempting"


def test_equal_or_higher_priority_and_unpreemptable_jobs_are_never_victims():
    offer = [agent("a1", 2, free=())]
    run = [
        running("peer", {"a1": (0,)}, priority=900),
        running("protected", {"a1": (1,)}, priority=100, preemptable=False),
    ]
    result = plan([waiting("urgent", workers=1, priority=900)], offer, run)
    assert result.preemptions == [] and result.waiting["urgent"]["kind"] == "head"


def test_held_capacity_goes_to_the_preemptor_only():
    # "urgent" preempted the job on a1 and holds a1 and a2: while a1's job exits, a2 stays idle.
    offer = [agent("a1", free=()), agent("a2")]
    run = [running("victim", {"a1": (0,)}, ends_in_s=20, preemptable=False)]
    hold = {"a1": (0,), "a2": (0,)}
    order = [
        waiting("urgent", workers=2, priority=900, hold=hold),
        waiting("sneaky", priority=100, age_s=100),
    ]
    result = plan(order, offer, run)
    assert placed(result) == []
    assert result.waiting["urgent"]["kind"] == "preempting"
    assert result.waiting["sneaky"] == {
        "kind": "behind_priority",
        "message": result.waiting["sneaky"]["message"],
        "estimated_start": None,
        "for_job": "urgent",
    }
    # Once the victim has exited, the preemptor takes what was held.
    result = plan(order, [agent("a1"), agent("a2")])
    assert placed(result) == ["urgent"]


def test_a_team_within_quota_reclaims_a_borrowed_job_of_equal_priority():
    offer = [agent("a1", 2, free=())]
    run = [running("borrower", {"a1": (0, 1)}, team="b", borrowed=True)]
    quotas = {"a": {"cpu": 2, "gpu": None}, "b": {"cpu": 0, "gpu": None}}
    result = plan([waiting("owner", workers=2, team="a")], offer, run, quotas=quotas)
    assert [v.job_id for v in result.preemptions[0].victims] == ["borrower"]
    assert result.preemptions[0].cause == "reclaim"


def test_a_job_within_its_quota_is_never_preempted_for_borrowing():
    offer = [agent("a1", 2, free=())]
    run = [running("owner", {"a1": (0, 1)}, team="a", priority=100)]
    quotas = {"b": {"cpu": 0, "gpu": None}}
    result = plan([waiting("borrower", workers=2, team="b", priority=900)], offer, run, quotas=quotas)
    assert result.preemptions == [] and result.waiting["borrower"]["kind"] == "over_quota"


# -- reasons ---------------------------------------------------------------------------------------------


def test_only_cordoned_agents_fit():
    result = plan([waiting("job", workers=2)], [agent("a1")], cordoned=[agent("a2")])
    # The head would get a reservation, but nothing can free for it: it says cordoned agents are why.
    assert result.waiting["job"]["kind"] == "cordoned"


def test_restarting_and_preempted_jobs_wait_without_being_placed():
    result = plan([waiting("r", state="RESTARTING"), waiting("p", state="PREEMPTING")], [agent("a1", 2)])
    assert placed(result) == []
    assert (result.waiting["r"]["kind"], result.waiting["p"]["kind"]) == ("backoff", "preempted")


# -- settled reasons --------------------------------------------------------------------------------------


class _Forgets(dict):
    """A memo that keeps nothing: every job is decided in full."""

    def __setitem__(self, key, value) -> None:
        pass


def test_jobs_decided_from_their_fits_settled_reason_fare_as_if_each_were_decided_in_full():
    # Random clusters and queues: gangs that reserve, short jobs that backfill (a placement changes what
    # is free), quotas, holds, jobs that could never fit. The plan is the same with and without the memo.
    from mwms.server.services.scheduler.queue_plan import _Pass

    for seed in range(60):
        rng = random.Random(seed)
        offer = [agent(f"a{i}", slots=2, free=rng.choice([(), (0,), (0, 1)])) for i in range(8)]
        run = [
            running(
                f"r{i}",
                {a.agent_id: tuple(d for d in (0, 1) if d not in a.free_devices)},
                team=rng.choice("tu"),
                ends_in_s=rng.choice([None, 5, 50]),
            )
            for i, a in enumerate(offer)
            if len(a.free_devices) < 2
        ]
        order = [
            waiting(
                f"j{i}",
                workers=rng.choice([1, 1, 2, 3, 6, 20]),
                team=rng.choice("tuv"),
                age_s=100 - i,
                preemptible=rng.random() < 0.5,
                max_runtime_s=rng.choice([None, None, 1, 30]),
            )
            for i in range(40)
        ]
        quotas = {"v": {"gpu": None, "cpu": rng.choice([1, 4])}}
        plans = []
        for memo in (None, _Forgets()):
            state = _Pass(inputs_of(order, offer, run, quotas, seed=seed))
            if memo is not None:
                state.settled = memo
            for job in order:
                state.decide(job)
            plans.append(state.plan)
        with_memo, in_full = plans
        assert [(p.job.job_id, p.tasks) for p in with_memo.placements] == [
            (p.job.job_id, p.tasks) for p in in_full.placements
        ], seed
        assert with_memo.waiting == in_full.waiting, seed
        assert [d.preemptor.job_id for d in with_memo.preemptions] == [
            d.preemptor.job_id for d in in_full.preemptions
        ], seed


def test_an_agent_in_use_is_a_copy_with_what_the_pass_changed_and_the_agent_itself_unchanged():
    from dataclasses import replace as dataclass_replace

    original = agent("a1", slots=4)
    copy = original.in_use((1, 3), frozenset({20001}), 512)
    assert copy == dataclass_replace(
        original, free_devices=(1, 3), used_ports=frozenset({20001}), memory_used=512
    )
    assert hash(copy) == hash(copy.in_use((1, 3), frozenset({20001}), 512))
    assert (
        original.free_devices == (0, 1, 2, 3)
        and original.used_ports == frozenset()
        and original.memory_used == 0
    )
