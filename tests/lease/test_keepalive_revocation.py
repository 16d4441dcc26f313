"""A LeaseKeepAlive stream keeps no right its token lost: each keep-alive is judged by the token now.

etcd checks every keep-alive (``checkLeaseRenew``) with the stream's token. One store, two proxies
(simple tokens): a keep-alive stream is opened on each proxy with a user's token and renews once;
the token is then revoked through the other proxy (user deleted, password changed) or the user
loses WRITE on the lease's key (role revoked); the next keep-alive on each open stream ends it
with etcd's error, never with a renewal.

Finding: a keep-alive stream that outlives its token's revocation (an attack that held when
written).
"""

from __future__ import annotations

import queue
from collections.abc import Iterator

import grpc
import pytest

from protos.authpb import auth_pb2
from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from raftgate.errors import Err
from tests.support.revocation import ROOT_PW, _as_root, _token, cluster  # noqa: F401 - fixture

pytestmark = pytest.mark.slow


class KeepAliveStream:
    """One open LeaseKeepAlive stream; ``renew`` sends one keep-alive and takes its answer."""

    def __init__(self, target: str, token: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.requests: queue.Queue[rpc_pb2.LeaseKeepAliveRequest | None] = queue.Queue()
        self.answers = rpc_pb2_grpc.LeaseStub(self.channel).LeaseKeepAlive(
            self._send(), metadata=(("token", token),), timeout=60)

    def _send(self) -> Iterator[rpc_pb2.LeaseKeepAliveRequest]:
        while (item := self.requests.get(timeout=60)) is not None:
            yield item

    def renew(self, lease_id: int) -> rpc_pb2.LeaseKeepAliveResponse:
        self.requests.put(rpc_pb2.LeaseKeepAliveRequest(ID=lease_id))
        return next(self.answers)

    def close(self) -> None:
        self.requests.put(None)
        self.channel.close()


def _setup_user(target: str, name: str) -> tuple[str, int]:
    """A user with WRITE on `name/`, logged in; a lease of its with key `name/k` attached."""
    _as_root(target, "UserAdd", rpc_pb2.AuthUserAddRequest(name=name, password="pw"))
    _as_root(target, "RoleAdd", rpc_pb2.AuthRoleAddRequest(name=f"{name}-role"))
    perm = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=f"{name}/".encode(),
                               range_end=f"{name}0".encode())
    _as_root(target, "RoleGrantPermission", rpc_pb2.AuthRoleGrantPermissionRequest(name=f"{name}-role", perm=perm))
    _as_root(target, "UserGrantRole", rpc_pb2.AuthUserGrantRoleRequest(user=name, role=f"{name}-role"))
    token = _token(target, name, "pw")
    with grpc.insecure_channel(target) as ch:
        lease = rpc_pb2_grpc.LeaseStub(ch).LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60),
                                                      metadata=(("token", token),), timeout=30)
        rpc_pb2_grpc.KVStub(ch).Put(rpc_pb2.PutRequest(key=f"{name}/k".encode(), value=b"v", lease=lease.ID),
                                    metadata=(("token", token),), timeout=30)
    return token, lease.ID


@pytest.mark.parametrize(("revoke", "error"), [
    ("delete", Err.INVALID_AUTH_TOKEN),
    ("password", Err.INVALID_AUTH_TOKEN),
    ("role", Err.PERMISSION_DENIED),
])
def test_a_revoked_token_renews_no_lease_on_an_open_stream(cluster: list[str], revoke: str,  # noqa: F811
                                                           error: Err) -> None:
    name = f"ka-{revoke}"
    token, lease_id = _setup_user(cluster[0], name)
    streams = [KeepAliveStream(target, token) for target in cluster]
    try:
        for s in streams:
            assert s.renew(lease_id).TTL > 0
        if revoke == "delete":
            _as_root(cluster[1], "UserDelete", rpc_pb2.AuthUserDeleteRequest(name=name))
        elif revoke == "password":
            _as_root(cluster[1], "UserChangePassword", rpc_pb2.AuthUserChangePasswordRequest(name=name, password="x"))
        else:
            _as_root(cluster[1], "UserRevokeRole", rpc_pb2.AuthUserRevokeRoleRequest(name=name, role=f"{name}-role"))
        for s in streams:
            with pytest.raises(grpc.RpcError) as e:
                answer = s.renew(lease_id)
                pytest.fail(f"renewed after the revocation: {answer}")
            assert (e.value.code(), e.value.details()) == (error.code, error.message)
    finally:
        for s in streams:
            s.close()


def _member_list(target: str, token: str) -> None:
    with grpc.insecure_channel(target) as ch:
        rpc_pb2_grpc.ClusterStub(ch).MemberList(rpc_pb2.MemberListRequest(), metadata=(("token", token),), timeout=30)


def _status(target: str, token: str) -> None:
    with grpc.insecure_channel(target) as ch:
        rpc_pb2_grpc.MaintenanceStub(ch).Status(rpc_pb2.StatusRequest(), metadata=(("token", token),), timeout=30)


def _snapshot(target: str, token: str) -> None:
    with grpc.insecure_channel(target) as ch:
        for _ in rpc_pb2_grpc.MaintenanceStub(ch).Snapshot(rpc_pb2.SnapshotRequest(), metadata=(("token", token),),
                                                          timeout=60):
            pass


def _alarm_get(target: str, token: str) -> None:
    with grpc.insecure_channel(target) as ch:
        rpc_pb2_grpc.MaintenanceStub(ch).Alarm(rpc_pb2.AlarmRequest(action=rpc_pb2.AlarmRequest.GET),
                                               metadata=(("token", token),), timeout=30)


def _lease_leases(target: str, token: str) -> None:
    with grpc.insecure_channel(target) as ch:
        rpc_pb2_grpc.LeaseStub(ch).LeaseLeases(rpc_pb2.LeaseLeasesRequest(), metadata=(("token", token),), timeout=30)


def _range_serializable(target: str, token: str) -> None:
    with grpc.insecure_channel(target) as ch:
        rpc_pb2_grpc.KVStub(ch).Range(rpc_pb2.RangeRequest(key=b"k", serializable=True),
                                      metadata=(("token", token),), timeout=30)


CALLS = {"member_list": _member_list, "status": _status, "snapshot": _snapshot, "alarm_get": _alarm_get,
         "lease_leases": _lease_leases, "range_serializable": _range_serializable}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_revoked_admins_token_fails_at_once_on_the_other_proxy(cluster: list[str], call: str) -> None:  # noqa: F811
    """Revoked on one proxy, used on the other at once, for the calls that need only a user (or
    root, for Snapshot) and are answered without the log."""
    name = f"adm-{call}"
    _as_root(cluster[0], "UserAdd", rpc_pb2.AuthUserAddRequest(name=name, password="pw"))
    _as_root(cluster[0], "UserGrantRole", rpc_pb2.AuthUserGrantRoleRequest(user=name, role="root"))
    token = _token(cluster[0], name, "pw")
    for target in cluster:
        CALLS[call](target, token)  # cached on both proxies
    _as_root(cluster[0], "UserChangePassword", rpc_pb2.AuthUserChangePasswordRequest(name=name, password="x"))
    for target in cluster:
        with pytest.raises(grpc.RpcError) as e:
            CALLS[call](target, token)
        assert (e.value.code(), e.value.details()) == (Err.INVALID_AUTH_TOKEN.code, Err.INVALID_AUTH_TOKEN.message)
