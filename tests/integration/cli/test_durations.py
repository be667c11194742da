"""Duration options take a unit; a bare number is refused with a sentence that shows the accepted forms."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from mwms.cli.durations import DurationError, duration_option_parser, parse_duration
from mwms.cli.main import app
from mwms_testkit.fake_api import ADMIN_TOKEN, FakeState

runner = CliRunner()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("12h", 43200),
        ("30d", 2592000),
        ("2w", 1209600),
        ("1h30m", 5400),
        ("0.5s", 0.5),
        (" 2 H ", 7200),
    ],
)
def test_durations_with_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5", "", "soon", "5x", "1h30", "-5s", "0s", "0"])
def test_refused_durations(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


def test_zero_alone_is_zero_where_zero_is_allowed() -> None:
    assert parse_duration("0", allow_zero=True) == 0
    with pytest.raises(DurationError, match="5s, 5m, 5h or 5d"):
        parse_duration("5", allow_zero=True)


def test_token_create_refuses_a_bare_number(fake_api: tuple[str, FakeState]) -> None:
    args = [
        "token",
        "create",
        "--user",
        "x",
        "--expires-in",
        "5",
        "--api",
        fake_api[0],
        "--token",
        ADMIN_TOKEN,
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    message = " ".join(result.output.split())
    assert "5 has no unit: write 5s, 5m, 5h or 5d (durations look like 90s, 15m, 12h, 30d" in message
    assert len(fake_api[1].tokens) == 3


def test_token_create_takes_a_duration(fake_api: tuple[str, FakeState]) -> None:
    args = [
        "token",
        "create",
        "--user",
        "x",
        "--expires-in",
        "15m",
        "--api",
        fake_api[0],
        "--token",
        ADMIN_TOKEN,
    ]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert len(fake_api[1].tokens) == 4


def test_submit_refuses_a_grace_past_its_limit() -> None:
    result = runner.invoke(
        app, ["submit", ".", "-n", "1", "--preemption-grace", "2h", "--", "python", "t.py"]
    )
    assert result.exit_code == 2
    assert "2h is longer than the most it may be, 1h" in " ".join(result.output.split())


def test_the_daemons_take_units_and_read_a_bare_number_as_seconds() -> None:
    parse = duration_option_parser(minimum=1, maximum=6 * 3600, bare_seconds=True)
    assert (parse("45m"), parse("1800"), parse("90s"), parse("1.5h")) == (2700, 1800, 90, 5400)
    for text, said in (("0.5", "shorter than the least it may be, 1s"), ("7h", "longer than the most")):
        with pytest.raises(typer.BadParameter, match=said):
            parse(text)
    sampled = duration_option_parser(allow_zero=True, maximum=3600, bare_seconds=True)
    assert (sampled("0"), sampled("10s"), sampled("5")) == (0, 10, 5)


def test_the_agents_help_states_what_a_bare_number_means() -> None:
    result = runner.invoke(app, ["agent", "--help"], env={"COLUMNS": "300"})
    text = " ".join(result.output.split())
    assert (
        "--env-build-timeout DURATION" in text and "e.g. 45m (a bare number is seconds; at most 6h)" in text
    )
    refused = runner.invoke(app, ["agent", "--env-build-timeout", "9h", "--systemd-unit"])
    assert refused.exit_code == 2 and "9h is longer than the most it may be, 6h" in " ".join(
        refused.output.split()
    )
    unit = runner.invoke(app, ["agent", "--env-build-timeout", "45m", "--systemd-unit"])
    assert unit.exit_code == 0, unit.output
    assert "--env-build-timeout 2700s" in unit.stdout  # the unit states its unit
