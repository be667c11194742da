"""What a program bundle, artifact or checkpoint archive may be: `ArchiveLimits`, its defaults and settings,
the errors that say why an archive is refused, and the checks of size and time every reading pass makes.

The limits are shared by the coordinator (which may override them through its settings) and the agent
(which uses the defaults), so both sides agree on what a bundle may be.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
MIB = 1024**2
# Archives that unpack to less than this are never refused for their ratio: a small file of zeros is fine.
RATIO_FLOOR_BYTES = 64 * MIB


@dataclass(frozen=True)
class ArchiveLimits:
    """What an archive may hold. The one home of the defaults; `ENVIRONMENT` names their MWMS_ settings."""

    # The archive itself: an upload, a fetched bundle or checkpoint.
    max_archive_bytes: int = 2 * GIB
    # Files, directories and links together.
    max_entries: int = 50_000
    # Everything the archive unpacks to (for tar: the whole uncompressed tar stream).
    max_unpacked_bytes: int = 8 * GIB
    # Unpacked bytes per compressed byte, checked once more than RATIO_FLOOR_BYTES are unpacked.
    max_ratio: float = 200.0
    # Wall-clock seconds the inspection of one archive may take.
    time_budget_s: float = 60.0


DEFAULT_LIMITS = ArchiveLimits()
# The coordinator's setting for each limit (server/settings.py); error messages name them.
ENVIRONMENT = {
    "max_archive_bytes": "MWMS_MAX_UPLOAD_BYTES",
    "max_entries": "MWMS_ARCHIVE_MAX_ENTRIES",
    "max_unpacked_bytes": "MWMS_ARCHIVE_MAX_UNPACKED_BYTES",
    "max_ratio": "MWMS_ARCHIVE_MAX_RATIO",
    "time_budget_s": "MWMS_ARCHIVE_TIME_BUDGET_S",
}


class ArchiveError(Exception):
    """The archive cannot be extracted; the message says why."""


class UnsafeArchiveError(ArchiveError):
    """An entry would write outside the destination or create something other than files, dirs and links."""


class UnsupportedArchiveError(ArchiveError):
    """The file is neither a gzip-compressed tar nor a zip."""


class ArchiveLimitError(ArchiveError):
    """The archive exceeds one of the `ArchiveLimits`; `limit` is the field's name."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(f"{message} (limit {ENVIRONMENT[limit]})")
        self.limit = limit


@dataclass(frozen=True)
class ArchiveSummary:
    """What an inspected archive holds."""

    format: str
    entries: int
    files: int
    unpacked_bytes: int


def limit_exceeded(limit: str, value: int, limits: ArchiveLimits) -> ArchiveLimitError:
    """The error for an archive (or upload) of `value` bytes over `limit`."""
    bound = getattr(limits, limit)
    return ArchiveLimitError(
        limit, f"the archive is larger than the limit of {human_size(bound)} ({value}+ bytes)"
    )


def check_archive_size(archive: Path, limits: ArchiveLimits) -> int:
    size = archive.stat().st_size
    if size > limits.max_archive_bytes:
        raise limit_exceeded("max_archive_bytes", size, limits)
    return size


def check_deadline(deadline: float, limits: ArchiveLimits) -> None:
    if time.monotonic() > deadline:
        raise ArchiveLimitError(
            "time_budget_s", f"reading the archive took longer than {limits.time_budget_s:g} s"
        )


def human_size(value: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{int(value)} bytes"
