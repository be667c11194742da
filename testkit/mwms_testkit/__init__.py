"""The scaffolding mwms's tests and benchmarks share: a process cluster (cluster.py, replica_cluster.py,
runtime_cluster.py), a coordinator inside the test process (in_process_coordinator.py) and a threaded server
for apps over real HTTP (served_app.py), one fake REST API that answers with the coordinator's response
models (fake_api/), a throwaway PostgreSQL server (postgres_server.py), the agent simulator (simulator.py),
the SQL statement counter (sql_statements.py), the training programs the system tests run (programs/) and
real stack dumps (stack_dumps/).

Installed editable by `make install` (testkit/pyproject.toml); not part of mwms's wheel."""

from pathlib import Path

from mwms import grpc_process

# The simulated agents and the coordinators run in tests speak gRPC as mwms's own processes do (the same I/O
# path, set before gRPC loads): whatever imports the scaffolding imports it before gRPC.
grpc_process.configure()

# The repository: testkit/ sits at its top.
REPO = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).resolve().parent / "programs"
# Real stack dumps of training workers (py-spy and faulthandler), as agents send them.
STACK_DUMPS = Path(__file__).resolve().parent / "stack_dumps"
