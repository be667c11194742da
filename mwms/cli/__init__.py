"""The `mwms` command-line interface (entry point: mwms.cli.main:app)."""
