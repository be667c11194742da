"""The one container of what the coordinator wires together: the database, settings and live machinery.

`build_wiring` makes it inside the running event loop (the app's lifespan, server/app.py); routers get it
through server/api/deps.py and the gRPC servicers through their constructor (server/rpc/agent_service.py).
`start` and `stop` run and end its loops in a fixed order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from mwms.server.db.engine import Database
from mwms.server.live.agent_notify import Doorbell
from mwms.server.live.device_ingest import DeviceTelemetryWriter
from mwms.server.live.hang_detector import HangDetector
from mwms.server.live.hello_writer import HelloWriter
from mwms.server.live.hub import AgentHub
from mwms.server.live.ingest import TelemetryWriter
from mwms.server.live.ingest_process import IngestProcess, runs_apart, worker_config
from mwms.server.live.ingest_store import Decode, GroupStore, ThreadStore
from mwms.server.live.liveness import Liveness
from mwms.server.live.loop_lag import LoopLagProbe
from mwms.server.live.loops import BackgroundLoops
from mwms.server.live.pass_locks import PassLocks
from mwms.server.live.report_writer import ReportWriter
from mwms.server.live.stack_collector import StackCollector
from mwms.server.live.task_progress import TaskProgress
from mwms.server.services.fleet.replicas import ReplicaIdentity
from mwms.server.settings import Settings


@dataclass
class Wiring:
    """The database, settings and in-memory machinery that routers and servicers share."""

    db: Database
    settings: Settings
    hub: AgentHub
    liveness: Liveness
    loops: BackgroundLoops
    progress: TaskProgress  # hang detection's clock, fed by the telemetry writer
    telemetry: TelemetryWriter
    hellos: HelloWriter  # the agents' hellos, several to a transaction
    reports: ReportWriter  # the agents' task reports, several to a transaction
    devices: DeviceTelemetryWriter  # also holds the newest device samples, for server/api/devices.py
    stacks: StackCollector  # stack dump requests waiting for the agents' answers
    hangs: HangDetector
    replica: ReplicaIdentity  # this coordinator process, one of the replicas on the database
    doorbell: Doorbell  # rings between replicas (PostgreSQL LISTEN/NOTIFY; inert on SQLite)
    passes: PassLocks  # which background loop's pass runs here
    background: set[asyncio.Task[None]]  # fire-and-forget work to await at stop
    lag: LoopLagProbe  # the event loop's lateness, for /metrics

    def poke_scheduler(self) -> None:
        """Runs the scheduler soon (task or job states changed)."""
        self.loops.poke()

    def wake_agents(self, agent_ids: Iterable[str] | None = None) -> None:
        """Pushes the pending commands of the given agents (every connected one when None); any thread."""
        self.hub.wake(agent_ids)

    def start(self) -> None:
        """Starts the doorbell, the hub's dispatcher, the writers, the background loops, the hang detector and
        the event loop's lag probe."""
        self.doorbell.start()
        self.hub.start()
        self.telemetry.start()
        self.hellos.start()
        self.reports.start()
        self.devices.start()
        self.loops.start()
        self.hangs.start()
        self.lag.start()

    async def stop(self) -> None:
        """Stops what `start` started; the database stays open (its owner disposes of it)."""
        await self.lag.stop()
        await self.hangs.stop()
        await self.telemetry.stop()
        await self.hellos.stop()
        await self.reports.stop()
        await self.devices.stop()
        await self.hub.stop()
        await self.loops.stop()
        await self.passes.release_all()
        await self.doorbell.stop()
        await asyncio.gather(*self.background, return_exceptions=True)


def telemetry_store(db: Database, settings: Settings, decode: Decode) -> GroupStore:
    """Where telemetry transactions run: the ingest process (settings.ingest_process, a database another
    process can open), else a thread of this process, decoding with `decode`."""
    if runs_apart(settings, db.url):
        return IngestProcess(worker_config(settings, db.url))
    return ThreadStore(db, decode)


def build_wiring(db: Database, settings: Settings, replica: ReplicaIdentity, decode: Decode) -> Wiring:
    """The coordinator's machinery for `db` and `settings`, not started; call inside the running loop.
    `decode` turns a log or metric batch's bytes into lines or points (server/rpc/convert.py's
    telemetry_items: the live machinery imports no transport)."""
    loop = asyncio.get_running_loop()
    doorbell = Doorbell(db, loop, replica.id)
    hub = AgentHub(loop, db, replica_id=replica.id, doorbell=doorbell)
    doorbell.on("agents", hub.wake_local)
    doorbell.on_reconnect(lambda: hub.wake_local(["*"]))
    liveness = Liveness()
    passes = PassLocks(db, patient=settings.serve == "agents")
    progress = TaskProgress()
    loops = BackgroundLoops(
        db, settings, hub, liveness, replica=replica, passes=passes, progress=progress, doorbell=doorbell
    )
    doorbell.on("scheduler", loops.poked_by_ring)
    telemetry = TelemetryWriter(
        telemetry_store(db, settings, decode), hub.wake, loops.poke, progress=progress
    )
    stacks = StackCollector(db, hub, doorbell)
    return Wiring(
        db=db,
        settings=settings,
        hub=hub,
        liveness=liveness,
        loops=loops,
        progress=progress,
        telemetry=telemetry,
        hellos=HelloWriter(db, settings, replica.id, hub.wake, loops.poke),
        reports=ReportWriter(db, settings.restart_backoff_s, hub.wake),
        devices=DeviceTelemetryWriter(db, settings, passes),
        stacks=stacks,
        hangs=HangDetector(db, settings, stacks, progress, hub.wake, loops.poke, passes=passes),
        replica=replica,
        doorbell=doorbell,
        passes=passes,
        background=set(),
        lag=LoopLagProbe(),
    )
