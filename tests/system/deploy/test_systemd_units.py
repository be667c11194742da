"""Both daemons' systemd units as `mwms server|agent --systemd-unit` print them: the flags of the command
line and no secrets in ExecStart=, the state dirs, limits and stop timeouts, the hardening, systemd's own
verdict (`systemd-analyze verify`) and exposure score (`systemd-analyze security --offline=yes`), and the
shipped deploy/systemd/mwms-server.service being exactly the printed unit."""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mwms.server.open_files import WANTED_OPEN_FILES
from mwms.server.systemd_unit import SERVER_ENV_FILE
from mwms.worker_agent.systemd import OMITTED, STOP_MARGIN_SECONDS
from mwms_testkit import REPO
from mwms_testkit.cluster import MWMS

REPO = REPO
SHIPPED_SERVER_UNIT = REPO / "deploy" / "systemd" / "mwms-server.service"
# Where docs/operators.md and the unit's header install the package.
INSTALLED_MWMS = "/opt/mwms/bin/mwms"
# Measured with systemd 252 (Debian 12): server 1.3 OK, agent as root 7.4 MEDIUM, as another user 7.7
# (the old agent unit: 9.6 UNSAFE). The bounds leave room for other systemd versions' weights.
SERVER_EXPOSURE_AT_MOST = 2.0
AGENT_EXPOSURE_BELOW = 9.2


def print_unit(*args: str) -> str:
    """What `mwms ARGS... --systemd-unit` prints; a failure with its stderr when it does not exit 0."""
    result = subprocess.run(
        [MWMS, *args, "--systemd-unit"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def refusal(*args: str) -> str:
    """The error of `mwms ARGS... --systemd-unit`, which must refuse them (exit 2) and print no unit."""
    result = subprocess.run(
        [MWMS, *args, "--systemd-unit"], capture_output=True, text=True, timeout=60, check=False
    )
    assert (result.returncode, result.stdout) == (2, ""), result.stdout + result.stderr
    return result.stderr


def directives(unit: str) -> list[tuple[str, str]]:
    """(key, value) of every directive, in order (keys may repeat); comments left out."""
    lines = [line.strip() for line in unit.splitlines()]
    return [
        (key, value)
        for key, _, value in (line.partition("=") for line in lines if "=" in line and line[0] != "#")
    ]


def exec_start(unit: str) -> list[str]:
    return dict(directives(unit))["ExecStart"].split()


def installed(unit: str) -> str:
    """`unit` as printed on a machine where mwms is installed in /opt/mwms (the executable replaced)."""
    replaced, count = re.subn(r"^ExecStart=\S+ ", f"ExecStart={INSTALLED_MWMS} ", unit, flags=re.MULTILINE)
    assert count == 1, unit
    return replaced


def systemd_version() -> int:
    result = subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True, check=True)
    return int(result.stdout.split()[1])


needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (apt-get install systemd)",
)


def verify(unit: str, name: str, tmp_path: Path) -> None:
    """`systemd-analyze verify` accepts `unit` (with User= made root, a user that exists here)."""
    path = tmp_path / "verify" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(re.sub(r"^User=.*$", "User=root", unit, flags=re.MULTILINE))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr


def exposure(unit: str, name: str, tmp_path: Path) -> float:
    """The overall exposure level `systemd-analyze security --offline=yes` gives `unit` (0 best, 10 worst)."""
    if systemd_version() < 250:
        pytest.skip("systemd-analyze security --offline needs systemd 250 or later")
    path = tmp_path / "security" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(unit)
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert found, result.stdout + result.stderr
    return float(found.group(1))


# --- the coordinator ----------------------------------------------------------------------------------


def test_the_shipped_server_unit_is_what_mwms_server_prints() -> None:
    # The command docs/operators.md gives; the file must never drift from the code that writes it.
    assert installed(print_unit("server")) == SHIPPED_SERVER_UNIT.read_text()
    assert installed(print_unit("server", "--service-user", "mwms")) == SHIPPED_SERVER_UNIT.read_text()


def test_the_server_unit_runs_the_flags_given_with_the_state_dir_by_default() -> None:
    unit = print_unit("server")
    values = dict(directives(unit))
    assert exec_start(unit)[1:] == ["server", "--data-dir", "/var/lib/mwms"]
    assert values["User"] == "mwms" and "Group" not in values  # the user's own group
    assert values["EnvironmentFile"] == f"-{SERVER_ENV_FILE}"
    assert (values["StateDirectory"], values["LimitNOFILE"], values["Restart"]) == (
        "mwms",
        "65536",
        "on-failure",
    )
    assert "ReadWritePaths" not in values  # /var/lib/mwms is the StateDirectory=
    # A second replica on the host: its data dir under /var/lib is its own StateDirectory=.
    values = dict(directives(print_unit("server", "--data-dir", "/var/lib/mwms-agents", "--serve", "agents")))
    assert (values["StateDirectory"], "ReadWritePaths" in values) == ("mwms-agents", False)

    unit = print_unit(
        "server",
        *("--host", "0.0.0.0", "--grpc-port", "50052", "--serve", "agents", "--replica-name", "c1-agents"),
        *("--tls-cert", "/etc/mwms/server.pem", "--tls-key", "/etc/mwms/server-key.pem"),
        *("--data-dir", "/srv/mwms", "--ports-file", "/run/mwms/ports.json", "--no-grpc-reflection"),
        *("--hang-timeout", "600", "--service-user", "coordinator"),
    )
    words = exec_start(unit)[1:]
    assert words == [
        "server",
        *("--host", "0.0.0.0", "--grpc-port", "50052", "--data-dir", "/srv/mwms"),
        *("--tls-cert", "/etc/mwms/server.pem", "--tls-key", "/etc/mwms/server-key.pem"),
        *("--hang-timeout", "600.0", "--ports-file", "/run/mwms/ports.json"),
        *("--serve", "agents", "--replica-name", "c1-agents", "--no-grpc-reflection"),
    ]
    pairs = directives(unit)
    assert ("User", "coordinator") in pairs
    # ProtectSystem=strict: what it writes outside its StateDirectory= is listed.
    assert [value for key, value in pairs if key == "ReadWritePaths"] == ["/run/mwms", "/srv/mwms"]


def test_the_server_unit_makes_relative_paths_absolute(tmp_path: Path) -> None:
    result = subprocess.run(
        [MWMS, "server", "--systemd-unit", "--tls-cert", "certs/server.pem"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/etc",  # not the checkout: a clone under /tmp (or /home) is refused, as the unit could not see it
    )
    assert result.returncode == 0, result.stderr
    assert "--tls-cert /etc/certs/server.pem" in dict(directives(result.stdout))["ExecStart"]


@pytest.mark.parametrize(
    ("flag", "value", "variable"),
    [
        ("--db-url", "postgresql+psycopg://mwms:pw-that-must-stay-out@db/mwms", "MWMS_DB_URL"),
        ("--join-token", "token-that-must-stay-out", "MWMS_JOIN_TOKEN"),
    ],
)
def test_secrets_are_refused_with_where_they_go(flag: str, value: str, variable: str) -> None:
    error = refusal("server", flag, value)
    assert f"{variable}=... in {SERVER_ENV_FILE}" in error, error
    assert "must-stay-out" not in error


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--tls-cert", "/home/ops/server.pem"], "ProtectHome=yes"),
        (["--data-dir", "/tmp/mwms"], "PrivateTmp=yes"),
        (["--service-user", "mwms\nUser=root"], "is not a user name"),
    ],
)
def test_paths_the_unit_hides_and_bad_users_are_refused(args: list[str], says: str) -> None:
    assert says in refusal("server", *args)


def test_the_server_unit_is_hardened() -> None:
    pairs = directives(print_unit("server"))
    values = dict(pairs)
    for key, value in {
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
        "RestrictRealtime": "yes",
        "RestrictNamespaces": "yes",
        "SystemCallArchitectures": "native",
        "CapabilityBoundingSet": "",
        "PrivateDevices": "yes",
        "UMask": "0077",
    }.items():
        assert values.get(key) == value, f"{key}={values.get(key)!r}, want {value!r}"
    assert ("SystemCallFilter", "@system-service") in pairs


@needs_systemd_analyze
def test_systemd_accepts_the_server_units(tmp_path: Path) -> None:
    verify(print_unit("server"), "mwms-server.service", tmp_path)
    unit = print_unit("server", "--data-dir", "/srv/mwms-api", "--serve", "api", "--http-port", "8081")
    verify(unit, "mwms-api.service", tmp_path)


@needs_systemd_analyze
def test_the_server_unit_scores_as_safe(tmp_path: Path) -> None:
    score = exposure(print_unit("server"), "mwms-server.service", tmp_path)
    assert score <= SERVER_EXPOSURE_AT_MOST, score


def lifted_open_files_limit(soft: int, hard: int) -> subprocess.CompletedProcess[str]:
    """A child process with RLIMIT_NOFILE (soft, hard) that calls raise_open_files_limit: it prints the soft
    limit after that, and logs to stderr (the limit is the process's own; lowered here it would stay low)."""
    program = (
        "import resource, sys\n"
        "from mwms.server.open_files import raise_open_files_limit\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))\n"
        "print(raise_open_files_limit())\n"
    )
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True, cwd=REPO
    )


def test_the_coordinator_lifts_its_open_files_limit_to_the_hard_limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2 * WANTED_OPEN_FILES:
        pytest.skip(f"the hard open files limit here is {hard}")
    result = lifted_open_files_limit(256, 2 * WANTED_OPEN_FILES)
    assert result.stdout.split() == [str(2 * WANTED_OPEN_FILES)]
    assert result.stderr == ""
    # A hard limit too low for a fleet: raised all the same, and the log says what to do.
    result = lifted_open_files_limit(256, 1024)
    assert result.stdout.split() == ["1024"]
    assert "may open only 1024 files" in result.stderr and "LimitNOFILE=65536" in result.stderr


# --- the agent ----------------------------------------------------------------------------------------


def test_the_agent_unit_keeps_its_work_dir_in_its_state_dir_and_its_token_in_a_file() -> None:
    unit = print_unit("agent", "--server", "10.0.0.1:50051", "--name", "gpu-1")
    values = dict(directives(unit))
    words = exec_start(unit)
    assert words[words.index("--work-dir") + 1] == "/var/lib/mwms-agent"  # never the caller's home
    assert values["StateDirectory"] == "mwms-agent"
    assert values["EnvironmentFile"] == "-/etc/mwms/agent.env"
    assert values["LimitNOFILE"] == "65536"
    assert "ReadWritePaths" not in values

    unit = print_unit("agent", "--work-dir", "/home/ops/agent", "--service-user", "ops")
    values = dict(directives(unit))
    assert exec_start(unit)[exec_start(unit).index("--work-dir") + 1] == "/home/ops/agent"
    assert values["ReadWritePaths"] == "/home/ops/agent"  # under ProtectHome=read-only
    assert "PrivateTmp=yes" in refusal("agent", "--work-dir", "/tmp/agent")


@pytest.mark.parametrize(
    ("grace", "timeout"), [(None, 10 + STOP_MARGIN_SECONDS), ("300", 300 + STOP_MARGIN_SECONDS)]
)
def test_systemd_waits_for_the_agents_stop_grace(grace: str | None, timeout: int) -> None:
    unit = print_unit("agent", *(["--stop-grace-seconds", grace] if grace else []))
    words = exec_start(unit)
    assert words[words.index("--stop-grace-seconds") + 1] == (grace or "10")
    assert dict(directives(unit))["TimeoutStopSec"] == str(timeout)


def test_a_stop_grace_out_of_range_is_refused() -> None:
    for grace in ("-1", "3601"):
        assert "--stop-grace-seconds" in refusal("agent", "--stop-grace-seconds", grace)


def test_the_agent_unit_is_hardened_only_where_tasks_and_gpus_keep_working() -> None:
    as_root = print_unit("agent")
    values = dict(directives(as_root))
    for key, value in {
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectHostname": "yes",
        "Delegate": "yes",  # a cgroup per task under the agent's
        "OOMScoreAdjust": "-900",  # tasks (1000) are killed first
        "LockPersonality": "yes",
        "RestrictRealtime": "yes",
        "RestrictSUIDSGID": "yes",
        "PrivateTmp": "yes",
        "ProtectHome": "read-only",
        "SystemCallArchitectures": "native",
    }.items():
        assert values.get(key) == value, f"{key}={values.get(key)!r}, want {value!r}"
    assert "CAP_SYS_ADMIN" not in values["CapabilityBoundingSet"]  # bwrap's
    assert values["CapabilityBoundingSet"].startswith("~")  # a deny list, not an allow list
    # What would stop bwrap, setpriv or the GPUs stays off, each with its reason in the unit.
    for omitted in (
        "NoNewPrivileges",
        "PrivateDevices",
        "RestrictNamespaces",
        "SystemCallFilter",
        "ProtectClock",
        "ProtectControlGroups",
    ):
        assert omitted not in values
        assert f"# {omitted}= off: " in as_root
    for reason in OMITTED:
        assert f"\n# {reason}\n" in as_root
    # An agent that is not root runs bwrap in a user namespace, which needs an uncovered /proc.
    as_user = dict(directives(print_unit("agent", "--service-user", "mwms")))
    for root_only in ("ProtectKernelTunables", "ProtectKernelLogs", "ProtectProc"):
        assert root_only not in as_user


def test_both_daemons_name_the_unit_user_service_user() -> None:
    """`mwms agent --user` was the agent's name for `--service-user`: it still works, hidden from --help."""
    assert print_unit("agent", "--user", "ops") == print_unit("agent", "--service-user", "ops")
    assert "User=ops" in print_unit("agent", "--service-user", "ops")
    for command in ("server", "agent"):
        wide = dict(os.environ, COLUMNS="200")  # rich wraps help to the terminal's width
        shown = subprocess.run(
            [MWMS, command, "--help"], capture_output=True, text=True, timeout=60, env=wide
        )
        assert "--service-user" in shown.stdout
        assert not re.search(r"--user\b", shown.stdout), shown.stdout


@needs_systemd_analyze
def test_systemd_accepts_the_agent_units(tmp_path: Path) -> None:
    verify(print_unit("agent", "--server", "10.0.0.1:50051"), "mwms-agent.service", tmp_path)
    unit = print_unit(
        "agent", "--service-user", "ops", "--work-dir", "/home/ops/my agent", "--stop-grace-seconds", "90"
    )
    verify(unit, "mwms-agent-user.service", tmp_path)


@needs_systemd_analyze
def test_the_agent_unit_scores_better_than_before(tmp_path: Path) -> None:
    score = exposure(print_unit("agent"), "mwms-agent.service", tmp_path)
    assert score < AGENT_EXPOSURE_BELOW, score
