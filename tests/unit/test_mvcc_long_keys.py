"""Keys longer than LMDB's key cap behave exactly like short ones: order, ranges, history, leases.

A key over index.PREFIX bytes is indexed as prefix + SHA-256, so long keys sharing a prefix sit in
hash order inside LMDB; these tests aim at that region: range bounds falling inside it, limits and
counts across it, compaction of it, and lease attachments of it, against a dict model.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import lmdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from authstore.state.lease.lessor import Lessor
from authstore.state.mvcc.index import PREFIX
from authstore.state.mvcc.kvstore import KVStore
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError
from tests.support.nested_txn import apply_in_nested_txn

RR = pb.RangeRequest
C = pb.Compare


class Node:
    """A key space with a lessor; every call runs in a nested write txn aborted on EtcdError."""

    def __init__(self, env: lmdb.Environment) -> None:
        self.env = env
        self.kv = KVStore(env)
        self.lessor = Lessor(env, self.kv)

    def call(self, obj: Any, method: str, *args: Any) -> Any:
        return apply_in_nested_txn(self.env, obj, method, *args)

    def put(self, key: bytes, value: bytes = b"", **kw: Any) -> pb.PutResponse:
        return self.call(self.kv, "put", pb.PutRequest(key=key, value=value, **kw))

    def get(self, key: bytes, range_end: bytes = b"", **kw: Any) -> pb.RangeResponse:
        return self.call(self.kv, "range", RR(key=key, range_end=range_end, **kw))

    def delete(self, key: bytes, range_end: bytes = b"", **kw: Any) -> pb.DeleteRangeResponse:
        return self.call(self.kv, "delete_range", pb.DeleteRangeRequest(key=key, range_end=range_end, **kw))

    def txn(self, compare: list[pb.Compare], success: list[pb.RequestOp], failure: list[pb.RequestOp] = ()):
        return self.call(self.kv, "txn", pb.TxnRequest(compare=compare, success=success, failure=list(failure)))

    def compact(self, rev: int) -> None:
        self.call(self.kv, "compact", pb.CompactionRequest(revision=rev))

    def grant(self, lease_id: int) -> None:
        self.call(self.lessor, "grant", pb.LeaseGrantRequest(TTL=60, ID=lease_id), 1_000_000)

    def attached(self, lease_id: int) -> list[bytes]:
        return self.call(self.lessor, "attached_keys", lease_id)

    @property
    def rev(self) -> int:
        with self.env.begin() as txn:
            return self.kv.current_revision(txn)

    def history(self, key: bytes) -> list:
        with self.env.begin() as txn:
            return self.kv.history(txn, key)

    def long_key_counts(self) -> tuple[int, int]:
        """(distinct long index keys in mvcc_index, entries in mvcc_longkey): always equal."""
        index = self.kv._index
        with self.env.begin() as txn:
            cur = txn.cursor(db=index._db)
            n = 0
            ok = cur.first()
            while ok:
                n += len(cur.key()) > PREFIX  # a long key's index key: PREFIX bytes + SHA-256
                ok = cur.next_nodup()
            return n, txn.stat(index._long)["entries"]


@pytest.fixture
def node(tmp_path) -> Iterator[Node]:
    env = lmdb.open(str(tmp_path), max_dbs=32, map_size=1 << 30)
    yield Node(env)
    env.close()


def keys(resp: pb.RangeResponse) -> list[bytes]:
    return [kv.key for kv in resp.kvs]


def put_op(key: bytes, value: bytes = b"", **kw: Any) -> pb.RequestOp:
    return pb.RequestOp(request_put=pb.PutRequest(key=key, value=value, **kw))


def get_op(key: bytes, range_end: bytes = b"", **kw: Any) -> pb.RequestOp:
    return pb.RequestOp(request_range=RR(key=key, range_end=range_end, **kw))


A = b"a" * PREFIX  # a short key (exactly PREFIX bytes) and the prefix of one bucket of long keys


# ---- directed ----
def test_lengths_around_the_boundary(node: Node) -> None:
    lengths = [1, PREFIX - 1, PREFIX, PREFIX + 1, 503, 504, 511, 512, 1000, 1 << 20]
    ks = [b"k" * n for n in lengths]
    for k in reversed(ks):
        node.put(k, str(len(k)).encode())
    for k in ks:
        r = node.get(k)
        assert keys(r) == [k] and r.kvs[0].value == str(len(k)).encode()
    assert keys(node.get(b"k", b"\x00")) == ks
    assert keys(node.get(b"k", b"\x00", sort_order=RR.DESCEND)) == ks[::-1]
    assert node.get(b"k" * (PREFIX + 2)).count == 0  # absent long key with a present bucket
    assert node.delete(b"k" * PREFIX, b"k" * 512).deleted == 5
    assert keys(node.get(b"\x00", b"\x00")) == ks[:2] + ks[-3:]


def test_bucket_ranges_limits_and_sorts(node: Node) -> None:
    rng = random.Random(7)
    bucket = sorted({A + bytes(rng.choice(b"abc") for _ in range(rng.randint(1, 8))) for _ in range(150)})
    others = [b"a", A[:-1], A, A[:-1] + b"b", A[:-1] + b"b" + b"z" * 300, b"b"]
    everything = sorted(bucket + others)
    shuffled = everything[:]
    rng.shuffle(shuffled)
    for i, k in enumerate(shuffled):
        node.put(k, b"%05d" % i)
    assert keys(node.get(b"\x00", b"\x00")) == everything
    assert node.get(b"\x00", b"\x00", count_only=True).count == len(everything)
    # prefixes and bounds that fall inside the bucket
    for start, end in [(A + b"a", A + b"b"), (A + b"ab", A + b"c"), (A + b"b", b"\x00"), (A, A + b"b"),
                       (A[:-1] + b"a" + b"\x00", A + b"aa"), (A + b"c", A[:-1] + b"b" + b"z")]:
        want = [k for k in everything if start <= k and (end == b"\x00" or k < end)]
        assert keys(node.get(start, end)) == want, (start[PREFIX - 2 :], end[PREFIX - 2 :])
        r = node.get(start, end, limit=7)
        assert keys(r) == want[:7] and r.count == len(want) and r.more == (len(want) > 7)
        r = node.get(start, end, limit=5, sort_order=RR.DESCEND, keys_only=True)
        assert keys(r) == want[::-1][:5] and all(not kv.value for kv in r.kvs)
    by_value = node.get(A, A + b"\xff", sort_target=RR.VALUE, sort_order=RR.ASCEND)
    assert [kv.value for kv in by_value.kvs] == sorted(kv.value for kv in by_value.kvs)
    by_create = node.get(b"\x00", b"\x00", sort_target=RR.CREATE, sort_order=RR.DESCEND, limit=3)
    assert keys(by_create) == shuffled[::-1][:3]


def test_history_compaction_and_full_key_cleanup(node: Node) -> None:
    k1, k2 = A + b"one", A + b"two"
    node.put(k1, b"1")  # 2
    node.put(k2, b"x")  # 3
    node.put(k1, b"2")  # 4
    node.delete(k2)  # 5
    assert node.get(k1, revision=3).kvs[0].value == b"1"
    assert keys(node.get(A, b"\x00", revision=3)) == [k1, k2]
    assert keys(node.get(A, b"\x00")) == [k1]
    assert [e.version for e in node.history(k1)] == [1, 2]
    assert node.long_key_counts() == (2, 2)
    node.compact(5)  # k2's tombstone is exactly at 5: kept for watchers
    assert node.long_key_counts() == (2, 2)
    node.put(b"z", b"")  # 6
    node.compact(6)  # now k2 is gone entirely, and its stored full key with it
    assert node.history(k2) == [] and node.long_key_counts() == (1, 1)
    assert [e.version for e in node.history(k1)] == [2]
    kv = node.get(k1).kvs[0]
    assert (kv.key, kv.value, kv.version, kv.create_revision) == (k1, b"2", 2, 2)
    with pytest.raises(EtcdError) as e:
        node.get(k1, revision=4)
    assert e.value.err is Err.COMPACTED


def test_put_options_and_txn_compares_on_long_keys(node: Node) -> None:
    k = A + b"key"
    node.put(k, b"v1")
    prev = node.put(k, ignore_value=True, prev_kv=True).prev_kv
    assert (prev.key, prev.value) == (k, b"v1")
    assert node.get(k).kvs[0].value == b"v1"
    node.put(A + b"kez", b"v1")
    ok = node.txn([C(key=k, target=C.VALUE, result=C.EQUAL, value=b"v1"),
                   C(key=k, target=C.VERSION, result=C.EQUAL, version=2),
                   C(key=A + b"k", range_end=A + b"l", target=C.VALUE, value=b"v1"),
                   C(key=A + b"missing", target=C.VERSION, version=0)],
                  [put_op(k, b"v2"), get_op(A, b"\x00")])
    assert ok.succeeded and keys(ok.responses[1].response_range) == [k, A + b"kez"]
    assert not node.txn([C(key=A + b"k", range_end=A + b"l", target=C.VALUE, value=b"v1")], []).succeeded


def test_lease_with_long_keys(node: Node) -> None:
    node.grant(1)
    node.grant(2)
    ks = [A + b"b", b"a", A + b"a", A, A + b"a" * 300, A + b"\x00"]
    for k in ks:
        node.put(k, b"v", lease=1)
    node.put(A + b"other", lease=2)
    assert node.attached(1) == sorted(ks)
    node.put(A + b"a", lease=2)  # moves to lease 2
    node.delete(A + b"b")  # detaches
    assert node.attached(1) == sorted(set(ks) - {A + b"a", A + b"b"})
    assert node.attached(2) == [A + b"a", A + b"other"]
    with node.env.begin() as txn:
        ttl = node.lessor.time_to_live(txn, pb.LeaseTimeToLiveRequest(ID=1, keys=True), 1_000_000)
    assert list(ttl.keys) == node.attached(1)
    rev = node.rev
    node.call(node.lessor, "revoke", 1)
    gone = sorted(set(ks) - {A + b"a", A + b"b"})
    subs = [[e.sub for e in node.history(k) if e.main == rev + 1] for k in gone]
    assert subs == [[i] for i in range(len(gone))]  # one revision, deleted in key order
    assert keys(node.get(b"\x00", b"\x00")) == [A + b"a", A + b"other"]


# ---- model check ----
A399 = A[:-1]
KEYS = [
    b"a", A399, A, A399 + b"b", b"b",  # short, two of them equal to a bucket's prefix
    A + b"\x00", A + b"a", A + b"a" * 50, A + b"a" * 50 + b"\x00", A + b"a" * 50 + b"b", A + b"b",
    A + b"b" * 200,  # bucket A
    A399 + b"b" + b"c" * 100, A399 + b"b" + b"c" * 100 + b"d",  # bucket A399 + "b"
    b"a" * 200 + b"b" + b"z" * 300,  # a bucket alone
]
STARTS = [*KEYS, b"\x00", b"a" * 420, A + b"a" * 49, A399 + b"b\x00", b"a" * 200 + b"b"]
ENDS = [b"", b"", b"\x00", b"a", A, A + b"\x00", A + b"a" * 50, A + b"a" * 50 + b"\x01", A + b"b", A + b"c",
        A399 + b"b", A399 + b"c", b"a" * 420, A + b"a" * 49 + b"b", b"b", b"c"]

op_strategy = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.binary(max_size=2), st.sampled_from([0, 0, 1, 2])),
    st.tuples(st.just("del"), st.sampled_from(STARTS), st.sampled_from(ENDS)),
    st.tuples(st.just("txn"), st.lists(st.sampled_from(KEYS), max_size=3, unique=True), st.sampled_from(KEYS)),
)


def in_range(k: bytes, key: bytes, end: bytes) -> bool:
    if not end:
        return k == key
    if end == b"\x00":
        return k >= key
    return key <= k < end


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(op_strategy, max_size=16),
    reads=st.lists(
        st.tuples(st.sampled_from(STARTS), st.sampled_from(ENDS), st.integers(0, 4), st.integers(0, 4),
                  st.booleans(), st.booleans()),
        min_size=1,
        max_size=8,
    ),
    compact_at=st.integers(0, 20),
)
def test_long_keys_match_dict_model(tmp_path_factory, ops, reads, compact_at) -> None:
    env = lmdb.open(str(tmp_path_factory.mktemp("model")), max_dbs=32, map_size=1 << 26)
    node = Node(env)
    node.grant(1)
    node.grant(2)
    model: dict[bytes, dict[str, Any]] = {}
    snapshots: dict[int, dict] = {1: {}}
    rev = 1

    def write(k: bytes, v: bytes, lease: int) -> None:
        old = model.get(k)
        model[k] = {"v": v, "c": old["c"] if old else rev, "m": rev, "ver": old["ver"] + 1 if old else 1,
                    "l": lease}

    for op in ops:
        if op[0] == "put":
            _, k, v, lease = op
            rev += 1
            node.put(k, v, lease=lease)
            write(k, v, lease)
        elif op[0] == "del":
            _, k, end = op
            victims = sorted(x for x in model if in_range(x, k, end))
            r = node.delete(k, end, prev_kv=True)
            assert r.deleted == len(victims) and [kv.key for kv in r.prev_kvs] == victims
            if victims:
                rev += 1
                for x in victims:
                    del model[x]
        else:
            _, ks, probe = op
            want_ver = model[probe]["ver"] if probe in model else 0
            r = node.txn([C(key=probe, target=C.VERSION, result=C.EQUAL, version=want_ver)],
                         [put_op(k, b"t") for k in ks])
            assert r.succeeded
            if ks:
                rev += 1
                for k in ks:
                    write(k, b"t", 0)
        snapshots[rev] = {k: (d["v"], d["c"], d["m"], d["ver"]) for k, d in model.items()}
    assert node.rev == rev
    for lease in (1, 2):
        assert node.attached(lease) == sorted(k for k, d in model.items() if d["l"] == lease)
    floor = 0
    if ops and 0 < compact_at <= rev:
        node.compact(compact_at)
        floor = compact_at
    n_long, n_full = node.long_key_counts()
    assert n_long == n_full
    for key, end, back, limit, descend, keys_only in reads:
        at = max(rev - back, 1)
        if at < floor:
            with pytest.raises(EtcdError):
                node.get(key, end, revision=at)
            continue
        state = snapshots[max(r for r in snapshots if r <= at)]
        want = sorted((k, kv) for k, kv in state.items() if in_range(k, key, end))
        order = RR.DESCEND if descend else RR.NONE
        got = node.get(key, end, revision=at, limit=limit, sort_order=order, keys_only=keys_only)
        shown = want[::-1] if descend else want
        if limit:
            shown = shown[:limit]
        if keys_only:
            shown = [(k, (b"", *rest[1:])) for k, rest in shown]
        assert [(kv.key, (kv.value, kv.create_revision, kv.mod_revision, kv.version)) for kv in got.kvs] == shown
        assert got.count == len(want) and got.more == (len(shown) < len(want))
        assert node.get(key, end, revision=at, count_only=True).count == len(want)
    # revoking a lease deletes its keys in one revision, in key order
    doomed = node.attached(1)
    node.call(node.lessor, "revoke", 1)
    if doomed:
        assert [e.sub for k in doomed for e in node.history(k) if e.main == rev + 1] == list(range(len(doomed)))
    assert keys(node.get(b"\x00", b"\x00")) == sorted(k for k, d in model.items() if d["l"] != 1)
    env.close()
