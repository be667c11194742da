"""The scheduler process keeps what it built from the agents' and the running jobs' rows between passes
(WaitingJobs.agents_memo, .running_memo), by the exact values it was built from: after every change a
pass reads what a read without them reads, and a pass with nothing changed builds nothing again."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from mwms.server.db.models import Agent, Job, Preemption, Task, utcnow
from mwms.server.schemas import JobCreate
from mwms.server.services.fleet.agent_capacity import capacities, holding_tasks
from mwms.server.services.fleet.agents import Registration, register_agent
from mwms.server.services.fleet.cordons import cordon
from mwms.server.services.job_life.jobs import create_job
from mwms.server.services.json_values import hashable
from mwms.server.services.scheduler.job_rows import read_running
from mwms.server.services.scheduler.scheduling import SharingPolicy, schedule_pass
from mwms.server.services.scheduler.waiting_jobs import WaitingJobs
from mwms.server.states import JobState
from mwms_testkit.coordinator_rows import place_task, seeded_database

DIGEST = "f" * 64
POLICY = SharingPolicy(min_runtime_s=60.0)


def same_as_fresh(db, memo: dict[Any, Any], running_memo: dict[Any, Any], later_s: float = 0.0) -> Any:
    """capacities and read_running with the memos, given the holding tasks once as a pass reads them, equal
    them without either; returns (agents, running)."""
    now = utcnow() + timedelta(seconds=later_s)
    with db.read() as session:
        holding = holding_tasks(session)
        agents = capacities(session, now, memo=memo, holding=holding)
        assert agents == capacities(session, now)
        running = read_running(session, now, POLICY, running_memo, holding)
        assert running == read_running(session, now, POLICY)
    return {a.name: a for a in agents}, {r.job_id: r for r in running}


def register(db, name: str, slots: int = 1, memory: int = 0) -> None:
    devices = [{"kind": "cpu", "index": i, "name": f"s{i}"} for i in range(slots)]
    with db.write() as session:
        register_agent(
            session,
            Registration(name, name, "127.0.0.1", 20000, 20010, devices, "t", memory_bytes=memory),
            30,
        )


def test_agents_memo_follows_tasks_registrations_losses_and_refused_ports(tmp_path):
    db = seeded_database(tmp_path / "a.db", DIGEST, ("a-1", "a-2"))
    memo: dict[Any, Any] = {}
    running: dict[Any, Any] = {}
    agents, _ = same_as_fresh(db, memo, running)
    assert agents["a-1"].free_devices == (0,) and len(memo) == 2
    again, _ = same_as_fresh(db, memo, running)
    assert again["a-1"] is agents["a-1"]  # nothing changed: nothing built again

    task = place_task(db, agents["a-1"].agent_id, digest=DIGEST, port=20003)
    agents, _ = same_as_fresh(db, memo, running)
    assert agents["a-1"].free_devices == () and 20003 in agents["a-1"].used_ports
    with db.write() as session:  # the task ends: its device is free again
        row = session.get(Task, task.id)
        assert row is not None
        row.state = "SUCCEEDED"
    agents, _ = same_as_fresh(db, memo, running)
    assert agents["a-1"].free_devices == (0,)

    with db.write() as session:  # a refused port is avoided
        row = session.get(Task, task.id)
        assert row is not None
        row.state, row.ended_at = "REJECTED", utcnow()
    agents, _ = same_as_fresh(db, memo, running)
    assert 20003 in agents["a-1"].used_ports

    register(db, "a-2", slots=3, memory=1 << 30)  # registers again with more slots and memory
    register(db, "a-3")  # a new agent
    agents, _ = same_as_fresh(db, memo, running)
    assert agents["a-2"].all_devices == (0, 1, 2) and agents["a-2"].memory_bytes == 1 << 30
    assert "a-3" in agents
    with db.write() as session:  # a-3 is lost: its liveness ran out
        for agent in session.query(Agent).filter(Agent.name == "a-3"):
            agent.online_until = utcnow() - timedelta(seconds=1)
    agents, _ = same_as_fresh(db, memo, running)
    assert "a-3" not in agents and len(memo) == 2
    db.dispose()


def test_running_memo_follows_job_changes_preemptions_and_the_minimum_run_time(tmp_path):
    db = seeded_database(tmp_path / "r.db", DIGEST, ("a-1",))
    memo: dict[Any, Any] = {}
    running_memo: dict[Any, Any] = {}
    agent_id = same_as_fresh(db, memo, running_memo)[0]["a-1"].agent_id
    task = place_task(db, agent_id, digest=DIGEST, options={"max_runtime_seconds": 600})
    _, running = same_as_fresh(db, memo, running_memo)
    job = running[task.job_id]
    assert job.devices == {agent_id: (0,)} and not job.preemptable and job.ends_at is not None
    assert same_as_fresh(db, memo, running_memo)[1][task.job_id] is job
    # Its minimum run time passes: it becomes preemptable with nothing in the database changed.
    _, later = same_as_fresh(db, memo, running_memo, later_s=120)
    assert later[task.job_id].preemptable

    with db.write() as session:
        row = session.get(Job, task.job_id)
        assert row is not None
        row.priority = 700
    _, running = same_as_fresh(db, memo, running_memo, later_s=120)
    assert running[task.job_id].priority == 700
    with db.write() as session:  # it is preempted: it ends within its grace
        row = session.get(Job, task.job_id)
        assert row is not None
        row.state = JobState.PREEMPTING.value
        session.add(Preemption(victim_job_id=task.job_id, attempt_id=task.attempt_id, cause="priority"))
    _, running = same_as_fresh(db, memo, running_memo, later_s=120)
    assert not running[task.job_id].preemptable and running[task.job_id].ends_at != job.ends_at
    with db.write() as session:  # its task ends: it holds nothing
        row = session.get(Task, task.id)
        assert row is not None
        row.state = "PREEMPTED"
    assert same_as_fresh(db, memo, running_memo)[1] == {} and running_memo == {}
    db.dispose()


def test_passes_with_the_memos_see_agents_join_leave_and_be_cordoned(tmp_path):
    db = seeded_database(tmp_path / "p.db", DIGEST, ("a-1",))
    cache = WaitingJobs()
    with db.write() as session:
        two = create_job(
            session,
            JobCreate(bundle_digest=DIGEST, command=["python", "x.py"], workers=2),
            submitted_by="u",
        ).id
    assert schedule_pass(db, waiting_jobs=cache) == []  # one slot: it waits
    with db.write() as session:
        cordon(session, "a-1", by="u", reason="maintenance")
    register(db, "a-2")
    assert schedule_pass(db, waiting_jobs=cache) == []  # two slots, one cordoned: it still waits
    register(db, "a-3")
    touched = schedule_pass(db, waiting_jobs=cache)  # a-2 and a-3: it is placed, not on a-1
    with db.read() as session:
        job = session.get(Job, two)
        assert job is not None and job.state == JobState.SCHEDULED.value
        names = {a.id: a.name for a in session.query(Agent)}
    assert sorted(names[a] for a in touched) == ["a-2", "a-3"]
    db.dispose()


def test_json_read_parsed_by_the_driver_makes_a_key_too():
    # psycopg hands back JSON columns parsed: the memos key them by their canonical text.
    assert hashable([0, 1]) == "[0, 1]" and hashable('[{"index": 0}]') == '[{"index": 0}]'
    assert hashable([{"kind": "cpu", "index": 0}]) == hashable([{"index": 0, "kind": "cpu"}])
    assert hash((hashable([{"index": 0}]), hashable(None)))
