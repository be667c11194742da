"""What an agent says about itself at Register is bounded: names, addresses, devices."""

from __future__ import annotations

import pytest

from mwms.server.errors import InvalidInput
from mwms.server.services.fleet.agents import Registration, validate_registration

CPU = [{"kind": "cpu", "index": 0, "name": "slot", "uuid": "", "memory_mib": 0}]


def registration(**changes) -> Registration:
    fields = dict(
        name="gpu-1",
        hostname="host-1",
        advertise_address="10.0.0.7",
        port_low=20000,
        port_high=20999,
        devices=CPU,
        version="0.1.0",
    )
    fields.update(changes)
    return Registration(**fields)


def test_a_plain_registration_passes():
    validate_registration(registration())
    validate_registration(registration(advertise_address="[fd00::7]"))
    validate_registration(registration(advertise_address="node-7.cluster.local"))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "x" * 201}, "at most 200"),
        ({"name": "bad\x00name"}, "printable"),
        ({"advertise_address": "a" * 256}, "advertise address"),
        ({"advertise_address": "évil.example"}, "ASCII"),
        ({"advertise_address": '10.0.0.7","x'}, "advertise address"),
        ({"hostname": "h" * 256}, "hostname"),
        ({"version": "v" * 51}, "version"),
        ({"task_isolation": "i" * 201}, "task isolation must be at most 200"),
        ({"task_isolation": "bwrap\x1b]0;title\x07"}, "task isolation must be at most 200 printable"),
        ({"devices": [{**CPU[0], "index": i} for i in range(1025)]}, "at most 1024 devices"),
        ({"devices": [{**CPU[0], "name": "n" * 201}]}, "at most 200"),
        ({"devices": [CPU[0], CPU[0]]}, "distinct"),
        ({"devices": [{**CPU[0], "index": -1}]}, "indices"),
    ],
)
def test_oversized_or_odd_values_are_refused(changes, message):
    with pytest.raises(InvalidInput, match=message):
        validate_registration(registration(**changes))
