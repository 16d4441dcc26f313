"""Unit tests of the Raft state machine: elections, PreVote, CheckQuorum, replication, commit
rules, ReadIndex, leadership transfer, learners, membership changes and snapshots."""

from __future__ import annotations

import pytest

from authstore.raft import (
    CAMPAIGN_TRANSFER,
    ConfChange,
    ConfChangeType,
    Entry,
    EntryType,
    MemoryStorage,
    Message,
    ProposalDroppedError,
    Raft,
    ReadState,
    StateType,
)
from authstore.raft.codec import encode_conf_change
from authstore.raft.progress import PROBE, REPLICATE
from tests.support.raft_helpers import M, Network, log_of, new_raft, persisted, storage_with

F, C, L, PC = StateType.FOLLOWER, StateType.CANDIDATE, StateType.LEADER, StateType.PRE_CANDIDATE


def cluster(n: int = 3, **kw: object) -> Network:
    ids = list(range(1, n + 1))
    return Network(*(new_raft(i, ids, **kw) for i in ids))


def elect(net: Network, id: int = 1) -> None:
    net.campaign(id)
    assert net.peers[id].state == L


# --- elections ------------------------------------------------------------------------------
@pytest.mark.parametrize("pre_vote", [False, True])
def test_leader_election(pre_vote: bool) -> None:
    net = cluster(3, pre_vote=pre_vote)
    elect(net, 1)
    assert [p.state for p in net.peers.values()] == [L, F, F]
    assert all(p.lead == 1 and p.term == 1 for p in net.peers.values())
    # the new leader's empty entry commits everywhere
    assert all(p.log.committed == 1 for p in net.peers.values())


def test_election_needs_a_quorum() -> None:
    net = cluster(5, pre_vote=False)
    net.isolate(1)
    net.isolate(2)
    net.isolate(3)
    net.campaign(1)
    assert net.peers[1].state == C  # only itself


def test_vote_goes_to_most_up_to_date_log_only() -> None:
    # nodes 1 and 3 have an entry of term 2 that 2 lacks: 2 cannot win, 1 can
    net = Network(new_raft(1, [1, 2, 3], storage=storage_with([1, 2, 3], [1, 2]), pre_vote=False),
                  new_raft(2, [1, 2, 3], storage=storage_with([1, 2, 3], [1]), pre_vote=False),
                  new_raft(3, [1, 2, 3], storage=storage_with([1, 2, 3], [1, 2]), pre_vote=False))
    net.campaign(2)
    assert net.peers[2].state != L
    net.campaign(1)
    assert net.peers[1].state == L


def test_one_vote_per_term() -> None:
    r = new_raft(1, [1, 2, 3], pre_vote=False)
    r.step(Message(M.MsgVote, to=1, frm=2, term=5, index=0, log_term=0))
    r.step(Message(M.MsgVote, to=1, frm=3, term=5, index=0, log_term=0))
    resps = [(m.to, m.reject) for m in r.msgs if m.type == M.MsgVoteResp]
    assert resps == [(2, False), (3, True)]
    assert r.vote == 2


def test_randomized_election_timeout_is_seeded() -> None:
    a = new_raft(1, [1, 2, 3])
    b = new_raft(1, [1, 2, 3])
    seq_a, seq_b = [], []
    for _ in range(20):
        a.become_follower(a.term + 1, 0)
        b.become_follower(b.term + 1, 0)
        seq_a.append(a.randomized_election_timeout)
        seq_b.append(b.randomized_election_timeout)
    assert seq_a == seq_b
    assert all(10 <= t < 20 for t in seq_a) and len(set(seq_a)) > 1


def test_follower_campaigns_after_election_timeout() -> None:
    net = cluster(3, pre_vote=False)
    r = net.peers[1]
    net.tick(1, r.randomized_election_timeout)
    assert r.state == L


# --- PreVote and CheckQuorum --------------------------------------------------------------------
def test_prevote_partitioned_node_does_not_raise_term() -> None:
    net = cluster(3, pre_vote=True)
    elect(net, 1)
    net.isolate(3)
    net.tick(3, 100)
    assert net.peers[3].term == 1 and net.peers[3].state == PC
    net.heal()
    net.send(Message(M.MsgHup, to=3, frm=3))
    # the rejoining node did not disturb the leader
    assert net.peers[1].state == L and net.peers[1].term == 1


def test_without_prevote_partitioned_node_disrupts_on_rejoin() -> None:
    net = cluster(3, pre_vote=False, check_quorum=False)
    elect(net, 1)
    net.isolate(3)
    net.tick(3, 100)
    assert net.peers[3].term > 1
    net.heal()
    net.send(Message(M.MsgHup, to=3, frm=3))  # its next campaign carries the higher term
    assert net.peers[1].state != L and net.peers[1].term > 1


def test_check_quorum_leader_steps_down_when_isolated() -> None:
    net = cluster(3, check_quorum=True)
    elect(net, 1)
    net.isolate(1)
    net.tick(1, 10)  # one election timeout: followers did answer once, so still leader
    net.tick(1, 10)
    assert net.peers[1].state == F


def test_check_quorum_leader_keeps_leading_with_quorum() -> None:
    net = cluster(3, check_quorum=True)
    elect(net, 1)
    net.isolate(3)
    net.tick(1, 50)
    assert net.peers[1].state == L


def test_leader_lease_followers_ignore_disruptive_votes() -> None:
    net = cluster(3, check_quorum=True, pre_vote=False)
    elect(net, 1)
    # node 3 forced to campaign at a higher term: 2 heard from the leader recently and ignores it
    net.send(Message(M.MsgHup, to=3, frm=3))
    assert net.peers[2].term == 1 and net.peers[2].lead == 1
    assert net.peers[1].state == L


def test_losing_the_leaders_connection_ends_its_lease() -> None:
    """Followers that lose the leader's connection elect a new leader within one election
    timeout: they stop ignoring (pre-)votes at once instead of after their lease."""
    net = cluster(3, check_quorum=True, pre_vote=True)
    elect(net, 1)
    net.isolate(1)
    for follower in (2, 3):  # what each node's transport reports (a local message)
        net.peers[follower].step(Message(M.MsgUnreachable, frm=1))
    ticks = 0
    while not any(net.peers[i].state == L for i in (2, 3)):
        net.tick(2)
        net.tick(3)
        ticks += 1
        assert ticks <= 10, "no leader within one election timeout"


def test_one_false_alarm_does_not_disturb_a_leader() -> None:
    net = cluster(3, check_quorum=True, pre_vote=True)
    elect(net, 1)
    net.peers[3].step(Message(M.MsgUnreachable, frm=1))  # only 3 thinks the leader is gone
    for _ in range(30):
        net.tick(1)
        net.tick(2)
        net.tick(3)
    assert net.peers[1].state == L and net.peers[1].term == net.peers[2].term == net.peers[3].term


def test_stale_leader_learns_new_term_from_response() -> None:
    net = cluster(3, check_quorum=True)
    elect(net, 1)
    net.isolate(1)
    for _ in range(30):
        net.tick(2)
        net.tick(3)
    assert any(p.state == L and p.id != 1 for p in net.peers.values())
    net.heal()
    net.tick(1)  # heartbeat at the old term → answered with the new term
    assert net.peers[1].state == F


# --- replication ----------------------------------------------------------------------------
def test_replication_and_commit() -> None:
    net = cluster(3)
    elect(net, 1)
    for i in range(5):
        net.propose(1, b"d%d" % i)
    logs = [log_of(p) for p in net.peers.values()]
    assert logs[0] == logs[1] == logs[2]
    assert all(p.log.committed == 6 for p in net.peers.values())


def test_proposal_forwarded_by_follower() -> None:
    net = cluster(3)
    elect(net, 1)
    net.propose(2, b"from2")
    assert log_of(net.peers[1])[-1][2] == b"from2"
    assert net.peers[1].log.committed == 2


def test_proposal_without_leader_is_dropped() -> None:
    r = new_raft(1, [1, 2, 3])
    with pytest.raises(ProposalDroppedError):
        r.step(Message(M.MsgProp, to=1, frm=1, entries=[Entry(data=b"x")]))


def test_follower_with_divergent_log_is_repaired_fast() -> None:
    # follower 2 has a long suffix from term 2 that the leader (term 3 entries) overwrites
    st1 = storage_with([1, 2, 3], [1, 1, 1, 3, 3, 3])
    st2 = storage_with([1, 2, 3], [1, 1, 1] + [2] * 50)
    a = new_raft(1, [1, 2, 3], storage=st1, pre_vote=False)
    b = new_raft(2, [1, 2, 3], storage=st2, pre_vote=False)
    c = new_raft(3, [1, 2, 3], storage=storage_with([1, 2, 3], [1, 1, 1, 3, 3, 3]), pre_vote=False)
    for r in (a, b, c):
        r.term = 3
    net = Network(a, b, c)
    net.cut = {(1, 2), (2, 1)}
    net.campaign(1)
    assert a.state == L
    net.heal()
    net.tick(1)  # the heartbeat response unpauses the probe
    rejects = [m for m in net.sent if m.type == M.MsgAppResp and m.frm == 2 and m.reject]
    assert log_of(b) == log_of(a)
    assert len(rejects) <= 2  # one round trip per term, not one per entry


def test_commit_only_current_term_entries_by_counting() -> None:
    # Figure 8: an entry of an earlier term on a majority is not committed by counting replicas
    st = storage_with([1, 2, 3], [1, 2])
    r = new_raft(1, [1, 2, 3], storage=st, pre_vote=False)
    r.term = 2
    r.become_candidate()
    r.become_leader()  # term 3, appends 3@3
    persisted(r)
    r.msgs = []
    assert r.log.last_index() == 3
    r.step(Message(M.MsgAppResp, to=1, frm=2, term=3, index=2))
    assert r.log.committed == 0
    r.step(Message(M.MsgAppResp, to=1, frm=2, term=3, index=3))
    assert r.log.committed == 3


def test_flow_control_limits_inflight_messages() -> None:
    r = new_raft(1, [1, 2], max_inflight_msgs=2, pre_vote=False)
    r.become_candidate()
    r.become_leader()
    r.step(Message(M.MsgAppResp, to=1, frm=2, term=1, index=1))
    assert r.trk.progress[2].state == REPLICATE
    r.msgs = []
    for i in range(10):
        r.step(Message(M.MsgProp, to=1, frm=1, entries=[Entry(data=b"%d" % i)]))
    apps = [m for m in r.msgs if m.type == M.MsgApp]
    assert len(apps) == 2
    # an ack frees the window
    r.msgs = []
    r.step(Message(M.MsgAppResp, to=1, frm=2, term=1, index=apps[0].entries[-1].index))
    assert [m.type for m in r.msgs].count(M.MsgApp) >= 1


def test_max_size_per_msg_splits_entries() -> None:
    r = new_raft(1, [1, 2], max_size_per_msg=100, pre_vote=False)
    r.become_candidate()
    r.become_leader()
    for i in range(10):
        r.step(Message(M.MsgProp, to=1, frm=1, entries=[Entry(data=b"x" * 40 + b"%d" % i)]))
    r.msgs = []
    r.trk.progress[2].probe_sent = False
    r.maybe_send_append(2, True)
    (app,) = r.msgs
    assert 1 <= len(app.entries) <= 2


def test_probe_rejection_then_replicate() -> None:
    net = cluster(3)
    elect(net, 1)
    pr = net.peers[1].trk.progress[2]
    assert pr.state == REPLICATE
    net.drop_types.add(M.MsgApp)
    net.propose(1)
    net.drop_types.clear()
    net.propose(1)  # arrives with a gap: rejected, leader probes back and repairs
    assert log_of(net.peers[2]) == log_of(net.peers[1])
    assert pr.state == REPLICATE


def test_leader_unreachable_report_moves_to_probe() -> None:
    net = cluster(3)
    elect(net, 1)
    net.peers[1].step(Message(M.MsgUnreachable, to=1, frm=2))
    assert net.peers[1].trk.progress[2].state == PROBE


# --- ReadIndex ------------------------------------------------------------------------------
def test_read_index_on_leader_needs_heartbeat_quorum() -> None:
    net = cluster(3)
    elect(net, 1)
    net.propose(1)
    net.send(Message(M.MsgReadIndex, to=1, context=b"ctx1"))
    assert net.peers[1].read_states == [ReadState(2, b"ctx1")]


def test_read_index_isolated_leader_serves_nothing() -> None:
    net = cluster(3)
    elect(net, 1)
    net.isolate(1)
    net.send(Message(M.MsgReadIndex, to=1, context=b"ctx1"))
    assert net.peers[1].read_states == []


def test_read_index_forwarded_by_follower() -> None:
    net = cluster(3)
    elect(net, 1)
    net.propose(1)
    net.send(Message(M.MsgReadIndex, to=2, context=b"ctx2"))
    assert net.peers[2].read_states == [ReadState(2, b"ctx2")]
    assert net.peers[1].read_states == []


def test_read_index_waits_for_commit_in_current_term() -> None:
    net = cluster(3)
    net.drop_types.add(M.MsgApp)
    elect(net, 1)  # leader, but its empty entry is not committed
    net.send(Message(M.MsgReadIndex, to=1, context=b"early"))
    assert net.peers[1].read_states == []
    net.drop_types.clear()
    net.tick(1)  # heartbeat responses make the leader send the entries; commit releases the read
    net.tick(1)
    assert net.peers[1].read_states == [ReadState(1, b"early")]


def test_read_index_single_voter_immediate() -> None:
    net = Network(new_raft(1, [1]))
    elect(net, 1)
    net.send(Message(M.MsgReadIndex, to=1, context=b"solo"))
    assert net.peers[1].read_states == [ReadState(1, b"solo")]


# --- leadership transfer --------------------------------------------------------------------
def test_transfer_to_up_to_date_follower() -> None:
    net = cluster(3)
    elect(net, 1)
    net.send(Message(M.MsgTransferLeader, to=1, frm=2))
    assert net.peers[2].state == L and net.peers[1].state == F
    assert net.peers[2].term == 2


def test_transfer_to_lagging_follower_catches_it_up_first() -> None:
    net = cluster(3)
    elect(net, 1)
    net.isolate(3)
    net.propose(1)
    net.heal()
    net.drop_types.add(M.MsgApp)
    net.send(Message(M.MsgTransferLeader, to=1, frm=3))
    assert net.peers[1].lead_transferee == 3 and net.peers[1].state == L
    with pytest.raises(ProposalDroppedError):
        net.peers[1].step(Message(M.MsgProp, to=1, frm=1, entries=[Entry(data=b"x")]))
    net.drop_types.clear()
    net.tick(1)
    assert net.peers[3].state == L


def test_transfer_aborted_after_election_timeout() -> None:
    net = cluster(3)
    elect(net, 1)
    net.isolate(3)
    net.propose(1)
    net.peers[1].step(Message(M.MsgTransferLeader, to=1, frm=3))  # (frm is the transferee)
    assert net.peers[1].lead_transferee == 3
    net.tick(1, 10)
    assert net.peers[1].lead_transferee == 0 and net.peers[1].state == L


def test_timeout_now_bypasses_lease() -> None:
    net = cluster(3, check_quorum=True)
    elect(net, 1)
    m = Message(M.MsgVote, to=2, frm=3, term=5, index=1, log_term=1, context=CAMPAIGN_TRANSFER)
    net.peers[2].step(m)
    assert net.peers[2].term == 5


# --- learners and membership ----------------------------------------------------------------
def test_learner_replicates_but_never_votes_or_counts() -> None:
    ids = [1, 2]
    net = Network(new_raft(1, ids, learners=[3]), new_raft(2, ids, learners=[3]), new_raft(3, ids, learners=[3]))
    elect(net, 1)
    net.propose(1, b"to-learner")
    assert log_of(net.peers[3]) == log_of(net.peers[1])
    net.tick(3, 100)
    assert net.peers[3].state == F  # never campaigns
    # the learner is not part of the quorum: without voter 2 nothing commits
    net.isolate(2)
    before = net.peers[1].log.committed
    net.propose(1)
    assert net.peers[1].log.committed == before


def test_conf_change_add_remove_and_one_at_a_time() -> None:
    net = cluster(3)
    elect(net, 1)
    lead = net.peers[1]
    lead.log.applied_to(lead.log.committed)  # the leader's own empty entry is applied
    cc = Entry(type=EntryType.CONF_CHANGE, data=encode_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, 3)))
    net.send(Message(M.MsgProp, to=1, frm=1, entries=[cc]))
    first = lead.log.last_index()
    assert lead.pending_conf_index == first
    cc2 = Entry(type=EntryType.CONF_CHANGE, data=encode_conf_change(ConfChange(ConfChangeType.ADD_NODE, 4)))
    net.send(Message(M.MsgProp, to=1, frm=1, entries=[cc2]))
    last = lead.log.slice(first + 1, first + 2, 1 << 62)[0]
    assert last.type == EntryType.NORMAL and last.data == b""  # refused while one is pending
    # applying the removal: quorum is now {1, 2}
    lead.log.applied_to(lead.log.committed)
    cs = lead.apply_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, 3))
    assert cs.voters == [1, 2] and 3 not in lead.trk.progress


def test_removed_leader_steps_down() -> None:
    net = cluster(3)
    elect(net, 1)
    net.peers[1].apply_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, 1))
    assert net.peers[1].state == F


def test_promote_learner_to_voter() -> None:
    r = new_raft(1, [1, 2], learners=[3])
    cs = r.apply_conf_change(ConfChange(ConfChangeType.ADD_NODE, 3))
    assert cs.voters == [1, 2, 3] and cs.learners == []
    assert not r.trk.progress[3].is_learner


def test_no_campaign_with_unapplied_conf_change() -> None:
    st = MemoryStorage.with_conf([1, 2, 3])
    st.append([Entry(1, 1, EntryType.CONF_CHANGE, encode_conf_change(ConfChange(ConfChangeType.ADD_NODE, 4)))])
    from authstore.raft import HardState
    st.set_hard_state(HardState(1, 0, 1))
    r = new_raft(1, [1, 2, 3], storage=st, pre_vote=False)
    r.step(Message(M.MsgHup, to=1, frm=1))
    assert r.state == F
    r.log.applied_to(1)
    r.step(Message(M.MsgHup, to=1, frm=1))
    assert r.state == C


# --- snapshots ------------------------------------------------------------------------------
def _leader_past_an_isolated_follower() -> tuple[Raft, Network]:
    """Node 1 leads with node 3 cut off, and has compacted its log through index 6 (its snapshot):
    node 3 can only catch up by that snapshot."""
    from authstore.raft import ConfState

    ids = [1, 2, 3]
    st1 = MemoryStorage.with_conf(ids)
    a = new_raft(1, ids, storage=st1)
    net = Network(a, new_raft(2, ids), new_raft(3, ids))
    net.isolate(3)
    elect(net, 1)
    for i in range(5):
        net.propose(1, b"d%d" % i)
    # persist the leader's log, snapshot at the commit index and compact
    st1.append(list(a.log.unstable))
    a.log.stable_to(a.log.last_index(), a.log.last_term())
    a.log.applied_to(a.log.committed)
    st1.create_snapshot(a.log.committed, ConfState(ids), b"state@6")
    st1.compact(a.log.committed)
    return a, net


def test_snapshot_sent_to_follower_behind_first_index() -> None:
    a, net = _leader_past_an_isolated_follower()
    net.heal()
    net.tick(1)  # heartbeat → node 3 far behind → probe → rejected → snapshot
    snaps = [m for m in net.sent if m.type == M.MsgSnap]
    assert snaps and snaps[0].to == 3
    c = net.peers[3]
    assert c.log.pending_snapshot is not None and c.log.committed == 6
    assert c.log.first_index() == 7 and c.log.last_index() == 6
    a.step(Message(M.MsgSnapStatus, to=1, frm=3))
    net.tick(1)
    net.propose(1, b"after")
    assert log_of(c)[-1][2] == b"after"
    assert a.trk.progress[3].state == REPLICATE


def test_a_stale_ack_after_a_snapshot_was_taken_sends_no_second_snapshot() -> None:
    """Found by a diagnostic run of the crash tests under load: the follower's answers to appends
    sent before the snapshot can reach the leader after the snapshot (it travels on a connection
    of its own) was reported taken. Such an ack moved the probing follower to replicating from
    just past the ack, an index the log no longer holds, so the leader sent the same snapshot
    again at once: a whole store copy for nothing (and a second copy of the same index at the
    follower while it installed the first)."""
    a, _net = _leader_past_an_isolated_follower()
    pr = a.trk.progress[3]
    a.msgs.clear()
    # node 3 rejects the append it was probed with: it holds nothing, the log starts after 6
    a.step(Message(M.MsgAppResp, to=1, frm=3, term=a.term, index=pr.next - 1, reject=True, reject_hint=0))
    assert [m.snapshot.metadata.index for m in a.msgs if m.type == M.MsgSnap] == [6]
    a.step(Message(M.MsgSnapStatus, to=1, frm=3))  # the copy was taken; node 3's own ack is on its way
    a.msgs.clear()
    a.step(Message(M.MsgAppResp, to=1, frm=3, term=a.term, index=1))  # an ack it sent before the snapshot came
    assert not [m for m in a.msgs if m.type == M.MsgSnap]
    assert pr.next > 6  # the next append goes on after the snapshot


def test_snapshot_already_covered_only_advances_commit() -> None:
    r = new_raft(2, [1, 2], storage=storage_with([1, 2], [1, 1, 1]))
    from authstore.raft import Snapshot, SnapshotMetadata
    snap = Snapshot(b"x", SnapshotMetadata(index=2, term=1))
    r.step(Message(M.MsgSnap, to=2, frm=1, term=1, snapshot=snap))
    assert r.log.pending_snapshot is None and r.log.committed == 2
