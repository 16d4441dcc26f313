"""Wraps the etcd v3 handlers to count every RPC by method and gRPC status code.

Why wrap handlers rather than intercept: a grpc.aio interceptor sees the call before the handler
runs but not how it ended; the wrapper sees the status the handler left on its context (an
``abort`` sets it before raising) and can keep the open-streams gauge exact.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from proxy import metrics
from raftgate import stages
from raftgate.methods import Method

Context = grpc.aio.ServicerContext
UnaryBehaviour = Callable[[Any, Context], Awaitable[bytes]]
StreamBehaviour = Callable[[Any, Context], AsyncIterator[bytes]]


def _code(context: Context, error: BaseException | None) -> str:
    if isinstance(error, asyncio.CancelledError | GeneratorExit):
        return grpc.StatusCode.CANCELLED.name
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    if error is not None:
        return grpc.StatusCode.UNKNOWN.name
    return grpc.StatusCode.OK.name


def unary(method: Method, behaviour: UnaryBehaviour) -> UnaryBehaviour:
    service, name = method.full_service, method.name

    async def observed(request: Any, context: Context) -> bytes:
        started = time.perf_counter()
        error: BaseException | None = None
        trace = token = None
        if stages.ON and stages.sampled():
            trace = stages.ProxyTrace()
            token = stages.CURRENT.set(trace)  # this handler's task only: its store call carries the mark
        try:
            return await behaviour(request, context)
        except BaseException as e:
            error = e
            raise
        finally:
            if trace is not None and token is not None:
                stages.CURRENT.reset(token)
                trace.finish()
            metrics.REQUEST_DURATION.labels(service, name).observe(time.perf_counter() - started)
            metrics.REQUESTS.labels(service, name, _code(context, error)).inc()

    return observed


def stream(method: Method, behaviour: StreamBehaviour) -> StreamBehaviour:
    service, name = method.full_service, method.name

    async def observed(request: Any, context: Context) -> AsyncIterator[bytes]:
        error: BaseException | None = None
        gauge = metrics.OPEN_STREAMS.labels(service, name)
        gauge.inc()
        try:
            async for message in behaviour(request, context):
                yield message
        except BaseException as e:
            error = e
            raise
        finally:
            gauge.dec()
            metrics.REQUESTS.labels(service, name, _code(context, error)).inc()

    return observed
