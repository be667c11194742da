"""The coordinator's logic: plain functions that take a session and flush, never commit."""
