"""raftgate's departures from etcd-raft, each a ``Config`` option that is on by default: with the
option off the core behaves as etcd-raft does, with it on as raftgate does."""

from __future__ import annotations

import pytest

from authstore.raft import Message
from authstore.raft.log import RaftLogError
from authstore.raft.progress import PROBE
from tests.support.raft_helpers import M, Network, log_of, new_raft


def test_departures_are_on_by_default() -> None:
    r = new_raft(1, [1, 2, 3])
    assert (r.accept_wiped_follower, r.end_lease_on_unreachable, r.repoll_pre_votes) == (True, True, True)


# --- accept_wiped_follower --------------------------------------------------------------------
def wiped_cluster(accept: bool) -> Network:
    """Three nodes that committed three entries, then node 3 restarted with an empty disk."""
    net = Network(*(new_raft(i, [1, 2, 3], accept_wiped_follower=accept) for i in (1, 2, 3)))
    net.campaign(1)
    for data in (b"a", b"b", b"c"):
        net.propose(1, data)
    assert all(p.log.committed == 4 for p in net.peers.values())
    assert net.peers[1].trk.progress[3].match == 4
    net.peers[3] = new_raft(3, [1, 2, 3], accept_wiped_follower=accept)
    return net


def test_wiped_follower_is_caught_up_when_accepted() -> None:
    net = wiped_cluster(True)
    net.tick(1)  # a heartbeat with commit 4 to a node whose log is empty: taken up to index 0
    leader, wiped = net.peers[1], net.peers[3]
    assert wiped.lead == 1 and wiped.log.committed == 0
    net.propose(1, b"d")  # the append after index 4 is rejected: the leader sends the whole log
    assert log_of(wiped) == log_of(leader) and wiped.log.committed == 5
    assert leader.trk.progress[3].match == 5


def test_wiped_follower_is_refused_as_etcd_raft_does() -> None:
    net = wiped_cluster(False)
    with pytest.raises(RaftLogError, match="beyond the last index"):
        net.tick(1)  # etcd-raft's follower panics: "tocommit(4) is out of range [lastIndex(0)]"


@pytest.mark.parametrize("accept", [True, False])
def test_leader_forgets_a_lost_match_only_when_accepting_wiped_followers(accept: bool) -> None:
    net = wiped_cluster(accept)
    leader = net.peers[1]
    leader.msgs = []
    # the wiped node rejects an append at index 4 and hints that its log ends at 0
    leader.step(Message(M.MsgAppResp, to=1, frm=3, term=1, index=4, reject=True, reject_hint=0))
    pr = leader.trk.progress[3]
    apps = [m for m in leader.msgs if m.type == M.MsgApp and m.to == 3]
    if accept:
        assert (pr.match, pr.state) == (0, PROBE)
        assert [(m.index, len(m.entries)) for m in apps] == [(0, 4)]  # the whole log again
    else:
        assert pr.match == 4 and apps == []  # a stale rejection: ignored


# --- end_lease_on_unreachable -----------------------------------------------------------------
@pytest.mark.parametrize("end_lease", [True, False])
def test_unreachable_leader_ends_its_lease_only_when_enabled(end_lease: bool) -> None:
    r = new_raft(2, [1, 2, 3], end_lease_on_unreachable=end_lease)
    r.step(Message(M.MsgHeartbeat, to=2, frm=1, term=1))
    assert r.lead == 1
    r.step(Message(M.MsgUnreachable, to=2, frm=1))  # the transport lost the leader's connection
    r.msgs = []
    r.step(Message(M.MsgPreVote, to=2, frm=3, term=2, index=0, log_term=0))
    if end_lease:
        assert [(m.type, m.to, m.reject) for m in r.msgs] == [(M.MsgPreVoteResp, 3, False)]
    else:
        assert r.msgs == []  # still inside the lease: the pre-vote is ignored, as in etcd-raft
    # either way the node still follows its leader until it campaigns
    assert r.lead == 1 and r.term == 1


@pytest.mark.parametrize("end_lease", [True, False])
def test_unreachable_leader_lets_the_follower_campaign_early_only_when_enabled(end_lease: bool) -> None:
    r = new_raft(2, [1, 2, 3], end_lease_on_unreachable=end_lease)
    r.step(Message(M.MsgHeartbeat, to=2, frm=1, term=1))
    r.step(Message(M.MsgUnreachable, to=2, frm=1))
    r.msgs = []
    # the randomized timeout is in [election, 2 * election): past the lease, only its random part is left
    for _ in range(r.randomized_election_timeout - r.election_timeout):
        r.tick()
    pre_votes = [m.to for m in r.msgs if m.type == M.MsgPreVote]
    assert pre_votes == ([1, 3] if end_lease else [])


# --- repoll_pre_votes -------------------------------------------------------------------------
@pytest.mark.parametrize("repoll", [True, False])
def test_pre_candidate_asks_again_only_when_enabled(repoll: bool) -> None:
    r = new_raft(1, [1, 2, 3], repoll_pre_votes=repoll)
    r.step(Message(M.MsgHup, to=1, frm=1))
    assert [m.to for m in r.msgs if m.type == M.MsgPreVote] == [2, 3]
    # node 2 answers (no), node 3 does not (a follower inside its leader lease ignores pre-votes)
    r.step(Message(M.MsgPreVoteResp, to=1, frm=2, term=0, reject=True))
    r.msgs = []
    r.tick()  # one heartbeat interval, well within the election timeout
    again = [(m.to, m.term) for m in r.msgs if m.type == M.MsgPreVote]
    assert again == ([(3, 1)] if repoll else [])
    assert r.term == 0  # a pre-vote never raises the term
