"""The Raft state machine of one node: a value stepped by messages and ticks, never doing I/O.

Everything a node decides comes out as data: messages in ``msgs``, entries in the log's unstable
tail, read states in ``read_states``. ``RawNode`` packages them into ``Ready`` for the driver.
Time is only ``tick()``; randomness (the election timeout) only comes from the seeded
``random.Random`` in ``Config``, so a run is a pure function of its inputs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .log import RaftLog
from .progress import PROBE, REPLICATE, SNAPSHOT, Progress, ProgressTracker
from .readonly import ReadOnly
from .storage import CompactedError, SnapshotTemporarilyUnavailableError, Storage
from .types import (
    NONE,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Snapshot,
    StateType,
)

MsgHup = MessageType.MsgHup
MsgBeat = MessageType.MsgBeat
MsgProp = MessageType.MsgProp
MsgApp = MessageType.MsgApp
MsgAppResp = MessageType.MsgAppResp
MsgVote = MessageType.MsgVote
MsgVoteResp = MessageType.MsgVoteResp
MsgSnap = MessageType.MsgSnap
MsgHeartbeat = MessageType.MsgHeartbeat
MsgHeartbeatResp = MessageType.MsgHeartbeatResp
MsgUnreachable = MessageType.MsgUnreachable
MsgSnapStatus = MessageType.MsgSnapStatus
MsgCheckQuorum = MessageType.MsgCheckQuorum
MsgTransferLeader = MessageType.MsgTransferLeader
MsgTimeoutNow = MessageType.MsgTimeoutNow
MsgReadIndex = MessageType.MsgReadIndex
MsgReadIndexResp = MessageType.MsgReadIndexResp
MsgPreVote = MessageType.MsgPreVote
MsgPreVoteResp = MessageType.MsgPreVoteResp

FOLLOWER = StateType.FOLLOWER
CANDIDATE = StateType.CANDIDATE
LEADER = StateType.LEADER
PRE_CANDIDATE = StateType.PRE_CANDIDATE

CAMPAIGN_PRE_ELECTION = b"CampaignPreElection"
CAMPAIGN_ELECTION = b"CampaignElection"
#: carried in MsgVote's context: a leadership transfer, which may disturb a live leader's lease
CAMPAIGN_TRANSFER = b"CampaignTransfer"

_NO_LIMIT = 1 << 62


class ProposalDroppedError(Exception):
    """The proposal was not appended (no leader, leadership transfer, or removed from the cluster).
    The caller may retry; nothing of it will be committed."""


@dataclass
class Config:
    id: int
    storage: Storage
    election_tick: int = 10
    heartbeat_tick: int = 1
    #: the last index the application has applied (0 or the snapshot index after a restart:
    #: conf changes above the snapshot must be re-applied, see RawNode.apply_conf_change)
    applied: int = 0
    max_size_per_msg: int = 1 << 20
    max_inflight_msgs: int = 256
    #: upper bound on the bytes of committed entries in one Ready (at least one entry is returned)
    max_committed_size_per_ready: int = _NO_LIMIT
    check_quorum: bool = True
    pre_vote: bool = True
    #: Catch up a follower that lost entries it had acknowledged (its disk was wiped or replaced)
    #: under its old identity: the leader forgets the lost match and sends the log (or a snapshot)
    #: again, and the follower takes a heartbeat's commit index only up to its own last index.
    #: etcd-raft calls this corruption: the leader ignores the rejection as stale and the follower
    #: panics ("tocommit(N) is out of range [lastIndex(M)]. Was the raft log corrupted, truncated,
    #: or lost?"); the remedy there is removing the member and adding it back. raftgate departs so
    #: a replaced disk needs no membership change; it is safe only while the other nodes hold a
    #: quorum, since the wiped node's earlier acknowledgements are forgotten.
    accept_wiped_follower: bool = True
    #: A follower told by its transport that the leader is unreachable (the connection broke, most
    #: often because the leader's process died) stops honouring the leader's lease at once: it
    #: grants (pre-)votes and campaigns within a randomized part of an election timeout. etcd-raft's
    #: followers ignore MsgUnreachable (only a leader uses it, to probe the peer) and wait out a
    #: whole election timeout of silence first. raftgate departs for a faster failover; a false
    #: alarm on one follower is harmless: its pre-vote finds no majority while the others still
    #: hear the leader.
    end_lease_on_unreachable: bool = True
    #: A pre-candidate asks again, every heartbeat, the voters that have not answered its pre-vote.
    #: A follower inside its leader lease ignores a pre-vote, and would grant it once the lease
    #: ends; etcd-raft polls once per election and waits a whole randomized election timeout before
    #: asking again. Pre-votes change no term, so asking again is harmless; raftgate departs so a
    #: failover takes about one election timeout instead of up to three.
    repoll_pre_votes: bool = True
    rng: random.Random = field(default_factory=random.Random)

    def validate(self) -> None:
        if self.id == NONE:
            raise ValueError("raft: id must not be 0")
        if self.heartbeat_tick <= 0:
            raise ValueError("raft: heartbeat_tick must be > 0")
        if self.election_tick <= self.heartbeat_tick:
            raise ValueError("raft: election_tick must be greater than heartbeat_tick")
        if self.max_inflight_msgs <= 0:
            raise ValueError("raft: max_inflight_msgs must be > 0")


class ReadState:
    """A confirmed read point: once applied >= index, reading local state answers request ctx."""

    __slots__ = ("index", "ctx")

    def __init__(self, index: int, ctx: bytes) -> None:
        self.index = index
        self.ctx = ctx

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReadState) and (self.index, self.ctx) == (other.index, other.ctx)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ReadState({self.index}, {self.ctx!r})"


class Raft:
    def __init__(self, c: Config) -> None:
        c.validate()
        self.id = c.id
        self.rng = c.rng
        self.log = RaftLog(c.storage, c.max_committed_size_per_ready)
        self.trk = ProgressTracker(c.max_inflight_msgs)
        self.max_msg_size = c.max_size_per_msg
        self.election_timeout = c.election_tick
        self.heartbeat_timeout = c.heartbeat_tick
        self.check_quorum = c.check_quorum
        self.pre_vote = c.pre_vote
        self.accept_wiped_follower = c.accept_wiped_follower
        self.end_lease_on_unreachable = c.end_lease_on_unreachable
        self.repoll_pre_votes = c.repoll_pre_votes
        self.term = 0
        self.vote = NONE
        self.lead = NONE
        self.state = FOLLOWER
        self.msgs: list[Message] = []
        # Messages to this node itself, to be stepped only once the entries appended so far are
        # durable (RawNode steps them in advance()): the leader's acknowledgement of its own entries.
        self.msgs_after_append: list[Message] = []
        self.read_states: list[ReadState] = []
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_timeout = c.election_tick
        self.lead_transferee = NONE
        # the index of the last conf change proposed; a new one waits until it is applied
        self.pending_conf_index = 0
        self.read_only = ReadOnly()
        self.pending_read_index_msgs: list[Message] = []
        self._step = self._step_follower
        self._tick = self._tick_election

        hs, cs = c.storage.initial_state()
        last = self.log.last_index()
        for v in cs.voters:
            self.trk.add_voter(v, last + 1)
        for v in cs.learners:
            self.trk.add_learner(v, last + 1)
        if not hs.is_empty():
            if hs.commit > last:
                raise ValueError(f"raft: hard state commit {hs.commit} is beyond the last index {last}")
            # (a snapshot is committed by definition, even if the hard state was written before it)
            self.log.committed = max(hs.commit, self.log.committed)
            self.term = hs.term
            self.vote = hs.vote
        if c.applied > 0:
            self.log.applied_to(c.applied)
        self.become_follower(self.term, NONE)

    # --- state snapshots --------------------------------------------------------------------
    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed)

    def promotable(self) -> bool:
        """Whether this node may campaign: a voter without a snapshot waiting to be persisted."""
        return self.id in self.trk.voters and self.log.pending_snapshot is None

    # --- sending ----------------------------------------------------------------------------
    def _send(self, m: Message) -> None:
        if m.frm == NONE:
            m.frm = self.id
        t = m.type
        if t not in (MsgVote, MsgVoteResp, MsgPreVote, MsgPreVoteResp, MsgProp, MsgReadIndex):
            m.term = self.term
        self.msgs.append(m)

    def maybe_send_append(self, to: int, send_if_empty: bool) -> bool:
        """Sends the entries ``to`` is missing (or a snapshot); False if nothing was sent."""
        pr = self.trk.progress[to]
        if pr.is_paused():
            return False
        log = self.log
        prev = pr.next - 1
        try:
            prev_term = log.term(prev)
            ents = log.entries(pr.next, self.max_msg_size)
        except CompactedError:
            return self._send_snapshot(to, pr)
        if not ents and not send_if_empty:
            return False
        self.msgs.append(Message(MsgApp, to, self.id, self.term, prev_term, prev, ents, log.committed))
        if pr.state == REPLICATE:
            if ents:
                last = ents[-1].index
                pr.next = last + 1
                pr.inflights.add(last)
        else:
            pr.probe_sent = True
        return True

    def _send_snapshot(self, to: int, pr: Progress) -> bool:
        if not pr.recent_active:
            return False
        try:
            snap = self.log.snapshot()
        except SnapshotTemporarilyUnavailableError:
            return False
        if snap.metadata.index == 0:
            raise AssertionError("raft: need a non-empty snapshot to catch a follower up")
        pr.become_snapshot(snap.metadata.index)
        self.msgs.append(Message(MsgSnap, to, self.id, self.term, snapshot=snap))
        return True

    def bcast_append(self) -> None:
        me = self.id
        for id in self.trk.progress:
            if id != me:
                self.maybe_send_append(id, True)

    def bcast_heartbeat(self, ctx: bytes = b"") -> None:
        me = self.id
        committed = self.log.committed
        term = self.term
        for id, pr in self.trk.progress.items():
            if id != me:
                self.msgs.append(Message(MsgHeartbeat, id, me, term, commit=min(pr.match, committed), context=ctx))

    # --- state transitions ------------------------------------------------------------------
    def _reset(self, term: int) -> None:
        if self.term != term:
            self.term = term
            self.vote = NONE
        self.lead = NONE
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_timeout = self.election_timeout + self.rng.randrange(self.election_timeout)
        self.lead_transferee = NONE
        trk = self.trk
        trk.votes = {}
        last = self.log.last_index()
        prs = trk.progress
        for id, pr in prs.items():
            fresh = Progress(last + 1, trk.max_inflight, pr.is_learner)
            if id == self.id:
                fresh.match = last
            prs[id] = fresh
        self.pending_conf_index = 0
        self.read_only = ReadOnly()
        self.pending_read_index_msgs = []

    def become_follower(self, term: int, lead: int) -> None:
        self._step = self._step_follower
        self._reset(term)
        self._tick = self._tick_election
        self.lead = lead
        self.state = FOLLOWER

    def become_candidate(self) -> None:
        if self.state == LEADER:
            raise AssertionError("raft: leader cannot become candidate")
        self._step = self._step_candidate
        self._reset(self.term + 1)
        self._tick = self._tick_election
        self.vote = self.id
        self.state = CANDIDATE

    def become_pre_candidate(self) -> None:
        """Polls for votes without raising the term, so a node that cannot win (a partitioned one)
        never forces the cluster into a new term when it rejoins."""
        if self.state == LEADER:
            raise AssertionError("raft: leader cannot become pre-candidate")
        self._step = self._step_candidate
        self.trk.votes = {}
        self._tick = self._tick_election
        self.lead = NONE
        self.state = PRE_CANDIDATE

    def become_leader(self) -> None:
        if self.state == FOLLOWER:
            raise AssertionError("raft: follower cannot become leader without an election")
        self._step = self._step_leader
        self._reset(self.term)
        self._tick = self._tick_heartbeat
        self.lead = self.id
        self.state = LEADER
        self.trk.progress[self.id].become_replicate()
        # An empty entry of the new term: committing it commits everything before it, and until then
        # neither a conf change (pending_conf_index) nor a read index is served.
        self._append_entries([Entry(data=b"")])
        self.pending_conf_index = self.log.last_index()

    def _append_entries(self, ents: list[Entry]) -> None:
        li = self.log.last_index()
        term = self.term
        for i, e in enumerate(ents, 1):
            e.term = term
            e.index = li + i
        li = self.log.append(ents)
        # The leader counts its own copy toward commit only once it is on its own disk: it
        # acknowledges itself with a MsgAppResp stepped after the Ready carrying these entries has
        # been persisted (as etcd-raft does). Until then only followers' acknowledgements count.
        self.msgs_after_append.append(Message(MsgAppResp, self.id, self.id, term, index=li))

    def maybe_commit(self) -> bool:
        return self.log.maybe_commit(self.trk.committed(), self.term)

    # --- ticks ------------------------------------------------------------------------------
    def tick(self) -> None:
        self._tick()

    def _tick_election(self) -> None:
        self.election_elapsed += 1
        if self.election_elapsed >= self.randomized_election_timeout and self.promotable():
            self.election_elapsed = 0
            self.step(Message(MsgHup, frm=self.id))
        elif (self.state == PRE_CANDIDATE and self.repoll_pre_votes
              and self.election_elapsed % self.heartbeat_timeout == 0):
            self._repoll()

    def _repoll(self) -> None:
        """Asks again, every heartbeat, the voters that have not answered a pre-vote.

        A follower still inside its leader lease ignores pre-votes; once the lease runs out it
        would grant one, but without a new request the pre-candidate waits a whole randomized
        election timeout. Pre-votes change no term, so asking again is harmless, and a failover
        then takes about one election timeout instead of up to three.
        """
        trk = self.trk
        last, last_term = self.log.last_index(), self.log.last_term()
        for id in sorted(trk.voters):
            if id != self.id and id not in trk.votes:
                self.msgs.append(Message(MsgPreVote, id, self.id, self.term + 1, last_term, last))

    def _tick_heartbeat(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.election_timeout:
            self.election_elapsed = 0
            if self.check_quorum:
                self.step(Message(MsgCheckQuorum, frm=self.id))
            if self.state == LEADER and self.lead_transferee != NONE:
                self.lead_transferee = NONE  # the transfer did not finish within an election timeout
        if self.state != LEADER:
            return
        if self.heartbeat_elapsed >= self.heartbeat_timeout:
            self.heartbeat_elapsed = 0
            self.step(Message(MsgBeat, frm=self.id))

    # --- elections --------------------------------------------------------------------------
    def _has_unapplied_conf_changes(self) -> bool:
        log = self.log
        if log.applied >= log.committed:
            return False
        lo = max(log.applied + 1, log.first_index())
        try:
            ents = log.slice(lo, log.committed + 1, _NO_LIMIT)
        except CompactedError:
            return True
        return any(e.type == EntryType.CONF_CHANGE for e in ents)

    def _hup(self, kind: bytes) -> None:
        if self.state == LEADER:
            return
        if not self.promotable():
            return
        # a node that has not applied a committed conf change does not know the current membership
        if self._has_unapplied_conf_changes():
            return
        self.campaign(kind)

    def campaign(self, kind: bytes) -> None:
        if kind == CAMPAIGN_PRE_ELECTION:
            self.become_pre_candidate()
            vote_type = MsgPreVote
            term = self.term + 1
        else:
            self.become_candidate()
            vote_type = MsgVote
            term = self.term
        trk = self.trk
        trk.record_vote(self.id, True)
        if trk.vote_result() == 1:
            if kind == CAMPAIGN_PRE_ELECTION:
                self.campaign(CAMPAIGN_ELECTION)
            else:
                self.become_leader()
            return
        ctx = CAMPAIGN_TRANSFER if kind == CAMPAIGN_TRANSFER else b""
        last = self.log.last_index()
        last_term = self.log.last_term()
        for id in sorted(trk.voters):
            if id != self.id:
                self.msgs.append(Message(vote_type, id, self.id, term, last_term, last, context=ctx))

    # --- stepping ---------------------------------------------------------------------------
    def step(self, m: Message) -> None:
        t = m.type
        if m.term == 0:
            pass  # a local message, or a forwarded proposal / read index
        elif m.term > self.term:
            if t in (MsgVote, MsgPreVote):
                force = m.context == CAMPAIGN_TRANSFER
                in_lease = self.check_quorum and self.lead != NONE and self.election_elapsed < self.election_timeout
                if not force and in_lease:
                    # We heard from a leader within the election timeout: ignore the disruptor (the
                    # leader lease that makes CheckQuorum's step-down safe for reads).
                    return
            if t == MsgPreVote or (t == MsgPreVoteResp and not m.reject):
                pass  # pre-votes never change terms; the candidate raises its own when it wins
            elif t in (MsgApp, MsgHeartbeat, MsgSnap):
                self.become_follower(m.term, m.frm)
            else:
                self.become_follower(m.term, NONE)
        elif m.term < self.term:
            if (self.check_quorum or self.pre_vote) and (t in (MsgHeartbeat, MsgApp)):
                # Tell a stale leader about the newer term: without this, a leader cut off and
                # rejoining could be ignored forever by nodes that never adopt its lower term.
                self._send(Message(MsgAppResp, m.frm))
            elif t == MsgPreVote:
                self.msgs.append(Message(MsgPreVoteResp, m.frm, self.id, self.term, reject=True))
            return

        if t == MsgHup:
            self._hup(CAMPAIGN_PRE_ELECTION if self.pre_vote else CAMPAIGN_ELECTION)
        elif t in (MsgVote, MsgPreVote):
            can_vote = (self.vote == m.frm or (self.vote == NONE and self.lead == NONE)
                        or (t == MsgPreVote and m.term > self.term))
            resp = MsgVoteResp if t == MsgVote else MsgPreVoteResp
            if can_vote and self.log.is_up_to_date(m.index, m.log_term):
                self.msgs.append(Message(resp, m.frm, self.id, m.term))
                if t == MsgVote:
                    self.election_elapsed = 0
                    self.vote = m.frm
            else:
                self.msgs.append(Message(resp, m.frm, self.id, self.term, reject=True))
        else:
            self._step(m)

    def _step_leader(self, m: Message) -> None:
        t = m.type
        trk = self.trk
        if t == MsgBeat:
            self.bcast_heartbeat(self.read_only.last_pending())
            return
        if t == MsgCheckQuorum:
            me = trk.progress.get(self.id)
            if me is not None:
                me.recent_active = True
            if not trk.quorum_active():
                self.become_follower(self.term, NONE)
            for id, pr in trk.progress.items():
                if id != self.id:
                    pr.recent_active = False
            return
        if t == MsgProp:
            if not m.entries:
                raise ValueError("raft: stepped empty MsgProp")
            if self.id not in trk.progress:
                raise ProposalDroppedError("removed from the cluster")
            if self.lead_transferee != NONE:
                raise ProposalDroppedError("leadership transfer in progress")
            # fresh entries: the message may be shared (a duplicate in flight, the caller's)
            ents = []
            for i, e in enumerate(m.entries):
                if e.type == EntryType.CONF_CHANGE:
                    if self.pending_conf_index > self.log.applied:
                        # one membership change at a time: keep the slot (and the order of the
                        # batch) but make it a no-op
                        ents.append(Entry(data=b""))
                        continue
                    self.pending_conf_index = self.log.last_index() + i + 1
                ents.append(Entry(0, 0, e.type, e.data))
            self._append_entries(ents)
            self.bcast_append()
            return
        if t == MsgReadIndex:
            if trk.is_single_voter(self.id):
                self._respond_read(m, self.log.committed)
            elif self.log.term_or_zero(self.log.committed) != self.term:
                # not yet known which entries are committed: wait for this term's first commit
                self.pending_read_index_msgs.append(m)
            else:
                self._send_read_index(m)
            return

        pr = trk.progress.get(m.frm)
        if pr is None:
            return
        if t == MsgAppResp:
            pr.recent_active = True
            if m.reject:
                if m.reject_hint < pr.match and self.accept_wiped_follower:
                    # The follower no longer has entries it acknowledged: its disk was wiped or
                    # replaced. Forget what it had and catch it up again (by snapshot if the log
                    # was compacted); etcd-raft ignores the rejection as stale instead.
                    pr.match = m.reject_hint
                    pr.next = m.reject_hint + 1
                    pr.become_probe()
                    self.maybe_send_append(m.frm, True)
                    return
                next_probe = m.reject_hint
                if m.log_term > 0:
                    next_probe = self.log.find_conflict_by_term(m.reject_hint, m.log_term)[0]
                if pr.maybe_decr_to(m.index, next_probe):
                    if pr.state == REPLICATE:
                        pr.become_probe()
                    self.maybe_send_append(m.frm, True)
                return
            old_paused = pr.is_paused()
            if not pr.maybe_update(m.index):
                return
            if pr.state == PROBE:
                probing = pr.next
                pr.become_replicate()
                # An ack older than the probe (the follower sent it before it took a snapshot
                # that travelled on its own connection) must not move the next append back to
                # where the log may no longer reach: that would send the same snapshot again.
                # etcd-raft moves it back; the probe's own answer settles where it goes on.
                pr.next = max(pr.next, probing)
            elif pr.state == SNAPSHOT:
                if pr.match + 1 >= self.log.first_index():
                    pr.become_probe()
                    pr.become_replicate()
            else:
                pr.inflights.free_le(m.index)
            if self.maybe_commit():
                self._release_pending_read_index()
                self.bcast_append()
            elif m.frm == self.id:
                return  # the leader's acknowledgement of its own entries: nothing to send itself
            elif old_paused:
                self.maybe_send_append(m.frm, True)
            while m.frm != self.id and self.maybe_send_append(m.frm, False):
                pass
            if m.frm == self.lead_transferee and pr.match == self.log.last_index():
                self.msgs.append(Message(MsgTimeoutNow, m.frm, self.id, self.term))
        elif t == MsgHeartbeatResp:
            pr.recent_active = True
            pr.probe_sent = False
            if pr.state == REPLICATE and pr.inflights.full():
                pr.inflights.q.popleft()  # let one MsgApp through, in case the window was lost
            if pr.match < self.log.last_index():
                self.maybe_send_append(m.frm, True)
            if not m.context:
                return
            acks = self.read_only.recv_ack(m.frm, m.context)
            if acks is None or len(acks & trk.voters) < trk.quorum():
                return
            for rs in self.read_only.advance(m.context):
                self._respond_read(rs.req, rs.index)
        elif t == MsgSnapStatus:
            if pr.state != SNAPSHOT:
                return
            if m.reject:
                pr.pending_snapshot = 0
                pr.become_probe()
            else:
                pr.become_probe()
                pr.probe_sent = True  # wait for the follower's MsgAppResp before probing further
        elif t == MsgUnreachable:
            if pr.state == REPLICATE:
                pr.become_probe()
        elif t == MsgTransferLeader:
            if pr.is_learner:
                return
            transferee = m.frm
            if transferee == self.lead_transferee or transferee == self.id:
                return
            self.lead_transferee = transferee
            self.election_elapsed = 0  # the transfer must finish within one election timeout
            if pr.match == self.log.last_index():
                self.msgs.append(Message(MsgTimeoutNow, transferee, self.id, self.term))
            else:
                self.maybe_send_append(transferee, True)

    def _step_candidate(self, m: Message) -> None:
        """Shared by CANDIDATE and PRE_CANDIDATE."""
        t = m.type
        if t == MsgProp:
            raise ProposalDroppedError("no leader")
        if t == MsgApp:
            self.become_follower(m.term, m.frm)
            self._handle_append(m)
        elif t == MsgHeartbeat:
            self.become_follower(m.term, m.frm)
            self._handle_heartbeat(m)
        elif t == MsgSnap:
            self.become_follower(m.term, m.frm)
            self._handle_snapshot(m)
        elif (t == MsgPreVoteResp and self.state == PRE_CANDIDATE) or (t == MsgVoteResp and self.state == CANDIDATE):
            self.trk.record_vote(m.frm, not m.reject)
            res = self.trk.vote_result()
            if res == 1:
                if self.state == PRE_CANDIDATE:
                    self.campaign(CAMPAIGN_ELECTION)
                else:
                    self.become_leader()
                    self.bcast_append()
            elif res == -1:
                self.become_follower(self.term, NONE)

    def _step_follower(self, m: Message) -> None:
        t = m.type
        if t == MsgApp:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_append(m)
        elif t == MsgHeartbeat:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_heartbeat(m)
        elif t == MsgSnap:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_snapshot(m)
        elif t == MsgProp:
            if self.lead == NONE:
                raise ProposalDroppedError("no leader")
            self._forward(m)
        elif t in (MsgTransferLeader, MsgReadIndex):
            if self.lead == NONE:
                return
            self._forward(m)
        elif t == MsgTimeoutNow:
            self._hup(CAMPAIGN_TRANSFER)
        elif t == MsgReadIndexResp:
            self.read_states.append(ReadState(m.index, m.context))
        elif t == MsgUnreachable and m.frm == self.lead and self.lead != NONE and self.end_lease_on_unreachable:
            # The transport lost the connection to the leader (most often: its process is gone).
            # Stop honouring its lease at once: this node now grants (pre-)votes, and campaigns
            # itself within a randomized part of an election timeout instead of a whole one. A
            # false alarm on one follower is harmless: its pre-vote finds no majority while the
            # others still hear the leader.
            self.election_elapsed = max(self.election_elapsed, self.election_timeout)

    def _forward(self, m: Message) -> None:
        """Sends a copy to the leader (never mutate a received message: it may be shared)."""
        self.msgs.append(Message(m.type, self.lead, m.frm or self.id, entries=m.entries, context=m.context))

    # --- follower handlers ------------------------------------------------------------------
    def _handle_append(self, m: Message) -> None:
        log = self.log
        if m.index < log.committed:
            self.msgs.append(Message(MsgAppResp, m.frm, self.id, self.term, index=log.committed))
            return
        last_new = log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if last_new is not None:
            self.msgs.append(Message(MsgAppResp, m.frm, self.id, self.term, index=last_new))
            return
        # Fast backtracking: point the leader at the last index where our log could agree with its
        # (the highest index <= m.index whose term is <= the leader's term there).
        hint_index, hint_term = log.find_conflict_by_term(min(m.index, log.last_index()), m.log_term)
        self.msgs.append(Message(MsgAppResp, m.frm, self.id, self.term, log_term=hint_term, index=m.index,
                                 reject=True, reject_hint=hint_index))

    def _handle_heartbeat(self, m: Message) -> None:
        # A leader may still think this node holds entries it lost with a wiped disk; without
        # accept_wiped_follower, commit_to refuses a commit index beyond the log (as etcd panics).
        commit = min(m.commit, self.log.last_index()) if self.accept_wiped_follower else m.commit
        self.log.commit_to(commit)
        self.msgs.append(Message(MsgHeartbeatResp, m.frm, self.id, self.term, context=m.context))

    def _handle_snapshot(self, m: Message) -> None:
        snap = m.snapshot
        if snap is not None and self.restore(snap):
            self.msgs.append(Message(MsgAppResp, m.frm, self.id, self.term, index=self.log.last_index()))
        else:
            self.msgs.append(Message(MsgAppResp, m.frm, self.id, self.term, index=self.log.committed))

    def restore(self, snap: Snapshot) -> bool:
        """Installs a leader's snapshot unless our log already covers it."""
        md = snap.metadata
        if md.index <= self.log.committed:
            return False
        if self.log.match_term(md.index, md.term):
            # we have the entry: the snapshot only tells us it is committed
            self.log.commit_to(md.index)
            return False
        self.log.restore(snap)
        self._set_conf(md.conf_state)
        return True

    def _set_conf(self, cs: ConfState) -> None:
        trk = self.trk
        nxt = self.log.last_index() + 1
        trk.voters = set()
        trk.learners = set()
        trk.progress = {}
        for v in cs.voters:
            trk.add_voter(v, nxt)
        for v in cs.learners:
            trk.add_learner(v, nxt)
        me = trk.progress.get(self.id)
        if me is not None:
            me.match = nxt - 1

    # --- reads ------------------------------------------------------------------------------
    def _send_read_index(self, m: Message) -> None:
        self.read_only.add_request(self.log.committed, m)
        self.read_only.recv_ack(self.id, m.context)
        self.bcast_heartbeat(m.context)

    def _release_pending_read_index(self) -> None:
        if not self.pending_read_index_msgs:
            return
        pending, self.pending_read_index_msgs = self.pending_read_index_msgs, []
        for m in pending:
            if self.trk.is_single_voter(self.id):
                self._respond_read(m, self.log.committed)
            else:
                self._send_read_index(m)

    def _respond_read(self, req: Message, index: int) -> None:
        if req.frm == NONE or req.frm == self.id:
            self.read_states.append(ReadState(index, req.context))
        else:
            self.msgs.append(Message(MsgReadIndexResp, req.frm, self.id, self.term, index=index,
                                     context=req.context))

    # --- membership -------------------------------------------------------------------------
    def apply_conf_change(self, cc: ConfChange) -> ConfState:
        """Makes a committed conf change take effect (called when its entry is applied)."""
        trk = self.trk
        nid = cc.node_id
        nxt = self.log.last_index() + 1
        if cc.type == ConfChangeType.ADD_NODE:
            trk.add_voter(nid, nxt)
        elif cc.type == ConfChangeType.ADD_LEARNER_NODE:
            if trk.voters != {nid}:
                trk.add_learner(nid, nxt)
        elif cc.type == ConfChangeType.REMOVE_NODE:
            if trk.voters != {nid}:  # never remove the last voter: nobody could commit again
                trk.remove(nid)
        else:
            raise ValueError(f"raft: unknown conf change type {cc.type}")
        if self.state == LEADER:
            if self.id not in trk.voters:
                self.become_follower(self.term, NONE)  # removed or demoted: let the others elect
            else:
                if self.lead_transferee != NONE and self.lead_transferee not in trk.voters:
                    self.lead_transferee = NONE
                if self.maybe_commit():
                    self.bcast_append()
                else:
                    for id in trk.progress:
                        if id != self.id:
                            self.maybe_send_append(id, False)
        return trk.conf_state()
