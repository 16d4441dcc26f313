"""gRPC handlers for every etcd v3 service, built from the method table over raw bytes.

No deserializers: requests reach the pipeline as the client's bytes and answers leave as the
store's bytes, so the proxy only parses the three requests it must (Authenticate, UserAdd,
UserChangePassword).
"""

from __future__ import annotations

import functools
from typing import Any

import grpc

from proxy import instrument
from proxy.pipeline import Pipeline
from raftgate.methods import METHODS, Kind, Method


def _handler(pipeline: Pipeline, method: Method) -> grpc.RpcMethodHandler:
    def unary(behaviour: Any) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(instrument.unary(method, functools.partial(behaviour, method)))

    def stream(behaviour: Any) -> Any:
        return instrument.stream(method, functools.partial(behaviour, method))

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
    if method.kind is Kind.UNIMPLEMENTED:
        return grpc.stream_stream_rpc_method_handler(stream(pipeline.unimplemented))
    raise AssertionError(f"no handler for {method.kind}")


def etcd_handlers(pipeline: Pipeline) -> list[grpc.GenericRpcHandler]:
    """One generic handler per etcd service (KV, Watch, Lease, Cluster, Maintenance, Auth)."""
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for method in METHODS:
        by_service.setdefault(method.full_service, {})[method.name] = _handler(pipeline, method)
    return [grpc.method_handlers_generic_handler(service, handlers) for service, handlers in by_service.items()]
