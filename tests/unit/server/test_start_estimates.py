"""Start estimates for people over plain data (server/services/scheduler/start_estimates.py): running jobs' ends from
max_runtime or from similar jobs' typical run time, overdue jobs, the walk in time order, the jobs ahead,
and "unknown" only when there is nothing to go on."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from mwms.server.services.scheduler.start_estimates import (
    MAX_RUNTIME,
    NO_ESTIMATE,
    OVERDUE,
    SIMILAR_JOBS,
    UNKNOWN,
    Estimate,
    Running,
    ShapeKey,
    Waiting,
    earlier,
    estimate_starts,
    expected_end,
    typical_run_time,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
BOB_1x1: ShapeKey = ("bob", 1, 1)
BOB_2x1: ShapeKey = ("bob", 2, 1)
ALICE_2x1: ShapeKey = ("alice", 2, 1)
TYPICAL = {BOB_1x1: 600.0}  # bob's 1 × 1 GPU jobs run 10 min


def running(
    devices: int = 1,
    started_s_ago: float = 240,
    ends_in_s: float | None = None,
    shape: ShapeKey = BOB_1x1,
    kind: str = "gpu",
) -> Running:
    return Running(
        kind=kind,
        devices=devices,
        started_at=NOW - timedelta(seconds=started_s_ago),
        ends_at=NOW + timedelta(seconds=ends_in_s) if ends_in_s is not None else None,
        shape=shape,
    )


def waiting(
    job_id: str,
    need: int = 2,
    shape: ShapeKey = ALICE_2x1,
    max_runtime_s: float | None = None,
    for_capacity: bool = True,
    kind: str = "gpu",
) -> Waiting:
    return Waiting(job_id, kind, need, shape, max_runtime_s, for_capacity)


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def test_typical_run_time_is_the_median_and_none_without_runs() -> None:
    assert typical_run_time([480, 600, 720]) == 600
    assert typical_run_time([100, 300, 10_000, 200]) == 250  # one slow run does not drag it
    assert typical_run_time([]) is None


def test_a_running_jobs_end_from_max_runtime_else_similar_jobs_else_none() -> None:
    assert expected_end(running(ends_in_s=180), TYPICAL, NOW) == (at(180), MAX_RUNTIME)
    # max_runtime wins over history: it is what the user said.
    assert expected_end(running(ends_in_s=3600), TYPICAL, NOW) == (at(3600), MAX_RUNTIME)
    assert expected_end(running(started_s_ago=240), TYPICAL, NOW) == (at(360), SIMILAR_JOBS)
    assert expected_end(running(shape=("carol", 1, 1)), TYPICAL, NOW) is None


def test_a_job_past_its_similar_jobs_time_is_overdue_not_ending_in_the_past() -> None:
    assert expected_end(running(started_s_ago=900), TYPICAL, NOW) == (NOW, OVERDUE)
    # One past its max_runtime (not yet stopped) ends now too, still on max_runtime.
    assert expected_end(running(ends_in_s=-30), TYPICAL, NOW) == (NOW, MAX_RUNTIME)


def test_a_waiting_job_starts_when_a_similar_job_would_end() -> None:
    estimates = estimate_starts([waiting("w")], [running(started_s_ago=240)], {"gpu": 1}, TYPICAL, NOW)
    assert estimates == {"w": Estimate(at(360), SIMILAR_JOBS)}


def test_from_max_runtime_when_every_end_it_waits_for_has_one() -> None:
    jobs = [running(ends_in_s=180), running(started_s_ago=0)]  # the second would end in 10 min
    estimates = estimate_starts([waiting("w")], jobs, {"gpu": 1}, TYPICAL, NOW)
    assert estimates["w"] == Estimate(at(180), MAX_RUNTIME)


def test_the_walk_goes_through_ends_in_time_order_until_enough_devices_are_free() -> None:
    jobs = [running(ends_in_s=900), running(started_s_ago=300), running(ends_in_s=120)]
    estimates = estimate_starts([waiting("w", need=3)], jobs, {"gpu": 0}, TYPICAL, NOW)
    # Ends at 2 min (max_runtime), 5 min (similar jobs), 15 min: three devices at 15 min, resting on both.
    assert estimates["w"] == Estimate(at(900), SIMILAR_JOBS)


def test_overdue_jobs_make_it_any_time_now() -> None:
    estimates = estimate_starts([waiting("w")], [running(started_s_ago=900)], {"gpu": 1}, TYPICAL, NOW)
    assert estimates["w"] == Estimate(NOW, OVERDUE)
    # With a later end still needed, that end decides, and it says so.
    jobs = [running(started_s_ago=900), running(started_s_ago=60)]
    estimates = estimate_starts([waiting("w")], jobs, {"gpu": 0}, TYPICAL, NOW)
    assert estimates["w"] == Estimate(at(540), SIMILAR_JOBS)


def test_unknown_only_with_nothing_to_go_on() -> None:
    no_history = [running(shape=("carol", 1, 1))]
    assert estimate_starts([waiting("w")], no_history, {"gpu": 1}, TYPICAL, NOW)["w"] == NO_ESTIMATE
    assert estimate_starts([waiting("w")], [], {"gpu": 1}, TYPICAL, NOW)["w"] == NO_ESTIMATE
    assert NO_ESTIMATE == Estimate(None, UNKNOWN)


def test_nothing_starts_before_the_first_end() -> None:
    # Two devices are free, yet the pass did not place it (memory, or how its gang splits): not "now".
    estimates = estimate_starts([waiting("w")], [running(started_s_ago=240)], {"gpu": 2}, TYPICAL, NOW)
    assert estimates["w"] == Estimate(at(360), SIMILAR_JOBS)


def test_the_jobs_ahead_start_first_and_free_their_devices_after_their_own_run() -> None:
    queue = [
        waiting("head", need=2, max_runtime_s=1200),
        waiting("next", need=2, shape=BOB_2x1),
        waiting("last", need=1, shape=("dave", 1, 1)),
    ]
    jobs = [running(ends_in_s=120), running(ends_in_s=300)]
    estimates = estimate_starts(queue, jobs, {"gpu": 0}, {**TYPICAL, BOB_2x1: 1800.0}, NOW)
    assert estimates["head"] == Estimate(at(300), MAX_RUNTIME)
    # The head holds both devices until its max_runtime ends.
    assert estimates["next"] == Estimate(at(1500), MAX_RUNTIME)
    # Then bob's 2 × 1 job holds them for its typical 30 min.
    assert estimates["last"] == Estimate(at(3300), SIMILAR_JOBS)


def test_a_job_ahead_that_never_ends_keeps_the_rest_unknown() -> None:
    queue = [waiting("head", need=2), waiting("next", need=1, shape=BOB_1x1)]
    jobs = [running(ends_in_s=120), running(ends_in_s=300)]
    estimates = estimate_starts(queue, jobs, {"gpu": 0}, {}, NOW)
    assert estimates["head"] == Estimate(at(300), MAX_RUNTIME)
    assert estimates["next"] == NO_ESTIMATE  # alice's 2 × 1 jobs have no history: the head never ends


def test_a_job_that_can_never_fit_holds_nobody_up() -> None:
    queue = [waiting("huge", need=64), waiting("small", need=1)]
    estimates = estimate_starts(queue, [running(ends_in_s=60)], {"gpu": 1}, TYPICAL, NOW)
    assert estimates["huge"] == NO_ESTIMATE
    assert estimates["small"] == Estimate(at(60), MAX_RUNTIME)


def test_jobs_not_waiting_for_capacity_take_no_part() -> None:
    queue = [waiting("over-quota", need=1, for_capacity=False), waiting("w", need=1)]
    estimates = estimate_starts(queue, [running(ends_in_s=60)], {"gpu": 0}, TYPICAL, NOW)
    assert estimates["over-quota"] == NO_ESTIMATE
    assert estimates["w"] == Estimate(at(60), MAX_RUNTIME)


def test_each_kind_is_counted_on_its_own() -> None:
    queue = [waiting("gpu-job", need=1), waiting("cpu-job", need=1, kind="cpu", shape=("bob", 1, 0))]
    jobs = [running(ends_in_s=60, kind="cpu", shape=("bob", 1, 0)), running(ends_in_s=600)]
    estimates = estimate_starts(queue, jobs, {"gpu": 0, "cpu": 0}, {}, NOW)
    assert estimates == {"gpu-job": Estimate(at(600), MAX_RUNTIME), "cpu-job": Estimate(at(60), MAX_RUNTIME)}


def test_thousands_of_waiting_jobs_in_one_walk() -> None:
    queue = [waiting(f"w{i}", need=1, shape=BOB_1x1) for i in range(5000)]
    jobs = [running(started_s_ago=i % 600) for i in range(500)]
    estimates = estimate_starts(queue, jobs, {"gpu": 0}, TYPICAL, NOW)
    starts = [estimates[f"w{i}"].starts_at for i in range(5000)]
    assert all(start is not None for start in starts)
    assert starts == sorted(starts)  # in queue order, one after another
    # 500 devices, each turning over every 10 min: the 5000th job starts in its tenth round.
    assert at(5400) <= starts[-1] <= at(6000)


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        (Estimate(at(60), SIMILAR_JOBS), Estimate(at(120), MAX_RUNTIME), Estimate(at(60), SIMILAR_JOBS)),
        (NO_ESTIMATE, Estimate(at(120), MAX_RUNTIME), Estimate(at(120), MAX_RUNTIME)),
        (Estimate(at(60), SIMILAR_JOBS), NO_ESTIMATE, Estimate(at(60), SIMILAR_JOBS)),
        (NO_ESTIMATE, NO_ESTIMATE, NO_ESTIMATE),
    ],
)
def test_the_earlier_of_two_estimates(first: Estimate, second: Estimate, expected: Estimate) -> None:
    assert earlier(first, second) == expected
