"""The agent's credential: kept 0600 in its work dir, presented on every call, never logged; refusals end the
agent with exit code 2; --ca-file makes a TLS channel that trusts only that CA."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import grpc
import pytest
from builders import connected

from server.tls import ensure_self_signed
from worker_agent.config import AgentConfig
from worker_agent.credentials import CREDENTIAL_FILE, CredentialStore

# What tests/worker_agent/conftest.py's fake coordinator issues (fixtures only there, so it is repeated here).
FAKE_CREDENTIAL = "mwmsa_agent-1.fake-secret-for-tests"


def test_the_credential_from_register_is_kept_0600_and_presented_after_a_restart(
    coordinator, start_agent, wait_for, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    fake, address = coordinator
    agent = start_agent(address, join_token="s3cret")
    stream = connected(fake, wait_for)
    assert stream.agent_id == "agent-1"  # the fake checks the Connect call carries the credential
    path = tmp_path / "agent" / CREDENTIAL_FILE
    assert path.read_text().strip() == FAKE_CREDENTIAL
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    _, first_metadata = fake.registrations[0]
    assert "authorization" not in dict(first_metadata)  # nothing to present before the first join
    assert agent.shut_down() == 0

    again = start_agent(address)  # no join token: the credential is enough
    connected(fake, wait_for, count=2)
    _, metadata = fake.registrations[1]
    assert dict(metadata)["authorization"] == f"Bearer {FAKE_CREDENTIAL}"
    assert path.read_text().strip() == FAKE_CREDENTIAL
    assert again.shut_down() == 0
    secret = FAKE_CREDENTIAL.split(".", 1)[1]
    assert secret not in caplog.text
    assert secret not in repr(again.config) and secret not in repr(CredentialStore(path.parent))


@pytest.mark.parametrize("code", [grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED])
def test_a_refused_credential_or_name_ends_the_agent_with_code_2(
    coordinator, start_agent, code: grpc.StatusCode, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    fake.refuse_with = code
    agent = start_agent(address)
    agent.thread.join(10)
    assert agent.exit_code == 2 and fake.streams == []
    assert "the coordinator refused this agent" in caplog.text


def test_a_credential_file_readable_by_others_is_restricted(tmp_path: Path) -> None:
    path = tmp_path / CREDENTIAL_FILE
    path.write_text(FAKE_CREDENTIAL + "\n")
    path.chmod(0o644)
    store = CredentialStore(tmp_path)
    assert store.load() and store.get() == FAKE_CREDENTIAL
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not CredentialStore(tmp_path / "empty").load()


def test_ca_file_makes_a_tls_channel_that_trusts_that_ca_only(
    serve_coordinator, start_agent, wait_for, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    made = ensure_self_signed(tmp_path / "tls", ["127.0.0.1"])
    pair = (made.server.key.read_bytes(), made.server.cert.read_bytes())
    fake, address = serve_coordinator(tls=pair)

    stranger_ca = ensure_self_signed(tmp_path / "other-tls", ["127.0.0.1"]).ca_cert
    doubtful = start_agent(address, ca_file=stranger_ca, work_dir=tmp_path / "doubtful")
    plain = start_agent(address, work_dir=tmp_path / "plain")
    doubtful.thread.join(2)
    assert fake.registrations == []  # neither the wrong CA nor clear text gets through
    doubtful.shut_down()
    plain.shut_down()

    trusting = start_agent(address, ca_file=made.ca_cert, work_dir=tmp_path / "trusting")
    assert connected(fake, wait_for).agent_id == "agent-1"
    assert trusting.shut_down() == 0
    assert "tls=True" in repr(AgentConfig(server=address, name="n", work_dir=tmp_path, ca_file=made.ca_cert))
