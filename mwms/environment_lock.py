"""A job's own Python environment as it crosses every boundary: a lock of pinned requirements.

Dependency-free: the client that resolves it at submit (mwms/client/environment.py), the coordinator that
stores it with the job (server/schemas/job_parts.py) and the agent that builds it (worker_agent/environments.py)
read it with the same rules.

The lock is requirements.txt text in which every requirement is pinned to one version (`name==version`,
with environment markers where `uv pip compile --universal` wrote them, and `--hash` continuations). It is
resolved once for the job, so every worker of every attempt installs exactly the same packages from the
package index its agent's operator configured. That is why a lock names no index, no file, no URL and no
editable install: only names and versions.
"""

from __future__ import annotations

import re

# Characters (at most 256 KiB of UTF-8): a lock of a few hundred packages without hashes is a few KiB.
MAX_LOCK_CHARS = 64 * 1024
MAX_REQUIREMENTS_PATH_CHARS = 500
# "3", "3.11" or "3.11.7": what `uv venv --python` takes as a version request.
PYTHON_PATTERN = r"^3(\.\d{1,2}(\.\d{1,3})?)?$"
# The files of a program directory that name an environment, in the order a submit looks for them.
ENVIRONMENT_FILES = ("uv.lock", "requirements.txt", "pyproject.toml")

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,200}[A-Za-z0-9])?"
_VERSION = r"[A-Za-z0-9.+!_-]{1,100}"
_HASH = r"--hash=[a-z0-9]+:[A-Fa-f0-9]+"
_REQUIREMENT = (
    rf"(?P<name>{_NAME})(?:\[[A-Za-z0-9._, -]*\])?[ \t]*==[ \t]*(?P<version>{_VERSION})"
    rf"(?:[ \t]*;(?P<marker>[^\n#\\\x00]{{0,1000}}))?(?:[ \t]+{_HASH})*"
)
# Every quantifier that could overlap its neighbours is bounded, so a long hostile line cannot make the
# match backtrack for long. One line of a lock: blank, a comment, a pinned requirement or a `--hash` continuation, each of the last
# two perhaps continued with a backslash. LOCK_PATTERN (in the API's schema) is the whole text of them.
LINE_PATTERN = rf"[ \t]*(?:#[^\n\x00]*|{_REQUIREMENT}(?:[ \t]*\\)?|{_HASH}(?:[ \t]*\\)?)?[ \t]*"
_UNNAMED_LINE = re.sub(r"\(\?P<\w+>", "(?:", LINE_PATTERN)
LOCK_PATTERN = rf"^(?:{_UNNAMED_LINE}\n)*(?:{_UNNAMED_LINE})?$"
_LINE = re.compile(LINE_PATTERN)


class LockError(ValueError):
    """The lock is not a list of pinned requirements; the message names the line and says what to do."""


def pinned_packages(locked: str) -> list[str]:
    """The lock's requirements as `name==version`, with ` ; marker` where one applies only to some
    Pythons or platforms (hashes left out), in its order.

    Raises LockError for a lock over MAX_LOCK_CHARS, and for a line that is none of: blank, a comment, a
    requirement pinned to one version, a `--hash` continuation (an index, a constraint file, `-e`, a URL
    or a range are refused, each naming its line).
    """
    if len(locked) > MAX_LOCK_CHARS:
        raise LockError(f"the environment's lock is over {MAX_LOCK_CHARS} characters: pin fewer packages")
    packages: list[str] = []
    for number, line in enumerate(locked.split("\n"), start=1):
        match = _LINE.fullmatch(line)
        if match is None:
            what = line.strip()[:120]
            if what.startswith("-"):
                raise LockError(
                    f"line {number} of the lock is an option ({what.split()[0]}): a lock names packages "
                    "only; the agents install from the package index their operator configured"
                )
            raise LockError(
                f"line {number} of the lock is not a requirement pinned to one version ({what!r}): every "
                "requirement must read name==version; resolve the file with `uv pip compile --universal`"
            )
        if match["name"]:
            marker = " ".join((match["marker"] or "").split())
            packages.append(f"{match['name']}=={match['version']}" + (f" ; {marker}" if marker else ""))
    return packages


def distinct_count(packages: list[str]) -> int:
    """How many packages `pinned_packages` names (a package pinned apart for several Pythons is one)."""
    return len({package.split("==", 1)[0].lower().replace("_", "-") for package in packages})
