"""A real task started by a real agent sees the contract's environment (mwms/task_environment.py): every
variable the agent adds or changes is one a job may not set, or one it only defaults or merges."""

from __future__ import annotations

import io
import json
import os
import tarfile
import textwrap

from mwms import grpc_process, task_environment
from mwms.v1 import agent_pb2
from mwms_testkit.agent_builders import connected, start_task
from mwms_testkit.cluster import pack

S = agent_pb2

WRITE_ENVIRONMENT = textwrap.dedent(
    """
    import json, os
    with open(os.path.join(os.environ["MWMS_OUTPUT_DIR"], "env.json"), "w") as out:
        json.dump(dict(os.environ), out)
    """
)


def test_what_the_agent_sets_is_reserved_defaulted_or_merged(coordinator, start_agent, wait_for) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    agent_env = dict(os.environ)  # what the agent's own environment holds (it passes os.environ on)
    start_agent(address)  # as root: bubblewrap and a task user of its own (HOME, USER, LOGNAME)
    stream = connected(fake, wait_for)
    digest = fake.add_bundle(pack({"train.py": WRITE_ENVIRONMENT}))
    job_env = {"MY_SETTING": "kept", "MWMS_COMMUNICATION": "RING"}  # as the coordinator's job_env sends it
    stream.send(start=start_task("task-env", digest, env=job_env))
    wait_for(
        lambda: S.TASK_STATE_SUCCEEDED in fake.states("task-env"),
        "SUCCEEDED",
        observed=lambda: (fake.reports("task-env"), fake.log_lines("task-env")),
    )
    (data,) = [data for task_id, kind, data in fake.uploads if task_id == "task-env"]
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.extractfile("env.json")
        assert member is not None
        seen: dict[str, str] = json.load(member)

    assert {name: seen[name] for name in job_env} == job_env
    set_by_agent = {
        name for name, value in seen.items() if name not in job_env and agent_env.get(name) != value
    }
    allowed = (
        task_environment.RESERVED_ENV | set(task_environment.DEFAULTED_ENV) | task_environment.MERGED_ENV
    )
    assert set_by_agent - allowed == set(), (
        f"the agent sets variables a job could set too: {set_by_agent - allowed}"
    )
    # The runtime's names, and the ones a job may not give, are what the task really got.
    assert seen[task_environment.TASK_ID] == "task-env" and seen[task_environment.JOB_ID] == "job-1"
    assert seen[task_environment.PYTHONUNBUFFERED] == "1"
    assert seen[task_environment.TMPDIR].endswith("/task-0/tmp")
    assert seen[task_environment.STACKS_DIR].endswith("/task-0/stacks")
    assert seen[task_environment.USE_LEGACY_KERAS] == agent_env.get(
        task_environment.USE_LEGACY_KERAS, task_environment.DEFAULTED_ENV[task_environment.USE_LEGACY_KERAS]
    )
    # The agent's own settings and secrets do not reach the task.
    assert not {name for name in seen if name.startswith("MWMS_")} - allowed - set(job_env)
    # Nor the gRPC settings mwms gives its own processes (mwms/grpc_process.py): TensorFlow's gRPC reads them.
    ours = grpc_process.set_by_mwms(agent_env)
    assert ours and not ours & set(seen), ours & set(seen)
