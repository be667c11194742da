"""The liveness flush goes on every second while a reconcile pass is slow.

Found by bench/sharing.py --scenario scale: a reconcile pass that waited 11-28 s for the writer kept the
loop that also flushes liveness waiting, so nothing agents said was written meanwhile, and one poll of
GET /agents showed all 1,000 agents offline while every heartbeat was answered.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path

from mwms.server.db.engine import Database
from mwms.server.db.migrate import upgrade_to_head
from mwms.server.db.models import Agent
from mwms.server.live.liveness import Liveness
from mwms.server.services.fleet.agents import Registration, register_agent
from mwms.server.settings import Settings
from mwms_testkit.in_process_coordinator import background_loops


def test_liveness_is_written_at_every_tick_while_a_reconcile_pass_waits(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'coordinator.db'}")
    upgrade_to_head(db.engine)
    devices = [{"kind": "cpu", "index": 0, "name": "s"}]
    with db.write() as session:
        agent_id = register_agent(
            session, Registration("slow-reconcile", "h", "127.0.0.1", 20000, 20010, devices, "t"), 30
        ).id
    settings = Settings(data_dir=tmp_path, agent_timeout_s=10)

    def last_heartbeat() -> datetime:
        with db.read() as session:
            stored = session.get(Agent, agent_id)
            assert stored is not None and stored.last_heartbeat_at is not None
            return stored.last_heartbeat_at

    async def ticks() -> None:
        liveness = Liveness()
        loops = background_loops(db, settings, liveness)
        release = asyncio.Event()
        reconciles: list[datetime] = []

        async def waiting_reconcile(taken_at: datetime) -> None:  # stands for one waiting on the writer
            reconciles.append(taken_at)
            await release.wait()

        loops._reconcile = waiting_reconcile  # type: ignore[method-assign]
        beats = []
        for _ in range(3):
            liveness.seen(agent_id)
            await asyncio.wait_for(loops._flush_and_reconcile(), 10)  # one tick of the loop
            await asyncio.sleep(0.05)
            beats.append(last_heartbeat())
        assert beats[0] < beats[1] < beats[2], beats  # each tick wrote what it heard
        assert len(reconciles) == 1  # one reconcile pass at a time: the others ticks only flushed
        release.set()
        assert loops._reconciling is not None
        await asyncio.wait_for(loops._reconciling, 10)

    asyncio.run(ticks())
    db.dispose()
