"""The coordinator's live machinery: what exists only in memory while the coordinator runs.

The agent hub, the telemetry and device writers, the stack collector, liveness, task progress, the hang
detector and the background loops. None of it is a transport: the gRPC servicers (server/rpc/) and the
HTTP routers (server/api/) both use it, through the one container server/live/wiring.py builds, and
neither imports the other. All of it is rebuilt from the database when the coordinator restarts.
"""
