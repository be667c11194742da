"""One writer for the task reports of every agent's stream: reports that arrive together share one
transaction (server/live/grouped_writes.py).

The agents of a 64-worker job report its tasks starting, then running, within the same second or two; one
transaction each lined 64 writes up behind the database's writer lock, twice, before the job read RUNNING,
and the scheduler's next placement waited behind them. Each stream gets its report's replies (final
acknowledgements, stops of tasks the coordinator does not know) once committed, and sends them itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sqlalchemy.orm import Session

from mwms.server.db.engine import Database
from mwms.server.live.grouped_writes import GroupedWrites
from mwms.server.services.fleet import agent_messages
from mwms.server.services.job_life.tasks import TaskReport

MAX_REPORTS_PER_TRANSACTION = 200


class ReportWriter(GroupedWrites[TaskReport, agent_messages.Replies]):
    """Groups queued task reports into transactions."""

    def __init__(
        self, db: Database, backoff_base_s: float, wake_agents: Callable[[Iterable[str]], None]
    ) -> None:
        def apply(session: Session, agent_id: str, report: TaskReport) -> agent_messages.Replies:
            return agent_messages.accept_report(session, agent_id, report, backoff_base_s=backoff_base_s)

        super().__init__(
            db,
            apply,
            wake_agents,
            MAX_REPORTS_PER_TRANSACTION,
            prepare=agent_messages.hold_rows_of_reports,
        )
