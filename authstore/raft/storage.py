"""The stable-storage interface the Raft core reads its durable log through, and an in-memory one.

The core never writes storage: the driver persists what ``Ready`` hands it (snapshot, hard state,
entries, in that order) and then calls ``advance``. The core only reads: at start-up
(``initial_state``) and to serve entries and snapshots to followers. A WAL-backed storage
implements the same protocol.
"""

from __future__ import annotations

from typing import Protocol

from .types import ConfState, Entry, EntryType, HardState, Snapshot, SnapshotMetadata, entry_size


class StorageError(Exception):
    pass


class CompactedError(StorageError):
    """The requested index is at or below the first index: it was compacted into a snapshot."""


class UnavailableError(StorageError):
    """The requested index is beyond the last index."""


class SnapshotOutOfDateError(StorageError):
    """The snapshot is not newer than the one storage already holds."""


class SnapshotTemporarilyUnavailableError(StorageError):
    """A snapshot is being prepared; the leader retries later."""


class Storage(Protocol):
    def initial_state(self) -> tuple[HardState, ConfState]:
        """The persisted hard state and the membership as of the latest snapshot."""
        ...

    def entries(self, lo: int, hi: int, max_size: int) -> list[Entry]:
        """Entries [lo, hi), at least one if any, then as many as fit in max_size bytes."""
        ...

    def term(self, index: int) -> int:
        """Term of the entry at index, for first_index()-1 <= index <= last_index()."""
        ...

    def first_index(self) -> int:
        ...

    def last_index(self) -> int:
        ...

    def snapshot(self) -> Snapshot:
        """The most recent snapshot (may raise SnapshotTemporarilyUnavailableError)."""
        ...


def limit_size(ents: list[Entry], max_size: int) -> list[Entry]:
    """The longest prefix of ents within max_size bytes, but never less than one entry."""
    if len(ents) <= 1:
        return ents
    size = entry_size(ents[0])
    for i in range(1, len(ents)):
        size += entry_size(ents[i])
        if size > max_size:
            return ents[:i]
    return ents


class MemoryStorage:
    """Storage held in memory: for tests, the simulation, and as the cache in front of the WAL.

    ``ents[0]`` is a dummy entry at the snapshot's (index, term), so term(first_index - 1) works.
    """

    def __init__(self) -> None:
        self.hard_state = HardState()
        self.snap = Snapshot()
        self.ents: list[Entry] = [Entry()]

    @classmethod
    def with_conf(cls, voters: list[int], learners: list[int] | None = None) -> MemoryStorage:
        """A fresh storage whose initial membership is given directly (tests; no log entries)."""
        s = cls()
        s.snap.metadata.conf_state = ConfState(voters, learners)
        return s

    # --- Storage protocol -------------------------------------------------------------------
    def initial_state(self) -> tuple[HardState, ConfState]:
        hs = self.hard_state
        return HardState(hs.term, hs.vote, hs.commit), self.snap.metadata.conf_state

    def entries(self, lo: int, hi: int, max_size: int) -> list[Entry]:
        ents = self.ents
        offset = ents[0].index
        if lo <= offset:
            raise CompactedError(lo)
        if hi > offset + len(ents):
            raise UnavailableError(hi)
        out = ents[lo - offset:hi - offset]
        return limit_size(out, max_size) if len(out) > 1 else out

    def term(self, index: int) -> int:
        ents = self.ents
        offset = ents[0].index
        if index < offset:
            raise CompactedError(index)
        if index - offset >= len(ents):
            raise UnavailableError(index)
        return ents[index - offset].term

    def first_index(self) -> int:
        return self.ents[0].index + 1

    def last_index(self) -> int:
        return self.ents[0].index + len(self.ents) - 1

    def snapshot(self) -> Snapshot:
        return self.snap

    # --- writes, by the driver --------------------------------------------------------------
    def set_hard_state(self, hs: HardState) -> None:
        self.hard_state = HardState(hs.term, hs.vote, hs.commit)

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Replaces the whole log with the snapshot (a follower catching up from the leader)."""
        if snap.metadata.index <= self.snap.metadata.index:
            raise SnapshotOutOfDateError(snap.metadata.index)
        self.snap = snap
        self.ents = [Entry(snap.metadata.term, snap.metadata.index)]

    def create_snapshot(self, index: int, conf_state: ConfState, data: bytes) -> Snapshot:
        """Records the application's snapshot taken at applied index ``index``."""
        if index <= self.snap.metadata.index:
            raise SnapshotOutOfDateError(index)
        offset = self.ents[0].index
        if index > self.last_index():
            raise UnavailableError(index)
        md = SnapshotMetadata(ConfState(conf_state.voters, conf_state.learners), index, self.ents[index - offset].term)
        self.snap = Snapshot(data, md)
        return self.snap

    def compact(self, compact_index: int) -> None:
        """Discards entries up to compact_index (which must already be in a snapshot or applied)."""
        offset = self.ents[0].index
        if compact_index <= offset:
            raise CompactedError(compact_index)
        if compact_index > self.last_index():
            raise UnavailableError(compact_index)
        i = compact_index - offset
        dummy = Entry(self.ents[i].term, self.ents[i].index)
        self.ents = [dummy, *self.ents[i + 1:]]

    def append(self, entries: list[Entry]) -> None:
        """Appends entries, replacing any conflicting suffix (the leader overwrote it)."""
        if not entries:
            return
        first = self.first_index()
        last = entries[-1].index
        if last < first:
            return  # all already compacted
        if first > entries[0].index:
            entries = entries[first - entries[0].index:]
        offset = entries[0].index - self.ents[0].index
        n = len(self.ents)
        if n > offset:
            del self.ents[offset:]
            self.ents.extend(entries)
        elif n == offset:
            self.ents.extend(entries)
        else:
            raise UnavailableError(f"missing log entry: last {self.last_index()}, appending at {entries[0].index}")


def bootstrap(storage: MemoryStorage, voters: list[int]) -> None:
    """Writes a new cluster's starting log: one committed ADD_NODE conf change per voter, term 1.

    Like etcd's bootstrap, membership then lives in the log itself, so a node added later learns
    the initial members by replaying it. The node learns them when it applies those entries.
    """
    from .codec import encode_conf_change
    from .types import ConfChange, ConfChangeType

    if storage.last_index() != 0 or not storage.hard_state.is_empty():
        raise StorageError("bootstrap needs an empty storage")
    ents = [Entry(1, i + 1, EntryType.CONF_CHANGE, encode_conf_change(ConfChange(ConfChangeType.ADD_NODE, v)))
            for i, v in enumerate(sorted(voters))]
    storage.append(ents)
    storage.set_hard_state(HardState(term=1, vote=0, commit=len(ents)))
