"""Telemetry: logs, metrics, device samples, stacks, preflight results, cluster counts and retention."""
