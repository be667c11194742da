"""Sharing a cluster (issue 18): the scheduler's priorities, preemption and backfill at work.

Scenarios (--scenario, repeatable; default: all), each against a fresh `mwms server` with simulated
agents (testkit/mwms_testkit/simulator.py) in this process:
  scale       1,000 agents x 1 CPU slot, 936 slots held by running jobs, 10,000 waiting jobs of 20 teams in
              four priority bands (none fits the 64 free slots): every scheduler pass's time, then a fitting
              64-worker job of higher priority to RUNNING, heartbeats throughout.
  preemption  a full cluster of low-priority preemptible 8-worker jobs whose simulated tasks answer a stop
              by saving and exiting 42; a high-priority 64-worker job to RUNNING, the steps the victims
              lost, and the victims back PENDING and RUNNING again.
  starvation  4 agents x 1 slot, a 1-worker job a second (runs 4 s, max_runtime_seconds 6) and, 3 s in, a
              4-worker job: its wait / the small jobs' run time, and small jobs started ahead of it.

The waiting jobs of `scale` are stored with the coordinator's own `create_job` on its database (as
bench/jobs_at_volume.py seeds it, but while it runs: the scheduler then finds them). Pass times come from
the coordinator itself: this script starts `mwms server` through a launcher that wraps the scheduler
loop's `schedule_pass` (server/live/loops.py) and the loop's whole write transaction with a timer
(nothing in server/ changes; see PASS_TIMER).
Targets live here; results go to bench/results_sharing.json; exit status 1 when one is missed.
Usage: python bench/sharing.py [--scenario scale] [--agents 1000 --jobs 10000 --teams 20] [--db postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

import httpx  # noqa: E402
import run as bench_run  # noqa: E402
import scale  # noqa: E402
from databases import CHOICES, BenchDatabase, bench_database  # noqa: E402
from machine_speed import machine_speed, speed_line  # noqa: E402

from mwms_testkit.cluster import MWMS, Cluster, Process  # noqa: E402
from mwms_testkit.simulator import SimTask, Simulator  # noqa: E402

SCENARIOS = ("scale", "preemption", "starvation")
TARGETS = [
    ("scale", "pass_p99_ms", 100, "<="),
    ("scale", "gang64_running_s", 2, "<="),
    ("scale", "heartbeat_rtt_p99_ms", 50, "<"),
    ("scale", "agents_lost", 0, "=="),
    ("scale", "invariant_violations", 0, "=="),
    ("preemption", "preemptor_running_over_grace_s", 3, "<="),
    ("preemption", "victim_steps_lost", 0, "=="),
    ("preemption", "victims_running_again", True, "=="),
    ("preemption", "devices_assigned_twice", 0, "=="),
    ("starvation", "gang_wait_over_run_time", 1.5, "<="),
    ("starvation", "small_overtook_gang", 0, "=="),
    ("starvation", "devices_assigned_twice", 0, "=="),
]
PRIORITY_BANDS = (100, 300, 500, 700)
# Sizes of the waiting jobs of `scale`: all bigger than the 64 free slots, so they wait (and the scheduler
# works out why, for each) while the 64-worker job fits.
WAITING_SIZES = (72, 80, 96, 128, 160, 192, 256, 320, 384, 512)
FILL_WORKERS = 8
FREE_SLOTS = 64
SEED_BATCH = 500
SEED_PAUSE_S = 0.1

# Runs `mwms server` with the scheduler loop timed: each pass (its own time, as the scheduler process
# reports it: server/live/scheduler_process.py) and the loop's whole step (the request to that process,
# the pass, waking agents) as lines "pass|step <unix time> <seconds>" in $MWMS_BENCH_PASS_LOG; with
# $MWMS_BENCH_PASS_PROFILE the passes run in the coordinator's process (MWMS_SCHEDULER_PROCESS=false) and
# every pass while the file of that name plus ".on" exists runs under cProfile (slower: for finding where a
# pass's time goes, not for its figures). A bench-only wrapper: the coordinator's code is unchanged.
PASS_TIMER = """
import functools, os, sys, time
import mwms.server.live.loops as loops
log = open(os.environ["MWMS_BENCH_PASS_LOG"], "a", buffering=1)
profile_path = os.environ.get("MWMS_BENCH_PASS_PROFILE")
if profile_path:
    import cProfile
    profiler = cProfile.Profile()
pass_of = loops.schedule_pass
@functools.wraps(pass_of)
def profiled_pass(*args, **kwargs):
    profiling = profile_path and os.path.exists(profile_path + ".on")
    if profiling:
        profiler.enable()
    try:
        return pass_of(*args, **kwargs)
    finally:
        if profiling:
            profiler.disable()
            profiler.dump_stats(profile_path)
loops.schedule_pass = profiled_pass
step_of = loops.BackgroundLoops._schedule
async def timed_step(self):
    before = self.passes_run
    start = time.perf_counter()
    try:
        await step_of(self)
    finally:
        if self.passes_run != before and self.last_pass_s is not None:
            parts = " ".join(f"{k}={v:.4f}" for k, v in self.last_pass_phases.items())
            log.write(f"pass {time.time():.3f} {self.last_pass_s:.6f} {parts}\\n")
        log.write(f"step {time.time():.3f} {time.perf_counter() - start:.6f}\\n")
loops.BackgroundLoops._schedule = timed_step
from mwms.cli.main import app
sys.argv = [os.environ["MWMS_BENCH_MWMS"], *sys.argv[1:]]
app()
"""


class TimedCluster(Cluster):
    """A Cluster whose coordinator logs every scheduler pass's time (PASS_TIMER)."""

    profile_passes: bool = False

    @property
    def pass_log(self) -> Path:
        return self.root / "scheduler-passes.txt"

    @property
    def pass_profile(self) -> Path:
        return self.root / "scheduler-passes.prof"

    def spawn_server(self, args: list[str]) -> Process:
        log_path = self.root / "server.log"
        env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            MWMS_BENCH_PASS_LOG=str(self.pass_log),
            MWMS_BENCH_MWMS=MWMS,
            **self.server_environment(),
        )
        if self.profile_passes:
            env["MWMS_BENCH_PASS_PROFILE"] = str(self.pass_profile)
            env["MWMS_SCHEDULER_PROCESS"] = "false"
        env.pop("TF_CONFIG", None)
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-c", PASS_TIMER, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=ROOT,
            )
        return Process("server", popen, log_path)

    def passes(
        self, since_unix: float = 0.0, until_unix: float = float("inf"), kind: str = "pass"
    ) -> list[float]:
        """Seconds of each timed pass (or loop step) that ended in [since_unix, until_unix)."""
        try:
            lines = self.pass_log.read_text().splitlines()
        except FileNotFoundError:
            return []
        result = []
        for line in lines:
            parts = line.split()
            if len(parts) >= 3 and parts[0] == kind and since_unix <= float(parts[1]) < until_unix:
                result.append(float(parts[2]))
        return result


def database_url(cluster: Cluster, url: str | None) -> str:
    return url or f"sqlite:///{(cluster.root / 'data' / 'mwms.db').resolve()}"


def seed_waiting_jobs(url: str, digest: str, jobs: list[dict[str, Any]]) -> float:
    """Stores jobs through the coordinator's own `create_job`, SEED_BATCH a transaction; returns seconds.

    Each entry: workers, priority, team, preemptible and the run time its simulated tasks take.
    """
    from mwms.server.db.engine import Database
    from mwms.server.schemas import JobCreate
    from mwms.server.services.job_life.jobs import create_job
    from mwms.server.services.scheduler import teams

    database = Database(url)
    start = time.monotonic()
    try:
        with database.write() as session:
            for team in sorted({j["team"] for j in jobs}):
                teams.add_member(session, team, f"user-{team}", by="bench")
        for first in range(0, len(jobs), SEED_BATCH):
            time.sleep(SEED_PAUSE_S)  # the coordinator's own writers get the lock between batches
            with database.write() as session:
                for job in jobs[first : first + SEED_BATCH]:
                    spec = JobCreate(
                        bundle_digest=digest,
                        command=["python", "p.py", f"--sim-run-s={job.get('run_s', 'forever')}"],
                        workers=job["workers"],
                        gpus_per_worker=0,
                        name=job["name"],
                        priority=job["priority"],
                        preemptible=job["preemptible"],
                    )
                    create_job(session, spec, submitted_by=f"user-{job['team']}")
    finally:
        database.dispose()
    return time.monotonic() - start


async def seed_elsewhere(url: str, digest: str, jobs: list[dict[str, Any]]) -> float:
    """seed_waiting_jobs in a process of its own: this process's loop (the simulated agents) keeps its
    GIL, so the heartbeats measured while seeding are the coordinator's, not the seeder's."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return await asyncio.get_running_loop().run_in_executor(pool, seed_waiting_jobs, url, digest, jobs)


async def submit(
    http: httpx.AsyncClient, digest: str, workers: int, name: str, run_s: float | str, **spec: Any
) -> str:
    """POST /api/v1/jobs; the simulated tasks run `run_s` seconds ("forever": until stopped)."""
    body = {
        "bundle_digest": digest,
        "command": ["python", "p.py", f"--sim-run-s={run_s}"],
        "workers": workers,
        "gpus_per_worker": 0,
        "name": name,
        "startup_timeout_seconds": scale.GANG_TIMEOUT_S,
        **spec,
    }
    response = await http.post("/api/v1/jobs", json=body, timeout=120)
    if response.status_code != 201:
        raise RuntimeError(f"submit refused: {response.status_code} {response.text}")
    return str(response.json()["id"])


async def job_state(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    response = await http.get(f"/api/v1/jobs/{job_id}", timeout=60)
    response.raise_for_status()
    return dict(response.json())


async def until_state(http: httpx.AsyncClient, job_id: str, states: set[str], timeout_s: float) -> float:
    """Polls every 0.1 s until the job is in one of `states`; returns when (monotonic)."""
    deadline = time.monotonic() + timeout_s
    last = "?"
    while time.monotonic() < deadline:
        last = (await job_state(http, job_id))["state"]
        if last in states:
            return time.monotonic()
        await asyncio.sleep(0.1)
    job = await job_state(http, job_id)
    path = " > ".join(e["to_state"] for e in job["events"])
    raise TimeoutError(
        f"job {job_id} not in {sorted(states)} within {timeout_s} s (last {last}: {job['reason']}; {path})"
    )


async def invariant_violations(http: httpx.AsyncClient) -> float:
    """Jobs the coordinator's passes left waiting unexplained beside devices that fit them
    (server/services/scheduler/pass_check.py), from its /metrics."""
    text = (await http.get("/metrics", timeout=60)).text
    name = "mwms_scheduler_invariant_violations_total"
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


async def offer_seen(http: httpx.AsyncClient, sim: Simulator) -> dict[str, int]:
    """What GET /api/v1/agents shows of the simulated agents: online ones, and free slots on those."""
    agents = (await http.get("/api/v1/agents", timeout=60)).json()
    names = {a.name for a in sim.agents}
    mine = [a for a in agents if a["name"] in names]
    return {
        "online": sum(1 for a in mine if a["online"]),
        "free_slots_online": sum(a["devices_free"] for a in mine if a["online"]),
        "free_slots_all": sum(a["devices_free"] for a in mine),
    }


def copy_sqlite(source: Path, target: Path) -> None:
    """A consistent copy of a live SQLite database (its WAL included), through SQLite's backup."""
    import sqlite3

    target.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(source) as live, sqlite3.connect(target) as copy:
        live.backup(copy)
    print(f"database as it was when the 64-worker job had not run: {target}", file=sys.stderr)


def percentile_ms(values: list[float], p: float) -> float | None:
    value = scale.percentile(values, p)
    return None if value is None else round(value * 1000, 2)


def pass_figures(cluster: TimedCluster, since_unix: float, until_unix: float) -> dict[str, Any]:
    passes = cluster.passes(since_unix, until_unix)
    steps = cluster.passes(since_unix, until_unix, kind="step")
    return {
        "passes": len(passes),
        "pass_p50_ms": percentile_ms(passes, 50),
        "pass_p99_ms": percentile_ms(passes, 99),
        "pass_max_ms": percentile_ms(passes, 100),
        # The loop's whole step: waiting for the writer, the pass, the commit (10,000 reasons the first time).
        "loop_step_p50_ms": percentile_ms(steps, 50),
        "loop_step_p99_ms": percentile_ms(steps, 99),
        "loop_step_max_ms": percentile_ms(steps, 100),
    }


# -- scale ------------------------------------------------------------------------------------------------


async def scenario_scale(
    cluster: TimedCluster,
    url: str,
    results: dict[str, Any],
    agents: int,
    jobs: int,
    team_count: int,
    seconds: float,
    database_pid: int | None = None,
    snapshot: Path | None = None,
) -> None:
    """A busy cluster with `jobs` waiting: pass times over `seconds`, then a fitting 64-worker job.

    When that job does not run in time, the database is copied to `snapshot` (when given) to look into.
    """
    assert cluster.server is not None
    rng = random.Random(18)
    team_names = [f"team-{i:02d}" for i in range(team_count)]
    results |= {"agents": agents, "waiting_jobs": jobs, "teams": team_count, "seconds": seconds}
    sim = await scale.start_fleet(cluster, agents, scale.sim_config(cluster, task_run_s=None), results)
    heartbeats_from = time.monotonic()
    try:
        async with scale.admin_client(cluster) as http:
            digest = await scale.upload_bundle(http)
            # Running jobs hold all but FREE_SLOTS slots; higher priority than every waiting job and not
            # preemptible, so they stay put while the waiting jobs are planned around them.
            fill = [
                {
                    "name": f"bench-running-{i}",
                    "workers": FILL_WORKERS,
                    "priority": 800,
                    "team": team_names[i % team_count],
                    "preemptible": False,
                }
                for i in range((agents - FREE_SLOTS) // FILL_WORKERS)
            ]
            await seed_elsewhere(url, digest, fill)
            busy = len(fill) * FILL_WORKERS
            await scale.wait_for(lambda: sum(1 for t in sim.tasks() if t.running_at) >= busy, 120)
            waiting = [
                {
                    "name": f"bench-waiting-{i}",
                    "workers": rng.choice(WAITING_SIZES),
                    "priority": rng.choice(PRIORITY_BANDS),
                    "team": rng.choice(team_names),
                    "preemptible": rng.random() < 0.5,
                }
                for i in range(jobs)
            ]
            seeded_from, seeding_from = time.time(), time.monotonic()
            results["seed_waiting_s"] = await seed_elsewhere(url, digest, waiting)
            seeded_until = time.monotonic()
            results["pass_before_seeding_p50_ms"] = percentile_ms(cluster.passes(0, seeded_from), 50)
            await asyncio.sleep(2)  # the first pass over the new jobs stores their reasons (timed apart)
            window_from = time.time()
            if cluster.profile_passes:
                Path(f"{cluster.pass_profile}.on").touch()
            lag = await scale.LoopLag.read(http)
            window = scale.Window(cluster.server.popen.pid, database_pid)
            with scale.OfflineWatch(cluster, sim) as watch:
                await asyncio.sleep(seconds)
                results["before_gang"] = await offer_seen(http, sim)
                start = time.monotonic()
                gang = await submit(http, digest, 64, "bench-fitting-64", "forever", priority=900)
                try:
                    running_at = await until_state(http, gang, {"RUNNING"}, scale.GANG_TIMEOUT_S)
                except TimeoutError:
                    if snapshot is not None and url.startswith("sqlite:///"):
                        copy_sqlite(Path(url.removeprefix("sqlite:///")), snapshot)
                    raise
                finally:
                    results["after_gang"] = await offer_seen(http, sim)
                results["gang64_running_s"] = running_at - start
                await asyncio.sleep(3)  # passes with the 64-worker job placed
            window_to = time.time()
            Path(f"{cluster.pass_profile}.on").unlink(missing_ok=True)
            results |= window.close() | watch.figures() | await lag.figures(http)
            results |= pass_figures(cluster, window_from, window_to)
            # Passes while the jobs were stored, and the first one that stored all their reasons.
            seeding = cluster.passes(seeded_from, window_from)
            results["passes_while_seeding"] = len(seeding)
            results["pass_while_seeding_max_ms"] = percentile_ms(seeding, 100)
            after = await http.get("/api/v1/jobs", params={"state": "PENDING", "limit": 1}, timeout=60)
            results["waiting_after"] = after.json().get("total")
            await scale.drain_heartbeats(sim, time.monotonic())
            # Throughout the timed passes (10,000 waiting), and apart: while this script stored them
            # (500 create_job calls a transaction, in this process) and before.
            results |= scale.heartbeat_figures(sim, seeded_until, time.monotonic())
            results |= {
                f"seeding_{k}": v
                for k, v in scale.heartbeat_figures(sim, seeding_from, seeded_until).items()
                if k.startswith("heartbeat_rtt")
            }
            results |= {
                f"before_seeding_{k}": v
                for k, v in scale.heartbeat_figures(sim, heartbeats_from, seeding_from).items()
                if k.startswith("heartbeat_rtt")
            }
            results |= await scale.lost_agents(http, sim)
            results["devices_assigned_twice"] = sim.devices_assigned_twice()
            results["starts_refused"] = sum(len(a.refused_starts) for a in sim.agents)
            results["invariant_violations"] = await invariant_violations(http)
    finally:
        await sim.close()


# -- preemption -------------------------------------------------------------------------------------------


async def scenario_preemption(
    cluster: TimedCluster,
    results: dict[str, Any],
    agents: int,
    victim_workers: int,
    preemptor_workers: int,
    save_s: float,
    grace_s: int,
) -> None:
    """A full cluster of preemptible low-priority jobs, then a high-priority job that needs some of it."""
    config = scale.sim_config(cluster, task_run_s=None, stop_exit_code=42, stop_save_s=save_s)
    sim = await scale.start_fleet(cluster, agents, config, results)
    results |= {
        "agents": agents,
        "victim_workers": victim_workers,
        "preemptor_workers": preemptor_workers,
        "victim_grace_s": grace_s,
        "victim_save_s": save_s,
    }
    try:
        async with scale.admin_client(cluster) as http:
            digest = await scale.upload_bundle(http)
            low = [
                await submit(
                    http,
                    digest,
                    victim_workers,
                    f"bench-low-{i}",
                    "forever",
                    priority=100,
                    preemptible=True,
                    preemption_grace_seconds=grace_s,
                )
                for i in range(agents // victim_workers)
            ]
            await scale.wait_for(lambda: sum(1 for t in sim.tasks() if t.running_at) >= agents, 120)
            await asyncio.sleep(2)  # the victims train a while: they have steps to lose
            start = time.monotonic()
            high = await submit(http, digest, preemptor_workers, "bench-high", 5, priority=900)
            running_at = await until_state(http, high, {"RUNNING"}, 120)
            results["preemptor_running_s"] = running_at - start
            victims = [t for t in sim.tasks() if t.stop_received_at is not None]
            victim_jobs = sorted({t.job_id for t in victims})
            grace_used = max((t.ended_at or running_at) - (t.stop_received_at or 0) for t in victims)
            results["grace_used_s"] = grace_used
            results["preemptor_running_over_grace_s"] = results["preemptor_running_s"] - grace_used
            stops = [t.stop_received_at or 0 for t in victims]
            results["victim_stop_spread_s"] = max(stops) - min(stops)
            # Where the time went, from the submit: the first stop arrived, the last victim exited, the
            # preemptor's first StartTask arrived.
            results["first_stop_after_submit_s"] = min(stops) - start
            results["victims_exited_after_submit_s"] = max(t.ended_at or running_at for t in victims) - start
            high_tasks = [t for t in sim.tasks() if t.job_id == high]
            results["preemptor_first_start_after_submit_s"] = min(t.started_at for t in high_tasks) - start
            results["preemptor_last_running_after_submit_s"] = (
                max(t.running_at or running_at for t in high_tasks) - start
            )
            results["victim_jobs"] = len(victim_jobs)
            results["victim_tasks_stopped"] = len(victims)
            results["victim_exit_codes"] = sorted({t.exit_code for t in victims})

            async def victims_again() -> bool:
                for job_id in victim_jobs:
                    if (await job_state(http, job_id))["state"] != "RUNNING":
                        return False
                return True

            deadline = time.monotonic() + 60
            again = False
            while time.monotonic() < deadline and not (again := await victims_again()):
                await asyncio.sleep(0.2)
            results["victims_running_again"] = again
            results["victims_running_again_s"] = time.monotonic() - start if again else None
            paths, saved = [], 0
            for job_id in victim_jobs:
                events = (await job_state(http, job_id))["events"]
                paths.append([e["to_state"] for e in events])
                saved += sum(1 for e in events if "every worker saved a checkpoint" in e["reason"])
            results["victim_state_paths"] = sorted({" > ".join(p) for p in paths})
            results["preemptions"] = sum(p.count("PREEMPTING") for p in paths)
            results["preemptions_saved"] = saved
            results["victim_steps_lost"] = sum(sim.progress.lost_steps.get(j, 0) for j in victim_jobs)
            chiefs = [t for t in sim.tasks() if t.job_id in victim_jobs and t.index == 0]
            saved_at = {t.job_id: t.step_at_exit for t in chiefs if t.stop_received_at is not None}
            resumed = [t for t in chiefs if t.stop_received_at is None and t.attempt > 1]
            results["victims_resumed_from_saved_step"] = len(resumed) == len(victim_jobs) and all(
                t.resumed_from_step == saved_at.get(t.job_id) for t in resumed
            )
            results["low_jobs"] = len(low)
            results["devices_assigned_twice"] = sim.devices_assigned_twice()
    finally:
        await sim.close()


# -- starvation -------------------------------------------------------------------------------------------


async def scenario_starvation(
    cluster: TimedCluster,
    results: dict[str, Any],
    small_jobs: int,
    small_run_s: float = 4.0,
    gang_after_s: float = 3.0,
) -> None:
    """4 agents x 1 slot, a 1-worker job a second, a 4-worker job `gang_after_s` in."""
    sim = await scale.start_fleet(cluster, 4, scale.sim_config(cluster, task_run_s=None), results)
    results |= {"small_jobs": small_jobs, "small_run_s": small_run_s, "gang_after_s": gang_after_s}
    try:
        async with scale.admin_client(cluster) as http:
            digest = await scale.upload_bundle(http)
            figures = await starvation_run(http, sim, digest, small_jobs, small_run_s, gang_after_s)
            results |= figures
            results["devices_assigned_twice"] = sim.devices_assigned_twice()
    finally:
        await sim.close()


async def starvation_run(
    http: httpx.AsyncClient,
    sim: Simulator,
    digest: str,
    small_jobs: int,
    small_run_s: float,
    gang_after_s: float,
) -> dict[str, Any]:
    """Submits the small jobs on a 1 s clock and the gang at `gang_after_s`; follows the gang to RUNNING."""
    start = time.monotonic()
    small: list[str] = []
    small_sent: dict[str, float] = {}  # job id -> when its POST was sent
    gang_box: dict[str, Any] = {}

    async def small_stream() -> None:
        for i in range(small_jobs):
            await asyncio.sleep(max(0.0, start + i - time.monotonic()))
            sent = time.monotonic()
            job_id = await submit(http, digest, 1, f"bench-small-{i}", small_run_s, max_runtime_seconds=6)
            small.append(job_id)
            small_sent[job_id] = sent

    async def the_gang() -> None:
        await asyncio.sleep(max(0.0, start + gang_after_s - time.monotonic()))
        gang_box["submitted_at"] = time.monotonic()
        gang_box["id"] = await submit(http, digest, 4, "bench-gang-4", small_run_s)
        gang_box["accepted_at"] = time.monotonic()
        gang_box["running_at"] = await until_state(http, gang_box["id"], {"RUNNING"}, 120)

    await asyncio.gather(small_stream(), the_gang())
    submitted, running = gang_box["submitted_at"], gang_box["running_at"]
    gang_tasks = [t for t in sim.tasks() if t.job_id == gang_box["id"]]
    first_gang_start = min(t.started_at for t in gang_tasks)
    firsts: dict[str, SimTask] = {}
    for t in sim.tasks():
        if t.job_id in small and (t.job_id not in firsts or t.started_at < firsts[t.job_id].started_at):
            firsts[t.job_id] = t
    ahead = [j for j, t in firsts.items() if submitted <= t.started_at < first_gang_start]
    wait = running - submitted
    return {
        "gang_wait_s": wait,
        "gang_wait_over_run_time": wait / small_run_s,
        # Started after the gang's submit and before the gang: the brief's count. A small job submitted
        # at the same moment (3 s in) may be older and rightly ahead; "overtook" counts the ones sent
        # after the gang's submit had returned.
        "small_started_while_gang_waited": len(ahead),
        "small_overtook_gang": sum(1 for j in ahead if small_sent[j] >= gang_box["accepted_at"]),
        "small_started": len(firsts),
    }


# -- running ----------------------------------------------------------------------------------------------


def run_scenario(name: str, args: argparse.Namespace, database: BenchDatabase) -> dict[str, Any]:
    """One scenario against a fresh coordinator and database; a scenario that breaks returns its error."""
    results: dict[str, Any] = {}
    url = database.fresh(f"sharing_{name}")
    env = database.server_env(url)
    # The benches preempt jobs seconds old: no minimum run time.
    env |= {"MWMS_PREEMPTION_MIN_RUNTIME_S": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = TimedCluster(root=Path(tmp), server_env=env)
        cluster.profile_passes = bool(args.profile_passes)
        try:
            cluster.start_server()
            assert cluster.server is not None
            if name == "scale":
                coroutine = scenario_scale(
                    cluster,
                    database_url(cluster, url),
                    results,
                    args.agents,
                    args.jobs,
                    args.teams,
                    args.seconds,
                    database_pid=database.pid,
                    snapshot=args.logs / "sharing-scale-stuck.db" if args.logs else None,
                )
            elif name == "preemption":
                coroutine = scenario_preemption(
                    cluster,
                    results,
                    args.preemption_agents,
                    victim_workers=8,
                    preemptor_workers=64,
                    save_s=args.save_s,
                    grace_s=10,
                )
            else:
                coroutine = scenario_starvation(cluster, results, args.small_jobs)
            asyncio.run(coroutine)
            if cluster.profile_passes and cluster.pass_profile.exists():
                results["pass_profile_top"] = profile_summary(cluster.pass_profile)
            results["coordinator_rss_mib"] = bench_run.rss_mib(cluster.server.popen.pid)
            return results
        except Exception as error:  # noqa: BLE001 - a scenario that breaks is a result too
            tail = cluster.server.log_tail(40) if cluster.server else ""
            print(f"scenario {name} failed: {type(error).__name__}: {error}\n{tail}", file=sys.stderr)
            return results | {
                "error": f"{type(error).__name__}: {error}",
                "coordinator_log_tail": tail[-4000:],
            }
        finally:
            cluster.stop()
            if args.logs and cluster.server is not None:
                args.logs.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(
                    cluster.server.log_path, args.logs / f"sharing-{name}-{args.db}-coordinator.log"
                )
                shutil.copyfile(cluster.pass_log, args.logs / f"sharing-{name}-{args.db}-passes.txt")


def profile_summary(path: Path, limit: int = 30) -> list[str]:
    """The functions of server/ (and SQLAlchemy's execute) that took the passes' time, cumulative."""
    import pstats

    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    passes, total = max(
        ((v[1], v[3]) for k, v in stats.items() if k[2] == "schedule_pending"), default=(1, 0.0)
    )
    rows = []
    for (file, line, name), (_, calls, _own, cumulative, _) in stats.items():
        if "/server/" in file or name in ("execute", "flush", "commit"):
            where = file.split("/server/")[-1] if "/server/" in file else file.rsplit("/", 2)[-1]
            rows.append((cumulative, f"{name} ({where}:{line}), {calls} calls"))
    rows.sort(reverse=True)
    header = (
        f"{passes} passes of the window, {1000 * total / max(1, passes):.1f} ms a pass under cProfile; "
        "cumulative ms a pass, calls in all passes:"
    )
    return [header] + [f"{1000 * c / max(1, passes):8.1f}  {what}" for c, what in rows[:limit]]


def report(by_database: dict[str, dict[str, dict[str, Any]]], printing: bool = True) -> list[str]:
    """Prints every figure that has a target, one column per database, beside its target; returns the
    missed ones."""
    databases = list(by_database)
    missed = []
    columns = "".join(f" {db:>12}" for db in databases)
    out = print if printing else (lambda *_: None)
    out(f"\n{'scenario':<11} {'figure':<32}{columns}  target")
    for name, key, target, op in TARGETS:
        if not any(name in scenarios for scenarios in by_database.values()):
            continue
        shown_all = []
        for db in databases:
            scenarios = by_database[db]
            if name not in scenarios:
                shown_all.append(f" {'-':>12}")
                continue
            value = scenarios[name].get(key)
            ok = bench_run.meets(value, target, op)
            shown = f"{value:,.2f}" if isinstance(value, float) else str(value)
            shown_all.append(f" {shown + ('' if ok else ' ✘'):>12}")
            if not ok:
                missed.append(f"{name}.{key} ({db}): {shown} (target {op} {target})")
        out(f"{name:<11} {key:<32}{''.join(shown_all)}  {op} {target}")
    return missed


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="repeatable; default: all")
    parser.add_argument("--agents", type=int, default=1000, help="simulated agents (scale)")
    parser.add_argument("--jobs", type=int, default=10_000, help="waiting jobs (scale)")
    parser.add_argument("--teams", type=int, default=20, help="teams the waiting jobs belong to (scale)")
    parser.add_argument("--seconds", type=float, default=30, help="window of timed passes (scale)")
    parser.add_argument("--preemption-agents", type=int, default=256, help="simulated agents (preemption)")
    parser.add_argument("--save-s", type=float, default=1.0, help="a victim task's save before exit 42")
    parser.add_argument("--small-jobs", type=int, default=15, help="1-worker jobs, one a second (starvation)")
    parser.add_argument(
        "--profile-passes", action="store_true", help="run every pass under cProfile (slower; for the cause)"
    )
    parser.add_argument("--logs", type=Path, help="keep each coordinator's log and pass times in this folder")
    parser.add_argument(
        "--db",
        action="append",
        choices=CHOICES,
        help="the coordinators' database; repeatable (figures side by side); default: sqlite",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="default: bench/results_sharing.json (_postgres for PostgreSQL); one --db only",
    )
    args = parser.parse_args()
    databases = list(dict.fromkeys(args.db or ["sqlite"]))
    if args.out is not None and len(databases) > 1:
        parser.error("--out takes one --db")
    chosen = args.scenario or list(SCENARIOS)
    by_database = {db: run_database(db, args, chosen) for db in databases}
    missed = report(by_database)
    for line in missed:
        print(f"MISSED TARGET {line}", file=sys.stderr)
    return 1 if missed else 0


def run_database(db: str, args: argparse.Namespace, chosen: list[str]) -> dict[str, dict[str, Any]]:
    """The chosen scenarios against coordinators on `db`; results written to its results file."""
    out = args.out or ROOT / "bench" / f"results_sharing{'' if db == 'sqlite' else '_' + db}.json"
    args = argparse.Namespace(**{**vars(args), "db": db})
    stamp = {
        "run_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": bench_run.commit(),
        "machine": bench_run.machine(),
        "arguments": " ".join(sys.argv[1:]),
        "database": db,
    }
    scenarios: dict[str, dict[str, Any]] = {}
    with bench_database(args.db) as database:
        for name in SCENARIOS:
            if name not in chosen:
                continue
            speed = machine_speed()
            started = time.monotonic()
            load_before = os.getloadavg()
            print(f"--- {name} ({args.db}; {speed_line(speed)})", file=sys.stderr, flush=True)
            scenarios[name] = run_scenario(name, args, database)
            scenarios[name]["scenario_wall_s"] = time.monotonic() - started
            scenarios[name]["load_average_before"] = load_before
            scenarios[name]["load_average_after"] = os.getloadavg()
            scenarios[name]["machine_speed_before"] = speed
            scenarios[name].update(stamp)
            print(json.dumps({name: scenarios[name]}, indent=2, default=str), flush=True)
            bench_run.write_results(out, stamp, scenarios, missed=None)  # type: ignore[arg-type]
    missed = report({db: scenarios}, printing=False)
    bench_run.write_results(out, stamp, scenarios, missed)  # type: ignore[arg-type]
    return scenarios


if __name__ == "__main__":
    raise SystemExit(main())
