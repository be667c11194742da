"""A job submitted to the fake API (POST /api/v1/jobs): it moves one state per read of its details.

PENDING -> RUNNING (twice, the second time with step 10 and loss 0.5) -> SUCCEEDED, or FAILED (task 1
exits with code 3) when a word of its command contains "fail". Its tasks run on local-1, local-2, ...; its
metrics hold steps 10 and 20 of loss and accuracy from the start; it writes log lines as it goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mwms.server.schemas import JobCreate
from mwms_testkit.fake_api.fake_job import ENDED_STATES, FakeJob, attempt_ending, fake_task, now, state_event

if TYPE_CHECKING:
    from mwms_testkit.fake_api.state import FakeState


def scripted_metrics() -> list[dict[str, Any]]:
    wall_time = now()
    return [
        {"name": metric, "step": step, "value": value, "wall_time": wall_time, "attempt": 1}
        for step, loss in ((10, 0.5), (20, 0.25))
        for metric, value in (("loss", loss), ("accuracy", 1 - loss))
    ]


@dataclass
class ScriptedJob(FakeJob):
    step: int | None = None
    loss: float | str | None = None

    @classmethod
    def submitted(cls, job_id: str, spec: JobCreate, submitted_by: str) -> ScriptedJob:
        """The job `spec` makes, PENDING, as the coordinator answers a submit."""
        kept = {
            "command",
            "bundle_digest",
            "communication",
            "restart",
            "preflight",
            "agents",
            "max_runtime_seconds",
        }
        kept |= {
            "startup_timeout_seconds",
            "memory_per_worker",
            "cpus_per_worker",
            "preemption_grace_seconds",
        }
        return cls(
            job_id,
            spec.name or "job",
            "PENDING",
            now(),
            attempts=0,
            submitted_by=submitted_by,
            team="",
            priority=spec.priority,
            preemptible=spec.preemptible,
            workers=spec.workers,
            gpus_per_worker=spec.gpus_per_worker,
            metrics=scripted_metrics(),
            spec={**spec.model_dump(mode="json", include=kept), "env_names": sorted(spec.env)},
            tasks=[],
            events=[],
        )

    def progress(self) -> tuple[int | None, float | str | None]:
        return self.step, self.loss

    def ending(self, number: int, state: str) -> dict[str, Any]:
        if state == "FAILED":
            return attempt_ending(
                "task_failed",
                "task 1 failed on agent local-2: exit code 3",
                task=1,
                agent="local-2",
                exit_code=3,
            )
        return super().ending(number, state)

    def read(self, state: FakeState) -> None:
        """One step of the scripted life."""
        if self.state in ENDED_STATES:
            return
        self.polls += 1
        if self.polls == 1:
            self.start(state)
        elif self.polls == 2:
            self.step, self.loss = 10, 0.5
            state.add_log(self.id, 0, "step 10 loss 0.5")
            state.add_log(self.id, 0, "a warning", stream="stderr")
        else:
            self.finish(state)

    def start(self, state: FakeState) -> None:
        self.state, self.started_at, self.attempts = "RUNNING", now(), 1
        agents = [f"local-{index + 1}" for index in range(self.workers)]
        self.tasks = [
            fake_task(
                self.id, i, attempt=1, state="RUNNING", agent=agent, started_at=now(), workers=self.workers
            )
            for i, agent in enumerate(agents)
        ]
        assert self.events is not None
        self.events.append(state_event("PENDING", "RUNNING", "", now()))
        state.add_log(self.id, 0, "epoch 1 starting")
        state.add_log(self.id, 1, "worker 1 says hi")

    def finish(self, state: FakeState) -> None:
        failing = any("fail" in word for word in self.spec["command"])
        self.state = "FAILED" if failing else "SUCCEEDED"
        self.finished_at, self.step, self.loss = now(), 20, 0.25
        self.reason = "task 1 exited with code 3" if failing else ""
        for task in self.tasks or []:
            failed = failing and task["index"] == 1
            task.update(
                state="FAILED" if failed else "SUCCEEDED", exit_code=3 if failed else 0, ended_at=now()
            )
        assert self.events is not None
        self.events.append(state_event("RUNNING", self.state, self.reason, now()))
        if failing:
            state.add_log(self.id, 1, "Traceback: boom", stream="stderr")
        state.add_log(self.id, 0, "done")
