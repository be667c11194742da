"""Uploads on their way to disk: written to a temp file, hashed and counted as the bytes arrive, refused
the moment they pass the upload limit. Shared by bundle uploads (REST) and agents' files (gRPC)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from mwms.server.errors import UploadTooLarge

UPLOAD_LIMIT_SETTING = "MWMS_MAX_UPLOAD_BYTES"
# Room for the multipart boundaries and part headers around an uploaded archive.
MULTIPART_OVERHEAD = 64 * 1024


def too_large_message(max_bytes: int) -> str:
    """What a refused oversized upload is told."""
    return (
        f"the upload is larger than the limit of {max_bytes} bytes ({UPLOAD_LIMIT_SETTING}); "
        "leave data sets out of the bundle, or ask the operator to raise the limit"
    )


def check_body_size(body_bytes: int, max_bytes: int) -> None:
    """UploadTooLarge when an upload's body (declared, or received so far) is over `max_bytes` and the
    room its multipart framing may take."""
    if body_bytes > max_bytes + MULTIPART_OVERHEAD:
        raise UploadTooLarge(too_large_message(max_bytes))


class UploadSpool:
    """An upload being written to a temp file under `directory`; nothing is left behind when it is discarded."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=directory, suffix=".upload")
        self.path = Path(name)
        self.max_bytes = max_bytes
        self.size = 0
        self._file = os.fdopen(fd, "wb")
        self._digest = hashlib.sha256()

    def write(self, data: bytes) -> None:
        """Appends `data`; UploadTooLarge (and nothing written) when it would pass the limit."""
        if self.size + len(data) > self.max_bytes:
            raise UploadTooLarge(too_large_message(self.max_bytes))
        self.size += len(data)
        self._digest.update(data)
        self._file.write(data)

    def finish(self) -> tuple[Path, str, int]:
        """Closes the file; returns (path, sha256, size)."""
        self._file.close()
        return self.path, self._digest.hexdigest(), self.size

    def discard(self) -> None:
        """Closes and removes the file."""
        self._file.close()
        self.path.unlink(missing_ok=True)
