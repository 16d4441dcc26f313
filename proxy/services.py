"""gRPC handlers for every etcd v3 service, built from the method table over raw bytes.

No deserializers: requests reach the pipeline as the client's bytes and answers leave as the
store's bytes, so the proxy only parses the three requests it must (Authenticate, UserAdd,
UserChangePassword).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

import grpc

from proxy import instrument
from proxy.audit import handlers as audit
from proxy.pipeline import Pipeline
from raftgate.methods import METHODS, Kind, Method


def too_large(size: int, limit: int) -> str:
    """grpc-go's words for a request over the receive limit (grpc-core words it differently)."""
    return f"grpc: received message larger than max ({size} vs. {limit})"


UNARY_KINDS = (Kind.UNARY, Kind.AUTHENTICATE, Kind.HASH_PASSWORD)


def _bounded_unary(behaviour: Any, method: Method, limit: int) -> Any:
    """``_bounded`` for a unary method, with the method bound in the same closure (one call
    layer less on every request than a ``functools.partial`` around it)."""

    async def unary(request: bytes, context: Any) -> bytes:
        if len(request) > limit:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, too_large(len(request), limit))
        return await behaviour(method, request, context)

    return unary


def _bounded(behaviour: Any, kind: Kind, limit: int) -> Any:
    """Refuses a request over `limit` as etcd's grpc-go server does, before `behaviour` sees it
    (streaming methods; unary ones: ``_bounded_unary``).

    gRPC's own receive limit sits above `limit` (see ProxyServer), so the refusal is ours.
    """

    async def refuse(size: int, context: Any) -> None:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, too_large(size, limit))

    if kind in (Kind.RANGE_STREAM, Kind.SNAPSHOT):

        async def unary_stream(method: Method, request: bytes, context: Any) -> AsyncIterator[bytes]:
            if len(request) > limit:
                await refuse(len(request), context)
            async for answer in behaviour(method, request, context):
                yield answer

        return unary_stream

    async def stream_stream(method: Method, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        # The handler may read the client in a task of its own (Watch) and go on serving after the
        # client's side ends, so an oversized message interrupts the wait for its next answer;
        # never a send in progress (the handler task is cancelled only while it waits here).
        task = asyncio.current_task()
        state = {"size": 0, "waiting": False}

        async def checked() -> AsyncIterator[bytes]:
            async for data in requests:
                if len(data) > limit:
                    state["size"] = len(data)
                    if state["waiting"] and task is not None and task is not asyncio.current_task():
                        task.cancel()
                    return
                yield data

        answers = behaviour(method, checked(), context)
        try:
            while not state["size"]:
                state["waiting"] = True
                try:
                    answer = await answers.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    state["waiting"] = False
                yield answer
        except asyncio.CancelledError:
            if not state["size"]:
                raise
        finally:
            await answers.aclose()
        if state["size"]:
            await refuse(state["size"], context)

    return stream_stream


def handler(pipeline: Pipeline, method: Method, limit: int | None = None) -> grpc.RpcMethodHandler:
    """The one handler of ``method``: the gRPC server registers it and the JSON gateway calls it,
    so both paths share token extraction, auditing and errors."""
    log = getattr(pipeline, "audit", None)  # a test stub may have none

    def bound(behaviour: Any) -> Any:
        if limit is not None and method.kind in UNARY_KINDS:
            return _bounded_unary(behaviour, method, limit)
        return functools.partial(behaviour if limit is None else _bounded(behaviour, method.kind, limit), method)

    # The audit log sees every call here, the JSON gateway's too (it calls these handlers).
    def unary(behaviour: Any) -> grpc.RpcMethodHandler:
        inner = bound(behaviour) if log is None else audit.unary(log, method, bound(behaviour))
        return grpc.unary_unary_rpc_method_handler(instrument.unary(method, inner))

    def stream(behaviour: Any) -> Any:
        inner = bound(behaviour) if log is None else audit.stream(log, method, bound(behaviour))
        return instrument.stream(method, inner)

    if method.kind is Kind.UNARY:
        return unary(pipeline.unary)
    if method.kind is Kind.AUTHENTICATE:
        return unary(pipeline.authenticate)
    if method.kind is Kind.HASH_PASSWORD:
        return unary(pipeline.hash_password)
    if method.kind is Kind.RANGE_STREAM:
        return grpc.unary_stream_rpc_method_handler(stream(pipeline.range_stream))
    if method.kind is Kind.SNAPSHOT:
        return grpc.unary_stream_rpc_method_handler(stream(pipeline.snapshot))
    if method.kind is Kind.KEEPALIVE:
        return grpc.stream_stream_rpc_method_handler(stream(pipeline.keepalive))
    if method.kind is Kind.WATCH:
        return grpc.stream_stream_rpc_method_handler(stream(pipeline.watch))
    raise AssertionError(f"no handler for {method.kind}")


def etcd_handlers(pipeline: Pipeline, max_receive_bytes: int | None = None) -> list[grpc.GenericRpcHandler]:
    """One generic handler per etcd service (KV, Watch, Lease, Cluster, Maintenance, Auth);
    requests over `max_receive_bytes` (if given) are refused with grpc-go's words."""
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for method in METHODS:
        by_service.setdefault(method.full_service, {})[method.name] = handler(pipeline, method, max_receive_bytes)
    return [grpc.method_handlers_generic_handler(service, handlers) for service, handlers in by_service.items()]
