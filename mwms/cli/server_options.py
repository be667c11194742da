"""The options of `mwms server` (mwms/cli/daemons.py), each a type of its own: typer reads `Annotated`
aliases as it reads them inline. They are in the order --help lists them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mwms import log_setup
from mwms.cli.durations import DURATION_METAVAR, duration_option_parser

ServerHost = Annotated[
    str | None,
    typer.Option(help="Address both servers bind to [default: 127.0.0.1]; see --http-host, --grpc-host."),
]

ServerHttpHost = Annotated[
    str | None, typer.Option(help="Address the REST API and dashboard bind to (MWMS_HTTP_HOST).")
]

ServerGrpcHost = Annotated[
    str | None, typer.Option(help="Address the agents' gRPC endpoint binds to (MWMS_GRPC_HOST).")
]

ServerHttpPort = Annotated[
    int | None, typer.Option(min=0, max=65535, help="Port of the REST API and dashboard [default: 8080].")
]

ServerGrpcPort = Annotated[
    int | None, typer.Option(min=0, max=65535, help="Port agents connect to [default: 50051].")
]

ServerDataDir = Annotated[
    Path | None,
    typer.Option(
        help="Where the database, bundles and artifacts live, this user's alone (0700) [default: mwms-data]."
    ),
]

ServerDbUrl = Annotated[
    str | None, typer.Option(help="SQLAlchemy database URL; default: SQLite in --data-dir.")
]

ServerJoinToken = Annotated[
    str | None,
    typer.Option(
        help="A bootstrap join token agents may present; give it as MWMS_JOIN_TOKEN rather than this "
        "flag, since every user of the machine can read a command line. Admins can also make revocable "
        "ones with `mwms agent-token create`.",
        show_default=False,
    ),
]

ServerAllowedHosts = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated Host names the HTTP API answers (DNS rebinding); default: loopback "
        "names when bound to loopback, any otherwise."
    ),
]

ServerTlsCert = Annotated[Path | None, typer.Option(help="PEM certificate: serve REST and gRPC over TLS.")]

ServerTlsKey = Annotated[Path | None, typer.Option(help="PEM private key of --tls-cert.")]

ServerGrpcTlsCert = Annotated[
    Path | None, typer.Option(help="PEM certificate for gRPC when it differs from --tls-cert.")
]

ServerGrpcTlsKey = Annotated[Path | None, typer.Option(help="PEM private key of --grpc-tls-cert.")]

ServerTlsSelfSigned = Annotated[
    bool | None,
    typer.Option(
        "--tls-self-signed",
        help="Make a CA and a server certificate in <data dir>/tls and serve TLS with them; prints "
        "the CA's path and fingerprint for agents (--ca-file) and the CLI (MWMS_CA_FILE).",
    ),
]

ServerHangTimeout = Annotated[
    float | None,
    typer.Option(
        parser=duration_option_parser(allow_zero=True, bare_seconds=True),
        metavar=DURATION_METAVAR,
        help="Time without a log line or metric point, e.g. 30m (a bare number is seconds), after "
        "which a RUNNING job that sets no --hang-timeout of its own counts as hung "
        "(MWMS_HANG_TIMEOUT_S) [default: 0, off].",
        show_default=False,
    ),
]

ServerPortsFile = Annotated[
    Path | None,
    typer.Option(
        help='Once both servers listen, write {"http": N, "grpc": M} here: the ports bound, for '
        "--http-port 0 / --grpc-port 0 (MWMS_PORTS_FILE).",
        show_default=False,
    ),
]

ServerLogFormat = Annotated[
    str | None,
    typer.Option(
        help="How the coordinator logs to stderr: text, or json (one object a line, with job and agent "
        f"ids as keys, for journald, Loki and other log shippers) [default: {log_setup.DEFAULT_FORMAT}] "
        "(MWMS_LOG_FORMAT).",
        show_default=False,
    ),
]

ServerLogLevel = Annotated[
    str | None,
    typer.Option(
        help="Log records at this level or above: debug, info, warning or error "
        f"[default: {log_setup.DEFAULT_LEVEL}] (MWMS_LOG_LEVEL).",
        show_default=False,
    ),
]

ServerServeRole = Annotated[
    str | None,
    typer.Option(
        "--serve",
        help="What this replica serves: api (REST + dashboard), agents (the agents' gRPC, with /healthz "
        "and /metrics) or both [default: both]. Several replicas share one PostgreSQL --db-url "
        "(MWMS_SERVE).",
        show_default=False,
    ),
]

ServerReplicaName = Annotated[
    str | None,
    typer.Option(
        help="The name this replica is listed under [default: HOST:PID] (MWMS_REPLICA_NAME).",
        show_default=False,
    ),
]

ServerReplicaAddress = Annotated[
    str | None,
    typer.Option(
        help="The host other machines reach this replica by, shown in the replicas list [default: the "
        "bound host] (MWMS_REPLICA_ADDRESS).",
        show_default=False,
    ),
]

ServerGrpcReflection = Annotated[
    bool | None,
    typer.Option(
        "--grpc-reflection/--no-grpc-reflection",
        help="gRPC server reflection on the agents' port, for grpcurl; grpc.health.v1 is served either "
        "way [default: on] (MWMS_GRPC_REFLECTION).",
        show_default=False,
    ),
]

ServerSystemdUnit = Annotated[
    bool,
    typer.Option(
        "--systemd-unit",
        help="Print a mwms-server.service unit that runs the coordinator with these options, and exit: "
        "mwms server ... --systemd-unit | sudo tee /etc/systemd/system/mwms-server.service. Secrets "
        "(MWMS_DB_URL, MWMS_ADMIN_TOKEN, MWMS_JOIN_TOKEN) go in /etc/mwms/server.env (root, mode 0600), "
        "which the unit reads; the data dir defaults to /var/lib/mwms.",
    ),
]

ServerServiceUser = Annotated[
    str | None,
    typer.Option(
        help="With --systemd-unit: the user the service runs as [default: mwms].", show_default=False
    ),
]
