"""Checkpoints without shared storage: the chief's checkpoint dir goes up to the coordinator after each save,
and every task of a restarted attempt gets the latest archive back before its process starts.

A save is complete when the directory changed and then stayed unchanged for one more poll (its signature:
relative path, size and mtime of every file), and, where it holds TensorFlow's `checkpoint` index, no file
is newer than the index: TensorFlow writes a save's data first and the index last, so a save whose data is
written but whose index is not yet (a process stalled between the two) waits for it. Nothing here blocks
the task: uploads run in the watcher's thread, and a failed one is retried at the next poll.

tf_keras BackupAndRestore lets non-chief workers write `workertemp_<n>` directories inside the backup dir
and removes them after the save; those are left out of the signature and of the archive.
"""

from __future__ import annotations

import logging
import os
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from mwms.archive import DEFAULT_LIMITS, ArchiveLimits, archive_format, extract_archive, limit_exceeded
from mwms.v1 import agent_pb2, agent_pb2_grpc
from mwms.worker_agent import artifacts
from mwms.worker_agent.task_files import pack_beneath

log = logging.getLogger("mwms.agent.checkpoints")

POLL_SECONDS = 1.0
FETCH_TIMEOUT_SECONDS = 1800.0
WORKER_TEMP_PREFIX = "workertemp_"
INDEX_FILE = "checkpoint"  # tf.train.CheckpointManager's (and so BackupAndRestore's) index of saves

Signature = tuple[tuple[str, int, int], ...]


class RestoreError(Exception):
    """The checkpoint archive could not be fetched or installed; the message says why."""


def directory_signature(directory: Path) -> Signature:
    """(relative path, size, mtime_ns) of every file under `directory`, sorted; empty when it is missing."""
    found = []
    for root, dirs, files in os.walk(directory):
        if Path(root) == directory:
            dirs[:] = [d for d in dirs if not d.startswith(WORKER_TEMP_PREFIX)]
        for name in files:
            path = Path(root, name)
            try:
                stat = path.stat()
            except OSError:  # removed between listing and stat: the next poll sees the change
                continue
            found.append((path.relative_to(directory).as_posix(), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(found))


def index_written_last(signature: Signature) -> bool:
    """No file is newer than the top-level `checkpoint` index, when there is one (without one, stability
    alone decides)."""
    index = next((mtime for path, _, mtime in signature if path == INDEX_FILE), None)
    return index is None or all(mtime <= index for _, _, mtime in signature)


def pack_checkpoint(directory: Path, archive: Path) -> None:
    """Writes `directory`'s contents (without `workertemp_*`) to the tar.gz `archive`."""
    with tarfile.open(archive, "w:gz") as tar:
        for entry in sorted(directory.iterdir()):
            if entry.is_dir() and entry.name.startswith(WORKER_TEMP_PREFIX):
                continue
            tar.add(entry, arcname=entry.name)


class CheckpointWatcher:
    """Watches the chief's checkpoint dir and uploads it through `upload(archive)` after every completed save."""

    def __init__(
        self,
        directory: Path,
        scratch_dir: Path,
        upload: Callable[[Path], None],
        poll_seconds: float | None = None,
        within: Path | None = None,
    ) -> None:
        self.directory = directory
        # The task dir `directory` lies in, which the task can write: packed without following links.
        self._within = within
        self._scratch_dir = scratch_dir
        self._upload = upload
        self._poll_seconds = POLL_SECONDS if poll_seconds is None else poll_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"checkpoints-{directory.name}", daemon=True)
        # What the dir held when the task started (a restored checkpoint is not uploaded again).
        self._uploaded: Signature = ()
        self._previous: Signature = ()
        self.uploads = 0

    def start(self) -> None:
        """Takes the starting signature and begins polling."""
        self._uploaded = self._previous = directory_signature(self.directory)
        self._thread.start()

    def finish(self) -> None:
        """Stops polling and uploads once more when the dir changed since the last upload (task exit)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        current = directory_signature(self.directory)
        if current and current != self._uploaded:
            self._try_upload(current)

    def cancel(self) -> None:
        """Stops polling without a last upload (the task's process never started)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._poll_seconds):
            current = directory_signature(self.directory)
            stable = current == self._previous
            self._previous = current
            # Changed since the last upload, unchanged over the last poll, its index written last: a save
            # has completed.
            if stable and current and current != self._uploaded and index_written_last(current):
                self._try_upload(current)

    def _try_upload(self, signature: Signature) -> None:
        self._scratch_dir.mkdir(parents=True, exist_ok=True)
        archive = self._scratch_dir / "checkpoint-upload.tar.gz"
        try:
            if self._within is not None:
                pack_beneath(self._within, self.directory, archive, skip_top=_is_worker_temp)
            else:
                pack_checkpoint(self.directory, archive)
            if directory_signature(self.directory) != signature:
                log.info("checkpoint dir %s changed while packing; uploading after the save", self.directory)
                return
            self._upload(archive)
        except Exception as error:  # noqa: BLE001 - retried at the next poll; the task goes on
            log.warning("could not upload the checkpoint in %s (retrying later): %s", self.directory, error)
            return
        finally:
            archive.unlink(missing_ok=True)
        self._uploaded = signature
        self.uploads += 1


def _is_worker_temp(name: str) -> bool:
    return name.startswith(WORKER_TEMP_PREFIX)


def upload_checkpoint(stub: agent_pb2_grpc.AgentServiceStub, task_id: str, archive: Path) -> None:
    """Sends `archive` as the job's latest checkpoint (UploadFiles, kind CHECKPOINT)."""
    response = artifacts.upload_archive(stub, task_id, agent_pb2.FILE_KIND_CHECKPOINT, archive)
    log.info("uploaded the checkpoint of task %s (%d bytes)", task_id, response.size)


def restore_checkpoint(
    stub: agent_pb2_grpc.AgentServiceStub,
    job_id: str,
    checkpoint_dir: Path,
    limits: ArchiveLimits = DEFAULT_LIMITS,
    scratch: Path | None = None,
) -> int:
    """Replaces `checkpoint_dir`'s contents with the job's latest archive; returns its size (0: none stored).

    With no archive stored the local dir is left as it is. The archive is fetched and extracted next to
    the dir first, so a failure leaves the dir untouched.
    """
    parent = scratch or checkpoint_dir.parent  # the agent's own scratch dir, same filesystem
    parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=parent, prefix=".checkpoint-fetch-", suffix=".tar.gz")
    archive = Path(name)
    staging = Path(tempfile.mkdtemp(dir=parent, prefix=".checkpoint-restore-"))
    try:
        size = 0
        try:
            with os.fdopen(fd, "wb") as out:
                request = agent_pb2.FetchCheckpointRequest(job_id=job_id)
                for chunk in stub.FetchCheckpoint(request, timeout=FETCH_TIMEOUT_SECONDS):
                    size += len(chunk.data)
                    if size > limits.max_archive_bytes:
                        raise RestoreError(
                            f"the checkpoint of job {job_id} was refused: "
                            f"{limit_exceeded('max_archive_bytes', size, limits)}"
                        )
                    out.write(chunk.data)
        except grpc.RpcError as error:
            raise RestoreError(
                f"could not fetch the checkpoint of job {job_id}: {_rpc_reason(error)}"
            ) from error
        if size == 0:
            return 0
        if archive_format(archive) != "tar.gz":
            raise RestoreError(f"the checkpoint of job {job_id} is not a tar.gz archive")
        extract_archive(archive, staging, limits)
        _replace_directory(checkpoint_dir, staging)
        return size
    finally:
        archive.unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)


def _replace_directory(target: Path, replacement: Path) -> None:
    """Puts `replacement` where `target` is: two renames, the old contents removed afterwards."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(replacement, target)
    shutil.rmtree(old, ignore_errors=True)


def _rpc_reason(error: grpc.RpcError) -> str:
    if isinstance(error, grpc.Call):
        return f"{error.code().name}: {error.details()}"
    return str(error)
