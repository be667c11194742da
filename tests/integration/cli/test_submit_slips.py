"""`mwms submit` slips answered before anything is uploaded, each with one sentence that says what to do:
the program's options given without `--`, and a command given as one quoted string. Against the real
HTTP fake of the API, so nothing reaching it is checked too."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mwms.cli.main import app
from mwms.cli.parsing import corrected_submit_line
from mwms_testkit.fake_api import FakeState

runner = CliRunner()
OPTIONS = [(["--workers", "-n"], True), (["--wait"], False), (["--env", "-e"], True), (["--api"], True)]


@pytest.fixture
def program(tmp_path: Path) -> Path:
    directory = tmp_path / "my program"
    directory.mkdir()
    (directory / "train.py").write_text("print('training')\n")
    return directory


def test_the_programs_options_without_dashes_get_the_corrected_line(
    fake_api: tuple[str, FakeState], program: Path
) -> None:
    api, state = fake_api
    args = ["submit", str(program), "--workers", "2", "--api", api, "python", "train.py", "--epochs", "1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    corrected = shlex.join(
        [
            "mwms",
            "submit",
            str(program),
            "--workers",
            "2",
            "--api",
            api,
            "--",
            "python",
            "train.py",
            "--epochs",
            "1",
        ]
    )
    assert (
        "Error: --epochs is not an option of mwms submit: options for the program go after --, e.g.\n"
        f"  {corrected}"
    ) in " ".join(result.output.split(" "))
    assert state.bundles == {} and state.jobs == {}


def test_a_program_file_given_as_the_directory_gets_the_corrected_line(program: Path) -> None:
    result = runner.invoke(app, ["submit", str(program / "train.py"), "--epochs", "1"])
    assert result.exit_code == 2, result.output
    corrected = shlex.join(
        ["mwms", "submit", str(program), "--workers", "1", "--", "python", "train.py", "--epochs", "1"]
    )
    assert f"options for the program go after --, e.g.\n  {corrected}" in result.output


def test_an_unknown_option_before_the_program_gets_an_example() -> None:
    result = runner.invoke(app, ["submit", ".", "--epochs", "1", "python", "train.py"])
    assert result.exit_code == 2
    assert (
        "--epochs is not an option of mwms submit: options for the program go after --, e.g.\n"
        "  mwms submit . --workers 2 -- python train.py --epochs 1"
    ) in result.output


@pytest.mark.parametrize(
    ("args", "corrected"),
    [
        ([".", "-n", "2", "python", "t.py", "--lr=1"], [".", "-n", "2", "--", "python", "t.py", "--lr=1"]),
        (
            [".", "-n2", "--wait", "python", "t.py", "-x"],
            [".", "-n2", "--wait", "--", "python", "t.py", "-x"],
        ),
        # An option of submit's after the program, before the first unknown one, stays submit's (as parsed).
        (
            [".", "python", "t.py", "--workers=3", "--steps", "--wait"],
            [".", "--workers=3", "--", "python", "t.py", "--steps", "--wait"],
        ),
        ([".", "python", "t.py", "-v"], [".", "--workers", "1", "--", "python", "t.py", "-v"]),
        ([".", "--epochs", "1"], None),  # where the program starts cannot be told
        ([".", "-n", "2", "--", "python", "t.py"], None),
    ],
)
def test_corrected_submit_line(args: list[str], corrected: list[str] | None) -> None:
    assert corrected_submit_line(args, OPTIONS) == corrected


def test_a_command_given_as_one_string_is_refused_with_its_words(
    fake_api: tuple[str, FakeState], program: Path
) -> None:
    api, state = fake_api
    result = runner.invoke(
        app, ["submit", str(program), "--workers", "2", "--api", api, "--", "python train.py --epochs 1"]
    )
    assert result.exit_code == 2, result.output
    expected = (
        "error: the command 'python train.py --epochs 1' is one word with spaces in it, and no agent can "
        f"run a program of that name: pass its words separately, e.g. mwms submit {shlex.quote(str(program))} "
        "--workers N -- python train.py --epochs 1"
    )
    assert " ".join(result.output.split()) == expected
    assert state.bundles == {} and state.jobs == {}


def test_one_word_with_spaces_that_names_a_file_is_submitted(
    fake_api: tuple[str, FakeState], program: Path
) -> None:
    api, state = fake_api
    script = program / "run me.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    result = runner.invoke(app, ["submit", str(program), "--workers", "1", "--api", api, "--", "./run me.sh"])
    assert result.exit_code == 0, result.output
    assert [job.spec["command"] for job in state.jobs.values()] == [["./run me.sh"]]
