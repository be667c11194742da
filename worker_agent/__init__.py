"""The per-machine agent: registers with the coordinator, runs its tasks, ships their logs and metrics."""
