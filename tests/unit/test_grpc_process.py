"""gRPC's process-wide settings for mwms's own processes (mwms/grpc_process.py), and what of them a task gets."""

from __future__ import annotations

from mwms import grpc_process
from mwms.v1 import agent_pb2
from mwms.worker_agent.task_env import TaskPaths, child_environment

EXPERIMENTS = "GRPC_EXPERIMENTS"
FORK = "GRPC_ENABLE_FORK_SUPPORT"


def test_settings_are_given_where_unset_and_marked_as_mwms() -> None:
    environ: dict[str, str] = {"PATH": "/usr/bin"}
    grpc_process.configure(environ)
    assert {name: environ[name] for name in grpc_process.SETTINGS} == grpc_process.SETTINGS
    assert grpc_process.set_by_mwms(environ) == set(grpc_process.SETTINGS)


def test_the_operators_value_is_kept_and_not_counted_as_mwms() -> None:
    environ = {EXPERIMENTS: "-event_engine_dns"}
    grpc_process.configure(environ)
    assert environ[EXPERIMENTS] == "-event_engine_dns"
    assert grpc_process.set_by_mwms(environ) == {FORK}


def test_a_child_process_knows_what_its_parent_set() -> None:
    parent: dict[str, str] = {}
    grpc_process.configure(parent)
    child = dict(parent)  # an agent started from the CLI, or from a test
    grpc_process.configure(child)
    assert grpc_process.set_by_mwms(child) == set(grpc_process.SETTINGS)
    child[EXPERIMENTS] = "-event_engine_client"  # changed on the way: the operator's now
    assert grpc_process.set_by_mwms(child) == {FORK}


def test_a_task_gets_the_operators_grpc_settings_but_not_mwmss(tmp_path) -> None:  # type: ignore[no-untyped-def]
    start = agent_pb2.StartTask(task_id="t-1", job_id="j-1", num_workers=1)
    paths = TaskPaths.for_task(tmp_path, start)
    ours: dict[str, str] = {"PATH": "/usr/bin"}
    grpc_process.configure(ours)
    env = child_environment(start, paths, ours)
    assert not set(grpc_process.SETTINGS) & set(env) and env["PATH"] == "/usr/bin"
    operators = {"PATH": "/usr/bin", EXPERIMENTS: "-event_engine_dns"}
    grpc_process.configure(operators)
    env = child_environment(start, paths, operators)
    assert env[EXPERIMENTS] == "-event_engine_dns" and FORK not in env
