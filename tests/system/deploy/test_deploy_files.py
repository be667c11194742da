"""The operator's deployment files: the coordinator's systemd unit and its environment file (systemd's own
verdict; the flags and variables they name exist), and the HAProxy configuration (HAProxy's own verdict, then
a copy of it in front of a real TLS coordinator: REST, authentication and an agent's stream through it)."""

from __future__ import annotations

import re
import shutil
import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from mwms.server.settings import Settings
from mwms_testkit import REPO
from mwms_testkit.cluster import MWMS, Cluster, Process, free_port, wait_until
from mwms_testkit.parallel import port_range

REPO = REPO
UNIT = REPO / "deploy" / "systemd" / "mwms-server.service"
ENV_EXAMPLE = REPO / "deploy" / "systemd" / "server.env.example"
HAPROXY_CONFIG = REPO / "deploy" / "haproxy" / "mwms.cfg"
# The name the configuration's health checks send as Host; the replicas must answer it.
LOAD_BALANCER_NAME = "mwms.example"


def unit_directives(text: str) -> list[tuple[str, str]]:
    """(key, value) for every directive of a unit, in order (keys may repeat)."""
    lines = [line.strip() for line in text.splitlines()]
    return [
        (key, value)
        for key, _, value in (line.partition("=") for line in lines if "=" in line and line[0] != "#")
    ]


def haproxy() -> str:
    """The haproxy binary; a failure (not a skip) when it is missing, since CI installs it."""
    found = shutil.which("haproxy") or next(
        (str(p) for p in (Path("/usr/sbin/haproxy"), Path("/usr/local/sbin/haproxy")) if p.exists()), None
    )
    if found is None:
        pytest.fail("haproxy is not installed: apt-get install haproxy (.ci/run installs it)")
    return found


# --- the systemd unit -------------------------------------------------------------------------------------


def test_the_unit_runs_the_coordinator_as_its_own_user_with_secrets_from_a_file() -> None:
    pairs = unit_directives(UNIT.read_text())
    values = dict(pairs)
    assert values["User"] == "mwms" and "Group" not in values  # the user's own group
    # Optional: without it the coordinator keeps SQLite in /var/lib/mwms (tests/system/deploy/test_systemd_units.py
    # checks that the file is what `mwms server --systemd-unit` prints).
    assert values["EnvironmentFile"] == "-/etc/mwms/server.env"
    assert (values["Restart"], values["LimitNOFILE"], values["StateDirectory"]) == (
        "on-failure",
        "65536",
        "mwms",
    )
    assert int(values["TimeoutStopSec"]) > 0
    assert values["After"].split() == ["network-online.target", "postgresql.service"]
    assert values["Wants"] == "network-online.target"
    command = values["ExecStart"]
    assert command.startswith("/opt/mwms/bin/mwms server ")
    for secret in ("TOKEN", "token", "db-url", "postgresql", "://"):
        assert secret not in command, f"{secret!r} on the command line, where every user reads it"
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "CapabilityBoundingSet": "",
        "UMask": "0077",
    }.items():
        assert values.get(key) == value, f"{key}={values.get(key)!r}, want {value!r}"
    assert ("SystemCallFilter", "@system-service") in pairs


def test_the_unit_uses_only_flags_that_mwms_server_has() -> None:
    command = dict(unit_directives(UNIT.read_text()))["ExecStart"]
    flags = [word for word in command.split() if word.startswith("--")]
    assert flags, command
    result = subprocess.run(
        [MWMS, "server", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    known = set(re.findall(r"--[a-z][a-z-]*", result.stdout))
    assert set(flags) <= known, f"not flags of `mwms server`: {sorted(set(flags) - known)}"


def test_the_env_example_sets_only_real_settings() -> None:
    settings = {f"MWMS_{name.upper()}" for name in Settings.model_fields}
    names = re.findall(r"^(MWMS_[A-Z0-9_]+)=", ENV_EXAMPLE.read_text(), re.MULTILINE)
    assert "MWMS_DB_URL" in names and "MWMS_ADMIN_TOKEN" in names
    assert set(names) <= settings, f"not coordinator settings: {sorted(set(names) - settings)}"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    # As in tests/system/worker_agent/test_systemd.py: the unit as shipped, but with an executable and a user that
    # exist here (verify refuses an ExecStart= that is not executable).
    text = UNIT.read_text()
    text = text.replace("ExecStart=/opt/mwms/bin/mwms ", f"ExecStart={MWMS} ", 1)
    text = text.replace("User=mwms\n", "User=root\n", 1)
    path = tmp_path / UNIT.name
    path.write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr


# --- HAProxy ----------------------------------------------------------------------------------------------


def test_haproxy_accepts_the_configuration() -> None:
    result = subprocess.run(
        [haproxy(), "-c", "-f", str(HAPROXY_CONFIG)], capture_output=True, text=True, timeout=30, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Configuration file is valid" in output
    # The only warnings allowed: the placeholder replicas do not resolve here (they start out of rotation).
    warnings = [line for line in output.splitlines() if "[WARNING]" in line]
    unexpected = [
        line for line in warnings if not re.search(r"could not resolve address 'coordinator-\d'", line)
    ]
    assert not unexpected, output


def loopback_haproxy_config(
    shipped: str, replica_http: int, replica_grpc: int, api: int, agents: int, stats_socket: Path
) -> str:
    """The shipped configuration with every replica at one coordinator on loopback and the frontends on
    loopback ports; without chroot, user, group and daemon, which a HAProxy that the test runs (as whoever
    runs the tests, in the foreground) cannot or should not use; logging to stderr (the test's log file) and
    with fewer connections; with a stats socket for the test to read the health checks from. The rest is as
    shipped."""
    substitutions = [
        (r"^(\s*server coordinator-\d) coordinator-\d:8080$", rf"\g<1> 127.0.0.1:{replica_http}", 3),
        (r"^(\s*server coordinator-\d) coordinator-\d:50051$", rf"\g<1> 127.0.0.1:{replica_grpc}", 3),
        (r"^(\s*default-server .*\bcheck port) 8080\b", rf"\g<1> {replica_http}", 1),
        (r"^(\s*)bind :8080$", rf"\g<1>bind 127.0.0.1:{api}", 1),
        (r"^(\s*)bind :50051$", rf"\g<1>bind 127.0.0.1:{agents}", 1),
        (r"^\s*(chroot|user|group|daemon)\b.*$", "", 4),
        (r"^(\s*)log /dev/log (\w+)$", r"\g<1>log stderr format short \g<2>", 1),
        # 20,000 connections need 40,000 descriptors, more than a test's limit may allow.
        (r"^(\s*)maxconn \d+$", r"\g<1>maxconn 1000", 1),
    ]
    config = shipped
    for pattern, replacement, expected in substitutions:
        config, count = re.subn(pattern, replacement, config, flags=re.MULTILINE)
        assert count == expected, f"{pattern!r} matched {count} times in {HAPROXY_CONFIG}, not {expected}"
    return config.replace("global\n", f"global\n    stats socket {stats_socket} level user\n", 1)


def health_checks(stats_socket: Path) -> dict[str, str]:
    """ "backend/server" -> the last health check's status (L7OK, L7STS, L4CON, ...) from `show stat`."""
    with socket.socket(socket.AF_UNIX) as stats:
        stats.settimeout(5)
        stats.connect(str(stats_socket))
        stats.sendall(b"show stat\n")
        data = b""
        while chunk := stats.recv(65536):
            data += chunk
    header, *rows = data.decode().strip().splitlines()
    columns = header.lstrip("# ").split(",")
    table = [dict(zip(columns, row.split(","), strict=False)) for row in rows]
    return {
        f"{row['pxname']}/{row['svname']}": row["check_status"]
        for row in table
        if row["svname"] not in ("FRONTEND", "BACKEND")
    }


@dataclass
class TlsCluster(Cluster):
    """A coordinator serving TLS from its own self-signed CA (whose names include loopback, the load
    balancer's address here) and answering the Host name the health checks send."""

    @property
    def ca_file(self) -> Path:
        return self.root / "data" / "tls" / "ca.pem"

    @property
    def api(self) -> str:
        return f"https://127.0.0.1:{self.http_port}"

    def client(self, token: str | None) -> httpx.Client:
        return self.client_at(self.api, token)

    def client_at(self, base_url: str, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        context = ssl.create_default_context(cafile=str(self.ca_file))
        return httpx.Client(base_url=base_url, timeout=10, headers=headers, trust_env=False, verify=context)

    def server_args(self) -> list[str]:
        return ["--tls-self-signed", "--allowed-hosts", f"{LOAD_BALANCER_NAME},127.0.0.1,localhost"]

    def _healthy(self) -> bool:
        assert self.server is not None
        if self.server.popen.poll() is not None:
            raise AssertionError(f"coordinator exited:\n{self.server.log_tail()}")
        if not self.ca_file.exists():
            return False
        try:
            return self.client(None).get("/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


@pytest.mark.e2e
def test_the_api_and_an_agent_work_through_haproxy(tmp_path: Path) -> None:
    binary = haproxy()
    cluster = TlsCluster(root=tmp_path)
    balancer: Process | None = None
    try:
        cluster.start_server()
        api_port, agents_port = free_port(), free_port()
        config = tmp_path / "haproxy.cfg"
        shipped = HAPROXY_CONFIG.read_text()
        stats_socket = tmp_path / "haproxy.sock"
        ports = (cluster.http_port, cluster.grpc_port, api_port, agents_port)
        config.write_text(loopback_haproxy_config(shipped, *ports, stats_socket))
        log_path = tmp_path / "haproxy.log"
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                [binary, "-db", "-f", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        balancer = Process("haproxy", popen, log_path)
        through = f"https://127.0.0.1:{api_port}"
        anonymous, admin = cluster.client_at(through, None), cluster.client_at(through, cluster.admin_token)

        def healthy_through_balancer() -> bool:
            if popen.poll() is not None:
                raise AssertionError(f"haproxy exited:\n{balancer.log_tail()}")
            try:
                return anonymous.get("/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy_through_balancer, 15, "/healthz through haproxy", observed=balancer.log_tail)
        # Servers count as up until checks fail, so /healthz alone would not show that the checks work:
        # every replica of both backends passes its TLS /healthz check (with the Host header it sends).
        wait_until(
            lambda: set(health_checks(stats_socket).values()) == {"L7OK"},
            15,
            "every replica's /healthz check passing",
            observed=lambda: health_checks(stats_socket),
        )
        assert len(health_checks(stats_socket)) == 6
        assert anonymous.get("/api/v1/agents").status_code == 401
        response = admin.get("/api/v1/agents")
        assert response.status_code == 200, response.text
        assert response.json() == []

        # The agent knows only the load balancer's gRPC port, over TLS checked against the coordinator's CA.
        args = ["agent", "--server", f"127.0.0.1:{agents_port}", "--ca-file", str(cluster.ca_file)]
        args += ["--name", "behind-lb", "--work-dir", str(tmp_path / "behind-lb"), "--slots", "1"]
        args += ["--advertise-address", "127.0.0.1", "--port-range", port_range(23300)]
        agent = cluster.agents["behind-lb"] = cluster._spawn("behind-lb", args, cluster.agent_environment())

        def online_through_balancer() -> bool:
            agents = admin.get("/api/v1/agents").json()
            return any(a["name"] == "behind-lb" and a["online"] for a in agents)

        wait_until(online_through_balancer, 30, "the agent online through haproxy", observed=agent.log_tail)
    finally:
        if balancer is not None:
            balancer.stop(grace=5)
        cluster.stop()
