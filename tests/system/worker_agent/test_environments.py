"""The agent's cache of the jobs' Python environments, built with the real uv from the real package index:
one build per key however many tasks ask, a sealed tree that runs the lock and mwms_runtime over the
agent's own packages (or, isolated, nothing of the agent), the job's mistakes told apart from the
network's, and least recently used eviction that spares environments in use."""

from __future__ import annotations

import importlib.metadata
import io
import logging
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mwms.worker_agent import environments
from mwms.worker_agent.environments import EnvironmentBuildError, EnvironmentCache, EnvironmentSpec

UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


def compiled(requirements: str) -> str | None:
    """`uv pip compile --universal` of `requirements`, as a job's submit makes its lock; None offline."""
    if UV is None:
        return None
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "requirements.in").write_text(requirements)
        command = [UV, "pip", "compile", "--universal", "--quiet", "requirements.in", "-o", "lock.txt"]
        try:
            done = subprocess.run(command, cwd=directory, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            return None
        return (Path(directory) / "lock.txt").read_text() if done.returncode == 0 else None


LOCK = compiled("tabulate==0.9.0\n")
if LOCK is None:
    pytest.skip(
        "uv cannot resolve tabulate from the package index (no uv, or no network)", allow_module_level=True
    )
assert LOCK is not None
SPEC = EnvironmentSpec(LOCK)
ISOLATED = EnvironmentSpec(LOCK, isolated=True)
OTHER = EnvironmentSpec(LOCK.replace("tabulate==0.9.0", "tabulate==0.8.10"))


def ignore(_line: str) -> None:
    pass


@pytest.fixture
def counting_uv(tmp_path: Path) -> tuple[str, Path]:
    """A uv that notes each command's first word in a file, then runs the real uv."""
    calls = tmp_path / "uv-calls"
    script = tmp_path / "uv"
    script.write_text(
        f'#!/bin/sh\necho "$1" >> {shlex.quote(str(calls))}\nexec {shlex.quote(str(UV))} "$@"\n'
    )
    script.chmod(0o755)
    return str(script), calls


def fake_uv(tmp_path: Path, pip_output: str) -> str:
    """A uv whose `venv` is the real one and whose `pip` prints `pip_output` and fails."""
    script = tmp_path / "fake-uv"
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = venv ]; then exec {shlex.quote(str(UV))} "$@"; fi\n'
        f"cat <<'EOF'\n{pip_output}\nEOF\nexit 2\n"
    )
    script.chmod(0o755)
    return str(script)


def run_in(python: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`code` run by `python` as a task would: no PYTHONPATH, started elsewhere than the repository (and
    writing no bytecode: these tests run as root, whom the sealed tree's modes do not stop)."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith("PYTHON")}
    clean["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        [str(python), "-c", code], cwd=cwd, env=clean, capture_output=True, text=True, timeout=60
    )


def keys(cache: EnvironmentCache) -> list[str]:
    return sorted(key for key, _, _ in cache.entries())


def test_an_isolated_environment_runs_its_lock_and_the_runtime_and_nothing_of_the_agent(
    tmp_path: Path,
) -> None:
    cache = EnvironmentCache(tmp_path / "cache", 0)
    lines: list[str] = []
    env = cache.acquire(ISOLATED, lines.append)

    assert env.built and env.build_seconds > 0 and env.python == env.prefix / "bin" / "python"
    assert env.extends == ()
    assert any("tabulate==0.9.0" in line for line in lines)  # uv's own lines, as they came
    assert lines[-1].startswith(f"environment {env.key[:12]} built in ") and lines[-1].endswith(
        ": 1 packages (isolated)"
    )

    modes = {}
    for directory, dirnames, filenames in os.walk(env.prefix):
        for name in [*dirnames, *filenames]:
            info = os.lstat(os.path.join(directory, name))
            if not stat.S_ISLNK(info.st_mode):
                modes[os.path.join(directory, name)] = stat.S_IMODE(info.st_mode)
    modes[str(env.prefix)] = stat.S_IMODE(env.prefix.stat().st_mode)
    assert [path for path, mode in modes.items() if mode & 0o222] == []  # nobody may change it
    assert [path for path, mode in modes.items() if mode & 0o004 != 0o004] == []  # every uid may read it
    assert modes[str(env.prefix / "bin" / "tabulate")] == 0o555

    code = "import tabulate, mwms.task_environment, mwms.metrics_line; print(tabulate.__version__)"
    ran = run_in(env.python, code, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "0.9.0"
    # Compiled ahead by the agent: tasks cannot write bytecode into the sealed tree.
    assert list(env.prefix.glob("lib/python*/site-packages/tabulate/__pycache__/*.pyc"))
    for module in ("mwms.client", "mwms.worker_agent", "mwms.server", "grpc", "numpy", "tensorflow"):
        refused = run_in(env.python, f"import {module}", tmp_path)
        assert "ModuleNotFoundError" in refused.stderr, (module, refused.stdout, refused.stderr)
    shared = run_in(env.python, "import mwms, os; print(sorted(os.listdir(mwms.__path__[0])))", tmp_path)
    assert shared.stdout.strip() == str(
        ["__init__.py", "__pycache__", "metrics_line.py", "preflight_contract.py", "task_environment.py"]
    )
    [(key, size, _)] = cache.entries()
    assert key == env.key and size > 100_000
    cache.release(env)


def test_an_environment_extends_the_agents_runtime_with_the_locks_pins_first(tmp_path: Path) -> None:
    # termcolor is in the agent's environment (TensorFlow needs it) at another version than the lock's.
    agent_termcolor = importlib.metadata.version("termcolor")
    lock = compiled("tabulate==0.9.0\ntermcolor==2.4.0\n")
    assert lock is not None and agent_termcolor != "2.4.0"
    cache = EnvironmentCache(tmp_path / "cache", 0)
    lines: list[str] = []
    env = cache.acquire(EnvironmentSpec(lock), lines.append)

    assert lines[-1].endswith("packages (extends the agent's runtime)"), lines[-1]
    assert env.extends and all(Path(directory).is_dir() for directory in env.extends)
    code = (
        "import importlib.metadata as m, importlib.util as u, tabulate, termcolor, numpy, mwms_runtime\n"
        "print(tabulate.__version__, m.version('termcolor'), numpy.__version__)\n"
        "print(u.find_spec('tensorflow').origin)\n"
        "print(u.find_spec('tf_keras').origin)\n"
        "print(u.find_spec('mwms.client'))"
    )
    ran = run_in(env.python, code, tmp_path)
    assert ran.returncode == 0, ran.stderr
    versions, tensorflow, tf_keras, client = ran.stdout.split("\n")[:4]
    assert versions == f"0.9.0 2.4.0 {importlib.metadata.version('numpy')}"  # the lock's pin first
    assert any(tensorflow.startswith(directory) for directory in env.extends), tensorflow
    assert any(tf_keras.startswith(directory) for directory in env.extends), tf_keras
    assert client == "None"  # mwms's own packages stay out: the runtime's share of mwms comes first
    # The same again from the cache knows what it extends.
    cache.release(env)
    again = cache.acquire(EnvironmentSpec(lock), ignore)
    assert not again.built and again.extends == env.extends
    cache.release(again)


def test_a_second_acquire_reuses_the_environment_without_running_uv(
    tmp_path: Path, counting_uv: tuple[str, Path]
) -> None:
    uv, calls = counting_uv
    cache = EnvironmentCache(tmp_path / "cache", 0, uv=uv)
    first = cache.acquire(SPEC, ignore)
    cache.release(first)
    assert calls.read_text().split() == ["venv", "pip"]

    lines: list[str] = []
    again = EnvironmentCache(tmp_path / "cache", 0, uv=uv).acquire(SPEC, lines.append)  # another agent too

    assert (again.built, again.build_seconds, again.prefix) == (False, 0.0, first.prefix)
    assert lines == [f"environment {first.key[:12]} ready from the cache (no install)"]
    assert calls.read_text().split() == ["venv", "pip"]


def test_concurrent_acquires_of_one_spec_build_it_once(tmp_path: Path, counting_uv: tuple[str, Path]) -> None:
    uv, calls = counting_uv
    caches = [EnvironmentCache(tmp_path / "cache", 0, uv=uv) for _ in range(3)]  # as three agents would

    with ThreadPoolExecutor(len(caches)) as pool:
        envs = list(pool.map(lambda cache: cache.acquire(SPEC, ignore), caches))

    assert calls.read_text().split() == ["venv", "pip"]
    assert sorted(env.built for env in envs) == [False, False, True]
    assert len({env.prefix for env in envs}) == 1


def test_an_incomplete_leftover_is_built_again(tmp_path: Path) -> None:
    leftover = tmp_path / "cache" / "envs" / SPEC.key()
    (leftover / "lib").mkdir(parents=True)
    (leftover / "lib" / "half-written").write_text("")
    for path in (leftover / "lib", leftover):
        path.chmod(0o555)
    cache = EnvironmentCache(tmp_path / "cache", 0)

    env = cache.acquire(SPEC, ignore)

    assert env.built and not (leftover / "lib" / "half-written").exists()
    assert keys(cache) == [env.key]


def test_a_misspelled_package_is_the_jobs_to_fix(tmp_path: Path) -> None:
    cache = EnvironmentCache(tmp_path / "cache", 0)

    with pytest.raises(EnvironmentBuildError) as caught:
        cache.acquire(EnvironmentSpec("tabulatezzzq==1.0\n"), ignore)

    assert not caught.value.retryable
    assert caught.value.message.startswith("could not build the job's Python environment: ")
    assert "tabulatezzzq" in caught.value.message
    assert cache.entries() == [] and list((tmp_path / "cache" / "envs").iterdir()) == []


def test_a_network_failure_may_be_retried(tmp_path: Path) -> None:
    output = (
        "Using Python 3.11.7 environment at: somewhere\n"
        "error: Failed to fetch: `https://pypi.org/simple/tabulate/`\n"
        "  Caused by: error sending request for url (https://pypi.org/simple/tabulate/)\n"
        "  Caused by: dns error: failed to lookup address information"
    )
    cache = EnvironmentCache(tmp_path / "cache", 0, uv=fake_uv(tmp_path, output))

    with pytest.raises(EnvironmentBuildError) as caught:
        cache.acquire(SPEC, ignore)

    assert caught.value.retryable
    assert "Failed to fetch: `https://pypi.org/simple/tabulate/`" in caught.value.message
    assert "Using Python" not in caught.value.message


def test_the_runtime_imports_where_the_lock_brings_numpy(tmp_path: Path) -> None:
    # mwms_runtime needs numpy (TensorFlow brings it); a lock without it builds all the same.
    lock = compiled("numpy>=2,<3\n")
    assert lock is not None
    cache = EnvironmentCache(tmp_path / "cache", 0)
    env = cache.acquire(EnvironmentSpec(lock), ignore)
    ran = run_in(env.python, "import mwms_runtime, numpy; print(mwms_runtime.context().task_index)", tmp_path)
    assert ran.returncode == 0, ran.stderr
    cache.release(env)


def _wheel(directory: Path, name: str, files: dict[str, str]) -> Path:
    """A minimal wheel of `name` 1.0 holding `files` (as a package index would serve it)."""
    dist = f"{name}-1.0.dist-info"
    contents = {
        **files,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in contents) + f"{dist}/RECORD,,\n"
    path = directory / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in {**contents, f"{dist}/RECORD": record}.items():
            archive.writestr(member, text)
    return path


def test_nothing_of_the_jobs_runs_as_the_agent_while_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A package whose .pth file runs code at every interpreter start, and one that is a source
    # distribution only (its setup.py would run to build it): the agent runs neither.
    index = tmp_path / "index"
    index.mkdir()
    ran = tmp_path / "ran-as-agent"
    payload = f"import pathlib; pathlib.Path({str(ran)!r}).write_text('pth')\n"
    _wheel(index, "startuphook", {"startuphook.pth": payload, "startuphook_mod.py": "X = 1\n"})
    with tarfile.open(index / "sdistonly-1.0.tar.gz", "w:gz") as archive:
        setup = f"import pathlib; pathlib.Path({str(ran)!r}).write_text('setup')\nfrom setuptools import setup; setup()\n"
        for member, text in {
            "sdistonly-1.0/setup.py": setup,
            "sdistonly-1.0/PKG-INFO": "Name: sdistonly\nVersion: 1.0\n",
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(member)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    monkeypatch.setenv("UV_FIND_LINKS", str(index))
    cache = EnvironmentCache(tmp_path / "cache", 0)

    env = cache.acquire(EnvironmentSpec("startuphook==1.0\n"), ignore)
    assert not ran.exists(), ran.read_text()  # built and compiled without starting its interpreter
    assert list(env.prefix.glob("lib/python*/site-packages/__pycache__/startuphook_mod*.pyc"))
    cache.release(env)

    with pytest.raises(EnvironmentBuildError) as caught:
        cache.acquire(EnvironmentSpec("sdistonly==1.0\n"), ignore)
    assert not ran.exists(), ran.read_text()
    assert not caught.value.retryable
    assert "sdistonly" in caught.value.message and "--env-source-builds" in caught.value.message


def test_eviction_removes_the_least_recently_used_environment_no_one_holds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = EnvironmentCache(tmp_path / "released", max_bytes=1)
    first = cache.acquire(SPEC, ignore)
    cache.release(first)
    with caplog.at_level(logging.INFO, logger="mwms.agent.environments"):
        second = cache.acquire(OTHER, ignore)
    assert keys(cache) == [second.key]  # the one just built stays, over the limit as it is
    assert not first.prefix.exists()
    assert f"evicted environment {first.key[:12]}" in caplog.text

    holder = EnvironmentCache(tmp_path / "held", max_bytes=1)  # another agent process, still using it
    held = holder.acquire(SPEC, ignore)
    built = EnvironmentCache(tmp_path / "held", max_bytes=1).acquire(OTHER, ignore)
    assert keys(holder) == sorted([held.key, built.key])
    holder.release(held)


def test_the_key_follows_the_lock_and_the_python_not_the_comments() -> None:
    base = EnvironmentSpec("tabulate==0.9.0\nnumpy==2.4.6 ; python_full_version < '3.12'\n")
    commented = EnvironmentSpec(
        "# autogenerated by uv\ntabulate==0.9.0   \n    # via -r requirements.in\n\n"
        "numpy==2.4.6 ; python_full_version < '3.12'\n"
    )

    assert len(base.key()) == 32 and int(base.key(), 16) >= 0
    assert commented.key() == base.key()
    assert EnvironmentSpec(base.locked.replace("0.9.0", "0.8.10")).key() != base.key()
    assert EnvironmentSpec(base.locked, python="3.11").key() != base.key()
    assert EnvironmentSpec(base.locked, python="3.12").key() != EnvironmentSpec(base.locked, "3.11").key()
    assert EnvironmentSpec(base.locked, isolated=True).key() != base.key()


def test_the_key_follows_the_agents_own_packages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec, isolated = EnvironmentSpec("tabulate==0.9.0\n"), EnvironmentSpec("tabulate==0.9.0\n", isolated=True)
    site_packages = tmp_path / "site-packages"
    (site_packages / "tensorflow-2.21.0.dist-info").mkdir(parents=True)
    monkeypatch.setattr(environments.site, "getsitepackages", lambda: [str(site_packages)])
    before, isolated_before = spec.key(), isolated.key()
    (site_packages / "tensorflow-2.21.0.dist-info").rename(site_packages / "tensorflow-2.22.0.dist-info")

    assert spec.key() != before  # an agent whose TensorFlow was upgraded builds anew
    assert isolated.key() == isolated_before  # an isolated environment holds nothing of it


def test_a_python_uv_cannot_find_is_the_jobs_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "never")
    cache = EnvironmentCache(tmp_path / "cache", 0)

    with pytest.raises(EnvironmentBuildError) as caught:
        cache.acquire(EnvironmentSpec(LOCK, python="3.2"), ignore)

    assert not caught.value.retryable
    assert "Python '3.2'" in caught.value.message and "installed on the agents" in caught.value.message
    assert cache.entries() == []


def test_a_build_over_its_time_is_stopped(tmp_path: Path) -> None:
    cache = EnvironmentCache(tmp_path / "cache", 0, build_timeout_s=0.05)

    with pytest.raises(EnvironmentBuildError) as caught:
        cache.acquire(SPEC, ignore)

    assert not caught.value.retryable and "--env-build-timeout" in caught.value.message
    assert list((tmp_path / "cache" / "envs").iterdir()) == []


def test_an_agent_without_uv_says_to_install_it(tmp_path: Path) -> None:
    cache = EnvironmentCache(tmp_path / "cache", 0, uv=str(tmp_path / "no-uv-here"))

    with pytest.raises(EnvironmentBuildError) as caught:
        cache.acquire(SPEC, ignore)

    assert not caught.value.retryable and "pip install uv" in caught.value.message
