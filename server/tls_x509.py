"""X.509 certificates and PEM files for the coordinator's TLS: checking a certificate pair given by flags,
the names a self-signed certificate covers and the CA's name constraints, building CA certificates, and
writing keys and certificates (a key is never readable by others, even for a moment).

When to make or renew the self-signed CA and server certificate is mwms.server.tls's; this module holds the
pieces it builds them from.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

log = logging.getLogger("mwms.server.tls")

WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")

IPName = ipaddress.IPv4Address | ipaddress.IPv6Address


class TlsError(RuntimeError):
    """A TLS setting that cannot be served; the message names the file or flag and what to do."""


@dataclass(frozen=True)
class CertificatePair:
    cert: Path
    key: Path


def fingerprint(cert_path: Path) -> str:
    """The SHA-256 fingerprint of the first certificate in a PEM file, as `openssl x509 -fingerprint` prints it."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    digest = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


# --- given certificates ----------------------------------------------------------------------------------


def given_pair(cert: Path | None, key: Path | None, flag: str) -> CertificatePair | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        given, missing = (f"--{flag}-cert", f"--{flag}-key") if cert else (f"--{flag}-key", f"--{flag}-cert")
        raise TlsError(f"{given} needs {missing} as well: TLS takes a certificate and its private key")
    check_pair(cert, key, f"--{flag}-cert", f"--{flag}-key")
    return CertificatePair(cert=cert, key=key)


def check_pair(cert_path: Path, key_path: Path, cert_flag: str, key_flag: str) -> None:
    """Raises TlsError unless `key_path` holds the unencrypted private key of the PEM certificate in `cert_path`."""
    try:
        chain = x509.load_pem_x509_certificates(read_file(cert_path, cert_flag))
    except ValueError:
        raise TlsError(
            f"{cert_flag} {cert_path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        ) from None
    try:
        key = serialization.load_pem_private_key(read_file(key_path, key_flag), password=None)
    except TypeError:
        raise TlsError(
            f"{key_flag} {key_path} is encrypted; the coordinator cannot ask for a passphrase, so give it "
            f"a decrypted copy readable only by its user (e.g. `openssl pkey -in KEY -out KEY.plain`)"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise TlsError(
            f"{key_flag} {key_path} holds no PEM private key (-----BEGIN PRIVATE KEY-----)"
        ) from None
    if public_der(key.public_key()) != public_der(chain[0].public_key()):
        raise TlsError(
            f"{key_flag} {key_path} is not the private key of the certificate in {cert_flag} {cert_path} "
            "(their public keys differ); pass the key the certificate was issued for"
        )
    not_after = chain[0].not_valid_after_utc
    if not_after < utc_now():
        log.warning("%s %s expired on %s; clients will refuse it", cert_flag, cert_path, not_after.date())


def read_file(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TlsError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise TlsError(f"{flag} {path} is a directory; give the PEM file") from None
    except PermissionError:
        raise TlsError(f"{flag} {path} cannot be read by this user ({_user()}): permission denied") from None
    except OSError as error:
        raise TlsError(f"{flag} {path} cannot be read: {error.strerror or error}") from None


# --- what self-signed certificates hold, and writing them ------------------------------------------------


def subject_names(bound_hosts: Iterable[str]) -> set[str | IPName]:
    """The names a self-signed server certificate covers: loopback, this machine's name, concrete bound hosts."""
    names: set[str | IPName] = {"localhost", ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    for host in (socket.gethostname(), *bound_hosts):
        host = host.strip().strip("[]")
        if host in WILDCARD_HOSTS or not host.isascii():
            continue
        try:
            names.add(ipaddress.ip_address(host))
        except ValueError:
            names.add(host.lower())
    return names


def browser_ca_is_current(path: Path, ca_cert: x509.Certificate, names: set[str | IPName]) -> bool:
    """True when `path` holds the browsers' certificate of this CA, permitting exactly `names`."""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        critical = cert.extensions.get_extension_for_class(x509.NameConstraints).critical
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    return (
        critical
        and cert.subject == ca_cert.subject
        and public_der(cert.public_key()) == public_der(ca_cert.public_key())
        and cert.not_valid_after_utc == ca_cert.not_valid_after_utc
        and permitted_names(cert) == names
    )


def permitted_names(ca_cert: x509.Certificate) -> set[str | IPName]:
    """The host names and single addresses the CA's name constraints permit (none without constraints)."""
    try:
        constraints = ca_cert.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return set()
    permitted: set[str | IPName] = set()
    for subtree in constraints.permitted_subtrees or []:
        if isinstance(subtree, x509.DNSName):
            permitted.add(subtree.value)
        elif isinstance(subtree, x509.IPAddress) and isinstance(
            subtree.value, (ipaddress.IPv4Network, ipaddress.IPv6Network)
        ):
            if subtree.value.num_addresses == 1:
                permitted.add(subtree.value.network_address)
    return permitted


def name_constraints(names: set[str | IPName], addresses: bool) -> x509.NameConstraints:
    """Permits exactly `names`: each host name (and, as RFC 5280 has it, the names under it) and, with
    `addresses`, each address on its own. "localhost", 127.0.0.1 and ::1 are always among them, so host
    names (and IPv4 and IPv6 addresses) are all constrained."""
    subtrees: list[x509.GeneralName] = []
    for name in sorted(names, key=lambda n: (not isinstance(n, str), str(n))):
        if isinstance(name, str):
            subtrees.append(x509.DNSName(name))
        elif addresses:
            address = name.compressed.split("%")[0]  # a zone id has no place in a certificate
            subtrees.append(x509.IPAddress(ipaddress.ip_network(f"{address}/{name.max_prefixlen}")))
    return x509.NameConstraints(permitted_subtrees=subtrees, excluded_subtrees=None)


def make_browser_ca(
    ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, names: set[str | IPName]
) -> x509.Certificate:
    """The same CA for browsers (browser-ca.pem): its key, name and validity, addresses constrained too."""
    constraints = name_constraints(names, addresses=True)
    return ca_certificate(
        ca_key, ca_cert.subject, ca_cert.not_valid_before_utc, ca_cert.not_valid_after_utc, constraints
    )


def ca_certificate(
    key: ec.EllipticCurvePrivateKey,
    name: x509.Name,
    start: datetime.datetime,
    end: datetime.datetime,
    constraints: x509.NameConstraints,
) -> x509.Certificate:
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(key_usage(cert_sign=True), critical=True)
        .add_extension(constraints, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_atomically(path, pem, 0o600)


def write_cert(path: Path, cert: x509.Certificate) -> None:
    _write_atomically(path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _write_atomically(path: Path, content: bytes, mode: int) -> None:
    # Created with its final mode, so a private key is never readable by others, even for a moment.
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "wb") as file:
        file.write(content)
    os.chmod(partial, mode)
    os.replace(partial, path)


def public_der(public_key: PublicKeyTypes) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())
