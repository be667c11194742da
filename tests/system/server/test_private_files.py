"""The coordinator's files are private whatever the umask (mwms/private_files.py): a real `mwms server`
started under umask 022 keeps its data dir 0700 and its database, -wal, -shm, admin token and keys 0600,
fixes an older open data dir at start, and refuses a data dir another user owns; the quickstart's dir is
closed to listing with private logs and results. Also the module's functions one by one."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from mwms import private_files
from mwms.cli.main import app
from mwms.cli.quickstart import quickstart_admin_token
from mwms.private_files import ForeignFileError
from mwms_testkit.cluster import read_ports_file, wait_until

MWMS = str(Path(sys.executable).parent / "mwms")
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextmanager
def umask(value: int) -> Iterator[None]:
    previous = os.umask(value)
    try:
        yield
    finally:
        os.umask(previous)


def make_file(path: Path, file_mode: int, content: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.chmod(file_mode)
    return path


# --- a real `mwms server` under umask 022 -----------------------------------------------------------


@contextmanager
def running_server(tmp_path: Path, data_dir: Path, *flags: str) -> Iterator[dict[str, int]]:
    """`mwms server` started with umask 022 (as a shell would), until it listens and answers /healthz."""
    ports_file = tmp_path / "ports.json"
    log_path = tmp_path / "server.log"
    env = {name: value for name, value in os.environ.items() if not name.startswith("MWMS_")}
    argv = [MWMS, "server", "--http-port", "0", "--grpc-port", "0", "--data-dir", str(data_dir)]
    with log_path.open("ab") as log:
        server = subprocess.Popen(
            [*argv, "--ports-file", str(ports_file), *flags],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=lambda: os.umask(0o022),
            start_new_session=True,
        )
    try:

        def ports() -> dict[str, int] | None:
            assert server.poll() is None, f"the coordinator exited:\n{log_path.read_text()}"
            return read_ports_file(ports_file)

        found = wait_until(ports, 60, "the coordinator's ports file", observed=log_path.read_text)
        yield found
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_a_server_started_under_umask_022_keeps_its_files_private(tmp_path):
    data = tmp_path / "data"
    with running_server(tmp_path, data, "--tls-self-signed") as ports:
        tls = data / "tls"
        api = f"https://127.0.0.1:{ports['http']}"
        with httpx.Client(base_url=api, verify=str(tls / "ca.pem"), timeout=10) as http:
            wait_until(lambda: http.get("/healthz").status_code == 200, 60, "coordinator health")
            token = (data / "admin-token").read_text().strip()
            made = http.post(
                "/api/v1/tokens",
                json={"user": "someone", "role": "viewer"},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert made.status_code == 201, made.text  # a write: the WAL holds it
        # While it runs: SQLite keeps -wal and -shm beside the database.
        database = data / "mwms.db"
        assert Path(f"{database}-wal").exists() and Path(f"{database}-shm").exists()
        assert mode(data) == 0o700 and mode(tls) == 0o700
        for name in (
            "mwms.db",
            "mwms.db-wal",
            "mwms.db-shm",
            "admin-token",
            "tls/ca-key.pem",
            "tls/server-key.pem",
        ):
            assert mode(data / name) == 0o600, name
        assert mode(tls / "ca.pem") == 0o644  # certificates are public; the dir around them is not
        certificates = {tls / name for name in ("ca.pem", "browser-ca.pem", "server.pem")}
        for path in set(data.rglob("*")) - certificates:  # whatever else it made (the lock) follows the umask
            assert not mode(path) & 0o077, path


def test_an_open_data_dir_from_an_older_start_is_made_private(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    database = make_file(data / "mwms.db", 0o644)  # an empty file is an empty SQLite database
    token = make_file(data / "admin-token", 0o644, b"an-old-admin-token-nobody-uses\n")
    key = make_file(data / "tls" / "ca-key.pem", 0o644)
    (data / "tls").chmod(0o755)
    with running_server(tmp_path, data):
        assert mode(data) == 0o700 and mode(data / "tls") == 0o700
        for path in (database, Path(f"{database}-wal"), Path(f"{database}-shm"), token, key):
            assert mode(path) == 0o600, path
    assert "was open to other users; restricting it to mode 0700" in (tmp_path / "server.log").read_text()


@as_root
def test_a_data_dir_of_another_user_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    os.chown(data, NOBODY, NOBODY)
    result = subprocess.run(
        [
            MWMS,
            "server",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--data-dir",
            str(data),
            "--tls-self-signed",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={name: value for name, value in os.environ.items() if not name.startswith("MWMS_")},
    )
    assert result.returncode == 2, result
    message = result.stderr.strip()
    assert message.startswith(f"error: {data} belongs to uid {NOBODY}")
    assert "give it a directory of its own (--data-dir)" in message and f"chown -R 0 {data}" in message
    assert list(data.iterdir()) == []  # no key, database or token was written into it


# --- the functions -------------------------------------------------------------------------------------


def test_a_new_dir_is_0700_whatever_the_umask(tmp_path):
    with umask(0o022):
        private_files.make_private_dir(tmp_path / "a" / "data")
    assert mode(tmp_path / "a" / "data") == 0o700
    assert mode(tmp_path / "a") == 0o755  # a parent is not ours to close


def test_an_open_dir_is_restricted_with_a_warning_and_a_closed_one_stays_closed(tmp_path, caplog):
    open_dir, closed = tmp_path / "open", tmp_path / "closed"
    open_dir.mkdir()
    open_dir.chmod(0o775)
    closed.mkdir()
    closed.chmod(0o500)
    with caplog.at_level(logging.WARNING, logger="mwms.server"):
        private_files.make_private_dir(open_dir)
        private_files.make_private_dir(closed)
        private_files.make_private_dir(tmp_path / "quickstart", 0o711)
    assert (mode(open_dir), mode(closed), mode(tmp_path / "quickstart")) == (0o700, 0o700, 0o711)
    warnings = [record.getMessage() for record in caplog.records]
    assert warnings == [f"{open_dir} (mode 0775) was open to other users; restricting it to mode 0700"]


@as_root
def test_a_dir_or_file_of_another_user_is_refused_and_left_as_it_was(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    foreign.chmod(0o755)
    os.chown(foreign, NOBODY, NOBODY)
    with pytest.raises(ForeignFileError, match=rf"belongs to uid {NOBODY} .*not to the user this runs as"):
        private_files.secure_data_dir(foreign, f"sqlite:///{foreign}/mwms.db")
    assert mode(foreign) == 0o755 and not (foreign / "mwms.db").exists()

    file = make_file(tmp_path / "token", 0o644)
    os.chown(file, NOBODY, NOBODY)
    with pytest.raises(ForeignFileError, match=r"make it yours \(chown 0 .*token\) or remove it"):
        private_files.make_private_file(file)
    assert mode(file) == 0o644


def test_a_shared_dir_or_a_file_is_no_data_dir(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(
        ForeignFileError, match="shared by every user .*mode 1777.*a directory of its own below it"
    ):
        private_files.make_private_dir(shared)
    assert mode(shared) == 0o1777
    with pytest.raises(ForeignFileError, match="is not a directory"):
        private_files.make_private_dir(make_file(tmp_path / "file", 0o644))


def test_secret_files_are_restricted_certificates_and_links_are_not(tmp_path):
    target = make_file(tmp_path / "elsewhere", 0o644)
    data = tmp_path / "data"
    secrets = [make_file(data / name, 0o640) for name in private_files.SECRET_FILES]
    certificate = make_file(data / "tls" / "ca.pem", 0o644)
    (data / "mwms.db-wal").symlink_to(target)
    private_files.secure_data_dir(data, f"sqlite:///{data}/mwms.db")
    assert [mode(path) for path in secrets] == [0o600] * len(secrets)
    assert mode(certificate) == 0o644 and mode(target) == 0o644
    assert mode(data / "mwms.db") == 0o600  # made empty, for SQLite to fill


def test_a_database_made_ahead_keeps_wal_and_shm_private_under_umask_022(tmp_path):
    database = tmp_path / "mwms.db"
    with umask(0o022):
        private_files.create_private_file(database)
        connection = sqlite3.connect(database)
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("CREATE TABLE t (x)")
            connection.commit()
            modes = [mode(Path(f"{database}{suffix}")) for suffix in ("", "-wal", "-shm")]
        finally:
            connection.close()
    assert modes == [0o600, 0o600, 0o600]


def test_postgresql_has_no_database_file_here(tmp_path):
    data = tmp_path / "data"
    private_files.secure_data_dir(data, "postgresql+psycopg://mwms@db.example/mwms")
    assert mode(data) == 0o700 and list(data.iterdir()) == []


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:////var/lib/mwms/mwms.db", Path("/var/lib/mwms/mwms.db")),
        ("sqlite:///relative.db", Path("relative.db")),
        ("sqlite://", None),
        ("sqlite:///:memory:", None),
        ("sqlite:///file:x.db?mode=ro&uri=true", None),
        ("postgresql+psycopg://u@h/db", None),
    ],
)
def test_the_database_file_of_a_url(url, expected):
    assert private_files.sqlite_file(url) == expected


def test_a_database_outside_the_data_dir_is_made_private_there(tmp_path):
    elsewhere = make_file(tmp_path / "db" / "coordinator.db", 0o644)
    private_files.secure_data_dir(tmp_path / "data", f"sqlite:///{elsewhere}")
    assert mode(elsewhere) == 0o600


# --- the quickstart's dir -----------------------------------------------------------------------------


def test_the_quickstart_dir_cannot_be_listed_and_its_logs_and_results_are_private(tmp_path):
    root = tmp_path / "mwms-quickstart"
    with umask(0o022):
        private_files.prepare_quickstart_dir(root, ("logs", "artifacts"))
    assert (mode(root), mode(root / "logs"), mode(root / "artifacts")) == (0o711, 0o700, 0o700)
    root.chmod(0o700)  # a dir its user closed further stays so
    private_files.prepare_quickstart_dir(root, ("logs", "artifacts"))
    assert mode(root) == 0o700


def test_the_quickstart_admin_token_of_an_earlier_run_is_made_0600(tmp_path):
    saved = make_file(tmp_path / "admin-token", 0o644, b"a-saved-quickstart-admin-token\n")
    assert quickstart_admin_token(saved) == "a-saved-quickstart-admin-token"
    assert mode(saved) == 0o600
    with umask(0o022):
        quickstart_admin_token(tmp_path / "new-token")
    assert mode(tmp_path / "new-token") == 0o600


@as_root
def test_quickstart_refuses_a_dir_of_another_user_before_starting_anything(tmp_path):
    root = tmp_path / "mwms-quickstart"
    root.mkdir()
    os.chown(root, NOBODY, NOBODY)
    result = CliRunner().invoke(app, ["quickstart", "--data-dir", str(root)])
    assert result.exit_code != 0
    assert f"{root} belongs to uid {NOBODY}" in " ".join(result.output.split())
    assert list(root.iterdir()) == []
