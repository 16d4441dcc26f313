"""The MVCC key space as an etcd client sees it: revisions, versions, history, Txn, compaction."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lmdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from authstore.state.mvcc import revision, validate
from authstore.state.mvcc.kvstore import KVStore
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError
from tests.support.nested_txn import apply_in_nested_txn

RR = pb.RangeRequest
C = pb.Compare


class Store:
    """Runs each call like the apply stage does: in a nested write txn, aborted on EtcdError."""

    def __init__(self, env: lmdb.Environment) -> None:
        self.env = env
        self.kv = KVStore(env)

    def call(self, method: str, req: Any) -> Any:
        return apply_in_nested_txn(self.env, self.kv, method, req)

    def put(self, key: bytes, value: bytes = b"", **kw: Any) -> pb.PutResponse:
        return self.call("put", pb.PutRequest(key=key, value=value, **kw))

    def get(self, key: bytes, range_end: bytes = b"", **kw: Any) -> pb.RangeResponse:
        return self.call("range", RR(key=key, range_end=range_end, **kw))

    def delete(self, key: bytes, range_end: bytes = b"", **kw: Any) -> pb.DeleteRangeResponse:
        return self.call("delete_range", pb.DeleteRangeRequest(key=key, range_end=range_end, **kw))

    def txn(self, compare: list[pb.Compare], success: list[pb.RequestOp], failure: list[pb.RequestOp] = ()):
        return self.call("txn", pb.TxnRequest(compare=compare, success=success, failure=list(failure)))

    def compact(self, rev: int) -> pb.CompactionResponse:
        return self.call("compact", pb.CompactionRequest(revision=rev, physical=True))

    @property
    def rev(self) -> int:
        with self.env.begin() as txn:
            return self.kv.current_revision(txn)

    def records(self) -> int:
        with self.env.begin() as txn:
            return txn.stat(self.kv._kv)["entries"]


@pytest.fixture
def env(tmp_path) -> Iterator[lmdb.Environment]:
    e = lmdb.open(str(tmp_path), max_dbs=32, map_size=1 << 30)
    yield e
    e.close()


@pytest.fixture
def s(env: lmdb.Environment) -> Store:
    return Store(env)


def keys(resp: pb.RangeResponse) -> list[bytes]:
    return [kv.key for kv in resp.kvs]


def put_op(key: bytes, value: bytes = b"", **kw: Any) -> pb.RequestOp:
    return pb.RequestOp(request_put=pb.PutRequest(key=key, value=value, **kw))


def get_op(key: bytes, range_end: bytes = b"", **kw: Any) -> pb.RequestOp:
    return pb.RequestOp(request_range=RR(key=key, range_end=range_end, **kw))


def del_op(key: bytes, range_end: bytes = b"", **kw: Any) -> pb.RequestOp:
    return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key, range_end=range_end, **kw))


def txn_op(compare: list[pb.Compare], success: list[pb.RequestOp], failure: list[pb.RequestOp] = ()) -> pb.RequestOp:
    return pb.RequestOp(request_txn=pb.TxnRequest(compare=compare, success=success, failure=list(failure)))


def raises(err: Err):
    class _Ctx:
        def __enter__(self) -> None:
            return None

        def __exit__(self, et, ev, tb) -> bool:
            assert et is EtcdError, f"expected {err}, got {et}"
            assert ev.err is err, f"expected {err}, got {ev.err}"
            return True

    return _Ctx()


# ---- revisions and versions ----
def test_revision_encoding_sorts_like_revisions() -> None:
    revs = [(1, 0), (1, 1), (2, 0), (255, 7), (256, 0), (1 << 40, 3)]
    enc = [revision.encode(*r) for r in revs]
    assert enc == sorted(enc)
    assert [revision.decode(b) for b in enc] == revs


def test_fresh_store_is_at_revision_1(s: Store) -> None:
    assert s.rev == 1
    with s.env.begin() as txn:
        assert s.kv.compacted_revision(txn) == 0
    assert s.get(b"a").count == 0


def test_put_creates_versions_and_revisions(s: Store) -> None:
    s.put(b"a", b"1")
    s.put(b"a", b"2")
    s.put(b"b", b"x")
    kv = s.get(b"a").kvs[0]
    assert (kv.create_revision, kv.mod_revision, kv.version, kv.value) == (2, 3, 2, b"2")
    assert s.rev == 4


def test_delete_resets_version_and_recreate_starts_new_generation(s: Store) -> None:
    s.put(b"a", b"1")
    s.put(b"a", b"2")
    assert s.delete(b"a").deleted == 1
    assert s.get(b"a").count == 0
    s.put(b"a", b"3")
    kv = s.get(b"a").kvs[0]
    assert (kv.create_revision, kv.mod_revision, kv.version) == (5, 5, 1)


def test_put_prev_kv(s: Store) -> None:
    assert not s.put(b"a", b"1", prev_kv=True).HasField("prev_kv")
    prev = s.put(b"a", b"2", prev_kv=True).prev_kv
    assert (prev.value, prev.mod_revision) == (b"1", 2)


def test_ignore_value_and_missing_key(s: Store) -> None:
    with raises(Err.KEY_NOT_FOUND):
        s.put(b"a", ignore_value=True)
    with raises(Err.KEY_NOT_FOUND):
        s.put(b"a", ignore_lease=True)
    assert s.rev == 1
    s.put(b"a", b"keep")
    s.put(b"a", ignore_value=True)
    kv = s.get(b"a").kvs[0]
    assert (kv.value, kv.version) == (b"keep", 2)


def test_put_with_unknown_lease_is_refused_without_writes(s: Store) -> None:
    with raises(Err.LEASE_NOT_FOUND):
        s.put(b"a", b"1", lease=42)
    assert s.rev == 1 and s.get(b"a").count == 0


# ---- Range ----
@pytest.fixture
def abc(s: Store) -> Store:
    for k, v in [(b"a", b"3"), (b"ab", b"1"), (b"b", b"2"), (b"c", b"0")]:
        s.put(k, v)
    s.put(b"b", b"22")  # b: version 2, mod 6
    return s


def test_range_shapes(abc: Store) -> None:
    assert keys(abc.get(b"a")) == [b"a"]
    assert keys(abc.get(b"a", b"b")) == [b"a", b"ab"]  # prefix a
    assert keys(abc.get(b"ab", b"\x00")) == [b"ab", b"b", b"c"]  # from key
    assert keys(abc.get(b"\x00", b"\x00")) == [b"a", b"ab", b"b", b"c"]  # everything
    assert keys(abc.get(b"c", b"a")) == []  # end before start
    assert abc.get(b"zz").count == 0


def test_range_limit_more_count(abc: Store) -> None:
    r = abc.get(b"\x00", b"\x00", limit=2)
    assert keys(r) == [b"a", b"ab"] and r.more and r.count == 4
    r = abc.get(b"\x00", b"\x00", limit=4)
    assert len(r.kvs) == 4 and not r.more and r.count == 4


def test_range_count_only_and_keys_only(abc: Store) -> None:
    r = abc.get(b"\x00", b"\x00", count_only=True)
    assert r.count == 4 and not r.kvs
    r = abc.get(b"a", b"b", keys_only=True)
    assert keys(r) == [b"a", b"ab"] and all(kv.value == b"" for kv in r.kvs)
    assert r.kvs[0].version == 1 and r.kvs[0].mod_revision == 2


def test_range_sorting(abc: Store) -> None:
    everything = {"key": b"\x00", "range_end": b"\x00"}
    assert keys(abc.call("range", RR(**everything, sort_order=RR.DESCEND))) == [b"c", b"b", b"ab", b"a"]
    # a target other than KEY with no order means ascending
    by_value = abc.call("range", RR(**everything, sort_target=RR.VALUE))
    assert [kv.value for kv in by_value.kvs] == [b"0", b"1", b"22", b"3"]
    by_mod = abc.call("range", RR(**everything, sort_target=RR.MOD, sort_order=RR.DESCEND, limit=2))
    assert keys(by_mod) == [b"b", b"c"] and by_mod.more and by_mod.count == 4
    by_version = abc.call("range", RR(**everything, sort_target=RR.VERSION, sort_order=RR.DESCEND))
    assert keys(by_version)[0] == b"b"
    by_create = abc.call("range", RR(**everything, sort_target=RR.CREATE, sort_order=RR.ASCEND))
    assert keys(by_create) == [b"a", b"ab", b"b", b"c"]


def test_range_sort_with_unset_order_keeps_etcd_limit_pushdown(abc: Store) -> None:
    # etcd fetches limit+1 keys in key order first when sort_order is NONE, then sorts those
    r = abc.call("range", RR(key=b"\x00", range_end=b"\x00", sort_target=RR.VALUE, limit=2))
    assert [kv.value for kv in r.kvs] == [b"1", b"22"] and r.more


def test_range_revision_filters(abc: Store) -> None:
    everything = {"key": b"\x00", "range_end": b"\x00"}
    r = abc.call("range", RR(**everything, min_mod_revision=4))
    assert keys(r) == [b"b", b"c"] and r.count == 4  # count is before filtering, like etcd
    r = abc.call("range", RR(**everything, max_create_revision=3))
    assert keys(r) == [b"a", b"ab"]
    r = abc.call("range", RR(**everything, min_create_revision=3, max_mod_revision=5, limit=1))
    assert keys(r) == [b"ab"] and r.more


def test_range_history(abc: Store) -> None:
    assert abc.get(b"b", revision=4).kvs[0].value == b"2"
    assert abc.get(b"b", revision=3).count == 0
    assert keys(abc.get(b"\x00", b"\x00", revision=3)) == [b"a", b"ab"]
    abc.delete(b"a")
    assert abc.get(b"a").count == 0
    assert abc.get(b"a", revision=6).kvs[0].value == b"3"
    with raises(Err.FUTURE_REV):
        abc.get(b"a", revision=abc.rev + 1)


def test_compaction_errors_and_reads(abc: Store) -> None:
    abc.put(b"a", b"new")  # rev 7
    abc.delete(b"c")  # rev 8
    abc.compact(6)
    with raises(Err.COMPACTED):
        abc.get(b"a", revision=5)
    with raises(Err.COMPACTED):
        abc.compact(6)
    with raises(Err.COMPACTED):
        abc.compact(3)
    with raises(Err.FUTURE_REV):
        abc.compact(9)
    # the compaction revision itself stays readable, and nothing visible at or after it changed
    assert [kv.value for kv in abc.get(b"\x00", b"\x00", revision=6).kvs] == [b"3", b"1", b"22", b"0"]
    assert [kv.value for kv in abc.get(b"\x00", b"\x00").kvs] == [b"new", b"1", b"22"]
    kv = abc.get(b"b").kvs[0]
    assert (kv.version, kv.create_revision) == (2, 4)  # versions survive compaction


def test_compaction_drops_records_physically(s: Store) -> None:
    for i in range(5):
        s.put(b"k", str(i).encode())
    s.put(b"gone", b"x")
    s.delete(b"gone")  # rev 8
    s.put(b"z", b"1")  # rev 9
    assert s.records() == 8
    s.compact(8)
    # k keeps its newest version; gone's tombstone at exactly rev 8 is kept for watchers; z stays
    assert s.records() == 3
    s.compact(9)
    assert s.records() == 2
    with s.env.begin() as txn:
        assert s.kv.history(txn, b"gone") == []
    assert s.get(b"k").kvs[0].version == 5


def test_delete_range(abc: Store) -> None:
    r = abc.delete(b"a", b"b", prev_kv=True)
    assert r.deleted == 2 and [kv.key for kv in r.prev_kvs] == [b"a", b"ab"]
    rev = abc.rev
    assert abc.delete(b"nothing").deleted == 0
    assert abc.rev == rev  # deleting nothing makes no revision
    assert abc.delete(b"b", b"\x00").deleted == 2
    assert abc.get(b"\x00", b"\x00").count == 0
    assert abc.rev == rev + 1


# ---- Txn ----
def test_txn_shares_one_revision_with_sub_revisions(s: Store) -> None:
    s.put(b"x", b"old")
    r = s.txn([], [put_op(b"a", b"1"), put_op(b"b", b"2"), del_op(b"x"), get_op(b"a", b"c")])
    assert s.rev == 3
    assert [op.response_put.header.revision for op in r.responses[:2]] == [3, 3]
    assert r.responses[2].response_delete_range.deleted == 1
    inner = r.responses[3].response_range
    assert keys(inner) == [b"a", b"b"] and inner.header.revision == 3  # sees the txn's own writes
    with s.env.begin() as txn:
        subs = [e.sub for k in (b"a", b"b", b"x") for e in s.kv.history(txn, k) if e.main == 3]
    assert subs == [0, 1, 2]


def test_txn_compare_targets(s: Store) -> None:
    s.put(b"k", b"v")  # rev 2
    s.put(b"k", b"v2")  # rev 3, version 2

    def ok(*cmps: pb.Compare) -> bool:
        return s.txn(list(cmps), []).succeeded

    assert ok(C(key=b"k", target=C.VERSION, result=C.EQUAL, version=2))
    assert ok(C(key=b"k", target=C.CREATE, result=C.EQUAL, create_revision=2))
    assert ok(C(key=b"k", target=C.MOD, result=C.GREATER, mod_revision=2))
    assert ok(C(key=b"k", target=C.MOD, result=C.LESS, mod_revision=4))
    assert ok(C(key=b"k", target=C.VALUE, result=C.EQUAL, value=b"v2"))
    assert ok(C(key=b"k", target=C.VALUE, result=C.NOT_EQUAL, value=b"v"))
    assert ok(C(key=b"k", target=C.LEASE, result=C.EQUAL, lease=0))
    assert not ok(C(key=b"k", target=C.VERSION, result=C.LESS, version=2))
    # a missing key: version/create/mod are 0, its value never compares
    assert ok(C(key=b"nope", target=C.VERSION, result=C.EQUAL, version=0))
    assert ok(C(key=b"nope", target=C.CREATE, result=C.EQUAL, create_revision=0))
    assert not ok(C(key=b"nope", target=C.VALUE, result=C.NOT_EQUAL, value=b"x"))
    # every compare must hold
    assert not ok(C(key=b"k", target=C.VERSION, result=C.EQUAL, version=2), C(key=b"k", target=C.VALUE, value=b""))
    assert s.rev == 3  # read-only txns make no revision


def test_txn_compare_over_range(s: Store) -> None:
    s.put(b"p/1", b"a")
    s.put(b"p/2", b"a")
    s.put(b"q", b"b")
    assert s.txn([C(key=b"p/", range_end=b"p0", target=C.VALUE, value=b"a")], []).succeeded
    assert not s.txn([C(key=b"p/", range_end=b"\x00", target=C.VALUE, value=b"a")], []).succeeded
    assert s.txn([C(key=b"p/", range_end=b"p0", target=C.CREATE, result=C.LESS, create_revision=4)], []).succeeded


def test_txn_failure_branch_and_nested(s: Store) -> None:
    s.put(b"flag", b"off")  # rev 2
    r = s.txn(
        [C(key=b"flag", target=C.VALUE, value=b"on")],
        [put_op(b"never")],
        [
            put_op(b"flag", b"on"),
            # nested compares see the state before the txn: flag is still "off" there
            txn_op([C(key=b"flag", target=C.VALUE, value=b"off")], [put_op(b"n1", b"x"), get_op(b"flag")]),
        ],
    )
    assert not r.succeeded
    nested = r.responses[1].response_txn
    assert nested.succeeded and nested.HasField("header") and nested.header.revision == 0
    assert nested.responses[0].response_put.header.revision == 3
    assert nested.responses[1].response_range.kvs[0].value == b"on"
    assert s.rev == 3 and s.get(b"never").count == 0
    assert s.get(b"n1").kvs[0].mod_revision == s.get(b"flag").kvs[0].mod_revision == 3


def test_txn_refusals_leave_nothing(s: Store) -> None:
    s.put(b"a", b"1")
    with raises(Err.LEASE_NOT_FOUND):
        s.txn([], [put_op(b"b", b"2"), put_op(b"c", lease=7)])
    with raises(Err.FUTURE_REV):
        s.txn([], [put_op(b"b", b"2"), get_op(b"a", revision=99)])
    with raises(Err.KEY_NOT_FOUND):
        s.txn([], [put_op(b"b", b"2"), txn_op([], [put_op(b"missing", ignore_value=True)])])
    assert s.rev == 2 and s.get(b"b").count == 0


def test_txn_history_read_and_compacted_read(s: Store) -> None:
    s.put(b"a", b"1")
    s.put(b"a", b"2")
    r = s.txn([], [put_op(b"a", b"3"), get_op(b"a", revision=2)])
    assert r.responses[1].response_range.kvs[0].value == b"1"
    s.compact(3)
    with raises(Err.COMPACTED):
        s.txn([], [get_op(b"a", revision=2)])


def test_hash_kv(env: lmdb.Environment, tmp_path) -> None:
    a = Store(env)
    other = lmdb.open(str(tmp_path / "other"), max_dbs=32, map_size=1 << 30)
    b = Store(other)
    for st_ in (a, b):
        st_.put(b"a", b"1")
        st_.put(b"b", b"2")
        st_.delete(b"a")
    with env.begin() as t1, other.begin() as t2:
        assert a.kv.hash_kv(t1, 0) == b.kv.hash_kv(t2, 0)
        h3 = a.kv.hash_kv(t1, 3)
        assert h3[1:] == (-1, 3) and h3 != a.kv.hash_kv(t1, 4)
        with raises(Err.FUTURE_REV):
            a.kv.hash_kv(t1, 10)
    b.put(b"c", b"3")
    with env.begin() as t1, other.begin() as t2:
        assert a.kv.hash_kv(t1, 4)[0] == b.kv.hash_kv(t2, 4)[0]
        assert a.kv.hash_kv(t1, 0)[0] != b.kv.hash_kv(t2, 0)[0]
    other.close()


def test_keys_longer_than_lmdb_allows(s: Store) -> None:
    # etcd bounds a key only by the request size; LMDB's 511-byte key cap must not show through
    # (ordering, ranges, leases and compaction of long keys: test_mvcc_long_keys.py)
    big = b"k" * (1 << 20)
    s.put(big, b"ok")
    assert s.get(big).kvs[0].value == b"ok"
    assert keys(s.get(b"k", b"\x00")) == [big]


# ---- API-layer validation ----
def test_validate_range_put_delete() -> None:
    with raises(Err.EMPTY_KEY):
        validate.check_range(RR())
    with raises(Err.INVALID_SORT_OPTION):
        validate.check_range(RR(key=b"a", sort_order=7))
    with raises(Err.INVALID_SORT_OPTION):
        validate.check_range(RR(key=b"a", sort_target=9))
    validate.check_range(RR(key=b"a", sort_order=RR.DESCEND, sort_target=RR.VALUE))
    with raises(Err.EMPTY_KEY):
        validate.check_put(pb.PutRequest(value=b"v"))
    with raises(Err.VALUE_PROVIDED):
        validate.check_put(pb.PutRequest(key=b"a", value=b"v", ignore_value=True))
    with raises(Err.LEASE_PROVIDED):
        validate.check_put(pb.PutRequest(key=b"a", lease=1, ignore_lease=True))
    with raises(Err.EMPTY_KEY):
        validate.check_delete_range(pb.DeleteRangeRequest(range_end=b"z"))


def check_txn(compare=(), success=(), failure=(), max_ops: int = 128) -> None:
    validate.check_txn(pb.TxnRequest(compare=list(compare), success=list(success), failure=list(failure)), max_ops)


def test_validate_txn_shape() -> None:
    with raises(Err.TOO_MANY_OPS):
        check_txn(success=[get_op(b"a")] * 129)
    with raises(Err.TOO_MANY_OPS):
        check_txn(compare=[C(key=b"a")] * 3, max_ops=2)
    check_txn(success=[get_op(b"a")] * 128, failure=[get_op(b"a")] * 128)
    # nested txns get what the parent's widest list leaves
    with raises(Err.TOO_MANY_OPS):
        check_txn(success=[get_op(b"a"), txn_op([], [get_op(b"b")] * 3)], max_ops=4)
    check_txn(success=[get_op(b"a"), txn_op([], [get_op(b"b")] * 2)], max_ops=4)
    with raises(Err.EMPTY_KEY):
        check_txn(compare=[C(key=b"")])
    with raises(Err.KEY_NOT_FOUND):
        check_txn(success=[pb.RequestOp()])
    with raises(Err.VALUE_PROVIDED):
        check_txn(failure=[txn_op([], [put_op(b"a", b"v", ignore_value=True)])])


def test_validate_txn_duplicate_keys() -> None:
    with raises(Err.DUPLICATE_KEY):
        check_txn(success=[put_op(b"a"), put_op(b"a")])
    with raises(Err.DUPLICATE_KEY):
        check_txn(success=[del_op(b"a", b"c"), put_op(b"b")])
    with raises(Err.DUPLICATE_KEY):
        check_txn(success=[del_op(b"b"), put_op(b"b")])
    with raises(Err.DUPLICATE_KEY):
        check_txn(success=[put_op(b"a"), txn_op([], [put_op(b"a")])])
    with raises(Err.DUPLICATE_KEY):
        check_txn(success=[del_op(b"a", b"z"), txn_op([], [], [put_op(b"k")])])
    with raises(Err.DUPLICATE_KEY):
        check_txn(success=[txn_op([], [del_op(b"k")]), put_op(b"k")])
    # allowed: the two branches of one nested txn, different branches, deletes overlapping deletes,
    # and etcd's quirk that a "\x00" range end makes an interval that overlaps nothing
    check_txn(success=[txn_op([], [put_op(b"a")], [put_op(b"a")])])
    check_txn(success=[put_op(b"a")], failure=[put_op(b"a")])
    check_txn(success=[del_op(b"a", b"z"), del_op(b"b")])
    check_txn(success=[del_op(b"a", b"\x00"), put_op(b"b")])
    check_txn(success=[del_op(b"a", b"b"), put_op(b"b")])


# ---- model check ----
KEYS = [b"a", b"ab", b"b", b"ba", b"c"]
ENDS = [b"", b"\x00", b"a", b"b", b"bb", b"c", b"d"]

op_strategy = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.binary(max_size=3)),
    st.tuples(st.just("del"), st.sampled_from(KEYS), st.sampled_from(ENDS)),
    st.tuples(st.just("txn"), st.lists(st.sampled_from(KEYS), max_size=3, unique=True), st.binary(max_size=2)),
)


def in_range(k: bytes, key: bytes, end: bytes) -> bool:
    if not end:
        return k == key
    if end == b"\x00":
        return k >= key
    return key <= k < end


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(op_strategy, max_size=14),
    reads=st.lists(
        st.tuples(st.sampled_from(KEYS), st.sampled_from(ENDS), st.integers(0, 3), st.integers(0, 3), st.booleans()),
        min_size=1,
        max_size=6,
    ),
    compact_at=st.integers(0, 20),
)
def test_range_matches_dict_model(tmp_path_factory, ops, reads, compact_at) -> None:
    env = lmdb.open(str(tmp_path_factory.mktemp("model")), max_dbs=32, map_size=1 << 26)
    s = Store(env)
    model: dict[bytes, dict[str, Any]] = {}
    snapshots = {1: {}}  # revision -> {key: (value, create, mod, version)}
    rev = 1
    for op in ops:
        if op[0] == "put":
            _, k, v = op
            rev += 1
            s.put(k, v)
            old = model.get(k)
            model[k] = {"v": v, "c": old["c"] if old else rev, "m": rev, "ver": old["ver"] + 1 if old else 1}
        elif op[0] == "del":
            _, k, end = op
            victims = [x for x in model if in_range(x, k, end)]
            s.delete(k, end)
            if victims:
                rev += 1
                for x in victims:
                    del model[x]
        else:
            _, ks, v = op
            s.txn([], [put_op(k, v) for k in ks])
            if ks:
                rev += 1
                for k in ks:
                    old = model.get(k)
                    model[k] = {"v": v, "c": old["c"] if old else rev, "m": rev, "ver": old["ver"] + 1 if old else 1}
        snapshots[rev] = {k: (d["v"], d["c"], d["m"], d["ver"]) for k, d in model.items()}
    assert s.rev == rev
    floor = 0
    if ops and 0 < compact_at <= rev:
        s.compact(compact_at)
        floor = compact_at
    for key, end, back, limit, descend in reads:
        at = max(rev - back, 1)
        want = sorted((k, kv) for k, kv in latest_at(snapshots, at).items() if in_range(k, key, end))
        if at < floor:
            with raises(Err.COMPACTED):
                s.get(key, end, revision=at)
            continue
        order = RR.DESCEND if descend else RR.NONE
        got = s.get(key, end, revision=at, limit=limit, sort_order=order)
        shown = want[::-1] if descend else want
        if limit:
            shown = shown[:limit]
        assert [(kv.key, (kv.value, kv.create_revision, kv.mod_revision, kv.version)) for kv in got.kvs] == shown
        assert got.count == len(want) and got.more == (len(shown) < len(want))
        assert s.get(key, end, revision=at, count_only=True).count == len(want)
    env.close()


def latest_at(snapshots: dict[int, dict], at: int) -> dict:
    return snapshots[max(r for r in snapshots if r <= at)]
