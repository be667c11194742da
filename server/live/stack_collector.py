"""Taking the stacks of an attempt's tasks at the same moment: the DumpStacks commands to their agents,
and the wait (bounded) for the answers, which the agents' streams hand in (`accept`).

The database work is in server/services/observing/stacks.py; this module only sends, waits and wakes.

With replicas, the agents of a job may hold streams on other replicas: those are rung (server/live/
agent_notify.py, "stacks:REQUEST_ID"); the replica holding each agent sends its DumpStacks and stores its
answer, and the waiting replica reads those answers from the database every ANSWER_POLL_S.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from mwms.server.db.engine import Database
from mwms.server.live.agent_notify import Doorbell
from mwms.server.live.hub import AgentHub
from mwms.server.services.observing import stacks
from mwms.server.services.observing.stacks import IncomingStackDump, OpenedRequest

log = logging.getLogger("mwms.server.stacks")
T = TypeVar("T")
ANSWER_POLL_S = 0.25


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

    def __init__(self, db: Database, hub: AgentHub, doorbell: Doorbell | None = None) -> None:
        self._db = db
        self._hub = hub
        self._doorbell = doorbell if doorbell is not None and doorbell.enabled else None
        self._waiting: dict[str, _Answers] = {}
        if self._doorbell is not None:
            self._doorbell.on("stacks", self._rung)
        self._asking: set[asyncio.Task[None]] = set()

    def _rung(self, request_ids: list[str]) -> None:
        """Another replica opened these requests: ask the agents whose streams this replica holds."""
        for request_id in request_ids:
            task = asyncio.create_task(self._ask_held(request_id))
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)

    async def _ask_held(self, request_id: str) -> None:
        held = self._hub.connected()
        if not held:
            return

        def read() -> dict[str, list[str]]:
            with self._db.read() as session:
                return stacks.unanswered_by_agent(session, request_id, held)

        try:
            by_agent = await asyncio.to_thread(read)
            await self._send(request_id, by_agent)
        except Exception:  # noqa: BLE001 - the requester's wait ends on its own
            log.exception("asking the stacks of request %s failed", request_id)

    async def _send(self, request_id: str, by_agent: dict[str, list[str]]) -> list[bool]:
        return await asyncio.gather(
            *(self._hub.ask_stacks(agent_id, request_id, task_ids) for agent_id, task_ids in by_agent.items())
        )

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
            held = self._hub.connected()
            remote = {a: t for a, t in by_agent.items() if a not in held} if self._doorbell else {}
            local = {a: t for a, t in by_agent.items() if a not in remote}
            sent = await self._send(opened.request_id, local)
            unreachable = [
                t for (_, task_ids), ok in zip(local.items(), sent, strict=True) if not ok for t in task_ids
            ]
            poll: asyncio.Task[None] | None = None
            if remote and self._doorbell is not None:
                await self._doorbell.ring("stacks", [opened.request_id])
                poll = asyncio.create_task(self._poll_answers(opened.request_id, answers))
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
                if poll is not None:
                    poll.cancel()
        finally:
            del self._waiting[opened.request_id]
        return opened

    async def _poll_answers(self, request_id: str, answers: _Answers) -> None:
        """Answers stored by other replicas (the ones holding the other agents) count as they come."""

        def read() -> set[str]:
            with self._db.read() as session:
                return stacks.answered_task_ids(session, request_id)

        while not answers.complete.is_set():
            await asyncio.sleep(ANSWER_POLL_S)
            answers.arrived(await asyncio.to_thread(read))

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
