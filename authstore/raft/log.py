"""The Raft log as the core sees it: durable entries in ``Storage`` plus an unstable tail.

Entries the node appended (as leader) or received (as follower) stay in the unstable tail until the
driver reports them persisted (``stable_to``); a received snapshot waits there the same way. The
log also tracks ``committed`` (known to be on a quorum) and ``applied`` (handed to the
application), with ``applied <= committed`` always.
"""

from __future__ import annotations

from .storage import CompactedError, Storage, UnavailableError, limit_size
from .types import Entry, Snapshot


class RaftLogError(AssertionError):
    """An invariant of the log was broken: a bug, or storage that lost acknowledged data."""


class RaftLog:
    __slots__ = ("storage", "offset", "unstable", "pending_snapshot", "committed", "applied", "max_next_ents_size")

    def __init__(self, storage: Storage, max_next_ents_size: int = 1 << 62) -> None:
        self.storage = storage
        first = storage.first_index()
        last = storage.last_index()
        # unstable: entries[i] has index offset + i; pending_snapshot (if any) precedes them
        self.offset = last + 1
        self.unstable: list[Entry] = []
        self.pending_snapshot: Snapshot | None = None
        self.committed = first - 1
        self.applied = first - 1
        self.max_next_ents_size = max_next_ents_size

    # --- indexes and terms ------------------------------------------------------------------
    def first_index(self) -> int:
        if self.pending_snapshot is not None:
            return self.pending_snapshot.metadata.index + 1
        return self.storage.first_index()

    def last_index(self) -> int:
        if self.unstable:
            return self.offset + len(self.unstable) - 1
        if self.pending_snapshot is not None:
            return self.pending_snapshot.metadata.index
        return self.storage.last_index()

    def last_term(self) -> int:
        if self.unstable:
            return self.unstable[-1].term
        return self.term(self.last_index())

    def term(self, i: int) -> int:
        """Term of entry i; 0 if i is beyond the log; raises CompactedError if compacted away."""
        off = self.offset
        if i >= off:
            j = i - off
            return self.unstable[j].term if j < len(self.unstable) else 0
        snap = self.pending_snapshot
        if snap is not None:
            if i == snap.metadata.index:
                return snap.metadata.term
            if i < snap.metadata.index:
                raise CompactedError(i)
            return 0
        try:
            return self.storage.term(i)
        except UnavailableError:
            return 0

    def term_or_zero(self, i: int) -> int:
        try:
            return self.term(i)
        except CompactedError:
            return 0

    def match_term(self, i: int, t: int) -> bool:
        try:
            return self.term(i) == t
        except CompactedError:
            return False

    def is_up_to_date(self, lasti: int, term: int) -> bool:
        """Whether a candidate whose log ends at (lasti, term) is at least as up to date as ours."""
        lt = self.last_term()
        return term > lt or (term == lt and lasti >= self.last_index())

    # --- appending --------------------------------------------------------------------------
    def append(self, ents: list[Entry]) -> int:
        """Appends ents (which may overwrite an uncommitted suffix); returns the new last index."""
        if not ents:
            return self.last_index()
        after = ents[0].index - 1
        if after < self.committed:
            raise RaftLogError(f"append after {after} is below committed {self.committed}")
        self._truncate_and_append(ents)
        return self.last_index()

    def _truncate_and_append(self, ents: list[Entry]) -> None:
        first = ents[0].index
        off = self.offset
        n = len(self.unstable)
        if first == off + n:
            self.unstable.extend(ents)
        elif first <= off:
            # replaces everything unstable (and shadows a conflicting stable suffix)
            self.offset = first
            self.unstable = list(ents)
        else:
            del self.unstable[first - off:]
            self.unstable.extend(ents)

    def find_conflict(self, ents: list[Entry]) -> int:
        """Index of the first entry of ents that is new or conflicts with ours; 0 if none."""
        for e in ents:
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def maybe_append(self, index: int, log_term: int, committed: int, ents: list[Entry]) -> int | None:
        """A follower's handling of MsgApp: returns the last index known to match the leader, or
        None when our log does not contain (index, log_term) (the leader must back off)."""
        if not self.match_term(index, log_term):
            return None
        last_new = index + len(ents)
        ci = self.find_conflict(ents)
        if ci:
            if ci <= self.committed:
                raise RaftLogError(f"entry {ci} conflicts with committed entry (committed {self.committed})")
            self.append(ents[ci - index - 1:])
        self.commit_to(min(committed, last_new))
        return last_new

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The largest (i, term(i)) with i <= index and term(i) <= term: where a log whose entry at
        ``index`` has ``term`` could first agree with ours (fast backtracking)."""
        while index > 0:
            try:
                t = self.term(index)
            except CompactedError:
                return index, 0
            if t <= term:
                return index, t
            index -= 1
        return 0, 0

    # --- commit and apply -------------------------------------------------------------------
    def commit_to(self, to: int) -> None:
        if to > self.committed:
            if to > self.last_index():
                raise RaftLogError(f"commit {to} is beyond the last index {self.last_index()}")
            self.committed = to

    def maybe_commit(self, max_index: int, term: int) -> bool:
        """Commits up to max_index if that entry is of ``term`` (Raft only commits the current term
        by counting; earlier entries commit with it)."""
        if max_index > self.committed and self.term_or_zero(max_index) == term:
            self.commit_to(max_index)
            return True
        return False

    def applied_to(self, i: int) -> None:
        if i == 0:
            return
        if i > self.committed or i < self.applied:
            raise RaftLogError(f"applied {i} outside [{self.applied}, {self.committed}]")
        self.applied = i

    def has_next_committed_ents(self) -> bool:
        if self.pending_snapshot is not None:
            return False
        return self.committed > max(self.applied, self.first_index() - 1)

    def next_committed_ents(self) -> list[Entry]:
        if self.pending_snapshot is not None:
            return []
        lo = max(self.applied + 1, self.first_index())
        hi = self.committed + 1
        if lo >= hi:
            return []
        return self.slice(lo, hi, self.max_next_ents_size)

    # --- reading entries --------------------------------------------------------------------
    def slice(self, lo: int, hi: int, max_size: int) -> list[Entry]:
        """Entries [lo, hi) from storage and/or the unstable tail, limited to max_size bytes."""
        if lo >= hi:
            return []
        first = self.first_index()
        if lo < first:
            raise CompactedError(lo)
        last = self.last_index()
        if hi > last + 1:
            raise RaftLogError(f"slice [{lo}, {hi}) beyond last index {last}")
        off = self.offset
        if lo >= off:
            ents = self.unstable[lo - off:hi - off]
            return limit_size(ents, max_size)
        stored = self.storage.entries(lo, min(hi, off), max_size)
        if len(stored) < min(hi, off) - lo:
            return stored  # size limit hit
        if hi > off:
            stored = stored + self.unstable[:hi - off]
            return limit_size(stored, max_size)
        return stored

    def entries(self, i: int, max_size: int) -> list[Entry]:
        last = self.last_index()
        if i > last:
            return []
        return self.slice(i, last + 1, max_size)

    def snapshot(self) -> Snapshot:
        if self.pending_snapshot is not None:
            return self.pending_snapshot
        return self.storage.snapshot()

    # --- stability --------------------------------------------------------------------------
    def stable_to(self, i: int, t: int) -> None:
        """The driver persisted entries up to (i, t); drops them from the unstable tail unless the
        tail was rewritten meanwhile (then the term no longer matches and nothing is dropped)."""
        off = self.offset
        j = i - off
        if j < 0 or j >= len(self.unstable) or self.unstable[j].term != t:
            return
        del self.unstable[:j + 1]
        self.offset = i + 1

    def stable_snap_to(self, i: int) -> None:
        if self.pending_snapshot is not None and self.pending_snapshot.metadata.index == i:
            self.pending_snapshot = None

    def restore(self, snap: Snapshot) -> None:
        """Replaces the whole log with a snapshot received from the leader."""
        self.committed = snap.metadata.index
        self.offset = snap.metadata.index + 1
        self.unstable = []
        self.pending_snapshot = snap
