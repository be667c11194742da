"""The pure rules behind a task's confinement: its limits from a StartTask, the ports it is held to, its
TF_CONFIG peers, co-location, and the cgroups a process is in (the kernel's side is tested end to end in
tests/system/e2e/test_task_limits.py and test_network_confinement.py)."""

from __future__ import annotations

import json
from pathlib import Path

from mwms.v1 import agent_pb2
from mwms.worker_agent.cgroups import own_cgroups
from mwms.worker_agent.landlock import has_co_located_peer
from mwms.worker_agent.port_guard import PortRules, bind_program, connect_program, merge, peers_of
from mwms.worker_agent.task_limits import LimitPolicy, offered_memory

GIB = 1024**3


def gpus(count: int) -> list[agent_pb2.Device]:
    return [agent_pb2.Device(kind=agent_pb2.DEVICE_KIND_GPU, index=i) for i in range(count)]


def test_a_task_without_its_own_limit_gets_the_agents_memory_shared_by_devices() -> None:
    policy = LimitPolicy(gpus(8), 80 * GIB, pids_max=4096, disk_max_bytes=0)
    start = agent_pb2.StartTask(device_kind=agent_pb2.DEVICE_KIND_GPU, device_indices=[0, 1])
    limits = policy.limits(start)
    assert (limits.memory_bytes, limits.devices, limits.pids_max, limits.cpus) == (20 * GIB, 2, 4096, 0.0)
    asked = agent_pb2.StartTask(
        device_kind=agent_pb2.DEVICE_KIND_GPU, device_indices=[0], memory_limit_bytes=8 * GIB, cpus=4
    )
    assert (policy.limits(asked).memory_bytes, policy.limits(asked).cpus) == (8 * GIB, 4.0)
    assert (
        policy.out_of_memory(asked, policy.limits(asked))
        == "out of memory: 8 GiB limit (--memory-per-worker)"
    )
    assert "--memory-per-worker" in policy.out_of_memory(start, limits)


def test_the_agent_keeps_a_reserve_of_a_tenth_between_1_and_16_gib() -> None:
    assert offered_memory(24 * GIB) == 24 * GIB - int(2.4 * GIB)
    assert offered_memory(4 * GIB) == 3 * GIB
    assert offered_memory(1024 * GIB) == 1008 * GIB
    assert offered_memory(0) == 0


def test_guarded_ranges_merge_and_peers_come_from_tf_config() -> None:
    assert merge([(21100, 21199), (21000, 21099), (50051, 50051), (8080, 8080), (0, -1)]) == (
        (8080, 8080),
        (21000, 21199),
        (50051, 50051),
    )
    config = json.dumps({"cluster": {"worker": ["10.0.0.1:21000", "[::1]:21001"]}, "task": {"index": 0}})
    peers = peers_of(config)
    assert peers[0] == (bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1]), 21000)
    assert peers[1] == (bytes(15) + b"\x01", 21001)
    assert peers_of("not json") == []


def test_port_programs_are_whole_instructions() -> None:
    rules = PortRules(
        21000, ((21000, 21199),), tuple(peers_of(json.dumps({"cluster": {"worker": ["10.0.0.1:21000"]}})))
    )
    for program in (
        bind_program(rules),
        connect_program(rules, ipv6=False),
        connect_program(rules, ipv6=True),
    ):
        assert program and len(program) % 8 == 0


def test_a_worker_is_co_located_when_another_of_its_job_shares_its_host() -> None:
    apart = json.dumps({"cluster": {"worker": ["10.0.0.1:21000", "10.0.0.2:21000"]}})
    together = json.dumps({"cluster": {"worker": ["10.0.0.1:21000", "10.0.0.1:21001"]}})
    assert not has_co_located_peer(apart, 0) and has_co_located_peer(together, 1)
    assert not has_co_located_peer("", 0)


def test_own_cgroups_reads_v1_controllers_and_the_v2_path(tmp_path: Path) -> None:
    listing = tmp_path / "cgroup"
    listing.write_text("12:memory:/process_api/x\n5:cpu,cpuacct:/a\n0::/system.slice/mwms-agent.service\n")
    assert own_cgroups(listing) == {
        "memory": "/process_api/x",
        "cpu": "/a",
        "cpuacct": "/a",
        "": "/system.slice/mwms-agent.service",
    }
