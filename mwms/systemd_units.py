"""What the coordinator's and the agent's systemd units share: quoting for ExecStart= and path lists,
the checks on User= and on directories that must outlive a restart, and the limits both units set.

Standard library only: the coordinator (server/systemd_unit.py) and the agent (worker_agent/systemd.py)
both import it, and neither imports the other.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

# Agent streams, bundle caches and task log pipes (agent), client connections (coordinator): the default
# 1,024 open files is tight for both.
OPEN_FILES_LIMIT = 65536
# /tmp and /var/tmp are the unit's own (PrivateTmp=yes) and emptied on every restart.
PRIVATE_TEMP_DIRS = (PurePosixPath("/tmp"), PurePosixPath("/var/tmp"))
# What ProtectHome=read-only makes read-only; a directory there gets ReadWritePaths=.
HOME_DIRS = (PurePosixPath("/home"), PurePosixPath("/root"), PurePosixPath("/run/user"))

_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
# A user name or uid for User= (what useradd accepts; systemd refuses the rest at start).
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")


class UnitError(ValueError):
    """The unit cannot be written for these options; the message says what to change."""


def quote_argument(argument: str) -> str:
    """`argument` as one word of an ExecStart= line (systemd.syntax quoting; `%` and `$` escaped)."""
    escaped = argument.replace("%", "%%").replace("$", "$$")
    if _SAFE.fullmatch(argument):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def quote_path(path: str) -> str:
    """`path` as one word of a path list (ReadWritePaths=): quoted, `%` escaped; `$` means itself there."""
    escaped = path.replace("%", "%%")
    if _SAFE.fullmatch(path):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def check_user(user: str, flag: str) -> str:
    """`user` when it can be a User= of a unit; UnitError naming `flag` otherwise."""
    if not _USER.fullmatch(user):
        raise UnitError(
            f"{flag} {user!r} is not a user name or uid (letters, digits, '_', '.', '-', at most 32, not "
            "starting with '-' or '.')"
        )
    return user


def check_lasting_dir(path: str, flag: str) -> str:
    """`path` (absolute) when it outlives a restart of the unit; UnitError when it is in /tmp or /var/tmp,
    which PrivateTmp=yes makes the unit's own and empties on every restart."""
    where = PurePosixPath(path)
    for temporary in PRIVATE_TEMP_DIRS:
        if where == temporary or temporary in where.parents:
            raise UnitError(
                f"{flag} {path} is under {temporary}, which the unit replaces with a private one, empty at "
                "every start (PrivateTmp=yes): choose a path elsewhere"
            )
    return path
