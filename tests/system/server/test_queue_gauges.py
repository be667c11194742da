"""The sharing gauges on /metrics of a real app over a seeded SQLite database (issue 18): the queue by
priority band and team, each team's devices in use and its quota; the team label stays bounded, and the
counts take the same three aggregate queries however many jobs and teams there are."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.priorities import priority_band
from mwms.server.app import create_app
from mwms.server.db.engine import Database
from mwms.server.db.migrate import upgrade_to_head
from mwms.server.db.models import Agent, Attempt, Bundle, Job, Task, TeamQuota, utcnow
from mwms.server.observability.cluster_gauges import MAX_TEAMS_LABELLED, OTHER_TEAMS
from mwms.server.services.fleet.agents import Registration, register_agent
from mwms.server.services.observing.cluster_counts import count_sharing
from mwms.server.settings import Settings
from mwms_testkit.sql_statements import recorded, selects

DIGEST = "9" * 64
ADMIN_TOKEN = "mwms_admin-token-for-queue-gauge-tests-01"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

pytestmark = pytest.mark.db_seed(DIGEST, agents=("cpu-1", "cpu-2"))


def add_gpu_agent(session: Session, name: str, gpus: int = 8) -> str:
    devices = [{"kind": "gpu", "index": i, "name": f"gpu{i}"} for i in range(gpus)]
    return register_agent(session, Registration(name, name, "127.0.0.1", 20000, 20010, devices, "t"), 30).id


def add_job(
    session: Session,
    team: str,
    state: str,
    priority: int = 500,
    gpus_per_worker: int = 0,
    **values: Any,
) -> Job:
    """A job row as the scheduler leaves it. Waiting ones ask for more GPUs than any agent has, so the app's
    scheduling loop leaves them where they are while the test scrapes."""
    job = Job(
        name=f"{team}-{state.lower()}",
        state=state,
        bundle_digest=DIGEST,
        command=["python", "train.py"],
        num_workers=1,
        gpus_per_worker=gpus_per_worker,
        team=team,
        submitted_by=team,
        priority=priority,
        **values,
    )
    session.add(job)
    session.flush()
    return job


def add_task(session: Session, job: Job, agent_id: str, kind: str, indices: list[int], state: str) -> None:
    attempt = Attempt(job_id=job.id, number=1, state="ACTIVE")
    session.add(attempt)
    session.flush()
    session.add(
        Task(
            job_id=job.id,
            attempt_id=attempt.id,
            attempt_number=1,
            index=0,
            agent_id=agent_id,
            host="127.0.0.1",
            port=20000 + len(indices),
            device_kind=kind,
            device_indices=indices,
            state=state,
        )
    )
    session.flush()


def add_cpu_agent(session: Session, name: str) -> str:
    """The seeded one-slot agent of that name, or a new one (the PostgreSQL database is not seeded)."""
    known = session.scalars(select(Agent.id).where(Agent.name == name)).one_or_none()
    if known is not None:
        return known
    slot = [{"kind": "cpu", "index": 0, "name": "s"}]
    return register_agent(session, Registration(name, name, "127.0.0.1", 20000, 20010, slot, "t"), 30).id


@pytest.fixture
def scrape(db: Database, tmp_path: Path) -> Iterator[Any]:
    """scrape() -> the samples of one /metrics page of a real app over the `db` fixture's database."""
    settings = Settings(
        data_dir=tmp_path / "coordinator", grpc_port=0, admin_token=ADMIN_TOKEN, db_url=str(db.engine.url)
    )
    with ExitStack() as stack:
        http = stack.enter_context(TestClient(create_app(settings), base_url="http://127.0.0.1"))
        http.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"

        def read() -> Samples:
            response = http.get("/metrics")
            assert response.status_code == 200, response.text[:500]
            values: Samples = {}
            for family in text_string_to_metric_families(response.text):
                for sample in family.samples:
                    values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
            return values

        yield read


def of(samples: Samples, name: str, *label_names: str) -> dict[tuple[str, ...], float]:
    """The samples of `name`, keyed by the values of `label_names`."""
    return {
        tuple(dict(labels)[label] for label in label_names): value
        for (n, labels), value in samples.items()
        if n == name
    }


def seed_sharing(db: Database) -> None:
    """Three teams: vision (GPU quota, two GPU tasks, a queue in every band), nlp (CPU quota, one CPU task,
    a restarting and a preempting job), and a lone user without a quota holding a GPU and waiting in one."""
    later = utcnow() + timedelta(hours=1)
    with db.write() as session:
        gpu = add_gpu_agent(session, "gpu-1")
        cpu = add_cpu_agent(session, "cpu-1")
        session.add(TeamQuota(team="vision", gpus=8, cpu_slots=None))
        session.add(TeamQuota(team="nlp", gpus=0, cpu_slots=4))
        add_task(session, add_job(session, "vision", "RUNNING", 500, 3), gpu, "gpu", [0, 1, 2], "RUNNING")
        add_task(session, add_job(session, "vision", "SCHEDULED", 800, 2), gpu, "gpu", [3, 4], "ASSIGNED")
        # Ended tasks hold nothing; a LOST one holds its devices until its agent confirms it ended.
        add_task(session, add_job(session, "vision", "SUCCEEDED", 500, 1), gpu, "gpu", [5], "SUCCEEDED")
        add_task(session, add_job(session, "dana", "RUNNING", 500, 1), gpu, "gpu", [6], "LOST")
        add_task(session, add_job(session, "nlp", "RUNNING", 100), cpu, "cpu", [0], "RUNNING")
        # The band edges: low < 250 <= normal < 750 <= high.
        for priority in (0, 249, 250, 749, 750, 1000):
            add_job(session, "vision", "PENDING", priority, gpus_per_worker=64)
        add_job(session, "nlp", "RESTARTING", 300, gpus_per_worker=64, not_before=later)
        add_job(session, "nlp", "PREEMPTING", 900, gpus_per_worker=64)
        add_job(session, "dana", "PENDING", 500, gpus_per_worker=64)
        add_job(session, "nlp", "FAILED", 900)  # ended: not queued


def test_metrics_show_the_queue_by_band_and_team_and_each_teams_use_and_quota(db: Database, scrape) -> None:
    seed_sharing(db)
    samples = scrape()
    queue = of(samples, "mwms_queue_jobs", "band", "team")
    assert {key: value for key, value in queue.items() if value} == {
        ("low", "vision"): 2,
        ("normal", "vision"): 2,
        ("high", "vision"): 2,
        ("normal", "nlp"): 1,
        ("high", "nlp"): 1,
        ("normal", "dana"): 1,
    }
    # Every band of every team shown has a series, zeros included, so a queue that empties reads 0.
    assert len(queue) == 3 * 3 and queue[("low", "dana")] == 0
    assert of(samples, "mwms_team_devices_in_use", "team", "kind") == {
        ("vision", "gpu"): 5,
        ("vision", "cpu"): 0,
        ("nlp", "gpu"): 0,
        ("nlp", "cpu"): 1,
        ("dana", "gpu"): 1,
        ("dana", "cpu"): 0,
    }
    # Only the kinds a quota caps; dana has no quota at all.
    assert of(samples, "mwms_team_quota_devices", "team", "kind") == {
        ("vision", "gpu"): 8,
        ("nlp", "gpu"): 0,
        ("nlp", "cpu"): 4,
    }
    assert of(samples, "mwms_cluster_scrape_ok") == {(): 1}


def test_the_sharing_counts_on_postgres(postgres) -> None:
    """The same queries (CASE grouping, JSON length inside a sum, the join) on a real PostgreSQL server."""
    database = Database(postgres.create_database("sharing_counts"))
    upgrade_to_head(database.engine)
    with database.write() as session:
        session.add(Bundle(digest=DIGEST, size=1, archive_format="tar.gz"))
    try:
        seed_sharing(database)
        with database.read() as session:
            counts = count_sharing(session)
    finally:
        database.dispose()
    assert counts.queued == {
        "vision": {"low": 2, "normal": 2, "high": 2},
        "nlp": {"normal": 1, "high": 1},
        "dana": {"normal": 1},
    }
    assert counts.in_use == {"vision": {"gpu": 5}, "nlp": {"cpu": 1}, "dana": {"gpu": 1}}
    assert counts.quotas == {"vision": {"gpu": 8}, "nlp": {"gpu": 0, "cpu": 4}}


def test_the_band_edges_are_those_of_the_queue_wait_histogram(db: Database) -> None:
    with db.write() as session:
        for priority in (0, 249, 250, 749, 750, 1000):
            add_job(session, f"team-{priority}", "PENDING", priority)
    with db.read() as session:
        queued = count_sharing(session).queued
    assert queued == {f"team-{p}": {priority_band(p): 1} for p in (0, 249, 250, 749, 750, 1000)}


def test_an_empty_cluster_exports_the_families_without_series(scrape) -> None:
    samples = scrape()
    names = {name for name, _ in samples}
    assert not names & {"mwms_queue_jobs", "mwms_team_devices_in_use", "mwms_team_quota_devices"}
    assert of(samples, "mwms_cluster_scrape_ok") == {(): 1}


def test_the_team_label_is_bounded_and_the_rest_is_summed_as_other(db: Database, scrape) -> None:
    extra = 5
    with db.write() as session:
        gpu = add_gpu_agent(session, "gpu-1")
        # The teams with a quota are shown first, whatever their size.
        session.add(TeamQuota(team="zz-quota", gpus=2, cpu_slots=None))
        add_job(session, "zz-quota", "PENDING", 500, gpus_per_worker=64)
        # The biggest user of the cluster next.
        add_task(session, add_job(session, "zz-big", "RUNNING", 500, 4), gpu, "gpu", [0, 1, 2, 3], "RUNNING")
        for i in range(MAX_TEAMS_LABELLED + extra):
            add_job(session, f"team-{i:04d}", "PENDING", 100, gpus_per_worker=64)
    samples = scrape()
    queue = of(samples, "mwms_queue_jobs", "band", "team")
    teams = {team for _, team in queue}
    assert len(teams) == MAX_TEAMS_LABELLED + 1 and OTHER_TEAMS in teams
    assert {"zz-quota", "zz-big"} <= teams
    # 207 teams, 200 shown: the quota's, the big user's and 198 of the rest; 7 are summed as other.
    assert queue[("low", OTHER_TEAMS)] == extra + 2
    assert sum(queue.values()) == MAX_TEAMS_LABELLED + extra + 1
    assert of(samples, "mwms_team_devices_in_use", "team", "kind")[("zz-big", "gpu")] == 4
    assert of(samples, "mwms_team_quota_devices", "team", "kind") == {("zz-quota", "gpu"): 2}


def test_the_sharing_counts_take_three_queries_at_any_size(db: Database) -> None:
    def queries() -> int:
        with recorded(db.engine, selects) as statements, db.read() as session:
            count_sharing(session)
        return len(statements)

    seed_sharing(db)
    small = queries()
    with db.write() as session:
        for i in range(60):
            session.add(TeamQuota(team=f"more-{i}", gpus=i, cpu_slots=i))
            add_job(session, f"more-{i}", "PENDING", i * 16)
    assert queries() == small == 3
