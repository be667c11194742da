"""A test-only coordinator stand-in: the dashboard router plus fixed, slowly advancing JSON for /api/v1.

It lets the browser tests check rendering, live updates, escaping and the cancel flow without agents or
TensorFlow. The shapes follow server/schemas/; the real coordinator is exercised by test_dashboard_e2e.py.
Authentication is a small copy of the real rules (server/api/auth.py): three fixed tokens, session cookies,
401 without one, 403 for a viewer's writes, someone else's cancel or a cookie write from a foreign origin.
Sharing (issue 18): jobs carry team, priority, preemptible and waiting; /api/v1/queue lists the waiting jobs
(PENDING, RESTARTING, PREEMPTING) highest priority first, then oldest, each with its estimated start and
basis (`FakeJob.estimated_start`, `estimate_basis`); /api/v1/teams answers
`FakeCluster.teams`; agents carry cordon fields, set per agent in `FakeCluster.agent_cordons`.
Each attempt in a job's attempt_history carries its `ended` and `events` (attempt_ending, attempt_events);
`FakeJob.ending` says how each ended, and a test's subclass may tell other stories.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel

from mwms.server.api import dashboard
from mwms.server.api.security_headers import SecurityHeadersMiddleware
from mwms_testkit.served_app import served

XSS_NAME = "<img src=x onerror=alert(1)>"
XSS_LOG = "<script>alert('log')</script><b>bold?</b>"
# An hour ago, so durations and "ago" times in screenshots look like a live cluster's.
FAILED_ATTEMPT_REASON = "task 1 was killed by signal 9 (SIGKILL); restarting; last lines:\n" + "\n".join(
    f"I0000 worker log line {i} <tag> " + "x" * 80 for i in range(12)
)
T0 = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)

SESSION_COOKIE = "mwms_session"
ADMIN_TOKEN = "fake-admin-token"
USER_TOKEN = "fake-user-token"
VIEWER_TOKEN = "fake-viewer-token"
# secret -> (user, role); bob submitted two of the jobs below, alice the others.
TOKENS = {ADMIN_TOKEN: ("alice", "admin"), USER_TOKEN: ("bob", "user"), VIEWER_TOKEN: ("carol", "viewer")}


WAITING_STATES = ("PENDING", "RESTARTING", "PREEMPTING")
NO_FIT = {
    "kind": "no_fit",
    "message": "needs 2 workers × 1 GPU at once; the most free on online agents is 1 GPU",
    "estimated_start": None,
}


def default_teams() -> list[dict[str, Any]]:
    """What GET /api/v1/teams answers unless a test changes it: a team with a GPU quota and recent use, and a
    team of one that has not run lately."""
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


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment else None


def _task(
    job_id: str,
    created: datetime,
    index: int,
    attempt: int,
    state: str,
    agent: str,
    exit_code: int | None = None,
) -> dict:
    workers = [f"10.0.0.{i + 11}:4{i}001" for i in range(2)]
    return {
        "id": f"{job_id}-a{attempt}-t{index}",
        "index": index,
        "attempt": attempt,
        "agent_id": f"agent-{agent}",
        "agent_name": agent,
        "address": workers[index],
        "state": state,
        "exit_code": exit_code,
        "message": "exited with code 0" if exit_code == 0 else "",
        "pid": 4100 + index if exit_code is None else None,
        "device_kind": "gpu",
        "device_indices": [index],
        "device_uuids": [],
        "tf_config": f'{{"cluster": {{"worker": ["{workers[0]}", "{workers[1]}"]}}, '
        f'"task": {{"type": "worker", "index": {index}}}}}',
        "started_at": _iso(created + timedelta(minutes=3 * (attempt - 1), seconds=20)),
        "ended_at": _iso(created + timedelta(minutes=9)) if exit_code is not None else None,
        "environment": "",
        "environment_build_seconds": None,
        # Worker 0 reported its peak memory (1.2 GiB), worker 1 only the limit its agent applied.
        "peak_memory_bytes": 1288490188 if index == 0 else None,
        "memory_limit_bytes": 8 * 2**30,
        "ended_attempt": False,
    }


@dataclass
class FakeJob:
    id: str
    name: str
    state: str
    created_at: datetime
    attempts: int = 1
    finish_after_polls: int | None = None
    polls: int = 0
    metrics: list[dict] = field(default_factory=list)
    logs: list[dict] = field(default_factory=list)
    reason: str = ""
    submitted_by: str = "alice"
    cancelled_by: str = ""
    team: str = "vision"
    priority: int = 500
    preemptible: bool = True
    waiting: dict[str, Any] = field(default_factory=dict)
    # The queue row's estimated start for people and its basis (server/services/scheduler/start_estimates.py).
    estimated_start: datetime | None = None
    estimate_basis: str = "unknown"

    def summary(self) -> dict[str, Any]:
        last_loss = next((p for p in reversed(self.metrics) if p["name"] == "loss"), None)
        finished = self.state in ("SUCCEEDED", "FAILED", "CANCELLED")
        return {
            "id": self.id,
            "name": self.name,
            "state": self.state,
            "reason": self.reason,
            "workers": 2,
            "gpus_per_worker": 1,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.created_at + timedelta(seconds=5)) if self.state != "PENDING" else None,
            "finished_at": _iso(self.created_at + timedelta(minutes=9)) if finished else None,
            "attempts": self.attempts,
            "restarts": self.attempts - 1,
            "step": last_loss["step"] if last_loss else None,
            "loss": last_loss["value"] if last_loss else None,
            "submitted_by": self.submitted_by,
            "cancelled_by": self.cancelled_by,
            "team": self.team,
            "priority": self.priority,
            "preemptible": self.preemptible,
            "waiting": self.waiting if self.state in WAITING_STATES else {},
        }

    def queue_row(self, position: int) -> dict[str, Any]:
        """This job as GET /api/v1/queue lists it."""
        return {
            "position": position,
            "job_id": self.id,
            "name": self.name,
            "state": self.state,
            "team": self.team,
            "submitted_by": self.submitted_by,
            "priority": self.priority,
            "workers": 2,
            "gpus_per_worker": 1,
            "preemptible": self.preemptible,
            "created_at": _iso(self.created_at),
            "waiting": self.waiting,
            "estimated_start": _iso(self.estimated_start),
            "estimate_basis": self.estimate_basis,
        }

    def ending(self, number: int, state: str) -> dict[str, Any]:
        """How attempt `number` ended (its `ended`), as the coordinator words it; a test's subclass may tell
        other stories."""
        if state == "FAILED":
            return attempt_ending(
                "task_failed",
                "task 1 failed on agent gpu-node-2: exit code 137 (SIGKILL); restart 1 of 3",
                task=1,
                agent="gpu-node-2",
                agent_id="agent-2",
                exit_code=137,
                restart=number,
                restart_cause="signal",
            )
        if state == "CANCELLED":
            by = self.cancelled_by
            return attempt_ending("cancelled", f"cancelled by {by}" if by else "cancelled", by=by)
        return attempt_ending("succeeded", "succeeded: every task exited 0")

    def detail(self) -> dict[str, Any]:
        task_state = {"SUCCEEDED": "SUCCEEDED", "CANCELLED": "STOPPED", "PENDING": None}.get(
            self.state, "RUNNING"
        )
        exit_code = 0 if self.state == "SUCCEEDED" else (-15 if self.state == "CANCELLED" else None)
        tasks = (
            [
                _task(self.id, self.created_at, i, self.attempts, task_state, f"gpu-node-{i + 1}", exit_code)
                for i in range(2)
            ]
            if task_state
            else []
        )
        history = []
        for number in range(1, self.attempts + 1):
            newest = number == self.attempts
            state = ("ACTIVE" if task_state == "RUNNING" else self.state) if newest else "FAILED"
            created = self.created_at + timedelta(minutes=3 * (number - 1))
            ended = None if state == "ACTIVE" else self.created_at + timedelta(minutes=3 * number)
            history.append(
                {
                    "number": number,
                    "state": state,
                    "reason": "" if newest else FAILED_ATTEMPT_REASON,
                    "created_at": _iso(created),
                    "ended_at": _iso(ended),
                    "tasks": tasks,
                    "ended": None if ended is None else self.ending(number, state),
                    "events": attempt_events(state, created, ended, self.ending(number, state)["kind"]),
                }
            )
        events = [
            {"from_state": None, "to_state": "PENDING", "reason": "submitted", "at": _iso(self.created_at)},
            {
                "from_state": "PENDING",
                "to_state": "SCHEDULED",
                "reason": "placed on gpu-node-1, gpu-node-2",
                "at": _iso(self.created_at + timedelta(seconds=2)),
            },
            {
                "from_state": "SCHEDULED",
                "to_state": "RUNNING",
                "reason": "all 2 tasks running",
                "at": _iso(self.created_at + timedelta(seconds=5)),
            },
        ]
        if self.state in ("SUCCEEDED", "CANCELLED"):
            events.append(
                {
                    "from_state": "RUNNING",
                    "to_state": self.state,
                    "reason": self.reason or "all tasks exited 0",
                    "at": _iso(self.created_at + timedelta(minutes=9)),
                }
            )
        return {
            **self.summary(),
            "command": ["python", "train.py", "--epochs", "3", "--note", "it's quoted"],
            "bundle_digest": "ab" * 32,
            "env_names": ["WANDB_MODE", "DATA_DIR"],
            "communication": {"implementation": "NCCL", "timeout_seconds": 600.0, "bytes_per_pack": 33554432},
            "restart": {"max_restarts": 3, "restart_on": "retryable"},
            "startup_timeout_seconds": 300.0,
            "max_runtime_seconds": None,
            "tasks": tasks,
            "latest_stacks": None,
            "attempt_history": history,
            "events": events,
        }


ENDING_FIELDS = (
    "job_id",
    "priority",
    "team",
    "agent",
    "agent_id",
    "task",
    "exit_code",
    "by",
    "restart",
    "restart_cause",
)


def attempt_ending(kind: str, message: str, details: dict[str, Any] | None = None, **actors: Any) -> dict:
    """An attempt's `ended` as the coordinator answers it (schemas.AttemptEndingOut): every actor field,
    null where the kind has none."""
    unknown = set(actors) - set(ENDING_FIELDS)
    assert not unknown, f"not fields of AttemptEndingOut: {unknown}"
    return {
        "kind": kind,
        "message": message,
        **dict.fromkeys(ENDING_FIELDS),
        **actors,
        "details": details or {},
    }


def attempt_events(state: str, created: datetime, ended: datetime | None, cause: str) -> list[dict]:
    """An attempt's events: placed (ACTIVE), then its ending with the ending's kind as cause."""
    events = [
        {"from_state": None, "to_state": "ACTIVE", "reason": "placing", "at": _iso(created), "cause": ""}
    ]
    if ended is not None:
        events.append(
            {"from_state": "ACTIVE", "to_state": state, "reason": "", "at": _iso(ended), "cause": cause}
        )
    return events


def _loss_curve(attempts: int, steps_per_attempt: int) -> list[dict]:
    points = []
    for attempt in range(1, attempts + 1):
        start = (attempt - 1) * (steps_per_attempt // 2)
        for step in range(start, start + steps_per_attempt):
            value = 2.3 * (0.955**step) + 0.05 * attempt
            wall = _iso(T0 + timedelta(seconds=step))
            points.append(
                {"name": "loss", "step": step, "value": value, "wall_time": wall, "attempt": attempt}
            )
            points.append(
                {
                    "name": "accuracy",
                    "step": step,
                    "value": 1 - value / 2.5,
                    "wall_time": wall,
                    "attempt": attempt,
                }
            )
    return points


def _log_lines(job_id: str, count: int) -> list[dict]:
    lines = []
    for task in range(2):
        for seq in range(count):
            attempt = 1 if seq < count // 2 else 2
            text = f"Epoch 1/3 - step {seq}/{count} - loss: {2.3 * 0.955**seq:.4f}"
            if seq == 3:
                text = XSS_LOG
            lines.append(
                {
                    "id": task * 10_000 + seq + 1,
                    "task": task,
                    "attempt": attempt,
                    "seq": seq,
                    "stream": "stderr" if seq % 17 == 5 else "stdout",
                    "text": text,
                    "at": _iso(T0 + timedelta(seconds=seq)),
                }
            )
    return lines


class FakeCluster:
    """The fake coordinator's state; tests reach it through the app to flip switches."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.unreachable = False
        self.empty = False
        self.jobs: dict[str, FakeJob] = {}
        self.sessions: dict[str, tuple[str, str]] = {}  # cookie secret -> (user, role)
        self.cancel_refusal: str | None = None  # when set, every cancel answers 403 with it
        self.teams: list[dict[str, Any]] = []
        self.teams_refusal: str | None = None  # when set, GET /api/v1/teams answers 500 with it
        # agent id -> the cordon fields it answers with (cordoned, cordoned_at, cordoned_by, ...)
        self.agent_cordons: dict[str, dict[str, Any]] = {}
        # Every read of a job's metrics: its `after` cursor and how many points it answered.
        self.metric_reads: list[dict[str, Any]] = []
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.unreachable = False
            self.empty = False
            self.sessions.clear()
            self.cancel_refusal = None
            self.teams = default_teams()
            self.teams_refusal = None
            self.agent_cordons = {}
            self.metric_reads = []
            finishing = FakeJob(
                "7f3c2a91d0b44c7e9a61b0c3d5e8f201",
                "resnet50-imagenet",
                "RUNNING",
                T0 + timedelta(minutes=30),
                attempts=2,
                finish_after_polls=3,
                metrics=_loss_curve(2, 40),
                logs=_log_lines("resnet", 60),
                submitted_by="bob",
            )
            xss = FakeJob(
                "0b1e2d3c4f5a69788796a5b4c3d2e1f0",
                XSS_NAME,
                "RUNNING",
                T0 + timedelta(minutes=20),
                metrics=_loss_curve(1, 10),
                logs=_log_lines("xss", 8),
            )
            done = FakeJob(
                "c0ffee00c0ffee00c0ffee00c0ffee00",
                "bert-finetune",
                "SUCCEEDED",
                T0,
                metrics=_loss_curve(1, 25),
                logs=_log_lines("bert", 12),
                reason="all tasks exited 0",
                submitted_by="bob",
            )
            pending = FakeJob(
                "aa55aa55aa55aa55aa55aa55aa55aa55",
                "waiting-for-gpus",
                "PENDING",
                T0 + timedelta(minutes=40),
                waiting=dict(NO_FIT),
            )
            self.jobs = {job.id: job for job in (finishing, xss, done, pending)}

    def advance(self, job: FakeJob) -> None:
        job.polls += 1
        if (
            job.finish_after_polls is not None
            and job.state == "RUNNING"
            and job.polls >= job.finish_after_polls
        ):
            job.state = "SUCCEEDED"
            job.reason = "all tasks exited 0"


NOT_CORDONED = {
    "cordoned": False,
    "cordoned_at": None,
    "cordoned_by": "",
    "cordon_reason": "",
    "draining": False,
    "drained": False,
}

AGENTS = [
    {
        "id": "agent-1",
        "name": "gpu-node-1",
        "hostname": "gpu-node-1.cluster.local",
        "address": "10.0.0.11",
        "port_range": "40000-40999",
        "version": "0.1.0",
        "online": True,
        "last_heartbeat_at": None,
        "devices": [
            {
                "kind": "gpu",
                "index": i,
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": f"GPU-{i}",
                "memory_mib": 81559,
            }
            for i in range(4)
        ],
        "devices_used": 1,
        "devices_free": 3,
        **NOT_CORDONED,
        "tasks": [
            {
                "job_id": "7f3c2a91d0b44c7e9a61b0c3d5e8f201",
                "job_name": "resnet50-imagenet",
                "task_index": 0,
                "attempt": 2,
                "state": "RUNNING",
                "device_indices": [0],
            }
        ],
    },
    {
        "id": "agent-2",
        "name": XSS_NAME,
        "hostname": "cpu-box",
        "address": "10.0.0.12",
        "port_range": "41000-41999",
        "version": "0.1.0",
        "online": False,
        "last_heartbeat_at": _iso(T0),
        "devices": [
            {"kind": "cpu", "index": i, "name": "cpu", "uuid": "", "memory_mib": 0} for i in range(2)
        ],
        "devices_used": 0,
        "devices_free": 2,
        **NOT_CORDONED,
        "tasks": [],
    },
]


class LoginRequest(BaseModel):
    token: str


def _caller(cluster: FakeCluster, request: Request) -> tuple[str, str] | None:
    scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return TOKENS.get(bearer.strip())
    return cluster.sessions.get(request.cookies.get(SESSION_COOKIE, ""))


def create_fake_app(cluster: FakeCluster) -> FastAPI:
    """A FastAPI app serving fake /api/v1 data for cluster, then the dashboard router, as the real app does."""
    app = FastAPI()

    @app.middleware("http")
    async def authenticate(request, call_next):  # type: ignore[no-untyped-def]
        path, method = request.url.path, request.method
        if not path.startswith("/api/") or (method, path) == ("POST", "/api/v1/session"):
            return await call_next(request)
        caller = _caller(cluster, request)
        if caller is None:
            return JSONResponse({"detail": "authentication required (fake)"}, status_code=401)
        if method not in ("GET", "HEAD"):
            cookie_only = not request.headers.get("authorization")
            origin = request.headers.get("origin", "")
            if cookie_only and origin.split("://", 1)[-1] != request.headers.get("host"):
                return JSONResponse({"detail": "cross-site request refused (fake)"}, status_code=403)
            if caller[1] == "viewer" and (method, path) != ("DELETE", "/api/v1/session"):
                return JSONResponse({"detail": f"the viewer role of {caller[0]!r} may not do this"}, 403)
        request.state.caller = caller
        return await call_next(request)

    @app.middleware("http")
    async def maybe_down(request, call_next):  # type: ignore[no-untyped-def]
        if cluster.unreachable and request.url.path.startswith("/api/"):
            return PlainTextResponse("coordinator down", status_code=503)
        return await call_next(request)

    app.add_middleware(SecurityHeadersMiddleware)

    def whoami_out(caller: tuple[str, str]) -> dict:
        return {"user": caller[0], "role": caller[1], "token_name": "", "via_session": True}

    @app.post("/api/v1/session")
    def log_in(body: LoginRequest, response: Response) -> dict:
        caller = TOKENS.get(body.token)
        if caller is None:
            raise HTTPException(401, "the token is unknown, revoked or expired (fake)")
        secret = secrets.token_urlsafe(16)
        cluster.sessions[secret] = caller
        response.set_cookie(SESSION_COOKIE, secret, httponly=True, samesite="strict", path="/")
        return whoami_out(caller)

    @app.delete("/api/v1/session", status_code=204)
    def log_out(request: Request) -> Response:
        cluster.sessions.pop(request.cookies.get(SESSION_COOKIE, ""), None)
        response = Response(status_code=204)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    @app.get("/api/v1/whoami")
    def whoami(request: Request) -> dict:
        return whoami_out(request.state.caller)

    def get_job(job_id: str) -> FakeJob:
        job = cluster.jobs.get(job_id)
        if job is None:
            raise HTTPException(404, f"job {job_id} not found")
        return job

    @app.get("/api/v1/overview")
    def overview() -> dict:
        states = [job.state for job in cluster.jobs.values()]
        return {
            "agents_online": 1,
            "agents_lost": 1,
            "devices_busy": 1,
            "devices_free": 5,
            "jobs_running": states.count("RUNNING"),
            "jobs_pending": states.count("PENDING"),
        }

    @app.get("/api/v1/jobs")
    def jobs(state: str | None = None, offset: int = 0, limit: int = 50) -> dict:
        with cluster.lock:
            for job in cluster.jobs.values():
                cluster.advance(job)
            everything = [] if cluster.empty else list(cluster.jobs.values())
            selected = [job for job in everything if not state or job.state == state]
        selected.sort(key=lambda job: job.created_at, reverse=True)
        return {
            "jobs": [job.summary() for job in selected[offset : offset + limit]],
            "total": len(selected),
            "offset": offset,
            "limit": limit,
        }

    @app.get("/api/v1/jobs/{job_id}")
    def job_detail(job_id: str) -> dict:
        return get_job(job_id).detail()

    @app.post("/api/v1/jobs/{job_id}/cancel")
    def cancel(job_id: str, request: Request) -> dict:
        job = get_job(job_id)
        user, role = request.state.caller
        if cluster.cancel_refusal:
            raise HTTPException(403, cluster.cancel_refusal)
        if role != "admin" and job.submitted_by != user:
            raise HTTPException(
                403, f"{user!r} may cancel only their own jobs; {job.submitted_by!r} submitted this one"
            )
        with cluster.lock:
            if job.state in ("SUCCEEDED", "FAILED", "CANCELLED"):
                raise HTTPException(409, f"job {job_id} already ended ({job.state})")
            job.state = "CANCELLED"
            job.reason = f"cancelled by {user}"
            job.cancelled_by = user
        return job.summary()

    @app.get("/api/v1/jobs/{job_id}/metrics")
    def metrics(
        job_id: str,
        name: str | None = None,
        min_step: int | None = None,
        max_step: int | None = None,
        attempt: int | None = None,
        after: int | None = None,
        limit: int = Query(default=10_000, ge=1, le=10_000),
    ) -> dict:
        # As the coordinator: a point's cursor is its place in storage (1-based), pages after it.
        stored = list(enumerate(get_job(job_id).metrics, start=1))
        matching = [
            (cursor, p)
            for cursor, p in stored
            if (not name or p["name"] == name)
            and (min_step is None or p["step"] >= min_step)
            and (max_step is None or p["step"] <= max_step)
            and (attempt is None or p["attempt"] == attempt)
            and (after is None or cursor > after)
        ]
        if after is None:
            matching.sort(key=lambda pair: (pair[1]["name"], pair[1]["attempt"], pair[1]["step"]))
        page, more = matching[:limit], len(matching) > limit
        cluster.metric_reads.append({"after": after, "points": len(page)})
        if after is not None:
            cursor = page[-1][0] if page else after
        else:
            cursor = 0 if more else max((c for c, _ in page), default=0)
        return {"points": [p for _, p in page], "cursor": cursor, "more": more}

    @app.get("/api/v1/jobs/{job_id}/logs")
    def logs(job_id: str, task: int = 0, after: int = 0, tail: int = Query(default=500, le=5000)) -> dict:
        lines = [line for line in get_job(job_id).logs if line["task"] == task and line["id"] > after][-tail:]
        return {"lines": lines, "next_after": lines[-1]["id"] if lines else after}

    @app.get("/api/v1/jobs/{job_id}/artifacts")
    def artifacts(job_id: str) -> list:
        job = get_job(job_id)
        if job.state != "SUCCEEDED":
            return []
        return [
            {
                "path": "model/saved_model.pb",
                "size": 48_213_004,
                "sha256": "cd" * 32,
                "attempt": 1,
                "created_at": _iso(T0),
            },
            {
                "path": "metrics <final>.json",
                "size": 812,
                "sha256": "ef" * 32,
                "attempt": 1,
                "created_at": _iso(T0),
            },
        ]

    @app.get("/api/v1/jobs/{job_id}/devices")
    def job_devices(job_id: str) -> dict:
        # Its tasks' GPUs, without telemetry (the fake's agents sample none).
        job = get_job(job_id)
        tasks = [
            {
                "task_index": task["index"],
                "agent_id": task["agent_id"],
                "agent_name": task["agent_name"],
                "device_kind": task["device_kind"],
                "device_indices": task["device_indices"],
                "device_uuids": [],
                "started_at": task["started_at"],
                "ended_at": task["ended_at"],
                "series": [],
            }
            for task in job.detail()["tasks"]
        ]
        return {"job_id": job.id, "attempt": job.attempts, "bucket_seconds": 10, "tasks": tasks}

    @app.get("/api/v1/jobs/{job_id}/preflight")
    def job_preflight(job_id: str) -> dict:
        return {"job_id": get_job(job_id).id, "attempts": []}

    @app.get("/api/v1/jobs/{job_id}/stacks")
    def latest_stacks(job_id: str) -> dict:
        # Like the coordinator: 404 until a dump was taken (a job's latest_stacks names the newest).
        raise HTTPException(404, f"no stacks of job {get_job(job_id).id} were dumped yet")

    @app.get("/api/v1/jobs/{job_id}/artifacts/{path:path}")
    def artifact(job_id: str, path: str) -> PlainTextResponse:
        get_job(job_id)
        return PlainTextResponse(f"artifact {path}")

    @app.get("/api/v1/agents")
    def agents() -> JSONResponse:
        if cluster.empty:
            return JSONResponse([])
        fresh = [dict(AGENTS[0], last_heartbeat_at=_iso(datetime.now(timezone.utc))), AGENTS[1]]
        return JSONResponse([dict(agent, **cluster.agent_cordons.get(agent["id"], {})) for agent in fresh])

    @app.get("/api/v1/queue")
    def queue(offset: int = Query(default=0, ge=0), limit: int = Query(default=50, ge=1, le=500)) -> dict:
        with cluster.lock:
            waiting = [] if cluster.empty else [j for j in cluster.jobs.values() if j.state in WAITING_STATES]
        waiting.sort(key=lambda job: (-job.priority, job.created_at))
        return {
            "jobs": [job.queue_row(offset + i + 1) for i, job in enumerate(waiting[offset : offset + limit])],
            "total": len(waiting),
            "offset": offset,
            "limit": limit,
        }

    @app.get("/api/v1/teams")
    def teams() -> list:
        if cluster.teams_refusal:
            raise HTTPException(500, cluster.teams_refusal)
        return [] if cluster.empty else cluster.teams

    app.include_router(dashboard.router)
    return app


class ServerThread:
    """The fake coordinator served over real HTTP (testkit/mwms_testkit/served_app.py); `url` once entered."""

    def __init__(self, app: FastAPI) -> None:
        self._serving = served(app)
        self.url = ""

    def __enter__(self) -> ServerThread:
        self.url = self._serving.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._serving.__exit__(None, None, None)
