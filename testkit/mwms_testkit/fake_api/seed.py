"""The cluster the dashboard's browser tests start from (`FakeState(seeded=True)`): four jobs (one finishing
after three lists, one with a hostile name and log line, one done, one waiting for GPUs), two agents (one a
GPU node, one lost with a hostile name), two teams, the jobs' artifacts, and three tokens easy to type
(fake-admin-token, fake-user-token and fake-viewer-token).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from mwms_testkit.fake_api.fake_job import T0, FakeJob, _iso
from mwms_testkit.fake_api.state import fake_agent

if TYPE_CHECKING:
    from mwms_testkit.fake_api.state import FakeState

XSS_NAME = "<img src=x onerror=alert(1)>"
XSS_LOG = "<script>alert('log')</script><b>bold?</b>"
NO_FIT = {
    "kind": "no_fit",
    "message": "needs 2 workers × 1 GPU at once; the most free on online agents is 1 GPU",
    "estimated_start": None,
}
RESNET = "7f3c2a91d0b44c7e9a61b0c3d5e8f201"
BERT = "c0ffee00c0ffee00c0ffee00c0ffee00"
XSS_JOB = "0b1e2d3c4f5a69788796a5b4c3d2e1f0"
WAITING_JOB = "aa55aa55aa55aa55aa55aa55aa55aa55"


def default_teams() -> list[dict[str, Any]]:
    """A team with a GPU quota and recent use, and a team of one that has not run lately."""
    return [
        {
            "team": "vision",
            "members": ["alice", "bob"],
            "quota": {"gpus": 4, "cpu_slots": None},
            "in_use": {"gpus": 1, "cpu_slots": 0},
            "usage_device_hours": {"gpus": 10.5, "cpu_slots": 0.0},
            "share": {"gpus": 4.0, "cpu_slots": 2.0},
            "standing": 2.625,
        },
        {
            "team": "carol",
            "members": [],
            "quota": None,
            "in_use": {"gpus": 0, "cpu_slots": 0},
            "usage_device_hours": {"gpus": 0.0, "cpu_slots": 0.0},
            "share": {"gpus": 2.0, "cpu_slots": 2.0},
            "standing": 0.0,
        },
    ]


def loss_curve(attempts: int, steps_per_attempt: int) -> list[dict]:
    """Loss and accuracy points of each attempt, each attempt starting halfway through the one before."""
    points = []
    for attempt in range(1, attempts + 1):
        start = (attempt - 1) * (steps_per_attempt // 2)
        for step in range(start, start + steps_per_attempt):
            value = 2.3 * (0.955**step) + 0.05 * attempt
            wall = _iso(T0 + timedelta(seconds=step))
            for name, shown in (("loss", value), ("accuracy", 1 - value / 2.5)):
                points.append(
                    {"name": name, "step": step, "value": shown, "wall_time": wall, "attempt": attempt}
                )
    return points


def log_lines(count: int) -> list[dict]:
    """`count` lines of each of two tasks, the fourth of each hostile HTML, some on stderr."""
    lines = []
    for task in range(2):
        for seq in range(count):
            text = XSS_LOG if seq == 3 else f"Epoch 1/3 - step {seq}/{count} - loss: {2.3 * 0.955**seq:.4f}"
            lines.append(
                {
                    "id": task * 10_000 + seq + 1,
                    "task": task,
                    "attempt": 1 if seq < count // 2 else 2,
                    "seq": seq,
                    "stream": "stderr" if seq % 17 == 5 else "stdout",
                    "text": text,
                    "at": _iso(T0 + timedelta(seconds=seq)),
                }
            )
    return lines


def seeded_agents() -> list[dict[str, Any]]:
    gpus = [
        {"kind": "gpu", "index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{i}", "memory_mib": 81559}
        for i in range(4)
    ]
    task = {
        "job_id": RESNET,
        "job_name": "resnet50-imagenet",
        "task_index": 0,
        "attempt": 2,
        "state": "RUNNING",
        "device_indices": [0],
    }
    node = {"hostname": "gpu-node-1.cluster.local", "address": "10.0.0.11", "port_range": "40000-40999"}
    cpus = [{"kind": "cpu", "index": i, "name": "cpu", "uuid": "", "memory_mib": 0} for i in range(2)]
    lost = {"hostname": "cpu-box", "address": "10.0.0.12", "port_range": "41000-41999", "online": False}
    lost |= {"state": "lost", "lost_at": _iso(T0)}
    return [
        fake_agent(
            "agent-1",
            "gpu-node-1",
            **node,
            devices=gpus,
            devices_used=1,
            devices_free=3,
            tasks=[task],
        ),
        fake_agent("agent-2", XSS_NAME, **lost, last_heartbeat_at=_iso(T0), devices=cpus, devices_free=2),
    ]


def seeded_jobs() -> list[FakeJob]:
    """One finishing after three lists, one with a hostile name, one done (bob submitted these two), and
    one waiting for GPUs; each with loss curves and log lines of its attempts."""
    later = [T0 + timedelta(minutes=minutes) for minutes in (30, 20, 40)]
    jobs = [
        FakeJob(RESNET, "resnet50-imagenet", "RUNNING", later[0], attempts=2, finish_after_polls=3),
        FakeJob(XSS_JOB, XSS_NAME, "RUNNING", later[1]),
        FakeJob(BERT, "bert-finetune", "SUCCEEDED", T0, reason="all tasks exited 0"),
        FakeJob(WAITING_JOB, "waiting-for-gpus", "PENDING", later[2], waiting=dict(NO_FIT)),
    ]
    stories = [(2, 40, 60), (1, 10, 8), (1, 25, 12), (1, 0, 0)]  # attempts, steps each, log lines
    for job, (attempts, steps, lines) in zip(jobs, stories, strict=True):
        job.metrics, job.logs = loss_curve(attempts, steps), log_lines(lines)
    jobs[0].submitted_by = jobs[2].submitted_by = "bob"
    return jobs


def seed_dashboard_cluster(state: FakeState) -> None:
    """Puts the dashboard's cluster into `state`."""
    state.jobs = {job.id: job for job in seeded_jobs()}
    state.agents = seeded_agents()
    state.teams = default_teams()
    for user, role in (("alice", "admin"), ("bob", "user"), ("carol", "viewer")):
        # Short tokens to type into the login form by hand, beside the three every FakeState has.
        state.add_token(f"fake-{role}-token", user, role, name=f"{user}'s dashboard token")
    saved = {"model/saved_model.pb": b"\x08\x01" * 1024, "metrics <final>.json": b'{"loss": 0.1}'}
    state.artifacts = {RESNET: dict(saved), BERT: dict(saved)}
