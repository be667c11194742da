"""The Python client's test fixtures, from the scaffolding (mwms_testkit/client_fixtures.py)."""

from mwms_testkit.client_fixtures import fake_api, private_config, program, user_token  # noqa: F401
