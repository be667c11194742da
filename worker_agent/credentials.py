"""The agent's credential: kept in `<work dir>/agent-credential` (mode 0600) and sent on every call.

Register returns a credential when the agent joins with a join token; from then on the agent proves who it
is with the credential alone, and the file is what lets a restarted agent keep its name. The client
interceptor reads the current value at each call, so the stubs never deal with it.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import grpc

log = logging.getLogger("mwms.agent.credentials")

CREDENTIAL_FILE = "agent-credential"
METADATA_KEY = "authorization"


class CredentialStore:
    """The credential file of one work dir, and its value in memory; thread-safe."""

    def __init__(self, work_dir: Path) -> None:
        self.path = work_dir / CREDENTIAL_FILE
        self._lock = threading.Lock()
        self._value = ""

    def __repr__(self) -> str:  # never the secret
        return f"CredentialStore(path={str(self.path)!r}, held={bool(self._value)})"

    def load(self) -> bool:
        """Reads the file when there is one; True when a credential is now held."""
        try:
            mode = self.path.stat().st_mode
            value = self.path.read_text().strip()
        except FileNotFoundError:
            return False
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("%s is readable by other users; restricting it to its owner (mode 0600)", self.path)
            os.chmod(self.path, 0o600)
        with self._lock:
            self._value = value
        return bool(value)

    def get(self) -> str:
        with self._lock:
            return self._value

    def set_aside(self) -> Path:
        """Stops presenting the credential (the coordinator refused it) and moves its file aside to
        <name>.refused, so a join token can admit the agent again; returns where it went."""
        refused = self.path.with_name(f"{self.path.name}.refused")
        with self._lock:
            self._value = ""
        try:
            os.replace(self.path, refused)
        except FileNotFoundError:
            pass
        return refused

    def save(self, credential: str) -> None:
        """Keeps `credential` in memory and replaces the file atomically, durably and with mode 0600."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # normally the prepared work dir
        partial = self.path.with_name(f".{self.path.name}.partial")
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, (credential + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(partial, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # a credential lost to a power cut would lock the agent out of its name
        finally:
            os.close(directory)
        with self._lock:
            self._value = credential


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: Any


class CredentialInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <credential>` to every call while the store holds a credential."""

    def __init__(self, store: CredentialStore) -> None:
        self._store = store

    def _with_credential(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        credential = self._store.get()
        if not credential:
            return details
        metadata = [(k, v) for k, v in (details.metadata or ()) if k != METADATA_KEY]
        metadata.append((METADATA_KEY, f"Bearer {credential}"))
        return _CallDetails(  # type: ignore[return-value]  # duck-typed like grpc's own examples
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            details.wait_for_ready,
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._with_credential(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._with_credential(details), request)

    def intercept_stream_unary(
        self, continuation: Callable[..., Any], details: Any, request_iterator: Iterator[Any]
    ) -> Any:
        return continuation(self._with_credential(details), request_iterator)

    def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: Any, request_iterator: Iterator[Any]
    ) -> Any:
        return continuation(self._with_credential(details), request_iterator)
