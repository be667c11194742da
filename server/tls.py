"""TLS for the coordinator: which certificate REST and gRPC serve, the self-signed CA kept in <data dir>/tls,
and the checks that turn a missing, unreadable or mismatched file into one message that says what to fix.

`plan_tls` is the one place that reads the TLS settings; `mwms.server.main` hands its REST pair to uvicorn and
`bind_grpc_port` (called in the app's lifespan) gives the gRPC pair to grpc.aio.

This module decides what is served and when the self-signed CA and server certificate are made or renewed;
the certificate and PEM file work (checking a given pair, name constraints, building and writing
certificates) is mwms.server.tls_x509's, and the names callers use are importable from here as well.
"""

from __future__ import annotations

import datetime
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mwms.server.settings import Settings, is_loopback
from mwms.server.tls_x509 import WILDCARD_HOSTS as WILDCARD_HOSTS
from mwms.server.tls_x509 import CertificatePair as CertificatePair
from mwms.server.tls_x509 import IPName as IPName
from mwms.server.tls_x509 import TlsError as TlsError
from mwms.server.tls_x509 import (
    browser_ca_is_current,
    ca_certificate,
    given_pair,
    key_usage,
    make_browser_ca,
    permitted_names,
    public_der,
    read_file,
    utc_now,
    write_cert,
    write_key,
)
from mwms.server.tls_x509 import check_pair as check_pair
from mwms.server.tls_x509 import fingerprint as fingerprint
from mwms.server.tls_x509 import name_constraints as _name_constraints
from mwms.server.tls_x509 import subject_names as subject_names

log = logging.getLogger("mwms.server.tls")

# At most a year each (browsers refuse longer server certificates; a CA people trust should not outlive that
# either). The server certificate never outlives the CA that signed it.
CA_VALIDITY = datetime.timedelta(days=365)
SERVER_VALIDITY = datetime.timedelta(days=365)
# A CA or server certificate this close to its end is renewed at start, so a long-running coordinator keeps a
# valid one.
RENEW_BEFORE = datetime.timedelta(days=30)


@dataclass(frozen=True)
class SelfSignedFiles:
    """The files `ensure_self_signed` keeps, and what it had to make on this call."""

    ca_cert: Path
    ca_key: Path
    server: CertificatePair
    ca_fingerprint: str
    made: tuple[str, ...]  # e.g. ("CA", "browser CA", "server certificate"); empty when all was reused
    # The CA for browsers (same key and name as ca.pem, so it vouches for the same server certificate), whose
    # name constraints also hold its addresses; its fingerprint; the names it may vouch for.
    browser_ca_cert: Path
    browser_ca_fingerprint: str
    permitted: tuple[str, ...]


@dataclass(frozen=True)
class TlsPlan:
    """What each protocol serves: a certificate pair, or None for clear text."""

    http: CertificatePair | None
    grpc: CertificatePair | None
    self_signed: SelfSignedFiles | None


def plan_tls(settings: Settings) -> TlsPlan:
    """Checks the TLS settings (making the self-signed files when asked) and says what each protocol serves."""
    if settings.tls_self_signed and (settings.tls_cert or settings.tls_key):
        raise TlsError(
            "give either --tls-self-signed or --tls-cert/--tls-key (MWMS_TLS_SELF_SIGNED, MWMS_TLS_CERT), not both"
        )
    http = given_pair(settings.tls_cert, settings.tls_key, "tls")
    grpc_override = given_pair(settings.grpc_tls_cert, settings.grpc_tls_key, "grpc-tls")
    self_signed = None
    if settings.tls_self_signed:
        self_signed = ensure_self_signed(settings.data_dir / "tls", [settings.http_host, settings.grpc_host])
        http = self_signed.server
    return TlsPlan(http=http, grpc=grpc_override or http, self_signed=self_signed)


def bind_grpc_port(server: grpc.aio.Server, settings: Settings) -> int:
    """Binds the agents' port with TLS when a certificate is configured; returns the port (0: not bound)."""
    host = settings.grpc_host
    address = f"[{host}]:{settings.grpc_port}" if ":" in host and not host.startswith("[") else None
    address = address or f"{host}:{settings.grpc_port}"
    pair = plan_tls(settings).grpc
    if pair is None:
        warn_if_clear_text("gRPC (agents)", host, "--tls-cert/--tls-key, --grpc-tls-cert/--grpc-tls-key")
        return server.add_insecure_port(address)
    credentials = grpc.ssl_server_credentials([(pair.key.read_bytes(), pair.cert.read_bytes())])
    log.info("gRPC for agents serves TLS with %s", pair.cert)
    return server.add_secure_port(address, credentials)


def warn_if_clear_text(what: str, host: str, fix: str) -> None:
    """Logs a WARNING when `what` is served without TLS on an address other machines can reach."""
    if not is_loopback(host):
        log.warning(
            "%s is served WITHOUT TLS on %s: join tokens, agent credentials, API tokens and job environments "
            "cross the network in clear text; serve TLS with %s, or --tls-self-signed",
            what,
            host or "all addresses",
            fix,
        )


# --- the self-signed CA ----------------------------------------------------------------------------------


def ensure_self_signed(tls_dir: Path, bound_hosts: Iterable[str]) -> SelfSignedFiles:
    """Makes (or reuses) a CA and a server certificate it signed in `tls_dir`, covering the names agents dial.

    Trusting the CA trusts it for this coordinator only: its name constraints (critical) permit just the
    server's names. Two certificates of the one CA key hold them. ca.pem, for agents and CLIs, constrains
    host names only: gRPC's TLS library (BoringSSL) refuses every chain whose CA constrains IP addresses.
    browser-ca.pem, for browsers, constrains host names and addresses both. Both vouch for server.pem.
    A CA that ends within RENEW_BEFORE, lacks such constraints (an older mwms made it) or does not permit
    every name is replaced, with a warning: agents, CLIs and browsers then need the new files.
    """
    tls_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # holds keys; mwms/private_files.py keeps it so
    ca_cert_path, ca_key_path = tls_dir / "ca.pem", tls_dir / "ca-key.pem"
    browser_path = tls_dir / "browser-ca.pem"
    server = CertificatePair(cert=tls_dir / "server.pem", key=tls_dir / "server-key.pem")
    names = subject_names(bound_hosts)
    made = []
    ca = _load_ca(ca_cert_path, ca_key_path, names)
    if ca is None:
        ca = _make_ca(names)
        write_key(ca_key_path, ca[1])
        write_cert(ca_cert_path, ca[0])
        made.append("CA")
    ca_cert, ca_key = ca
    if made or not browser_ca_is_current(browser_path, ca_cert, names):
        write_cert(browser_path, make_browser_ca(ca_cert, ca_key, names))
        made.append("browser CA")
    if "CA" in made or not _server_cert_is_current(server, ca_cert, names):
        key = ec.generate_private_key(ec.SECP256R1())
        write_key(server.key, key)
        write_cert(server.cert, _make_server_cert(key, ca_cert, ca_key, names))
        made.append("server certificate")
    return SelfSignedFiles(
        ca_cert=ca_cert_path,
        ca_key=ca_key_path,
        server=server,
        ca_fingerprint=fingerprint(ca_cert_path),
        made=tuple(made),
        browser_ca_cert=browser_path,
        browser_ca_fingerprint=fingerprint(browser_path),
        permitted=tuple(sorted(map(str, names))),
    )


def _load_ca(
    cert_path: Path, key_path: Path, names: set[str | IPName]
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """The CA kept in the tls dir; None when there is none yet or it is unfit for `names` (a new one is
    then made): it ends soon, lacks critical name constraints, or does not permit every name."""
    if not cert_path.exists() and not key_path.exists():
        return None
    remedy = (
        f"remove {cert_path.parent} to make a new CA (agents and CLIs then need the new ca.pem), "
        "or restore the file"
    )
    if not cert_path.exists() or not key_path.exists():
        missing = key_path if cert_path.exists() else cert_path
        raise TlsError(f"the self-signed CA is incomplete: {missing} is missing; {remedy}")
    try:
        cert = x509.load_pem_x509_certificate(read_file(cert_path, "the self-signed CA"))
        key = serialization.load_pem_private_key(read_file(key_path, "the self-signed CA key"), password=None)
    except (ValueError, TypeError):
        raise TlsError(f"the self-signed CA in {cert_path.parent} cannot be loaded; {remedy}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or public_der(key.public_key()) != public_der(
        cert.public_key()
    ):
        raise TlsError(f"{key_path} is not the key of {cert_path}; {remedy}")
    unfit = _ca_unfit(cert, names)
    if unfit:
        log.warning(
            "the self-signed CA %s %s; making a new one: give agents and CLIs the new ca.pem (and trust it "
            "in browsers again)",
            cert_path,
            unfit,
        )
        return None
    return cert, key


def _ca_unfit(cert: x509.Certificate, names: set[str | IPName]) -> str:
    """Why the stored CA cannot be kept for `names` ("" when it can)."""
    if cert.not_valid_after_utc < utc_now() + RENEW_BEFORE:
        return f"ends on {cert.not_valid_after_utc.date()}"
    try:
        constraints = cert.extensions.get_extension_for_class(x509.NameConstraints)
    except x509.ExtensionNotFound:
        return "has no name constraints (an older mwms made it), so trusting it would trust it for any site"
    if not constraints.critical:
        return "has name constraints that clients may ignore (not marked critical)"
    if cert.not_valid_after_utc - cert.not_valid_before_utc > CA_VALIDITY:
        return "is valid for more than a year"
    permitted = permitted_names(cert)
    if any(not isinstance(name, str) for name in permitted):
        return "constrains IP addresses, which agents' TLS (BoringSSL, in gRPC) refuses to verify"
    missing = {name for name in names if isinstance(name, str)} - permitted
    if missing:
        return f"does not permit {', '.join(sorted(missing))}"
    return ""


def _server_cert_is_current(
    pair: CertificatePair, ca_cert: x509.Certificate, names: set[str | IPName]
) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
        key = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
        cert.verify_directly_issued_by(ca_cert)
        covered = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
        return False
    have = set(covered.get_values_for_type(x509.DNSName)) | set(covered.get_values_for_type(x509.IPAddress))
    if not names <= have:
        log.info("making a new server certificate: it does not name %s", sorted(map(str, names - have)))
        return False
    return (
        public_der(key.public_key()) == public_der(cert.public_key())
        and cert.not_valid_after_utc > utc_now() + RENEW_BEFORE
    )


def _make_ca(names: set[str | IPName]) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The CA agents and CLIs trust (ca.pem): a new key, a year, host names constrained."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"mwms self-signed CA ({socket.gethostname()})")]
    )
    start = utc_now() - datetime.timedelta(minutes=5)  # tolerate small clock skew
    cert = ca_certificate(key, name, start, start + CA_VALIDITY, _name_constraints(names, addresses=False))
    return cert, key


def _make_server_cert(
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    names: set[str | IPName],
) -> x509.Certificate:
    general_names: list[x509.GeneralName] = [
        x509.IPAddress(name) if not isinstance(name, str) else x509.DNSName(name)
        for name in sorted(names, key=lambda n: (not isinstance(n, str), str(n)))
    ]
    start = utc_now() - datetime.timedelta(minutes=5)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mwms coordinator")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(min(start + SERVER_VALIDITY, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(general_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
