"""The whole snapshot path in one process: save (the copy a leader sends and a client downloads),
install on another node, restart from it, and go on applying — under generated histories.

After each step both stores must hold the same replicated state: the same HashKV and the same
records in every sub-database but the node-local meta. A key with hundreds of revisions is in
every history shape that matters (it becomes a sub-database of duplicates inside LMDB, the shape
LMDB 0.9.36's compacting copy crashed the process on).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import lmdb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from authstore.raft.types import Entry
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb

KEYS = [b"a", b"b", b"c", b"hot", b"k/1", b"k/2", b"k/3"]

Op = tuple[str, object]


def _requests(ops: Sequence[Op], revision: Callable[[], int]) -> Iterator[ipb.InternalRaftRequest]:
    """Log entries for `ops`; a compaction is `arg` per cent of the revision applied when it is made."""
    for kind, arg in ops:
        req = ipb.InternalRaftRequest(header=ipb.RequestHeader())
        if kind == "put":
            key, value = arg  # type: ignore[misc]
            req.put.CopyFrom(pb.PutRequest(key=key, value=value))
        elif kind == "hot":
            for i in range(arg):  # type: ignore[call-overload]
                yield ipb.InternalRaftRequest(header=ipb.RequestHeader(),
                                              put=pb.PutRequest(key=b"hot", value=b"%d" % i))
            continue
        elif kind == "delete":
            key, end = arg  # type: ignore[misc]
            req.delete_range.CopyFrom(pb.DeleteRangeRequest(key=key, range_end=end))
        elif kind == "compact":
            req.compaction.CopyFrom(pb.CompactionRequest(revision=max(1, revision() * arg // 100)))  # type: ignore[operator]
        elif kind == "user":
            req.auth_user_add.CopyFrom(pb.AuthUserAddRequest(name=arg, hashedPassword="$2b$04$" + "x" * 53))  # type: ignore[arg-type]
        yield req


class Store:
    """One store node's state machine on its own LMDB directory."""

    def __init__(self, path: Path, member_id: int) -> None:
        self.path = path
        self.member_id = member_id
        self.applier = Applier(Backend(path), member_id=member_id)

    def apply(self, reqs: Sequence[ipb.InternalRaftRequest], first_index: int) -> int:
        """Applies `reqs` as one batch from `first_index`; returns the next free index."""
        entries = [Entry(term=1, index=first_index + i, data=r.SerializeToString()) for i, r in enumerate(reqs)]
        if entries:
            self.applier.apply_batch(entries)
        return first_index + len(entries)

    def apply_ops(self, ops: Sequence[Op], first_index: int, batch: int) -> int:
        """Applies `ops` in batches of at most `batch` entries; each op sees the state before it."""
        index = first_index
        for op in ops:
            reqs = list(_requests([op], self.revision))
            for i in range(0, len(reqs), batch):
                index = self.apply(reqs[i:i + batch], index)
        return index

    def revision(self) -> int:
        with self.applier.env.begin() as txn:
            return self.applier.kv.current_revision(txn)

    def restart(self) -> None:
        self.applier.backend.close()
        self.applier = Applier(Backend(self.path), member_id=self.member_id)

    def state(self) -> tuple[tuple[int, int, int], dict[bytes, list[tuple[bytes, bytes]]]]:
        """(HashKV, every record of every replicated sub-database)."""
        env = self.applier.env
        with env.begin() as txn:
            hashkv = self.applier.kv.hash_kv(txn, 0)
            with txn.cursor() as names:
                dbs = [name for name, _ in names if name != b"meta"]
            records = {}
            for name in dbs:
                db = env.open_db(name, txn=txn, create=False)
                with txn.cursor(db=db) as cur:
                    records[name] = list(cur)
        return hashkv, records

    def close(self) -> None:
        self.applier.backend.close()


def _check_snapshot_path(history: Sequence[Op], tail: Sequence[Op], batch: int) -> None:
    with tempfile.TemporaryDirectory(prefix="raftgate-snap-test-") as tmp:
        root = Path(tmp)
        leader = Store(root / "leader", 1)
        follower = Store(root / "follower", 2)
        try:
            index = leader.apply_ops(history, 1, batch)
            # save: the copy the leader streams to a follower, and a client's Snapshot downloads
            saved = leader.applier.backend.copy_to(root / "snap")
            # install on another node
            follower.applier.restore(saved)
            assert follower.state() == leader.state()
            # restart from it
            follower.restart()
            assert follower.state() == leader.state()
            # and both go on applying the same entries
            more = list(_requests(tail, leader.revision))
            leader.apply(more, index)
            follower.apply(more, index)
            assert follower.state() == leader.state()
            assert follower.applier.applied_index() == leader.applier.applied_index()
        finally:
            leader.close()
            follower.close()


_key = st.sampled_from(KEYS)
_op = st.one_of(
    st.tuples(st.just("put"), st.tuples(_key, st.binary(max_size=64))),
    st.tuples(st.just("hot"), st.integers(1, 400)),
    st.tuples(st.just("delete"), st.tuples(_key, st.sampled_from([b"", b"\x00", b"k0", b"z"]))),
    st.tuples(st.just("compact"), st.integers(1, 100)),
    st.tuples(st.just("user"), st.sampled_from(["alice", "bob", "carol"])),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=st.lists(_op, min_size=1, max_size=12), tail=st.lists(_op, max_size=4), batch=st.integers(1, 64))
def test_snapshot_save_install_restart_keeps_replicas_equal(history: list[Op], tail: list[Op], batch: int) -> None:
    _check_snapshot_path(history, tail, batch)


def test_snapshot_of_a_key_with_many_revisions() -> None:
    """The shape that crashed: hundreds of revisions of one key, some compacted away."""
    _check_snapshot_path([("hot", 300), ("compact", 50), ("hot", 200), ("delete", (b"hot", b""))],
                         [("hot", 150)], batch=32)


def test_snapshot_copy_is_a_plain_lmdb_file(tmp_path: Path) -> None:
    """What a client saves opens as an LMDB environment on its own (the format the README names)."""
    store = Store(tmp_path / "s", 1)
    try:
        store.apply_ops([("hot", 200), ("put", (b"a", b"1"))], 1, batch=64)
        saved = store.applier.backend.copy_to(tmp_path / "snap")
    finally:
        store.close()
    env = lmdb.open(str(saved), subdir=False, readonly=True, lock=False, max_dbs=32)
    try:
        with env.begin() as txn:
            names = {name for name, _ in txn.cursor()}
        assert b"mvcc_index" in names and b"mvcc_kv" in names
    finally:
        env.close()


def test_a_restart_after_installing_a_snapshot_holds_the_leaders_state(tmp_path: Path) -> None:
    """(Its member ID is not in the store: tests/storage/test_snapshot_identity.py.)"""
    leader = Store(tmp_path / "leader", 1)
    follower = Store(tmp_path / "follower", 2)
    try:
        leader.apply_ops([("hot", 50), ("put", (b"a", b"1"))], 1, batch=16)
        follower.applier.restore(leader.applier.backend.copy_to(tmp_path / "snap"))
        follower.restart()
        assert follower.state() == leader.state()
    finally:
        leader.close()
        follower.close()
