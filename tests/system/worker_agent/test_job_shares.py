"""Co-located tasks of one job share a /dev/shm and an IPC namespace (NCCL's paths between them); a task of
another job on the same agent sees neither. Real bwrap, nsenter and unshare, tasks as their uids (root)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from mwms.v1 import agent_pb2
from mwms.worker_agent.job_shares import JobShares
from mwms.worker_agent.sandbox import Confinement, find_bwrap
from mwms.worker_agent.seccomp import run_filled
from mwms.worker_agent.task_env import TaskPaths
from mwms.worker_agent.task_users import TaskUsers
from mwms_testkit.parallel import free_uid_range

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None, reason="a sandbox as another uid needs root and bwrap"
)

# What each task does: say its IPC namespace and uid, write a file only its owner may read into /dev/shm,
# then list /dev/shm and read every file there.
PROGRAM = """
import os, sys
name = sys.argv[1]
with open(os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_WRONLY, 0o600), "w") as f:
    f.write(name)
seen = {}
for entry in sorted(os.listdir("/dev/shm")):
    try:
        seen[entry] = open(f"/dev/shm/{entry}").read()
    except OSError as error:
        seen[entry] = type(error).__name__
print(os.readlink("/proc/self/ns/ipc"), os.getuid(), seen)
"""


def test_a_jobs_tasks_share_dev_shm_and_ipc_and_another_jobs_task_sees_neither(tmp_path: Path) -> None:
    work_dir = tmp_path / "agent"
    work_dir.mkdir(mode=0o700)
    users = TaskUsers(None, free_uid_range(4), lock_dir=tmp_path / "task-uids")
    confinement = Confinement(work_dir, users, find_bwrap("bwrap"))
    shares = JobShares(work_dir)
    outputs = []
    held = []
    for job, index in (("jobA", 0), ("jobA", 1), ("jobB", 0)):
        start = agent_pb2.StartTask(task_id=f"{job}-{index}", job_id=job, attempt=1, task_index=index)
        paths = TaskPaths.for_task(work_dir, start)
        paths.create_fresh()
        identity = users.acquire(start.task_id, job)
        paths.hand_over(identity.uid, identity.gid)
        share = shares.acquire(job, start.task_id, identity.uid, identity.gid)
        held.append((job, start.task_id, share))
        (paths.bundle_dir / "shm.py").write_text(PROGRAM)
        launch = confinement.launch(
            [sys.executable, "shm.py", f"{job}-{index}"], paths, identity, [], share=share
        )
        done = run_filled(launch.argv, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin"})
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.split(" ", 2))
    (a0_ns, a0_uid, _), (a1_ns, a1_uid, a1_seen), (b_ns, b_uid, b_seen) = outputs
    assert a0_ns == a1_ns != b_ns and a0_ns != os.readlink("/proc/self/ns/ipc")
    assert a0_uid == a1_uid != b_uid  # one uid per job here: NCCL's files are their owner's alone
    assert a1_seen.strip() == str({"jobA-0": "jobA-0", "jobA-1": "jobA-1"})
    assert b_seen.strip() == str({"jobB-0": "jobB-0"})
    # The job's share goes with its last task here.
    job_a_dir = held[0][2].shm_dir
    namespace = held[0][2].ipc_namespace
    assert job_a_dir.stat().st_mode & 0o777 == 0o700 and shares.shm_root.stat().st_mode & 0o777 == 0o700
    assert namespace is not None and namespace.exists()
    shares.release("jobA", "jobA-0")
    assert job_a_dir.exists()
    shares.release("jobA", "jobA-1")
    assert not job_a_dir.exists() and not namespace.exists()
    # What a crashed agent left is removed by the next one.
    shares.clean_stale()
    assert not shares.shm_root.exists() and not list(shares.ns_root.iterdir())


def test_tasks_of_one_job_share_a_uid_and_each_job_has_its_own(tmp_path: Path) -> None:
    users = TaskUsers(None, free_uid_range(2), lock_dir=tmp_path / "task-uids")
    a0, a1, b0 = users.acquire("a0", "A"), users.acquire("a1", "A"), users.acquire("b0", "B")
    assert a0 == a1 and a0.uid != b0.uid
    assert not users.sole_holder("a0") and users.sole_holder("b0")
    assert users.release("a0") is False  # a1 still runs as it
    assert users.sole_holder("a1") and users.release("a1") is True
    assert users.acquire("c0", "C").uid == a0.uid  # free again (the only one)
