"""Raw etcd v3 gRPC access through raftgate's own generated protos (wire-identical to etcd's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc

OLD_REVISION = {
    ("INVALID_ARGUMENT", "etcdserver: revision of auth store is old"),  # 3.5.2+ / 3.6 / 3.7
    ("UNKNOWN", "auth: revision in header is old"),  # <= 3.5.1
}


class Stubs:
    """KV / Auth / Maintenance stubs on one channel, with an optional token."""

    def __init__(self, target: str, token: str | None = None) -> None:
        self.channel = grpc.insecure_channel(
            target, options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        )
        self.kv = rpc_pb2_grpc.KVStub(self.channel)
        self.auth = rpc_pb2_grpc.AuthStub(self.channel)
        self.maintenance = rpc_pb2_grpc.MaintenanceStub(self.channel)
        self.token = token

    @property
    def md(self) -> tuple[tuple[str, str], ...] | None:
        return (("token", self.token),) if self.token else None

    def login(self, name: str, password: str) -> str:
        self.token = self.auth.Authenticate(rpc_pb2.AuthenticateRequest(name=name, password=password), timeout=10).token
        return self.token

    def close(self) -> None:
        self.channel.close()


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """("OK", response) or (status code name, details) of fn(*args, **kwargs)."""
    try:
        return "OK", fn(*args, **kwargs)
    except grpc.RpcError as exc:
        return exc.code().name, exc.details()  # type: ignore[attr-defined]
