"""Trust item 3: a revoked simple token fails on the very next request, on every proxy.

Proxies cache a simple token's resolution; a cached resolution must not outlive a revocation
(user deleted, password changed). One store, two proxies: the token is used on both (so both have
it cached), then revoked through one of them; the next request on either proxy - one that needs
only "any authenticated user" (LeaseGrant) or an admin (UserList) - gets etcd's answer for a token
that no longer exists, `invalid auth token`.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from raftgate.errors import Err
from tests.support.revocation import ROOT_PW, _as_root, _token, cluster  # noqa: F401 - fixture

pytestmark = pytest.mark.slow


def _lease_grant(target: str, token: str) -> None:
    with grpc.insecure_channel(target) as ch:
        rpc_pb2_grpc.LeaseStub(ch).LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60), metadata=(("token", token),),
                                              timeout=30)


def _user_list(target: str, token: str) -> None:
    with grpc.insecure_channel(target) as ch:
        rpc_pb2_grpc.AuthStub(ch).UserList(rpc_pb2.AuthUserListRequest(), metadata=(("token", token),), timeout=30)


def _refused_as_invalid_token(call: object, target: str, token: str) -> None:
    with pytest.raises(grpc.RpcError) as e:
        call(target, token)  # type: ignore[operator]
    assert (e.value.code(), e.value.details()) == (Err.INVALID_AUTH_TOKEN.code, Err.INVALID_AUTH_TOKEN.message)


def _user_with_token(targets: list[str], name: str, *, root: bool) -> str:
    """A new user (role root if asked), logged in, its token in both proxies' caches."""
    _as_root(targets[0], "UserAdd", rpc_pb2.AuthUserAddRequest(name=name, password="pw"))
    if root:
        _as_root(targets[0], "UserGrantRole", rpc_pb2.AuthUserGrantRoleRequest(user=name, role="root"))
    token = _token(targets[0], name, "pw")
    for target in targets:
        _lease_grant(target, token)
        if root:
            _user_list(target, token)
    return token


def test_deleted_users_token_fails_at_once_on_every_proxy(cluster: list[str]) -> None:  # noqa: F811
    token = _user_with_token(cluster, "alice", root=False)
    _as_root(cluster[1], "UserDelete", rpc_pb2.AuthUserDeleteRequest(name="alice"))
    for target in cluster:
        _refused_as_invalid_token(_lease_grant, target, token)


def test_deleted_admins_token_fails_at_once_on_every_proxy(cluster: list[str]) -> None:  # noqa: F811
    token = _user_with_token(cluster, "carol", root=True)
    _as_root(cluster[1], "UserDelete", rpc_pb2.AuthUserDeleteRequest(name="carol"))
    for target in cluster:
        _refused_as_invalid_token(_user_list, target, token)


def test_changed_password_revokes_an_admins_token_at_once(cluster: list[str]) -> None:  # noqa: F811
    token = _user_with_token(cluster, "bob", root=True)
    _as_root(cluster[0], "UserChangePassword", rpc_pb2.AuthUserChangePasswordRequest(name="bob", password="new"))
    for target in cluster:
        _refused_as_invalid_token(_user_list, target, token)
        _refused_as_invalid_token(_lease_grant, target, token)


def test_a_revoked_token_creates_no_watch_on_a_stream_opened_before(cluster: list[str]) -> None:  # noqa: F811
    """A watch create on a stream opened earlier is judged by the token's validity now."""
    token = _user_with_token(cluster, "dave", root=True)
    channels = [grpc.insecure_channel(target) for target in cluster]
    queues: list[queue.Queue[rpc_pb2.WatchRequest | None]] = [queue.Queue() for _ in cluster]

    def stream(q: queue.Queue[rpc_pb2.WatchRequest | None]) -> Iterator[rpc_pb2.WatchRequest]:
        while (item := q.get(timeout=60)) is not None:
            yield item

    try:
        streams = [rpc_pb2_grpc.WatchStub(ch).Watch(stream(q), metadata=(("token", token),), timeout=60)
                   for ch, q in zip(channels, queues, strict=True)]
        for q, answers in zip(queues, streams, strict=True):
            q.put(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"k1")))
            first = next(answers)
            assert first.created and not first.canceled and first.watch_id != -1
        _as_root(cluster[1], "UserChangePassword", rpc_pb2.AuthUserChangePasswordRequest(name="dave", password="new"))
        for q, answers in zip(queues, streams, strict=True):
            q.put(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"k2")))
            created = next(a for a in answers if a.created)  # the first watch's cancellation may come first
            assert created.canceled and created.watch_id == -1, created
    finally:
        for q in queues:
            q.put(None)
        for ch in channels:
            ch.close()


def test_an_unrelated_auth_change_costs_a_valid_token_nothing(cluster: list[str]) -> None:  # noqa: F811
    """The other side of the coin: after an auth change, a still-valid cached token is resolved
    again transparently, for every kind of request (a snapshot stream included)."""
    token = _token(cluster[0], "root", ROOT_PW)
    for target in cluster:
        _lease_grant(target, token)
        _user_list(target, token)
    _as_root(cluster[1], "UserAdd", rpc_pb2.AuthUserAddRequest(name="erin", password="pw"))
    for target in cluster:
        _lease_grant(target, token)
        _as_root(cluster[0], "RoleAdd", rpc_pb2.AuthRoleAddRequest(name=f"role-{target.rsplit(':', 1)[1]}"))
        with grpc.insecure_channel(target) as ch:
            chunks = list(rpc_pb2_grpc.MaintenanceStub(ch).Snapshot(rpc_pb2.SnapshotRequest(),
                                                                    metadata=(("token", token),), timeout=60))
        assert chunks and chunks[-1].remaining_bytes == 0
        _user_list(target, token)
