"""Who tasks run as and what the agent does with the files they wrote: task users, the sandbox, and
reads of task dirs that never follow a link (real processes, real bwrap where installed, as root in CI)."""

from __future__ import annotations

import os
import pwd
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

from mwms.v1 import agent_pb2
from mwms.worker_agent.metrics import MetricsTail
from mwms.worker_agent.sandbox import Confinement, SandboxError, closed_ancestor, find_bwrap
from mwms.worker_agent.seccomp import run_filled
from mwms.worker_agent.task_env import TaskPaths
from mwms.worker_agent.task_files import pack_beneath, read_beneath
from mwms.worker_agent.task_users import TaskIdentity, TaskUserError, TaskUsers
from mwms_testkit.parallel import free_uid_range

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="changing a task's uid needs root")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@needs_root
def test_each_running_task_gets_a_uid_of_its_own_and_gives_it_back(tmp_path: Path) -> None:
    low, high = free_uid_range(2)
    users = TaskUsers(None, (low, high), lock_dir=tmp_path / "task-uids")
    first, second = users.acquire("a"), users.acquire("b")
    assert {first.uid, second.uid} == {low, high} and first.gid == first.uid and not first.shared
    assert users.acquire("a") == first  # asked again: the same
    with pytest.raises(TaskUserError, match="in use .*; widen --task-uids"):
        users.acquire("c")
    users.release("a")
    assert users.acquire("c").uid == first.uid
    assert users.per_task and "a uid of its own" in users.describe()


@needs_root
def test_a_range_holding_an_account_or_root_and_a_root_task_user_are_refused(tmp_path: Path) -> None:
    account = next(e for e in pwd.getpwall() if e.pw_uid != 0)
    with pytest.raises(TaskUserError, match=f"holds uid {account.pw_uid}, the account"):
        TaskUsers(None, (account.pw_uid, account.pw_uid), lock_dir=tmp_path)
    with pytest.raises(TaskUserError, match="not a range of unprivileged uids"):
        TaskUsers(None, (0, 10), lock_dir=tmp_path)
    for root in ("root", "0"):
        with pytest.raises(TaskUserError, match="root"):
            TaskUsers(root, (60000, 60999))
    with pytest.raises(TaskUserError, match="no account on this machine"):
        TaskUsers("no-such-user-mwms", (60000, 60999))
    fixed = TaskUsers(account.pw_name, (60000, 60999))
    assert (
        fixed.acquire("x")
        == fixed.acquire("y")
        == TaskIdentity(account.pw_uid, account.pw_gid, account.pw_name)
    )


def test_an_agent_that_is_not_root_shares_its_identity_and_says_so() -> None:
    users = TaskUsers(None, (60000, 60999), agent_uid=1000)
    assert users.shared_with_agent and users.acquire("t").shared
    assert "tasks run as the agent's own user" in users.describe() and "root" in users.describe()
    with pytest.raises(TaskUserError, match="needs an agent started as root"):
        TaskUsers("nobody", (60000, 60999), agent_uid=1000)


def test_the_highest_directory_closed_to_others_is_found_above_a_path(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    (closed / "inner" / "python").mkdir(parents=True)
    closed.chmod(0o700)
    above = [p for p in closed.parents if p != Path("/") and not os.stat(p).st_mode & 0o001]
    assert closed_ancestor(closed / "inner" / "python") == (above[-1] if above else closed)
    closed.chmod(0o755)
    assert closed_ancestor(closed / "inner" / "python") == (above[-1] if above else None)


def start(task_index: int = 0, **fields: object) -> agent_pb2.StartTask:
    return agent_pb2.StartTask(
        task_id=f"t-{task_index}", job_id="j", attempt=1, task_index=task_index, **fields
    )


@needs_root
@needs_bwrap
def test_a_sandboxed_task_runs_as_its_uid_sees_its_dirs_only_and_reaches_a_python_under_a_closed_dir(
    tmp_path: Path,
) -> None:
    """The task's user cannot enter /root, where this Python may live: the sandbox binds it back."""
    work_dir = tmp_path / "agent"
    work_dir.mkdir(mode=0o700)
    (work_dir / "agent-credential").write_text("secret")
    low, high = free_uid_range(1)
    users = TaskUsers(None, (low, high), lock_dir=tmp_path / "task-uids")
    confinement = Confinement(work_dir, users, find_bwrap("bwrap"))
    paths = TaskPaths.for_task(work_dir, start())
    paths.create_fresh()
    (paths.bundle_dir / "train.py").write_text(
        "import os, sys\n"
        "print(os.getuid(), os.getgid(), os.getgroups(), sorted(os.listdir(sys.argv[1])))\n"
        "open(os.path.join(os.environ['OUT'], 'made'), 'w').write('x')\n"
    )
    identity = users.acquire("t-0")
    paths.hand_over(identity.uid, identity.gid)
    launch = confinement.launch([sys.executable, "train.py", str(work_dir)], paths, identity, [])
    done = run_filled(
        launch.argv,
        cwd=paths.bundle_dir,
        env={"OUT": str(paths.output_dir), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(low), str(low), "[]", "['jobs']"]
    made = paths.output_dir / "made"
    assert made.stat().st_uid == low
    assert launch.spare_leader


@needs_root
def test_without_a_sandbox_a_python_the_task_user_cannot_reach_is_refused_at_start(tmp_path: Path) -> None:
    closed = [a for a in (closed_ancestor(Path(p)) for p in (sys.base_prefix, sys.prefix)) if a]
    if not closed:
        pytest.skip("this Python is reachable by every user")
    with pytest.raises(SandboxError, match="cannot reach this agent's Python"):
        Confinement(tmp_path, TaskUsers(None, free_uid_range(1), lock_dir=tmp_path / "task-uids"), None)


def test_reads_of_task_files_never_follow_a_link(tmp_path: Path) -> None:
    task_dir = tmp_path / "task"
    (task_dir / "stacks").mkdir(parents=True)
    secret = tmp_path / "agent-credential"
    secret.write_text("mwmsa_secret")
    (task_dir / "metrics.jsonl").symlink_to(secret)
    with pytest.raises(OSError):
        read_beneath(task_dir, task_dir / "metrics.jsonl", 100)
    # A linked directory on the way is refused too, not only a linked file.
    (task_dir / "linked").symlink_to(tmp_path)
    with pytest.raises(OSError):
        read_beneath(task_dir, task_dir / "linked" / "agent-credential", 100)
    tail = MetricsTail(task_dir / "metrics.jsonl", within=task_dir)
    points, warnings = tail.poll()
    assert points == [] and len(warnings) == 1 and "mwmsa_secret" not in warnings[0]
    assert tail.poll() == ([], [])  # said once


def test_packing_a_task_dir_leaves_links_out(tmp_path: Path) -> None:
    task_dir = tmp_path / "task"
    output = task_dir / "output"
    (output / "sub").mkdir(parents=True)
    (output / "model.txt").write_text("weights")
    (output / "sub" / "more.txt").write_text("more")
    secret = tmp_path / "agent-credential"
    secret.write_text("mwmsa_secret")
    (output / "stolen").symlink_to(secret)
    (output / "sub" / "stolen-dir").symlink_to(tmp_path)
    archive = tmp_path / "out.tar.gz"
    assert pack_beneath(task_dir, output, archive) == 2
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["model.txt", "sub", "sub/more.txt"]
        assert b"mwmsa_secret" not in b"".join(
            tar.extractfile(m).read()
            for m in tar.getmembers()
            if m.isfile()  # type: ignore[union-attr]
        )
    # The output dir itself replaced by a link to the agent's files: nothing is packed.
    shutil.rmtree(output)
    output.symlink_to(tmp_path)
    with pytest.raises(OSError):
        pack_beneath(task_dir, output, archive)
