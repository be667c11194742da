"""`Job.wait`, and `watch_job` on it (behind `mwms submit --wait`), return only once every task of the job's newest attempt has
ended, not at the job's final state; a task whose end never comes is waited for a bounded time, and the
ending names it. Against the real HTTP fake of the API, whose job rows a test changes as a coordinator
would."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from mwms.cli.follow import watch_job
from mwms.cli.submit import report_ending
from mwms.client import Client, job
from mwms.client.job import running_tasks, task_ends_deadline_s
from mwms_testkit.fake_api import T0, USER_TOKEN, FakeJob, FakeState, fake_task


def _cancelled_with_running_tasks(state: FakeState) -> str:
    tasks = [
        fake_task("job0001", index, attempt=1, state="RUNNING", agent=f"local-{index + 1}", started_at=T0)
        for index in (0, 1)
    ]
    job = FakeJob("job0001", "j", "CANCELLED", T0, reason="cancelled by bob", submitted_by="bob", tasks=tasks)
    state.jobs["job0001"] = job
    return "job0001"


def test_the_wait_goes_on_until_every_task_has_ended(fake_api: tuple[str, FakeState]) -> None:
    api, state = fake_api
    job_id = _cancelled_with_running_tasks(state)

    def stop_the_tasks() -> None:
        time.sleep(0.6)
        for task in state.jobs[job_id].tasks:
            task["state"] = "STOPPED"

    stopper = threading.Thread(target=stop_the_tasks)
    started = time.monotonic()
    stopper.start()
    with Client(api, token=USER_TOKEN) as client:
        seen: list[dict[str, Any]] = []
        final = watch_job(client, job_id, on_job=seen.append, interval=0.1)
    stopper.join()
    assert time.monotonic() - started >= 0.6
    assert final["state"] == "CANCELLED" and running_tasks(final) == []
    assert seen[0]["state"] == "CANCELLED" and running_tasks(seen[0])  # seen ended before its tasks were


def test_a_task_whose_end_never_comes_is_waited_for_a_bounded_time_and_named(
    fake_api: tuple[str, FakeState], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api, state = fake_api
    job_id = _cancelled_with_running_tasks(state)
    monkeypatch.setattr(job, "DEFAULT_STOP_GRACE_S", 0.2)
    monkeypatch.setattr(job, "TASK_ENDS_MARGIN_S", 0.3)
    with Client(api, token=USER_TOKEN) as client:
        started = time.monotonic()
        final = watch_job(client, job_id, on_job=lambda job: None, interval=0.1)
        assert 0.5 <= time.monotonic() - started < 5
        report_ending(client, final)
    printed = " ".join(capsys.readouterr().err.split())
    assert "task 0 on agent local-1 is still RUNNING: its end was not reported in time" in printed
    assert f"(see mwms status {job_id})" in printed


def test_the_bound_follows_the_jobs_own_grace() -> None:
    assert task_ends_deadline_s({"preemption_grace_seconds": 600}) == 600 + job.TASK_ENDS_MARGIN_S
    assert task_ends_deadline_s({}) == job.DEFAULT_STOP_GRACE_S + job.TASK_ENDS_MARGIN_S


def test_the_python_client_waits_for_the_tasks_too(fake_api: tuple[str, FakeState]) -> None:
    api, state = fake_api
    job_id = _cancelled_with_running_tasks(state)
    started = time.monotonic()  # before the timer: the tasks end 0.5 s from here, however loaded the machine
    threading.Timer(0.5, lambda: [t.update(state="STOPPED") for t in state.jobs[job_id].tasks]).start()
    with Client(api, token=USER_TOKEN) as client:
        waited = client.job(job_id)
        assert waited.wait(poll_interval=0.1) == "CANCELLED"
        assert time.monotonic() - started >= 0.5 and running_tasks(waited.raw) == []
