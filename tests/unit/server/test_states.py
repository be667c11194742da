"""The transition tables: allowed changes pass, everything else is an error."""

from __future__ import annotations

import pytest

from mwms.server.states import (
    ATTEMPT_TRANSITIONS,
    JOB_TRANSITIONS,
    TASK_TRANSITIONS,
    AttemptState,
    InvalidTransition,
    JobState,
    TaskState,
    check_attempt_transition,
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
        # Preempted: back to waiting once its workers have exited, or cancelled meanwhile.
        [None, JobState.PENDING, JobState.SCHEDULED, JobState.RUNNING, JobState.PREEMPTING, JobState.PENDING],
        [None, JobState.PENDING, JobState.SCHEDULED, JobState.PREEMPTING, JobState.CANCELLED],
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
        (JobState.PENDING, JobState.PREEMPTING),
        (JobState.PREEMPTING, JobState.RUNNING),
        (JobState.RESTARTING, JobState.PREEMPTING),
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
    assert set(ATTEMPT_TRANSITIONS) == {None, *AttemptState}
    assert set(TASK_TRANSITIONS) == set(TaskState)


ENDINGS = [
    AttemptState.SUCCEEDED,
    AttemptState.FAILED,
    AttemptState.CANCELLED,
    AttemptState.REPLACED,
    AttemptState.PREEMPTED,
]


@pytest.mark.parametrize("ending", ENDINGS)
def test_attempt_is_born_active_and_ends_once(ending):
    check_attempt_transition(None, AttemptState.ACTIVE)
    check_attempt_transition(AttemptState.ACTIVE, ending)
    assert ending.terminal and not AttemptState.ACTIVE.terminal
    assert ATTEMPT_TRANSITIONS[ending] == frozenset()


def test_attempt_table_allows_exactly_these():
    allowed = {(current, requested) for current, row in ATTEMPT_TRANSITIONS.items() for requested in row}
    assert allowed == {(None, AttemptState.ACTIVE)} | {(AttemptState.ACTIVE, e) for e in ENDINGS}


@pytest.mark.parametrize(
    ("current", "requested"),
    [
        (None, AttemptState.SUCCEEDED),
        (None, AttemptState.REPLACED),
        (AttemptState.ACTIVE, AttemptState.ACTIVE),
        (AttemptState.SUCCEEDED, AttemptState.FAILED),
        (AttemptState.FAILED, AttemptState.ACTIVE),
        (AttemptState.CANCELLED, AttemptState.FAILED),
        (AttemptState.REPLACED, AttemptState.ACTIVE),
    ],
)
def test_attempt_transitions_rejected(current, requested):
    with pytest.raises(InvalidTransition, match="attempt cannot go from"):
        check_attempt_transition(current, requested)


def test_every_refused_attempt_transition_raises():
    for current in [None, *AttemptState]:
        for requested in AttemptState:
            if requested in ATTEMPT_TRANSITIONS[current]:
                check_attempt_transition(current, requested)
            else:
                with pytest.raises(InvalidTransition):
                    check_attempt_transition(current, requested)
