"""The standard grpc.health.v1 service and server reflection on the coordinator's gRPC port.

Kubernetes `grpc:` probes, Envoy/HAProxy/NGINX gRPC health checks and `grpcurl` speak these. Health
answers NOT_SERVING until the database and the coordinator's loops are up, SERVING then, and NOT_SERVING
again from the moment the coordinator starts to stop, before the gRPC server's grace period, so probes
and Watch streams see it go. Both services are public (server/rpc/auth.py): they reveal no job, agent or
credential, only whether the coordinator serves and the shape of its protocol.
"""

from __future__ import annotations

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from mwms.v1 import agent_pb2

AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name
# Health answers for the whole server ("") and for the agents' service by its full name.
HEALTH_SERVICES = (health.OVERALL_HEALTH, AGENT_SERVICE)


def _method_paths(*services: ServiceDescriptor) -> frozenset[str]:
    return frozenset(
        f"/{service.full_name}/{method.name}" for service in services for method in service.methods
    )


# Every method of the two services, whether reflection is on or not (off, it has no handler: UNIMPLEMENTED).
PUBLIC_METHODS = _method_paths(
    health_pb2.DESCRIPTOR.services_by_name["Health"],
    reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"],
)

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class GrpcHealth:
    """What grpc.health.v1 answers for this coordinator; starts NOT_SERVING."""

    def __init__(self) -> None:
        self._servicer = health.aio.HealthServicer()
        self._status = _NOT_SERVING
        self._stopping = False

    async def add_to(self, server: grpc.aio.Server, *, reflection_on: bool) -> None:
        """Adds the health service to `server`, answering NOT_SERVING until serving(), and reflection
        (listing the agents' service and health) when `reflection_on`."""
        await self._set(_NOT_SERVING)  # the library's servicer starts at SERVING
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)
        if reflection_on:
            reflection.enable_server_reflection(
                (AGENT_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server
            )

    async def serving(self) -> None:
        """SERVING: the database and the loops are up."""
        await self._set(_SERVING)

    async def stopping(self) -> None:
        """NOT_SERVING from now on: the coordinator is shutting down."""
        self._stopping = True
        self._status = _NOT_SERVING
        await self._servicer.enter_graceful_shutdown()

    @property
    def status(self) -> str:
        """SERVING or NOT_SERVING, as health answers it for the whole server."""
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(self._status))

    async def _set(self, status: health_pb2.HealthCheckResponse.ServingStatus) -> None:
        if self._stopping:
            return
        self._status = status
        for service in HEALTH_SERVICES:
            await self._servicer.set(service, status)
