"""Unknown options are answered with the command's closest options; submit keeps its hint about `--`."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from mwms.cli.main import app

runner = CliRunner()


def error_of(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["logs", "--folow", "j1"], "--folow is not an option of mwms logs; did you mean --follow?"),
        (
            ["token", "create", "--user", "x", "--expire-in", "5m"],
            "--expire-in is not an option of mwms token create; did you mean --expires-in?",
        ),
        (["--verison"], "--verison is not an option of mwms; did you mean --version?"),
        (["jobs", "--zzz"], "--zzz is not an option of mwms jobs: `mwms jobs -h` lists its options"),
    ],
)
def test_unknown_options_get_the_closest(args: list[str], expected: str) -> None:
    assert expected in error_of(args)


def test_a_submit_option_misspelt_before_the_separator_gets_the_suggestion_alone() -> None:
    message = error_of(["submit", ".", "--wokers", "2", "--", "python", "train.py"])
    assert "Error: --wokers is not an option of mwms submit; did you mean --workers?" in message
    assert "go after --" not in message


def test_a_misspelt_option_without_the_separator_also_gets_the_hint_about_it() -> None:
    message = error_of(["submit", ".", "--wokers", "2", "python", "train.py"])
    assert (
        "--wokers is not an option of mwms submit; did you mean --workers? If it is the program's, it goes "
        "after --, e.g. mwms submit . --workers 2 -- python train.py --epochs 1"
    ) in message
