"""The one contract between the Raft node and the state machine it drives (hashicorp/raft's FSM).

The node knows nothing else of the store: it hands over committed entries in log order, asks for
a copy of the state (a client's Snapshot, a follower's catch-up), installs a copy a leader sent,
and asks for the applied state to be made durable before it drops log entries. The store's
``authstore.state.apply.Applier`` implements it; the simulation (tests/raft) uses a small one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from authstore.raft.types import Entry


class StateMachine(Protocol):
    def apply(self, entries: Sequence[Entry], term: int) -> list[tuple[int, Any]]:
        """Applies committed entries in log order, as one atomic batch; ``term`` is the node's
        current Raft term (response headers carry it).

        Returns, per entry, the ID of the request it carries (0 for none) and the response or the
        exception refusing it. Entries at or below the state's own applied index are skipped (a
        replay after a crash, or entries a snapshot covered). Raising means nothing of the batch
        took effect: the node stops (fail-stop) and a restart applies the batch again."""
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
