"""`mwms agent --warm-pool N` (worker_agent/config.py): checked, passed to a systemd unit, 1 by default."""

from __future__ import annotations

import pytest

from mwms import agent_defaults
from mwms.worker_agent.config import AgentConfig, AgentOptionError, AgentOptions, check_agent_options


def test_the_default_keeps_one_warm_interpreter(tmp_path):
    assert AgentConfig(server="127.0.0.1:50051", name="a", work_dir=tmp_path).warm_pool == 1
    assert agent_defaults.WARM_POOL == 1


def test_a_given_size_reaches_the_config_and_the_units_command_line(tmp_path, monkeypatch):
    monkeypatch.delenv("MWMS_JOIN_TOKEN", raising=False)
    setup = check_agent_options(
        AgentOptions(name="a", work_dir=tmp_path, advertise_address="127.0.0.1", warm_pool=0)
    )
    assert setup.config().warm_pool == 0
    arguments = setup.unit_arguments()
    assert arguments[arguments.index("--warm-pool") + 1] == "0"
    unset = check_agent_options(AgentOptions(name="a", work_dir=tmp_path, advertise_address="127.0.0.1"))
    assert "--warm-pool" not in unset.unit_arguments() and unset.config().warm_pool == 1


@pytest.mark.parametrize("size", [-1, agent_defaults.MAX_WARM_POOL + 1])
def test_a_size_out_of_range_is_refused_with_the_range(tmp_path, size):
    with pytest.raises(AgentOptionError, match="--warm-pool"):
        check_agent_options(AgentOptions(name="a", work_dir=tmp_path, warm_pool=size))
