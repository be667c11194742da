"""A small, real HTTP stand-in for the coordinator's REST API, served by uvicorn on a free port.

It speaks the API contract (request bodies are validated with mwms.server.schemas.JobCreate) so the CLI can be
tested over real HTTP before, and independently of, the real coordinator. Jobs move one state per GET:
PENDING -> RUNNING (twice, with step/loss) -> SUCCEEDED, or FAILED when the command contains "fail".

Like the real API it wants `Authorization: Bearer <token>` on every route but /healthz: 401 without a known
token, 403 when the token's role is too low (GET: viewer, other methods: user, tokens and removing agents:
admin). The known tokens are ADMIN_TOKEN, USER_TOKEN and VIEWER_TOKEN, plus those made through the API.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Annotated, Any

from fastapi import FastAPI, File, HTTPException, Query, Request, UploadFile
from fastapi.responses import JSONResponse, Response, StreamingResponse

from mwms.server.schemas import JobCreate
from mwms_testkit.served_app import served

DIGEST_OF_EMPTY = hashlib.sha256(b"").hexdigest()
ADMIN_TOKEN = "mwms_fake-admin-secret-0123456789"
USER_TOKEN = "mwms_fake-user-secret-0123456789"
VIEWER_TOKEN = "mwms_fake-viewer-secret-0123456789"
ROLE_RANK = {"viewer": 1, "user": 2, "admin": 3}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


@dataclass
class FakeState:
    bundles: dict[str, bytes] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)
    logs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    artifacts: dict[str, dict[str, bytes]] = field(default_factory=dict)
    polls: dict[str, int] = field(default_factory=dict)
    upload_content_lengths: list[int | None] = field(default_factory=list)
    # secret -> token object (as the API lists it); the three below exist from the start
    tokens: dict[str, dict[str, Any]] = field(default_factory=dict)
    join_tokens: dict[str, dict[str, Any]] = field(default_factory=dict)
    removed_agents: list[str] = field(default_factory=list)
    authorization_headers: list[str] = field(default_factory=list)
    # The Idempotency-Key header of every job submit (None when absent).
    idempotency_keys: list[str | None] = field(default_factory=list)
    # job id -> the points its metrics endpoint returns instead of the scripted ones
    metric_points: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # When set, what GET /api/v1/agents answers instead of the one canned agent.
    agents: list[dict[str, Any]] | None = None
    # job id -> the stack dump that GET and POST /api/v1/jobs/{id}/stacks answer (404 for other jobs).
    stack_dumps: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for secret, user, role in (
            (ADMIN_TOKEN, "alice", "admin"),
            (USER_TOKEN, "bob", "user"),
            (VIEWER_TOKEN, "carol", "viewer"),
        ):
            self.add_token(secret, user, role, name=f"{user}'s token")

    def add_token(self, secret: str, user: str, role: str, name: str = "", **extra: Any) -> dict[str, Any]:
        token = {
            "id": f"tok{len(self.tokens) + 1}",
            "kind": "api",
            "name": name or user,
            "user": user,
            "role": role,
            "created_by": extra.get("created_by", ""),
            "created_at": _now(),
            "expires_at": extra.get("expires_at"),
            "revoked_at": None,
        }
        self.tokens[secret] = token
        return token

    def add_log(self, job_id: str, task: int, text: str, stream: str = "stdout") -> None:
        lines = self.logs.setdefault(job_id, [])
        line_id = sum(len(items) for items in self.logs.values()) + 1
        lines.append(
            {
                "id": line_id,
                "task": task,
                "attempt": 1,
                "seq": len(lines),
                "stream": stream,
                "text": text,
                "at": _now(),
            }
        )


def _job_object(job_id: str, spec: JobCreate, submitted_by: str) -> dict[str, Any]:
    return {
        "id": job_id,
        "name": spec.name or "job",
        "submitted_by": submitted_by,
        "cancelled_by": "",
        "state": "PENDING",
        "reason": "",
        "workers": spec.workers,
        "gpus_per_worker": spec.gpus_per_worker,
        "created_at": _now(),
        "started_at": None,
        "finished_at": None,
        "attempts": 0,
        "restarts": 0,
        "step": None,
        "loss": None,
        "command": spec.command,
        "bundle_digest": spec.bundle_digest,
        "env_names": sorted(spec.env),
        "communication": spec.communication.model_dump(mode="json"),
        "restart": spec.restart.model_dump(mode="json"),
        "startup_timeout_seconds": spec.startup_timeout_seconds,
        "max_runtime_seconds": spec.max_runtime_seconds,
        "tasks": [],
        "attempt_history": [],
        "events": [],
        "memory_per_worker": spec.memory_per_worker,
        "cpus_per_worker": spec.cpus_per_worker,
    }


def _advance(state: FakeState, job: dict[str, Any]) -> None:
    """One step of the scripted life of a job."""
    if job["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"}:
        return
    polls = state.polls[job["id"]] = state.polls.get(job["id"], 0) + 1
    failing = any("fail" in word for word in job["command"])
    if polls == 1:
        job.update(state="RUNNING", started_at=_now(), attempts=1)
        job["tasks"] = [
            {
                "id": f"{job['id']}-{index}",
                "index": index,
                "attempt": 1,
                "agent_id": f"agent-{index}",
                "agent_name": f"local-{index + 1}",
                "address": f"127.0.0.1:{20000 + index}",
                "state": "RUNNING",
                "exit_code": None,
                "message": "",
                "device_kind": "CPU",
                "device_indices": [0],
                "tf_config": "{}",
                "started_at": _now(),
                "ended_at": None,
            }
            for index in range(job["workers"])
        ]
        job["events"].append({"from_state": "PENDING", "to_state": "RUNNING", "reason": "", "at": _now()})
        state.add_log(job["id"], 0, "epoch 1 starting")
        state.add_log(job["id"], 1, "worker 1 says hi")
    elif polls == 2:
        job.update(step=10, loss=0.5)
        state.add_log(job["id"], 0, "step 10 loss 0.5")
        state.add_log(job["id"], 0, "a warning", stream="stderr")
    else:
        final = "FAILED" if failing else "SUCCEEDED"
        job.update(state=final, finished_at=_now(), step=20, loss=0.25)
        job["reason"] = "task 1 exited with code 3" if failing else ""
        for task in job["tasks"]:
            failed = failing and task["index"] == 1
            task.update(
                state="FAILED" if failed else "SUCCEEDED", exit_code=3 if failed else 0, ended_at=_now()
            )
        job["events"].append(
            {"from_state": "RUNNING", "to_state": final, "reason": job["reason"], "at": _now()}
        )
        if failing:
            state.add_log(job["id"], 1, "Traceback: boom", stream="stderr")
        state.add_log(job["id"], 0, "done")


def _needed_role(method: str, path: str) -> str:
    if path.startswith(("/api/v1/tokens", "/api/v1/agent-tokens")) or (
        method == "DELETE" and path.startswith("/api/v1/agents/")
    ):
        return "admin"
    return "viewer" if method in {"GET", "HEAD"} else "user"


def _expiry(seconds: int | None) -> str | None:
    if not seconds:
        return None
    return datetime.fromtimestamp(datetime.now(timezone.utc).timestamp() + seconds, timezone.utc).isoformat()


def create_app(state: FakeState) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path == "/healthz":
            return await call_next(request)
        header = request.headers.get("authorization", "")
        state.authorization_headers.append(header)
        scheme, _, secret = header.partition(" ")
        token = state.tokens.get(secret) if scheme.lower() == "bearer" else None
        if token is None or token["revoked_at"]:
            return JSONResponse({"detail": "authentication required: send an API token"}, status_code=401)
        needed = _needed_role(request.method, request.url.path)
        if ROLE_RANK[token["role"]] < ROLE_RANK[needed]:
            detail = (
                f"the {token['role']} role of {token['user']!r} may not do this; it needs the {needed} role"
            )
            return JSONResponse({"detail": detail}, status_code=403)
        request.state.token = token
        return await call_next(request)

    @app.get("/api/v1/whoami")
    def whoami(request: Request) -> dict[str, Any]:
        token = request.state.token
        return {
            "user": token["user"],
            "role": token["role"],
            "token_name": token["name"],
            "via_session": False,
        }

    @app.get("/api/v1/tokens")
    def list_tokens() -> list[dict[str, Any]]:
        return list(state.tokens.values())

    @app.post("/api/v1/tokens", status_code=201)
    def create_token(body: dict[str, Any], request: Request) -> dict[str, Any]:
        if body.get("role") not in ROLE_RANK or not body.get("user"):
            raise HTTPException(422, "user and a role of admin, user or viewer are required")
        secret = "mwms_" + secrets.token_urlsafe(16)
        token = state.add_token(
            secret,
            body["user"],
            body["role"],
            body.get("name", ""),
            created_by=request.state.token["user"],
            expires_at=_expiry(body.get("expires_in_seconds")),
        )
        return {**token, "token": secret}

    @app.delete("/api/v1/tokens/{token_id}")
    def revoke_token(token_id: str) -> dict[str, Any]:
        for token in state.tokens.values():
            if token["id"] == token_id:
                token["revoked_at"] = token["revoked_at"] or _now()
                return token
        raise HTTPException(404, f"no api token with id {token_id}; see mwms token list")

    @app.get("/api/v1/agent-tokens")
    def list_join_tokens() -> list[dict[str, Any]]:
        return list(state.join_tokens.values())

    @app.post("/api/v1/agent-tokens", status_code=201)
    def create_join_token(body: dict[str, Any], request: Request) -> dict[str, Any]:
        secret = "mwmsj_" + secrets.token_urlsafe(16)
        token = {
            "id": f"join{len(state.join_tokens) + 1}",
            "kind": "join",
            "name": body.get("name") or "agents",
            "user": "",
            "role": "",
            "created_by": request.state.token["user"],
            "created_at": _now(),
            "expires_at": _expiry(body.get("expires_in_seconds")),
            "revoked_at": None,
        }
        state.join_tokens[secret] = token
        return {**token, "token": secret}

    @app.delete("/api/v1/agent-tokens/{token_id}")
    def revoke_join_token(token_id: str) -> dict[str, Any]:
        for token in state.join_tokens.values():
            if token["id"] == token_id:
                token["revoked_at"] = token["revoked_at"] or _now()
                return token
        raise HTTPException(404, f"no join token with id {token_id}")

    @app.delete("/api/v1/agents/{agent_id}")
    def remove_agent(agent_id: str) -> dict[str, Any]:
        if agent_id != "a1" or agent_id in state.removed_agents:
            raise HTTPException(404, f"agent {agent_id} not found")
        state.removed_agents.append(agent_id)
        return {"id": agent_id, "name": "local-1", "removed": True}

    def get(job_id: str) -> dict[str, Any]:
        if job_id not in state.jobs:
            raise HTTPException(404, f"job {job_id} not found")
        return state.jobs[job_id]

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/bundles")
    async def upload(request: Request, file: Annotated[UploadFile, File()]) -> dict[str, Any]:
        length = request.headers.get("content-length")
        state.upload_content_lengths.append(int(length) if length else None)
        data = await file.read()
        if file.filename != "bundle.tar.gz":
            raise HTTPException(400, f"unexpected file name {file.filename}")
        digest = hashlib.sha256(data).hexdigest()
        created = digest not in state.bundles
        state.bundles[digest] = data
        return {"digest": digest, "size": len(data), "format": "tar.gz", "created": created}

    @app.post("/api/v1/jobs", status_code=201)
    def create(spec: JobCreate, request: Request) -> dict[str, Any]:
        state.idempotency_keys.append(request.headers.get("idempotency-key"))
        if spec.bundle_digest not in state.bundles:
            raise HTTPException(404, f"unknown bundle digest {spec.bundle_digest[:12]}; upload it first")
        job_id = f"job{len(state.jobs) + 1:04d}"
        state.jobs[job_id] = _job_object(job_id, spec, request.state.token["user"])
        return state.jobs[job_id]

    @app.get("/api/v1/jobs")
    def list_jobs(
        state_: Annotated[list[str] | None, Query(alias="state")] = None, offset: int = 0, limit: int = 50
    ) -> Any:
        jobs = [job for job in reversed(list(state.jobs.values())) if not state_ or job["state"] in state_]
        summaries = [{key: job[key] for key in list(job)[:15]} for job in jobs[offset : offset + limit]]
        return {"jobs": summaries, "total": len(jobs), "offset": offset, "limit": limit}

    @app.get("/api/v1/jobs/{job_id}")
    def get_job(job_id: str) -> Any:
        job = get(job_id)
        _advance(state, job)
        return job

    @app.post("/api/v1/jobs/{job_id}/cancel")
    def cancel(job_id: str, request: Request) -> Any:
        job = get(job_id)
        if job["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"}:
            return JSONResponse({"detail": f"job {job_id} already ended {job['state']}"}, status_code=409)
        job.update(
            state="CANCELLED",
            reason="cancelled by request",
            finished_at=_now(),
            cancelled_by=request.state.token["user"],
        )
        for task in job["tasks"]:  # the coordinator's stops, answered at once here
            if task["state"] == "RUNNING":
                task.update(state="STOPPED", ended_at=_now())
        return job

    @app.get("/api/v1/jobs/{job_id}/logs")
    def logs(
        job_id: str,
        task: int | None = None,
        attempt: int | None = None,
        tail: int = 1000,
        after: int = 0,
        follow: bool = False,
    ) -> Any:
        get(job_id)
        # Like the real API: without a cursor the newest `tail` lines, with one the next `tail` lines.
        lines = [
            line
            for line in state.logs.get(job_id, [])
            if (task is None or line["task"] == task) and line["id"] > after
        ]
        lines = lines[:tail] if after else lines[-tail:]
        if follow:

            def stream() -> Iterator[str]:
                # The scripted job ends after a few polls: drive it there, sending lines as they appear.
                sent = lines[0]["id"] - 1 if lines else after
                while True:
                    job = state.jobs[job_id]
                    for line in state.logs.get(job_id, []):
                        if line["id"] > sent and (task is None or line["task"] == task):
                            yield json.dumps(line) + "\n"
                            sent = line["id"]
                    if job["state"] in {"SUCCEEDED", "FAILED", "CANCELLED"}:
                        return
                    _advance(state, job)

            return StreamingResponse(stream(), media_type="application/x-ndjson")
        return {"lines": lines, "next_after": lines[-1]["id"] if lines else after}

    @app.get("/api/v1/jobs/{job_id}/metrics")
    def metrics(job_id: str, name: str | None = None) -> Any:
        get(job_id)
        if job_id in state.metric_points:
            return {"points": [p for p in state.metric_points[job_id] if name is None or p["name"] == name]}
        points = [
            {"name": metric, "step": step, "value": value, "wall_time": _now(), "attempt": 1}
            for step, loss in ((10, 0.5), (20, 0.25))
            for metric, value in (("loss", loss), ("accuracy", 1 - loss))
            if name is None or metric == name
        ]
        return {"points": points}

    @app.get("/api/v1/jobs/{job_id}/artifacts")
    def artifacts(job_id: str) -> Any:
        get(job_id)
        return [
            {
                "path": path,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "attempt": 1,
                "created_at": _now(),
            }
            for path, data in state.artifacts.get(job_id, {}).items()
        ]

    @app.get("/api/v1/jobs/{job_id}/artifacts/{path:path}")
    def artifact(job_id: str, path: str) -> Response:
        data = state.artifacts.get(job_id, {}).get(path)
        if data is None:
            raise HTTPException(404, f"no artifact {path}")
        return Response(data, media_type="application/octet-stream")

    @app.get("/api/v1/jobs/{job_id}/stacks")
    @app.post("/api/v1/jobs/{job_id}/stacks")
    def stacks(job_id: str) -> Any:
        if job_id not in state.stack_dumps:
            raise HTTPException(404, f"job {job_id} has no stack dumps")
        return state.stack_dumps[job_id]

    @app.get("/api/v1/agents")
    def agents() -> Any:
        if state.agents is not None:
            return state.agents
        return [
            {
                "id": "a1",
                "name": "local-1",
                "hostname": "host",
                "address": "127.0.0.1",
                "port_range": "20000-20049",
                "version": "0.1.0",
                "online": True,
                "last_heartbeat_at": _now(),
                "devices": [{"kind": "CPU", "index": 0, "name": "cpu:0", "uuid": "", "memory_mib": 0}],
                "devices_used": 0,
                "devices_free": 1,
                "tasks": [],
            }
        ]

    @app.get("/api/v1/boom")
    def boom() -> Any:
        return JSONResponse({"detail": "database is on fire"}, status_code=500)

    return app


@contextmanager
def serve_fake_api(port: int = 0) -> Iterator[tuple[str, FakeState]]:
    """Serves a fresh fake API on 127.0.0.1:<port, default free> in a thread; yields (base url, its state)."""
    state = FakeState()
    with served(create_app(state), port=port) as url:
        yield url, state
