"""The same users, roles and grants on every target, created through the etcd v3 API."""

from __future__ import annotations

import contextlib
from typing import Any

import grpc

from protos.authpb import auth_pb2
from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc

ROOT = ("root", "rootpw")
BENCH = ("bench", "benchpw")
#: Everything the bench user reads, writes and watches lives under this prefix.
PREFIX = "/bench/"
TIMEOUT = 30.0
#: Auth-admin requests kept in flight at once while creating many grants.
WINDOW = 32


def prefix_end(prefix: str) -> bytes:
    b = prefix.encode()
    return b[:-1] + bytes([b[-1] + 1])


def grant_key(n: int, i: int) -> str:
    """The i-th of the n disjoint prefixes granted to user g<n> (never adjacent, so never merged)."""
    return f"/g{n}/{i:05d}/"


class Admin:
    def __init__(self, target: str, options: list[tuple[str, Any]]) -> None:
        self.channel = grpc.insecure_channel(target, options=options)
        grpc.channel_ready_future(self.channel).result(timeout=TIMEOUT)
        self.auth = rpc_pb2_grpc.AuthStub(self.channel)
        self.kv = rpc_pb2_grpc.KVStub(self.channel)
        self.md: tuple[tuple[str, str], ...] = ()

    def close(self) -> None:
        self.channel.close()

    def token(self, user: str, password: str) -> str:
        return str(self.auth.Authenticate(rpc_pb2.AuthenticateRequest(name=user, password=password),
                                          timeout=TIMEOUT).token)  # fmt: skip

    def login_root(self) -> None:
        self.md = (("token", self.token(*ROOT)),)

    def _many(self, method: Any, requests: list[Any]) -> None:
        """Sends `requests` with up to WINDOW in flight (group commit makes this much faster than one by one)."""
        pending: list[Any] = []
        for req in requests:
            pending.append(method.future(req, metadata=self.md, timeout=TIMEOUT))
            if len(pending) >= WINDOW:
                pending.pop(0).result()
        for f in pending:
            f.result()

    def setup(self, grant_sizes: list[int]) -> None:
        """Users root, bench (READWRITE on PREFIX) and g<n> with n disjoint prefix grants each; auth still off."""
        a = self.auth
        a.UserAdd(rpc_pb2.AuthUserAddRequest(name=ROOT[0], password=ROOT[1]), timeout=TIMEOUT)
        # etcd needs a "root" role (etcdctl's `auth enable` creates it); raftgate may already have it.
        with contextlib.suppress(grpc.RpcError):
            a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="root"), timeout=TIMEOUT)
        a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user=ROOT[0], role="root"), timeout=TIMEOUT)
        a.UserAdd(rpc_pb2.AuthUserAddRequest(name=BENCH[0], password=BENCH[1]), timeout=TIMEOUT)
        a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="rw"), timeout=TIMEOUT)
        self._grant("rw", PREFIX)
        a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user=BENCH[0], role="rw"), timeout=TIMEOUT)
        for n in grant_sizes:
            user = f"g{n}"
            a.UserAdd(rpc_pb2.AuthUserAddRequest(name=user, password=BENCH[1]), timeout=TIMEOUT)
            a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name=user), timeout=TIMEOUT)
            # Grants first, role to the user last: etcd rebuilds its permission cache for the users
            # holding a role on each grant, which would make the set-up quadratic.
            self._many(a.RoleGrantPermission, [self._grant_req(user, grant_key(n, i)) for i in range(n)])
            a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user=user, role=user), timeout=TIMEOUT)
        self.kv.Put(rpc_pb2.PutRequest(key=f"{PREFIX}r".encode(), value=b"x" * 128), timeout=TIMEOUT)

    @staticmethod
    def _grant_req(role: str, prefix: str) -> rpc_pb2.AuthRoleGrantPermissionRequest:
        perm = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=prefix.encode(),
                                   range_end=prefix_end(prefix))  # fmt: skip
        return rpc_pb2.AuthRoleGrantPermissionRequest(name=role, perm=perm)

    def _grant(self, role: str, prefix: str) -> None:
        self.auth.RoleGrantPermission(self._grant_req(role, prefix), timeout=TIMEOUT)

    def enable_auth(self) -> None:
        self.auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=TIMEOUT)
        self.login_root()
