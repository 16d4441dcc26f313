"""RawNode's Ready/advance contract, MemoryStorage, the raftpb codec and the log's edge cases."""

from __future__ import annotations

import random

import pytest

from authstore.raft import (
    CompactedError,
    ConfChange,
    ConfChangeType,
    Config,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    ProposalDroppedError,
    RawNode,
    Ready,
    Snapshot,
    SnapshotMetadata,
    SnapshotOutOfDateError,
    StateType,
    UnavailableError,
    bootstrap,
    codec,
)
from authstore.raft.log import RaftLog, RaftLogError
from protos.raftpb import raft_pb2 as pb
from tests.support.raft_helpers import storage_with


def single_node() -> tuple[RawNode, MemoryStorage]:
    st = MemoryStorage()
    bootstrap(st, [1])
    return RawNode(Config(id=1, storage=st, rng=random.Random(1))), st


def handle(rn: RawNode, st: MemoryStorage) -> list:
    """The driver's duties for one Ready, in order; returns the applied entries."""
    rd = rn.ready()
    if rd is None:
        return []
    if rd.snapshot is not None:
        st.apply_snapshot(rd.snapshot)
    if rd.hard_state is not None:
        st.set_hard_state(rd.hard_state)
    st.append(rd.entries)
    for e in rd.committed_entries:
        if e.type == EntryType.CONF_CHANGE:
            rn.apply_conf_change(codec.decode_conf_change(e.data))
    rn.advance(rd)
    return rd.committed_entries


def test_bootstrap_then_single_node_elects_itself_and_commits() -> None:
    rn, st = single_node()
    applied = handle(rn, st)
    assert [e.type for e in applied] == [EntryType.CONF_CHANGE]
    assert rn.status().conf_state.voters == [1]
    rn.campaign()
    rd = rn.ready()
    assert rd is not None
    assert rd.soft_state is not None and rd.soft_state.state == StateType.LEADER
    assert rd.hard_state == HardState(term=2, vote=1, commit=1)
    assert [(e.index, e.term) for e in rd.entries] == [(2, 2)]
    assert rd.committed_entries == []  # committed only once persisted (then advanced)
    assert rd.must_sync
    with pytest.raises(RuntimeError):
        rn.ready()
    st.set_hard_state(rd.hard_state)
    st.append(rd.entries)
    rn.advance(rd)
    assert [e.index for e in handle(rn, st)] == [2]
    assert rn.ready() is None
    rn.propose(b"hello")
    applied = settle(rn, st)
    assert [e.data for e in applied] == [b"hello"]
    assert st.last_index() == 3 and rn.status().applied == 3


def persist(st: MemoryStorage, rd: Ready) -> None:
    """Step 1 of the driver's duties: make rd's hard state and entries durable."""
    if rd.hard_state is not None:
        st.set_hard_state(rd.hard_state)
    st.append(rd.entries)


def settle(rn: RawNode, st: MemoryStorage) -> list[Entry]:
    """Handles Ready after Ready until there is none; returns the applied entries."""
    applied: list[Entry] = []
    for _ in range(10):
        if not rn.has_ready():
            return applied
        applied += handle(rn, st)
    raise AssertionError("the node never settles")


def test_single_node_leader_commits_its_entries_only_after_persisting_them() -> None:
    rn, st = single_node()
    handle(rn, st)
    rn.campaign()
    rd = rn.ready()
    assert rd is not None and [(e.index, e.term) for e in rd.entries] == [(2, 2)]
    assert rd.hard_state == HardState(term=2, vote=1, commit=1)  # not 2: entry 2 is not on disk yet
    assert rd.committed_entries == []
    persist(st, rd)
    rn.advance(rd)  # the leader's acknowledgement of its own entry arrives here
    rd = rn.ready()
    assert rd is not None and rd.hard_state == HardState(term=2, vote=1, commit=2)
    assert [e.index for e in rd.committed_entries] == [2] and not rd.entries and not rd.must_sync
    rn.advance(rd)
    rn.propose(b"hello")
    rd = rn.ready()
    assert rd is not None and [e.index for e in rd.entries] == [3]
    assert rd.hard_state is None and rd.committed_entries == []
    assert rn.status().commit == 2
    persist(st, rd)
    rn.advance(rd)
    assert rn.status().commit == 3
    assert [e.data for e in settle(rn, st)] == [b"hello"]


def test_leader_never_counts_its_own_unpersisted_entry_toward_commit() -> None:
    st = MemoryStorage.with_conf([1, 2, 3])
    rn = RawNode(Config(id=1, storage=st, rng=random.Random(1), pre_vote=False))
    rn.campaign()
    rn.step(Message(MessageType.MsgVoteResp, to=1, frm=2, term=1))
    assert rn.status().state == StateType.LEADER
    settle(rn, st)  # the leader's empty entry (index 1) is on its disk
    rn.step(Message(MessageType.MsgAppResp, to=1, frm=2, term=1, index=1))
    assert rn.status().commit == 1
    settle(rn, st)
    rn.propose(b"x")
    rd = rn.ready()
    assert rd is not None and [e.index for e in rd.entries] == [2]
    assert [m.to for m in rd.messages if m.type == MessageType.MsgApp] == [2]  # sent before its own write
    # Follower 2 has entry 2 on disk while the leader's own write is still under way: 2 of 3 is a
    # quorum only with the leader's copy, which is not durable yet.
    rn.step(Message(MessageType.MsgAppResp, to=1, frm=2, term=1, index=2))
    assert rn.status().commit == 1
    assert rn.status().progress[1][0] == 1  # the leader's own match
    persist(st, rd)
    rn.advance(rd)
    assert rn.status().commit == 2 and rn.status().progress[1][0] == 2
    assert [e.data for e in settle(rn, st)] == [b"x"]


def test_commit_only_hard_state_change_needs_no_sync() -> None:
    st = storage_with([1, 2], [1, 1])
    st.set_hard_state(HardState(term=1))
    rn = RawNode(Config(id=2, storage=st, rng=random.Random(2)))
    handle(rn, st)
    rn.step(Message(MessageType.MsgHeartbeat, to=2, frm=1, term=1, commit=2))
    rd = rn.ready()
    assert rd is not None and rd.hard_state is not None and rd.hard_state.commit == 2
    assert not rd.must_sync
    assert [m.type for m in rd.messages] == [MessageType.MsgHeartbeatResp]


def test_read_index_through_ready() -> None:
    rn, st = single_node()
    handle(rn, st)
    rn.campaign()
    handle(rn, st)
    rn.read_index(b"r1")
    rd = rn.ready()
    assert rd is not None and [(r.index, r.ctx) for r in rd.read_states] == [(2, b"r1")]
    rn.advance(rd)
    with pytest.raises(ValueError):
        rn.read_index(b"")


def test_propose_without_leader_raises_and_step_refuses_local_messages() -> None:
    st = MemoryStorage.with_conf([1, 2, 3])
    rn = RawNode(Config(id=1, storage=st, rng=random.Random(1)))
    with pytest.raises(ProposalDroppedError):
        rn.propose(b"x")
    with pytest.raises(ValueError):
        rn.step(Message(MessageType.MsgHup, to=1, frm=1))
    # a forwarded proposal that cannot be placed is dropped quietly
    rn.step(Message(MessageType.MsgProp, to=1, frm=2, entries=[Entry(data=b"x")]))


def test_conf_change_through_rawnode() -> None:
    rn, st = single_node()
    handle(rn, st)
    rn.campaign()
    settle(rn, st)
    rn.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER_NODE, 2))
    applied = settle(rn, st)
    assert applied[-1].type == EntryType.CONF_CHANGE
    assert rn.status().conf_state == ConfState([1], [2])
    assert set(rn.status().progress) == {1, 2}


def test_restart_keeps_only_persisted_state() -> None:
    rn, st = single_node()
    handle(rn, st)
    rn.campaign()
    settle(rn, st)
    rn.propose(b"lost")  # never persisted: the Ready is dropped on the floor
    assert rn.ready() is not None
    rn2 = RawNode(Config(id=1, storage=st, rng=random.Random(1)))
    assert rn2.status().term == 2 and rn2.raft.log.last_index() == 2
    rd = rn2.ready()
    assert rd is not None and [e.index for e in rd.committed_entries] == [1, 2]  # re-applied from applied=0


def test_memory_storage() -> None:
    st = storage_with([1], [1, 1, 2, 2, 3])
    assert (st.first_index(), st.last_index()) == (1, 5)
    assert [e.index for e in st.entries(2, 5, 1 << 20)] == [2, 3, 4]
    assert len(st.entries(1, 6, 0)) == 1  # at least one entry whatever the size limit
    st.create_snapshot(3, ConfState([1]), b"s3")
    st.compact(3)
    assert st.first_index() == 4 and st.term(3) == 2
    with pytest.raises(CompactedError):
        st.term(2)
    with pytest.raises(CompactedError):
        st.entries(3, 5, 1 << 20)
    with pytest.raises(UnavailableError):
        st.entries(4, 7, 1 << 20)
    st.append([Entry(4, 5), Entry(4, 6)])  # overwrite the suffix from index 5
    assert [(e.index, e.term) for e in st.entries(4, 7, 1 << 20)] == [(4, 2), (5, 4), (6, 4)]
    with pytest.raises(SnapshotOutOfDateError):
        st.apply_snapshot(Snapshot(b"", SnapshotMetadata(ConfState([1]), 2, 1)))
    st.apply_snapshot(Snapshot(b"s10", SnapshotMetadata(ConfState([1, 2]), 10, 5)))
    assert (st.first_index(), st.last_index(), st.term(10)) == (11, 10, 5)
    assert st.initial_state()[1] == ConfState([1, 2])


def test_log_unstable_overwrite_and_stable_to() -> None:
    st = storage_with([1], [1, 1, 1])
    log = RaftLog(st)
    log.append([Entry(2, 4), Entry(2, 5)])
    assert log.last_index() == 5
    log.append([Entry(3, 3)])  # shadows the stable entry 3 and drops 4, 5
    assert (log.last_index(), log.term(3), log.term(2)) == (3, 3, 1)
    log.stable_to(5, 2)  # a stale acknowledgement: ignored
    assert log.unstable and log.offset == 3
    log.stable_to(3, 3)
    assert not log.unstable and log.offset == 4
    log.commit_to(2)
    with pytest.raises(RaftLogError):
        log.append([Entry(4, 2)])
    with pytest.raises(RaftLogError):
        log.commit_to(10)


def test_find_conflict_by_term() -> None:
    log = RaftLog(storage_with([1], [1, 1, 2, 2, 2, 5, 5]))
    assert log.find_conflict_by_term(7, 3) == (5, 2)
    assert log.find_conflict_by_term(7, 5) == (7, 5)
    assert log.find_conflict_by_term(4, 1) == (2, 1)
    assert log.find_conflict_by_term(1, 0) == (0, 0)


def test_codec_round_trip_and_enum_numbers() -> None:
    for t in MessageType:
        assert pb.MessageType.Value(t.name) == t.value
    assert pb.EntryType.Value("CONF_CHANGE") == EntryType.CONF_CHANGE
    assert pb.ConfChangeType.Value("ADD_LEARNER_NODE") == ConfChangeType.ADD_LEARNER_NODE
    snap = Snapshot(b"data", SnapshotMetadata(ConfState([1, 2], [3]), 7, 2))
    m = Message(MessageType.MsgApp, to=2, frm=1, term=3, log_term=2, index=5,
                entries=[Entry(3, 6, EntryType.NORMAL, b"a"), Entry(3, 7, EntryType.CONF_CHANGE, b"b")],
                commit=5, snapshot=snap, reject=True, reject_hint=4, context=b"ctx")
    back = codec.decode_message(codec.encode_message(m))
    assert {s: getattr(back, s) for s in Message.__slots__ if s != "snapshot"} == \
           {s: getattr(m, s) for s in Message.__slots__ if s != "snapshot"}
    assert back.snapshot is not None and back.snapshot.data == b"data"
    assert back.snapshot.metadata.conf_state == ConfState([1, 2], [3])
    assert codec.decode_message(codec.encode_message(Message(MessageType.MsgHeartbeat))).snapshot is None
    cc = ConfChange(ConfChangeType.REMOVE_NODE, 9, b"why")
    assert codec.decode_conf_change(codec.encode_conf_change(cc)) == cc
    hs = HardState(3, 2, 1)
    assert codec.hard_state_from_pb(codec.hard_state_to_pb(hs)) == hs
    e = Entry(1, 2, EntryType.NORMAL, b"z")
    assert codec.entry_from_pb(codec.entry_to_pb(e)) == e
