"""Messages and streams the agent tests build again and again."""

from __future__ import annotations

from typing import Any

from mwms.v1 import agent_pb2


def start_task(task_id: str, digest: str, **fields: object) -> agent_pb2.StartTask:
    """A StartTask for a 1-worker CPU task of job-1, attempt 1, index 0, running `python train.py`."""
    values: dict[str, object] = dict(
        task_id=task_id,
        job_id="job-1",
        attempt=1,
        task_index=0,
        num_workers=1,
        bundle_digest=digest,
        command=["python", "train.py"],
        device_kind=agent_pb2.DEVICE_KIND_CPU_SLOT,
        device_indices=[0],
        stop_grace_seconds=1,
    )
    values.update(fields)
    return agent_pb2.StartTask(**values)  # type: ignore[arg-type]


def connected(fake: Any, wait_for: Any, count: int = 1) -> Any:
    """The fake coordinator's `count`-th stream once its Hello has arrived."""
    wait_for(
        lambda: len(fake.streams) >= count and fake.streams[count - 1].of_kind("hello"),
        f"connection {count} with a Hello",
        observed=lambda: [s.received[:1] for s in fake.streams],
    )
    return fake.streams[count - 1]
