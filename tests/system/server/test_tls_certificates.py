"""mwms.server.tls on real files: the self-signed CA and server certificate, the checks on given certificates,
and real TLS handshakes (Python's ssl and gRPC) against what it makes."""

from __future__ import annotations

import datetime
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
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mwms.server import tls
from mwms.server.main import log_tls
from mwms.server.settings import Settings

MWMS = str(Path(sys.executable).parent / "mwms")


def settings_for(tmp_path: Path, **values: object) -> Settings:
    return Settings(data_dir=tmp_path / "data", **values)


def san_of(cert_path: Path) -> set[object]:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(names.get_values_for_type(x509.DNSName)) | set(names.get_values_for_type(x509.IPAddress))


def test_self_signed_makes_a_ca_and_a_server_certificate_naming_every_dialled_host(tmp_path):
    made = tls.ensure_self_signed(tmp_path / "tls", ["10.1.2.3", "coord.example", "0.0.0.0", "::"])

    assert made.made == ("CA", "browser CA", "server certificate")
    assert {p.name for p in (tmp_path / "tls").iterdir()} == {
        "ca.pem",
        "ca-key.pem",
        "browser-ca.pem",
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
    year = datetime.timedelta(days=365)
    assert ca.not_valid_after_utc - ca.not_valid_before_utc == year
    assert server.not_valid_after_utc - server.not_valid_before_utc <= year
    assert server.not_valid_after_utc <= ca.not_valid_after_utc


def constraints_of(cert_path: Path) -> x509.Extension[x509.NameConstraints]:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    return cert.extensions.get_extension_for_class(x509.NameConstraints)


def test_the_ca_is_name_constrained_to_the_servers_names_critically(tmp_path):
    made = tls.ensure_self_signed(tmp_path, ["10.1.2.3", "coord.example", "::"])
    hosts = {"localhost", socket.gethostname().lower(), "coord.example"}
    addresses = {
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("::1/128"),
        ipaddress.ip_network("10.1.2.3/32"),
    }
    for path, permitted_addresses in ((made.browser_ca_cert, addresses), (made.ca_cert, set())):
        constraints = constraints_of(path)
        assert constraints.critical, path
        assert constraints.value.excluded_subtrees is None
        permitted = constraints.value.permitted_subtrees or []
        assert {n.value for n in permitted if isinstance(n, x509.DNSName)} == hosts, path
        assert {n.value for n in permitted if isinstance(n, x509.IPAddress)} == permitted_addresses, path
        assert not [n for n in permitted if not isinstance(n, (x509.DNSName, x509.IPAddress))]
    # The server certificate names exactly what the browsers' CA permits.
    assert san_of(made.server.cert) == hosts | {a.network_address for a in addresses}
    assert set(made.permitted) == {str(name) for name in san_of(made.server.cert)}
    # One CA, two certificates of it: same name, key and validity, so both vouch for server.pem.
    ca = x509.load_pem_x509_certificate(made.ca_cert.read_bytes())
    browser = x509.load_pem_x509_certificate(made.browser_ca_cert.read_bytes())
    assert (browser.subject, browser.not_valid_before_utc, browser.not_valid_after_utc) == (
        ca.subject,
        ca.not_valid_before_utc,
        ca.not_valid_after_utc,
    )
    assert browser.public_key() == ca.public_key()
    server = x509.load_pem_x509_certificate(made.server.cert.read_bytes())
    server.verify_directly_issued_by(ca)
    server.verify_directly_issued_by(browser)
    assert made.browser_ca_fingerprint == tls.fingerprint(made.browser_ca_cert) != made.ca_fingerprint


def leaf_signed_by(made: tls.SelfSignedFiles, *names: x509.GeneralName) -> x509.Certificate:
    """A server certificate for `names`, signed with the CA's own key (what a stolen CA key could make)."""
    ca = x509.load_pem_x509_certificate(made.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(made.ca_key.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "somebody else")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,  # type: ignore[arg-type]
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )


def test_a_verifier_trusting_the_ca_accepts_the_servers_names_and_no_other_site(tmp_path):
    made = tls.ensure_self_signed(tmp_path, ["coord.example", "10.1.2.3"])
    server = x509.load_pem_x509_certificate(made.server.cert.read_bytes())
    ours = (
        x509.DNSName("coord.example"),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("10.1.2.3")),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    )
    other_host = (x509.DNSName("bank.example"), x509.DNSName("example"))
    other_address = (
        x509.IPAddress(ipaddress.ip_address("10.1.2.4")),
        x509.IPAddress(ipaddress.ip_address("2001:db8::1")),
    )
    for anchor, refused in ((made.browser_ca_cert, other_host + other_address), (made.ca_cert, other_host)):
        store = verification.Store([x509.load_pem_x509_certificate(anchor.read_bytes())])

        def verify(leaf: x509.Certificate, name: verification.Subject, store=store) -> None:
            verification.PolicyBuilder().store(store).build_server_verifier(name).verify(leaf, [])

        for name in ours:
            verify(server, name)
        for outside in refused:  # what a stolen CA key could sign for another site
            with pytest.raises(verification.VerificationError, match="constraint|violat"):
                verify(leaf_signed_by(made, outside), outside)


def openssl_verify(ca: Path, cert: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["openssl", "verify", "-x509_strict", "-CAfile", str(ca), str(cert)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError:
        pytest.skip("no openssl command here")


def test_openssl_refuses_what_the_ca_signed_for_another_site(tmp_path):
    made = tls.ensure_self_signed(tmp_path, [])
    for anchor in (made.ca_cert, made.browser_ca_cert):
        assert openssl_verify(anchor, made.server.cert).returncode == 0
    forged_host = tmp_path / "forged-host.pem"
    forged_host.write_bytes(
        leaf_signed_by(made, x509.DNSName("bank.example")).public_bytes(serialization.Encoding.PEM)
    )
    forged_address = tmp_path / "forged-address.pem"
    forged_address.write_bytes(
        leaf_signed_by(made, x509.IPAddress(ipaddress.ip_address("192.0.2.1"))).public_bytes(
            serialization.Encoding.PEM
        )
    )
    for anchor, forged in (
        (made.ca_cert, forged_host),
        (made.browser_ca_cert, forged_host),
        (made.browser_ca_cert, forged_address),
    ):
        result = openssl_verify(anchor, forged)
        assert result.returncode != 0 and "permitted subtree violation" in result.stdout + result.stderr, (
            anchor.name,
            forged.name,
            result,
        )


def test_self_signed_files_are_reused_and_the_server_certificate_follows_the_bound_hosts(tmp_path):
    first = tls.ensure_self_signed(tmp_path, ["127.0.0.1"])
    contents = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    again = tls.ensure_self_signed(tmp_path, ["127.0.0.1"])
    assert again.made == ()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == contents

    # A new address: agents keep their ca.pem (it constrains host names only); browsers need the new
    # browser-ca.pem, which permits it.
    moved = tls.ensure_self_signed(tmp_path, ["192.0.2.7"])
    assert moved.made == ("browser CA", "server certificate")
    assert moved.ca_cert.read_bytes() == contents["ca.pem"]
    assert moved.ca_fingerprint == first.ca_fingerprint
    assert ipaddress.ip_address("192.0.2.7") in san_of(moved.server.cert)
    assert "192.0.2.7" in moved.permitted and moved.browser_ca_fingerprint != first.browser_ca_fingerprint

    # A new host name is outside every constraint of the CA: a new CA (with a warning).
    renamed = tls.ensure_self_signed(tmp_path, ["coord.example"])
    assert renamed.made == ("CA", "browser CA", "server certificate")
    assert renamed.ca_fingerprint != first.ca_fingerprint
    assert "coord.example" in san_of(renamed.server.cert)


def test_a_server_certificate_near_its_end_is_renewed(tmp_path, monkeypatch):
    monkeypatch.setattr(tls, "SERVER_VALIDITY", tls.RENEW_BEFORE / 2)
    tls.ensure_self_signed(tmp_path, [])
    monkeypatch.undo()

    renewed = tls.ensure_self_signed(tmp_path, [])
    assert renewed.made == ("server certificate",)
    cert = x509.load_pem_x509_certificate(renewed.server.cert.read_bytes())
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days >= 360


def write_ca(
    tls_dir: Path, days: int, constraints: x509.NameConstraints | None, critical: bool = True
) -> None:
    """A CA as an older mwms (or another tool) left it in the tls dir."""
    tls_dir.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "an older mwms CA")])
    start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
    )
    if constraints is not None:
        builder = builder.add_extension(constraints, critical=critical)
    cert = builder.sign(key, hashes.SHA256())
    (tls_dir / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tls_dir / "ca-key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def own_constraints(addresses: bool = False) -> x509.NameConstraints:
    return tls._name_constraints(tls.subject_names([]), addresses=addresses)


@pytest.mark.parametrize(
    ("days", "constraints", "critical", "why"),
    [
        (3650, None, True, "has no name constraints (an older mwms made it)"),
        (365, "own", False, "not marked critical"),
        (3650, "own", True, "is valid for more than a year"),
        (20, "own", True, "ends on"),
        (365, "narrow", True, "does not permit"),
        (365, "addresses", True, "constrains IP addresses, which agents' TLS (BoringSSL, in gRPC) refuses"),
    ],
)
def test_a_stored_ca_that_is_unfit_is_replaced_with_a_warning(
    tmp_path, caplog, days, constraints, critical, why
):
    given = {
        None: None,
        "own": own_constraints(),
        "narrow": x509.NameConstraints([x509.DNSName("localhost")], None),
        "addresses": own_constraints(addresses=True),
    }[constraints]
    write_ca(tmp_path, days, given, critical)
    old = (tmp_path / "ca.pem").read_bytes()
    with caplog.at_level(logging.WARNING):
        made = tls.ensure_self_signed(tmp_path, [])
    assert made.made == ("CA", "browser CA", "server certificate")
    assert (tmp_path / "ca.pem").read_bytes() != old
    assert why in caplog.text and "give agents and CLIs the new ca.pem" in caplog.text
    ca = x509.load_pem_x509_certificate(made.ca_cert.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.NameConstraints).critical
    assert tls.ensure_self_signed(tmp_path, []).made == ()  # the new one is kept from then on


def test_a_fit_stored_ca_is_kept(tmp_path):
    write_ca(tmp_path, 365, own_constraints())
    old = (tmp_path / "ca.pem").read_bytes()
    assert tls.ensure_self_signed(tmp_path, []).made == ("browser CA", "server certificate")
    assert (tmp_path / "ca.pem").read_bytes() == old


def test_a_ca_near_its_end_is_renewed_with_its_server_certificate(tmp_path, monkeypatch):
    monkeypatch.setattr(tls, "CA_VALIDITY", tls.RENEW_BEFORE / 2)
    first = tls.ensure_self_signed(tmp_path, [])
    server = x509.load_pem_x509_certificate(first.server.cert.read_bytes())
    ca = x509.load_pem_x509_certificate(first.ca_cert.read_bytes())
    assert server.not_valid_after_utc == ca.not_valid_after_utc  # capped: it never outlives its CA
    monkeypatch.undo()

    renewed = tls.ensure_self_signed(tmp_path, [])
    assert renewed.made == ("CA", "browser CA", "server certificate")
    ca = x509.load_pem_x509_certificate(renewed.ca_cert.read_bytes())
    assert ca.not_valid_after_utc - ca.not_valid_before_utc == datetime.timedelta(days=365)


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
    browser_ca = ca_path.with_name("browser-ca.pem")
    browser_fingerprint = tls.fingerprint(browser_ca)
    assert (
        f"browsers: trust {browser_ca} (SHA-256 {browser_fingerprint}) for mwms only: its name constraints "
        "limit it to " in text
    )
    limited_to = text.split("limit it to ", 1)[1].splitlines()[0]
    assert {"127.0.0.1", "::1", "localhost", socket.gethostname().lower()} == set(limited_to.split(", "))
    assert f"mwms agent --server 127.0.0.1:50999 --ca-file {ca_path}" in text
    assert f"MWMS_CA_FILE={ca_path}" in text


@pytest.mark.parametrize("anchor", ["ca.pem", "browser-ca.pem"])
def test_python_ssl_verifies_the_self_signed_server_with_strict_checks(tmp_path, anchor):
    made = tls.ensure_self_signed(tmp_path, [])
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(made.server.cert, made.server.key)
    client_context = ssl.create_default_context(cafile=str(tmp_path / anchor))
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
