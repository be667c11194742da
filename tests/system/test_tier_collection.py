"""A test that starts processes outside tests/system fails the collection, naming the file and where it
belongs; one outside every tier too. pytest runs, as a process, on a copy of the suite's conftest.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from mwms_testkit import REPO


def collect(tests: Path) -> subprocess.CompletedProcess[str]:
    shutil.copy(REPO / "tests" / "conftest.py", tests / "conftest.py")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", str(tests)],
        cwd=tests.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


def write(path: Path, source: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)


def test_a_unit_test_that_runs_a_program_fails_the_collection(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    write(tests / "unit" / "test_fine.py", "def test_fine():\n    assert 1 + 1 == 2\n")
    write(
        tests / "unit" / "test_runs.py",
        "import subprocess\n\ndef test_runs():\n    subprocess.run(['true'])\n",
    )
    write(tests / "integration" / "test_cluster.py", "def test_c(cluster):\n    pass\n")
    write(tests / "test_nowhere.py", "def test_n():\n    pass\n")
    result = collect(tests)
    assert result.returncode == 4, result.stdout + result.stderr
    out = result.stdout + result.stderr
    assert "tests/unit/test_runs.py imports subprocess (runs programs): move it to tests/system" in out
    assert "test_cluster.py::test_c uses the 'cluster' fixture, which starts processes" in out
    assert "tests/test_nowhere.py: a test lives in tests/unit, tests/integration or tests/system" in out
    assert "test_fine" not in out.split("tests in the wrong tier")[1]


def test_the_same_test_in_the_system_tier_is_collected(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    write(
        tests / "system" / "test_runs.py",
        "import subprocess\n\ndef test_runs():\n    subprocess.run(['true'])\n",
    )
    result = collect(tests)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 test collected" in result.stdout
