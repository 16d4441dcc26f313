"""The one contract between the Raft node and the state machine it drives (hashicorp/raft's FSM).

The node knows nothing else of the store: it hands over committed entries in log order, is told
when a batch's results are decided (so it answers callers before the state's own commit), asks
for a copy of the state (a client's Snapshot, a follower's catch-up), installs a copy a leader
sent, and asks for the applied state to be made durable before it drops log entries. The store's
``authstore.state.apply.Applier`` implements it; the simulation (tests/raft) uses a small one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from authstore.raft.types import Entry


class StateMachine(Protocol):
    def apply(self, entries: Sequence[Entry], term: int) -> tuple[list[tuple[int, Any]], bool]:
        """Applies committed entries in log order, as one atomic batch; ``term`` is the node's
        current Raft term (response headers carry it).

        Returns, per entry, the ID of the request it carries (0 for none) and the response or the
        exception refusing it; and whether the batch changed the membership (a conf change, or a
        member's addresses or attributes): the node then re-reads it. Entries at or below the
        state's own applied index are skipped (a replay after a crash, or entries a snapshot
        covered). Raising means nothing of the batch took effect: the node stops (fail-stop) and
        a restart applies the batch again."""
        ...

    def on_decided(self, fn: Callable[[int, list[tuple[int, Any]], bool], None]) -> None:
        """Registers ``fn(last index, results, membership changed)``, called by ``apply`` (on its thread) once a batch
        with entries above the applied index is fully executed, before its effects are committed.
        The entries are durable in the log and apply is deterministic, so the results are final: a
        crash before the commit replays the batch to the same results. The node registers itself
        when it is built and answers its callers from there."""
        ...

    def snapshot(self, directory: Path) -> Path:
        """Writes a consistent copy of the whole state into ``directory``; returns the file."""
        ...

    def restore(self, path: Path) -> int:
        """Replaces the whole state, durably, with a copy a leader sent; returns its applied index."""
        ...

    def sync(self) -> None:
        """Makes everything applied so far durable (before the log below it is dropped)."""
        ...
