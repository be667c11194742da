"""The wheel is the product: the sdist and the wheel built from it the way an operator's pip builds them,
installed with the server extra into a fresh virtual environment (dependencies from the package index,
none from this checkout). From there the coordinator serves the dashboard and the API, and no generic
top-level package (`server`, `worker_agent`) lands in site-packages. And the tree names its packages
only as mwms.server / mwms.worker_agent (scripts/rename_namespace.py finds nothing left to rewrite)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from mwms_testkit import REPO
from mwms_testkit.cluster import Process, read_ports_file, wait_until

REPO = REPO
INSTALL_TIMEOUT_S = 600  # a fresh venv fetches the server extra's dependencies from the package index
ADMIN_TOKEN = "packaging-test-admin-token-0123456789"


def clean_environment(venv: Path | None = None) -> dict[str, str]:
    """This process's environment without anything that points Python at the checkout or its venv."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(venv)
    return env


def run(argv: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    """Runs argv; on failure the assertion shows its output."""
    result = subprocess.run(
        argv, cwd=cwd, env=env or clean_environment(), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{argv} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@dataclass
class Installed:
    sdist: Path
    wheel: Path
    venv: Path
    site_packages: Path
    work: Path  # a folder outside the checkout, the installed programs' working directory


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The sdist (setuptools' build hook, as a PEP 517 frontend calls it), the wheel pip builds from the
    unpacked sdist (so a file missing from the sdist fails here), and a fresh venv holding that wheel with
    the server extra."""
    root = tmp_path_factory.mktemp("packaging")
    dist = root / "dist"
    dist.mkdir()
    hook = f"from setuptools import build_meta; print(build_meta.build_sdist({str(dist)!r}))"
    sdist = dist / run([sys.executable, "-c", hook], cwd=REPO, timeout=120).strip().splitlines()[-1]
    with tarfile.open(sdist) as archive:
        archive.extractall(root / "unpacked", filter="data")
    (source,) = (root / "unpacked").iterdir()
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(source)],
        root,
        300,
    )
    (wheel,) = dist.glob("mwms-*.whl")
    venv = root / "venv"
    run([sys.executable, "-m", "venv", str(venv)], root, 120)
    python = str(venv / "bin" / "python")
    run(
        [python, "-m", "pip", "install", "--quiet", "--no-compile", f"{wheel}[server]"],
        root,
        INSTALL_TIMEOUT_S,
    )
    site_packages = Path(
        run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], root, 60).strip()
    )
    work = root / "work"
    work.mkdir()
    yield Installed(sdist=sdist, wheel=wheel, venv=venv, site_packages=site_packages, work=work)
    shutil.rmtree(venv)  # 2-3 GB with the agent extra; pytest keeps the last runs' temporary folders


def test_the_tree_names_the_packages_only_under_mwms() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "rename_namespace.py"), "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "", (
        "these files import or name `server`/`worker_agent` as top-level packages; "
        f"run scripts/rename_namespace.py:\n{result.stdout}"
    )


@pytest.mark.e2e
def test_the_wheel_installs_only_names_of_ours(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
        top_level = wheel.read(next(n for n in names if n.endswith(".dist-info/top_level.txt"))).decode()
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert sorted(top_level.split()) == ["mwms", "mwms_runtime"]
    assert {name.split("/")[0] for name in names} == {"mwms", "mwms_runtime", "mwms-0.1.0.dist-info"}
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    for shipped in (
        "mwms/web/index.html",
        "mwms/web/js/app.js",
        "mwms/examples/keras_fit/train.py",
        "mwms/server/db/migrations/env.py",
        "mwms/server/db/migrations/versions/0001_initial_schema.py",
        "mwms/worker_agent/stack_handler/sitecustomize.py",
        "mwms/v1/agent_pb2.pyi",
        "mwms/py.typed",
    ):
        assert shipped in names, f"{shipped} is not in {installed.wheel.name}"
    for generic in ("server", "worker_agent", "web", "examples"):
        assert not (installed.site_packages / generic).exists(), f"site-packages/{generic} was installed"
    # The agent's own modules need the agent extra (numpy, TensorFlow); its package and config do not.
    code = "import mwms.server.app, mwms.worker_agent.config; print(mwms.server.app.__file__)"
    where = run([str(installed.venv / "bin" / "python"), "-c", code], installed.work, 120).strip()
    assert Path(where).is_relative_to(installed.site_packages), where


@pytest.fixture
def installed_coordinator(installed: Installed, tmp_path: Path) -> Iterator[str]:
    """`mwms server` of the fresh venv on ports it picks, run from a folder outside the checkout; its URL."""
    ports_file = tmp_path / "ports.json"
    log_path = tmp_path / "server.log"
    argv = [str(installed.venv / "bin" / "mwms"), "server", "--http-port", "0", "--grpc-port", "0"]
    argv += ["--data-dir", str(tmp_path / "data"), "--ports-file", str(ports_file)]
    env = clean_environment(installed.venv) | {"MWMS_ADMIN_TOKEN": ADMIN_TOKEN, "PYTHONUNBUFFERED": "1"}
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            argv, cwd=installed.work, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = Process("server", popen, log_path)
    try:

        def ports_written() -> dict[str, int] | None:
            if popen.poll() is not None:
                raise AssertionError(f"the installed coordinator exited:\n{server.log_tail()}")
            return read_ports_file(ports_file)

        ports = wait_until(ports_written, 60, "the coordinator's ports file", observed=server.log_tail)
        url = f"http://127.0.0.1:{ports['http']}"

        def healthy() -> bool:
            try:
                return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 60, "the installed coordinator's /healthz", observed=server.log_tail)
        yield url
    finally:
        server.stop()


@pytest.mark.e2e
def test_the_installed_coordinator_serves_the_dashboard_and_the_api(installed_coordinator: str) -> None:
    with httpx.Client(base_url=installed_coordinator, timeout=10) as http:
        index = http.get("/")
        assert index.status_code == 200, index.text
        assert index.headers["content-type"].startswith("text/html")
        assert "<html" in index.text.lower() and "/static/" in index.text
        script = http.get("/static/js/app.js")
        assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
        agents = http.get("/api/v1/agents", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert agents.status_code == 200, agents.text  # the API on a database the shipped migrations made
        assert http.get("/api/v1/agents").status_code == 401


@pytest.mark.e2e
def test_quickstart_runs_from_the_installed_wheel(installed: Installed, tmp_path: Path) -> None:
    # The example trains with TensorFlow on the agents: the agent extra comes on top of the server one.
    python = str(installed.venv / "bin" / "python")
    run(
        [python, "-m", "pip", "install", "--quiet", "--no-compile", f"{installed.wheel}[server,agent]"],
        tmp_path,
        INSTALL_TIMEOUT_S,
    )
    data_dir = tmp_path / "quickstart"
    argv = [str(installed.venv / "bin" / "mwms"), "quickstart", "--data-dir", str(data_dir)]
    argv += ["--epochs", "1", "--steps-per-epoch", "5"]
    result = subprocess.run(
        argv,
        cwd=installed.work,
        env=clean_environment(installed.venv),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"mwms quickstart exited {result.returncode}:\n{output}"
    assert "ended SUCCEEDED" in result.stdout, output
    assert any((data_dir / "artifacts").iterdir()), output
