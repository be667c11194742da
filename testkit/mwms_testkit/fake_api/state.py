"""What the fake API holds and what it recorded: tokens and login sessions, bundles, jobs with their logs,
metrics, artifacts and stack dumps, agents, teams, and switches tests flip (unreachable, empty, refusals).

Three tokens exist from the start, as on a coordinator with three users: ADMIN_TOKEN (alice, admin),
USER_TOKEN (bob, user) and VIEWER_TOKEN (carol, viewer). `FakeState()` starts empty but for one CPU agent
(local-1, id a1); `FakeState(seeded=True)` holds the dashboard's cluster (fake_api/seed.py) instead, and
three more tokens, short enough to type into the dashboard's login form.
`reset()` returns to the start.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

from fastapi import HTTPException

from mwms_testkit.fake_api.fake_job import FakeJob, _iso, now

ADMIN_TOKEN = "mwms_fake-admin-secret-0123456789"
USER_TOKEN = "mwms_fake-user-secret-0123456789"
VIEWER_TOKEN = "mwms_fake-viewer-secret-0123456789"
ROLE_RANK = {"viewer": 1, "user": 2, "admin": 3}


def fake_agent(agent_id: str, name: str, **overrides: Any) -> dict[str, Any]:
    """An agent as GET /api/v1/agents lists it (schemas.AgentOut): online with one CPU slot, unless
    `overrides` say otherwise."""
    return {
        "id": agent_id,
        "name": name,
        "hostname": "host",
        "address": "127.0.0.1",
        "port_range": "20000-20049",
        "version": "0.1.0",
        "online": True,
        "last_heartbeat_at": None,  # answered as now while online
        "devices": [{"kind": "CPU", "index": 0, "name": "cpu:0", "uuid": "", "memory_mib": 0}],
        "devices_used": 0,
        "devices_free": 1,
        "tasks": [],
        **overrides,
    }


def expiry(seconds: int | None) -> datetime | None:
    return now() + timedelta(seconds=seconds) if seconds else None


class FakeState:
    """The fake coordinator's state; tests reach into it to arrange a case and to see what was sent."""

    def __init__(self, seeded: bool = False) -> None:
        self.seeded = seeded
        self.lock = threading.RLock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.unreachable = False  # every /api/ request answers 503
            self.server_error: str | None = None  # every /api/ request answers 500 with it
            self.empty = False  # no jobs, agents, queue or teams are listed
            self.cancel_refusal: str | None = None  # every cancel answers 403 with it
            self.teams_refusal: str | None = None  # GET /api/v1/teams answers 500 with it
            self.teams: list[dict[str, Any]] = []
            self.agents: list[dict[str, Any]] = [fake_agent("a1", "local-1")]
            # agent id -> the cordon fields it answers with (cordoned, cordoned_at, cordoned_by, ...)
            self.agent_cordons: dict[str, dict[str, Any]] = {}
            self.removed_agents: list[str] = []
            self.jobs: dict[str, FakeJob] = {}
            self.bundles: dict[str, bytes] = {}
            self.artifacts: dict[str, dict[str, bytes]] = {}  # job id -> path -> content
            # job id -> the stack dump GET and POST /api/v1/jobs/{id}/stacks answer (404 for other jobs)
            self.stack_dumps: dict[str, dict[str, Any]] = {}
            self.tokens: dict[str, dict[str, Any]] = {}  # secret -> the token as listed (schemas.TokenOut)
            self.join_tokens: dict[str, dict[str, Any]] = {}
            self.sessions: dict[str, dict[str, Any]] = {}  # login cookie -> its token
            self.next_log_id = 1
            # What was sent: every Authorization header, the Content-Length of every upload, the
            # Idempotency-Key of every submit (None when absent), every metrics read (its `after`, its points).
            self.authorization_headers: list[str] = []
            self.upload_content_lengths: list[int | None] = []
            self.idempotency_keys: list[str | None] = []
            self.metric_reads: list[dict[str, Any]] = []
            for secret, user, role in (
                (ADMIN_TOKEN, "alice", "admin"),
                (USER_TOKEN, "bob", "user"),
                (VIEWER_TOKEN, "carol", "viewer"),
            ):
                self.add_token(secret, user, role, name=f"{user}'s token")
            if self.seeded:
                # Imported here: seed.py builds its agents with this module's fake_agent.
                from mwms_testkit.fake_api.seed import seed_dashboard_cluster

                seed_dashboard_cluster(self)

    def add_token(
        self, secret: str, user: str, role: str, name: str = "", kind: str = "api", **extra: Any
    ) -> dict[str, Any]:
        """An API token of `user` (kind "join": a join token, without user and role); `extra` may set
        created_by and expires_at."""
        tokens = self.join_tokens if kind == "join" else self.tokens
        token = {
            "id": f"{'join' if kind == 'join' else 'tok'}{len(tokens) + 1}",
            "kind": kind,
            "name": name or user,
            "user": user,
            "role": role,
            "created_by": extra.get("created_by", ""),
            "created_at": _iso(now()),
            "expires_at": _iso(extra.get("expires_at")),
            "revoked_at": None,
        }
        tokens[secret] = token
        return token

    def add_log(self, job_id: str, task: int, text: str, stream: str = "stdout") -> None:
        """A log line of the job's task, its id after every line stored so far."""
        lines = self.jobs[job_id].logs
        line = {"id": self.next_log_id, "task": task, "attempt": 1, "seq": len(lines), "stream": stream}
        lines.append({**line, "text": text, "at": _iso(now())})
        self.next_log_id += 1

    def job(self, job_id: str) -> FakeJob:
        """The job, else the coordinator's 404."""
        if job_id not in self.jobs:
            raise HTTPException(404, f"job {job_id} not found")
        return self.jobs[job_id]

    def listed_agents(self) -> list[dict[str, Any]]:
        """The agents as listed: a heartbeat just now while online, each with its cordon."""
        if self.empty:
            return []
        heard = _iso(now())
        return [
            {
                **agent,
                "last_heartbeat_at": agent["last_heartbeat_at"] or (heard if agent["online"] else None),
                **self.agent_cordons.get(agent["id"], {}),
            }
            for agent in self.agents
        ]
