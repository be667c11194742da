"""One writer for the hellos of every agent's stream: hellos that arrive together share one transaction.

A hello (an agent that reconnected says what it runs) is a read-then-write transaction under the
database's writer lock. After a replica dies, hundreds of its agents say hello to the survivors within a
second or two, so their hellos are grouped (server/live/grouped_writes.py), up to MAX_HELLOS_PER_TRANSACTION
a transaction. Each stream gets its replies and its new stream epoch (server/services/fleet/replicas.py)
once committed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from sqlalchemy.orm import Session

from mwms.server.db.engine import Database
from mwms.server.db.models import Agent
from mwms.server.live.grouped_writes import GroupedWrites
from mwms.server.services.fleet import agent_messages, replicas
from mwms.server.services.job_life.tasks import TaskReport, agents_with_active_tasks
from mwms.server.settings import Settings

MAX_HELLOS_PER_TRANSACTION = 200
Accepted = tuple[agent_messages.Replies, int]  # the replies to send, and the stream's epoch


class HelloWriter(GroupedWrites[list[TaskReport], Accepted]):
    """Groups queued hellos (the tasks an agent says it runs) into transactions."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        replica_id: str,
        wake_agents: Callable[[Iterable[str]], None],
        on_change: Callable[[], None],
    ) -> None:
        def apply(session: Session, agent_id: str, reports: list[TaskReport]) -> Accepted:
            # The stream is claimed first, so the agent's row is written once, with its liveness, when
            # the hello's read of its tasks flushes the session.
            epoch = replicas.claim_stream(session, agent_id, replica_id)
            replies = agent_messages.accept_hello(
                session,
                agent_id,
                reports,
                timeout_s=settings.agent_timeout_s,
                backoff_base_s=settings.restart_backoff_s,
                had_active_tasks=agent_id in busy,
            )
            return replies, epoch

        # The agents of the group being written that had a task STARTING or RUNNING when its
        # transaction took the writer lock; groups are written one at a time, by one thread.
        busy: set[str] = set()

        def prepare(session: Session, hellos: list[tuple[str, list[TaskReport]]]) -> object:
            ids = {agent_id for agent_id, _ in hellos}
            busy.clear()
            busy.update(agents_with_active_tasks(session, sorted(ids)))
            return agent_messages.hold_rows(session, Agent, ids)

        def committed(outcomes: Sequence[Accepted | BaseException]) -> None:
            if any(not isinstance(o, BaseException) and o[0].changed for o in outcomes):
                on_change()

        super().__init__(
            db,
            apply,
            wake_agents,
            MAX_HELLOS_PER_TRANSACTION,
            committed,
            prepare=prepare,
        )
