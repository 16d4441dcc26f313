"""Leases as an etcd client sees them: grant rules, attached keys, revoke in one revision, TTL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lmdb
import pytest

from authstore.state.lease.lessor import MAX_LEASE_TTL, Lessor
from authstore.state.mvcc.kvstore import KVStore
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError
from tests.support.nested_txn import apply_in_nested_txn


class Node:
    """A store with a lessor; every call runs in a nested write txn aborted on EtcdError."""

    def __init__(self, env: lmdb.Environment) -> None:
        self.env = env
        self.kv = KVStore(env)
        self.lessor = Lessor(env, self.kv)

    def call(self, obj: Any, method: str, *args: Any) -> Any:
        return apply_in_nested_txn(self.env, obj, method, *args)

    def grant(self, ttl: int, lease_id: int = 0, at_ms: int = 1_000_000) -> pb.LeaseGrantResponse:
        return self.call(self.lessor, "grant", pb.LeaseGrantRequest(TTL=ttl, ID=lease_id), at_ms)

    def put(self, key: bytes, lease: int = 0, **kw: Any) -> pb.PutResponse:
        return self.call(self.kv, "put", pb.PutRequest(key=key, value=b"v", lease=lease, **kw))

    def keys(self, lease_id: int) -> list[bytes]:
        return self.call(self.lessor, "attached_keys", lease_id)

    def rev(self) -> int:
        with self.env.begin() as txn:
            return self.kv.current_revision(txn)

    def ttl(self, lease_id: int, now_ms: int, keys: bool = False) -> pb.LeaseTimeToLiveResponse:
        with self.env.begin() as txn:
            return self.lessor.time_to_live(txn, pb.LeaseTimeToLiveRequest(ID=lease_id, keys=keys), now_ms)


def raises(err: Err) -> Any:
    return pytest.raises(EtcdError, match=f"^{err.message}$")


@pytest.fixture
def node(tmp_path) -> Iterator[Node]:
    env = lmdb.open(str(tmp_path), max_dbs=32, map_size=1 << 30)
    yield Node(env)
    env.close()


def test_grant_rules(node: Node) -> None:
    r = node.grant(60, lease_id=7)
    assert (r.ID, r.TTL) == (7, 60)
    with raises(Err.LEASE_EXIST):
        node.grant(60, lease_id=7)
    with raises(Err.LEASE_TTL_TOO_LARGE):
        node.grant(MAX_LEASE_TTL + 1, lease_id=8)
    assert node.grant(MAX_LEASE_TTL, lease_id=8).TTL == MAX_LEASE_TTL
    assert node.grant(1, lease_id=9).TTL == 2  # etcd's minimum TTL
    assert node.grant(0, lease_id=10).TTL == 2
    assert node.rev() == 1  # leases make no revision


def test_store_picked_ids_are_deterministic_and_distinct(tmp_path) -> None:
    runs = []
    for name in ("one", "two"):
        env = lmdb.open(str(tmp_path / name), max_dbs=32, map_size=1 << 26)
        n = Node(env)
        ids = [n.grant(10).ID for _ in range(20)]
        runs.append(ids)
        env.close()
    assert runs[0] == runs[1]
    assert len(set(runs[0])) == 20 and all(0 < i < 1 << 63 for i in runs[0])


def test_attach_detach_follow_puts_and_deletes(node: Node) -> None:
    a, b = node.grant(10, 1).ID, node.grant(10, 2).ID
    node.put(b"k1", a)
    node.put(b"k2", a)
    node.put(b"k3", b)
    assert node.keys(a) == [b"k1", b"k2"]
    node.put(b"k2", b)  # moves to b
    node.put(b"k3", ignore_lease=True)  # keeps b
    assert node.keys(a) == [b"k1"] and node.keys(b) == [b"k2", b"k3"]
    node.put(b"k1")  # plain put detaches
    assert node.keys(a) == []
    node.call(node.kv, "delete_range", pb.DeleteRangeRequest(key=b"k3"))
    assert node.keys(b) == [b"k2"]
    with node.env.begin() as txn:
        assert node.kv.get(txn, b"k2").lease == b
        assert node.kv.get(txn, b"k3") is None
    with raises(Err.LEASE_NOT_FOUND):
        node.keys(99)


def test_revoke_deletes_keys_in_one_revision(node: Node) -> None:
    lease = node.grant(10, 5).ID
    for k in (b"c", b"a", b"b"):
        node.put(k, lease)
    node.put(b"other")
    rev = node.rev()
    node.call(node.lessor, "revoke", lease)
    assert node.rev() == rev + 1
    with node.env.begin() as txn:
        assert [node.kv.get(txn, k) for k in (b"a", b"b", b"c")] == [None, None, None]
        assert node.kv.get(txn, b"other") is not None
        assert not node.lessor.exists(txn, lease)
        assert [e.sub for k in (b"a", b"b", b"c") for e in node.kv.history(txn, k) if e.main == rev + 1] == [0, 1, 2]
    with raises(Err.LEASE_NOT_FOUND):
        node.call(node.lessor, "revoke", lease)
    empty = node.grant(10, 6).ID
    node.call(node.lessor, "revoke", empty)
    assert node.rev() == rev + 1  # nothing attached: no revision


def test_time_to_live_and_leases(node: Node) -> None:
    a = node.grant(10, 1, at_ms=1_000).ID
    b = node.grant(5, 2, at_ms=2_000).ID
    node.put(b"x", a)
    r = node.ttl(a, now_ms=3_500, keys=True)
    assert (r.ID, r.TTL, r.grantedTTL, list(r.keys)) == (a, 7, 10, [b"x"])
    assert node.ttl(a, now_ms=3_500).keys == []
    assert node.ttl(a, now_ms=60_000).TTL == 0
    missing = node.ttl(77, now_ms=0)
    assert (missing.ID, missing.TTL) == (77, -1)
    with node.env.begin() as txn:
        assert [l_.ID for l_ in node.lessor.leases(txn).leases] == [b, a]  # soonest expiry first
        assert node.lessor.expired(txn, 7_000) == [b]
        assert node.lessor.expired(txn, 11_000) == [b, a]
    assert node.call(node.lessor, "renew", b, 20_000) == 5
    with node.env.begin() as txn:
        assert [l_.ID for l_ in node.lessor.leases(txn).leases] == [a, b]
    assert node.ttl(b, now_ms=21_000).TTL == 4


def test_aborted_entry_leaves_lease_state_untouched(node: Node) -> None:
    lease = node.grant(10, 3).ID
    node.put(b"k", lease)
    with node.env.begin(write=True) as batch:
        txn = node.env.begin(write=True, parent=batch)
        node.lessor.revoke(txn, lease)
        node.lessor.grant(txn, pb.LeaseGrantRequest(TTL=10), 0)
        txn.abort()
    assert node.keys(lease) == [b"k"]
    with node.env.begin() as txn:
        assert node.kv.get(txn, b"k").lease == lease
        assert len(node.lessor.leases(txn).leases) == 1
    # a txn put with a missing lease is refused before anything is written
    with raises(Err.LEASE_NOT_FOUND):
        node.call(
            node.kv,
            "txn",
            pb.TxnRequest(
                success=[
                    pb.RequestOp(request_put=pb.PutRequest(key=b"a", lease=lease)),
                    pb.RequestOp(request_put=pb.PutRequest(key=b"b", lease=404)),
                ]
            ),
        )
    assert node.keys(lease) == [b"k"]
