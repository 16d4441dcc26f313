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
    if error is not None and isinstance(error, asyncio.CancelledError | GeneratorExit):
        return grpc.StatusCode.CANCELLED.name
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    if error is not None:
        return grpc.StatusCode.UNKNOWN.name
    return grpc.StatusCode.OK.name


def unary(method: Method, behaviour: UnaryBehaviour) -> UnaryBehaviour:
    service, name = method.full_service, method.name
    # The method's series, looked up once each (``labels()`` costs more than the observation):
    # on first use, so a method never called exports no series, as before.
    duration: Any = None
    counts: dict[str, Any] = {}

    async def observed(request: Any, context: Context) -> bytes:
        nonlocal duration
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
            if duration is None:
                duration = metrics.REQUEST_DURATION.labels(service, name)
            duration.observe(time.perf_counter() - started)
            code = _code(context, error)
            counter = counts.get(code)
            if counter is None:
                counter = counts[code] = metrics.REQUESTS.labels(service, name, code)
            counter.inc()

    return observed


def stream(method: Method, behaviour: StreamBehaviour) -> StreamBehaviour:
    service, name = method.full_service, method.name

    gauges: list[Any] = []  # the method's open-streams series, looked up on first use
    counts: dict[str, Any] = {}

    async def observed(request: Any, context: Context) -> AsyncIterator[bytes]:
        error: BaseException | None = None
        if not gauges:
            gauges.append(metrics.OPEN_STREAMS.labels(service, name))
        gauge = gauges[0]
        gauge.inc()
        try:
            async for message in behaviour(request, context):
                yield message
        except BaseException as e:
            error = e
            raise
        finally:
            gauge.dec()
            code = _code(context, error)
            counter = counts.get(code)
            if counter is None:
                counter = counts[code] = metrics.REQUESTS.labels(service, name, code)
            counter.inc()

    return observed
