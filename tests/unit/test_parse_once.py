"""Issue 22 item 4, "parse once, apply less": the store takes a request's kind from its field
number (no walk of the parsed message), and the leader hands the request it parsed to apply
instead of parsing the entry again. Neither may change any answer: the kind is what the parsed
message says (``request_kind``, which refuses anything but exactly one request), and the object
apply uses on the leader is exactly what parsing the entry's bytes gives - the bytes a follower,
or a replay, applies alone.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from authstore.api.server import StoreService
from authstore.raft.types import Entry
from authstore.state.apply import Applier
from authstore.state.auth.authorize import authorize, kind_of, request_kind
from authstore.state.backend import Backend
from protos import wire
from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError
from tests.support.authorize_world import READWRITE, World, lease_keys, put, w  # noqa: F401 - w: fixture

REQUEST_FIELDS = [f for f in ipb.InternalRaftRequest.DESCRIPTOR.fields
                  if f.message_type is not None and f.name != "header"]
HEADER = ipb.RequestHeader(username="alice", auth_revision=3, simple_token=True)


def _reference_kind(req: ipb.InternalRaftRequest) -> str:
    """The kind as the store first defined it: the one message field set besides the header."""
    kinds = [f.name for f, _ in req.ListFields() if f.message_type is not None and f.name != "header"]
    if len(kinds) != 1:
        raise EtcdError(Err.NOT_CAPABLE)
    return kinds[0]


def _kind_or_error(fn: Any, *args: Any) -> str | Err:
    try:
        return str(fn(*args))
    except EtcdError as exc:
        return exc.err


@pytest.mark.parametrize("field", REQUEST_FIELDS, ids=lambda f: f.name)
def test_the_kind_of_every_internal_request_field_is_its_name(field: Any) -> None:
    """Every request field of InternalRaftRequest, empty or not, with the header, ID and time
    around it in either order: the field-number table names the same kind as the parsed message."""
    empty = ipb.InternalRaftRequest(header=HEADER)
    getattr(empty, field.name).SetInParent()
    filled = ipb.InternalRaftRequest(ID=7, time_unix_ms=1733456789000, header=HEADER)
    getattr(filled, field.name).SetInParent()
    for req in (empty, filled):
        data = req.SerializeToString()
        assert request_kind(req) == _reference_kind(req) == field.name
        assert kind_of(data, req) == field.name
        # the proxy's layout: header first, then the client's bytes under the field number
        framed = wire.encode_header("alice", 3) + data
        parsed = ipb.InternalRaftRequest.FromString(framed)
        assert kind_of(framed, parsed) == request_kind(parsed) == field.name


def test_no_request_or_two_requests_are_refused_as_the_parsed_message_is() -> None:
    none = ipb.InternalRaftRequest(header=HEADER, ID=5)
    two = ipb.InternalRaftRequest(put=pb.PutRequest(key=b"k"), range=pb.RangeRequest(key=b"k"))
    for req in (none, two):
        assert _kind_or_error(kind_of, req.SerializeToString(), req) is Err.NOT_CAPABLE
        assert _kind_or_error(request_kind, req) is Err.NOT_CAPABLE


def test_one_request_sent_twice_merges_into_one_kind() -> None:
    data = (wire.length_delimited(4, pb.PutRequest(key=b"a").SerializeToString())
            + wire.length_delimited(4, pb.PutRequest(value=b"v").SerializeToString()))
    req = ipb.InternalRaftRequest.FromString(data)
    assert kind_of(data, req) == request_kind(req) == "put"


def test_random_mixtures_of_fields_get_the_parsed_message_s_answer() -> None:
    """Random sets of request fields, scalars and unknown fields, in random order: the table
    agrees with the parsed message every time, refusals included."""
    rnd = random.Random(22)
    for _ in range(2000):
        parts = [wire.encode_header("bob", rnd.randrange(5))]
        for f in rnd.sample(REQUEST_FIELDS, rnd.choice((0, 1, 1, 1, 2))):
            parts.append(wire.length_delimited(f.number, b""))
        if rnd.random() < 0.5:
            parts.append(wire.varint_field(1, rnd.randrange(1 << 40)))
        if rnd.random() < 0.3:
            parts.append(wire.length_delimited(rnd.choice((2, 999, 4000)), b"xyz"))  # unknown fields
        if rnd.random() < 0.2:
            parts.append(wire.varint_field(4, 1))  # a request's number with the wrong wire type
        rnd.shuffle(parts)
        data = b"".join(parts)
        req = ipb.InternalRaftRequest.FromString(data)
        expected = _kind_or_error(_reference_kind, req)
        assert _kind_or_error(kind_of, data, req) == _kind_or_error(request_kind, req) == expected, data


# ---- the leader's parse, handed to apply ----


class _Node:
    """The proposal path (the proposer's, then the driver's) in one step: the payload logged (the
    request's bytes, its ID and time appended), the hand-off, then the entry applied by the
    leader's applier; a follower applies the same bytes alone."""

    id = 1
    leader_id = 1
    applied_index = 0

    def __init__(self, leader: Applier, follower: Applier) -> None:
        self.leader = leader
        self.follower = follower
        self.index = 0
        self.answers: list[tuple[Any, Any]] = []

    async def must_lead(self) -> None:
        pass

    async def settled(self) -> None:
        pass

    async def propose(self, data: bytes, trace: Any = None, prepared: Any = None) -> Any:
        self.index += 1
        request_id, now = 1000 + self.index, 1733456789000 + self.index
        payload = data + wire.varint_field(1, request_id) + wire.varint_field(3200, now)
        if prepared is not None:
            prepared(payload, request_id, now)
        entry = Entry(term=1, index=self.index, data=payload)
        ((_, mine),) = self.leader.apply_batch([entry])
        ((_, theirs),) = self.follower.apply_batch([Entry(term=1, index=self.index, data=bytes(payload))])
        self.answers.append((mine, theirs))
        if isinstance(mine, BaseException):
            raise mine
        return mine


class _Quota:
    async def check(self, req: Any, size: int) -> None:
        pass


class _Maintenance:
    def handles(self, kind: str) -> bool:
        return False


@pytest.fixture
def appliers(tmp_path: Path) -> Iterator[tuple[Applier, Applier]]:
    backends = [Backend(tmp_path / name, map_size=64 << 20) for name in ("leader", "follower")]
    yield Applier(backends[0], member_id=1), Applier(backends[1], member_id=1)
    for b in backends:
        b.close()


def _service(node: _Node, applier: Applier) -> StoreService:
    service = StoreService.__new__(StoreService)  # the write path alone
    service.applier = applier
    service.node = node  # type: ignore[assignment]
    service.proposer = node  # type: ignore[assignment]
    service.draining = False
    service.quota = _Quota()  # type: ignore[assignment]
    service.maintenance = _Maintenance()  # type: ignore[assignment]
    service.lockout_attempts = 3
    service.lockout_duration_ms = 1000
    return service


WRITES = [
    ipb.InternalRaftRequest(put=pb.PutRequest(key=b"a", value=b"1")),
    ipb.InternalRaftRequest(put=pb.PutRequest(key=b"a", value=b"2", prev_kv=True)),
    ipb.InternalRaftRequest(header=ipb.RequestHeader(username="", auth_revision=1),
                            put=pb.PutRequest(key=b"b", value=b"x" * 300)),
    ipb.InternalRaftRequest(txn=pb.TxnRequest(
        compare=[pb.Compare(key=b"a", target=pb.Compare.VALUE, value=b"2")],
        success=[pb.RequestOp(request_put=pb.PutRequest(key=b"c", value=b"3"))],
        failure=[pb.RequestOp(request_range=pb.RangeRequest(key=b"a"))])),
    ipb.InternalRaftRequest(delete_range=pb.DeleteRangeRequest(key=b"a", prev_kv=True)),
    ipb.InternalRaftRequest(lease_grant=pb.LeaseGrantRequest(ID=9, TTL=60)),
    ipb.InternalRaftRequest(put=pb.PutRequest(key=b"", value=b"refused")),  # etcd: key is not provided
    ipb.InternalRaftRequest(auth_failures=ipb.AuthFailuresEntry(names=["alice"])),  # stamped by the node
    ipb.InternalRaftRequest(auth_user_add=pb.AuthUserAddRequest(name="carol", options={"no_password": True})),
]


def test_the_leader_applies_what_the_entry_s_bytes_say(appliers: tuple[Applier, Applier]) -> None:
    """Each write through the store's own path: the request apply uses on the leader equals the
    parse of the logged bytes, and the leader answers and stores what a follower does."""
    leader, follower = appliers
    handed: list[tuple[bytes, ipb.InternalRaftRequest]] = []
    remember = leader.remember

    def spy(payload: bytes, req: ipb.InternalRaftRequest, kind: str) -> None:
        handed.append((payload, req))
        remember(payload, req, kind)

    leader.remember = spy  # type: ignore[method-assign]
    node = _Node(leader, follower)
    service = _service(node, leader)
    extra = b"\x92\xfa\x01\x03abc"  # an unknown field the client sent: logged and parsed alike
    for req in WRITES:
        with pytest.raises(Exception) if not req.put.key and req.HasField("put") else _nothing():
            asyncio.run(service.answer(req.SerializeToString() + extra))
    assert len(handed) == len(WRITES)
    for payload, req in handed:
        assert req == ipb.InternalRaftRequest.FromString(payload)
        assert req.SerializeToString() == ipb.InternalRaftRequest.FromString(payload).SerializeToString()
    for mine, theirs in node.answers:
        assert type(mine) is type(theirs)
        if isinstance(mine, EtcdError):
            assert (mine.err, mine.message) == (theirs.err, theirs.message)
        else:
            assert mine == theirs
    with leader.env.begin() as t1, follower.env.begin() as t2:
        assert leader.kv.hash_kv(t1, 0) == follower.kv.hash_kv(t2, 0)
        assert leader.auth.revision(t1) == follower.auth.revision(t2)
    assert not leader._prepared  # every hand-off was taken by apply (or dropped): nothing kept


def test_a_handed_request_is_used_only_for_its_own_bytes(appliers: tuple[Applier, Applier]) -> None:
    """A hand-off whose bytes are not the entry's (another entry at that place after a leader
    change) is ignored: the entry is parsed from its bytes."""
    leader, _ = appliers
    logged = ipb.InternalRaftRequest(ID=1, put=pb.PutRequest(key=b"k", value=b"logged")).SerializeToString()
    other = ipb.InternalRaftRequest(ID=1, put=pb.PutRequest(key=b"k", value=b"other"))
    leader.remember(other.SerializeToString(), other, "put")
    leader.apply_batch([Entry(term=1, index=1, data=logged)])
    with leader.env.begin() as txn:
        assert leader.kv.range(txn, pb.RangeRequest(key=b"k")).kvs[0].value == b"logged"


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# ---- a user's record, parsed once: any auth change is seen by the next check ----



def _revoke(role: str, key: bytes, end: bytes = b"") -> pb.AuthRoleRevokePermissionRequest:
    return pb.AuthRoleRevokePermissionRequest(role=role, key=key, range_end=end)


def test_a_permission_revoked_between_two_requests_is_enforced_on_the_next(w: World) -> None:  # noqa: F811
    for _ in range(3):  # warm whatever is cached
        assert w.check("put", put(b"w1")) is None
        assert w.check("range", pb.RangeRequest(key=b"b")) is None
    w.mutate("role_revoke_permission", _revoke("r", b"w", b"x"))
    assert w.check("put", put(b"w1")) is Err.PERMISSION_DENIED
    assert w.check("range", pb.RangeRequest(key=b"b")) is None
    w.mutate("user_revoke_role", pb.AuthUserRevokeRoleRequest(name="alice", role="r"))
    assert w.check("range", pb.RangeRequest(key=b"b")) is Err.PERMISSION_DENIED
    w.mutate("user_grant_role", pb.AuthUserGrantRoleRequest(user="alice", role="root"))
    assert w.check("put", put(b"zz")) is None  # root now
    assert w.check("auth_user_list", pb.AuthUserListRequest()) is None
    w.mutate("user_delete", pb.AuthUserDeleteRequest(name="alice"))
    assert w.check("put", put(b"zz")) is Err.PERMISSION_DENIED
    assert w.check("auth_user_list", pb.AuthUserListRequest()) is Err.USER_NOT_FOUND


def test_a_role_granted_and_deleted_is_seen_by_the_next_check(w: World) -> None:  # noqa: F811
    assert w.check("range", pb.RangeRequest(key=b"q")) is Err.PERMISSION_DENIED
    perm = auth_pb2.Permission(permType=READWRITE, key=b"q", range_end=b"")
    w.mutate("role_grant_permission", pb.AuthRoleGrantPermissionRequest(name="other", perm=perm))
    assert w.check("range", pb.RangeRequest(key=b"q")) is Err.PERMISSION_DENIED  # alice lacks "other"
    w.mutate("user_grant_role", pb.AuthUserGrantRoleRequest(user="alice", role="other"))
    assert w.check("range", pb.RangeRequest(key=b"q")) is None
    w.mutate("role_delete", pb.AuthRoleDeleteRequest(role="other"))
    assert w.check("range", pb.RangeRequest(key=b"q")) is Err.PERMISSION_DENIED


def test_a_change_in_an_unfinished_transaction_is_seen_only_inside_it(w: World) -> None:  # noqa: F811
    """Apply checks an entry inside the batch that changed auth before it; a read elsewhere sees
    the committed state, and an aborted change is never seen afterwards."""
    def check_in(txn: Any, key: bytes, rev: int) -> Err | None:
        req = ipb.InternalRaftRequest(header=ipb.RequestHeader(username="alice", auth_revision=rev),
                                      range=pb.RangeRequest(key=key))
        try:
            authorize(w.auth, txn, req.header, req, lease_keys, read=False)
        except EtcdError as exc:
            return exc.err
        return None

    assert w.check("range", pb.RangeRequest(key=b"b")) is None
    txn = w.env.begin(write=True)
    w.auth.role_revoke_permission(txn, _revoke("r", b"a", b"c"))
    inside = w.auth.revision(txn)
    assert check_in(txn, b"b", inside) is Err.PERMISSION_DENIED
    txn.abort()
    assert w.check("range", pb.RangeRequest(key=b"b")) is None
    with w.env.begin() as txn:
        assert check_in(txn, b"b", w.rev) is None
