"""The start command rules on their own (server/services/job_life/start_commands.py): the env and preflight choices a
StartTask carries, and the reasons a start command is refused."""

from __future__ import annotations

from mwms.agent_link import AGENT_RECEIVE_LIMIT_BYTES
from mwms.preflight_contract import ALLREDUCE_ENV
from mwms.server.db.models import Job, Task
from mwms.server.rpc.convert import start_task
from mwms.server.services.job_life.start_commands import (
    StartDefaults,
    oversize_reason,
    start_spec,
    unbuildable_reason,
)
from mwms.task_environment import COMMUNICATION, PREEMPTION_GRACE_S


def job(workers: int = 2, env: dict[str, str] | None = None, **options: object) -> Job:
    return Job(
        id="job-1",
        num_workers=workers,
        bundle_digest="b" * 64,
        command=["python", "train.py"],
        env=env or {"A": "1"},
        options=options,
    )


def task(attempt: int = 1) -> Task:
    return Task(
        id="task-1",
        attempt_number=attempt,
        index=1,
        tf_config="{}",
        port=20001,
        device_indices=[0],
        device_kind="cpu",
    )


def test_the_spec_carries_the_job_env_and_the_coordinators_settings():
    defaults = StartDefaults(stop_grace_s=7, shared_checkpoint_dir="/shared", preemption_grace_s=12)
    spec = start_spec(task(attempt=2), job(communication={"implementation": "RING"}), defaults)
    # The preemption grace: the coordinator's default unless the job sets preemption_grace_seconds.
    assert spec.env == {"A": "1", COMMUNICATION: "RING", PREEMPTION_GRACE_S: "12"}
    assert (spec.stop_grace_s, spec.shared_checkpoint_dir, spec.restore_checkpoint) == (7, "/shared", True)
    assert (
        spec.preflight_timeout_s is None and start_spec(task(), job(), defaults).restore_checkpoint is False
    )
    message = start_task(spec).start
    assert dict(message.env) == spec.env and not message.preflight and message.attempt == 2


def test_preflight_runs_when_the_job_or_the_default_wants_it_and_never_for_one_worker():
    on = StartDefaults(stop_grace_s=1, preflight=True, preflight_timeout_s=30)
    off = StartDefaults(stop_grace_s=1, preflight=False, preflight_timeout_s=30)
    assert start_spec(task(), job(), on).preflight_timeout_s == 30
    assert start_spec(task(), job(), off).preflight_timeout_s is None
    assert start_spec(task(), job(preflight=True), off).preflight_timeout_s == 30
    assert start_spec(task(), job(preflight=False), on).preflight_timeout_s is None
    assert start_spec(task(), job(workers=1, preflight=True), on).preflight_timeout_s is None
    message = start_task(start_spec(task(), job(), on)).start
    assert message.preflight and message.preflight_timeout_seconds == 30


def test_the_allreduce_phase_is_left_out_only_when_the_default_says_so_and_the_job_did_not_ask():
    without = StartDefaults(stop_grace_s=1, preflight=True, preflight_allreduce=False)
    assert start_spec(task(), job(), without).env[ALLREDUCE_ENV] == "0"
    assert ALLREDUCE_ENV not in start_spec(task(), job(preflight=True), without).env
    assert start_spec(task(), job(env={ALLREDUCE_ENV: "1"}), without).env[ALLREDUCE_ENV] == "1"
    with_it = StartDefaults(stop_grace_s=1, preflight=True)
    assert ALLREDUCE_ENV not in start_spec(task(), job(), with_it).env
    no_check = StartDefaults(stop_grace_s=1, preflight=False, preflight_allreduce=False)
    assert ALLREDUCE_ENV not in start_spec(task(), job(), no_check).env


def test_refusal_reasons():
    assert oversize_reason(AGENT_RECEIVE_LIMIT_BYTES) is None
    reason = oversize_reason(AGENT_RECEIVE_LIMIT_BYTES + 1)
    assert reason is not None and f"is {AGENT_RECEIVE_LIMIT_BYTES + 1} bytes" in reason
    assert "make env and command smaller" in reason
    assert (
        unbuildable_reason(TypeError("x" * 500))
        == f"its start command cannot be built (TypeError: {'x' * 200})"
    )
