"""Runs after the preflight check passed on every worker of an `mwms doctor` job."""

import os

print(f"mwms doctor: worker {os.environ.get('MWMS_TASK_INDEX', '?')} passed the preflight check", flush=True)
