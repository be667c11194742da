"""Scale scenarios of issue 10, run with simulated agents (testkit/mwms_testkit/simulator.py) against a real coordinator.

  agents: N agents heartbeating for T s: heartbeat round trip p50/p99, coordinator CPU (% of one core,
          from /proc/<pid>/stat over the window), agents marked lost, time to register all N.
  gangs:  with N agents connected, submit -> RUNNING of a 64-worker and a 256-worker job (CPU slots).
  ingest: 50 tasks streaming metric points and log lines while the other agents heartbeat, in three
          cases (INGEST_CASES: metrics alone, logs alone, both together, each offered at its target plus
          10 %, or as fast as acks allow): points/s and lines/s acked AND readable through the API,
          each stored once, heartbeat round trips, and how long a write of the API waits meanwhile.

The coordinator is a real `mwms server` process (testkit/mwms_testkit/cluster.py), on SQLite or on PostgreSQL as
bench/run.py --db chooses; the simulator runs in this process, on one asyncio loop, and its own CPU and
loop lag (and the PostgreSQL server's CPU, when there is one) are reported beside the figures.
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from mwms.server.heap import settle_heap
from mwms_testkit.cluster import Cluster, pack
from mwms_testkit.simulator import BATCH_MAX_ITEMS, SimAgent, SimConfig, Simulator, TelemetryPlan

TICKS = os.sysconf("SC_CLK_TCK")
GANG_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 180.0


def cpu_seconds(pid: int | str) -> float:
    """utime + stime of a process (all its threads) in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def process_tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a server process and its children, live and ended (a PostgreSQL postmaster and its
    backends): its own time, its waited-for children's (cutime, cstime) and its live children's."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(x) for x in fields[11:15])
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            child = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile: its time is in the parent's cutime now
        if child[1] == str(pid):
            total += int(child[11]) + int(child[12])
    return total / TICKS


def runqueue_wait_seconds(pid: int | str) -> float:
    """Seconds the threads of a process spent runnable but waiting for a CPU (/proc/<pid>/task/*/schedstat)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def machine_busy_seconds() -> float:
    """CPU seconds all processes of this machine spent busy (everything in /proc/stat but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICKS


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


class Window:
    """CPU of the coordinator, of this process and of the database server (when one runs) over wall time."""

    def __init__(self, coordinator_pid: int, database_pid: int | None = None) -> None:
        self.pid = coordinator_pid
        self.database_pid = database_pid
        self.database0 = process_tree_cpu_seconds(database_pid) if database_pid else 0.0
        self.start = time.monotonic()
        self.cpu0 = cpu_seconds(coordinator_pid)
        self.tree0 = process_tree_cpu_seconds(coordinator_pid)
        self.self0 = cpu_seconds("self")
        self.machine0 = machine_busy_seconds()
        self.wait0 = runqueue_wait_seconds(coordinator_pid)

    def close(self) -> dict[str, float]:
        self.end = time.monotonic()
        wall = self.end - self.start
        coordinator = 100 * (cpu_seconds(self.pid) - self.cpu0) / wall
        # Its helper processes (the ingest and scheduler processes): the whole tree less the coordinator.
        helpers = max(0.0, 100 * (process_tree_cpu_seconds(self.pid) - self.tree0) / wall - coordinator)
        simulator = 100 * (cpu_seconds("self") - self.self0) / wall
        machine = 100 * (machine_busy_seconds() - self.machine0) / wall
        database = (
            100 * (process_tree_cpu_seconds(self.database_pid) - self.database0) / wall
            if self.database_pid
            else 0.0
        )
        return {
            "window_s": wall,
            "coordinator_cpu_pct": coordinator,
            "coordinator_helpers_cpu_pct": helpers,
            "simulator_cpu_pct": simulator,
            # The PostgreSQL server's processes (0 with SQLite, which runs inside the coordinator).
            "database_cpu_pct": database,
            # Other processes on this machine in the same window (other benchmarks, test suites): a shared
            # machine makes every figure worse, so the figure says how shared it was.
            "other_processes_cpu_pct": max(0.0, machine - coordinator - helpers - simulator - database),
            # Time the coordinator's threads were ready to run but had no CPU, % of the window (summed over
            # threads, so it can pass 100): round trips include this wait.
            "coordinator_cpu_wait_pct": 100 * (runqueue_wait_seconds(self.pid) - self.wait0) / wall,
        }


def heartbeat_figures(
    sim: Simulator, since: float, until: float, agents: list[SimAgent] | None = None
) -> dict:
    """Round trips of the heartbeats written in [since, until); one still unanswered counts as endless."""
    rtts = sim.round_trips(since, until, agents)
    unanswered = sim.unanswered(until, agents, since=since)
    everything = rtts + [math.inf] * unanswered
    lags = [lag for at, lag in sim.lag.lags if since <= at < until]
    return {
        "heartbeat_rtt_p50_ms": _ms(percentile(everything, 50)),
        "heartbeat_rtt_p99_ms": _ms(percentile(everything, 99)),
        "heartbeat_rtt_max_ms": _ms(max(everything) if everything else None),
        "heartbeats_acked": len(rtts),
        # Written in the window, still unanswered after the drain wait: the coordinator's backlog.
        "heartbeats_unanswered": unanswered,
        "simulator_loop_lag_p99_ms": _ms(percentile(lags, 99)),
    }


async def drain_heartbeats(sim: Simulator, until: float, timeout_s: float = 15.0) -> None:
    """Gives heartbeats written before `until` time to be answered, so a backlog shows in the round trips."""
    deadline = time.monotonic() + timeout_s
    while sim.unanswered(until) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None or math.isinf(seconds) else round(seconds * 1000, 2)


async def lost_agents(http: httpx.AsyncClient, sim: Simulator) -> dict[str, Any]:
    """Agents of this simulator that the coordinator shows offline, and streams that broke on our side."""
    response = await http.get("/api/v1/agents", timeout=120)
    response.raise_for_status()
    names = {a.name for a in sim.agents}
    ours = [a for a in response.json() if a["name"] in names]
    offline = [a for a in ours if not a["online"]]
    return {
        "agents_lost": len(offline),
        "oldest_heartbeat": min((a["last_heartbeat_at"] or "" for a in ours), default=None),
        "agent_stream_errors": sum(len(a.stream_errors) for a in sim.agents),
        # When some show offline: one of them as the API showed it, and when (what it says tells why).
        "offline_sample": (
            {"at": time.time(), "date": response.headers.get("date"), "agent": offline[0]}
            if offline
            else None
        ),
    }


class LoopLag:
    """The coordinator's event-loop lag over a window, from its own histogram (mwms_event_loop_lag_seconds,
    server/live/loop_lag.py): its part of the heartbeats' round trips, apart from this simulator's.
    `await LoopLag.read(http)` when the window opens, then `await lag.figures(http)` when it closes."""

    def __init__(self, buckets: dict[float, float]) -> None:
        self.buckets = buckets

    @staticmethod
    async def _buckets(http: httpx.AsyncClient) -> dict[float, float]:
        response = await http.get("/metrics", timeout=60)
        response.raise_for_status()
        return {
            float(sample.labels["le"]): sample.value
            for family in text_string_to_metric_families(response.text)
            if family.name == "mwms_event_loop_lag_seconds"
            for sample in family.samples
            if sample.name.endswith("_bucket")
        }

    @classmethod
    async def read(cls, http: httpx.AsyncClient) -> LoopLag:
        return cls(await cls._buckets(http))

    async def figures(self, http: httpx.AsyncClient) -> dict[str, Any]:
        """p99 as the upper bound of its histogram bucket, and the samples 50 ms or more late."""
        after = await self._buckets(http)
        counts = sorted((le, after[le] - self.buckets.get(le, 0.0)) for le in after)
        total = counts[-1][1] if counts else 0.0
        p99 = next((le for le, n in counts if n >= 0.99 * total), math.inf) if total else None
        within_50ms = next((n for le, n in counts if le >= 0.05), total)
        return {
            "coordinator_loop_lag_p99_ms_at_most": None if p99 is None else round(1000 * p99, 1),
            "coordinator_loop_lag_samples": int(total),
            "coordinator_loop_lag_over_50ms": int(total - within_50ms),
        }


class OfflineWatch:
    """Polls `GET /api/v1/agents` every `interval_s` while a window is open: the most of this simulator's
    agents shown offline at once. An agent marked lost and back online by the end leaves no other trace
    (a streaming one shows as a stopped task; an idle one not at all)."""

    def __init__(self, cluster: Cluster, sim: Simulator, interval_s: float = 2.0) -> None:
        self.cluster, self.sim, self.interval_s = cluster, sim, interval_s
        self.most = 0
        self.sample: dict | None = None  # the poll that showed the most offline: when, and one of them
        self.timeline: list[
            tuple[float, int, str | None]
        ] = []  # each poll: when, how many offline, oldest beat
        self.polls = 0
        self.errors = 0
        self._task: asyncio.Task[None] | None = None

    def __enter__(self) -> OfflineWatch:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        async with admin_client(self.cluster) as http:
            while True:
                try:
                    seen = await lost_agents(http, self.sim)
                    self.timeline.append(
                        (round(time.time(), 2), seen["agents_lost"], seen["oldest_heartbeat"])
                    )
                    if seen["agents_lost"] > self.most:
                        self.most, self.sample = seen["agents_lost"], seen["offline_sample"]
                    self.polls += 1
                except httpx.HTTPError:
                    self.errors += 1
                await asyncio.sleep(self.interval_s)

    def figures(self) -> dict[str, Any]:
        figures: dict[str, Any] = {"agents_offline_max_in_window": self.most, "offline_polls": self.polls}
        if self.sample is not None:
            figures["offline_sample_in_window"] = self.sample
            figures["offline_timeline"] = self.timeline
        return figures


class WriteProbe:
    """Creates an API token (one small write transaction) every `interval_s` while a window is open and
    times each call: how long the coordinator's own writes wait for the database's write lock while
    telemetry is stored (task reports, the liveness flush and POST /jobs wait the same way)."""

    def __init__(self, cluster: Cluster, interval_s: float = 0.5) -> None:
        self.cluster, self.interval_s = cluster, interval_s
        self.times: list[float] = []
        self.errors = 0
        self._task: asyncio.Task[None] | None = None

    def __enter__(self) -> WriteProbe:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        async with admin_client(self.cluster) as http:
            while True:
                started = time.monotonic()
                try:
                    response = await http.post("/api/v1/tokens", json={"user": "write-probe"}, timeout=60)
                    response.raise_for_status()
                    self.times.append(time.monotonic() - started)
                except httpx.HTTPError:
                    self.errors += 1
                await asyncio.sleep(self.interval_s)

    def figures(self) -> dict[str, Any]:
        return {
            "api_write_p50_ms": _ms(percentile(self.times, 50)),
            "api_write_p99_ms": _ms(percentile(self.times, 99)),
            "api_write_max_ms": _ms(max(self.times) if self.times else None),
            "api_writes": len(self.times),
            "api_write_errors": self.errors,
        }


async def start_fleet(cluster: Cluster, agents: int, config: SimConfig, results: dict[str, Any]) -> Simulator:
    """Registers and connects `agents` simulated agents; records how long registration took."""
    sim = Simulator(config, agents, run_id=str(int(time.time()) % 100000))
    start = time.monotonic()
    latencies = await sim.register_all()
    results["register_all_s"] = time.monotonic() - start
    results["register_call_p50_s"] = percentile(latencies, 50)
    results["register_call_p99_s"] = percentile(latencies, 99)
    start = time.monotonic()
    await sim.connect_all(timeout_s=300)
    results["connect_all_s"] = time.monotonic() - start
    quiet_collector()
    return sim


def quiet_collector() -> None:
    """The simulated fleet's objects leave every later collection of this process, as the coordinator's do
    (server/heap.py): the simulator stands for agents on other machines, and its own full collections
    (120-190 ms each, one or two in every ingest window) read as the coordinator's heartbeat round trips.
    Call once the fleet is connected."""
    settle_heap()


def sim_config(cluster: Cluster, **overrides: Any) -> SimConfig:
    return SimConfig(join_token=cluster.join_token, server=f"127.0.0.1:{cluster.grpc_port}", **overrides)


def run_async(main: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    return asyncio.run(main())


async def scenario_agents(
    cluster: Cluster,
    results: dict[str, Any],
    agents: int,
    seconds: float,
    settle_s: float = 5.0,
    database_pid: int | None = None,
) -> None:
    """N agents heartbeating at 1 Hz for `seconds`: round trips, coordinator CPU, lost agents."""
    assert cluster.server is not None
    results |= {"agents": agents, "seconds": seconds}
    sim = await start_fleet(cluster, agents, sim_config(cluster), results)
    try:
        await asyncio.sleep(settle_s)  # registration's own load passes before the window opens
        async with admin_client(cluster) as http:
            lag = await LoopLag.read(http)
            window = Window(cluster.server.popen.pid, database_pid)
            with OfflineWatch(cluster, sim) as watch:
                await asyncio.sleep(seconds)
            results |= window.close() | watch.figures() | await lag.figures(http)
        await drain_heartbeats(sim, window.end)
        results |= heartbeat_figures(sim, window.start, window.end)
        async with admin_client(cluster) as http:
            results |= await lost_agents(http, sim)
    finally:
        await sim.close()


async def scenario_gangs(
    cluster: Cluster,
    results: dict[str, Any],
    agents: int,
    sizes: tuple[int, ...] = (64, 256),
    database_pid: int | None = None,
) -> None:
    """With N agents connected, submit -> RUNNING (and -> SUCCEEDED) of one gang per size, one at a time."""
    assert cluster.server is not None
    results["agents"] = agents
    sim = await start_fleet(cluster, agents, sim_config(cluster, task_run_s=1.0), results)
    try:
        async with admin_client(cluster) as http:
            digest = await upload_bundle(http)
            for size in sizes:
                window = Window(cluster.server.popen.pid, database_pid)
                figures = await run_gang(http, sim, digest, size)
                results |= {f"gang{size}_{k}": v for k, v in figures.items()}
                closed = window.close()
                results[f"gang{size}_coordinator_cpu_pct"] = closed["coordinator_cpu_pct"]
                results[f"gang{size}_database_cpu_pct"] = closed["database_cpu_pct"]
            results |= await lost_agents(http, sim)
    finally:
        await sim.close()


async def run_gang(http: httpx.AsyncClient, sim: Simulator, digest: str, workers: int) -> dict[str, Any]:
    """Submits one gang and follows it; times from the submit call's start."""
    start = time.monotonic()
    job_id = await submit(http, digest, workers, name=f"bench-gang-{workers}")
    submitted = time.monotonic() - start
    running = succeeded = None
    state = "?"
    deadline = start + GANG_TIMEOUT_S
    while time.monotonic() < deadline:
        state = (await http.get(f"/api/v1/jobs/{job_id}", timeout=60)).json()["state"]
        if state == "RUNNING" and running is None:
            running = time.monotonic() - start
        if state in ("SUCCEEDED", "FAILED", "CANCELLED"):
            succeeded = time.monotonic() - start if state == "SUCCEEDED" else None
            if running is None and state == "SUCCEEDED":
                running = max(t.running_at or 0 for t in sim.tasks() if t.job_id == job_id) - start
            break
        await asyncio.sleep(0.1)
    tasks = [t for t in sim.tasks() if t.job_id == job_id]
    first_start = min((t.started_at for t in tasks), default=None)
    if state not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        await http.post(f"/api/v1/jobs/{job_id}/cancel", timeout=60)
    return {
        "submit_call_s": submitted,
        "first_start_s": None if first_start is None else first_start - start,
        "starts_received": len(tasks),
        "distinct_agents": len(
            {a.name for a in sim.agents for t in a.history.values() if t.job_id == job_id}
        ),
        "running_s": running,
        "succeeded_s": succeeded,
        "final_state": state,
    }


# Ingest cases: offered items/s of each kind in all (None: as fast as acks allow; 0: none), and the stored
# rate each kind must reach (bench/run.py's targets). A case offers its target plus INGEST_HEADROOM, so a
# coordinator that keeps up stores at least the target although the figure's time runs on until the last
# item is readable.
INGEST_CASES: dict[str, dict[str, float]] = {
    "metrics": {"metric_points_per_s": 100_000, "log_lines_per_s": 0},
    "logs": {"metric_points_per_s": 0, "log_lines_per_s": 100_000},
    "both": {"metric_points_per_s": 50_000, "log_lines_per_s": 50_000},
}
INGEST_HEADROOM = 1.1
# At a chosen rate each task may have this many of each kind's batches unacknowledged: half the
# coordinator's bound per stream (MAX_UNACKED_BATCHES, both kinds), so it is the coordinator that holds a
# sender back, as with a real agent (which has no window of its own).
PACED_WINDOW_BATCHES = 16


def ingest_plan(
    metric_points_per_s: float | None, log_lines_per_s: float | None, tasks: int
) -> TelemetryPlan:
    """Each task's share of the offered rates (None: as fast as acks allow, in the simulator's window)."""
    if metric_points_per_s is None or log_lines_per_s is None:
        return TelemetryPlan(
            metric_points_per_s=None if metric_points_per_s is None else metric_points_per_s / tasks,
            log_lines_per_s=None if log_lines_per_s is None else log_lines_per_s / tasks,
        )
    return TelemetryPlan(
        metric_points_per_s=metric_points_per_s / tasks,
        log_lines_per_s=log_lines_per_s / tasks,
        window_items=PACED_WINDOW_BATCHES * BATCH_MAX_ITEMS,
    )


async def scenario_ingest(
    cluster: Cluster,
    results: dict[str, Any],
    agents: int,
    tasks: int,
    seconds: float,
    database_pid: int | None = None,
    metric_points_per_s: float | None = None,
    log_lines_per_s: float | None = None,
) -> None:
    """`tasks` one-worker jobs streaming metrics and logs at the offered rates (in all; None: as fast as
    acks allow), the other agents heartbeating.

    Counts what is acknowledged AND readable through the API, from the window's start until the last of it
    is readable; a coordinator that cannot drain the backlog within DRAIN_TIMEOUT_S is measured on what
    it acknowledged by then.
    """
    assert cluster.server is not None
    results |= {
        "agents": agents,
        "tasks": tasks,
        "seconds": seconds,
        "offered_metric_points_per_s": metric_points_per_s,
        "offered_log_lines_per_s": log_lines_per_s,
    }
    sim = await start_fleet(cluster, agents, sim_config(cluster, task_run_s=None), results)
    plan = ingest_plan(metric_points_per_s, log_lines_per_s, tasks)
    try:
        async with admin_client(cluster) as http:
            digest = await upload_bundle(http)
            for agent in sim.agents:
                agent.telemetry = plan
            job_ids = [await submit(http, digest, 1, name=f"bench-ingest-{i}") for i in range(tasks)]
            await wait_for(lambda: len(sim.tasks()) >= tasks and all(t.running_at for t in sim.tasks()), 120)
            streaming = [a for a in sim.agents if a.tasks]
            for agent in sim.agents:
                agent.telemetry = None  # only the first `tasks` starts stream
            others = [a for a in sim.agents if not a.tasks]
            # Tasks stream from their start: what was acked before the window is not counted in it.
            acked_before = {t.task_id: (t.acked_log_seq, t.acked_metric_seq) for t in sim.tasks()}
            lag = await LoopLag.read(http)
            window = Window(cluster.server.popen.pid, database_pid)
            with OfflineWatch(cluster, sim) as watch, WriteProbe(cluster) as writes:
                await asyncio.sleep(seconds)
            for task in sim.tasks():
                task.done.set()  # the producers stop; what is in flight is still acked
            sent_at = time.monotonic()
            results |= window.close() | watch.figures() | writes.figures() | await lag.figures(http)
            await drain_heartbeats(sim, window.end)
            results |= heartbeat_figures(sim, window.start, window.end, others)
            results |= {
                f"streaming_{k}": v
                for k, v in heartbeat_figures(sim, window.start, window.end, streaming).items()
                if k.startswith("heartbeat_rtt")
            }
            sim_tasks = sim.tasks()
            # More tasks than jobs: the coordinator stopped some and placed their jobs again.
            results["tasks_started"] = len(sim_tasks)
            results["tasks_stopped"] = sum(1 for t in sim_tasks if t.stopped)
            try:
                await wait_for(
                    lambda: all(
                        t.acked_log_seq >= t.sent_log_seq and t.acked_metric_seq >= t.sent_metric_seq
                        for t in sim_tasks
                    ),
                    DRAIN_TIMEOUT_S,
                )
            except TimeoutError:
                results["drain_timed_out"] = True
            acked_at = time.monotonic()
            await wait_until_readable(http, sim_tasks)
            readable_at = time.monotonic()
            lines = sum(t.acked_log_seq - acked_before.get(t.task_id, (0, 0))[0] for t in sim_tasks)
            points = sum(t.acked_metric_seq - acked_before.get(t.task_id, (0, 0))[1] for t in sim_tasks)
            elapsed = readable_at - window.start
            results |= {
                "metric_points": points,
                "log_lines": lines,
                "metric_points_per_s": points / elapsed,
                "log_lines_per_s": lines / elapsed,
                "drain_after_window_s": acked_at - sent_at,
                "readable_after_acked_s": readable_at - acked_at,
                "rejected_items": sum(t.rejected for t in sim_tasks),
            }
            if plan.metric_points_per_s != 0:
                results["points_stored_once"] = await count_points(http, sim_tasks[0])
            if plan.log_lines_per_s != 0:
                # The task that started last: its first line is not the log's first (see count_lines).
                last = max(sim_tasks, key=lambda t: t.running_at or 0.0)
                results["lines_stored_once"] = await count_lines(http, last)
            results |= await lost_agents(http, sim)
            del job_ids
    finally:
        await sim.close()


async def wait_until_readable(http: httpx.AsyncClient, tasks: list[Any]) -> None:
    """Until every task's last acknowledged log line and metric point can be read through the API."""
    pending = list(tasks)
    deadline = time.monotonic() + 300
    while pending and time.monotonic() < deadline:
        task = pending[0]
        # This task's own lines and points: its job may have a later attempt by now.
        logs = await http.get(
            f"/api/v1/jobs/{task.job_id}/logs",
            params={"tail": 1, "task": task.index, "attempt": task.attempt},
            timeout=60,
        )
        last_line = logs.json()["lines"][-1]["seq"] if logs.json()["lines"] else 0
        metrics = await http.get(
            f"/api/v1/jobs/{task.job_id}/metrics",
            params={"name": "loss", "min_step": task.acked_metric_seq, "attempt": task.attempt},
            timeout=60,
        )
        last_point = metrics.json()["points"][-1]["step"] if metrics.json()["points"] else 0
        if last_line >= task.acked_log_seq and last_point >= task.acked_metric_seq:
            pending.pop(0)
        else:
            await asyncio.sleep(0.1)
    if pending:
        task = pending[0]
        raise TimeoutError(
            f"{len(pending)} tasks' last lines or points are not readable after 300 s; e.g. task {task.index} "
            f"attempt {task.attempt} of job {task.job_id}: acked log seq {task.acked_log_seq}, "
            f"metric seq {task.acked_metric_seq}"
        )


async def count_points(http: httpx.AsyncClient, task: Any) -> bool:
    """True when one task's metric series through the API holds every acknowledged point exactly once.

    Read in storage order, a page at a time (the API pages at telemetry_reads.MAX_METRIC_POINTS_PER_PAGE)."""
    steps: list[int] = []
    after = 0
    while True:
        page = (
            await http.get(
                f"/api/v1/jobs/{task.job_id}/metrics",
                # a restarted job's next attempt counts anew
                params={"name": "loss", "attempt": task.attempt, "after": after},
                timeout=300,
            )
        ).json()
        steps += [p["step"] for p in page["points"]]
        if not page["more"] or not page["points"]:
            break
        after = page["cursor"]
    return len(steps) == len(set(steps)) and set(range(1, task.acked_metric_seq + 1)) <= set(steps)


async def count_lines(http: httpx.AsyncClient, task: Any) -> bool:
    """True when one task's log through the API holds every acknowledged line exactly once.

    Read oldest first, 10,000 lines a page after a cursor (a line id); the first cursor is 1 (0 asks for
    the newest lines instead), so this must be a task whose first line is not the first line stored."""
    seqs: list[int] = []
    after = 1
    while True:
        page = (
            await http.get(
                f"/api/v1/jobs/{task.job_id}/logs",
                params={"task": task.index, "attempt": task.attempt, "after": after, "tail": 10_000},
                timeout=300,
            )
        ).json()
        if not page["lines"]:
            break
        seqs += [line["seq"] for line in page["lines"]]
        after = page["next_after"]
    return len(seqs) == len(set(seqs)) and set(range(1, task.acked_log_seq + 1)) <= set(seqs)


async def wait_for(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.05)


def admin_client(cluster: Cluster) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=cluster.api, headers={"Authorization": f"Bearer {cluster.admin_token}"}, trust_env=False
    )


async def upload_bundle(http: httpx.AsyncClient) -> str:
    bundle = pack({"p.py": "print('simulated')\n"})
    response = await http.post("/api/v1/bundles", files={"file": ("bundle.tar.gz", bundle)}, timeout=60)
    response.raise_for_status()
    return response.json()["digest"]


async def submit(http: httpx.AsyncClient, digest: str, workers: int, name: str) -> str:
    body = {
        "bundle_digest": digest,
        "command": ["python", "p.py"],
        "workers": workers,
        "gpus_per_worker": 0,
        "name": name,
        "startup_timeout_seconds": GANG_TIMEOUT_S,
    }
    response = await http.post("/api/v1/jobs", json=body, timeout=120)
    if response.status_code != 201:
        raise RuntimeError(f"submit refused: {response.status_code} {response.text}")
    return response.json()["id"]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
