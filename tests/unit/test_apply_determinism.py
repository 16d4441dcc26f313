"""Trust item 10: apply decides from replicated state only, and a local failure stops the node.

A node restored from a compacted snapshot holds the same data in fewer LMDB pages than one that
applied the whole log; if apply looked at its page count, the two would answer the same entry
differently and their key spaces would diverge. And an entry that fails for a reason local to
one node (a bug, a full LMDB map) must not be answered and skipped there while the others apply
it: the node stops instead, with nothing of the batch committed, and replays it on restart.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest
from google.protobuf.message import Message

from authstore.raft.types import Entry
from authstore.state.apply import Applier, AuthRevisionMoved
from authstore.state.backend import Backend
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError

BIG = 100 << 10


class Log:
    """Numbers entries the way a Raft log would."""

    def __init__(self) -> None:
        self._index = itertools.count(1)

    def entry(self, **request: object) -> Entry:
        req = ipb.InternalRaftRequest(ID=0, **request)  # type: ignore[arg-type]
        index = next(self._index)
        req.ID = index
        return Entry(term=1, index=index, data=req.SerializeToString())


def put(key: bytes, value: bytes) -> dict[str, object]:
    return {"put": pb.PutRequest(key=key, value=value)}


def hash_kv(applier: Applier) -> tuple[int, int, int]:
    with applier.env.begin() as txn:
        return applier.kv.hash_kv(txn, 0)


def apply_one(applier: Applier, entry: Entry) -> object:
    ((_, result),) = applier.apply_batch([entry])
    return result


@pytest.fixture
def backends(tmp_path: Path) -> Iterator[list[Backend]]:
    opened: list[Backend] = []
    yield opened
    for b in opened:
        b.close()


def test_same_entries_same_hashkv_on_fresh_and_restored_store(tmp_path: Path, backends: list[Backend]) -> None:
    log = Log()
    fresh_backend = Backend(tmp_path / "fresh", map_size=64 << 20)
    backends.append(fresh_backend)
    fresh = Applier(fresh_backend, member_id=1)
    # The fresh store fills ~700 KiB, then deletes and compacts it all away: its LMDB file keeps
    # the pages (LMDB reuses them, never gives them back); apply once weighed those against a quota.
    history = [log.entry(**put(b"/fill/%d" % i, b"v" * BIG)) for i in range(6)]
    history.append(log.entry(delete_range=pb.DeleteRangeRequest(key=b"/fill/", range_end=b"/fill0")))
    history.append(log.entry(compaction=pb.CompactionRequest(revision=8, physical=True)))
    for e in history:
        result = apply_one(fresh, e)
        assert not isinstance(result, Exception), result

    # A follower restored from a (compacted) snapshot of that store: same data, fewer pages.
    restored_backend = Backend(tmp_path / "restored", map_size=64 << 20)
    backends.append(restored_backend)
    restored = Applier(restored_backend, member_id=2)
    restored.restore(fresh_backend.copy_to(tmp_path / "snapshot"))
    assert hash_kv(restored) == hash_kv(fresh)

    # The same entries after the snapshot: both must apply them alike.
    after = [log.entry(**put(b"/after/%d" % i, b"w" * (3 * BIG))) for i in range(2)]
    for e in after:
        a, b = apply_one(fresh, e), apply_one(restored, e)
        assert type(a) is type(b), (a, b)
    assert hash_kv(fresh) == hash_kv(restored)
    with fresh.env.begin() as t1, restored.env.begin() as t2:
        assert fresh.alarms(t1) == restored.alarms(t2)


def test_nospace_alarm_in_the_log_refuses_writes_on_every_replica(tmp_path: Path, backends: list[Backend]) -> None:
    """The alarm is replicated state: apply refuses what adds data while it is set, from the log
    alone (etcd's applierV3Capped), and lets deletes and compaction through."""
    log = Log()
    b = Backend(tmp_path / "s", map_size=64 << 20)
    backends.append(b)
    applier = Applier(b, member_id=1)
    assert isinstance(apply_one(applier, log.entry(**put(b"k", b"1"))), pb.PutResponse)
    raised = apply_one(applier, log.entry(alarm=pb.AlarmRequest(action=pb.AlarmRequest.ACTIVATE, memberID=7,
                                                                alarm=pb.NOSPACE)))
    assert isinstance(raised, pb.AlarmResponse)
    refused = [
        log.entry(**put(b"k", b"2")),
        log.entry(txn=pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=b"k", value=b"3"))])),
        log.entry(lease_grant=pb.LeaseGrantRequest(ID=5, TTL=60)),
    ]
    for e in refused:
        result = apply_one(applier, e)
        assert isinstance(result, EtcdError) and result.err is Err.NO_SPACE, result
        assert result.message == "etcdserver: mvcc: database space exceeded"
    assert isinstance(apply_one(applier, log.entry(delete_range=pb.DeleteRangeRequest(key=b"k"))),
                      pb.DeleteRangeResponse)
    apply_one(applier, log.entry(alarm=pb.AlarmRequest(action=pb.AlarmRequest.DEACTIVATE, memberID=7,
                                                       alarm=pb.NOSPACE)))
    assert isinstance(apply_one(applier, log.entry(**put(b"k", b"4"))), pb.PutResponse)


def test_unexpected_exception_in_apply_stops_instead_of_skipping(tmp_path: Path, backends: list[Backend],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug on one node must not turn into an answer there (NOT_CAPABLE) and a skipped entry that
    the other nodes applied: the batch fails as a whole and nothing of it is committed."""
    log = Log()
    b = Backend(tmp_path / "s", map_size=64 << 20)
    backends.append(b)
    applier = Applier(b, member_id=1)
    apply_one(applier, log.entry(**put(b"before", b"1")))

    def broken(*_a: object) -> None:
        raise RuntimeError("a bug in one handler")

    monkeypatch.setattr(applier.kv, "put", broken)
    batch = [log.entry(delete_range=pb.DeleteRangeRequest(key=b"before")), log.entry(**put(b"k", b"2"))]
    with pytest.raises(Exception) as raised:
        applier.apply_batch(batch)
    assert not isinstance(raised.value, EtcdError)
    assert applier.applied_index() == 1
    with applier.env.begin() as txn:
        assert applier.kv.get(txn, b"before") is not None  # the batch's delete was not committed


def test_full_lmdb_map_in_apply_stops_instead_of_answering_nospace(tmp_path: Path,
                                                                    backends: list[Backend]) -> None:
    """A full LMDB map is this node's problem (its map is too small), not a replicated decision:
    answering NOSPACE here while other nodes apply the entry would split the replicas."""
    log = Log()
    b = Backend(tmp_path / "s", map_size=1 << 20)
    backends.append(b)
    applier = Applier(b, member_id=1)
    apply_one(applier, log.entry(**put(b"before", b"1")))
    with pytest.raises(Exception) as raised:
        applier.apply_batch([log.entry(**put(b"huge", b"x" * (2 << 20)))])
    assert isinstance(raised.value.__cause__ or raised.value, lmdb.MapFullError), raised.value
    assert applier.applied_index() == 1
    with applier.env.begin() as txn:
        assert applier.alarms(txn) == pb.AlarmResponse()


class _Requests:
    """Random client requests, valid and not: odd keys, negative numbers, nested Txns."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def key(self) -> bytes:
        r = self.rng
        return r.choice([b"", b"a", b"\x00", b"\xff" * 600, b"k" * r.randint(1, 2000),
                         bytes([r.randint(0, 255)]) * r.randint(0, 5)])

    def num(self) -> int:
        return self.rng.choice([0, 1, 5, -1, 2**62, -(2**63)])

    def put(self) -> pb.PutRequest:
        r = self.rng
        return pb.PutRequest(key=self.key(), value=self.key(), lease=self.num(), prev_kv=r.random() < .5,
                             ignore_value=r.random() < .2, ignore_lease=r.random() < .2)

    def range(self) -> pb.RangeRequest:
        r = self.rng
        return pb.RangeRequest(key=self.key(), range_end=self.key(), revision=r.randint(-5, 50),
                               limit=r.randint(-3, 5), sort_order=r.randint(0, 2), sort_target=r.randint(0, 4),
                               count_only=r.random() < .3, keys_only=r.random() < .3,
                               min_mod_revision=r.randint(-2, 5), max_create_revision=r.randint(-2, 5))

    def op(self, depth: int) -> pb.RequestOp:
        c = self.rng.randint(0, 3 if depth < 2 else 2)
        if c == 0:
            return pb.RequestOp(request_put=self.put())
        if c == 1:
            return pb.RequestOp(request_range=self.range())
        if c == 2:
            return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=self.key(), range_end=self.key(),
                                                                           prev_kv=self.rng.random() < .5))
        return pb.RequestOp(request_txn=self.txn(depth + 1))

    def txn(self, depth: int = 0) -> pb.TxnRequest:
        r = self.rng
        cmps = [pb.Compare(key=self.key(), range_end=self.key(), target=r.randint(0, 4), result=r.randint(0, 3),
                           version=r.randint(-2, 5), create_revision=r.randint(-2, 5), mod_revision=r.randint(-2, 5),
                           value=self.key(), lease=r.randint(-2, 5)) for _ in range(r.randint(0, 3))]
        return pb.TxnRequest(compare=cmps, success=[self.op(depth) for _ in range(r.randint(0, 4))],
                             failure=[self.op(depth) for _ in range(r.randint(0, 3))])

    def request(self) -> dict[str, object]:
        c = self.rng.randint(0, 8)
        at = self.rng.choice([0, -1, 2**62, 1_700_000_000_000])
        return [
            {"put": self.put()},
            {"txn": self.txn()},
            {"delete_range": pb.DeleteRangeRequest(key=self.key(), range_end=self.key(), prev_kv=True)},
            {"lease_grant": pb.LeaseGrantRequest(ID=self.num(), TTL=self.num()), "time_unix_ms": at},
            {"lease_revoke": pb.LeaseRevokeRequest(ID=self.num())},
            {"compaction": pb.CompactionRequest(revision=self.rng.randint(-3, 60))},
            {"range": self.range()},
            {"lease_renew": ipb.LeaseRenewEntry(ID=self.num()), "time_unix_ms": at},
            {"auth_failures": ipb.AuthFailuresEntry(names=[self.key().decode("latin-1") for _ in range(3)],
                                                    attempts=self.rng.randint(0, 2),
                                                    duration_ms=self.rng.choice([0, 1, 60_000, 2**62])),
             "time_unix_ms": at},
        ][c]


def test_no_client_request_makes_apply_fail(tmp_path: Path, backends: list[Backend]) -> None:
    """With fail-stop, an exception in apply that a client can provoke would stop every node (they
    all apply the same entry): every request, however odd, must end in a response or an etcd error."""
    log = Log()
    b = Backend(tmp_path / "s", map_size=256 << 20)
    backends.append(b)
    applier = Applier(b, member_id=1)
    requests = _Requests(seed=1)
    for _ in range(1500):
        result = apply_one(applier, log.entry(**requests.request()))
        assert result is None or isinstance(result, Message | EtcdError | AuthRevisionMoved), result
