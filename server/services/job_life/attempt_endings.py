"""Why an attempt ended and what acted on it, kept as data on the attempt's ending event.

server/services/job_life/lifecycle.py decides every ending and hands one of these to transitions.transition_attempt,
which stores its `kind` and `details` on the event (attempt_events.cause and .details). The API shows them
as the attempt's `ended`, with `describe`'s sentence as its message, so the CLI and the dashboard say the
same thing. The reason text of the event stays as it was: the long form, log tail included.

The kinds, what acted, and the details each carries (JSON scalars or lists of ints; text cut to
MAX_DETAIL_CHARS):

- succeeded: every task exited 0.
- preempted: a job of higher priority needed its devices: job_id, and priority (that job's, then).
- reclaimed: a team within its quota took back what this job borrowed over its own: team, and the job_id
  and priority of the job it made room for.
- drained: an admin drained an agent it ran on: agent (its name), agent_id, by (the admin), note (the
  drain's reason).
- agent_lost: an agent it ran on is gone: agent, agent_id, task (the task lost there), how: silent (it
  stopped heartbeating), stopped (it said goodbye without its tasks' last reports), removed (by an admin)
  or forgot (it came back without the task). `how` is read from the agent's row when the attempt ends.
- task_failed: a task ended on its own: task, agent, agent_id, exit_code (None: none reported), note (the
  task's own message, such as an out-of-memory kill or a command not found).
- hang: no log line or metric point from any worker for timeout_s seconds.
- startup_timeout: workers (their indices) did not start within timeout_s seconds.
- environment_mismatch: workers (two indices) would run different packages.
- refused: an agent could not start a task (port busy, bundle fetch): task, agent, agent_id, note; the
  attempt is REPLACED and the job placed again, no restart used.
- start_failed: the start command of task `task` could not be sent: note says why.
- cancelled: by (the user; "" when unknown).
- runtime_limit: ran past limit_s seconds (max_runtime_seconds, time spent preempted not counted).
- nan_metric: metric was NaN at step (restart.fail_on_nan).
- unrecorded: ended before endings were recorded (or by a path that gives none); the message is the
  first line of the attempt's reason.

A failure after which the job restarts adds restart (its number), max_restarts and restart_cause (its label
in mwms_job_restarts_total: agent_lost, signal, exit_code, hang, startup_timeout, other).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from mwms.server.db.models import Agent, Job, Task

MAX_DETAIL_CHARS = 200
UNRECORDED = "unrecorded"
KINDS = (
    "succeeded",
    "preempted",
    "reclaimed",
    "drained",
    "agent_lost",
    "task_failed",
    "hang",
    "startup_timeout",
    "environment_mismatch",
    "refused",
    "start_failed",
    "cancelled",
    "runtime_limit",
    "nan_metric",
    UNRECORDED,
)


@dataclass(frozen=True)
class AttemptEnding:
    """One attempt's ending: a kind of KINDS and its details (the module docstring lists both)."""

    kind: str
    details: dict[str, Any] = field(default_factory=dict)

    def with_restart(self, number: int, max_restarts: int, cause: str) -> AttemptEnding:
        """The same ending, noting that the job restarts (restart `number` of `max_restarts`) for `cause`."""
        return AttemptEnding(
            self.kind,
            {**self.details, "restart": number, "max_restarts": max_restarts, "restart_cause": cause},
        )


def short(text: str) -> str:
    """`text`'s first line, cut to MAX_DETAIL_CHARS."""
    first = (text or "").strip().split("\n", 1)[0]
    return first if len(first) <= MAX_DETAIL_CHARS else first[: MAX_DETAIL_CHARS - 3] + "..."


# -- the endings, one constructor each ------------------------------------------------------------------


def succeeded() -> AttemptEnding:
    return AttemptEnding("succeeded")


def for_preemption(cause: str, preemptor: Job | None) -> AttemptEnding:
    """A preemption's ending: for a job of higher priority ("priority"), a team's reclaim ("reclaim"),
    or a drain (use `drained` where the agent is known)."""
    if preemptor is None:
        return AttemptEnding("drained" if cause == "drain" else "preempted")
    made_room = {"job_id": preemptor.id, "priority": preemptor.priority}
    if cause == "reclaim":
        return AttemptEnding("reclaimed", {"team": short(preemptor.team), **made_room})
    return AttemptEnding("preempted", made_room)


def drained(agent: Agent, by: str, note: str) -> AttemptEnding:
    return AttemptEnding(
        "drained", {"agent": short(agent.name), "agent_id": agent.id, "by": short(by), "note": short(note)}
    )


def how_lost(agent: Agent | None) -> str:
    """silent, stopped, removed or forgot: what the agent's row says of its going (see the docstring)."""
    if agent is None or agent.removed_at is not None:
        return "removed"
    if agent.stopped_at is not None:
        return "stopped"
    return "silent" if agent.lost_at is not None else "forgot"


def agent_lost(task: Task, agent: Agent | None) -> AttemptEnding:
    return AttemptEnding(
        "agent_lost",
        {
            "agent": short(agent.name) if agent is not None else task.agent_id,
            "agent_id": task.agent_id,
            "task": task.index,
            "how": how_lost(agent),
        },
    )


def task_failed(task: Task, agent_name: str) -> AttemptEnding:
    details: dict[str, Any] = {
        "task": task.index,
        "agent": short(agent_name),
        "agent_id": task.agent_id,
        "exit_code": task.exit_code,
    }
    if task.message:
        details["note"] = short(task.message)
    return AttemptEnding("task_failed", details)


def hang(timeout_s: float) -> AttemptEnding:
    return AttemptEnding("hang", {"timeout_s": timeout_s})


def startup_timeout(workers: list[int], timeout_s: float) -> AttemptEnding:
    return AttemptEnding("startup_timeout", {"workers": workers, "timeout_s": timeout_s})


def environment_mismatch(workers: list[int]) -> AttemptEnding:
    return AttemptEnding("environment_mismatch", {"workers": workers})


def refused(task: Task, agent: Agent) -> AttemptEnding:
    return AttemptEnding(
        "refused",
        {"task": task.index, "agent": short(agent.name), "agent_id": agent.id, "note": short(task.message)},
    )


def start_failed(task: Task, why: str) -> AttemptEnding:
    return AttemptEnding("start_failed", {"task": task.index, "note": short(why)})


def cancelled(by: str) -> AttemptEnding:
    return AttemptEnding("cancelled", {"by": short(by)})


def runtime_limit(limit_s: float) -> AttemptEnding:
    return AttemptEnding("runtime_limit", {"limit_s": limit_s})


def nan_metric(name: str, step: int) -> AttemptEnding:
    return AttemptEnding("nan_metric", {"metric": short(name), "step": step})


# -- the sentence people read ---------------------------------------------------------------------------

_HOW_LOST = {
    "silent": "it stopped heartbeating",
    "stopped": "it stopped without reporting the task's end",
    "removed": "an admin removed it",
    "forgot": "it came back without the task",
}


def exit_text(exit_code: int | None) -> str:
    """'exit code 3', 'exit code 137 (SIGKILL)', 'signal SIGTERM' (a negative code), 'no exit code'."""
    if exit_code is None:
        return "no exit code"
    number = exit_code - 128 if exit_code > 128 else -exit_code if exit_code < 0 else 0
    try:
        name = signal.Signals(number).name if number else ""
    except ValueError:
        name = ""
    if exit_code < 0:
        return f"signal {name or -exit_code}"
    return f"exit code {exit_code}" + (f" ({name})" if name else "")


def _seconds(value: Any) -> str:
    return f"{value:g} s" if isinstance(value, (int, float)) else "its limit"


def _workers(value: Any) -> str:
    indices = [str(i) for i in value] if isinstance(value, list) else []
    return ("workers " if len(indices) > 1 else "worker ") + ", ".join(indices) if indices else "workers"


def describe(kind: str, details: dict[str, Any], reason: str = "") -> str:
    """The ending in words: 'preempted by job abc123 (priority 900)'; an unrecorded one by `reason`."""
    d = details
    if kind == "succeeded":
        text = "succeeded: every task exited 0"
    elif kind == "preempted":
        text = f"preempted by job {d.get('job_id', '?')}" + (
            f" (priority {d['priority']})" if d.get("priority") is not None else ""
        )
    elif kind == "reclaimed":
        text = f"preempted: team {d.get('team', '?')} reclaims its quota for job {d.get('job_id', '?')}"
    elif kind == "drained":
        text = f"drained from agent {d.get('agent', '?')}" + (f" by {d['by']}" if d.get("by") else "")
        text += f" ({d['note']})" if d.get("note") else ""
    elif kind == "agent_lost":
        text = f"lost agent {d.get('agent', '?')} (task {d.get('task', '?')})"
        text += f": {_HOW_LOST[d['how']]}" if d.get("how") in _HOW_LOST else ""
    elif kind == "task_failed":
        text = f"task {d.get('task', '?')} failed on agent {d.get('agent', '?')}: {exit_text(d.get('exit_code'))}"
        text += (
            f" ({d['note']})"
            if d.get("note") and d["note"] != f"exited with code {d.get('exit_code')}"
            else ""
        )
    elif kind == "hang":
        text = f"hung: no progress for {_seconds(d.get('timeout_s'))}"
    elif kind == "startup_timeout":
        text = f"{_workers(d.get('workers'))} did not start within {_seconds(d.get('timeout_s'))}"
    elif kind == "environment_mismatch":
        text = f"{_workers(d.get('workers'))} would run different packages"
    elif kind == "refused":
        text = f"agent {d.get('agent', '?')} could not start task {d.get('task', '?')}" + (
            f" ({d['note']})" if d.get("note") else ""
        )
    elif kind == "start_failed":
        text = f"task {d.get('task', '?')} could not be started" + (
            f" ({d['note']})" if d.get("note") else ""
        )
    elif kind == "cancelled":
        text = f"cancelled by {d['by']}" if d.get("by") else "cancelled"
    elif kind == "runtime_limit":
        text = f"ran past max_runtime_seconds ({_seconds(d.get('limit_s'))})"
    elif kind == "nan_metric":
        text = f"metric {d.get('metric', '?')} was NaN at step {d.get('step', '?')}"
    else:
        text = short(reason) or "ended"
    if d.get("restart") is not None:
        text += f"; restart {d['restart']}" + (f" of {d['max_restarts']}" if d.get("max_restarts") else "")
    return text
