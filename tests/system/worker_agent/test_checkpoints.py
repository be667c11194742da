"""Checkpoints without shared storage: the chief's saves go up once each (and once more at exit), and a
restarted attempt finds the latest archive in MWMS_CHECKPOINT_DIR before its process starts."""

from __future__ import annotations

import io
import os
import tarfile
import textwrap
import time
from pathlib import Path

import grpc
import pytest

from mwms.v1 import agent_pb2
from mwms.worker_agent import checkpoints
from mwms_testkit.agent_builders import connected, start_task
from mwms_testkit.cluster import pack, wait_until

S = agent_pb2


def archive_files(data: bytes) -> dict[str, str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {
            m.name: tar.extractfile(m).read().decode()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


# Three saves the way a checkpoint manager makes them (data first, then the index file), a pause after
# each of the first two, and the last one right before the process exits. A non-chief's temp dir
# (tf_keras BackupAndRestore's workertemp_<n>) appears during the first save and is left out.
THREE_SAVES = textwrap.dedent(
    """
    import os, pathlib, shutil, time
    d = pathlib.Path(os.environ["MWMS_CHECKPOINT_DIR"])
    for n in (1, 2, 3):
        if n == 1:
            (d / "workertemp_1").mkdir()
            (d / "workertemp_1" / "partial").write_text("x")
        (d / f"ckpt-{n}.data").write_text("weights %d" % n)
        time.sleep(0.05)
        (d / "checkpoint").write_text(f"ckpt-{n}")
        if n == 1:
            shutil.rmtree(d / "workertemp_1")
        print("saved", n, flush=True)
        if n < 3:
            time.sleep(1.5)
    """
)


def test_each_completed_save_of_the_chief_is_uploaded_once_and_the_last_before_the_final_report(
    coordinator, start_agent, wait_for, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(checkpoints, "POLL_SECONDS", 0.2)
    fake, address = coordinator
    start_agent(address)
    stream = connected(fake, wait_for)
    digest = fake.add_bundle(pack({"train.py": THREE_SAVES}))
    stream.send(start=start_task("task-chief", digest))
    wait_for(
        lambda: S.TASK_STATE_SUCCEEDED in fake.states("task-chief"),
        "SUCCEEDED",
        observed=lambda: (fake.reports("task-chief"), fake.log_lines("task-chief")),
    )
    saved = [(kind, archive_files(data)) for task, kind, data in fake.uploads if task == "task-chief"]
    assert [kind for kind, _ in saved] == [S.FILE_KIND_CHECKPOINT] * 3, saved
    assert [files for _, files in saved] == [
        {"ckpt-1.data": "weights 1", "checkpoint": "ckpt-1"},
        {"ckpt-1.data": "weights 1", "ckpt-2.data": "weights 2", "checkpoint": "ckpt-2"},
        {
            "ckpt-1.data": "weights 1",
            "ckpt-2.data": "weights 2",
            "ckpt-3.data": "weights 3",
            "checkpoint": "ckpt-3",
        },
    ]
    # The third save was only complete at exit: its upload came after the process ended, before the report.
    timeline = fake.timeline
    last_upload = max(
        i for i, entry in enumerate(timeline) if entry == ("upload", "task-chief", S.FILE_KIND_CHECKPOINT)
    )
    assert last_upload < timeline.index(("report", "task-chief", S.TASK_STATE_SUCCEEDED))

    # A non-chief writing into its checkpoint dir uploads nothing.
    stream.send(start=start_task("task-worker", digest, job_id="job-2", task_index=1))
    wait_for(lambda: S.TASK_STATE_SUCCEEDED in fake.states("task-worker"), "the worker SUCCEEDED")
    assert [u for u in fake.uploads if u[0] == "task-worker"] == []


LIST_CHECKPOINTS = textwrap.dedent(
    """
    import os
    d = os.environ["MWMS_CHECKPOINT_DIR"]
    print("files:", ",".join(sorted(os.listdir(d))))
    for name in sorted(os.listdir(d)):
        print(name, "=", open(os.path.join(d, name)).read())
    """
)


def test_a_restarted_attempt_starts_with_the_latest_checkpoint(
    coordinator, start_agent, wait_for, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    work_dir = tmp_path / "fresh-agent"
    # What an earlier attempt left on this machine is not seen: each task has a checkpoint dir of its own.
    stale = work_dir / "jobs" / "job-r" / "attempt-1" / "task-0" / "checkpoints"
    stale.mkdir(parents=True)
    (stale / "ckpt-1.data").write_text("old")
    fake.checkpoints["job-r"] = pack({"checkpoint": "ckpt-7", "ckpt-7.data": "weights 7"})
    start_agent(address, work_dir=work_dir)
    stream = connected(fake, wait_for)
    digest = fake.add_bundle(pack({"train.py": LIST_CHECKPOINTS}))

    # Every task of the attempt restores into its own dir, the workers as well as the chief.
    for task_id, index in (("task-r0", 0), ("task-r1", 1)):
        stream.send(
            start=start_task(
                task_id, digest, job_id="job-r", attempt=2, task_index=index, restore_checkpoint=True
            )
        )
    for task_id in ("task-r0", "task-r1"):
        wait_for(
            lambda t=task_id: S.TASK_STATE_SUCCEEDED in fake.states(t),
            f"{task_id} SUCCEEDED",
            observed=lambda t=task_id: fake.log_lines(t),
        )
        stdout = [line.text for line in fake.log_lines(task_id) if line.stream == "stdout"]
        assert stdout == ["files: checkpoint,ckpt-7.data", "checkpoint = ckpt-7", "ckpt-7.data = weights 7"]
    assert fake.checkpoint_fetches == ["job-r", "job-r"]
    # The restored checkpoint is not sent back up by the chief.
    assert [u for u in fake.uploads if u[1] == S.FILE_KIND_CHECKPOINT] == []


@pytest.mark.parametrize("case", ["nothing stored", "fetch fails", "shared filesystem"])
def test_without_an_archive_a_task_starts_with_no_checkpoint_or_the_shared_one(
    case, coordinator, start_agent, wait_for, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """A task's checkpoint dir is its own, made fresh: without an archive it starts empty (nothing another
    job or attempt left on this machine), unless checkpoints live on a shared filesystem."""
    fake, address = coordinator
    work_dir = tmp_path / "agent"
    local = (
        tmp_path / "shared" if case == "shared filesystem" else work_dir / "jobs" / "job-k" / "checkpoints"
    )
    local.mkdir(parents=True)
    (local / "checkpoint").write_text("local")
    if case == "fetch fails":
        fake.checkpoint_fetch_error = grpc.StatusCode.UNAVAILABLE
    if case == "shared filesystem":
        fake.checkpoints["job-k"] = pack({"checkpoint": "from the coordinator"})
    start_agent(address, work_dir=work_dir)
    stream = connected(fake, wait_for)
    digest = fake.add_bundle(pack({"train.py": LIST_CHECKPOINTS}))
    shared = str(local) if case == "shared filesystem" else ""
    stream.send(
        start=start_task(
            "task-k",
            digest,
            job_id="job-k",
            attempt=2,
            task_index=1,
            restore_checkpoint=True,
            shared_checkpoint_dir=shared,
        )
    )
    wait_for(
        lambda: S.TASK_STATE_SUCCEEDED in fake.states("task-k"),
        "SUCCEEDED",
        observed=lambda: fake.log_lines("task-k"),
    )
    lines = [(line.stream, line.text) for line in fake.log_lines("task-k")]
    if case == "shared filesystem":
        assert ("stdout", "checkpoint = local") in lines
    else:
        assert ("stdout", "files: ") in lines
    warnings = [text for stream_name, text in lines if stream_name == "stderr"]
    if case == "fetch fails":
        assert len(warnings) == 1 and "could not restore the checkpoint" in warnings[0]
        assert "UNAVAILABLE" in warnings[0] and "starting without it" in warnings[0]
    else:
        assert warnings == []
    assert fake.checkpoint_fetches == ([] if case == "shared filesystem" else ["job-k"])


def test_a_fetched_file_that_is_not_a_tar_gz_is_refused(tmp_path: Path, coordinator, agent_channel) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    fake.checkpoints["job-z"] = b"PK\x03\x04 a zip is not what the chief uploads"
    target = tmp_path / "checkpoints"
    target.mkdir()
    (target / "keep").write_text("kept")
    with agent_channel(address) as channel:
        from mwms.v1 import agent_pb2_grpc

        with pytest.raises(checkpoints.RestoreError, match="not a tar.gz"):
            checkpoints.restore_checkpoint(agent_pb2_grpc.AgentServiceStub(channel), "job-z", target)
    assert [p.name for p in target.iterdir()] == ["keep"]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoints"]  # no temp files left


def test_a_save_whose_data_is_written_but_not_its_index_is_not_uploaded_however_long_it_waits(
    tmp_path: Path,
) -> None:
    """A process stalled between a save's data and its `checkpoint` index (a loaded machine) leaves a dir
    that is stable over many polls: it is not a completed save until the index is written."""
    directory = tmp_path / "ckpt"
    directory.mkdir()
    uploads: list[dict[str, str]] = []
    watcher = checkpoints.CheckpointWatcher(
        directory,
        tmp_path / "scratch",
        lambda archive: uploads.append(archive_files(archive.read_bytes())),
        poll_seconds=0.05,
    )
    watcher.start()
    try:
        (directory / "ckpt-1.data").write_text("weights 1")
        (directory / "checkpoint").write_text("ckpt-1")
        wait_until(lambda: len(uploads) == 1, 10, "the first save uploaded", interval=0.02)
        data = directory / "ckpt-2.data"
        data.write_text("weights 2")
        index_mtime = (directory / "checkpoint").stat().st_mtime_ns
        os.utime(data, ns=(index_mtime + 10**9, index_mtime + 10**9))  # certainly newer than the index
        time.sleep(0.5)  # ten polls with the dir unchanged
        assert len(uploads) == 1, uploads
        (directory / "checkpoint").write_text("ckpt-2")
        os.utime(directory / "checkpoint", ns=(index_mtime + 2 * 10**9, index_mtime + 2 * 10**9))
        wait_until(lambda: len(uploads) == 2, 10, "the second save uploaded", interval=0.02)
    finally:
        watcher.finish()
    assert uploads == [
        {"ckpt-1.data": "weights 1", "checkpoint": "ckpt-1"},
        {"ckpt-1.data": "weights 1", "ckpt-2.data": "weights 2", "checkpoint": "ckpt-2"},
    ]
