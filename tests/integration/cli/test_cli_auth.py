"""Tokens in the CLI, over real HTTP against the fake API: where the token comes from, mwms login/logout,
401/403 messages and exit codes, and the admin commands (token, agent-token, remove-agent)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mwms.cli.errors import ExitCode
from mwms.cli.main import app
from mwms.connection import (
    DEFAULT_API,
    ConfigError,
    StoredConfig,
    forget_token,
    load_config,
    resolve_connection,
    save_config,
)
from mwms_testkit.fake_api import ADMIN_TOKEN, USER_TOKEN, VIEWER_TOKEN, FakeState

runner = CliRunner()
SECRETS = (ADMIN_TOKEN, USER_TOKEN, VIEWER_TOKEN)


def _invoke(*argv: str, env: dict[str, str] | None = None, stdin: str | None = None):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(argv), env=env, input=stdin)


def _no_secret_in(output: str) -> None:
    for secret in SECRETS:
        assert secret not in output


@pytest.fixture
def program(tmp_path: Path) -> Path:
    directory = tmp_path / "prog"
    directory.mkdir()
    (directory / "train.py").write_text("print('x')\n")
    return directory


# -- resolution ------------------------------------------------------------------------------------------


def test_resolution_order_flag_then_environment_then_config(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    save_config(StoredConfig(api="http://coordinator:8080", token="from-config", ca_file="/ca.pem"), config)
    environ = {"MWMS_TOKEN": "from-env"}
    resolved = resolve_connection(environ={}, config_file=config)
    assert (resolved.api, resolved.token, resolved.ca_file) == (
        "http://coordinator:8080",
        "from-config",
        "/ca.pem",
    )
    assert str(config) in resolved.token_source
    resolved = resolve_connection(environ=environ, config_file=config)
    assert (resolved.token, resolved.token_source) == ("from-env", "MWMS_TOKEN")
    resolved = resolve_connection(token="from-flag", environ=environ, config_file=config)
    assert (resolved.token, resolved.token_source) == ("from-flag", "--token")
    assert "from-flag" not in repr(resolved), "the token never shows in a repr"


def test_saved_token_and_ca_are_only_for_the_saved_address(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    save_config(StoredConfig(api="http://a:8080", token="secret-a", ca_file="/ca.pem"), config)
    other = resolve_connection("b:8080", environ={}, config_file=config)
    assert (other.api, other.token, other.ca_file) == ("http://b:8080", "", "")
    assert other.config_api == "http://a:8080"
    via_env = resolve_connection(environ={"MWMS_API": "http://a:8080/"}, config_file=config)
    assert via_env.token == "secret-a"


def test_without_anything_the_default_address_and_no_token(tmp_path: Path) -> None:
    resolved = resolve_connection(environ={}, config_file=tmp_path / "none.json")
    assert (resolved.api, resolved.token, resolved.verify()) == (DEFAULT_API, "", True)


def test_config_file_is_private_and_logout_keeps_the_address(tmp_path: Path) -> None:
    config = tmp_path / "new" / "mwms" / "config.json"
    save_config(StoredConfig(api="http://a:1", token="t"), config)
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(config.parent.parent.stat().st_mode) == 0o700
    assert forget_token(config) is True
    assert load_config(config) == StoredConfig(api="http://a:1")
    assert forget_token(config) is False


def test_a_broken_config_file_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    config.write_text("{not json")
    with pytest.raises(ConfigError, match="mwms login"):
        resolve_connection(environ={}, config_file=config)


def test_a_missing_ca_file_is_a_clear_error(fake_api: tuple[str, FakeState], tmp_path: Path) -> None:
    result = _invoke("jobs", "--api", fake_api[0], "--ca-file", str(tmp_path / "nope.pem"))
    assert result.exit_code == ExitCode.USAGE
    assert "nope.pem" in result.stderr and "--ca-file" in result.stderr


def test_commands_send_the_token_as_bearer(fake_api: tuple[str, FakeState]) -> None:
    api, state = fake_api
    assert _invoke("jobs", "--api", api).exit_code == 0
    assert state.authorization_headers[-1] == f"Bearer {USER_TOKEN}"
    assert _invoke("agents", "--api", api, "--token", VIEWER_TOKEN).exit_code == 0
    assert state.authorization_headers[-1] == f"Bearer {VIEWER_TOKEN}"


def test_flag_beats_environment_beats_login(
    fake_api: tuple[str, FakeState], private_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = fake_api[0]
    save_config(StoredConfig(api=api, token=ADMIN_TOKEN), private_config)

    def user_of(*extra: str) -> str:
        result = _invoke("whoami", "--json", *extra)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["user"]

    monkeypatch.delenv("MWMS_TOKEN")
    assert user_of() == "alice"  # address and token from the config file
    monkeypatch.setenv("MWMS_TOKEN", USER_TOKEN)
    assert user_of() == "bob"
    assert user_of("--token", VIEWER_TOKEN) == "carol"


# -- 401 and 403 -------------------------------------------------------------------------------------------


def test_no_token_exits_5_and_says_how_to_log_in(
    fake_api: tuple[str, FakeState], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MWMS_TOKEN")
    result = _invoke("jobs", "--api", fake_api[0])
    assert result.exit_code == ExitCode.NOT_AUTHORIZED == 5
    assert "mwms login" in result.stderr and "MWMS_TOKEN" in result.stderr
    assert "admin-token" in result.stderr
    assert fake_api[1].authorization_headers[-1] == ""


def test_a_refused_token_is_named_by_its_source_never_shown(
    fake_api: tuple[str, FakeState], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MWMS_TOKEN", "mwms_wrong-secret-value")
    result = _invoke("status", "job0001", "--api", fake_api[0])
    assert result.exit_code == 5
    assert "refused the token from MWMS_TOKEN" in result.stderr and "mwms login" in result.stderr
    assert "wrong-secret-value" not in result.output
    flagged = _invoke("jobs", "--api", fake_api[0], "--token", "mwms_other-wrong")
    assert flagged.exit_code == 5 and "from --token" in flagged.stderr
    assert "other-wrong" not in flagged.output


def test_the_saved_token_is_not_sent_to_another_coordinator(
    fake_api: tuple[str, FakeState], private_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MWMS_TOKEN")
    save_config(StoredConfig(api="http://elsewhere:8080", token=ADMIN_TOKEN), private_config)
    result = _invoke("jobs", "--api", fake_api[0])
    assert result.exit_code == 5
    assert "saved by `mwms login` is for http://elsewhere:8080" in result.stderr
    assert fake_api[1].authorization_headers[-1] == ""


def test_a_viewer_may_not_submit_or_cancel(fake_api: tuple[str, FakeState], program: Path) -> None:
    api = fake_api[0]
    submitted = _invoke(
        "submit", str(program), "-n", "1", "--api", api, "--token", VIEWER_TOKEN, "--", "python", "x"
    )
    assert submitted.exit_code == 5
    assert "not allowed" in submitted.stderr and "viewer" in submitted.stderr
    job_id = _invoke(
        "submit", str(program), "-n", "1", "--api", api, "--", "python", "x"
    ).stdout.splitlines()[0]
    cancelled = _invoke("cancel", job_id, "--api", api, "--token", VIEWER_TOKEN)
    assert cancelled.exit_code == 5 and "needs the user role" in cancelled.stderr
    _no_secret_in(submitted.output + cancelled.output)


# -- login, logout, whoami ---------------------------------------------------------------------------------


def test_login_checks_the_token_and_saves_it_privately(
    fake_api: tuple[str, FakeState], private_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MWMS_TOKEN")
    token_file = tmp_path / "admin-token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    result = _invoke("login", "--api", fake_api[0], "--token-file", str(token_file))
    assert result.exit_code == 0, result.output
    assert "as alice (admin)" in result.stdout and str(private_config) in result.stderr
    _no_secret_in(result.output)
    assert stat.S_IMODE(private_config.stat().st_mode) == 0o600
    assert json.loads(private_config.read_text()) == {"api": fake_api[0], "token": ADMIN_TOKEN}
    # Later commands need neither --api nor a token.
    listed = _invoke("token", "list", "--json")
    assert listed.exit_code == 0, listed.output
    whoami = _invoke("whoami")
    assert "alice (admin)" in whoami.stdout and "config file" in whoami.stderr


def test_login_reads_stdin_with_a_dash(fake_api: tuple[str, FakeState], private_config: Path) -> None:
    result = _invoke("login", "--api", fake_api[0], "--token", "-", "--json", stdin=VIEWER_TOKEN + "\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["user"] == "carol"
    assert load_config(private_config) == StoredConfig(api=fake_api[0], token=VIEWER_TOKEN)


def test_login_refuses_a_bad_token_and_saves_nothing(
    fake_api: tuple[str, FakeState], private_config: Path
) -> None:
    result = _invoke("login", "--api", fake_api[0], "--token-file", "-", stdin="mwms_not-a-real-token\n")
    assert result.exit_code == 5
    assert "refused this token" in result.stderr and "nothing was saved" in result.stderr
    assert "not-a-real-token" not in result.output
    assert not private_config.exists()


def test_login_without_a_token_off_a_terminal_says_how(
    fake_api: tuple[str, FakeState], private_config: Path
) -> None:
    result = _invoke("login", "--api", fake_api[0], stdin="")
    assert result.exit_code == 2 and "--token-file" in result.stderr
    both = _invoke("login", "--token", "a", "--token-file", "b")
    assert both.exit_code == 2 and "not both" in both.stderr


def test_logout_forgets_the_token(
    fake_api: tuple[str, FakeState], private_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MWMS_TOKEN")
    save_config(StoredConfig(api=fake_api[0], token=USER_TOKEN), private_config)
    result = _invoke("logout")
    assert result.exit_code == 0 and str(private_config) in result.stdout
    assert load_config(private_config) == StoredConfig(api=fake_api[0])
    after = _invoke("jobs")  # the address is still known, the token is not
    assert after.exit_code == 5 and fake_api[0] in after.stderr
    again = _invoke("logout")
    assert again.exit_code == 0 and "no token saved" in again.stderr


# -- admin commands ----------------------------------------------------------------------------------------


def test_token_create_prints_the_secret_once_then_list_and_revoke(fake_api: tuple[str, FakeState]) -> None:
    api, state = fake_api
    admin = ("--api", api, "--token", ADMIN_TOKEN)
    created = _invoke("token", "create", "--user", "dave", "--role", "viewer", "--expires-in", "30d", *admin)
    assert created.exit_code == 0, created.output
    secret = created.stdout.strip()
    assert state.tokens[secret]["user"] == "dave" and state.tokens[secret]["role"] == "viewer"
    assert state.tokens[secret]["expires_at"] is not None
    assert "shown only this once" in created.stderr and secret not in created.stderr
    token_id = state.tokens[secret]["id"]

    listed = _invoke("token", "list", *admin)
    assert listed.exit_code == 0 and token_id in listed.stdout and "dave" in listed.stdout
    assert "viewer" in listed.stdout and "active" in listed.stdout
    assert secret not in listed.output
    as_json = json.loads(_invoke("token", "list", "--json", *admin).stdout)
    assert {item["id"] for item in as_json} >= {token_id} and all("token" not in item for item in as_json)

    assert _invoke("whoami", "--api", api, "--token", secret).exit_code == 0
    revoked = _invoke("token", "revoke", token_id, *admin)
    assert revoked.exit_code == 0 and f"revoked API token {token_id}" in revoked.stdout
    refused = _invoke("whoami", "--api", api, "--token", secret)
    assert refused.exit_code == 5 and secret not in refused.output
    assert "revoked" in _invoke("token", "list", *admin).stdout
    assert _invoke("token", "revoke", "nope", *admin).exit_code == 4


def test_token_create_json_has_the_whole_object(fake_api: tuple[str, FakeState]) -> None:
    created = _invoke(
        "token",
        "create",
        "--user",
        "erin",
        "--name",
        "ci",
        "--json",
        "--api",
        fake_api[0],
        "--token",
        ADMIN_TOKEN,
    )
    assert created.exit_code == 0, created.output
    body = json.loads(created.stdout)
    assert body["user"] == "erin" and body["name"] == "ci" and body["role"] == "user"
    assert body["token"] in fake_api[1].tokens and body["expires_at"] is None


def test_token_create_checks_its_options_before_calling(fake_api: tuple[str, FakeState]) -> None:
    api = ("--api", fake_api[0], "--token", ADMIN_TOKEN)
    bad_role = _invoke("token", "create", "--user", "x", "--role", "root", *api)
    assert bad_role.exit_code == 2 and "admin, user, viewer" in bad_role.stderr
    bad_expiry = _invoke("token", "create", "--user", "x", "--expires-in", "soon", *api)
    assert bad_expiry.exit_code == 2 and "30d" in bad_expiry.stderr
    assert len(fake_api[1].tokens) == 3


def test_token_commands_need_an_admin(fake_api: tuple[str, FakeState]) -> None:
    result = _invoke("token", "create", "--user", "x", "--api", fake_api[0])  # MWMS_TOKEN: a user
    assert result.exit_code == 5 and "needs the admin role" in result.stderr


def test_agent_token_create_list_revoke(fake_api: tuple[str, FakeState]) -> None:
    api, state = fake_api
    admin = ("--api", api, "--token", ADMIN_TOKEN)
    created = _invoke("agent-token", "create", "--name", "rack-1", "--expires-in", "12h", *admin)
    assert created.exit_code == 0, created.output
    secret = created.stdout.strip()
    assert state.join_tokens[secret]["name"] == "rack-1"
    assert "MWMS_JOIN_TOKEN" in created.stderr and secret not in created.stderr
    listed = _invoke("agent-token", "list", *admin)
    assert "rack-1" in listed.stdout and "join1" in listed.stdout and secret not in listed.output
    as_json = json.loads(_invoke("agent-token", "create", "--json", *admin).stdout)
    assert as_json["name"] == "agents" and as_json["token"].startswith("mwmsj_")
    revoked = _invoke("agent-token", "revoke", "join1", "--json", *admin)
    assert revoked.exit_code == 0 and json.loads(revoked.stdout)["revoked_at"]


def test_remove_agent_by_name_or_id(fake_api: tuple[str, FakeState]) -> None:
    api, state = fake_api
    admin = ("--api", api, "--token", ADMIN_TOKEN)
    as_user = _invoke("remove-agent", "local-1", "--api", api)
    assert as_user.exit_code == 5 and "admin" in as_user.stderr
    unknown = _invoke("remove-agent", "nobody", *admin)
    assert unknown.exit_code == 4 and "mwms agents" in unknown.stderr
    removed = _invoke("remove-agent", "local-1", *admin)
    assert removed.exit_code == 0, removed.output
    assert "removed agent local-1 (a1)" in removed.stdout and state.removed_agents == ["a1"]


# -- who submitted ---------------------------------------------------------------------------------------


def test_jobs_and_status_show_who_submitted_and_cancelled(
    fake_api: tuple[str, FakeState], program: Path
) -> None:
    api = fake_api[0]
    job_id = _invoke(
        "submit", str(program), "-n", "1", "--api", api, "--", "python", "x"
    ).stdout.splitlines()[0]
    assert _invoke("cancel", job_id, "--api", api, "--token", ADMIN_TOKEN).exit_code == 0
    jobs = _invoke("jobs", "--api", api)
    assert "SUBMITTED BY" in jobs.stdout and "bob" in jobs.stdout
    status = _invoke("status", job_id, "--api", api)
    assert "submitted by: bob" in status.stdout.replace("  ", " ").replace("  ", " ")
    assert "cancelled by" in status.stdout and "alice" in status.stdout
