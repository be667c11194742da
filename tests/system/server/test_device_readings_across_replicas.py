"""The newest device readings whichever replica holds an agent's stream (services.observing.device_telemetry):
`stored_newest` reads them from the table in one query, on a SQLite file and on a real PostgreSQL server;
`newest_readings` takes this replica's streams from memory and, on PostgreSQL only, the others from there.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from mwms.server.db.engine import Database
from mwms.server.db.migrate import upgrade_to_head
from mwms.server.db.models import Agent
from mwms.server.services.fleet.agents import Registration, register_agent
from mwms.server.services.observing.device_telemetry import (
    READINGS_WINDOW,
    IncomingSample,
    LatestSamples,
    newest_readings,
    sample_row,
    store_rows,
    stored_newest,
)
from mwms_testkit.sql_statements import recorded, selects

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)
SINCE = NOW - READINGS_WINDOW


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'readings.db'}"
    else:
        url = request.getfixturevalue("postgres").create_database("device_readings")
    database = Database(url)
    upgrade_to_head(database.engine)
    try:
        yield database
    finally:
        database.dispose()


def _agent(db: Database, name: str, stream_replica: str | None = None) -> str:
    gpus = [
        {"kind": "gpu", "index": i, "name": "g", "uuid": f"GPU-{i}", "memory_mib": 81920} for i in range(4)
    ]
    with db.write() as session:
        agent_id = register_agent(
            session, Registration(name, name, "127.0.0.1", 20000, 20010, gpus, "t"), 30
        ).id
        session.execute(update(Agent).where(Agent.id == agent_id).values(stream_replica=stream_replica))
    return agent_id


def _sample(index: int, util: float) -> IncomingSample:
    return IncomingSample(index, util, 100, 81920, 40.0)


def _store(db: Database, rows: list[tuple[str, int, float, float]]) -> None:
    """(agent, device index, utilisation, seconds before NOW) each."""
    with db.write() as session:
        store_rows(
            session, [sample_row(a, _sample(i, u), NOW - timedelta(seconds=ago)) for a, i, u, ago in rows]
        )


def _view(found: dict[str, list[Any]]) -> dict[str, list[tuple[int, float]]]:
    return {agent: [(s.index, s.utilization_pct) for s in devices] for agent, devices in found.items()}


def test_the_newest_sample_of_each_device_within_the_window(db: Database) -> None:
    first, second, silent, gone = (_agent(db, n) for n in ("first", "second", "silent", "gone"))
    _store(
        db,
        [
            (first, 0, 1.0, 30),
            (first, 0, 2.0, 10),
            (first, 0, 3.0, 20),  # stored after, received before: the one 10 s ago wins
            (first, 1, 4.0, 50),  # device 1 missed the last samples: its newest is older, still in
            (first, 2, 5.0, 120),  # device 2's only sample is past the window
            (second, 0, 6.0, 5),
            (second, 0, 7.0, 200),
            (second, 3, 8.0, 0),
            (gone, 0, 9.0, 61),  # only old ones
        ],
    )
    with recorded(db.engine, selects) as statements, db.read() as session:
        found = stored_newest(session, SINCE)
    assert len(statements) == 1  # one query for every agent
    assert _view(found) == {first: [(0, 2.0), (1, 4.0)], second: [(0, 6.0), (3, 8.0)]}
    assert silent not in found and gone not in found
    assert found[first][0].at == NOW - timedelta(seconds=10)

    with db.read() as session:
        assert _view(stored_newest(session, SINCE, agent_id=second)) == {second: [(0, 6.0), (3, 8.0)]}
        assert stored_newest(session, SINCE, agent_id=silent) == {}
        assert stored_newest(session, NOW + timedelta(seconds=1)) == {}


def test_agents_held_by_a_replica_are_left_to_its_memory(db: Database) -> None:
    here, there, nowhere = _agent(db, "here", "me"), _agent(db, "there", "other"), _agent(db, "nowhere")
    _store(db, [(a, 0, float(n), 5) for n, a in enumerate((here, there, nowhere))])
    with db.read() as session:
        assert set(stored_newest(session, SINCE, not_held_by="me")) == {there, nowhere}
        assert set(stored_newest(session, SINCE, not_held_by="other")) == {here, nowhere}


def test_newest_readings_merge_memory_and_the_table_on_postgresql_only(db: Database) -> None:
    here, there, left = _agent(db, "here", "me"), _agent(db, "there", "other"), _agent(db, "left")
    _store(db, [(here, 0, 1.0, 5), (there, 0, 2.0, 5), (there, 1, 3.0, 5)])
    latest = LatestSamples()
    latest.put(here, [_sample(0, 10.0), _sample(1, 11.0)], NOW)
    latest.put(there, [_sample(0, 20.0)], NOW - timedelta(minutes=5))  # heard here before it moved
    latest.put(left, [_sample(0, 30.0)], NOW - timedelta(minutes=5))  # heard here, then gone

    with recorded(db.engine, selects) as statements, db.read() as session:
        everyone = _view(newest_readings(session, latest, "me", now=NOW))
        one = _view(newest_readings(session, latest, "me", agent_id=there, now=NOW))
        unknown = newest_readings(session, latest, "me", agent_id="no-such-agent", now=NOW)
    assert unknown == {}
    if db.engine.dialect.name == "sqlite":  # one coordinator: its memory holds every agent
        assert len(statements) == 0
        assert everyone == {here: [(0, 10.0), (1, 11.0)], there: [(0, 20.0)], left: [(0, 30.0)]}
        assert one == {there: [(0, 20.0)]}
    else:
        assert len(statements) == 3
        assert everyone == {
            here: [(0, 10.0), (1, 11.0)],  # its stream is here: memory, not the table
            there: [(0, 2.0), (1, 3.0)],  # another replica's stream: the table
            left: [(0, 30.0)],  # none in the table this recent: what this replica heard last
        }
        assert list(everyone) == sorted(everyone)
        assert one == {there: [(0, 2.0), (1, 3.0)]}
