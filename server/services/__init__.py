"""The coordinator's logic: plain functions that take a session and flush, never commit.

By concern:
- job_life/: jobs and their lifecycle (submit, transitions, attempts and their endings, restarts, hangs,
  the reconciler, what a task is started with);
- scheduler/: the scheduling pass, the queue's order and plan, placement and the fit rules, fair share,
  wait reasons and start estimates;
- fleet/: agents (registration, credentials, commands, cordons and drains, device identity, replicas);
- observing/: telemetry (logs, metrics, device samples, stacks, preflight results, counts, retention);
- auth/: API and join tokens, and who may act on a job;
- storage/: bundles, artifacts and checkpoints, shared files, uploads, job environments.
Left here: the read views every API page builds on (views.py), and two small helpers.
"""
