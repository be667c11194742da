"""Fair share over time (issue 33): usage in device-seconds decays with a half-life, is counted once whatever
the interval between passes, survives a restart, orders the queue and is shown.

Against real SQLite files (and PostgreSQL where one can start) through the real functions: the reconciler's
accrual (fair_share.accrue), the scheduler's reading of its inputs (scheduling.read_inputs), the teams view
and the coordinator's API with its own loops. Time is a test clock (`now` passed in), never real hours.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import select, text, update

from mwms.cli.daemons import _settings
from mwms.cli.errors import CliError
from mwms.server.db.engine import Database
from mwms.server.db.migrate import upgrade_to_head
from mwms.server.db.models import Agent, Bundle, Job, TeamUsage, UsageClock, utcnow
from mwms.server.schemas import JobCreate
from mwms.server.services.fleet.agents import Registration, register_agent
from mwms.server.services.job_life.jobs import create_job
from mwms.server.services.job_life.tasks import TaskReport, apply_report
from mwms.server.services.scheduler import fair_share
from mwms.server.services.scheduler.queue_order import WaitingJob, queue_order
from mwms.server.services.scheduler.scheduling import SharingPolicy, read_inputs, schedule_pending
from mwms.server.services.views import teams_view
from mwms.server.settings import Settings
from mwms.server.states import TaskState
from mwms_testkit.cluster import wait_until
from mwms_testkit.coordinator_rows import place_task, register_request, seeded_database
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings

DIGEST = "f" * 64
HOUR = 3600.0
WEEK = 168 * HOUR
T0 = utcnow().replace(microsecond=0)


# -- the arithmetic ----------------------------------------------------------------------------------------


def test_usage_halves_every_half_life_and_accrues_the_same_whatever_the_interval():
    assert fair_share.decayed(100.0, WEEK, WEEK) == pytest.approx(50.0)
    assert fair_share.decayed(100.0, 3 * WEEK, WEEK) == pytest.approx(12.5)
    assert fair_share.decayed(100.0, -HOUR, WEEK) == 100.0  # a clock behind decays nothing
    # A short interval adds held × dt; a long one each second decayed from its own moment.
    assert fair_share.accrued(4, 60.0, WEEK) == pytest.approx(240.0, rel=1e-4)
    assert fair_share.accrued(4, 1e9 * WEEK, WEEK) == pytest.approx(4 * WEEK / math.log(2))
    assert fair_share.accrued(0, HOUR, WEEK) == fair_share.accrued(3, 0.0, WEEK) == 0.0

    # One pass after 10 hours adds what 600 passes a minute apart (or passes at irregular times) add.
    one = fair_share.accrued(3, 10 * HOUR, HOUR)
    many = 0.0
    for _ in range(600):
        many = fair_share.decayed(many, 60.0, HOUR) + fair_share.accrued(3, 60.0, HOUR)
    uneven = 0.0
    for step in (1.0, 7 * HOUR, 59.0, 3 * HOUR - 60.0):
        uneven = fair_share.decayed(uneven, step, HOUR) + fair_share.accrued(3, step, HOUR)
    assert many == pytest.approx(one, rel=1e-9) and uneven == pytest.approx(one, rel=1e-9)


def test_coarse_usage_steps_down_by_two_percent_and_forgets_crumbs():
    assert fair_share.coarse(0.0) == fair_share.coarse(-5.0) == fair_share.coarse(math.nan) == 0.0
    assert fair_share.coarse(71.0) == 0.0  # under 0.02 device-hours: none
    for value in (72.5, 100.0, HOUR, 1234.5 * HOUR, 1e9 * HOUR):
        rounded = fair_share.coarse(value)
        # Steps of 2 % of (the value + 1 device-hour): 72 device-seconds near 0, 2 % of large ones.
        assert value - 0.02 * (value + HOUR) <= rounded <= value, value
        assert fair_share.coarse(rounded * 1.0000001) == pytest.approx(rounded)  # a step is a step
    # Usage that grows by a second stays in its step: the scheduler's key does not change each second.
    assert fair_share.coarse(500 * HOUR) == fair_share.coarse(500 * HOUR + 1.0)


# -- queue order with history (pure) ---------------------------------------------------------------------


def waiting(job_id: str, team: str, age_s: float = 0.0, workers: int = 1) -> WaitingJob:
    return WaitingJob(
        job_id=job_id,
        state="PENDING",
        priority=500,
        team=team,
        created_at=T0 - timedelta(seconds=age_s),
        workers=workers,
        gpus_per_worker=0,
    )


def order_of(jobs: list[WaitingJob], **kwargs) -> list[str]:
    return [job.job_id for job in queue_order(jobs, **kwargs)]


def test_history_puts_a_team_behind_and_turns_still_alternate():
    jobs = [waiting(f"a{i}", "a", age_s=100 - i) for i in range(3)] + [
        waiting(f"b{i}", "b", age_s=10 - i) for i in range(3)
    ]
    plain = {"usage": {}, "totals": {"cpu": 8}, "quotas": {}}
    # No history: exactly the order by current use (equal: they alternate, older first).
    assert (
        order_of(jobs, **plain) == order_of(jobs, **plain, history={}) == ["a0", "b0", "a1", "b1", "a2", "b2"]
    )
    # a held 4 slots (its share) for half an hour lately: 0.5 h of its share, as if it held 2 slots now.
    history = {"a": {"cpu": 4 * 0.5 * HOUR}}
    assert order_of(jobs, **plain, history=history) == ["b0", "b1", "a0", "b2", "a1", "a2"]
    # Far behind: b takes every turn first.
    assert order_of(jobs, **plain, history={"a": {"cpu": 4 * 10 * HOUR}})[:3] == ["b0", "b1", "b2"]
    # Use of a kind the team has no share of (no GPUs online) does not count against it.
    assert order_of(jobs, **plain, history={"a": {"gpu": 8 * 10 * HOUR}})[:2] == ["a0", "b0"]
    # A quota is the share history is measured against: 2 slot-hours are 0.125 h of a quota of 16 slots.
    quotas = {"a": {"cpu": 16, "gpu": None}}
    with_quota = order_of(jobs, usage={}, totals={"cpu": 8}, quotas=quotas, history=history)
    assert with_quota == ["b0", "a0", "a1", "a2", "b1", "b2"]


# -- accrual on a real database ----------------------------------------------------------------------------


def database(path: Path, agents: int = 4) -> Database:
    """A migrated SQLite database with `agents` one-slot CPU agents, online whatever the test clock says."""
    db = seeded_database(path, DIGEST, [f"n{i}" for i in range(1, agents + 1)])
    with db.write() as session:
        session.execute(update(Agent).values(online_until=T0 + timedelta(days=3650)))
    return db


def submit(db: Database, team: str, *, workers: int = 1, pinned: list[str] | None = None) -> str:
    """A job of `team` (a user of that name: a team of one); `pinned` to agents that never join, it waits."""
    with db.write() as session:
        spec = JobCreate(bundle_digest=DIGEST, command=["python", "t.py"], workers=workers, agents=pinned)
        return create_job(session, spec, submitted_by=team).id


def place(db: Database, now: datetime) -> None:
    with db.write() as session:
        schedule_pending(session, now=now, policy=SharingPolicy(min_runtime_s=0))


def end(db: Database, job_ids: list[str], now: datetime) -> None:
    with db.write() as session:
        for job_id in job_ids:
            job = session.get(Job, job_id)
            assert job is not None
            for task in job.attempts[-1].tasks:
                agent = session.get(Agent, task.agent_id)
                for state, code in ((TaskState.RUNNING, None), (TaskState.SUCCEEDED, 0)):
                    apply_report(session, agent, TaskReport(task.id, state, code), backoff_base_s=1, now=now)


def accrue(db: Database, now: datetime, half_life_s: float = WEEK) -> None:
    with db.write() as session:
        fair_share.accrue(session, now, half_life_s)


def usage(db: Database, now: datetime) -> dict[str, dict[str, float]]:
    with db.read() as session:
        return fair_share.read_usage(session, now)


def order(db: Database, now: datetime) -> list[str]:
    with db.read() as session:
        return [job.job_id for job in read_inputs(session, now, None, SharingPolicy()).order]


def standing(db: Database, now: datetime) -> dict[str, float]:
    with db.read() as session:
        return {view.team: view.fair_share.standing for view in teams_view(session, now=now)}


def test_a_team_that_used_the_cluster_in_the_last_hour_waits_until_its_usage_decays(tmp_path):
    """Two teams with equal shares (no quotas, four slots: two each). a held all four slots for the last
    hour, b nothing: a's job waits behind b's although it is older. As a's usage decays the order flips
    back: against what b holds now after three half-lives, and level with b (age decides) after twenty."""
    db = database(tmp_path / "fair.db")
    accrue(db, T0)  # the clock starts
    hog = [submit(db, "a") for _ in range(4)]
    place(db, T0)
    accrue(db, T0 + timedelta(minutes=30))
    accrue(db, T0 + timedelta(minutes=60))
    end(db, hog, T0 + timedelta(minutes=60))
    assert usage(db, T0 + timedelta(minutes=60))["a"]["cpu"] == pytest.approx(4 * HOUR, rel=0.01)

    small_b = submit(db, "b")
    place(db, T0 + timedelta(minutes=60))  # b now holds one slot
    a_job = submit(db, "a", pinned=["ghost"])  # older
    b_job = submit(db, "b", pinned=["ghost"])
    hour_later = T0 + timedelta(minutes=60)
    assert order(db, hour_later) == [b_job, a_job]
    shown = standing(db, hour_later)
    assert shown["a"] == pytest.approx(2.0, rel=0.01)  # 4 slot-hours over a share of 2 slots
    assert shown["b"] == 0.0

    accrue(db, T0 + timedelta(minutes=70))  # b held its slot for ten minutes
    end(db, [small_b], T0 + timedelta(minutes=70))
    three_weeks = T0 + 3 * timedelta(hours=168)
    accrue(db, three_weeks)
    place_b = submit(db, "b")
    place(db, three_weeks)  # b holds one slot again: 0.5 of its share now
    assert order(db, three_weeks) == [a_job, b_job]
    assert standing(db, three_weeks)["a"] == pytest.approx(2.0 / 8, rel=0.02)

    end(db, [place_b], three_weeks)
    twenty_weeks = T0 + 20 * timedelta(hours=168)
    accrue(db, twenty_weeks)
    assert order(db, twenty_weeks) == [a_job, b_job]  # both level again: the older job first
    with db.read() as session:
        assert fair_share.read_history(session, twenty_weeks) == {}
    db.dispose()


def test_the_clock_survives_a_restart_so_nothing_is_counted_twice(tmp_path):
    path = tmp_path / "restart.db"
    db = database(path)
    accrue(db, T0)
    submit(db, "a", workers=2)
    place(db, T0)
    accrue(db, T0 + timedelta(hours=1))
    before = usage(db, T0 + timedelta(hours=1))
    db.dispose()

    db = Database(f"sqlite:///{path}")  # a new coordinator on the same database
    assert usage(db, T0 + timedelta(hours=1)) == before
    accrue(db, T0 + timedelta(hours=1))  # the pass the old one had made: nothing more
    assert usage(db, T0 + timedelta(hours=1)) == before
    accrue(db, T0 + timedelta(minutes=30))  # a clock behind counts nothing and moves nothing back
    assert usage(db, T0 + timedelta(hours=1)) == before
    with db.read() as session:
        clock = session.get(UsageClock, fair_share.CLOCK_ID)
        assert clock is not None and clock.accrued_to == T0 + timedelta(hours=1) and clock.half_life_s == WEEK
    # The hour the coordinator was down is counted once, from the stored clock.
    accrue(db, T0 + timedelta(hours=2))
    expected = fair_share.accrued(2, 2 * HOUR, WEEK)
    assert usage(db, T0 + timedelta(hours=2))["a"]["cpu"] == pytest.approx(expected, rel=1e-9)
    # Read later, it has decayed, though nothing was written.
    assert usage(db, T0 + timedelta(hours=2) + timedelta(hours=168))["a"]["cpu"] == pytest.approx(
        expected / 2
    )
    db.dispose()


def test_what_is_counted_gpus_slots_and_damaged_rows(tmp_path):
    db = database(tmp_path / "kinds.db", agents=1)
    gpus = [{"kind": "gpu", "index": i, "name": f"g{i}"} for i in range(4)]
    with db.write() as session:
        register_agent(session, Registration("g1", "g1", "127.0.0.1", 21000, 21010, gpus, "t"), 30)
        session.execute(update(Agent).values(online_until=T0 + timedelta(days=3650)))
        spec = JobCreate(bundle_digest=DIGEST, command=["python", "t.py"], workers=1, gpus_per_worker=3)
        create_job(session, spec, submitted_by="vision")
    submit(db, "vision")
    place(db, T0)
    with db.read() as session:
        assert fair_share.held_devices(session) == {"vision": {"gpu": 3, "cpu": 1}}
    with db.write() as session:  # a row damaged outside the coordinator does not stop the pass
        session.execute(text("UPDATE tasks SET device_indices = 'not json' WHERE device_kind = 'gpu'"))
    with db.read() as session:
        assert fair_share.held_devices(session) == {"vision": {"gpu": 0, "cpu": 1}}
    db.dispose()


def test_usage_not_written_for_forty_half_lives_is_deleted(tmp_path):
    db = database(tmp_path / "prune.db", agents=0)
    accrue(db, T0, half_life_s=HOUR)
    with db.write() as session:
        session.add(TeamUsage(team="old", kind="gpu", device_seconds=1e9, as_of=T0 - timedelta(hours=41)))
        session.add(TeamUsage(team="recent", kind="gpu", device_seconds=10.0, as_of=T0 - timedelta(hours=39)))
    accrue(db, T0 + timedelta(seconds=1), half_life_s=HOUR)
    with db.read() as session:
        assert set(session.scalars(select(TeamUsage.team))) == {"recent"}
    db.dispose()


def test_a_bad_half_life_is_contained_and_counts_nothing(tmp_path):
    db = database(tmp_path / "bad.db", agents=0)
    accrue(db, T0)
    accrue(db, T0 + timedelta(hours=1), half_life_s=0.0)  # logged and counted as poison, not raised
    with db.read() as session:
        assert session.get(UsageClock, fair_share.CLOCK_ID).accrued_to == T0
    db.dispose()


def test_accrual_on_postgres(postgres):
    db = Database(postgres.create_database("pg_fair_share"))
    upgrade_to_head(db.engine)
    gpus = [{"kind": "gpu", "index": i, "name": f"g{i}"} for i in range(2)]
    with db.write() as session:
        session.add(Bundle(digest=DIGEST, size=1, archive_format="tar.gz"))
        register_agent(session, Registration("pg-g", "pg-g", "127.0.0.1", 21000, 21010, gpus, "t"), 30)
        session.execute(update(Agent).values(online_until=T0 + timedelta(days=3650)))
        spec = JobCreate(bundle_digest=DIGEST, command=["python", "t.py"], workers=1, gpus_per_worker=2)
        create_job(session, spec, submitted_by="vision")
    place(db, T0)
    accrue(db, T0)
    accrue(db, T0 + timedelta(hours=1))
    assert usage(db, T0 + timedelta(hours=1)) == {"vision": {"gpu": pytest.approx(2 * HOUR, rel=0.01)}}
    with db.read() as session:
        assert fair_share.read_history(session, T0 + timedelta(hours=1))["vision"]["gpu"] > 0
    db.dispose()


# -- the setting -------------------------------------------------------------------------------------------


def test_the_half_life_setting_is_bounded_and_says_which_variable(monkeypatch):
    assert Settings().fair_share_half_life_hours == 168
    assert Settings(fair_share_half_life_hours=0.5).fair_share_half_life_hours == 0.5
    for bad in (0, -1, 1e6, math.nan, math.inf):
        with pytest.raises(ValidationError, match="fair_share_half_life_hours"):
            Settings(fair_share_half_life_hours=bad)
    monkeypatch.setenv("MWMS_FAIR_SHARE_HALF_LIFE_HOURS", "0")
    with pytest.raises(CliError, match="MWMS_FAIR_SHARE_HALF_LIFE_HOURS: Input should be greater than"):
        _settings(Settings, {})


# -- shown by the coordinator ------------------------------------------------------------------------------

JOIN_TOKEN = "join-token-for-fair-share-tests-0123456789"
ADMIN_TOKEN = "mwms_admin-token-for-fair-share-tests-0123"


def start(stack: ExitStack, data_dir: Path) -> InProcessCoordinator:
    settings = coordinator_settings(
        data_dir, join_token=JOIN_TOKEN, admin_token=ADMIN_TOKEN, agent_timeout_s=300
    )
    coordinator = InProcessCoordinator.start(stack, settings, admin_token=ADMIN_TOKEN)
    with coordinator.db.read() as session:
        known = set(session.scalars(select(Agent.name)))
    for name, port in (("box-1", 20000), ("box-2", 21000)):
        if name not in known:
            coordinator.stub.Register(register_request(name, JOIN_TOKEN, port_low=port), timeout=10)
    return coordinator


def teams_by_name(coordinator: InProcessCoordinator) -> dict[str, dict]:
    answer = coordinator.http.get("/api/v1/teams")
    assert answer.status_code == 200, answer.text
    return {team["team"]: team for team in answer.json()}


def test_the_api_shows_usage_share_and_standing_and_keeps_them_across_a_restart(tmp_path):
    data_dir = tmp_path / "coordinator"
    with ExitStack() as stack:
        coordinator = start(stack, data_dir)
        with coordinator.db.read() as session:
            box = session.scalars(select(Agent.id).where(Agent.name == "box-1")).one()
        job_id = place_task(coordinator.db, box, digest=DIGEST).job_id
        with coordinator.db.write() as session:
            session.get(Job, job_id).team = "vision"
            # Usage on record for a team that neither runs nor waits now: 3 slot-hours.
            session.add(TeamUsage(team="nlp", kind="cpu", device_seconds=3 * HOUR, as_of=utcnow()))
        # The coordinator's own reconciler pass counts what vision's task holds, every second.
        wait_until(
            lambda: teams_by_name(coordinator)["vision"]["usage_device_hours"]["cpu_slots"] > 0,
            30,
            "vision's usage to be counted",
        )
        teams = teams_by_name(coordinator)
        vision, nlp = teams["vision"], teams["nlp"]
        assert vision["in_use"] == {"gpus": 0, "cpu_slots": 1}
        assert vision["share"] == {"gpus": 0.0, "cpu_slots": 2.0}  # the one team that runs: both slots
        assert 0 <= vision["standing"] < 0.01  # seconds of use, in hours of its share
        # nlp's share is what it would get if it submitted now: one of the two slots.
        assert nlp["share"] == {"gpus": 0.0, "cpu_slots": 1.0}
        assert nlp["usage_device_hours"] == {"gpus": 0.0, "cpu_slots": pytest.approx(3.0, abs=0.001)}
        assert nlp["standing"] == pytest.approx(3.0, abs=0.001) and nlp["members"] == []

    with ExitStack() as stack:  # a new coordinator on the same database reads the usage back
        coordinator = start(stack, data_dir)
        nlp = teams_by_name(coordinator)["nlp"]
        assert nlp["usage_device_hours"]["cpu_slots"] == pytest.approx(3.0, abs=0.001)
