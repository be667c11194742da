"""The transition tables: allowed changes pass, everything else is an error."""

from __future__ import annotations

import pytest

from server.states import (
    JOB_TRANSITIONS,
    TASK_TRANSITIONS,
    InvalidTransition,
    JobState,
    TaskState,
    check_job_transition,
    check_task_transition,
)


@pytest.mark.parametrize(
    "path",
    [
        [None, JobState.PENDING, JobState.SCHEDULED, JobState.RUNNING, JobState.SUCCEEDED],
        [None, JobState.PENDING, JobState.SCHEDULED, JobState.RUNNING, JobState.FAILED],
        [None, JobState.PENDING, JobState.SCHEDULED, JobState.RUNNING, JobState.RESTARTING, JobState.PENDING],
        [None, JobState.PENDING, JobState.SCHEDULED, JobState.PENDING],
        [None, JobState.PENDING, JobState.CANCELLED],
    ],
)
def test_lifecycles_allowed(path):
    for current, requested in zip(path, path[1:], strict=False):
        check_job_transition(current, requested)


@pytest.mark.parametrize(
    ("current", "requested"),
    [
        (None, JobState.RUNNING),
        (JobState.PENDING, JobState.RUNNING),
        (JobState.PENDING, JobState.SUCCEEDED),
        (JobState.SUCCEEDED, JobState.FAILED),
        (JobState.CANCELLED, JobState.PENDING),
        (JobState.FAILED, JobState.RESTARTING),
    ],
)
def test_job_transitions_rejected(current, requested):
    with pytest.raises(InvalidTransition):
        check_job_transition(current, requested)


def test_terminal_states_have_no_way_out():
    for state in JobState:
        if state.terminal:
            assert JOB_TRANSITIONS[state] == frozenset()
    for state in TaskState:
        if state.terminal and state != TaskState.LOST:
            assert TASK_TRANSITIONS[state] == frozenset()


def test_task_transitions():
    check_task_transition(TaskState.ASSIGNED, TaskState.STARTING)
    check_task_transition(TaskState.STARTING, TaskState.RUNNING)
    check_task_transition(TaskState.RUNNING, TaskState.SUCCEEDED)
    check_task_transition(TaskState.LOST, TaskState.FAILED)
    with pytest.raises(InvalidTransition):
        check_task_transition(TaskState.RUNNING, TaskState.REJECTED)
    with pytest.raises(InvalidTransition):
        check_task_transition(TaskState.SUCCEEDED, TaskState.RUNNING)


def test_every_state_has_a_table_row():
    assert set(JOB_TRANSITIONS) == {None, *JobState}
    assert set(TASK_TRANSITIONS) == set(TaskState)
