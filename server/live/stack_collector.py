"""Taking the stacks of an attempt's tasks at the same moment: the DumpStacks commands to their agents,
and the wait (bounded) for the answers, which the agents' streams hand in (`accept`).

The database work is in server/services/stacks.py; this module only sends, waits and wakes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from mwms.v1 import agent_pb2 as pb
from server.db.engine import Database
from server.live.hub import AgentHub
from server.services import stacks
from server.services.stacks import IncomingStackDump, OpenedRequest

log = logging.getLogger("mwms.server.stacks")
T = TypeVar("T")


class _Answers:
    """The tasks of one request whose answers have not come yet."""

    def __init__(self, task_ids: set[str]) -> None:
        self.missing = set(task_ids)
        self.complete = asyncio.Event()
        if not self.missing:
            self.complete.set()

    def arrived(self, task_ids: set[str] | list[str]) -> None:
        self.missing.difference_update(task_ids)
        if not self.missing:
            self.complete.set()


class StackCollector:
    """Sends DumpStacks for a job's running tasks and waits for the answers; used from the event loop."""

    def __init__(self, db: Database, hub: AgentHub) -> None:
        self._db = db
        self._hub = hub
        self._waiting: dict[str, _Answers] = {}

    async def _write(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        def run() -> T:
            with self._db.write() as session:
                return fn(session, *args, **kwargs)

        return await asyncio.to_thread(run)

    async def collect(
        self, job_id: str, cause: str, requested_by: str, wait_s: float, *, any_owner: bool = False
    ) -> OpenedRequest:
        """Opens a request for the job's running tasks, asks every agent concerned at once, and returns
        when all have answered or after `wait_s` seconds (missing answers stay marked as such).

        `any_owner`: the requester is an admin; otherwise only the job's submitter may ask (on request).
        """
        opened = await self._write(
            stacks.open_stack_request, job_id, cause, requested_by, any_owner=any_owner
        )
        answers = _Answers({asked.task_id for asked in opened.asked})
        self._waiting[opened.request_id] = answers
        try:
            by_agent: dict[str, list[str]] = {}
            for asked in opened.asked:
                by_agent.setdefault(asked.agent_id, []).append(asked.task_id)
            sent = await asyncio.gather(
                *(
                    self._hub.send_to(
                        agent_id,
                        pb.CoordinatorMessage(
                            dump_stacks=pb.DumpStacks(request_id=opened.request_id, task_ids=task_ids)
                        ),
                    )
                    for agent_id, task_ids in by_agent.items()
                )
            )
            unreachable = [
                t
                for (_, task_ids), ok in zip(by_agent.items(), sent, strict=True)
                if not ok
                for t in task_ids
            ]
            if unreachable:
                answers.arrived(unreachable)
                await self._write(
                    stacks.mark_unreachable, opened.request_id, unreachable, "its agent is not connected"
                )
            try:
                await asyncio.wait_for(answers.complete.wait(), timeout=wait_s)
            except (TimeoutError, asyncio.TimeoutError):  # the same class from Python 3.11 on
                log.info(
                    "stacks of job %s: no answer within %.0f s for %d task(s)",
                    job_id,
                    wait_s,
                    len(answers.missing),
                )
        finally:
            del self._waiting[opened.request_id]
        return opened

    async def accept(self, agent_id: str, incoming: IncomingStackDump) -> None:
        """Stores an agent's answer (a late one too) and wakes the request waiting for it."""
        stored = await self._write(stacks.store_stack_dump, agent_id, incoming)
        if not stored:
            log.warning(
                "agent %s sent stacks of task %s for request %s, which did not ask it; dropped",
                agent_id,
                incoming.task_id,
                incoming.request_id,
            )
            return
        answers = self._waiting.get(incoming.request_id)
        if answers is not None:
            answers.arrived([incoming.task_id])
