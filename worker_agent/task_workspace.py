"""The files of this agent's tasks: what a task is given to run with and what is taken from it afterwards.

`TaskWorkspace` fetches and extracts a task's bundle into its fresh task dir, installs the job's latest
checkpoint there, hands the dirs over to the task's user, holds the job's own Python environment for it
(worker_agent/environments.py) and gives it back, watches and uploads the chief's checkpoints, uploads
the chief's artifacts, and removes the task's files once it is forgotten. TaskManager (worker_agent/tasks.py)
decides when; the reports stay there.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

from mwms.archive import ArchiveError, extract_archive
from mwms.v1 import agent_pb2, agent_pb2_grpc
from mwms.worker_agent import artifacts, checkpoints
from mwms.worker_agent.bundles import BundleCache
from mwms.worker_agent.checkpoints import CheckpointWatcher, RestoreError
from mwms.worker_agent.environments import Environment, EnvironmentCache, EnvironmentSpec
from mwms.worker_agent.task_env import TaskPaths
from mwms.worker_agent.task_files import pack_beneath
from mwms.worker_agent.task_record import TaskRecord
from mwms.worker_agent.task_users import TaskIdentity

log = logging.getLogger("mwms.agent.tasks")


class TaskWorkspace:
    """Fills, hands over, uploads and removes the tasks' files; holds and releases their environments."""

    def __init__(
        self,
        work_dir: Path,
        stub: agent_pb2_grpc.AgentServiceStub,
        environments: EnvironmentCache,
        owners_lock: threading.Lock,
    ) -> None:
        self._stub = stub
        self._work_dir = work_dir
        self._bundles = BundleCache(work_dir / "bundles", stub)
        self._environments = environments
        # Which task made each task dir: a task the coordinator placed again under the same job, attempt
        # and index gets the same dir, and the earlier record must not remove it when it is forgotten.
        # Guarded by `owners_lock` (TaskManager's lock on its records).
        self._dir_owners: dict[Path, str] = {}
        self._owners_lock = owners_lock

    def use_stub(self, stub: agent_pb2_grpc.AgentServiceStub) -> None:
        """Uses `stub` (a new channel) for bundle fetches, uploads and checkpoint restores from now on."""
        self._stub = stub
        self._bundles.use_stub(stub)

    def fetch_bundle(self, start: agent_pb2.StartTask) -> Path | None:
        """The task's verified bundle archive (fetched when missing or changed); None without a bundle."""
        return self._bundles.get(start.bundle_digest) if start.bundle_digest else None

    def prepare(self, record: TaskRecord, archive: Path | None, identity: TaskIdentity) -> None:
        """Makes the task dir afresh with the bundle and the restored checkpoint in it: filled while only
        the agent can write there, then handed to the task's user."""
        start = record.start
        with self._owners_lock:
            self._dir_owners[record.paths.task_dir] = record.task_id
        record.paths.create_fresh()
        if archive is not None:
            extract_archive(archive, record.paths.bundle_dir)
        if start.restore_checkpoint and not start.shared_checkpoint_dir:
            self._restore_checkpoint(record)
        if not identity.shared:
            record.paths.hand_over(identity.uid, identity.gid)

    def prepare_warm(
        self, record: TaskRecord, archive: Path | None, identity: TaskIdentity, warm_scratch: Path
    ) -> None:
        """`prepare` for a task dir a warm interpreter's sandbox binds already (worker_agent/warm_pool.py):
        filled in place, as its directories must stay the ones bound; the interpreter's scratch dir goes."""
        start = record.start
        with self._owners_lock:
            self._dir_owners[record.paths.task_dir] = record.task_id
        self._link_usual_dir(record)
        shutil.rmtree(warm_scratch, ignore_errors=True)
        shutil.rmtree(record.paths.scratch_dir, ignore_errors=True)
        record.paths.scratch_dir.mkdir(mode=0o700, parents=True)
        if archive is not None:
            extract_archive(archive, record.paths.bundle_dir)
        if start.restore_checkpoint and not start.shared_checkpoint_dir:
            self._restore_checkpoint(record)
        if not identity.shared:
            record.paths.hand_over(identity.uid, identity.gid)

    def _link_usual_dir(self, record: TaskRecord) -> None:
        """Links jobs/<job>/attempt-<n>/task-<i>, where a cold start's files would be, to a warm task's dir,
        for whoever looks there (the agent reads and removes the real one, never through the link)."""
        usual = TaskPaths.for_task(self._work_dir, record.start).task_dir
        for parent in reversed(usual.parents[:3]):
            parent.mkdir(exist_ok=True)
            parent.chmod(0o711)
        if usual.is_symlink():
            usual.unlink()
        else:
            shutil.rmtree(usual, ignore_errors=True)
        usual.symlink_to(record.paths.task_dir)

    def _unlink_usual_dir(self, record: TaskRecord) -> None:
        """Removes `_link_usual_dir`'s link, unless a later task of the same place made its own there."""
        usual = TaskPaths.for_task(self._work_dir, record.start).task_dir
        try:
            if usual.is_symlink() and os.readlink(usual) == str(record.paths.task_dir):
                usual.unlink()
        except OSError:
            return
        for parent in usual.parents[:2]:
            try:
                parent.rmdir()
            except OSError:
                break

    def _restore_checkpoint(self, record: TaskRecord) -> None:
        """Installs the job's latest checkpoint archive into the task's own checkpoint dir (each task has
        its own, owned by its user); a failure is only noted."""
        try:
            size = checkpoints.restore_checkpoint(
                self._stub,
                record.start.job_id,
                record.paths.checkpoint_dir,
                scratch=record.paths.scratch_dir,
            )
        except (RestoreError, ArchiveError, OSError) as error:
            log.warning("task %s: %s", record.task_id, error)
            record.add_log(
                "stderr", f"mwms-agent: could not restore the checkpoint ({error}); starting without it"
            )
            return
        if size:
            log.info("restored the checkpoint of job %s (%d bytes)", record.start.job_id, size)
            record.add_log("stderr", f"mwms-agent: restored the job's latest checkpoint ({size} bytes)")

    def acquire_environment(self, record: TaskRecord) -> Environment:
        """The job's own Python environment, built with uv (or found in the cache) and held for the task
        (`record.environment`); its lines go to the task's log. Raises EnvironmentBuildError."""
        start = record.start
        spec = EnvironmentSpec(
            locked=start.environment_lock,
            python=start.environment_python,
            isolated=start.environment_isolated,
        )
        record.add_log("stderr", f"mwms-agent: building environment {spec.key()[:12]} (uv)")
        environment = self._environments.acquire(spec, lambda line: record.add_log("stderr", line))
        record.environment = environment
        return environment

    def release_environment(self, record: TaskRecord) -> None:
        """Gives back the task's hold on its environment (which the cache may then evict)."""
        if record.environment is not None:
            self._environments.release(record.environment)
            record.environment = None

    def checkpoint_watcher(self, record: TaskRecord) -> CheckpointWatcher | None:
        """A watcher of the chief's checkpoint dir, unless checkpoints live on a shared filesystem."""
        if record.start.task_index != 0 or record.start.shared_checkpoint_dir:
            return None

        def upload(archive: Path) -> None:
            checkpoints.upload_checkpoint(self._stub, record.task_id, archive)

        return CheckpointWatcher(
            record.paths.checkpoint_dir, record.paths.scratch_dir, upload, within=record.paths.task_dir
        )

    def upload_artifacts(self, record: TaskRecord) -> None:
        output = record.paths.output_dir
        if not artifacts.directory_has_files(output):
            return
        archive = record.paths.scratch_dir / "artifacts.tar.gz"
        try:
            pack_beneath(record.paths.task_dir, output, archive)
            response = artifacts.upload_archive(
                self._stub, record.task_id, agent_pb2.FILE_KIND_ARTIFACTS, archive
            )
            log.info("uploaded artifacts of task %s (%d bytes)", record.task_id, response.size)
        except Exception as error:  # noqa: BLE001 - a failed upload must not hide the task's final state
            log.warning("could not upload the artifacts of task %s: %s", record.task_id, error)
            record.add_log("stderr", f"mwms-agent: could not upload the artifacts: {error}")
        finally:
            archive.unlink(missing_ok=True)

    def remove(self, record: TaskRecord) -> None:
        """Removes the task's scratch dir, and its task dir unless a later task made it again."""
        paths = record.paths
        shutil.rmtree(paths.scratch_dir, ignore_errors=True)
        with self._owners_lock:
            if self._dir_owners.get(paths.task_dir, record.task_id) != record.task_id:
                return  # made again by a later task of the same job, attempt and index
            self._dir_owners.pop(paths.task_dir, None)
        shutil.rmtree(paths.task_dir, ignore_errors=True)
        self._unlink_usual_dir(record)  # a warm start's link (nothing to do for a cold start's dir)
        # The attempt's and the job's dirs go with their last task (rmdir fails while others remain).
        for parent in paths.task_dir.parents[:2]:
            try:
                parent.rmdir()
            except OSError:
                break
