"""A task that fails on a missing module hears which module, and where the job should add it."""

from __future__ import annotations

from pathlib import Path

from mwms.v1 import agent_pb2
from mwms.worker_agent.environments import Environment
from mwms.worker_agent.import_failures import explain, missing_module
from mwms.worker_agent.task_env import TaskPaths
from mwms.worker_agent.task_record import TaskRecord


def _environment(extends: tuple[str, ...]) -> Environment:
    return Environment("k" * 32, Path("/envs/k"), Path("/envs/k/bin/python"), False, 0.0, extends=extends)


def test_the_last_line_of_a_traceback_names_the_module() -> None:
    assert missing_module("ModuleNotFoundError: No module named 'tensorflow'") == "tensorflow"
    assert (
        missing_module("ModuleNotFoundError: No module named 'sklearn.linear_model'")
        == "sklearn.linear_model"
    )
    assert missing_module("ImportError: cannot import name 'x' from 'y'") is None
    assert missing_module("print('ModuleNotFoundError: No module named')") is None


def test_the_reason_says_where_the_module_was_looked_for() -> None:
    isolated = explain("tensorflow", _environment(()))
    assert "could not import 'tensorflow'" in isolated and "isolated" in isolated
    assert "without --isolated-env" in isolated
    extended = explain("tabulate", _environment(("/agent/site-packages",)))
    assert "neither the job's environment nor the agents' runtime" in extended
    agents_own = explain("tabulate", None)
    assert "the agents' runtime does not have" in agents_own and "--requirements" in agents_own


def test_a_task_record_keeps_the_module_its_own_output_reported(tmp_path: Path) -> None:
    start = agent_pb2.StartTask(task_id="t1", job_id="j1")
    record = TaskRecord(start, TaskPaths.for_task(tmp_path, start), tmp_path / "outbox")
    record.add_log("stderr", "ModuleNotFoundError: No module named 'notes'")  # an agent note, not the task
    assert record.missing_module is None
    record.add_log("stderr", "Traceback (most recent call last):", redraw=False)
    record.add_log("stderr", "ModuleNotFoundError: No module named 'tabulate'", redraw=False)
    assert record.missing_module == "tabulate"
