"""How a CLI command gets its `mwms.Client`: --api / --token / --ca-file, else MWMS_*, else `mwms login`."""

from __future__ import annotations

from pathlib import Path

from mwms.client import Client

# A person at a prompt waits this long for a restarting coordinator before being told it is unreachable;
# following a job (submit --wait, quickstart) tolerates longer outages on top (Job.wait).
RETRY_SECONDS = 10.0


def connect(
    api: str | None = None,
    token: str | None = None,
    ca_file: str | Path | None = None,
    *,
    timeout: float = 30.0,
) -> Client:
    """A client for the coordinator that --api / MWMS_API / `mwms login` name, with the token in force."""
    return Client(api, token, ca_file, timeout=timeout, retry_seconds=RETRY_SECONDS)
