"""The leader's view of each follower (Progress), and the membership with its quorum rules.

A follower is in one of three states: PROBE (we do not know where its log matches ours; send one
MsgApp at a time and back off on rejection), REPLICATE (it matches; stream entries optimistically,
bounded by the inflight window) and SNAPSHOT (it is behind our first index; wait for the snapshot
to be installed).
"""

from __future__ import annotations

from collections import deque
from enum import IntEnum

from .types import ConfState


class ProgressState(IntEnum):
    PROBE = 0
    REPLICATE = 1
    SNAPSHOT = 2


PROBE = ProgressState.PROBE
REPLICATE = ProgressState.REPLICATE
SNAPSHOT = ProgressState.SNAPSHOT


class Inflights:
    """Last indexes of the MsgApps sent but not yet acknowledged, bounded in count (flow control)."""

    __slots__ = ("cap", "q")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.q: deque[int] = deque()

    def add(self, last: int) -> None:
        self.q.append(last)

    def free_le(self, to: int) -> None:
        q = self.q
        while q and q[0] <= to:
            q.popleft()

    def full(self) -> bool:
        return len(self.q) >= self.cap

    def count(self) -> int:
        return len(self.q)

    def reset(self) -> None:
        self.q.clear()


class Progress:
    __slots__ = ("match", "next", "state", "pending_snapshot", "recent_active", "probe_sent", "inflights",
                 "is_learner")

    def __init__(self, next: int, max_inflight: int, is_learner: bool = False) -> None:
        self.match = 0
        self.next = next
        self.state = PROBE
        self.pending_snapshot = 0
        # heard from within the last election timeout (CheckQuorum)
        self.recent_active = False
        # PROBE: a MsgApp is outstanding, wait for its answer (or a heartbeat response)
        self.probe_sent = False
        self.inflights = Inflights(max_inflight)
        self.is_learner = is_learner

    def _reset_state(self, state: ProgressState) -> None:
        self.probe_sent = False
        self.pending_snapshot = 0
        self.state = state
        self.inflights.reset()

    def become_probe(self) -> None:
        if self.state == SNAPSHOT:
            pending = self.pending_snapshot
            self._reset_state(PROBE)
            self.next = max(self.match + 1, pending + 1)
        else:
            self._reset_state(PROBE)
            self.next = self.match + 1

    def become_replicate(self) -> None:
        self._reset_state(REPLICATE)
        self.next = self.match + 1

    def become_snapshot(self, snapshot_index: int) -> None:
        self._reset_state(SNAPSHOT)
        self.pending_snapshot = snapshot_index

    def maybe_update(self, n: int) -> bool:
        """Acknowledgement of entries up to n; returns whether match moved."""
        updated = False
        if self.match < n:
            self.match = n
            updated = True
            self.probe_sent = False
        if self.next < n + 1:
            self.next = n + 1
        return updated

    def maybe_decr_to(self, rejected: int, match_hint: int) -> bool:
        """A rejection of the MsgApp whose previous index was ``rejected``; returns False if stale."""
        if self.state == REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, match_hint + 1), self.match + 1)
        self.probe_sent = False
        return True

    def is_paused(self) -> bool:
        s = self.state
        if s == PROBE:
            return self.probe_sent
        if s == REPLICATE:
            return len(self.inflights.q) >= self.inflights.cap
        return True

    def __repr__(self) -> str:
        return (f"Progress({self.state.name} match={self.match} next={self.next}"
                f"{' learner' if self.is_learner else ''}{' active' if self.recent_active else ''})")


class ProgressTracker:
    """Membership (voters, learners), each member's Progress, and the votes of an election."""

    __slots__ = ("voters", "learners", "progress", "votes", "max_inflight")

    def __init__(self, max_inflight: int) -> None:
        self.voters: set[int] = set()
        self.learners: set[int] = set()
        self.progress: dict[int, Progress] = {}
        self.votes: dict[int, bool] = {}
        self.max_inflight = max_inflight

    def conf_state(self) -> ConfState:
        return ConfState(list(self.voters), list(self.learners))

    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def is_single_voter(self, id: int) -> bool:
        return len(self.voters) == 1 and id in self.voters

    def committed(self) -> int:
        """The highest index a quorum of voters has matched."""
        voters = self.voters
        if not voters:
            return 0
        prs = self.progress
        matches = sorted((prs[v].match for v in voters), reverse=True)
        return matches[len(matches) // 2]

    def record_vote(self, id: int, granted: bool) -> None:
        if id not in self.votes:
            self.votes[id] = granted

    def tally(self) -> tuple[int, int]:
        granted = rejected = 0
        for id in self.voters:
            v = self.votes.get(id)
            if v is True:
                granted += 1
            elif v is False:
                rejected += 1
        return granted, rejected

    def vote_result(self) -> int:
        """1 won, -1 lost, 0 pending."""
        granted, rejected = self.tally()
        q = self.quorum()
        if granted >= q:
            return 1
        if rejected >= len(self.voters) - q + 1:
            return -1
        return 0

    def quorum_active(self) -> bool:
        active = sum(1 for v in self.voters if self.progress[v].recent_active)
        return active >= self.quorum()

    def add_voter(self, id: int, next: int) -> None:
        self.learners.discard(id)
        self.voters.add(id)
        pr = self.progress.get(id)
        if pr is None:
            pr = self.progress[id] = Progress(next, self.max_inflight)
            pr.recent_active = True  # a new member is not counted as dead before it could answer
        pr.is_learner = False

    def add_learner(self, id: int, next: int) -> None:
        self.voters.discard(id)
        self.learners.add(id)
        pr = self.progress.get(id)
        if pr is None:
            pr = self.progress[id] = Progress(next, self.max_inflight)
            pr.recent_active = True
        pr.is_learner = True

    def remove(self, id: int) -> None:
        self.voters.discard(id)
        self.learners.discard(id)
        self.progress.pop(id, None)
        self.votes.pop(id, None)
