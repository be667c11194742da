"""How replicas on one PostgreSQL database agree (server/db/locks.py, server/live/pass_locks.py,
server/live/agent_notify.py, server/services/fleet/replicas.py), on a real PostgreSQL server; and SQLite's one
coordinator (server/db/single_instance.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text

from mwms.server.app import create_app
from mwms.server.db.engine import Database
from mwms.server.db.locks import lock_key
from mwms.server.db.migrate import upgrade_to_head
from mwms.server.db.models import Agent, utcnow
from mwms.server.db.single_instance import AlreadyRunning, SingleInstanceLock
from mwms.server.live.agent_notify import PAYLOAD_BYTES, Doorbell, payloads
from mwms.server.live.hub import AgentHub
from mwms.server.live.liveness import Liveness
from mwms.server.live.pass_locks import PATIENT_TRY_S, PassLocks
from mwms.server.services.fleet import replicas
from mwms.server.services.fleet.agents import Registration, record_heartbeats, register_agent
from mwms.server.services.fleet.heard import write_heard
from mwms.server.services.job_life.reconcile import reconcile
from mwms.server.settings import Settings
from mwms_testkit.cluster import wait_until
from mwms_testkit.in_process_coordinator import background_loops


@pytest.fixture
def pg(postgres):
    """The session's PostgreSQL server (tests/conftest.py); each test makes databases of its own."""
    return postgres


@pytest.fixture()
def two(pg, request):
    """Two replicas' Database objects on one fresh database."""
    name = "r_" + request.node.name.lower()[:40].replace("[", "_").replace("]", "_").replace("-", "_")
    url = pg.create_database(name)
    first, second = Database(url), Database(url)
    upgrade_to_head(first.engine)
    yield first, second
    first.dispose()
    second.dispose()


def identity(name: str) -> replicas.ReplicaIdentity:
    return replicas.ReplicaIdentity(name, name, "", "", "t", "both", 1)


def add_agent(db: Database, name: str) -> str:
    with db.write() as session:
        reg = Registration(
            name, name, "127.0.0.1", 20000, 20010, [{"kind": "cpu", "index": 0, "name": "s"}], "t"
        )
        return register_agent(session, reg, 30).id


def test_concurrent_migrations_run_once_under_the_lock(pg):
    url = pg.create_database("r_concurrent_migrations")
    databases = [Database(url) for _ in range(3)]
    errors: list[BaseException] = []

    def upgrade(db: Database) -> None:
        try:
            upgrade_to_head(db.engine)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=upgrade, args=(db,)) for db in databases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert "replicas" in inspect(databases[0].engine).get_table_names()
    for db in databases:
        db.dispose()


def test_writers_of_two_replicas_take_turns(two):
    """A read-then-write transaction on one replica waits for the other's to commit, as on SQLite."""
    first, second = two
    order: list[str] = []
    holding = threading.Event()

    def hold() -> None:
        with first.write() as session:
            session.execute(text("SELECT 1"))
            holding.set()
            time.sleep(0.5)
            order.append("first commits")

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait(10)
    started = time.monotonic()
    with second.write() as session:
        session.execute(text("SELECT 1"))
        order.append("second writes")
    waited = time.monotonic() - started
    thread.join()
    assert order == ["first commits", "second writes"]
    assert waited >= 0.3


def test_a_loop_is_led_by_one_replica_and_moves_when_its_leader_dies(two):
    first, second = two

    async def scenario() -> None:
        a, b = PassLocks(first), PassLocks(second)
        runs: list[str] = []

        async def on(replica: str) -> None:
            runs.append(replica)

        assert await a.run("scheduler", lambda: on("a")) is True
        assert await b.run("scheduler", lambda: on("b")) is False  # a leads it, and keeps it
        assert await a.run("scheduler", lambda: on("a")) is True
        assert await b.run("reconciler", lambda: on("b")) is True  # another loop's lock is free
        assert a.leads() == ["scheduler"] and b.leads() == ["reconciler"]
        assert b.skipped["scheduler"] == 1
        # The leader's connection dies (its replica is killed): PostgreSQL ends its transaction.
        with second.engine.connect() as connection:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(l.pid) FROM pg_locks l WHERE l.locktype = 'advisory' "
                    "AND l.pid <> pg_backend_pid() AND l.objid = (:key & 4294967295)"
                ),
                {"key": lock_key("loop:scheduler")},
            )
        assert await b.run("scheduler", lambda: on("b")) is True  # the survivor leads it now
        assert await a.run("scheduler", lambda: on("a")) is False  # the old leader notices and stops
        assert a.leads() == []
        await b.release_all()  # a clean stop frees its locks at once
        assert await a.run("reconciler", lambda: on("a")) is True
        assert runs == ["a", "a", "b", "b", "a"]
        await a.release_all()

    asyncio.run(scenario())


def test_an_agents_only_replica_leaves_the_loops_to_the_others(two):
    first, _ = two

    async def scenario() -> None:
        patient = PassLocks(first, patient=True)

        async def nothing() -> None:
            pass

        assert await patient.run("retention", nothing) is False  # not in its first seconds
        await asyncio.sleep(PATIENT_TRY_S + 0.1)
        assert await patient.run("retention", nothing) is True  # nobody else took it
        await patient.release_all()

    asyncio.run(scenario())


def test_rings_reach_the_other_replica_and_payloads_are_bounded(two):
    first, second = two
    ids = [f"agent{i:07d}" for i in range(2000)]
    chunks = payloads("agents", ids)
    assert len(chunks) > 1 and all(len(c.encode()) <= PAYLOAD_BYTES for c in chunks)
    assert [i for c in chunks for i in c.split(":", 1)[1].split(",")] == ids

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        sender, listener = Doorbell(first, loop), Doorbell(second, loop)
        heard: list[str] = []
        got = asyncio.Event()

        def on_agents(items: list[str]) -> None:
            heard.extend(items)
            if len(heard) >= len(ids):
                got.set()

        listener.on("agents", on_agents)
        listener.start()
        try:
            await asyncio.to_thread(listener.listening.wait, 10)
            started = time.monotonic()
            await sender.ring("agents", ids)
            await asyncio.wait_for(got.wait(), 5)
            assert time.monotonic() - started < 1.0
        finally:
            await listener.stop()
        return heard

    assert asyncio.run(scenario()) == ids


class Sink:
    """What the hub needs of a stream (server/live/hub.py CommandSink): records what it is told."""

    def __init__(self, epoch: int) -> None:
        self.ready = True
        self.epoch: int | None = epoch
        self.closed: list[tuple[str, bool]] = []
        self.delivered = 0

    async def deliver(self, commands: object) -> None:
        self.delivered += 1

    async def ask_stacks(self, request_id: str, task_ids: list[str]) -> None:
        pass

    def close(self, reason: str, superseded: bool = False) -> None:
        self.closed.append((reason, superseded))


def test_a_stream_superseded_on_another_replica_is_closed_and_gets_no_commands(two):
    first, second = two
    agent_id = add_agent(first, "epoch-agent")
    with first.write() as session:
        old_epoch = replicas.claim_stream(session, agent_id, "replica-a")
    with second.write() as session:
        new_epoch = replicas.claim_stream(session, agent_id, "replica-b")  # the agent moved
    assert new_epoch == old_epoch + 1

    async def scenario() -> tuple[Sink, Sink]:
        loop = asyncio.get_running_loop()
        stale, current = Sink(old_epoch), Sink(new_epoch)
        hub_a = AgentHub(loop, first, replica_id="replica-a")
        hub_b = AgentHub(loop, second, replica_id="replica-b")
        hub_a.attach(agent_id, stale)
        hub_b.attach(agent_id, current)
        await hub_a.dispatch([agent_id])
        await hub_b.dispatch([agent_id])
        return stale, current

    stale, current = asyncio.run(scenario())
    assert len(stale.closed) == 1 and stale.closed[0][1] is True
    assert "newer stream" in stale.closed[0][0]
    assert current.closed == []
    with second.write() as session:
        replicas.release_stream(session, agent_id, "replica-a", old_epoch)  # too late: not its stream
    with second.read() as session:
        assert session.get(Agent, agent_id).stream_replica == "replica-b"


def test_replicas_alive_and_the_streams_they_hold(two):
    first, _ = two
    held = add_agent(first, "held-elsewhere")
    orphan = add_agent(first, "held-by-the-dead")
    now = utcnow()
    with first.write() as session:
        replicas.beat(session, identity("a"), 0, ["scheduler"], now)
        replicas.beat(session, identity("b"), 1, [], now)
        replicas.beat(
            session, identity("dead"), 1, [], now - timedelta(seconds=replicas.REPLICA_TIMEOUT_S + 1)
        )
        replicas.beat(
            session, identity("stale"), 1, [], now - timedelta(seconds=replicas.REPLICA_FRESH_S + 1)
        )
        replicas.claim_stream(session, held, "b")
        replicas.claim_stream(session, orphan, "dead")
    with first.read() as session:
        assert replicas.others_alive(session, "a", now) == 1  # "b"; "stale" reads alive, but is not fresh
        assert replicas.streams_elsewhere(session, "a", now) == frozenset({held})
        views = {v.id: v for v in replicas.list_replicas(session, now)}
    assert views["a"].alive and views["a"].loops == ["scheduler"]
    assert not views["dead"].alive and views["dead"].agents_held == 0
    with first.read() as session:
        assert replicas.name_streaming_elsewhere(session, "a", "held-elsewhere", now) == frozenset({held})
        assert replicas.name_streaming_elsewhere(session, "a", "held-by-the-dead", now) == frozenset()
        assert replicas.silence_verdict(session, session.get(Agent, orphan), now) == "moving"
        assert replicas.silence_verdict(session, session.get(Agent, held), now) != "moving"
    with first.write() as session:
        replicas.stop(session, identity("b"))
    with first.read() as session:
        assert replicas.others_alive(session, "a", now) == 0
        assert replicas.streams_elsewhere(session, "a", now) == frozenset()
        assert replicas.silence_verdict(session, session.get(Agent, held), now) == "moving"


def test_a_second_coordinator_on_one_sqlite_file_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'mwms.db'}"
    first = SingleInstanceLock(url)
    first.acquire()
    try:
        with pytest.raises(AlreadyRunning, match="PostgreSQL") as refused:
            SingleInstanceLock(url).acquire()
        assert "exactly one coordinator" in str(refused.value)
    finally:
        first.release()
    again = SingleInstanceLock(url)
    again.acquire()  # freed by the first one's release (or its process's end)
    again.release()
    assert SingleInstanceLock("postgresql+psycopg://u@h/db").path is None
    assert SingleInstanceLock("sqlite://").path is None


def test_a_coordinator_restarted_at_once_after_a_kill_on_sqlite_gives_its_agents_time(tmp_path):
    """The killed coordinator's row still reads alive (it beat a moment ago), but on SQLite no other runs:
    the new one is the whole control plane starting, and the agents get a timeout plus the grace."""
    settings = Settings(
        data_dir=tmp_path / "coordinator", grpc_port=0, agent_timeout_s=6, reconnect_grace_s=5
    )
    settings.data_dir.mkdir()
    database = Database(settings.database_url)
    upgrade_to_head(database.engine)
    agent = add_agent(database, "was-online")
    now = utcnow()
    with database.write() as session:
        replicas.beat(session, identity("killed"), 1, ["scheduler"], now)  # no clean stop
        replicas.claim_stream(session, agent, "killed")
        session.get(Agent, agent).online_until = now + timedelta(seconds=1)
    with TestClient(create_app(settings), base_url="http://127.0.0.1"):
        with database.read() as session:
            online_until = session.get(Agent, agent).online_until
    database.dispose()
    assert online_until >= now + timedelta(seconds=6 + 5 - 1), online_until - now


def test_an_agent_silent_with_its_dead_replica_gets_time_to_move_before_it_is_lost(two):
    first, _ = two
    moving = add_agent(first, "moving-agent")
    silent = add_agent(first, "silent-agent")
    unknown = add_agent(first, "not-known-yet")
    now = utcnow()
    with first.write() as session:
        replicas.beat(session, identity("dead"), 1, [], now - timedelta(seconds=5))  # killed 5 s ago
        replicas.beat(session, identity("live"), 1, [], now)
        replicas.beat(session, identity("slow"), 1, [], now - timedelta(seconds=2))  # its flush waits
        replicas.claim_stream(session, moving, "dead")
        replicas.claim_stream(session, silent, "live")
        replicas.claim_stream(session, unknown, "slow")
        for agent_id in (moving, silent, unknown):
            session.get(Agent, agent_id).online_until = now - timedelta(seconds=1)
    with first.write() as session:
        reconcile(session, backoff_base_s=1, default_startup_timeout_s=60, moving_grace_s=20, now=now)
    with first.read() as session:
        agent = session.get(Agent, moving)
        assert agent.lost_at is None and agent.online_until > now + timedelta(seconds=19)
        assert agent.stream_replica is None  # granted once
        assert session.get(Agent, silent).lost_at == now  # its replica wrote since: its silence is its own
        # Its replica beats but has not written what it heard since the agent ran out: not judged yet.
        assert session.get(Agent, unknown).lost_at is None
    later = now + timedelta(seconds=21)
    with first.write() as session:
        reconcile(session, backoff_base_s=1, default_startup_timeout_s=60, moving_grace_s=20, now=later)
    with first.read() as session:
        assert session.get(Agent, moving).lost_at == later  # it never said hello anywhere


def test_the_reconciler_gives_a_dead_replicas_agents_as_long_as_a_coordinator_start_gives(two, tmp_path):
    """A moving agent may first meet a replica that is starting, or swamped by the same failover, and wait
    out its registration timeout there (a kill storm's agents needed 19-23 s): the reconciler's loop grants
    the agent timeout plus the reconnect grace, as a start of the whole control plane does."""
    first, _ = two
    moving = add_agent(first, "moving-far")
    now = utcnow()
    with first.write() as session:
        replicas.beat(session, identity("killed"), 1, [], now - timedelta(seconds=5))
        replicas.claim_stream(session, moving, "killed")
        session.get(Agent, moving).online_until = now  # as its replica last heard it
    settings = Settings(data_dir=tmp_path, agent_timeout_s=6, reconnect_grace_s=5)

    async def one_tick() -> None:
        loops = background_loops(first, settings, Liveness())
        await loops._flush_and_reconcile()
        assert loops._reconciling is not None
        await loops._reconciling

    asyncio.run(one_tick())
    with first.read() as session:
        agent = session.get(Agent, moving)
        assert agent.lost_at is None and agent.stream_replica is None
        assert agent.online_until >= now + timedelta(seconds=6 + 5 - 1), agent.online_until - now


def test_a_replica_whose_connection_is_gone_offers_no_agents_even_while_its_beats_are_fresh(two):
    """PostgreSQL drops a killed replica's listening connection at once; its last beat is still fresh."""
    first, second = two
    on_b = add_agent(first, "on-b")
    now = utcnow()
    with first.write() as session:
        replicas.beat(session, identity("a"), 0, [], now)
        replicas.beat(session, identity("b"), 1, [], now)
        replicas.claim_stream(session, on_b, "b")

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        mine, theirs = Doorbell(first, loop, "a"), Doorbell(second, loop, "b")
        for bell in (mine, theirs):
            bell.start()
        try:
            for bell in (mine, theirs):
                await asyncio.to_thread(bell.listening.wait, 10)
            with first.read() as session:
                assert replicas.connected_replicas(session) >= {"a", "b"}
                assert replicas.streams_elsewhere(session, "a", now) == frozenset({on_b})
                assert replicas.others_alive(session, "c", now) == 2
            await theirs.stop()  # as a kill -9 would end it
            with first.read() as session:
                assert "b" not in replicas.connected_replicas(session)
                assert replicas.streams_elsewhere(session, "a", now) == frozenset()
                # A replica starting now does not count the killed one as alive.
                assert replicas.others_alive(session, "c", now) == 1
                # Where the database cannot tell (this replica does not listen), the beats decide.
                assert replicas.streams_elsewhere(session, "c", now) == frozenset({on_b})
        finally:
            await mine.stop()

    asyncio.run(scenario())


def test_a_dead_replicas_agents_are_moving_at_once_and_a_live_one_takes_its_streams_back(two):
    first, _ = two
    on_dead = add_agent(first, "on-dead")
    on_live = add_agent(first, "on-live")
    now = utcnow()
    with first.write() as session:
        replicas.beat(session, identity("dead"), 1, [], now - timedelta(seconds=replicas.REPLICA_FRESH_S + 1))
        replicas.beat(session, identity("live"), 1, [], now)
        replicas.claim_stream(session, on_dead, "dead")
        replicas.claim_stream(session, on_live, "live")
        for agent_id in (on_dead, on_live):
            session.get(Agent, agent_id).online_until = now + timedelta(seconds=2)
    with first.write() as session:
        assert replicas.release_streams_of_the_dead(session, 20, now) == 1
    with first.read() as session:
        moving = session.get(Agent, on_dead)
        assert moving.stream_replica is None and moving.online_until >= now + timedelta(seconds=20)
        assert session.get(Agent, on_live).stream_replica == "live"
    with first.write() as session:
        assert replicas.release_streams_of_the_dead(session, 20, now) == 0  # once per death
        # A replica that only looked dead and still holds the stream claims it back with its next beat.
        replicas.beat(session, identity("live"), 2, [], now, streams={on_live, on_dead})
    with first.read() as session:
        assert session.get(Agent, on_dead).stream_replica == "live"


def test_a_liveness_flush_locks_its_agents_in_one_order_and_never_closes_a_cycle(two):
    """A flush writes liveness, then claims back the streams it holds: two statements over agent rows. It
    locks every row it writes first, in id order, so a writer holding a lower agent that then takes a
    higher one never meets a flush that holds the higher one while it waits for the lower (a deadlock,
    which PostgreSQL ends by aborting one of them: seen in a kill storm)."""
    first, second = two
    low, high = sorted([add_agent(first, "row-one"), add_agent(first, "row-two")])
    now = utcnow()
    with first.write() as session:
        replicas.beat(session, identity("live"), 2, [], now)
        replicas.claim_stream(session, high, "live")  # low's stream is released: the flush claims it back
    errors: list[BaseException] = []

    def flush() -> None:
        try:
            with first.write_unserialised() as session:
                write_heard(session, identity("live"), {high: utcnow()}, {}, {low, high}, [], 10)
        except BaseException as error:  # noqa: BLE001 - asserted below
            errors.append(error)

    def flush_waits_for_a_row() -> bool:
        with second.read() as session:
            return bool(
                session.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock'"
                    )
                ).scalar()
            )

    with second.engine.connect() as writer, writer.begin():
        writer.execute(text("SELECT id FROM agents WHERE id = :id FOR UPDATE"), {"id": low})
        thread = threading.Thread(target=flush)
        thread.start()
        wait_until(flush_waits_for_a_row, 20, "the flush to wait for the lower agent's row")
        # The flush holds no row yet: the higher one is free at once (before, it held it: NOWAIT failed).
        writer.execute(text("SELECT id FROM agents WHERE id = :id FOR UPDATE NOWAIT"), {"id": high})
    thread.join(20)
    assert not thread.is_alive() and not errors, errors
    with first.read() as session:
        assert session.get(Agent, low).stream_replica == "live"
        assert session.get(Agent, high).last_heartbeat_at > now


def test_a_liveness_flush_committing_while_the_reconciler_judges_keeps_the_agent(two):
    """Flushes do not wait for the writer lock (Database.write_unserialised): a replica's flush that
    writes an agent's heartbeat while the reconciler's leader judges that agent either comes first or
    waits for the verdict; the agent is never marked lost on the liveness the flush replaced."""
    first, second = two
    agent_id = add_agent(first, "heard-just-now")
    now = utcnow()
    with first.write() as session:
        replicas.beat(session, identity("live"), 1, [], now)
        replicas.claim_stream(session, agent_id, "live")
        session.get(Agent, agent_id).online_until = now - timedelta(seconds=1)  # ran out, on its own
    written, release = threading.Event(), threading.Event()

    def flush() -> None:
        with second.write_unserialised() as session:
            record_heartbeats(session, {agent_id: now}, 30)
            written.set()
            release.wait(10)

    def judge() -> None:
        with first.write() as session:
            reconcile(session, backoff_base_s=1, default_startup_timeout_s=60, moving_grace_s=20, now=now)

    flusher = threading.Thread(target=flush)
    flusher.start()
    assert written.wait(10)
    judging = threading.Thread(target=judge)
    judging.start()
    judging.join(0.5)
    assert judging.is_alive()  # waits on the agent's row, which the flush holds
    release.set()
    flusher.join(10)
    judging.join(10)
    with first.read() as session:
        agent = session.get(Agent, agent_id)
        assert agent.lost_at is None and agent.online_until == now + timedelta(seconds=30)
