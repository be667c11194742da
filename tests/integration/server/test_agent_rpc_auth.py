"""Agent credentials and per-RPC authorization on a real coordinator: the app's own gRPC server on loopback,
its SQLite database and REST API. Every refused call is followed by a look at what it must not have changed.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import func, select

from mwms.server.db.models import Agent, Job, LogLine, StoredFile, Task
from mwms.server.rpc.auth import INTERNAL_MESSAGE
from mwms.server.services.auth.tokens import Role, create_api_token, hash_secret
from mwms.server.services.storage import files
from mwms.v1 import agent_pb2 as pb
from mwms.v1 import agent_pb2_grpc
from mwms_testkit.coordinator_rows import place_task, register_request
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings

JOIN_TOKEN = "join-token-for-agent-auth-tests-0123456789"
ADMIN_TOKEN = "mwms_admin-token-for-agent-auth-tests-0123"
LEAKS = ("Traceback", "<class", "Unexpected", "Error:", "sqlite", "SELECT", "Errno")


def auth(credential: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {credential}"),)


def tar_gz(files_: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files_.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@dataclass
class Placed:
    job_id: str
    task_id: str
    digest: str


@dataclass
class Coordinator(InProcessCoordinator):
    def register(self, name: str, credential: str = "", join_token: str = JOIN_TOKEN) -> pb.RegisterResponse:
        request = register_request(name, join_token, hostname=f"host-of-{name}")
        return self.stub.Register(request, metadata=auth(credential) if credential else None, timeout=10)

    def place(self, agent_id: str, state: str = "RUNNING") -> Placed:
        """A running job with one task on `agent_id`, its bundle stored (rows made directly)."""
        data = tar_gz({"train.py": f"print({agent_id!r})".encode()})
        digest = hashlib.sha256(data).hexdigest()
        self.settings.bundle_dir.mkdir(parents=True, exist_ok=True)
        (self.settings.bundle_dir / digest).write_bytes(data)
        task = place_task(self.db, agent_id, digest=digest, bundle_size=len(data), state=state)
        return Placed(task.job_id, task.id, digest)

    def store_checkpoint(self, job_id: str, data: bytes) -> None:
        path = files.checkpoint_archive(self.settings.files_dir, job_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def task(self, task_id: str) -> Task:
        with self.db.read() as session:
            task = session.get(Task, task_id)
            assert task is not None
            return task

    def job_state(self, job_id: str) -> str:
        with self.db.read() as session:
            job = session.get(Job, job_id)
            assert job is not None
            return job.state

    def stored_files(self, job_id: str) -> list[tuple[str, str, int]]:
        with self.db.read() as session:
            rows = session.scalars(select(StoredFile).where(StoredFile.job_id == job_id)).all()
            return sorted((r.kind, r.path, r.attempt) for r in rows)

    def sql(self, statement: str) -> None:
        with self.db.engine.begin() as connection:
            connection.exec_driver_sql(statement)


@pytest.fixture
def start_coordinator(tmp_path: Path) -> Iterator[Callable[..., Coordinator]]:
    """Starts coordinators (REST in-process, gRPC on a free loopback port); all stop at teardown."""
    with ExitStack() as stack:
        started: list[Coordinator] = []

        def start(join_token: str = JOIN_TOKEN) -> Coordinator:
            settings = coordinator_settings(
                tmp_path / f"coordinator-{len(started)}",
                join_token=join_token,
                admin_token=ADMIN_TOKEN,
                agent_timeout_s=300,
            )
            started.append(Coordinator.start(stack, settings, admin_token=ADMIN_TOKEN))
            return started[-1]

        yield start


@pytest.fixture
def coordinator(start_coordinator: Callable[..., Coordinator]) -> Coordinator:
    return start_coordinator()


def refusal(call: Callable[[], Any]) -> grpc.RpcError:
    """The error `call` fails with (streams are read to the end); checks it gives nothing away."""
    with pytest.raises(grpc.RpcError) as caught:
        result = call()
        if hasattr(result, "__iter__"):
            list(result)
    error = caught.value
    assert isinstance(error, grpc.Call)
    details = error.details() or ""
    assert not any(leak in details for leak in LEAKS), details
    return error


def upload(stub: agent_pb2_grpc.AgentServiceStub, credential: str, chunks: list[pb.FileChunk]) -> Any:
    return stub.UploadFiles(iter(chunks), metadata=auth(credential) if credential else None, timeout=10)


# --- credentials -----------------------------------------------------------------------------------


def test_register_issues_a_credential_that_is_stored_only_as_a_hash(coordinator: Coordinator) -> None:
    response = coordinator.register("alpha")
    assert response.credential.startswith(f"mwmsa_{response.agent_id}.")
    secret = response.credential.split(".", 1)[1]
    assert len(secret) >= 43  # 32 random bytes, url-safe base64
    with coordinator.db.read() as session:
        agent = session.get(Agent, response.agent_id)
        assert agent is not None and agent.credential_hash == hash_secret(secret)
    database = coordinator.settings.data_dir / "mwms.db"
    stored = b"".join(p.read_bytes() for p in database.parent.glob("mwms.db*"))
    assert secret.encode() not in stored


def test_every_rpc_but_register_needs_a_valid_credential(coordinator: Coordinator) -> None:
    alpha = coordinator.register("alpha")
    placed = coordinator.place(alpha.agent_id)
    coordinator.store_checkpoint(placed.job_id, b"checkpoint v1")
    stub = coordinator.stub
    forged = f"mwmsa_{alpha.agent_id}.{'x' * 43}"
    wrong_secret_of_a_real_agent = alpha.credential[:-4] + "AAAA"
    for credential in ("", forged, wrong_secret_of_a_real_agent, "not-a-credential", alpha.agent_id):
        metadata = auth(credential) if credential else (("agent-id", alpha.agent_id),)  # the old protocol
        calls: dict[str, Callable[[], Any]] = {
            "Connect": lambda m=metadata: stub.Connect(iter([pb.AgentMessage(hello=pb.Hello())]), metadata=m),
            "FetchBundle": lambda m=metadata: stub.FetchBundle(
                pb.FetchBundleRequest(digest=placed.digest), metadata=m
            ),
            "FetchCheckpoint": lambda m=metadata: stub.FetchCheckpoint(
                pb.FetchCheckpointRequest(job_id=placed.job_id), metadata=m
            ),
            "UploadFiles": lambda m=metadata: stub.UploadFiles(
                iter([pb.FileChunk(task_id=placed.task_id, kind=pb.FILE_KIND_CHECKPOINT, data=b"evil")]),
                metadata=m,
            ),
        }
        for name, call in calls.items():
            error = refusal(call)
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED, (name, credential, error.details())
    assert (
        files.checkpoint_archive(coordinator.settings.files_dir, placed.job_id).read_bytes()
        == b"checkpoint v1"
    )
    assert coordinator.stored_files(placed.job_id) == []
    assert coordinator.task(placed.task_id).state == "RUNNING"


def test_an_agent_gets_the_bundle_and_checkpoint_of_its_own_live_task_only(coordinator: Coordinator) -> None:
    alpha, beta = coordinator.register("alpha"), coordinator.register("beta")
    mine, theirs = coordinator.place(alpha.agent_id), coordinator.place(beta.agent_id)
    coordinator.store_checkpoint(mine.job_id, b"mine")
    coordinator.store_checkpoint(theirs.job_id, b"theirs")
    stub, metadata = coordinator.stub, auth(alpha.credential)

    bundle = b"".join(
        c.data for c in stub.FetchBundle(pb.FetchBundleRequest(digest=mine.digest), metadata=metadata)
    )
    assert hashlib.sha256(bundle).hexdigest() == mine.digest
    checkpoint = stub.FetchCheckpoint(pb.FetchCheckpointRequest(job_id=mine.job_id), metadata=metadata)
    assert b"".join(c.data for c in checkpoint) == b"mine"

    error = refusal(lambda: stub.FetchBundle(pb.FetchBundleRequest(digest=theirs.digest), metadata=metadata))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "placed on it" in error.details()
    error = refusal(
        lambda: stub.FetchCheckpoint(pb.FetchCheckpointRequest(job_id=theirs.job_id), metadata=metadata)
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    # A digest that was never stored is refused the same way: no way to probe what exists.
    error = refusal(lambda: stub.FetchBundle(pb.FetchBundleRequest(digest="0" * 64), metadata=metadata))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED

    with coordinator.db.write() as session:  # once the task ended, its bundle is no longer the agent's
        task = session.get(Task, mine.task_id)
        assert task is not None
        task.state = "SUCCEEDED"
    error = refusal(lambda: stub.FetchBundle(pb.FetchBundleRequest(digest=mine.digest), metadata=metadata))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize(
    "job_id", ["../../etc", "/etc/passwd", "..", "ABCDEF012345", "0123456789ab/..", "0123456789a", ""]
)
def test_a_job_id_that_is_not_an_id_is_invalid(coordinator: Coordinator, job_id: str) -> None:
    alpha = coordinator.register("alpha")
    error = refusal(
        lambda: coordinator.stub.FetchCheckpoint(
            pb.FetchCheckpointRequest(job_id=job_id), metadata=auth(alpha.credential)
        )
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "12 lowercase hex" in error.details()


@pytest.mark.parametrize(
    "digest", ["../../../etc/passwd", "/etc/passwd", "a" * 63, "A" * 64, "../" + "a" * 61]
)
def test_a_digest_that_is_not_a_sha256_is_invalid(coordinator: Coordinator, digest: str) -> None:
    alpha = coordinator.register("alpha")
    error = refusal(
        lambda: coordinator.stub.FetchBundle(
            pb.FetchBundleRequest(digest=digest), metadata=auth(alpha.credential)
        )
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_uploads_are_accepted_for_the_agents_own_tasks_only(coordinator: Coordinator) -> None:
    alpha, beta = coordinator.register("alpha"), coordinator.register("beta")
    mine, theirs = coordinator.place(alpha.agent_id), coordinator.place(beta.agent_id)
    coordinator.store_checkpoint(theirs.job_id, b"theirs v1")
    archive = tar_gz({"model.txt": b"weights"})

    for kind in (pb.FILE_KIND_ARTIFACTS, pb.FILE_KIND_CHECKPOINT):
        error = refusal(
            lambda k=kind: upload(
                coordinator.stub,
                alpha.credential,
                [pb.FileChunk(task_id=theirs.task_id, kind=k, data=archive)],
            )
        )
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "another agent" in error.details()
    # A stream that starts with the agent's own task and switches to another's is refused as a whole.
    smuggled = [
        pb.FileChunk(task_id=mine.task_id, kind=pb.FILE_KIND_CHECKPOINT, data=archive[:10]),
        pb.FileChunk(task_id=theirs.task_id, kind=pb.FILE_KIND_CHECKPOINT, data=archive[10:]),
    ]
    error = refusal(lambda: upload(coordinator.stub, alpha.credential, smuggled))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    for bad_id in ("../" + theirs.task_id, "/etc/passwd"):
        chunk = pb.FileChunk(task_id=bad_id, kind=pb.FILE_KIND_ARTIFACTS, data=archive)
        error = refusal(lambda c=chunk: upload(coordinator.stub, alpha.credential, [c]))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT

    assert (
        files.checkpoint_archive(coordinator.settings.files_dir, theirs.job_id).read_bytes() == b"theirs v1"
    )
    assert not files.checkpoint_archive(coordinator.settings.files_dir, mine.job_id).exists()
    assert coordinator.stored_files(theirs.job_id) == [] and coordinator.stored_files(mine.job_id) == []
    assert not (coordinator.settings.files_dir / theirs.job_id / "artifacts").exists()
    assert not list(coordinator.settings.files_dir.glob("*.upload"))  # spooled data removed

    # Artifacts come after the task ended: ownership, not liveness, is the rule.
    with coordinator.db.write() as session:
        task = session.get(Task, mine.task_id)
        assert task is not None
        task.state = "SUCCEEDED"
    response = upload(
        coordinator.stub,
        alpha.credential,
        [pb.FileChunk(task_id=mine.task_id, kind=pb.FILE_KIND_ARTIFACTS, data=archive)],
    )
    assert response.size == len(archive)
    assert coordinator.stored_files(mine.job_id) == [("artifact", "model.txt", 1)]


def test_a_stream_belongs_to_the_credentials_agent_not_to_the_one_it_names(coordinator: Coordinator) -> None:
    alpha, beta = coordinator.register("alpha"), coordinator.register("beta")
    theirs = coordinator.place(beta.agent_id)
    forged_report = pb.TaskReport(
        task_id=theirs.task_id, state=pb.TASK_STATE_FAILED, exit_code=1, message="x"
    )
    done = threading.Event()

    def messages() -> Iterator[pb.AgentMessage]:
        yield pb.AgentMessage(hello=pb.Hello(agent_id=beta.agent_id, tasks=[forged_report]))
        yield pb.AgentMessage(task=forged_report)
        line = pb.LogLine(seq=1, stream="stdout", text="forged line", unix_ms=1)
        yield pb.AgentMessage(logs=pb.LogBatch(task_id=theirs.task_id, lines=[line]))
        done.wait(10)

    metadata = (*auth(alpha.credential), ("agent-id", beta.agent_id))
    call = coordinator.stub.Connect(messages(), metadata=metadata)
    for message in call:
        if message.WhichOneof("body") == "ack" and message.ack.log_seq == 1:
            break  # every forged message was handled
    done.set()
    call.cancel()

    assert coordinator.task(theirs.task_id).state == "RUNNING"
    assert coordinator.job_state(theirs.job_id) == "RUNNING"
    with coordinator.db.read() as session:
        assert session.scalar(select(func.count()).select_from(LogLine)) == 0


# --- registration ------------------------------------------------------------------------------------


def test_a_registered_name_cannot_be_taken_over_even_with_a_join_token(coordinator: Coordinator) -> None:
    alpha, beta = coordinator.register("alpha"), coordinator.register("beta")
    for credential in ("", beta.credential):
        error = refusal(lambda c=credential: coordinator.register("alpha", credential=c))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "credential from its work dir" in error.details() and "remove" in error.details()
    with coordinator.db.read() as session:
        agent = session.get(Agent, alpha.agent_id)
        assert agent is not None and agent.hostname == "host-of-alpha"

    again = coordinator.register("alpha", credential=alpha.credential, join_token="")
    assert (again.agent_id, again.credential) == (alpha.agent_id, "")  # no join token needed, credential kept
    listing = coordinator.stub.FetchCheckpoint(
        pb.FetchCheckpointRequest(job_id=coordinator.place(alpha.agent_id).job_id),
        metadata=auth(alpha.credential),
    )
    assert list(listing) == []


def test_new_names_need_a_valid_join_token(coordinator: Coordinator) -> None:
    for token in ("", "wrong"):
        error = refusal(lambda t=token: coordinator.register("gamma", join_token=t))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "--join-token" in error.details()
    with coordinator.db.read() as session:
        assert session.scalar(select(func.count()).select_from(Agent)) == 0


def test_without_any_join_token_new_agents_are_told_how_to_make_one(
    start_coordinator: Callable[..., Coordinator],
) -> None:
    coordinator = start_coordinator(join_token="")
    error = refusal(lambda: coordinator.register("gamma", join_token="anything"))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "mwms agent-token create" in error.details() and "--join-token" in error.details()

    made = coordinator.http.post("/api/v1/agent-tokens", json={"name": "rack 1"})
    assert made.status_code == 201, made.text
    assert coordinator.register("gamma", join_token=made.json()["token"]).credential


# --- removal -----------------------------------------------------------------------------------------


def test_removing_an_agent_revokes_it_ends_its_stream_and_its_tasks(coordinator: Coordinator) -> None:
    alpha = coordinator.register("alpha")
    placed = coordinator.place(alpha.agent_id)
    hello = pb.AgentMessage(
        hello=pb.Hello(tasks=[pb.TaskReport(task_id=placed.task_id, state=pb.TASK_STATE_RUNNING)])
    )
    stop_sending = threading.Event()

    def messages() -> Iterator[pb.AgentMessage]:
        yield hello
        stop_sending.wait(30)

    call = coordinator.stub.Connect(messages(), metadata=auth(alpha.credential))
    ended: list[grpc.RpcError] = []

    def read() -> None:
        try:
            for _ in call:
                pass
        except grpc.RpcError as error:
            ended.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    viewer = _token(coordinator, Role.USER)
    response = coordinator.http.delete(
        f"/api/v1/agents/{alpha.agent_id}", headers={"Authorization": f"Bearer {viewer}"}
    )
    assert response.status_code == 403
    assert coordinator.http.delete("/api/v1/agents/nosuchagent1").status_code == 404

    response = coordinator.http.delete(f"/api/v1/agents/{alpha.agent_id}")
    assert response.status_code == 200, response.text
    assert (response.json()["id"], response.json()["name"], response.json()["online"]) == (
        alpha.agent_id,
        "alpha",
        False,
    )
    reader.join(10)
    stop_sending.set()
    assert ended and ended[0].code() == grpc.StatusCode.UNAUTHENTICATED, ended
    assert "removed by an admin" in ended[0].details()

    task = coordinator.task(placed.task_id)
    assert (task.state, task.message) == ("LOST", "lost (its agent was removed by an admin)")
    assert coordinator.job_state(placed.job_id) != "RUNNING"
    assert all(a["id"] != alpha.agent_id for a in coordinator.http.get("/api/v1/agents").json())

    # The old credential is void everywhere, Register included (the agent must not rejoin by itself).
    error = refusal(
        lambda: coordinator.stub.FetchBundle(
            pb.FetchBundleRequest(digest=placed.digest), metadata=auth(alpha.credential)
        )
    )
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    error = refusal(lambda: coordinator.register("alpha", credential=alpha.credential))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "agent-credential" in error.details()

    # The name joins again with a join token alone, under a new credential.
    rejoined = coordinator.register("alpha")
    assert rejoined.agent_id == alpha.agent_id and rejoined.credential not in ("", alpha.credential)
    assert any(a["id"] == alpha.agent_id for a in coordinator.http.get("/api/v1/agents").json())
    fresh = coordinator.place(alpha.agent_id)
    assert (
        list(
            coordinator.stub.FetchCheckpoint(
                pb.FetchCheckpointRequest(job_id=fresh.job_id), metadata=auth(rejoined.credential)
            )
        )
        == []
    )
    error = refusal(lambda: coordinator.register("alpha", credential=alpha.credential))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


def _token(coordinator: Coordinator, role: Role) -> str:
    with coordinator.db.write() as session:
        _, secret = create_api_token(session, "bob", role)
        return secret


# --- errors ------------------------------------------------------------------------------------------


def test_unexpected_failures_become_internal_without_details(
    coordinator: Coordinator, caplog: pytest.LogCaptureFixture
) -> None:
    alpha = coordinator.register("alpha")
    placed = coordinator.place(alpha.agent_id)
    metadata = auth(alpha.credential)
    # Real faults, one per kind of handler: a directory where the bundle file should be (server stream),
    # tables gone from under the services (unary, client stream, bidirectional stream).
    bundle = coordinator.settings.bundle_dir / placed.digest
    bundle.unlink()
    bundle.mkdir()
    coordinator.sql("ALTER TABLE tokens RENAME TO tokens_gone")
    coordinator.sql("ALTER TABLE stored_files RENAME TO stored_files_gone")
    coordinator.sql("ALTER TABLE log_lines RENAME TO log_lines_gone")

    def connect_and_log() -> Any:
        line = pb.LogLine(seq=1, stream="stdout", text="x", unix_ms=1)
        messages = [
            pb.AgentMessage(
                hello=pb.Hello(tasks=[pb.TaskReport(task_id=placed.task_id, state=pb.TASK_STATE_RUNNING)])
            ),
            pb.AgentMessage(logs=pb.LogBatch(task_id=placed.task_id, lines=[line])),
        ]
        return coordinator.stub.Connect(iter(messages), metadata=metadata, timeout=10)

    calls: dict[str, Callable[[], Any]] = {
        "FetchBundle": lambda: coordinator.stub.FetchBundle(
            pb.FetchBundleRequest(digest=placed.digest), metadata=metadata
        ),
        "Register": lambda: coordinator.register("gamma", join_token="not-the-bootstrap-one"),
        "UploadFiles": lambda: upload(
            coordinator.stub,
            alpha.credential,
            [pb.FileChunk(task_id=placed.task_id, kind=pb.FILE_KIND_ARTIFACTS, data=tar_gz({"a": b"1"}))],
        ),
        "Connect": connect_and_log,
    }
    for name, call in calls.items():
        error = refusal(call)
        assert (error.code(), error.details()) == (grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE), name
    # ...while the coordinator's own log has what an operator needs.
    assert "IsADirectoryError" in caplog.text and "OperationalError" in caplog.text
