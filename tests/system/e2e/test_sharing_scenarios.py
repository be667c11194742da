"""Sharing a cluster (issue 18) against a real coordinator with simulated agents (testkit/mwms_testkit/simulator.py).

Two of bench/sharing.py's scenarios, small and fast, asserting behaviour (the speed targets live in the
bench):
- starvation: 4 agents x 1 slot, a 1-worker job a second (4 s each, max_runtime_seconds 6) and a 4-worker
  job: the gang gets a reservation, so it starts within one small job's run time plus a pass, no small
  job overtakes it, and a short job whose max_runtime ends before the reservation starts is backfilled.
- preemption: a high-priority job on a full cluster stops the whole low-priority gang at once; the victim
  saves and exits 42 (recorded as saved), waits again in its place (ahead of a younger job of its
  priority) and runs again after.
In both, no device of an agent is ever held by two tasks: as the agents saw it (StartTask to final
report) and as `GET /api/v1/agents` shows it, polled throughout.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mwms_testkit.cluster import Cluster, pack
from mwms_testkit.simulator import SimConfig, SimTask, Simulator  # noqa: E402

pytestmark = pytest.mark.e2e
STARVATION_PORT_BASE = 26600  # 4 agents x 10 ports each, clear of other tests' agents
PREEMPTION_PORT_BASE = 26700
SMALL_RUN_S = 4.0


@pytest.fixture
def sharing_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A coordinator of its own per test: jobs a test leaves waiting must not land on the next one's agents."""
    cluster = Cluster(root=tmp_path, server_env={"MWMS_PREEMPTION_MIN_RUNTIME_S": "0"})
    try:
        cluster.start_server()
        yield cluster
    finally:
        cluster.stop()


async def poll(what: str, probe: Callable[[], Awaitable[Any]], timeout: float = 20.0) -> Any:
    """Awaits `probe()` until it returns something truthy; fails with the last value seen."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last observed: {last!r}")


class DeviceWatch:
    """Polls GET /api/v1/agents and records every moment one agent's device was shown held twice."""

    def __init__(self, http: httpx.AsyncClient, names: set[str]) -> None:
        self.http, self.names = http, names
        self.doubles: list[tuple[str, int, list[str]]] = []
        self.polls = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            for agent in (await self.http.get("/api/v1/agents")).json():
                if agent["name"] not in self.names:
                    continue
                holders: dict[int, list[str]] = {}
                for task in agent["tasks"]:
                    for device in task["device_indices"]:
                        holders.setdefault(device, []).append(f"{task['job_id']}/{task['task_index']}")
                self.doubles += [(agent["name"], d, h) for d, h in holders.items() if len(h) > 1]
            self.polls += 1
            await asyncio.sleep(0.2)

    def __enter__(self) -> DeviceWatch:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._task is not None:
            self._task.cancel()


async def start_fleet(cluster: Cluster, port_base: int, **config: Any) -> Simulator:
    sim = Simulator(
        SimConfig(
            join_token=cluster.join_token,
            server=f"127.0.0.1:{cluster.grpc_port}",
            heartbeat_interval_s=0.5,
            task_run_s=None,
            port_base=port_base,
            **config,
        ),
        4,
        run_id=f"share{port_base}",
    )
    await sim.register_all()
    await sim.connect_all(timeout_s=20)
    return sim


async def upload(http: httpx.AsyncClient) -> str:
    bundle = pack({"p.py": "print('simulated')\n"})
    response = await http.post("/api/v1/bundles", files={"file": ("b.tar.gz", bundle)})
    assert response.status_code in (200, 201), response.text
    return str(response.json()["digest"])


async def submit(http: httpx.AsyncClient, digest: str, workers: int, run_s: float, **spec: Any) -> str:
    body = {
        "bundle_digest": digest,
        "command": ["python", "p.py", f"--sim-run-s={run_s}"],
        "workers": workers,
        "gpus_per_worker": 0,
        **spec,
    }
    response = await http.post("/api/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def job(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    return dict((await http.get(f"/api/v1/jobs/{job_id}")).json())


def tasks_of(sim: Simulator, job_id: str) -> list[SimTask]:
    return [t for t in sim.tasks() if t.job_id == job_id]


def first_start(sim: Simulator, job_id: str) -> float | None:
    return min((t.started_at for t in tasks_of(sim, job_id)), default=None)


def client(cluster: Cluster) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {cluster.admin_token}"}
    return httpx.AsyncClient(base_url=cluster.api, headers=headers, trust_env=False, timeout=30)


async def starvation(cluster: Cluster) -> None:
    sim = await start_fleet(cluster, STARVATION_PORT_BASE)
    names = {a.name for a in sim.agents}
    async with client(cluster) as http:
        try:
            digest = await upload(http)
            with DeviceWatch(http, names) as watch:
                start = time.monotonic()
                small: list[str] = []
                gang: dict[str, Any] = {}

                async def small_jobs() -> None:
                    for i in range(8):
                        await asyncio.sleep(max(0.0, start + i - time.monotonic()))
                        small.append(await submit(http, digest, 1, SMALL_RUN_S, max_runtime_seconds=6))

                async def the_gang() -> None:
                    # Half a second after the fourth small job, so all four slots are taken by then.
                    await asyncio.sleep(max(0.0, start + 3.5 - time.monotonic()))
                    gang["submitted"] = time.monotonic()
                    gang["id"] = await submit(http, digest, 4, 0.5)

                    async def running() -> bool:
                        return (await job(http, gang["id"]))["state"] in ("RUNNING", "SUCCEEDED")

                    await poll("the 4-worker job to run", running, timeout=15)
                    gang["running"] = time.monotonic()

                async def backfill() -> None:
                    # A slot frees at ~4 s; the reservation starts when the fourth small job's
                    # max_runtime ends (~9 s), so a job of at most 1 s fits in between.
                    await asyncio.sleep(max(0.0, start + 4.5 - time.monotonic()))
                    gang["backfill"] = await submit(http, digest, 1, 0.3, max_runtime_seconds=1)

                await asyncio.gather(small_jobs(), the_gang(), backfill())

            gang_started = first_start(sim, gang["id"])
            assert gang_started is not None
            wait = gang["running"] - gang["submitted"]
            assert wait <= SMALL_RUN_S + 2, f"the 4-worker job waited {wait:.1f} s"
            overtaking = [
                j
                for j in small
                if (s := first_start(sim, j)) is not None and gang["submitted"] <= s < gang_started
            ]
            assert not overtaking, f"{len(overtaking)} small jobs started while the 4-worker job waited"
            backfilled = first_start(sim, gang["backfill"])
            assert backfilled is not None and backfilled < gang_started, "the 1 s job was not backfilled"

            async def backfill_done() -> dict[str, Any] | None:
                state = await job(http, gang["backfill"])
                return state if state["state"] == "SUCCEEDED" else None

            await poll("the backfilled job to succeed", backfill_done, timeout=10)
            assert watch.polls > 10 and not watch.doubles, watch.doubles
            assert sim.devices_assigned_twice() == 0
        finally:
            await sim.close()


async def preemption(cluster: Cluster) -> None:
    sim = await start_fleet(cluster, PREEMPTION_PORT_BASE, stop_exit_code=42, stop_save_s=0.3)
    names = {a.name for a in sim.agents}
    async with client(cluster) as http:
        try:
            digest = await upload(http)
            with DeviceWatch(http, names) as watch:
                low = dict(priority=100, preemptible=True, preemption_grace_seconds=5)
                victim = await submit(http, digest, 4, 3.0, **low)

                async def victim_running() -> bool:
                    return len([t for t in tasks_of(sim, victim) if t.running_at]) == 4

                await poll("the low-priority gang to run", victim_running)
                younger = await submit(http, digest, 4, 0.5, **low)  # same priority, waits behind it
                await asyncio.sleep(0.5)  # the victim trains a little: it has steps to save
                high = await submit(http, digest, 2, 1.0, priority=900)

                async def ended(job_id: str) -> dict[str, Any] | None:
                    state = await job(http, job_id)
                    return state if state["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

                high_done = await poll("the high-priority job to end", lambda: ended(high))
                victim_done = await poll("the victim to run again and end", lambda: ended(victim))
                younger_done = await poll("the younger low job to end", lambda: ended(younger))

            assert high_done["state"] == "SUCCEEDED", high_done["reason"]
            assert victim_done["state"] == "SUCCEEDED", victim_done["reason"]
            assert younger_done["state"] == "SUCCEEDED", younger_done["reason"]
            states = [e["to_state"] for e in victim_done["events"]]
            assert "PREEMPTING" in states, states
            after = states[states.index("PREEMPTING") :]
            assert after[:2] == ["PREEMPTING", "PENDING"] and "RUNNING" in after, states
            released = next(e for e in victim_done["events"] if e["from_state"] == "PREEMPTING")
            assert "every worker saved a checkpoint" in released["reason"], released["reason"]

            first = [t for t in tasks_of(sim, victim) if t.attempt == 1]
            again = [t for t in tasks_of(sim, victim) if t.attempt == 2]
            assert len(first) == 4 and all(t.stop_received_at is not None for t in first), "whole gang"
            stops = [t.stop_received_at or 0 for t in first]
            assert max(stops) - min(stops) < 0.5, f"stops spread over {max(stops) - min(stops):.2f} s"
            assert {t.exit_code for t in first} == {42}
            assert len(again) == 4
            high_started = first_start(sim, high)
            assert high_started is not None and high_started >= max(t.ended_at or 0 for t in first)
            # It kept its place: placed again before the younger job of its priority.
            younger_started = first_start(sim, younger)
            assert younger_started is not None and min(t.started_at for t in again) < younger_started
            chief = next(t for t in again if t.index == 0)
            saved_chief = next(t for t in first if t.index == 0)
            assert chief.resumed_from_step == saved_chief.step_at_exit and chief.resumed_from_step > 0
            assert sim.progress.lost_steps[victim] == 0

            with sqlite3.connect(cluster.root / "data" / "mwms.db") as db:
                rows = db.execute(
                    "SELECT preemptor_job_id, cause, saved, ended_at FROM preemptions WHERE victim_job_id = ?",
                    (victim,),
                ).fetchall()
            assert [(r[0], r[1], r[2]) for r in rows] == [(high, "priority", 1)] and rows[0][3], rows
            assert watch.polls > 10 and not watch.doubles, watch.doubles
            assert sim.devices_assigned_twice() == 0
        finally:
            await sim.close()


def test_gang_is_not_starved_and_short_jobs_backfill(sharing_cluster: Cluster) -> None:
    asyncio.run(asyncio.wait_for(starvation(sharing_cluster), timeout=28))


def test_preemption_stops_the_whole_gang_which_saves_and_runs_again(sharing_cluster: Cluster) -> None:
    asyncio.run(asyncio.wait_for(preemption(sharing_cluster), timeout=28))
