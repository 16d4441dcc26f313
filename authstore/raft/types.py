"""The values the Raft core works on: entries, messages, hard state, snapshots, conf changes.

They mirror ``protos/raftpb/raft.proto`` field for field, but are plain slotted Python objects:
the core creates and reads them millions of times in the simulation, and protobuf objects cost
several times more per field access and copy repeated fields on construction. ``codec.py``
converts to and from the protobuf messages at the edges (WAL, transport).
"""

from __future__ import annotations

from enum import IntEnum


class EntryType(IntEnum):
    NORMAL = 0
    CONF_CHANGE = 1


class MessageType(IntEnum):
    """Same numbers as ``raftpb.MessageType``."""

    MsgHup = 0
    MsgBeat = 1
    MsgProp = 2
    MsgApp = 3
    MsgAppResp = 4
    MsgVote = 5
    MsgVoteResp = 6
    MsgSnap = 7
    MsgHeartbeat = 8
    MsgHeartbeatResp = 9
    MsgUnreachable = 10
    MsgSnapStatus = 11
    MsgCheckQuorum = 12
    MsgTransferLeader = 13
    MsgTimeoutNow = 14
    MsgReadIndex = 15
    MsgReadIndexResp = 16
    MsgPreVote = 17
    MsgPreVoteResp = 18


class ConfChangeType(IntEnum):
    ADD_NODE = 0
    REMOVE_NODE = 1
    ADD_LEARNER_NODE = 2


class StateType(IntEnum):
    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2
    PRE_CANDIDATE = 3


NONE = 0
"""Node id meaning "nobody" (no leader, no vote). Real node ids are > 0."""


class Entry:
    __slots__ = ("term", "index", "type", "data")

    def __init__(self, term: int = 0, index: int = 0, type: int = EntryType.NORMAL, data: bytes = b"") -> None:
        self.term = term
        self.index = index
        self.type = type
        self.data = data

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Entry) and self.term == other.term and self.index == other.index
                and self.type == other.type and self.data == other.data)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        kind = "" if self.type == EntryType.NORMAL else " conf"
        return f"Entry({self.index}@{self.term}{kind} {self.data[:16]!r})"


def entry_size(e: Entry) -> int:
    """Approximate encoded size, for flow control (max size per message)."""
    return len(e.data) + 12


class HardState:
    """What must be durable before anything that depends on it is sent (term, vote, commit)."""

    __slots__ = ("term", "vote", "commit")

    def __init__(self, term: int = 0, vote: int = 0, commit: int = 0) -> None:
        self.term = term
        self.vote = vote
        self.commit = commit

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, HardState) and self.term == other.term and self.vote == other.vote
                and self.commit == other.commit)

    __hash__ = None  # type: ignore[assignment]

    def is_empty(self) -> bool:
        return self.term == 0 and self.vote == 0 and self.commit == 0

    def __repr__(self) -> str:
        return f"HardState(term={self.term}, vote={self.vote}, commit={self.commit})"


class ConfState:
    __slots__ = ("voters", "learners")

    def __init__(self, voters: list[int] | None = None, learners: list[int] | None = None) -> None:
        self.voters = sorted(voters or ())
        self.learners = sorted(learners or ())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConfState) and self.voters == other.voters and self.learners == other.learners

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ConfState(voters={self.voters}, learners={self.learners})"


class SnapshotMetadata:
    __slots__ = ("conf_state", "index", "term")

    def __init__(self, conf_state: ConfState | None = None, index: int = 0, term: int = 0) -> None:
        self.conf_state = conf_state if conf_state is not None else ConfState()
        self.index = index
        self.term = term

    def __repr__(self) -> str:
        return f"SnapshotMetadata({self.index}@{self.term} {self.conf_state})"


class Snapshot:
    """The application state as of ``metadata.index`` plus the membership at that point."""

    __slots__ = ("data", "metadata")

    def __init__(self, data: bytes = b"", metadata: SnapshotMetadata | None = None) -> None:
        self.data = data
        self.metadata = metadata if metadata is not None else SnapshotMetadata()

    def is_empty(self) -> bool:
        return self.metadata.index == 0

    def __repr__(self) -> str:
        return f"Snapshot({self.metadata}, {len(self.data)} bytes)"


class Message:
    """One Raft message. ``frm`` is the proto's ``from`` (a Python keyword)."""

    __slots__ = ("type", "to", "frm", "term", "log_term", "index", "entries", "commit", "snapshot", "reject",
                 "reject_hint", "context")

    def __init__(self, type: int, to: int = 0, frm: int = 0, term: int = 0, log_term: int = 0, index: int = 0,
                 entries: list[Entry] | None = None, commit: int = 0, snapshot: Snapshot | None = None,
                 reject: bool = False, reject_hint: int = 0, context: bytes = b"") -> None:
        self.type = type
        self.to = to
        self.frm = frm
        self.term = term
        self.log_term = log_term
        self.index = index
        self.entries = entries if entries is not None else []
        self.commit = commit
        self.snapshot = snapshot
        self.reject = reject
        self.reject_hint = reject_hint
        self.context = context

    def __repr__(self) -> str:
        parts = [f"{MessageType(self.type).name} {self.frm}->{self.to} t{self.term}"]
        if self.log_term or self.index:
            parts.append(f"idx={self.index}@{self.log_term}")
        if self.entries:
            parts.append(f"ents={len(self.entries)}")
        if self.commit:
            parts.append(f"commit={self.commit}")
        if self.reject:
            parts.append(f"reject hint={self.reject_hint}")
        if self.snapshot is not None:
            parts.append(f"snap={self.snapshot.metadata.index}")
        if self.context:
            parts.append(f"ctx={self.context!r}")
        return f"Message({' '.join(parts)})"


class ConfChange:
    """A single-server membership change, carried in a ``CONF_CHANGE`` entry's data."""

    __slots__ = ("type", "node_id", "context")

    def __init__(self, type: int, node_id: int, context: bytes = b"") -> None:
        self.type = type
        self.node_id = node_id
        self.context = context

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ConfChange) and self.type == other.type and self.node_id == other.node_id
                and self.context == other.context)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ConfChange({ConfChangeType(self.type).name} {self.node_id})"


def is_local_msg(t: int) -> bool:
    return t in _LOCAL


_LOCAL = frozenset({MessageType.MsgHup, MessageType.MsgBeat, MessageType.MsgUnreachable, MessageType.MsgSnapStatus,
                    MessageType.MsgCheckQuorum})
