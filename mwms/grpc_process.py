"""gRPC's process-wide settings for mwms's own processes, given before gRPC loads and kept from their tasks.

gRPC reads these variables once, as it loads (`import grpc`): `mwms/cli/main.py` adds `missing_from(os.environ)`
before anything imports it, and the test scaffolding (testkit) does the same for the simulated agents. A variable the
operator set is left as it is.

- GRPC_ENABLE_FORK_SUPPORT=false: the daemons start helper processes (the coordinator's scheduler and ingest
  processes, the agent's tasks) with fork+exec while gRPC's threads run. gRPC's fork handlers serve children
  that go on using gRPC, which none of these do, and they print a line of their own to stderr ("skipping
  fork() handlers") that no log format can hold.
- GRPC_EXPERIMENTS=-event_engine_listener,-event_engine_client: connections are read and written by the
  thread that polls gRPC's completion queue for asyncio (grpc.aio), instead of by gRPC's EventEngine
  threads, which hand each message to that thread. The hop cost the coordinator a fifth of its CPU with
  1,000 agents heartbeating at 1 Hz, and the agents as much (bench/README.md, Agents). It is the switch
  gRPC's maintainers give for going back to that I/O path; a gRPC that no longer knows an experiment logs
  "Unknown experiment" once and keeps its default.

A task is a program of its own (TensorFlow carries its own gRPC): `missing_from` names what it sets in
MWMS_GRPC_DEFAULTS, which processes started from this one inherit, and the agent passes none of those on
(worker_agent/task_env.py), while a value the operator gave reaches tasks as any other variable does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

SETTINGS: dict[str, str] = {
    "GRPC_ENABLE_FORK_SUPPORT": "false",
    "GRPC_EXPERIMENTS": "-event_engine_listener,-event_engine_client",
}
# The names of SETTINGS an mwms process set (an MWMS_ setting: never passed to a task itself).
MARK = "MWMS_GRPC_DEFAULTS"


def configure(environ: MutableMapping[str, str] = os.environ) -> None:
    """Gives `environ` what `missing_from` says; call it before gRPC loads."""
    environ.update(missing_from(environ))


def missing_from(environ: Mapping[str, str]) -> dict[str, str]:
    """Each of SETTINGS that `environ` does not hold yet, and MARK naming them (with those an mwms process
    that started this one set)."""
    added = {name: value for name, value in SETTINGS.items() if name not in environ}
    ours = set_by_mwms(environ) | set(added)
    return added | {MARK: ",".join(sorted(ours))} if added else {}


def set_by_mwms(environ: Mapping[str, str]) -> set[str]:
    """The variables of `environ` that an mwms process (this one, or one that started it) set, not the
    operator: marked, and still holding mwms's value."""
    marked = environ.get(MARK, "").split(",")
    return {name for name in marked if name in SETTINGS and environ.get(name) == SETTINGS[name]}
