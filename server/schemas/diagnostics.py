"""What the coordinator finds out about a gang: preflight check results and stack dumps (issue 11)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class PreflightResultOut(BaseModel):
    """What one task's preflight check found (report: see mwms/preflight_contract.py)."""

    task_index: int
    task_id: str
    ok: bool
    message: str
    at: datetime
    report: dict[str, Any] = Field(
        description="reachable_s, peers, tcp, collective, allreduce [{bytes, seconds, algbw_gbps, busbw_gbps}]"
    )


class PreflightAttemptOut(BaseModel):
    attempt: int
    ok: bool = Field(description="every task that reported passed")
    results: list[PreflightResultOut]


class PreflightOut(BaseModel):
    """The preflight results of a job, per attempt and task; empty when no check ran."""

    job_id: str
    attempts: list[PreflightAttemptOut]


class StackThreadOut(BaseModel):
    """One thread of a dump: its title as the tool printed it and its frames, innermost first."""

    title: str
    frames: list[str]
    in_collective: bool = Field(description="this thread waits inside a TensorFlow collective")


class TaskStacksOut(BaseModel):
    """The stacks of one task, as its agent took them (or why there are none)."""

    task_index: int
    task_id: str
    agent_id: str
    agent_name: str
    pid: int | None
    method: str = Field(description='"py-spy" or "faulthandler"; empty when no dump was taken')
    answered: bool = Field(description="false while (or when) the agent has not answered")
    error: str = Field(description="why there is no dump: the agent's reason, or no answer")
    in_collective: bool | None = Field(
        description="some thread waits inside a TensorFlow collective in some snapshot (false only when "
        "outside one in every snapshot); null when there is no dump"
    )
    snapshots: int = Field(
        0, description="how many snapshots of the stacks the dump holds (taken ~0.5 s apart)"
    )
    snapshots_in_collective: int = Field(
        0, description="in how many of them some thread waits inside a TensorFlow collective"
    )
    received_at: datetime
    threads: list[StackThreadOut] = Field(
        description="the threads of one snapshot: the newest that agrees with in_collective"
    )
    text: str = Field(description="the dump as the tool printed it, every snapshot, at most 256 KiB")


class StackDumpsOut(BaseModel):
    """One collection of the stacks of every running task of an attempt, taken at the same moment."""

    id: str
    job_id: str
    attempt: int
    cause: str = Field(description='"request" (a user asked) or "hang" (hang detection)')
    requested_by: str
    requested_at: datetime
    complete: bool = Field(description="every task asked has answered")
    tasks: list[TaskStacksOut]
