"""RawNode: the driver's handle on one Raft node, batching its output into ``Ready`` values.

The driver loop (the asyncio task later, the simulation in tests) is::

    rn.tick()                 # every tick interval
    rn.step(message)          # every message received from a peer
    rn.propose(data) / rn.read_index(ctx) / ...
    rd = rn.ready()           # None when there is nothing to do
    if rd:
        1. persist rd.snapshot (if any), then rd.hard_state (if any), then rd.entries: one fsync
           when rd.must_sync;
        2. send rd.messages (only now: they may promise what step 1 made durable);
        3. restore rd.snapshot into the application (if any), then apply rd.committed_entries in
           order, calling rn.apply_conf_change(cc) for each CONF_CHANGE entry;
        4. serve rd.read_states whose index the application has applied;
        5. rn.advance(rd): only now does a leader count its own entries of rd.entries toward
           commit, so a single-node cluster commits an entry in the Ready after the one carrying it.
    rd.soft_state (leader/role changes) is informational and may be looked at any time.

Another message may be stepped between ready() and advance() (the driver keeps receiving while it
fsyncs), but ready() is not called again before advance().
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .codec import encode_conf_change
from .raft import Config, ProposalDroppedError, Raft, ReadState
from .types import (
    NONE,
    ConfChange,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Snapshot,
    StateType,
    is_local_msg,
)


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state, reported when it changes: who leads and what this node is."""

    lead: int
    state: StateType


@dataclass(slots=True)
class Ready:
    #: set when it changed; persist before sending messages
    hard_state: HardState | None = None
    #: entries to append to stable storage (may overwrite a suffix); persist before sending messages
    entries: list[Entry] = field(default_factory=list)
    #: a snapshot from the leader to persist and then restore into the application
    snapshot: Snapshot | None = None
    #: committed entries to apply, in order (already durable once this Ready's writes are)
    committed_entries: list[Entry] = field(default_factory=list)
    #: messages to send after the writes above are durable
    messages: list[Message] = field(default_factory=list)
    #: confirmed read points (index, ctx) for read_index requests made on this node
    read_states: list[ReadState] = field(default_factory=list)
    soft_state: SoftState | None = None
    #: whether the writes need an fsync (a commit-index-only change does not)
    must_sync: bool = False


@dataclass(frozen=True, slots=True)
class Status:
    id: int
    term: int
    vote: int
    commit: int
    applied: int
    lead: int
    state: StateType
    conf_state: ConfState
    #: leader only: id -> (match, next, progress state name)
    progress: dict[int, tuple[int, int, str]]
    lead_transferee: int


class RawNode:
    def __init__(self, config: Config) -> None:
        self.raft = Raft(config)
        self._prev_soft = SoftState(self.raft.lead, self.raft.state)
        self._prev_hard = self.raft.hard_state()
        self._outstanding = False
        # the messages to this node taken with the outstanding Ready, stepped in advance()
        self._steps_on_advance: list[Message] = []

    # --- inputs -----------------------------------------------------------------------------
    def tick(self) -> None:
        self.raft.tick()

    def campaign(self) -> None:
        """Starts an election now (as if the election timeout elapsed)."""
        self.raft.step(Message(MessageType.MsgHup, frm=self.raft.id))

    def propose(self, data: bytes) -> None:
        """Proposes data to be appended; raises ProposalDroppedError when surely not appended.
        Success only means it was accepted for now: it is committed when it comes back applied."""
        self.raft.step(Message(MessageType.MsgProp, frm=self.raft.id, entries=[Entry(data=data)]))

    def propose_conf_change(self, cc: ConfChange) -> None:
        """Proposes a membership change; it takes effect when its entry is applied. A second change
        proposed while one is pending is replaced by an empty entry (it never takes effect)."""
        e = Entry(type=EntryType.CONF_CHANGE, data=encode_conf_change(cc))
        self.raft.step(Message(MessageType.MsgProp, frm=self.raft.id, entries=[e]))

    def step(self, m: Message) -> None:
        """Steps a message received from a peer. Local message types are refused."""
        if is_local_msg(m.type):
            raise ValueError(f"raft: cannot step local message {MessageType(m.type).name}")
        try:  # noqa: SIM105 (hot path: contextlib.suppress costs a context manager per message)
            self.raft.step(m)
        except ProposalDroppedError:
            pass  # a proposal forwarded by a peer: its client times out and retries

    def read_index(self, ctx: bytes) -> None:
        """Requests a linearizable read point; answered as a ReadState carrying ctx (unique,
        non-empty) in some later Ready, or never (leader change): the caller times out."""
        if not ctx:
            raise ValueError("raft: read_index needs a non-empty context")
        self.raft.step(Message(MessageType.MsgReadIndex, context=ctx))

    def transfer_leader(self, transferee: int) -> None:
        self.raft.step(Message(MessageType.MsgTransferLeader, frm=transferee))

    def report_unreachable(self, id: int) -> None:
        """The transport failed to send to id: the leader stops streaming to it optimistically."""
        self.raft.step(Message(MessageType.MsgUnreachable, frm=id))

    def report_snapshot(self, id: int, failed: bool) -> None:
        """Outcome of sending a MsgSnap to id (the transport streams snapshots out of band)."""
        self.raft.step(Message(MessageType.MsgSnapStatus, frm=id, reject=failed))

    def apply_conf_change(self, cc: ConfChange) -> ConfState:
        return self.raft.apply_conf_change(cc)

    # --- outputs ----------------------------------------------------------------------------
    def has_ready(self) -> bool:
        r = self.raft
        log = r.log
        if self._outstanding:
            return False
        if r.msgs or r.msgs_after_append or log.unstable or log.pending_snapshot is not None or r.read_states:
            return True
        if r.lead != self._prev_soft.lead or r.state != self._prev_soft.state:
            return True
        ph = self._prev_hard
        if r.term != ph.term or r.vote != ph.vote or log.committed != ph.commit:
            return True
        return log.has_next_committed_ents()

    def ready(self) -> Ready | None:
        """What the driver must do next (see the module docstring), or None if nothing."""
        if self._outstanding:
            raise RuntimeError("raft: ready() called again before advance()")
        if not self.has_ready():
            return None
        r = self.raft
        log = r.log
        rd = Ready()
        if r.lead != self._prev_soft.lead or r.state != self._prev_soft.state:
            rd.soft_state = self._prev_soft = SoftState(r.lead, r.state)
        ph = self._prev_hard
        if r.term != ph.term or r.vote != ph.vote or log.committed != ph.commit:
            rd.hard_state = self._prev_hard = HardState(r.term, r.vote, log.committed)
            rd.must_sync = r.term != ph.term or r.vote != ph.vote
        if log.unstable:
            rd.entries = list(log.unstable)
            rd.must_sync = True
        if log.pending_snapshot is not None:
            rd.snapshot = log.pending_snapshot
            rd.must_sync = True
        rd.committed_entries = log.next_committed_ents()
        if r.msgs:
            rd.messages = r.msgs
            r.msgs = []
        if r.read_states:
            rd.read_states = r.read_states
            r.read_states = []
        # acknowledgements of entries that are all in log.unstable, hence in rd.entries or earlier
        self._steps_on_advance, r.msgs_after_append = r.msgs_after_append, []
        self._outstanding = True
        return rd

    def advance(self, rd: Ready) -> None:
        """The driver finished with rd: its writes are durable and its committed entries applied."""
        log = self.raft.log
        if rd.snapshot is not None:
            log.stable_snap_to(rd.snapshot.metadata.index)
            if rd.snapshot.metadata.index > log.applied:
                log.applied = rd.snapshot.metadata.index
        if rd.entries:
            last = rd.entries[-1]
            log.stable_to(last.index, last.term)
        if rd.committed_entries:
            log.applied_to(rd.committed_entries[-1].index)
        self._outstanding = False
        steps, self._steps_on_advance = self._steps_on_advance, []
        for m in steps:
            self.raft.step(m)

    def status(self) -> Status:
        r = self.raft
        progress: dict[int, tuple[int, int, str]] = {}
        if r.state == StateType.LEADER:
            progress = {id: (pr.match, pr.next, pr.state.name) for id, pr in r.trk.progress.items()}
        return Status(r.id, r.term, r.vote, r.log.committed, r.log.applied, r.lead, r.state, r.trk.conf_state(),
                      progress, r.lead_transferee)


__all__ = ["NONE", "Config", "Ready", "RawNode", "ReadState", "SoftState", "Status"]
