"""Coordinator replicas (issue 19): failover, the scheduler's failover, commands across replicas, a kill
storm, and heartbeats with the roles split.

Real `mwms server --db-url postgresql+psycopg://...` processes on one throwaway PostgreSQL 15
(testkit/mwms_testkit/postgres_server.py, as bench/run.py --db postgres starts it) and simulated agents (testkit/mwms_testkit/simulator.py)
in this process, each with the replicas' addresses in its own order (the six orders of three, so a dead
replica's agents spread over both survivors) and moving to the next one when its stream breaks, as
`mwms agent --server a,b,c` does.

Three replicas ("both"), N agents spread over them, one after another:
  heartbeats          steady state: heartbeat round trips grouped by the replica each agent is on.
  commands            a 1-worker job pinned to an agent whose stream replica B holds, submitted and then
                      cancelled through replica A: POST's return -> the StartTask / StopTask's arrival.
  failover            kill -9 the replica holding the most agents (not the scheduler's leader): kill ->
                      each of its agents' next hello answered on a survivor; agents offline or lost.
  scheduler_failover  kill -9 the replica leading the scheduler, submit a 4-worker job through a survivor
                      at once: kill -> the last StartTask arrived.
  kill_storm          long-running 2-worker jobs streaming metric points; K kills of random replicas, each
                      restarted a few seconds later (2-3 stay up): restarts, attempts, double placements,
                      points lost or stored twice (metric_points against each task's acked seq).
Then, each on a fresh database, the same load on two set-ups:
  roles_split         one `--serve agents` replica holding every agent, one `--serve api` replica where ten
                      clients poll /agents, /jobs, /overview and /queue every 2 s each (as the dashboard
                      does, in a process of their own), 50 tasks streaming points and lines as fast as acks
                      allow (on 50 of the agents, simulated in another process): heartbeat round trips on
                      the agents-only replica.
  single_replica      the same on one `--serve both` replica (recorded, for comparison).
"Lost" is watched throughout: GET /api/v1/agents through a live API replica every 2 s (agents offline) and
`agents.lost_at` in the database every second.
Targets live here; results go to bench/results_replicas.json; exit status 1 when one is missed.
Usage: python bench/replicas.py [--quick] [--agents 1000 --kills 20] [--scenario failover ...] [--logs DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import itertools
import json
import multiprocessing
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

import httpx  # noqa: E402
import run as bench_run  # noqa: E402
import scale  # noqa: E402
from databases import BenchDatabase, bench_database  # noqa: E402

from mwms_testkit.replica_cluster import Replica  # noqa: E402
from mwms_testkit.simulator import SimAgent, SimConfig, Simulator, TelemetryPlan  # noqa: E402

THREE = ("heartbeats", "commands", "failover", "scheduler_failover", "kill_storm")
SCENARIOS = (*THREE, "roles_split", "single_replica")
TARGETS = [
    ("heartbeats", "heartbeat_rtt_p99_ms_worst_replica", 50, "<"),
    ("heartbeats", "agents_offline_max", 0, "=="),
    ("commands", "start_samples", 20, ">="),
    ("commands", "start_latency_p95_s", 1.0, "<="),
    ("commands", "stop_samples", 20, ">="),
    ("commands", "stop_latency_p95_s", 1.0, "<="),
    ("failover", "back_on_stream_p95_s", 5.0, "<="),
    ("failover", "back_on_stream_max_s", 10.0, "<="),
    ("failover", "agents_not_back", 0, "=="),
    ("failover", "agents_offline_max", 0, "=="),
    ("failover", "agents_lost_at_set", 0, "=="),
    ("scheduler_failover", "placed_after_kill_s", 3.0, "<="),
    ("kill_storm", "kills_done", None, ">="),  # target: --kills (filled in at start)
    ("kill_storm", "task_restarts", 0, "=="),
    ("kill_storm", "jobs_with_attempts_over_1", 0, "=="),
    ("kill_storm", "devices_assigned_twice", 0, "=="),
    ("kill_storm", "points_lost", 0, "=="),
    ("kill_storm", "points_duplicated", 0, "=="),
    ("kill_storm", "agents_offline_max", 0, "=="),
    ("kill_storm", "agents_lost_at_set", 0, "=="),
    ("roles_split", "heartbeat_rtt_p99_ms", 50, "<"),
    ("roles_split", "agents_offline_max", 0, "=="),
]
DASHBOARD_ENDPOINTS = ("/api/v1/agents", "/api/v1/jobs", "/api/v1/overview", "/api/v1/queue")
DASHBOARD_CLIENTS = 10
DASHBOARD_INTERVAL_S = 2.0
BACK_DEADLINE_S = 30.0
STORM_RUN = "forever"


@dataclass
class BenchReplica(Replica):
    """A replica with its role and name (`--serve`, `--replica-name`)."""

    serve: str = "both"
    replica_name: str = ""

    def server_args(self) -> list[str]:
        return [*super().server_args(), "--serve", self.serve, "--replica-name", self.replica_name]

    @property
    def up(self) -> bool:
        return self.server is not None and self.server.popen.poll() is None


class Plane:
    """Replicas on one database, the admin's REST clients to them, kills and restarts."""

    def __init__(self, root: Path, db_url: str) -> None:
        self.root = root
        self.db_url = db_url
        self.replicas: list[BenchReplica] = []
        self._clients: dict[str, httpx.AsyncClient] = {}
        # Shared by every replica: the REST API and the agents' credentials work on any of them.
        self.admin_token = "mwms_" + secrets.token_urlsafe(32)
        self.join_token = secrets.token_urlsafe(32)

    async def start(self, roles: list[tuple[str, str]]) -> None:
        """Starts (name, serve) replicas: the first alone (it runs the migrations), then the others."""
        for name, serve in roles:
            replica = BenchReplica(
                root=self.root / name,
                db_url=self.db_url,
                admin_token=self.admin_token,
                join_token=self.join_token,
                serve=serve,
                replica_name=name,
            )
            replica.root.mkdir(parents=True, exist_ok=True)
            self.replicas.append(replica)
        await asyncio.to_thread(self.replicas[0].start_server)
        await asyncio.gather(*(asyncio.to_thread(r.start_server) for r in self.replicas[1:]))

    def by_grpc(self) -> dict[str, BenchReplica]:
        return {r.grpc_address: r for r in self.replicas if r.serve != "api"}

    def api_replicas(self) -> list[BenchReplica]:
        return [r for r in self.replicas if r.up and r.serve != "agents"]

    def http(self, replica: BenchReplica) -> httpx.AsyncClient:
        client = self._clients.get(replica.replica_name)
        if client is None:
            client = self._clients[replica.replica_name] = httpx.AsyncClient(
                base_url=replica.api,
                headers={"Authorization": f"Bearer {self.admin_token}"},
                trust_env=False,
                timeout=60,
            )
        return client

    def any_http(self, avoid: BenchReplica | None = None) -> httpx.AsyncClient:
        choices = [r for r in self.api_replicas() if r is not avoid]
        return self.http(choices[0])

    async def kill(self, replica: BenchReplica) -> float:
        """kill -9; returns when it was sent (monotonic)."""
        killed_at = time.monotonic()
        await asyncio.to_thread(replica.kill)
        return killed_at

    async def restart(self, replica: BenchReplica) -> float:
        """Starts a killed replica again on its ports; returns how long until it was healthy."""
        start = time.monotonic()
        await asyncio.to_thread(replica.start_server)
        return time.monotonic() - start

    async def replicas_view(self) -> list[dict[str, Any]]:
        for replica in self.api_replicas():
            try:
                response = await self.http(replica).get("/api/v1/replicas", timeout=10)
                response.raise_for_status()
                return list(response.json())
            except httpx.HTTPError:
                continue
        return []

    async def loop_leader(self, loop: str) -> BenchReplica | None:
        """The live replica whose row says it leads `loop` (GET /api/v1/replicas)."""
        for row in await self.replicas_view():
            if row["alive"] and loop in row["loops"]:
                for replica in self.replicas:
                    if replica.replica_name == row["name"] and replica.up:
                        return replica
        return None

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        await asyncio.gather(
            *(asyncio.to_thread(r.server.stop) for r in self.replicas if r.server is not None)
        )

    def keep_logs(self, folder: Path | None, label: str) -> None:
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        for replica in self.replicas:
            if replica.server is not None and replica.server.log_path.exists():
                shutil.copyfile(
                    replica.server.log_path, folder / f"replicas-{label}-{replica.replica_name}.log"
                )


class LossWatch:
    """Agents offline (GET /api/v1/agents through a live API replica, every 2 s) and agents with
    `lost_at` set (the database, every second), as samples over time."""

    def __init__(self, plane: Plane, names: set[str]) -> None:
        from sqlalchemy import create_engine

        self.plane, self.names = plane, names
        self.engine = create_engine(plane.db_url, pool_size=1)
        self.offline: list[tuple[float, int]] = []
        self.lost: list[tuple[float, int]] = []
        self.lost_names: set[str] = set()
        # For each poll that showed agents offline: what the database held for them, counted by kind.
        self.offline_why: list[tuple[float, dict[str, int]]] = []
        self.errors = 0
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._poll_api()), asyncio.create_task(self._poll_db())]

    async def _poll_api(self) -> None:
        names = self.names
        while True:
            for replica in self.plane.api_replicas():
                try:
                    response = await self.plane.http(replica).get("/api/v1/agents", timeout=10)
                    response.raise_for_status()
                except httpx.HTTPError:
                    self.errors += 1
                    continue
                rows = response.json()
                shown = [a["name"] for a in rows if a["name"] in names and not a["online"]]
                at = time.monotonic()
                self.offline.append((at, len(shown)))
                if shown:
                    try:
                        kinds = await asyncio.to_thread(self._why_offline, shown)
                        self.offline_why.append((at, kinds))
                    except Exception:  # noqa: BLE001 - a diagnosis that fails leaves the count
                        self.errors += 1
                break
            await asyncio.sleep(2.0)

    def _why_offline(self, names: list[str]) -> dict[str, int]:
        """Agents shown offline, counted by where their stream is (no replica, or a replica by name and
        whether it still beats), how long ago their liveness ran out and how old their last heartbeat is."""
        from sqlalchemy import bindparam, text

        query = text(
            "SELECT r.name, EXTRACT(EPOCH FROM now() - a.online_until), "
            "EXTRACT(EPOCH FROM now() - a.last_heartbeat_at), EXTRACT(EPOCH FROM now() - r.seen_at), "
            "r.stopped_at IS NOT NULL FROM agents a LEFT JOIN replicas r ON r.id = a.stream_replica "
            "WHERE a.name IN :names"
        ).bindparams(bindparam("names", expanding=True))
        kinds: dict[str, int] = {}
        with self.engine.connect() as connection:
            for replica, lapsed, heard, beat, stopped in connection.execute(query, {"names": names}):
                if replica is None:
                    where = "no stream"
                elif stopped:
                    where = f"{replica} stopped"
                else:
                    where = f"{replica} beat {float(beat):.0f}s ago"
                kind = f"{where}; lapsed {float(lapsed or 0):.0f}s ago; heard {float(heard or 0):.0f}s ago"
                kinds[kind] = kinds.get(kind, 0) + 1
        return kinds

    def _lost_now(self) -> list[str]:
        from sqlalchemy import text

        with self.engine.connect() as connection:
            return list(
                connection.execute(text("SELECT name FROM agents WHERE lost_at IS NOT NULL")).scalars()
            )

    async def _poll_db(self) -> None:
        while True:
            try:
                names = await asyncio.to_thread(self._lost_now)
                self.lost.append((time.monotonic(), len(names)))
                self.lost_names.update(names)
            except Exception:  # noqa: BLE001 - a watch that fails once keeps watching
                self.errors += 1
            await asyncio.sleep(1.0)

    def figures(self, since: float, until: float) -> dict[str, Any]:
        offline = [n for at, n in self.offline if since <= at <= until]
        lost = [n for at, n in self.lost if since <= at <= until]
        return {
            "agents_offline_max": max(offline, default=None),
            "offline_polls": len(offline),
            # When agents read offline (seconds into the window) and how many: to tell which window it is.
            "offline_at_s": [
                (round(at - since, 1), n) for at, n in self.offline if since <= at <= until and n
            ],
            "offline_why": [
                (round(at - since, 1), kinds) for at, kinds in self.offline_why if since <= at <= until
            ],
            "agents_lost_at_set": max(lost, default=None),
            "lost_at_polls": len(lost),
        }

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.engine.dispose()


def seconds(values: list[float], p: float) -> float | None:
    value = scale.percentile(values, p)
    return None if value is None else round(value, 3)


def held_by(sim: Simulator, address: str) -> list[SimAgent]:
    """Agents whose stream is open on `address` now, its hello answered."""
    return [
        a
        for a in sim.agents
        if a.connected.is_set() and a.server == address and a.sessions and a.sessions[-1].answered_at
    ]


def back_at(agent: SimAgent, since: float) -> float | None:
    """When the agent's first stream opened after `since` was answered (its hello applied)."""
    for session in agent.sessions:
        if session.opened_at >= since and session.answered_at is not None:
            return session.answered_at
    return None


def all_back(sim: Simulator) -> bool:
    return all(a.connected.is_set() and a.sessions and a.sessions[-1].answered_at for a in sim.agents)


async def submit(
    http: httpx.AsyncClient, digest: str, workers: int, name: str, run_s: str = "forever", **spec: Any
) -> str:
    body = {
        "bundle_digest": digest,
        "command": ["python", "p.py", f"--sim-run-s={run_s}"],
        "workers": workers,
        "gpus_per_worker": 0,
        "name": name,
        "startup_timeout_seconds": scale.GANG_TIMEOUT_S,
        **spec,
    }
    response = await http.post("/api/v1/jobs", json=body, timeout=60)
    if response.status_code != 201:
        raise RuntimeError(f"submit refused: {response.status_code} {response.text}")
    return str(response.json()["id"])


async def cancel_all(http: httpx.AsyncClient, job_ids: list[str]) -> None:
    for job_id in job_ids:
        try:
            await http.post(f"/api/v1/jobs/{job_id}/cancel", timeout=30)
        except httpx.HTTPError:
            pass


async def until(predicate: Callable[[], Any], timeout_s: float, what: str, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        await asyncio.sleep(interval)


def job_arrivals(sim: Simulator, job_id: str) -> list[float]:
    """When each StartTask of the job arrived at its agent."""
    return [
        a.start_arrivals[t.task_id]
        for a in sim.agents
        for t in a.history.values()
        if t.job_id == job_id and t.task_id in a.start_arrivals
    ]


# -- three replicas ----------------------------------------------------------------------------------------


async def scenario_heartbeats(
    plane: Plane, sim: Simulator, watch: LossWatch, database: BenchDatabase, window_s: float
) -> dict:
    """Steady state: every agent's heartbeats over the window, grouped by the replica that answered."""
    cpu0 = cpu_snapshot(plane, database)
    start = time.monotonic()
    await asyncio.sleep(window_s)
    end = time.monotonic()
    cpu = cpu_figures(cpu0, cpu_snapshot(plane, database), end - start)
    await scale.drain_heartbeats(sim, end)
    names = {address: r.replica_name for address, r in plane.by_grpc().items()}
    per: dict[str, list[float]] = {}
    for agent in sim.agents:
        for (sent, rtt), server in zip(agent.heartbeats, agent.heartbeat_servers, strict=True):
            if start <= sent < end:
                per.setdefault(names.get(server, server), []).append(rtt)
    results: dict[str, Any] = {"window_s": end - start}
    worst = None
    for name, rtts in sorted(per.items()):
        p99 = scale.percentile(rtts, 99)
        results[f"{name}_heartbeats"] = len(rtts)
        results[f"{name}_heartbeat_rtt_p50_ms"] = round(1000 * (scale.percentile(rtts, 50) or 0), 2)
        results[f"{name}_heartbeat_rtt_p99_ms"] = round(1000 * (p99 or 0), 2)
        worst = max(worst or 0.0, 1000 * (p99 or 0))
    results["heartbeat_rtt_p99_ms_worst_replica"] = None if worst is None else round(worst, 2)
    results["heartbeats_unanswered"] = sim.unanswered(end, since=start)
    results["cpu"] = cpu
    results |= {k: v for k, v in scale.heartbeat_figures(sim, start, end).items() if "loop_lag" in k}
    results |= watch.figures(start, time.monotonic())
    return results


async def scenario_commands(plane: Plane, sim: Simulator, digest: str, samples: int) -> dict:
    """Jobs pinned to agents on replica B, submitted and cancelled through replica A (not the scheduler's
    leader, when one can be chosen); then a few submitted through the leader, for comparison."""
    held = {address: held_by(sim, address) for address in plane.by_grpc()}
    leader = await plane.loop_leader("scheduler")
    b_address = max(held, key=lambda address: len(held[address]))
    b = plane.by_grpc()[b_address]
    others = [r for r in plane.api_replicas() if r is not b]
    a = next((r for r in others if r is not leader), others[0])
    idle = [agent for agent in held[b_address] if not agent.tasks]
    starts, stops = await start_and_cancel(plane.http(a), sim, digest, idle[:samples], "across")
    results = {
        "decided_on": a.replica_name,
        "agents_on": b.replica_name,
        "scheduler_leader": leader.replica_name if leader else None,
        "start_samples": len(starts),
        "start_latency_p50_s": seconds(starts, 50),
        "start_latency_p95_s": seconds(starts, 95),
        "start_latency_max_s": seconds(starts, 100),
        "stop_samples": len(stops),
        "stop_latency_p50_s": seconds(stops, 50),
        "stop_latency_p95_s": seconds(stops, 95),
        "stop_latency_max_s": seconds(stops, 100),
        "stop_latency_min_s": seconds(stops, 0),
    }
    if leader is not None and leader is not a:
        via_leader, _ = await start_and_cancel(
            plane.http(leader), sim, digest, idle[samples : samples + 5], "via-leader"
        )
        results["start_latency_via_leader_samples"] = len(via_leader)
        results["start_latency_via_leader_p50_s"] = seconds(via_leader, 50)
        results["start_latency_via_leader_max_s"] = seconds(via_leader, 100)
    return results


async def start_and_cancel(
    http: httpx.AsyncClient, sim: Simulator, digest: str, agents: list[SimAgent], label: str
) -> tuple[list[float], list[float]]:
    """One 1-worker job pinned to each agent in turn, submitted and (once RUNNING) cancelled through
    `http`: seconds from each POST's return to the StartTask's and the StopTask's arrival at the agent."""
    starts: list[float] = []
    stops: list[float] = []
    for number, agent in enumerate(agents):
        job_id = await submit(http, digest, 1, f"bench-command-{label}-{number}", agents=[agent.name])
        returned = time.monotonic()
        arrivals = await until(lambda j=job_id: job_arrivals(sim, j), 10, f"StartTask of {job_id}")
        starts.append(arrivals[0] - returned)
        task = next(t for t in agent.history.values() if t.job_id == job_id)
        await until(lambda t=task: t.running_at, 10, f"{job_id} running on the agent")
        while (await http.get(f"/api/v1/jobs/{job_id}", timeout=30)).json()["state"] != "RUNNING":
            await asyncio.sleep(0.05)
        response = await http.post(f"/api/v1/jobs/{job_id}/cancel", timeout=30)
        response.raise_for_status()
        returned = time.monotonic()
        await until(lambda t=task: t.stop_received_at, 10, f"StopTask of {job_id}")
        stops.append((task.stop_received_at or returned) - returned)
    return starts, stops


def cpu_snapshot(plane: Plane, database: BenchDatabase, fleet_pids: Iterable[int] = ()) -> dict[str, float]:
    """CPU seconds so far of each live replica, the PostgreSQL server (its backends), this process and
    the fleet processes simulating agents."""
    snapshot = {
        r.replica_name: scale.cpu_seconds(r.server.popen.pid) for r in plane.replicas if r.up and r.server
    }
    if database.pid:
        snapshot["postgres"] = scale.process_tree_cpu_seconds(database.pid)
    snapshot["simulator"] = scale.cpu_seconds("self")
    if fleet_pids:
        snapshot["fleet_processes"] = sum(scale.cpu_seconds(pid) for pid in fleet_pids)
    snapshot["machine"] = scale.machine_busy_seconds()
    return snapshot


def cpu_figures(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, float]:
    """% of one core each process used between two snapshots; `other_processes`: the rest of the machine
    (other engineers' tests and benchmarks on a shared machine make every figure worse)."""
    used = {name: after[name] - before[name] for name in before if name in after}
    machine = used.pop("machine", 0.0)
    used["other_processes"] = max(0.0, machine - sum(used.values()))
    return {f"{name}_cpu_pct": round(100 * spent / wall_s, 1) for name, spent in used.items()}


def py_spy(pids: dict[str, int], folder: Path | None, label: str, seconds_: int) -> list[Any]:
    """Starts `py-spy record` (raw, collapsed stacks) on each pid when a folder is given; returns the processes."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if folder is None or not Path(spy).exists():
        return []
    folder.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                spy,
                "record",
                "-p",
                str(pid),
                "-d",
                str(seconds_),
                "-r",
                "50",
                "--nonblocking",
                "-f",
                "raw",
            ]
            + ["-o", str(folder / f"{label}-{name}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]


async def scenario_failover(
    plane: Plane, sim: Simulator, watch: LossWatch, database: BenchDatabase, profile: Path | None
) -> dict:
    """kill -9 the replica holding the most agents (not the scheduler's leader); its agents back."""
    leader = await plane.loop_leader("scheduler")
    candidates = [r for r in plane.by_grpc().values() if r.up and r is not leader]
    victim = max(candidates, key=lambda r: len(held_by(sim, r.grpc_address)))
    agents = held_by(sim, victim.grpc_address)
    errors_before = sum(len(a.register_errors) for a in sim.agents)
    reset_statements(plane.db_url)
    survivors = {r.replica_name: r.server.popen.pid for r in plane.replicas if r is not victim and r.server}
    cpu0 = cpu_snapshot(plane, database)
    killed_at = await plane.kill(victim)
    spies = py_spy(survivors, profile, "failover", 12)
    with_deadline = time.monotonic() + BACK_DEADLINE_S
    while time.monotonic() < with_deadline and not all(back_at(a, killed_at) for a in agents):
        await asyncio.sleep(0.05)
    cpu = cpu_figures(cpu0, cpu_snapshot(plane, database), time.monotonic() - killed_at)
    statements = database.top_statements(plane.db_url, limit=6)
    for spy in spies:
        await asyncio.to_thread(spy.wait)
    times = [at - killed_at for a in agents if (at := back_at(a, killed_at)) is not None]
    # When each noticed (its stream to the killed replica ended) and when it had registered again.
    noticed = [
        s.ended_at - killed_at
        for a in agents
        for s in a.sessions
        if s.server == victim.grpc_address and s.ended_at and s.ended_at >= killed_at
    ]
    opened = [
        s.opened_at - killed_at
        for a in agents
        for s in a.sessions
        if s.opened_at >= killed_at and s.answered_at
    ]
    names = {address: r.replica_name for address, r in plane.by_grpc().items()}
    moved: dict[str, int] = {}
    for agent in agents:
        if back_at(agent, killed_at) is not None:
            where = names.get(agent.server, agent.server)
            moved[where] = moved.get(where, 0) + 1
    await asyncio.sleep(3)  # the watch sees the survivors' view after the move
    results = {
        "killed": victim.replica_name,
        "agents_total": len(sim.agents),
        "agents_held_by_killed": len(agents),
        "agents_back": len(times),
        "agents_not_back": len(agents) - len(times),
        "back_on_stream_p50_s": seconds(times, 50),
        "back_on_stream_p95_s": seconds(times, 95),
        "back_on_stream_max_s": seconds(times, 100),
        "break_noticed_p95_s": seconds(noticed, 95),
        "registered_again_p50_s": seconds(opened, 50),
        "registered_again_p95_s": seconds(opened, 95),
        "moved_to": moved,
        "register_errors_during": sum(len(a.register_errors) for a in sim.agents) - errors_before,
        # From the kill until every agent was back (or the deadline): who had the CPU, what the database ran.
        "cpu_until_back": cpu,
        "database_top_statements": statements,
    }
    results |= watch.figures(killed_at, time.monotonic())
    results["restart_s"] = await plane.restart(victim)
    return results


async def scenario_scheduler_failover(plane: Plane, sim: Simulator, digest: str, watch: LossWatch) -> dict:
    """kill -9 the scheduler's leader, submit a 4-worker job through a survivor at once."""
    leader = await plane.loop_leader("scheduler")
    if leader is None:
        raise RuntimeError("no replica says it leads the scheduler (GET /api/v1/replicas)")
    survivor = next(r for r in plane.api_replicas() if r is not leader)
    http = plane.http(survivor)
    held_agents = held_by(sim, leader.grpc_address)
    held = len(held_agents)
    killed_at = await plane.kill(leader)
    job_id = await submit(http, digest, 4, "bench-after-scheduler-kill")
    returned = time.monotonic()
    arrivals = await until(
        lambda: len(job_arrivals(sim, job_id)) >= 4 and job_arrivals(sim, job_id), 60, "placed"
    )
    on_moving = [a for a in held_agents if any(t.job_id == job_id for t in a.history.values())]
    new_leader = None
    deadline = time.monotonic() + 15
    while new_leader is None and time.monotonic() < deadline:
        new_leader = await plane.loop_leader("scheduler")
        await asyncio.sleep(0.2)
    await cancel_all(http, [job_id])
    results = {
        "killed": leader.replica_name,
        "agents_held_by_killed": held,
        "submitted_through": survivor.replica_name,
        "submit_returned_after_kill_s": round(returned - killed_at, 3),
        "first_start_after_kill_s": round(min(arrivals) - killed_at, 3),
        "placed_after_kill_s": round(max(arrivals) - killed_at, 3),
        # Workers placed on agents whose stream was on the killed replica (their StartTask waits for the
        # agent's hello on a survivor).
        "workers_on_agents_of_killed": len(on_moving),
        "start_after_kill_s": sorted(round(t - killed_at, 3) for t in arrivals),
        "new_leader": new_leader.replica_name if new_leader else None,
    }
    results |= watch.figures(killed_at, time.monotonic())
    results["restart_s"] = await plane.restart(leader)
    return results


async def scenario_kill_storm(
    plane: Plane,
    sim: Simulator,
    digest: str,
    watch: LossWatch,
    kills: int,
    jobs: int,
    points_per_s: float,
    restart_after_s: float,
    seed: int = 19,
) -> dict:
    """Streaming long-running jobs through `kills` kills of random replicas, each restarted later."""
    rng = random.Random(seed)
    http = plane.any_http()
    plan = TelemetryPlan(metric_points_per_s=points_per_s, log_lines_per_s=0)
    for agent in sim.agents:
        agent.telemetry = plan
    job_ids = [await submit(http, digest, 2, f"bench-storm-{i}", STORM_RUN) for i in range(jobs)]
    await until(
        lambda: sum(1 for t in sim.tasks() if t.job_id in job_ids and t.running_at) >= 2 * jobs,
        120,
        "running",
    )
    for agent in sim.agents:
        agent.telemetry = None  # only the storm's tasks stream
    started = time.monotonic()
    restart_times: list[float] = []
    victims: list[str] = []
    moved: list[tuple[float, list[SimAgent]]] = []
    for _ in range(kills):
        # One replica down at a time: killed, `restart_after_s` later started again (healthy), then the next.
        victim = rng.choice(plane.replicas)
        moved.append((await plane.kill(victim), held_by(sim, victim.grpc_address)))
        victims.append(victim.replica_name)
        await asyncio.sleep(restart_after_s)
        restart_times.append(await plane.restart(victim))
        await asyncio.sleep(0.5)
    storm_s = time.monotonic() - started
    settled = True
    try:
        await until(lambda: all_back(sim), BACK_DEADLINE_S, "every agent on a stream again", interval=0.1)
    except TimeoutError:
        settled = False
    failovers = [
        at - killed_at for killed_at, agents in moved for a in agents if (at := back_at(a, killed_at))
    ]
    await asyncio.sleep(3)
    plan.metric_points_per_s = 0  # the producers stop; what is in flight is acked
    tasks = [t for t in sim.tasks() if t.job_id in job_ids]
    drained = True
    try:
        await until(lambda: all(t.acked_metric_seq >= t.sent_metric_seq for t in tasks), 60, "drained", 0.1)
    except TimeoutError:
        drained = False
    states = [(await http.get(f"/api/v1/jobs/{j}", timeout=30)).json() for j in job_ids]
    points = await asyncio.to_thread(
        stored_points, plane.db_url, {t.task_id: t.acked_metric_seq for t in tasks}
    )
    lost = duplicated = beyond = 0
    for task in tasks:
        count, distinct, up_to_acked, highest = points[task.task_id]
        lost += task.acked_metric_seq - up_to_acked
        duplicated += count - distinct
        beyond += max(0, highest - task.acked_metric_seq)
    results = {
        "kills_done": len(victims),
        "killed": victims,
        "killed_at_s": [round(killed_at - started, 1) for killed_at, _ in moved],
        "storm_s": round(storm_s, 1),
        "restart_s_max": round(max(restart_times, default=0), 2),
        "jobs": jobs,
        "tasks_started": len(tasks),
        "tasks_stopped": sum(1 for t in tasks if t.stopped),
        "task_restarts": sum(int(s["restarts"]) for s in states),
        "jobs_with_attempts_over_1": sum(1 for s in states if int(s["attempts"]) > 1),
        "jobs_not_running": sum(1 for s in states if s["state"] != "RUNNING"),
        "devices_assigned_twice": sim.devices_assigned_twice(),
        "points_acked": sum(t.acked_metric_seq for t in tasks),
        "points_lost": lost,
        "points_duplicated": duplicated,
        "points_stored_beyond_acked": beyond,
        "points_rejected": sum(t.rejected for t in tasks),
        "drained": drained,
        "all_agents_back": settled,
        "failover_samples": len(failovers),
        "failover_agents_held": sum(len(agents) for _, agents in moved),
        "failover_p95_s": seconds(failovers, 95),
        "failover_max_s": seconds(failovers, 100),
    }
    results |= watch.figures(started, time.monotonic())
    results["lost_agents"] = agent_stories(sim, watch.lost_names, started)
    return results


def agent_stories(sim: Simulator, names: set[str], since: float) -> dict[str, dict[str, Any]]:
    """What the simulator saw of each named agent (those marked lost): its streams (seconds from `since`)
    and errors, to tell an agent that could not reconnect from one the coordinator misjudged."""
    stories: dict[str, dict[str, Any]] = {}
    for agent in sim.agents:
        if agent.name not in names:
            continue
        stories[agent.name] = {
            "sessions": [
                (
                    s.server,
                    round(s.opened_at - since, 1),
                    None if s.answered_at is None else round(s.answered_at - since, 1),
                    None if s.ended_at is None else round(s.ended_at - since, 1),
                    s.error,
                )
                for s in agent.sessions
                if (s.ended_at or time.monotonic()) >= since
            ],
            "register_errors": agent.register_errors[-5:],
            "stream_errors": agent.stream_errors[-5:],
            "last_heartbeat_s": round(agent.heartbeats[-1][0] - since, 1) if agent.heartbeats else None,
        }
    return stories


def stored_points(url: str, acked: dict[str, int]) -> dict[str, tuple[int, int, int, int]]:
    """Per task id: its rows in metric_points, distinct seqs, distinct seqs in 1..acked, highest seq.

    Every acked point stored exactly once: rows = distinct = distinct in 1..acked = acked."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    query = text(
        "SELECT count(*), count(DISTINCT seq), count(DISTINCT seq) FILTER (WHERE seq BETWEEN 1 AND :acked), "
        "coalesce(max(seq), 0) FROM metric_points WHERE task_id = :task_id"
    )
    found = {}
    try:
        with engine.connect() as connection:
            for task_id, seq in acked.items():
                row = connection.execute(query, {"task_id": task_id, "acked": seq}).one()
                found[task_id] = (int(row[0]), int(row[1]), int(row[2]), int(row[3]))
    finally:
        engine.dispose()
    return found


def server_orders(addresses: list[str]) -> Callable[[int], list[str]]:
    """Agent i's replica order: the i-th of every order of the addresses (each replica first for 1/n)."""
    orders = [list(order) for order in itertools.permutations(addresses)]
    return lambda i: orders[i % len(orders)]


async def start_fleet(plane: Plane, agents: int, config: SimConfig, results: dict[str, Any]) -> Simulator:
    addresses = [r.grpc_address for r in plane.replicas if r.serve != "api"]
    sim = Simulator(
        config, agents, run_id=str(int(time.time()) % 100000), server_order=server_orders(addresses)
    )
    start = time.monotonic()
    await sim.register_all()
    results["register_all_s"] = round(time.monotonic() - start, 2)
    results["register_retries"] = sum(len(a.register_errors) for a in sim.agents)
    start = time.monotonic()
    await sim.connect_all(timeout_s=300)
    results["connect_all_s"] = round(time.monotonic() - start, 2)
    scale.quiet_collector()
    return sim


def reset_statements(url: str) -> None:
    """Zeroes pg_stat_statements, so the next top_statements covers only what follows."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_stat_statements_reset()"))
            connection.commit()
    finally:
        engine.dispose()


Record = Callable[[str, dict[str, Any], tuple[float, float, float]], None]


async def three_replicas(
    args: argparse.Namespace, database: BenchDatabase, root: Path, chosen: list[str], record: Record
) -> None:
    """The scenarios on three `--serve both` replicas, one fleet throughout; `record`s each one's figures."""
    db_url = database.fresh("replicas_three")
    assert db_url is not None
    plane = Plane(root, db_url)
    out: dict[str, dict[str, Any]] = {}
    sim: Simulator | None = None
    watch: LossWatch | None = None
    try:
        started = time.monotonic()
        await plane.start([("replica-1", "both"), ("replica-2", "both"), ("replica-3", "both")])
        setup: dict[str, Any] = {"replicas_start_s": round(time.monotonic() - started, 2)}
        config = SimConfig(
            join_token=plane.join_token,
            server=",".join(r.grpc_address for r in plane.replicas),
            task_run_s=None,
        )
        sim = await start_fleet(plane, args.agents, config, setup)
        watch = LossWatch(plane, {a.name for a in sim.agents})
        watch.start()
        digest = await scale.upload_bundle(plane.any_http())
        await asyncio.sleep(args.settle_s)
        runs: list[tuple[str, Callable[[], Any]]] = [
            ("heartbeats", lambda: scenario_heartbeats(plane, sim, watch, database, args.window_s)),
            ("commands", lambda: scenario_commands(plane, sim, digest, args.samples)),
            ("failover", lambda: scenario_failover(plane, sim, watch, database, args.py_spy)),
            ("scheduler_failover", lambda: scenario_scheduler_failover(plane, sim, digest, watch)),
            (
                "kill_storm",
                lambda: scenario_kill_storm(
                    plane,
                    sim,
                    digest,
                    watch,
                    args.kills,
                    args.storm_jobs,
                    args.points_per_s,
                    args.restart_after_s,
                ),
            ),
        ]
        for name, coroutine in runs:
            if name not in chosen:
                continue
            print(f"--- {name} (3 replicas, {args.agents} agents)", file=sys.stderr, flush=True)
            begun, load = time.monotonic(), os.getloadavg()
            try:
                out[name] = dict(setup) | await coroutine()
            except Exception as error:  # noqa: BLE001 - a scenario that breaks is a result too
                print(f"scenario {name} failed: {type(error).__name__}: {error}", file=sys.stderr)
                out[name] = dict(setup) | {"error": f"{type(error).__name__}: {error}"}
            out[name]["scenario_wall_s"] = round(time.monotonic() - begun, 1)
            out[name]["agents"] = args.agents
            await until(lambda: all(r.up for r in plane.replicas), 60, "replicas up", interval=0.1)
            try:
                await until(lambda: all_back(sim), BACK_DEADLINE_S, "agents back", interval=0.1)
            except TimeoutError:
                out[name]["agents_not_back_after"] = sum(
                    1 for a in sim.agents if not (a.connected.is_set() and a.sessions[-1].answered_at)
                )
            out[name]["lost_at_names_so_far"] = sorted(watch.lost_names)[:10]
            record(name, out[name], load)
    finally:
        if watch is not None:
            await watch.stop()
        if sim is not None:
            await sim.close()
        await plane.close()
        plane.keep_logs(args.logs, "three")


# -- roles split and one replica ---------------------------------------------------------------------------


def poll_dashboards(api: str, token: str, clients: int, seconds_: float) -> list[tuple[float, str, float]]:
    """Ten open dashboards for `seconds_`, in a process of its own (so their JSON does not slow the
    simulator's loop): each polls every endpoint every DASHBOARD_INTERVAL_S, clients spread over the
    interval. Returns (unix time, endpoint, seconds or -1 for an error) per request."""

    async def one(client: httpx.AsyncClient, offset_s: float, until_unix: float, out: list) -> None:
        await asyncio.sleep(offset_s)
        while time.time() < until_unix:
            begun = time.monotonic()
            for endpoint in DASHBOARD_ENDPOINTS:
                start = time.monotonic()
                try:
                    response = await client.get(endpoint, timeout=30)
                    response.raise_for_status()
                    out.append((time.time(), endpoint, time.monotonic() - start))
                except httpx.HTTPError:
                    out.append((time.time(), endpoint, -1.0))
            await asyncio.sleep(max(0.0, DASHBOARD_INTERVAL_S - (time.monotonic() - begun)))

    async def every() -> list[tuple[float, str, float]]:
        out: list[tuple[float, str, float]] = []
        until_unix = time.time() + seconds_
        headers = {"Authorization": f"Bearer {token}"}
        pool = [httpx.AsyncClient(base_url=api, headers=headers, trust_env=False) for _ in range(clients)]
        try:
            await asyncio.gather(
                *(one(c, i * DASHBOARD_INTERVAL_S / clients, until_unix, out) for i, c in enumerate(pool))
            )
        finally:
            for client in pool:
                await client.aclose()
        return out

    return asyncio.run(every())


INGEST_PORT_BASE = 32_000  # the ingest fleet's ports, clear of the idle fleets' (20,000 + 10 per agent)


def fleet_process(
    server: str, join_token: str, run_id: str, count: int, port_base: int, stream: bool, stop: Any, out: Any
) -> None:
    """`count` simulated agents in a process of their own, so that no event loop of the bench carries
    more agents than it can answer in time (a loop 300 ms late reads as a 300 ms heartbeat). `stream`:
    every task started on them streams points and lines as fast as acks allow. Runs until `stop` is set,
    then lets heartbeats written before it be answered (15 s at most) and puts on `out`: samples
    (monotonic seconds, items acked so far), every answered heartbeat (sent, round trip), the send times
    of those still unanswered, and this loop's lag, all on CLOCK_MONOTONIC, which the machine's
    processes share."""

    async def run() -> dict[str, Any]:
        config = SimConfig(join_token=join_token, server=server, task_run_s=None, port_base=port_base)
        sim = Simulator(config, count, run_id=run_id)
        plan = TelemetryPlan(metric_points_per_s=None, log_lines_per_s=None)
        if stream:
            for agent in sim.agents:
                agent.telemetry = plan
        samples: list[tuple[float, int]] = []
        try:
            await sim.register_all()
            await sim.connect_all(timeout_s=300)
            scale.quiet_collector()
            while not stop.is_set():
                acked = sum(t.acked_metric_seq + t.acked_log_seq for t in sim.tasks())
                samples.append((time.monotonic(), acked))
                await asyncio.sleep(0.25)
            plan.metric_points_per_s = plan.log_lines_per_s = 0
            await scale.drain_heartbeats(sim, time.monotonic())
            return {
                "samples": samples,
                "heartbeats": [h for a in sim.agents for h in a.heartbeats],
                "unanswered": [sent for a in sim.agents for sent in a._pending_heartbeats],
                "lags": sim.lag.lags,
            }
        finally:
            await sim.close()

    try:
        out.put(asyncio.run(run()))
    except Exception as error:  # noqa: BLE001 - the parent reports it
        out.put({"error": f"{type(error).__name__}: {error}"})


def fleet_heartbeats(results: list[dict[str, Any]], since: float, until: float) -> dict[str, Any]:
    """Heartbeat round trips of fleet processes in [since, until); one never answered counts as endless."""
    rtts = [rtt for r in results for sent, rtt in r["heartbeats"] if since <= sent < until]
    unanswered = sum(1 for r in results for sent in r["unanswered"] if since <= sent < until)
    everything = rtts + [float("inf")] * unanswered
    lags = [lag for r in results for at, lag in r["lags"] if since <= at < until]

    def ms(value: float | None) -> float | None:
        return None if value is None or value == float("inf") else round(1000 * value, 2)

    return {
        "heartbeat_rtt_p50_ms": ms(scale.percentile(everything, 50)),
        "heartbeat_rtt_p99_ms": ms(scale.percentile(everything, 99)),
        "heartbeat_rtt_max_ms": ms(max(everything, default=None)),
        "heartbeats_acked": len(rtts),
        "heartbeats_unanswered": unanswered,
        "simulator_loop_lag_p99_ms": ms(scale.percentile(lags, 99)),
    }


def acked_at(samples: list[tuple[float, int]], at: float) -> int:
    """Items acked by `at`, from the ingest fleet's samples (the last sample at or before it)."""
    return max((acked for when, acked in samples if when <= at), default=0)


async def api_names_online(http: httpx.AsyncClient, names: set[str]) -> bool:
    response = await http.get("/api/v1/agents", timeout=60)
    response.raise_for_status()
    return names <= {a["name"] for a in response.json() if a["online"]}


async def all_running(http: httpx.AsyncClient, job_ids: list[str]) -> bool:
    for job_id in job_ids:
        response = await http.get(f"/api/v1/jobs/{job_id}", timeout=30)
        if response.json()["state"] != "RUNNING":
            return False
    return True


async def wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        await asyncio.sleep(0.5)


async def loaded_plane(
    args: argparse.Namespace, database: BenchDatabase, db_url: str, root: Path, roles: list[tuple[str, str]]
) -> dict:
    """N agents on the agents replica, simulated in --fleet-processes processes (the tasks streaming at full
    rate on `ingest_tasks` of them, in one more), ten dashboards polling the API replica for the window
    (another process): heartbeat round trips of the idle agents and of the streaming ones, poll latencies,
    ingest rate, CPU of each replica."""
    plane = Plane(root, db_url)
    results: dict[str, Any] = {"replicas": [f"{n} ({s})" for n, s in roles], "agents": args.agents}
    watch: LossWatch | None = None
    phases: dict[str, float] = {}
    mark = time.monotonic()
    context = multiprocessing.get_context("spawn")
    stop_fleets = context.Event()
    fleets: list[tuple[Any, Any]] = []  # (process, its result queue); the ingest fleet last

    def phase(name: str) -> None:
        nonlocal mark
        phases[name] = round(time.monotonic() - mark, 1)
        mark = time.monotonic()

    def spawn(run_id: str, count: int, port_base: int, stream: bool) -> list[str]:
        out = context.Queue()
        process = context.Process(
            target=fleet_process,
            args=(
                agents_replica.grpc_address,
                plane.join_token,
                run_id,
                count,
                port_base,
                stream,
                stop_fleets,
                out,
            ),
            daemon=True,
        )
        process.start()
        fleets.append((process, out))
        return [f"sim-{run_id}-{i:05d}" for i in range(count)]

    try:
        await plane.start(roles)
        phase("start_s")
        agents_replica = next(r for r in plane.replicas if r.serve != "api")
        api_replica = next(r for r in plane.replicas if r.serve != "agents")
        stamp = int(time.time()) % 100000
        idle = args.agents - args.ingest_tasks
        per = -(-idle // args.fleet_processes)
        idle_names: list[str] = []
        for number, first in enumerate(range(0, idle, per)):
            count = min(per, idle - first)
            idle_names += spawn(f"idle{number}x{stamp}", count, 20_000 + 10 * first, stream=False)
        names = spawn(f"ingest{stamp}", args.ingest_tasks, INGEST_PORT_BASE, stream=True)
        results["fleet_processes"] = len(fleets)
        http = plane.http(api_replica)
        everyone = set(idle_names) | set(names)
        await wait_for(lambda: api_names_online(http, everyone), 300, "every simulated agent online")
        phase("fleet_s")
        watch = LossWatch(plane, everyone)
        watch.start()
        digest = await scale.upload_bundle(http)
        job_ids = list(
            await asyncio.gather(
                *(submit(http, digest, 1, f"bench-ingest-{i}", agents=[n]) for i, n in enumerate(names))
            )
        )
        await wait_for(lambda: all_running(http, job_ids), 120, "the ingest tasks running")
        phase("submit_and_running_s")
        warmup_s = 3.0
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
            polls = asyncio.get_running_loop().run_in_executor(
                pool,
                poll_dashboards,
                api_replica.api,
                plane.admin_token,
                DASHBOARD_CLIENTS,
                warmup_s + args.window_s + 1,
            )
            await asyncio.sleep(warmup_s)  # the child started and its pollers are in step
            pids = [process.pid for process, _ in fleets]
            cpu0 = cpu_snapshot(plane, database, pids)
            start, start_unix = time.monotonic(), time.time()
            await asyncio.sleep(args.window_s)
            end, end_unix = time.monotonic(), time.time()
            results["cpu"] = cpu_figures(cpu0, cpu_snapshot(plane, database, pids), end - start)
            requests = await polls
        stop_fleets.set()
        answers = []
        for _, out in fleets:
            answers.append(await asyncio.get_running_loop().run_in_executor(None, out.get, True, 120))
        failed = [a["error"] for a in answers if "error" in a]
        if failed:
            raise RuntimeError(f"a fleet process failed: {failed[0]}")
        *idle_answers, ingest = answers
        results |= fleet_heartbeats(idle_answers, start, end)
        results |= {
            f"streaming_{k}": v
            for k, v in fleet_heartbeats([ingest], start, end).items()
            if k.startswith("heartbeat_rtt") or k.startswith("simulator")
        }
        acked = acked_at(ingest["samples"], end) - acked_at(ingest["samples"], start)
        results["ingest_items_per_s"] = round(acked / (end - start))
        window = [(endpoint, took) for at, endpoint, took in requests if start_unix <= at <= end_unix]
        for endpoint in DASHBOARD_ENDPOINTS:
            key = endpoint.removeprefix("/api/v1/")
            took = [t for e, t in window if e == endpoint and t >= 0]
            results[f"poll_{key}_p50_ms"] = round(1000 * (scale.percentile(took, 50) or 0), 1)
            results[f"poll_{key}_p99_ms"] = round(1000 * (scale.percentile(took, 99) or 0), 1)
        results["polls"] = sum(1 for _, t in window if t >= 0)
        results["poll_errors"] = sum(1 for _, t in window if t < 0)
        results |= watch.figures(start, time.monotonic())
        phase("window_and_drain_s")
    finally:
        stop_fleets.set()
        for process, _ in fleets:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
        if watch is not None:
            await watch.stop()
        await plane.close()
        phase("stop_s")
        results["phases"] = phases
        plane.keep_logs(args.logs, roles[0][0])
    return results


# -- running -----------------------------------------------------------------------------------------------


def report(scenarios: dict[str, dict[str, Any]], kills: int) -> list[str]:
    """Prints every figure that has a target beside it (✔ met, ✘ missed); returns the missed ones."""
    missed = []
    print(f"\n{'scenario':<19} {'figure':<36} {'measured':>10}  target")
    for name, key, target, op in TARGETS:
        if name not in scenarios:
            continue
        target = kills if target is None else target
        value = scenarios[name].get(key)
        ok = bench_run.meets(value, target, op)
        shown = f"{value:,.3f}" if isinstance(value, float) else str(value)
        print(f"{name:<19} {key:<36} {shown:>10}  {op} {target}  {'✔' if ok else '✘'}")
        if not ok:
            missed.append(f"{name}.{key}: {shown} (target {op} {target})")
    single = scenarios.get("single_replica", {})
    if single:
        for key in ("heartbeat_rtt_p99_ms", "streaming_heartbeat_rtt_p99_ms", "ingest_items_per_s"):
            print(f"{'single_replica':<19} {key:<36} {single.get(key)!s:>10}  recorded (compare roles_split)")
    return missed


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="repeatable; default: all")
    parser.add_argument(
        "--quick", action="store_true", help="300 agents, 5 kills, 10 s windows (development)"
    )
    parser.add_argument("--agents", type=int, help="simulated agents (default 1000, --quick 300)")
    parser.add_argument("--kills", type=int, help="kills in the storm (default 20, --quick 5)")
    parser.add_argument("--samples", type=int, default=20, help="jobs started and cancelled across replicas")
    parser.add_argument("--window-s", type=float, help="heartbeat windows (default 20, --quick 10)")
    parser.add_argument("--settle-s", type=float, default=5.0, help="after connecting, before measuring")
    parser.add_argument("--storm-jobs", type=int, default=20, help="2-worker streaming jobs in the storm")
    parser.add_argument("--points-per-s", type=float, default=100, help="metric points per storm task")
    parser.add_argument("--restart-after-s", type=float, default=2.0, help="a killed replica's downtime")
    parser.add_argument("--ingest-tasks", type=int, default=50, help="full-rate streaming tasks (roles)")
    parser.add_argument(
        "--fleet-processes", type=int, default=4, help="processes simulating the idle agents (roles)"
    )
    parser.add_argument("--logs", type=Path, help="keep every replica's log in this folder")
    parser.add_argument(
        "--py-spy", type=Path, help="py-spy record the survivors of `failover` into this folder"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results_replicas.json")
    args = parser.parse_args()
    args.agents = args.agents or (300 if args.quick else 1000)
    args.kills = args.kills if args.kills is not None else (5 if args.quick else 20)
    args.window_s = args.window_s or (10.0 if args.quick else 20.0)
    chosen = args.scenario or list(SCENARIOS)
    stamp = {
        "run_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": bench_run.commit(),
        "machine": bench_run.machine(),
        "arguments": " ".join(sys.argv[1:]),
        "database": "postgres",
    }
    scenarios: dict[str, dict[str, Any]] = {}
    began = time.monotonic()

    def record(name: str, figures: dict[str, Any], load_before: tuple[float, float, float]) -> None:
        figures |= {"load_average_before": load_before, "load_average_after": os.getloadavg(), **stamp}
        scenarios[name] = figures
        print(json.dumps({name: figures}, indent=2, default=str), flush=True)
        bench_run.write_results(args.out, stamp, scenarios, missed=None)  # type: ignore[arg-type]

    with bench_database("postgres") as database, tempfile.TemporaryDirectory() as tmp:
        if any(name in chosen for name in THREE):
            asyncio.run(three_replicas(args, database, Path(tmp) / "three", chosen, record))
        setups = {
            "roles_split": [("agents-only", "agents"), ("api-only", "api")],
            "single_replica": [("single", "both")],
        }
        for name, roles in setups.items():
            if name not in chosen:
                continue
            print(f"--- {name} ({args.agents} agents)", file=sys.stderr, flush=True)
            load, begun = os.getloadavg(), time.monotonic()
            url = database.fresh(f"replicas_{name}")
            assert url is not None
            try:
                figures = asyncio.run(loaded_plane(args, database, url, Path(tmp) / name, roles))
            except Exception as error:  # noqa: BLE001 - a scenario that breaks is a result too
                print(f"scenario {name} failed: {type(error).__name__}: {error}", file=sys.stderr)
                figures = {"error": f"{type(error).__name__}: {error}"}
            figures["scenario_wall_s"] = round(time.monotonic() - begun, 1)
            record(name, figures, load)
    missed = report(scenarios, args.kills)
    bench_run.write_results(args.out, stamp, scenarios, missed)  # type: ignore[arg-type]
    print(f"\nreplicas bench: {time.monotonic() - began:.0f} s, {args.agents} agents", file=sys.stderr)
    for line in missed:
        print(f"MISSED TARGET {line}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
