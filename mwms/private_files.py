"""The coordinator's files are its own, whatever the umask it was started with.

The data dir holds the database (every job's environment values, token hashes), the first admin token
and the self-signed CA's keys. Started by hand under the usual umask 022 they would be world-readable,
and on a training machine "the world" includes tasks running other people's code. So `mwms server`
sets its umask to 0077 (SQLite's -wal and -shm, made later, follow it), keeps the data dir at 0700 and
the secret files in it at 0600, tightens an existing dir and files made by an older mwms or another
umask, and refuses a data dir that another user owns (that user could read and replace everything).
PostgreSQL deployments have no database file here: only the dir and the keys apply.

Standard library only at import (sqlalchemy is imported where a database URL is read), so `mwms
quickstart` keeps its own dir private with it without loading the coordinator into the CLI.
"""

from __future__ import annotations

import logging
import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("mwms.server")

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600
# Files under the data dir that hold secrets (the database's files are added from the database URL).
SECRET_FILES = ("admin-token", "tls/ca-key.pem", "tls/server-key.pem")
PRIVATE_SUBDIRS = ("tls",)
SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal", ".lock", "-writers", "-writers.door")


class ForeignFileError(Exception):
    """A data dir or secret file the coordinator must not use as it is; the message says what to do."""


def set_private_umask() -> None:
    """Files and dirs this process makes from now on are its user's alone (SQLite's -wal/-shm included).

    Only for a process of its own (`mwms server`): an app built inside another process (tests) leaves
    that process's umask alone and relies on the modes set here explicitly."""
    os.umask(PRIVATE_UMASK)


def refuse_foreign_dir(path: Path) -> None:
    """Raises ForeignFileError when `path` exists and is not a dir of this user's own to make private:
    another user owns it, or it is a shared dir such as /tmp (sticky bit) that must never become 0700."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        raise ForeignFileError(f"{path} is not a directory; give a directory of its own (--data-dir)")
    if info.st_uid != os.geteuid():
        raise ForeignFileError(
            f"{path} belongs to {_user(info.st_uid)}, not to the user this runs as ({_user(os.geteuid())}): "
            "that user could read the database (job environments, token hashes) and keys, and replace "
            f"them; give it a directory of its own (--data-dir), or make this one yours: chown -R "
            f"{os.geteuid()} {path}"
        )
    if info.st_mode & stat.S_ISVTX or path.resolve() == Path("/"):
        raise ForeignFileError(
            f"{path} is a directory shared by every user (mode {stat.S_IMODE(info.st_mode):04o}), which must "
            "not be made private; give a directory of its own below it (--data-dir)"
        )


def make_private_dir(path: Path, mode: int = DIR_MODE) -> None:
    """Creates `path` with `mode` (0700; parents get the umask's mode: they are not ours), or restricts
    an existing one of this user's to it (the owner gets mode's bits, others never more than before);
    ForeignFileError when it is not this user's to make private (refuse_foreign_dir)."""
    refuse_foreign_dir(path)
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    _restrict(path, mode)


def make_private_file(path: Path) -> None:
    """Restricts an existing file of this user's to 0600 (a missing one is fine: it will be made so);
    ForeignFileError when another user owns it. A link is left alone: its target is not ours to change."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        return
    if info.st_uid != os.geteuid():
        raise ForeignFileError(
            f"{path} belongs to {_user(info.st_uid)}, not to the user this runs as ({_user(os.geteuid())}), "
            f"so it cannot be kept private; make it yours (chown {os.geteuid()} {path}) or remove it"
        )
    _restrict(path, FILE_MODE)


def create_private_file(path: Path) -> None:
    """Makes an empty `path` with mode 0600 if there is none (and its dir exists). An empty file is an
    empty SQLite database: SQLite then makes -wal and -shm with the database's mode, whatever the umask."""
    if not path.parent.is_dir():
        return
    try:
        os.close(
            os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        )
    except FileExistsError:
        return


def sqlite_file(database_url: str) -> Path | None:
    """The database file of a SQLite file URL; None for other databases and in-memory SQLite."""
    from sqlalchemy.engine import make_url  # the coordinator's dependency, not the CLI's

    url = make_url(database_url)
    database = url.database or ""
    if not url.drivername.startswith("sqlite") or database in ("", ":memory:"):
        return None
    if url.query.get("uri") in ("true", "1") or database.startswith("file:"):
        return None  # a SQLite URI names its file in its own syntax; left to the umask
    return Path(database)


def secure_data_dir(data_dir: Path, database_url: str) -> None:
    """Makes the coordinator's data dir private (0700) and every secret file in it, and the SQLite
    database's files wherever they are, 0600; creates the database file 0600 when there is none yet.
    Raises ForeignFileError for a dir or file another user owns."""
    make_private_dir(data_dir)
    for name in PRIVATE_SUBDIRS:
        if (data_dir / name).is_dir():
            make_private_dir(data_dir / name)
    database = sqlite_file(database_url)
    for path in [*(data_dir / name for name in SECRET_FILES), *_sqlite_files(database)]:
        make_private_file(path)
    if database is not None:
        create_private_file(database)


def prepare_quickstart_dir(root: Path, private_subdirs: Iterable[str]) -> None:
    """`mwms quickstart`'s own dir: others may pass through it (0711), not list it, and each of
    `private_subdirs` (logs, results) is 0700. Passing through, because the agents' work dirs live below
    it and a root agent without a sandbox lets its tasks' uids enter them (worker_agent/work_dir.py
    keeps each work dir's mode); the coordinator's data dir below it is made private by `mwms server`."""
    make_private_dir(root, 0o711)
    for name in private_subdirs:
        make_private_dir(root / name)


def _sqlite_files(database: Path | None) -> list[Path]:
    if database is None:
        return []
    return [Path(f"{database}{suffix}") for suffix in SQLITE_SUFFIXES]


def _restrict(path: Path, mode: int) -> None:
    # The owner gets mode's bits; group and others only lose some: a dir already closed stays closed.
    current = stat.S_IMODE(path.stat().st_mode)
    wanted = (mode & stat.S_IRWXU) | (current & mode & (stat.S_IRWXG | stat.S_IRWXO))
    if current == wanted:
        return
    if current & ~wanted & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            "%s (mode %04o) was open to other users; restricting it to mode %04o", path, current, wanted
        )
    os.chmod(path, wanted)


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"
