"""The store's internal port, cell by cell: who may call what, carrying which request (issue 21).

One store node in development-secret mode with both classes of credential
(``--internal-secret-file``: central, ``--sidecar-secret-file``: sidecar), called straight at its
internal port with each credential and with none. A sidecar's credential is not root: whatever
request kind it puts into a call, it acts only as the user whose token it forwards.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import grpc
import pytest

from protos import wire
from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from protos.internal import INTERNAL_SECRET_METADATA, INTERNAL_TOKEN_METADATA
from protos.storepb import store_pb2 as spb
from raftgate.errors import Err
from tests.support.processes import SECRET, Program, store_program, wait_for

SIDECAR_SECRET = "sidecar-secret-for-access-tests-0123456789"
STORE = "/raftgate.storepb.Store/"
FIELDS = {f.name: f.number for f in ipb.InternalRaftRequest.DESCRIPTOR.fields}
pytestmark = pytest.mark.slow


@dataclass
class Store:
    address: str
    channel: grpc.Channel
    #: tokens the store issued through the sidecar Authenticate: root's and a non-root user's
    root_token: str
    app_token: str


def _hashed(password: str) -> str:
    return base64.b64encode(bcrypt.hashpw(password.encode(), bcrypt.gensalt(4, prefix=b"2a"))).decode()


def _request(kind: str, body: bytes = b"", header: bytes | None = None) -> bytes:
    return wire.build_internal_request(header, FIELDS[kind], body)


def _do(channel: grpc.Channel, data: bytes, secret: str = SECRET) -> bytes:
    call = channel.unary_unary(STORE + "Do", request_serializer=None, response_deserializer=None)
    return call(data, metadata=((INTERNAL_SECRET_METADATA, secret),), timeout=10)


def _stream(channel: grpc.Channel, calls: list[spb.DoCall], secret: str | None) -> dict[int, spb.DoResult]:
    """The first result of each call, sent in one DoBatch on one DoStream."""
    md = () if secret is None else ((INTERNAL_SECRET_METADATA, secret),)
    stream = channel.stream_stream(STORE + "DoStream", request_serializer=None, response_deserializer=None)
    answers = stream(iter([spb.DoBatch(calls=calls).SerializeToString()]), metadata=md, timeout=30)
    got: dict[int, spb.DoResult] = {}
    for raw in answers:
        for result in spb.DoResultBatch.FromString(raw).results:
            if not result.rest:
                got[result.id] = result
        if len(got) == len(calls):
            answers.cancel()
            break
    return got


def _login(channel: grpc.Channel, name: str, password: str) -> str:
    body = rpc_pb2.AuthenticateRequest(name=name, password=password).SerializeToString()
    result = _stream(channel, [spb.DoCall(id=1, method=spb.DoCall.AUTHENTICATE, request=body)], SIDECAR_SECRET)[1]
    assert result.code == 0, result.message
    return rpc_pb2.AuthenticateResponse.FromString(result.response).token


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    work: Path = tmp_path_factory.mktemp("internal-access")
    (work / "sidecar-secret").write_text(SIDECAR_SECRET)
    program, address = store_program(work, "--sidecar-secret-file", str(work / "sidecar-secret"),
                                     "--bcrypt-cost", "4")
    started: list[Program] = []
    try:
        program.start()
        started.append(program)
        channel = grpc.insecure_channel(address)

        def leads() -> bool:
            call = channel.unary_unary(STORE + "Leader", request_serializer=spb.LeaderRequest.SerializeToString,
                                       response_deserializer=spb.LeaderResponse.FromString)
            answer = call(spb.LeaderRequest(), metadata=((INTERNAL_SECRET_METADATA, SECRET),), timeout=5)
            return answer.leader_id == answer.member_id

        wait_for(leads, timeout=60, what="the store to lead")
        # users, roles and auth on, through the central credential (auth is off until the last step)
        perm = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=b"app/", range_end=b"app0")
        for kind, msg in (
            ("auth_user_add", rpc_pb2.AuthUserAddRequest(name="root", hashedPassword=_hashed("rootpw"))),
            ("auth_user_grant_role", rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root")),
            ("auth_user_add", rpc_pb2.AuthUserAddRequest(name="app", hashedPassword=_hashed("apppw"))),
            ("auth_role_add", rpc_pb2.AuthRoleAddRequest(name="app")),
            ("auth_role_grant_permission", rpc_pb2.AuthRoleGrantPermissionRequest(name="app", perm=perm)),
            ("auth_user_grant_role", rpc_pb2.AuthUserGrantRoleRequest(user="app", role="app")),
            ("put", rpc_pb2.PutRequest(key=b"secret-key", value=b"secret-value")),
            ("auth_enable", rpc_pb2.AuthEnableRequest()),
        ):
            _do(channel, _request(kind, msg.SerializeToString()))
        yield Store(address, channel, _login(channel, "root", "rootpw"), _login(channel, "app", "apppw"))
        channel.close()
    finally:
        for p in reversed(started):
            p.stop()


def _snapshot(store: Store, data: bytes, secret: str, token: str | None = None) -> tuple[grpc.StatusCode, str, int]:
    """Store/Snapshot: (code, message, bytes of snapshot received)."""
    md = [(INTERNAL_SECRET_METADATA, secret)]
    if token is not None:
        md.append((INTERNAL_TOKEN_METADATA, token))
    call = store.channel.unary_stream(STORE + "Snapshot", request_serializer=None, response_deserializer=None)
    received = 0
    try:
        for raw in call(data, metadata=tuple(md), timeout=30):
            received += len(rpc_pb2.SnapshotResponse.FromString(raw).blob)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", received
    return grpc.StatusCode.OK, "", received


def test_a_sidecar_credential_cannot_download_the_store(store: Store) -> None:
    """Issue 21 item 1: Snapshot authorized the kind the caller put in, not the snapshot kind, so a
    sidecar's `auth_status` (open to all) or store-only entry (never checked) got the LMDB file."""
    for data, token in ((_request("auth_status"), None),
                        (_request("auth_status"), "garbage"),
                        (_request("expire_tokens"), "garbage"),
                        (_request("lease_checkpoint"), None),
                        (_request("range", rpc_pb2.RangeRequest(key=b"app/x").SerializeToString()), store.app_token)):
        code, _, received = _snapshot(store, data, SIDECAR_SECRET, token)
        assert received == 0
        assert code == grpc.StatusCode.PERMISSION_DENIED
    # the snapshot kind itself: root's check, applied to the identity the store finds in the token
    snap = _request("snapshot")
    assert _snapshot(store, snap, SIDECAR_SECRET)[:2] == Err.USER_EMPTY.value
    assert _snapshot(store, snap, SIDECAR_SECRET, "garbage")[:2] == Err.INVALID_AUTH_TOKEN.value
    assert _snapshot(store, snap, SIDECAR_SECRET, store.app_token)[:2] == Err.PERMISSION_DENIED.value
    code, _, received = _snapshot(store, snap, SIDECAR_SECRET, store.root_token)
    assert code == grpc.StatusCode.OK and received > 0
