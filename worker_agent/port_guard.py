"""Which TCP ports a task may bind and reach: cgroup BPF programs on the task's own cgroup.

TensorFlow's gRPC servers (worker and coordination service) take any client: whoever reaches a job's
task ports can run ops in it or fail it with one RPC. So every task is held to these rules, by four
small programs the kernel runs on its sockets (BPF_PROG_TYPE_CGROUP_SOCK_ADDR, the mechanism Cilium's
socket load-balancer and systemd's SocketBindDeny= use):
- bind (IPv4, IPv6): no port of the guarded ranges but its own: no task squats another job's port;
- connect (IPv4, IPv6): a guarded port only at its own job's peers (the endpoints of its TF_CONFIG), so
  a task reaches its own job's gRPC servers and no one else's, on this machine or another.
The guarded ranges are every agent's task port range and the coordinator's own ports (StartTask's
guarded_ports, merged with this agent's range and its coordinators' ports). Everything else is open:
the outside world, and NCCL's own sockets between peers, on ports the kernel picks outside the ranges.

Refused calls fail with EPERM. The programs go with the cgroup: they end with the task, and a crashed
agent leaves none behind. Needs root (or CAP_BPF and CAP_NET_ADMIN) and a cgroup v2 hierarchy (the
unified one of a hybrid v1 host will do).
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import platform
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# bpf(2) commands, program and attach types (linux/bpf.h).
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_TYPE_CGROUP_SOCK_ADDR = 18
BPF_CGROUP_INET4_BIND = 8
BPF_CGROUP_INET6_BIND = 9
BPF_CGROUP_INET4_CONNECT = 10
BPF_CGROUP_INET6_CONNECT = 11
BPF_F_ALLOW_MULTI = 2
SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine(), -1)
# Offsets in struct bpf_sock_addr.
USER_IP4, USER_IP6, USER_PORT = 4, 8, 24
# Instruction opcodes.
LDX_W = 0x61  # r_dst = *(u32 *)(r_src + off)
END_TO_BE = 0xDC  # r_dst = htobe<imm>(r_dst): network to host order on a little-endian CPU
END_TO_LE = 0xD4
MOV_K = 0xB7
EXIT = 0x95
JA = 0x05
JEQ_K, JNE_K, JGT_K, JLT_K = 0x15, 0x55, 0x25, 0xA5
JMP32_JEQ_K, JMP32_JNE_K = 0x16, 0x56
MAX_PEERS = 4096
LOG_BYTES = 1 << 16


class PortGuardError(Exception):
    """The rules could not be loaded or attached; the message says why."""


@dataclass(frozen=True)
class PortRules:
    """One task's rules: its own port, the guarded ranges, and its job's peer endpoints."""

    own_port: int
    guarded: tuple[tuple[int, int], ...]
    peers: tuple[tuple[bytes, int], ...]  # (16-byte IPv6 address, IPv4 ones mapped), port


def merge(spans: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Inclusive port ranges, sorted, overlapping and adjacent ones joined; invalid ones dropped."""
    merged: list[list[int]] = []
    for low, high in sorted((max(1, a), min(65535, b)) for a, b in spans if a <= b and b >= 1):
        if merged and low <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    return tuple((a, b) for a, b in merged)


def peers_of(tf_config: str) -> list[tuple[bytes, int]]:
    """The endpoints of every task in a TF_CONFIG's cluster, addresses resolved, as (IPv6 bytes, port)."""
    try:
        cluster = json.loads(tf_config or "{}").get("cluster", {})
    except (ValueError, AttributeError):
        return []
    found: list[tuple[bytes, int]] = []
    for endpoints in cluster.values() if isinstance(cluster, dict) else ():
        for endpoint in endpoints if isinstance(endpoints, list) else ():
            host, _, port = str(endpoint).rpartition(":")
            if not port.isdigit():
                continue
            for address in _resolve(host.strip("[]")):
                found.append((address, int(port)))
    return found[:MAX_PEERS]


def _resolve(host: str) -> list[bytes]:
    try:
        return [_as_ipv6(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return []
    return sorted({_as_ipv6(ipaddress.ip_address(info[4][0])) for info in infos})


def _as_ipv6(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bytes:
    if isinstance(address, ipaddress.IPv4Address):
        return ipaddress.IPv6Address(f"::ffff:{address}").packed
    return address.packed


class _Program:
    """A tiny BPF assembler: instructions with symbolic jump targets."""

    def __init__(self) -> None:
        self._code: list[tuple[int, int, int, int | str, int]] = []
        self._labels: dict[str, int] = {}

    def op(self, code: int, dst: int = 0, src: int = 0, off: int | str = 0, imm: int = 0) -> None:
        self._code.append((code, dst, src, off, imm))

    def label(self, name: str) -> None:
        self._labels[name] = len(self._code)

    def assemble(self) -> bytes:
        out = []
        for at, (code, dst, src, off, imm) in enumerate(self._code):
            offset = self._labels[off] - at - 1 if isinstance(off, str) else off
            signed = imm - (1 << 32) if imm >= 1 << 31 else imm
            out.append(struct.pack("<BBhi", code, (src << 4) | dst, offset, signed))
        return b"".join(out)


def _allow_deny(program: _Program) -> None:
    program.label("allow")
    program.op(MOV_K, 0, imm=1)
    program.op(EXIT)
    program.label("deny")
    program.op(MOV_K, 0, imm=0)
    program.op(EXIT)


def _load_port(program: _Program) -> None:
    """r2 = the port the call names, in host order."""
    program.op(LDX_W, 2, 1, USER_PORT)
    little = struct.pack("=H", 1) == struct.pack("<H", 1)
    program.op(END_TO_BE if little else END_TO_LE, 2, imm=16)


def _jump_if_guarded(program: _Program, guarded: Sequence[tuple[int, int]], target: str) -> None:
    for index, (low, high) in enumerate(guarded):
        past = f"past-{index}"
        program.op(JLT_K, 2, off=past, imm=low)
        program.op(JGT_K, 2, off=past, imm=high)
        program.op(JA, off=target)
        program.label(past)


def bind_program(rules: PortRules) -> bytes:
    """Refuses a bind to a guarded port other than the task's own."""
    program = _Program()
    _load_port(program)
    if rules.own_port:
        program.op(JEQ_K, 2, off="allow", imm=rules.own_port)
    _jump_if_guarded(program, rules.guarded, "deny")
    program.op(JA, off="allow")
    _allow_deny(program)
    return program.assemble()


def connect_program(rules: PortRules, ipv6: bool) -> bytes:
    """Refuses a connect to a guarded port anywhere but at one of the job's peers."""
    program = _Program()
    _load_port(program)
    _jump_if_guarded(program, rules.guarded, "peers")
    program.op(JA, off="allow")
    program.label("peers")
    words = 4 if ipv6 else 1
    for register, word in enumerate(range(words), start=3):
        offset = USER_IP6 + 4 * word if ipv6 else USER_IP4
        program.op(LDX_W, register, 1, offset)
    for index, (address, port) in enumerate(rules.peers):
        if not ipv6 and not address.startswith(b"\0" * 10 + b"\xff\xff"):
            continue  # an IPv6 peer is reached through the IPv6 hook only
        nope = f"peer-{index}"
        program.op(JNE_K, 2, off=nope, imm=port)
        chunks = [address[i : i + 4] for i in range(0, 16, 4)] if ipv6 else [address[12:]]
        for register, chunk in enumerate(chunks, start=3):
            program.op(JMP32_JNE_K, register, off=nope, imm=struct.unpack("<I", chunk)[0])
        program.op(JA, off="allow")
        program.label(nope)
    program.op(JA, off="deny")
    _allow_deny(program)
    return program.assemble()


class PortGuard:
    """Loads a task's programs and attaches them to its cgroup (v2)."""

    def __init__(self, agent_range: tuple[int, int], coordinator_ports: Sequence[int] = ()) -> None:
        self.agent_range = agent_range
        self.coordinator_ports = tuple(coordinator_ports)
        self._libc = ctypes.CDLL(None, use_errno=True)

    def rules(self, own_port: int, guarded: Iterable[tuple[int, int]], tf_config: str) -> PortRules:
        """A task's rules: `guarded` (from its StartTask) with this agent's range and coordinators' ports."""
        spans = [*guarded, self.agent_range, *((p, p) for p in self.coordinator_ports)]
        return PortRules(own_port, merge(spans), tuple(peers_of(tf_config)))

    def attach(self, cgroup_dir: Path, rules: PortRules) -> None:
        """Puts `rules` on the cgroup at `cgroup_dir` (PortGuardError when the kernel refuses)."""
        programs = [
            (BPF_CGROUP_INET4_BIND, bind_program(rules)),
            (BPF_CGROUP_INET6_BIND, bind_program(rules)),
            (BPF_CGROUP_INET4_CONNECT, connect_program(rules, ipv6=False)),
            (BPF_CGROUP_INET6_CONNECT, connect_program(rules, ipv6=True)),
        ]
        try:
            directory = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as error:
            raise PortGuardError(f"cannot open the task's cgroup {cgroup_dir}: {error.strerror}") from error
        try:
            for attach_type, code in programs:
                program = self._load(attach_type, code)
                try:
                    attr = struct.pack("<IIII", directory, program, attach_type, BPF_F_ALLOW_MULTI)
                    self._bpf(BPF_PROG_ATTACH, attr, "attach")
                finally:
                    os.close(program)
        finally:
            os.close(directory)

    def _load(self, attach_type: int, code: bytes) -> int:
        instructions = ctypes.create_string_buffer(code, len(code))
        license_text = ctypes.create_string_buffer(b"GPL")
        log_buffer = ctypes.create_string_buffer(LOG_BYTES)
        attr = bytearray(128)
        struct.pack_into(
            "<IIQQIIQ",
            attr,
            0,
            BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
            len(code) // 8,
            ctypes.addressof(instructions),
            ctypes.addressof(license_text),
            1,
            LOG_BYTES,
            ctypes.addressof(log_buffer),
        )
        struct.pack_into("<I", attr, 68, attach_type)  # expected_attach_type
        try:
            return self._bpf(BPF_PROG_LOAD, bytes(attr), "load")
        except PortGuardError as error:
            detail = log_buffer.value.decode(errors="replace").strip().splitlines()[-1:]
            raise PortGuardError(f"{error}{': ' + detail[0] if detail else ''}") from None

    def _bpf(self, command: int, attr: bytes, what: str) -> int:
        if SYS_BPF < 0:
            raise PortGuardError(f"no bpf(2) number known for {platform.machine()}")
        buffer = ctypes.create_string_buffer(attr, len(attr))
        result = int(self._libc.syscall(SYS_BPF, command, buffer, len(attr)))
        if result < 0:
            code = ctypes.get_errno()
            raise PortGuardError(f"the kernel refused to {what} a port rule ({os.strerror(code)})")
        return result


def check(guard: PortGuard, scratch_cgroup: Path) -> str:
    """Why port rules cannot be had here ("" when they can): tries them on an empty cgroup."""
    try:
        scratch_cgroup.mkdir(exist_ok=True)
    except OSError as error:
        return f"cannot make a cgroup to try port rules in ({error.strerror})"
    try:
        guard.attach(scratch_cgroup, PortRules(0, ((1, 1),), ()))
    except PortGuardError as error:
        return str(error)
    finally:
        try:
            scratch_cgroup.rmdir()
        except OSError:
            pass
    return ""
