"""Which coordinator to call and how to prove who we are: the API address, the token and the CA file.

Each is taken from the command line, else the environment (MWMS_API, MWMS_TOKEN, MWMS_CA_FILE), else the
per-user config file that `mwms login` writes, else a default. The config file describes one coordinator:
its token and CA file are used only when talking to the address saved with them, so a token is never sent
to another coordinator named with --api.

Standard library only: `mwms.Client` and the CLI resolve connections here, the same way.
"""

from __future__ import annotations

import json
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mwms.errors import ConfigError

DEFAULT_API = "http://127.0.0.1:8080"
API_ENV = "MWMS_API"
TOKEN_ENV = "MWMS_TOKEN"
CA_FILE_ENV = "MWMS_CA_FILE"
CONFIG_ENV = "MWMS_CONFIG"  # an explicit config file path, e.g. one per cluster
FIRST_ADMIN_TOKEN_HINT = "a new coordinator writes its first admin token to <data dir>/admin-token"


def normalize_api(address: str) -> str:
    """'127.0.0.1:8080' -> 'http://127.0.0.1:8080'; no trailing slash."""
    address = address.strip()
    if "://" not in address:  # what people type
        address = "http://" + address
    return address.rstrip("/")


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    """$MWMS_CONFIG, else $XDG_CONFIG_HOME/mwms/config.json, else ~/.config/mwms/config.json."""
    environ = os.environ if environ is None else environ
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "mwms" / "config.json"


@dataclass(frozen=True)
class StoredConfig:
    """What `mwms login` saved: one coordinator's address, a token for it and, for https, a CA file."""

    api: str
    token: str = field(default="", repr=False)
    ca_file: str = ""

    def to_json(self) -> dict[str, str]:
        """The fields that are set, as the config file stores them."""
        values = {"api": self.api, "token": self.token, "ca_file": self.ca_file}
        return {key: value for key, value in values.items() if value}


def load_config(path: Path | None = None) -> StoredConfig | None:
    """The saved config, or None when there is none."""
    path = path or config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ConfigError(f"cannot read the mwms config file {path}: {error.strerror or error}") from None
    try:
        values = json.loads(text)
        if not isinstance(values, dict) or not isinstance(values.get("api", ""), str):
            raise ValueError("not an object with an api")
        return StoredConfig(
            api=normalize_api(values.get("api") or DEFAULT_API),
            token=str(values.get("token") or ""),
            ca_file=str(values.get("ca_file") or ""),
        )
    except ValueError:
        raise ConfigError(
            f"the mwms config file {path} is not valid JSON of the expected shape; "
            "fix it, or delete it and run `mwms login` again"
        ) from None


def save_config(config: StoredConfig, path: Path | None = None) -> Path:
    """Writes the config atomically, readable by its owner only (file 0600, new directories 0700)."""
    path = path or config_path()
    _make_private_dirs(path.parent)
    descriptor, temporary = tempfile.mkstemp(prefix=".config-", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(descriptor, 0o600)  # mkstemp makes it 0600 already; say so explicitly
        with os.fdopen(descriptor, "w") as file:
            json.dump(config.to_json(), file, indent=2)
            file.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def forget_token(path: Path | None = None) -> bool:
    """Removes the saved token (keeping the address and CA file); True if there was one."""
    path = path or config_path()
    config = load_config(path)
    if config is None or not config.token:
        return False
    if config.ca_file or config.api != DEFAULT_API:
        save_config(StoredConfig(api=config.api, ca_file=config.ca_file), path)
    else:
        path.unlink(missing_ok=True)
    return True


def _make_private_dirs(directory: Path) -> None:
    missing: list[Path] = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for new in reversed(missing):
        new.mkdir(mode=0o700, exist_ok=True)
        new.chmod(0o700)  # mkdir's mode is filtered by the umask


@dataclass(frozen=True)
class Connection:
    """A resolved coordinator address, token and CA file, and where each came from (for messages)."""

    api: str
    token: str = field(default="", repr=False)
    ca_file: str = ""
    token_source: str = ""  # "--token", "MWMS_TOKEN" or "the config file <path>"; empty without a token
    config_file: Path | None = None
    config_api: str = ""  # the address the config file's token is for, when it holds one

    def verify(self) -> ssl.SSLContext | bool:
        """The httpx `verify=` value: the CA file's certificates when one is set, else the system's."""
        if not self.ca_file:
            return True
        try:
            return ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise ConfigError(
                f"cannot use the CA file {self.ca_file}: {reason}; pass a PEM file with --ca-file or "
                f"{CA_FILE_ENV} (the coordinator's --tls-self-signed prints its path)"
            ) from None


def resolve_connection(
    api: str | None = None,
    token: str | None = None,
    ca_file: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Connection:
    """The connection in force: each of api, token, CA file from the argument, else env, else config."""
    environ = os.environ if environ is None else environ
    config_file = config_file or config_path(environ)
    config = load_config(config_file)
    resolved_api = normalize_api(api or environ.get(API_ENV) or (config.api if config else DEFAULT_API))
    # The saved token and CA file belong to the saved address only.
    saved = config if config is not None and config.api == resolved_api else None
    if token:
        secret, source = token, "--token"
    elif environ.get(TOKEN_ENV):
        secret, source = environ[TOKEN_ENV], TOKEN_ENV
    elif saved is not None and saved.token:
        secret, source = saved.token, f"the config file {config_file}"
    else:
        secret, source = "", ""
    ca = str(ca_file or environ.get(CA_FILE_ENV) or (saved.ca_file if saved else ""))
    return Connection(
        api=resolved_api,
        token=secret.strip(),
        ca_file=ca,
        token_source=source,
        config_file=config_file,
        config_api=config.api if config is not None and config.token else "",
    )
