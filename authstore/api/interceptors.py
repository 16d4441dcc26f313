"""The internal port's gate: who may call what, decided before any handler runs.

Every handler of the store's internal port runs behind ``Gate`` (a gRPC interceptor), which
classifies the caller by its credential and lets the one access table (raftgate/internal_access.py)
decide; handlers find the caller's class in ``CALLER`` and check again with the request kind they
carry (``admit``). Probes without credentials get health answered without the request being read
(``health_without_reading``).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2

from authstore.api.callers import Classifier
from raftgate.internal_access import Caller, decide

#: The class of the caller whose call is being served: set by ``Gate`` before any handler runs
#: (a handler reached any other way finds none, and fails).
CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("raftgate_internal_caller")


class Refusal(Exception):
    """A request the store answers with a gRPC status (etcd's code and message) instead of a result."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def admit(method: str, caller: Caller, kind: str | None = None) -> None:
    """THE check of the internal port: may ``caller`` call ``method`` (carrying request ``kind``)?
    Decided by the one table (raftgate/internal_access.py); refused with its answer. Every
    handler goes through it: ``Gate`` before the handler runs, then Do, DoStream's calls and
    Snapshot again with the kind they carry."""
    refusal = decide(method, caller, kind)
    if refusal is not None:
        raise Refusal(*refusal)


def health_without_reading(servicer: health.aio.HealthServicer
                           ) -> Callable[[grpc.RpcMethodHandler], grpc.RpcMethodHandler]:
    """Health/Check for callers without credentials (probes), answered without reading the
    request: the status of the whole server (the only one this port reports), whatever service is
    named. A unary handler would read the request whole first, up to the port's 64 MiB limit.
    Nothing that stays open is served to them (Health/Watch needs a credential: each open stream
    is memory the store holds for someone it does not know)."""

    def open_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if handler.response_streaming:
            raise ValueError("an open (unauthenticated) method must answer at once, not stream")

        async def check(_requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
            return await servicer.Check(health_pb2.HealthCheckRequest(), context)
        return grpc.stream_unary_rpc_method_handler(check, response_serializer=handler.response_serializer)

    return open_handler


class Gate(grpc.aio.ServerInterceptor):
    """Every handler of the internal port (the Store's, health's and reflection's) runs behind
    ``admit``: the caller's class (its credential, ``Classifier``) and the method's row decide
    before the handler does anything, and the handler finds the class in ``CALLER``. A method
    with no row is refused (deny by default)."""

    def __init__(self, classifier: Classifier) -> None:
        self._classifier = classifier

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None  # no such method: grpc's UNIMPLEMENTED
        return handler._replace(**{
            name: guarded(getattr(handler, name), details.method, self._classifier)
            for name in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
            if getattr(handler, name) is not None})


def guarded(behaviour: Callable[..., Any], method: str, classifier: Classifier) -> Callable[..., Any]:
    """``behaviour`` (a coroutine or async generator function, as gRPC calls it), once ``admit``
    lets the caller in."""

    async def enter(context: grpc.aio.ServicerContext) -> None:
        caller = classifier.classify(context)
        try:
            admit(method, caller)
        except Refusal as exc:
            await context.abort(exc.code, exc.message)
        CALLER.set(caller)

    if inspect.isasyncgenfunction(behaviour):
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await enter(context)
            async with contextlib.aclosing(behaviour(request, context)) as items:  # its cleanup, when this ends
                async for item in items:
                    yield item
        return stream

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await enter(context)
        result = behaviour(request, context)
        return await result if inspect.isawaitable(result) else result
    return call
