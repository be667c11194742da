"""server.tls on real files: the self-signed CA and server certificate, the checks on given certificates,
and real TLS handshakes (Python's ssl and gRPC) against what it makes."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import ssl
import subprocess
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from server import tls
from server.main import log_tls
from server.settings import Settings

MWMS = str(Path(sys.executable).parent / "mwms")


def settings_for(tmp_path: Path, **values: object) -> Settings:
    return Settings(data_dir=tmp_path / "data", **values)


def san_of(cert_path: Path) -> set[object]:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(names.get_values_for_type(x509.DNSName)) | set(names.get_values_for_type(x509.IPAddress))


def test_self_signed_makes_a_ca_and_a_server_certificate_naming_every_dialled_host(tmp_path):
    made = tls.ensure_self_signed(tmp_path / "tls", ["10.1.2.3", "coord.example", "0.0.0.0", "::"])

    assert made.made == ("CA", "server certificate")
    assert {p.name for p in (tmp_path / "tls").iterdir()} == {
        "ca.pem",
        "ca-key.pem",
        "server.pem",
        "server-key.pem",
    }
    assert (made.ca_key.stat().st_mode & 0o777) == 0o600
    assert (made.server.key.stat().st_mode & 0o777) == 0o600
    assert san_of(made.server.cert) == {
        "localhost",
        socket.gethostname().lower(),
        "coord.example",
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
        ipaddress.ip_address("10.1.2.3"),
    }
    ca = x509.load_pem_x509_certificate(made.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(made.server.cert.read_bytes())
    server.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert isinstance(server.public_key(), ec.EllipticCurvePublicKey)
    assert 3640 <= (ca.not_valid_after_utc - ca.not_valid_before_utc).days <= 3660
    assert 360 <= (server.not_valid_after_utc - server.not_valid_before_utc).days <= 370


def test_self_signed_files_are_reused_and_the_server_certificate_follows_the_bound_hosts(tmp_path):
    first = tls.ensure_self_signed(tmp_path, ["127.0.0.1"])
    contents = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    again = tls.ensure_self_signed(tmp_path, ["127.0.0.1"])
    assert again.made == ()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == contents

    moved = tls.ensure_self_signed(tmp_path, ["192.0.2.7"])
    assert moved.made == ("server certificate",)  # the CA agents trust stays
    assert moved.ca_cert.read_bytes() == contents["ca.pem"]
    assert moved.ca_fingerprint == first.ca_fingerprint
    assert ipaddress.ip_address("192.0.2.7") in san_of(moved.server.cert)


def test_a_server_certificate_near_its_end_is_renewed(tmp_path, monkeypatch):
    monkeypatch.setattr(tls, "SERVER_VALIDITY", tls.RENEW_BEFORE / 2)
    tls.ensure_self_signed(tmp_path, [])
    monkeypatch.undo()

    renewed = tls.ensure_self_signed(tmp_path, [])
    assert renewed.made == ("server certificate",)
    cert = x509.load_pem_x509_certificate(renewed.server.cert.read_bytes())
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days >= 360


def test_an_incomplete_ca_is_an_error_not_a_silent_new_ca(tmp_path):
    made = tls.ensure_self_signed(tmp_path, [])
    made.ca_key.unlink()
    with pytest.raises(tls.TlsError, match="ca-key.pem is missing; remove"):
        tls.ensure_self_signed(tmp_path, [])


def test_the_logged_fingerprint_is_the_ca_files_sha256(tmp_path, caplog):
    settings = settings_for(tmp_path, tls_self_signed=True, grpc_port=50999)
    with caplog.at_level(logging.INFO):
        log_tls(settings, tls.plan_tls(settings))

    ca_path = (tmp_path / "data" / "tls" / "ca.pem").resolve()
    ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    expected = ca.fingerprint(hashes.SHA256()).hex(":").upper()
    text = caplog.text
    assert f"CA SHA-256 fingerprint: {expected}" in text
    assert f"mwms agent --server 127.0.0.1:50999 --ca-file {ca_path}" in text
    assert f"MWMS_CA_FILE={ca_path}" in text


def test_python_ssl_verifies_the_self_signed_server_with_strict_checks(tmp_path):
    made = tls.ensure_self_signed(tmp_path, [])
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(made.server.cert, made.server.key)
    client_context = ssl.create_default_context(cafile=str(made.ca_cert))
    # What Python 3.13 turns on by default: RFC 5280 checks (key identifiers, critical basic constraints).
    client_context.verify_flags |= ssl.VERIFY_X509_STRICT

    hosts = ("localhost", "127.0.0.1", "::1")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        errors: list[BaseException] = []

        def serve_each_host() -> None:
            for _ in hosts:
                connection, _address = listener.accept()
                try:
                    with server_context.wrap_socket(connection, server_side=True) as wrapped:
                        wrapped.sendall(b"ok")
                except (ssl.SSLError, OSError) as error:
                    errors.append(error)

        thread = threading.Thread(target=serve_each_host, daemon=True)
        thread.start()
        for host in hosts:  # the name the client checks the certificate against
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                with client_context.wrap_socket(raw, server_hostname=host) as client:
                    assert client.recv(2) == b"ok"
        thread.join(5)
        assert not errors


def grpc_server_on_free_port(settings_values: dict[str, object], tmp_path: Path) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = tls.bind_grpc_port(server, settings_for(tmp_path, grpc_port=0, **settings_values))
    assert port > 0
    server.start()
    return server, port


def channel_ready(channel: grpc.Channel, timeout: float = 3) -> bool:
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def test_grpc_serves_tls_that_only_clients_trusting_the_ca_complete(tmp_path):
    server, port = grpc_server_on_free_port({"tls_self_signed": True}, tmp_path)
    try:
        ca = (tmp_path / "data" / "tls" / "ca.pem").read_bytes()
        address = f"127.0.0.1:{port}"
        trusted = grpc.ssl_channel_credentials(root_certificates=ca)
        assert channel_ready(grpc.secure_channel(address, trusted))
        assert channel_ready(grpc.secure_channel(f"localhost:{port}", trusted))
        # The system's roots do not include our CA; a clear-text client does not speak TLS.
        assert not channel_ready(grpc.secure_channel(address, grpc.ssl_channel_credentials()))
        assert not channel_ready(grpc.insecure_channel(address))
    finally:
        server.stop(None)


def test_grpc_tls_flags_override_the_rest_certificate(tmp_path):
    rest = tls.ensure_self_signed(tmp_path / "rest", [])
    agents = tls.ensure_self_signed(tmp_path / "agents", [])
    plan = tls.plan_tls(
        settings_for(
            tmp_path,
            tls_cert=rest.server.cert,
            tls_key=rest.server.key,
            grpc_tls_cert=agents.server.cert,
            grpc_tls_key=agents.server.key,
        )
    )
    assert plan.http == rest.server and plan.grpc == agents.server

    server, port = grpc_server_on_free_port(
        {"grpc_tls_cert": agents.server.cert, "grpc_tls_key": agents.server.key}, tmp_path
    )
    try:
        address = f"127.0.0.1:{port}"
        assert channel_ready(
            grpc.secure_channel(address, grpc.ssl_channel_credentials(agents.ca_cert.read_bytes()))
        )
        assert not channel_ready(
            grpc.secure_channel(address, grpc.ssl_channel_credentials(rest.ca_cert.read_bytes()))
        )
    finally:
        server.stop(None)


@pytest.fixture
def two_pairs(tmp_path: Path) -> tuple[tls.CertificatePair, tls.CertificatePair]:
    return (
        tls.ensure_self_signed(tmp_path / "a", []).server,
        tls.ensure_self_signed(tmp_path / "b", []).server,
    )


def test_a_key_of_another_certificate_is_refused(tmp_path, two_pairs):
    a, b = two_pairs
    with pytest.raises(
        tls.TlsError, match=r"--tls-key .* is not the private key of the certificate in --tls-cert"
    ):
        tls.plan_tls(settings_for(tmp_path, tls_cert=a.cert, tls_key=b.key))
    with pytest.raises(tls.TlsError, match=r"--grpc-tls-key .* is not the private key"):
        tls.plan_tls(settings_for(tmp_path, grpc_tls_cert=a.cert, grpc_tls_key=b.key))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tls_cert": "CERT"}, "--tls-cert needs --tls-key as well"),
        ({"tls_key": "KEY"}, "--tls-key needs --tls-cert as well"),
        ({"grpc_tls_cert": "CERT"}, "--grpc-tls-cert needs --grpc-tls-key as well"),
        ({"tls_cert": "CERT", "tls_key": "KEY", "tls_self_signed": True}, "not both"),
        ({"tls_cert": "MISSING", "tls_key": "KEY"}, "--tls-cert .*MISSING: no such file"),
        ({"tls_cert": "DIR", "tls_key": "KEY"}, "--tls-cert .* is a directory"),
        ({"tls_cert": "KEY", "tls_key": "KEY"}, "holds no PEM certificate"),
        ({"tls_cert": "CERT", "tls_key": "CERT"}, "--tls-key .* holds no PEM private key"),
        ({"tls_cert": "CERT", "tls_key": "ENCRYPTED"}, "--tls-key .* is encrypted"),
    ],
)
def test_unusable_tls_settings_say_what_to_fix(tmp_path, two_pairs, values, message):
    pair = two_pairs[0]
    key = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    files = {
        "CERT": pair.cert,
        "KEY": pair.key,
        "MISSING": tmp_path / "MISSING",
        "DIR": tmp_path,
        "ENCRYPTED": encrypted,
    }
    given = {name: files[value] if isinstance(value, str) else value for name, value in values.items()}
    with pytest.raises(tls.TlsError, match=message):
        tls.plan_tls(settings_for(tmp_path, **given))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_key_is_reported(tmp_path, two_pairs):
    pair = two_pairs[0]
    pair.key.chmod(0)
    with pytest.raises(tls.TlsError, match="cannot be read by this user"):
        tls.plan_tls(settings_for(tmp_path, tls_cert=pair.cert, tls_key=pair.key))


def test_clear_text_off_loopback_logs_a_warning_naming_the_fix(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        log_tls(settings_for(tmp_path), tls.plan_tls(settings_for(tmp_path)))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

    settings = settings_for(tmp_path, http_host="0.0.0.0")
    with caplog.at_level(logging.INFO):
        log_tls(settings, tls.plan_tls(settings))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "WITHOUT TLS on 0.0.0.0" in warnings[0]
    assert "--tls-cert/--tls-key" in warnings[0] and "--tls-self-signed" in warnings[0]


def test_mwms_server_exits_with_one_line_for_a_bad_tls_flag(tmp_path, two_pairs):
    result = subprocess.run(
        [MWMS, "server", "--data-dir", str(tmp_path / "data"), "--tls-cert", str(two_pairs[0].cert)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result
    assert (
        result.stderr.strip()
        == "error: --tls-cert needs --tls-key as well: TLS takes a certificate and its private key"
    )
    assert not (tmp_path / "data").exists()
