"""raftgate's Raft: a pure, deterministic consensus core shaped like etcd's raft library.

``RawNode`` is the entry point (see rawnode.py for the driver's duties); storage.py defines what
the core reads from stable storage; codec.py converts to and from the ``raftpb`` wire messages.
"""

from .raft import CAMPAIGN_TRANSFER, Config, ProposalDroppedError, Raft, ReadState
from .rawnode import RawNode, Ready, SoftState, Status
from .storage import (
    CompactedError,
    MemoryStorage,
    SnapshotOutOfDateError,
    SnapshotTemporarilyUnavailableError,
    Storage,
    UnavailableError,
    bootstrap,
)
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
    SnapshotMetadata,
    StateType,
)

__all__ = [
    "CAMPAIGN_TRANSFER", "NONE", "CompactedError", "ConfChange", "ConfChangeType", "ConfState", "Config", "Entry",
    "EntryType", "HardState", "MemoryStorage", "Message", "MessageType", "ProposalDroppedError", "Raft", "RawNode",
    "ReadState", "Ready", "Snapshot", "SnapshotMetadata", "SnapshotOutOfDateError",
    "SnapshotTemporarilyUnavailableError", "SoftState", "StateType", "Status", "Storage", "UnavailableError",
    "bootstrap",
]
