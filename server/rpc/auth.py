"""The one gate in front of every AgentService RPC: agent credentials, and errors that reveal nothing.

Every method needs a valid agent credential (`authorization: Bearer <credential>` metadata) except those
in PUBLIC_METHODS, so a new RPC cannot be born unprotected. Servicers learn who is calling from
`authenticated_agent_id()`, never from request fields. The same wrapper turns what a handler raises into a
status: domain errors into their code and message (server/rpc/status.py), anything unexpected into
INTERNAL with a generic message (the details go to the coordinator's log, not to the caller).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, NoReturn

import grpc

from mwms.server.db.engine import Database
from mwms.server.errors import DomainError, Forbidden, Unauthenticated
from mwms.server.rpc import health
from mwms.server.rpc.status import grpc_status
from mwms.server.services.fleet.agent_auth import authenticate_agent

log = logging.getLogger("mwms.server.rpc.auth")

METADATA_KEY = "authorization"
# Register, and the standard health and reflection services (probes and grpcurl carry no credential).
PUBLIC_METHODS = frozenset({"/mwms.v1.AgentService/Register", *health.PUBLIC_METHODS})
INTERNAL_MESSAGE = "internal error in the coordinator; its log has the details"

_agent_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("mwms_agent_id", default=None)


def presented_credential(metadata: Iterable[Any] | None) -> str:
    """The credential in `authorization: Bearer <credential>` metadata, "" when there is none."""
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str):
            scheme, _, credential = value.partition(" ")
            return credential.strip() if scheme.lower() == "bearer" else ""
    return ""


def authenticated_agent_id() -> str:
    """The agent the interceptor verified for this call."""
    agent_id = _agent_id.get()
    if agent_id is None:  # a public method asked for a caller: a wiring mistake, never allow it
        raise Unauthenticated("this call carries no verified agent credential")
    return agent_id


async def _abort_for(context: grpc.aio.ServicerContext, method: str, error: Exception) -> NoReturn:
    if isinstance(error, DomainError):
        if isinstance(error, (Unauthenticated, Forbidden)):
            log.warning("refused %s from %s: %s", method, context.peer(), error)
        await context.abort(grpc_status(error), str(error))
    log.error("%s failed", method, exc_info=error)
    await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
    raise AssertionError("unreachable: abort raises")


class AgentAuthInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates every call but the public ones and keeps exception details out of statuses."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def _authenticate(self, credential: str) -> str:
        with self._db.read() as session:
            return authenticate_agent(session, credential)

    async def _admit(self, method: str, context: grpc.aio.ServicerContext) -> None:
        if method in PUBLIC_METHODS:
            return
        credential = presented_credential(context.invocation_metadata())
        _agent_id.set(await asyncio.to_thread(self._authenticate, credential))

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return self._guard(handler, handler_call_details.method)

    def _guard(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        behavior = (
            handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
        )
        admit = self._admit

        async def unary_response(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                await admit(method, context)
                result = behavior(request, context)
                return await result if inspect.isawaitable(result) else result
            except grpc.aio.AbortError:
                raise
            except Exception as error:  # noqa: BLE001 - every failure becomes a clean status
                await _abort_for(context, method, error)

        async def streamed_response(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                await admit(method, context)
                async for response in behavior(request, context):
                    yield response
            except grpc.aio.AbortError:
                raise
            except Exception as error:  # noqa: BLE001
                await _abort_for(context, method, error)

        async def read_write(request: Any, context: grpc.aio.ServicerContext) -> None:
            # A streaming handler that writes with context.write() and returns nothing.
            try:
                await admit(method, context)
                await behavior(request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as error:  # noqa: BLE001
                await _abort_for(context, method, error)

        codec = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if not handler.response_streaming:
            make = (
                grpc.stream_unary_rpc_method_handler
                if handler.request_streaming
                else grpc.unary_unary_rpc_method_handler
            )
            return make(unary_response, **codec)
        streaming = streamed_response if inspect.isasyncgenfunction(behavior) else read_write
        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(streaming, **codec)
        return grpc.unary_stream_rpc_method_handler(streaming, **codec)
