"""The task-environment contract (mwms/task_environment.py) as the coordinator, agent and runtime use it.

The agent's side with a real task is tests/system/worker_agent/test_real_task_environment.py.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from mwms import task_environment
from mwms.preflight_contract import REPORT_ENV
from mwms.server.schemas import JobCreate
from mwms.server.services.job_life.jobs import job_env
from mwms_testkit import REPO

SITECUSTOMIZE = REPO / "worker_agent/stack_handler/sitecustomize.py"
DIGEST = "0" * 64


def submit(env: dict[str, str]) -> JobCreate:
    return JobCreate(bundle_digest=DIGEST, command=["python", "train.py"], workers=1, env=env)


def test_the_kinds_do_not_overlap() -> None:
    kinds = [
        task_environment.RESERVED_ENV,
        set(task_environment.SPEC_ENV),
        set(task_environment.DEFAULTED_ENV),
        task_environment.MERGED_ENV,
        task_environment.RUNTIME_SETTINGS,
    ]
    for i, first in enumerate(kinds):
        for second in kinds[i + 1 :]:
            assert not set(first) & set(second), (first, second)


def test_what_the_agent_overwrites_is_reserved() -> None:
    for name in ("TMPDIR", "PYTHONUNBUFFERED", "HOME", "USER", "LOGNAME", "TF_CONFIG", REPORT_ENV):
        assert name in task_environment.RESERVED_ENV
    assert task_environment.PREFLIGHT_REPORT == REPORT_ENV


@pytest.mark.parametrize("name", sorted(task_environment.RESERVED_ENV))
def test_every_reserved_name_is_refused_at_submit(name: str) -> None:
    with pytest.raises(ValidationError, match=f"{name} is set by mwms for each task"):
        submit({name: "mine"})


@pytest.mark.parametrize("name", sorted(task_environment.SPEC_ENV))
def test_spec_names_are_refused_naming_the_spec_field(name: str) -> None:
    with pytest.raises(ValidationError, match=f"set {task_environment.SPEC_ENV[name]} instead"):
        submit({name: "1"})


def test_one_refusal_names_every_reserved_name() -> None:
    with pytest.raises(ValidationError) as refused:
        submit({"TMPDIR": "/tmp", "PYTHONUNBUFFERED": "0", "MWMS_COMMUNICATION": "RING", "OK": "1"})
    (error,) = refused.value.errors()
    assert error["msg"] == (
        "Value error, PYTHONUNBUFFERED, TMPDIR are set by mwms for each task and cannot be overridden; "
        "MWMS_COMMUNICATION comes from the job spec: set communication.implementation instead"
    )


@pytest.mark.parametrize(
    "name", ["TF_USE_LEGACY_KERAS", "PYTHONPATH", "MWMS_REPORT_TIMEOUT_S", "MWMS_PREFLIGHT_TCP_MB", "tmpdir"]
)
def test_defaulted_merged_runtime_and_other_names_are_the_jobs(name: str) -> None:
    assert submit({name: "x"}).env == {name: "x"}


def test_refused_names_edge_values() -> None:
    assert task_environment.refused_names([]) is None
    assert task_environment.refused_names({"PATH": "/bin"}) is None
    assert (
        task_environment.refused_names(["HOME"])
        == "HOME is set by mwms for each task and cannot be overridden"
    )
    # Case matters: environment names are case-sensitive, and "home" is not the agent's.
    assert task_environment.refused_names(["home", "Tmpdir"]) is None


def test_the_coordinator_derives_exactly_the_spec_names() -> None:
    job = SimpleNamespace(
        env={"MINE": "1"},
        options={
            "communication": {"implementation": "RING", "timeout_seconds": 30.0, "bytes_per_pack": 4},
            "preemption_grace_seconds": 20,
        },
    )
    env = job_env(job)  # type: ignore[arg-type]
    assert set(env) - {"MINE"} == set(task_environment.SPEC_ENV)


def test_the_stack_handler_spells_the_contracts_variable() -> None:
    # sitecustomize.py runs inside the user's program and imports nothing of mwms: its literal is tied here.
    tree = ast.parse(SITECUSTOMIZE.read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert not imported & {"mwms", "mwms_runtime", "worker_agent"}, imported
    environ_reads = [
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ]
    assert environ_reads == [task_environment.STACKS_DIR]


def test_the_runtime_reads_what_the_agent_sets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from mwms_runtime.env import context

    values = {
        task_environment.JOB_ID: "job-7",
        task_environment.ATTEMPT: "3",
        task_environment.TASK_INDEX: "1",
        task_environment.NUM_WORKERS: "2",
        task_environment.OUTPUT_DIR: str(tmp_path / "out"),
        task_environment.CHECKPOINT_DIR: str(tmp_path / "ckpt"),
        task_environment.METRICS_FILE: str(tmp_path / "m.jsonl"),
        task_environment.NUM_GPUS: "0",
        task_environment.TF_CONFIG: json.dumps(
            {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
        ),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    ctx = context()
    assert (ctx.job_id, ctx.attempt, ctx.task_index, ctx.num_workers, ctx.is_chief) == (
        "job-7",
        3,
        1,
        2,
        False,
    )
    assert (ctx.output_dir, ctx.checkpoint_dir) == (str(tmp_path / "out"), str(tmp_path / "ckpt"))
    assert (ctx.metrics_file, ctx.num_gpus, ctx.in_job) == (str(tmp_path / "m.jsonl"), 0, True)


def test_importing_the_runtime_applies_the_agents_defaults() -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in task_environment.DEFAULTED_ENV}
    code = "import json, os, mwms_runtime; print(json.dumps({k: os.environ.get(k) for k in %r}))"
    out = subprocess.run(
        [sys.executable, "-c", code % sorted(task_environment.DEFAULTED_ENV)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out) == task_environment.DEFAULTED_ENV
