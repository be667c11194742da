"""The CLI's test fixtures, from the scaffolding (mwms_testkit/cli_fixtures.py)."""

from mwms_testkit.cli_fixtures import fake_api, private_config  # noqa: F401
