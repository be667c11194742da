"""`mwms submit --agents` and `mwms doctor` build the job specs the coordinator expects."""

from __future__ import annotations

import pytest

from mwms.cli.doctor import bundle_dir, doctor_spec, parse_agents
from mwms.cli.errors import CliError
from mwms.client.job_spec import build_job_spec


def test_agents_are_in_the_spec_only_when_given() -> None:
    spec = build_job_spec(name="n", bundle_digest="d" * 64, command=["python", "t.py"], workers=2)
    assert "agents" not in spec
    spec = build_job_spec(
        name="n", bundle_digest="d" * 64, command=["python", "t.py"], workers=2, agents=["a", "b"]
    )
    assert spec["agents"] == ["a", "b"]


def test_doctor_needs_two_agents_and_pins_one_worker_to_each() -> None:
    assert parse_agents(" a, b ,,c") == ["a", "b", "c"]
    with pytest.raises(CliError, match="at least two"):
        parse_agents("only-one")
    spec = doctor_spec("d" * 64, ["a", "b"], 32)
    assert spec["workers"] == 2 and spec["agents"] == ["a", "b"] and spec["preflight"] is True
    assert spec["env"] == {"MWMS_PREFLIGHT_TCP_MB": "32"} and spec["restart"] == {"max_restarts": 0}
    assert (bundle_dir() / spec["command"][1]).is_file()  # the program ships inside the mwms package
