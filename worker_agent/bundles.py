"""Program bundles fetched from the coordinator by sha256 digest, verified, and cached on disk.

A bundle is written to `<digest>.partial`, checked against its digest and only then renamed to `<digest>`,
so the cache never holds a damaged file. One lock per digest keeps concurrent tasks from fetching twice.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from pathlib import Path

import grpc

from mwms.archive import DEFAULT_LIMITS, ArchiveLimits, limit_exceeded
from mwms.v1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger("mwms.agent.bundles")

DIGEST_PATTERN = re.compile(r"[0-9a-f]{64}")
FETCH_TIMEOUT_SECONDS = 600.0


class BundleError(Exception):
    """The bundle could not be fetched or does not match its digest; the message says which."""


class BundleCache:
    """Bundles under `directory`, named by digest, fetched through `stub` when missing."""

    def __init__(
        self, directory: Path, stub: agent_pb2_grpc.AgentServiceStub, limits: ArchiveLimits = DEFAULT_LIMITS
    ) -> None:
        self.directory = directory
        self._stub = stub
        self._limits = limits
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def use_stub(self, stub: agent_pb2_grpc.AgentServiceStub) -> None:
        """Fetches through `stub` from now on (the agent replaced a dead channel)."""
        self._stub = stub

    def get(self, digest: str) -> Path:
        """The path of the verified bundle `digest`, fetched first when it is not cached."""
        if not DIGEST_PATTERN.fullmatch(digest):
            raise BundleError(f"bundle digest {digest!r} is not a lowercase hex sha256")
        with self._lock_for(digest):
            path = self.directory / digest
            if path.exists():
                return path
            self._fetch(digest, path)
            return path

    def _lock_for(self, digest: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(digest, threading.Lock())

    def _fetch(self, digest: str, path: Path) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{digest}.partial")
        sha256 = hashlib.sha256()
        size = 0
        try:
            with partial.open("wb") as out:
                request = agent_pb2.FetchBundleRequest(digest=digest)
                for chunk in self._stub.FetchBundle(request, timeout=FETCH_TIMEOUT_SECONDS):
                    size += len(chunk.data)
                    if size > self._limits.max_archive_bytes:
                        partial.unlink(missing_ok=True)
                        raise BundleError(
                            f"bundle {digest[:12]} was refused: {too_large(size, self._limits)}"
                        )
                    out.write(chunk.data)
                    sha256.update(chunk.data)
        except grpc.RpcError as error:
            partial.unlink(missing_ok=True)
            raise BundleError(f"could not fetch bundle {digest[:12]}: {_rpc_reason(error)}") from error
        except OSError as error:
            partial.unlink(missing_ok=True)
            raise BundleError(f"could not store bundle {digest[:12]}: {error}") from error
        if sha256.hexdigest() != digest:
            partial.unlink(missing_ok=True)
            raise BundleError(
                f"bundle digest mismatch: asked for {digest[:12]}, received {size} bytes "
                f"with sha256 {sha256.hexdigest()[:12]}"
            )
        partial.replace(path)
        log.info("fetched bundle %s (%d bytes)", digest[:12], size)


def too_large(size: int, limits: ArchiveLimits) -> str:
    return str(limit_exceeded("max_archive_bytes", size, limits))


def _rpc_reason(error: grpc.RpcError) -> str:
    code = error.code() if isinstance(error, grpc.Call) else None
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    return f"{code.name if code else 'error'}: {details}"
