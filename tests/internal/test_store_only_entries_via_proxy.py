"""A client cannot make the store apply an entry only the store proposes (raftgate/methods.py INTERNAL).

lease_renew, lease_expire, expire_tokens, member_attr_set, store_alarm, lease_checkpoint and auth_failures are
not checked by authorize (Perm.INTERNAL): they carry no caller. The proxy must never build them.
Through the proxy's client port, with root's token (a caller every check would let through):
no method of any service and no store-internal method is served under their names, and their
bytes sent as the body of the calls the proxy does forward (Put, LeaseKeepAlive, Txn) stay inside
that call's own request: the lease they name is neither expired nor revoked, no alarm is raised.

Finding: a client making the store apply a store-only entry, which authorize never checks, by name
or as a forwarded body (an attack that held when written).
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from raftgate.methods import INTERNAL, SERVICES
from tests.support.processes import RaftgateLocal

CAMEL = {"lease_checkpoint": "LeaseCheckpoint", "lease_renew": "LeaseRenew", "lease_expire": "LeaseExpire",
         "expire_tokens": "ExpireTokens", "member_attr_set": "MemberAttrSet", "store_alarm": "StoreAlarm",
         "auth_failures": "AuthFailures"}
STORE_METHODS = ["Do", "DoStream", "WatchBatches", "WatchShared", "Snapshot", "Leader", "Credentials", "ResolveToken"]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[grpc.Channel, tuple[tuple[str, str], ...]]]:
    server = RaftgateLocal(tmp_path_factory.mktemp("store-only"), bcrypt_cost=4)
    server.start()
    channel = grpc.insecure_channel(server.target)
    try:
        auth = rpc_pb2_grpc.AuthStub(channel)
        auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"), timeout=10)
        auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
        auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=10)
        token = auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="rootpw"), timeout=10).token
        yield channel, (("token", token),)
    finally:
        channel.close()
        server.stop()


def _raw(channel: grpc.Channel, path: str, data: bytes, md: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
    call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    try:
        call(data, metadata=md, timeout=10)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_no_store_only_entry_is_served_under_any_name(proxy: tuple[grpc.Channel, tuple[tuple[str, str], ...]]) -> None:
    channel, md = proxy
    assert {e.request for e in INTERNAL} == set(CAMEL)
    paths = [f"/etcdserverpb.{service}/{name}" for service in SERVICES for name in CAMEL.values()]
    paths += [f"/raftgate.storepb.Store/{name}" for name in STORE_METHODS]
    body = ipb.LeaseExpireEntry(ID=1).SerializeToString()
    served = {path: code for path in paths if (code := _raw(channel, path, body, md)) != grpc.StatusCode.UNIMPLEMENTED}
    assert not served


def _internal(**fields: object) -> bytes:
    return ipb.InternalRaftRequest(**fields).SerializeToString()  # type: ignore[arg-type]


def test_store_only_entries_as_a_forwarded_body_stay_inside_it(
        proxy: tuple[grpc.Channel, tuple[tuple[str, str], ...]]) -> None:
    channel, md = proxy
    lease = rpc_pb2_grpc.LeaseStub(channel)
    kv = rpc_pb2_grpc.KVStub(channel)
    maintenance = rpc_pb2_grpc.MaintenanceStub(channel)
    lease_id = lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=600), metadata=md, timeout=10).ID
    kv.Put(rpc_pb2.PutRequest(key=b"attached", value=b"v", lease=lease_id), metadata=md, timeout=10)
    bodies = [
        _internal(lease_expire=ipb.LeaseExpireEntry(ID=lease_id, deadline_ms=1)),
        _internal(lease_renew=ipb.LeaseRenewEntry(ID=lease_id)),
        _internal(store_alarm=rpc_pb2.AlarmRequest(action=rpc_pb2.AlarmRequest.ACTIVATE, memberID=1,
                                                   alarm=rpc_pb2.NOSPACE)),
        _internal(expire_tokens=ipb.ExpireTokensRequest(token_digests=[b"\x00" * 32])),
    ]
    for body in bodies:
        for path in ("/etcdserverpb.KV/Put", "/etcdserverpb.KV/Txn", "/etcdserverpb.KV/DeleteRange",
                     "/etcdserverpb.Lease/LeaseRevoke", "/etcdserverpb.Maintenance/Alarm"):
            _raw(channel, path, body, md)  # whatever it answers, as that call
        keepalive = channel.stream_stream("/etcdserverpb.Lease/LeaseKeepAlive", request_serializer=None,
                                          response_deserializer=None)
        try:
            for _ in keepalive(iter([body]), metadata=md, timeout=10):
                pass
        except grpc.RpcError:
            pass
    ttl = lease.LeaseTimeToLive(rpc_pb2.LeaseTimeToLiveRequest(ID=lease_id, keys=True), metadata=md, timeout=10)
    assert ttl.TTL > 0 and list(ttl.keys) == [b"attached"]
    assert [kv.value for kv in kv.Range(rpc_pb2.RangeRequest(key=b"attached"), metadata=md, timeout=10).kvs] == [b"v"]
    alarms = maintenance.Alarm(rpc_pb2.AlarmRequest(action=rpc_pb2.AlarmRequest.GET), metadata=md, timeout=10)
    assert list(alarms.alarms) == []
    # the token still works: no expire_tokens reached the store
    assert kv.Range(rpc_pb2.RangeRequest(key=b"x"), metadata=md, timeout=10) is not None
