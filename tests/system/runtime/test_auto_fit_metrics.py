"""fit's logs become metrics without code changes: the agent's task hook adds MetricsCallback to tf_keras fit.

Real processes with the agent's PYTHONPATH entry (worker_agent/stack_handler: its sitecustomize loads the
hook) and real tf_keras; plus the callback-list rule and the hook's contract with the task environment.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mwms import task_environment
from mwms_runtime.auto_fit_metrics import with_metrics_callback
from mwms_testkit import PROGRAMS, REPO
from mwms_testkit.runtime_cluster import read_metrics, task_env

HOOK_DIR = REPO / "worker_agent" / "stack_handler"
HOOK = HOOK_DIR / "_mwms_fit_metrics.py"


def _run(tmp_path: Path, *argv: str, python_path: str = "", **extra: str) -> subprocess.CompletedProcess:
    env = task_env(tmp_path, 0, 1, None, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOK_DIR), python_path) if p)
    return subprocess.run(
        [sys.executable, str(PROGRAMS / "fit_unchanged.py"), *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _steps(tmp_path: Path) -> dict[str, list[int]]:
    steps: dict[str, list[int]] = {}
    for line in read_metrics(tmp_path / "metrics-0.jsonl"):
        steps.setdefault(line["name"], []).append(line["step"])
    return steps


@pytest.mark.tf
def test_fit_without_any_mwms_code_reports_its_logs(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CALLBACKS MetricsCallback" in done.stdout, done.stdout + done.stderr[-2000:]
    steps = _steps(tmp_path)
    # 16 examples in batches of 4, 2 epochs: steps 1..8 per step, epochs 0 and 1 on their own axis.
    assert steps["loss"] == list(range(1, 9))
    assert steps["epoch_loss"] == [0, 1]
    assert not [line for line in done.stderr.splitlines() if line.startswith(("mwms: ", "mwms_runtime: "))]


@pytest.mark.tf
def test_a_program_that_adds_the_callback_itself_gets_only_its_own(tmp_path: Path) -> None:
    done = _run(tmp_path, "own")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("CALLBACKS ")[1].split() == ["MetricsCallback"]
    assert _steps(tmp_path)["loss"] == [2, 4, 6, 8]  # every_n_batches=2, not also every batch


@pytest.mark.tf
def test_the_opt_out_leaves_fit_alone(tmp_path: Path) -> None:
    done = _run(tmp_path, MWMS_AUTO_METRICS="0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CALLBACKS \n" in done.stdout or done.stdout.rstrip().endswith("CALLBACKS"), done.stdout
    assert read_metrics(tmp_path / "metrics-0.jsonl") == []


@pytest.mark.tf
def test_a_failing_hook_says_so_in_one_line_and_the_program_runs_on(tmp_path: Path) -> None:
    # An interpreter whose mwms_runtime cannot be imported (here: one that raises on import).
    broken = tmp_path / "broken"
    (broken / "mwms_runtime").mkdir(parents=True)
    (broken / "mwms_runtime" / "__init__.py").write_text("raise ImportError('this mwms_runtime is broken')\n")
    done = _run(tmp_path, python_path=str(broken))
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("mwms: ")]
    assert len(said) == 1, done.stderr[-3000:]
    assert "not recorded as metrics" in said[0] and "this mwms_runtime is broken" in said[0]
    assert "CALLBACKS \n" in done.stdout or done.stdout.rstrip().endswith("CALLBACKS"), done.stdout


class Callback:
    pass


class MetricsCallbackLike(Callback):
    pass


def test_the_callback_is_added_once_and_a_built_list_is_left_alone() -> None:
    assert [type(c) for c in with_metrics_callback(None, MetricsCallbackLike)] == [MetricsCallbackLike]
    mine = Callback()
    added = with_metrics_callback([mine], MetricsCallbackLike)
    assert added[0] is mine and isinstance(added[1], MetricsCallbackLike) and len(added) == 2
    assert len(with_metrics_callback((mine,), MetricsCallbackLike)) == 2
    own = [mine, MetricsCallbackLike()]
    assert with_metrics_callback(own, MetricsCallbackLike) is own
    built = object()  # e.g. a CallbackList the program made: its own business
    assert with_metrics_callback(built, MetricsCallbackLike) is built


def test_the_hook_spells_the_contracts_variables_and_imports_nothing_of_mwms_at_start() -> None:
    tree = ast.parse(HOOK.read_text())
    top_level_imports = {
        alias.name.split(".")[0]
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert not top_level_imports & {"mwms", "mwms_runtime", "worker_agent", "tensorflow", "tf_keras"}
    constants = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }
    assert constants["ENABLE_ENV"] == task_environment.AUTO_METRICS
    assert constants["METRICS_FILE_ENV"] == task_environment.METRICS_FILE
