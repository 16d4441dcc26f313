"""Requests into the log, as the API layer hands them to the node: it picks each request's ID
and wall time and stamps them into the bytes (stamp.py), as etcdserver does; the node logs bytes
it never reads and answers the caller waiting on the ID it was given. One ``Proposer`` per node
(authstore/main.py builds it and passes it to every part that proposes), so IDs stay unique.
"""

from __future__ import annotations

import itertools
import random
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from authstore.api.stamp import stamp

if TYPE_CHECKING:
    from authstore.node.driver import RaftNode


def wall_ms() -> int:
    """The wall clock the API layer stamps into requests (and the lease keeper's deadlines follow)."""
    return time.time_ns() // 1_000_000


class Proposer:
    def __init__(self, node: RaftNode, *, wall_ms: Callable[[], int] = wall_ms,
                 rng: random.Random | None = None) -> None:
        """``wall_ms``: the time stamped into each request (the simulation passes its manual
        clock's). ``rng``: the seed of the IDs (the simulation's, so a seed replays exactly)."""
        self.node = node
        self._wall_ms = wall_ms
        # Random high bits per incarnation, a counter below: an entry an earlier incarnation of
        # this node proposed, applied after a restart, matches no waiter of this one.
        self._ids = itertools.count((rng.getrandbits(40) if rng is not None else secrets.randbits(40)) << 20)

    def new_id(self) -> int:
        """A request ID unique on this node (a membership change's context carries one too)."""
        return next(self._ids)

    async def propose(self, data: bytes, trace: list[int] | None = None,
                      prepared: Callable[[bytes, int, int], None] | None = None) -> Any:
        """Logs an encoded InternalRaftRequest with a new ID and the time now appended; returns the
        apply stage's answer (or raises its error). The ID and time are picked once the node may
        log it (``admit``: a leader known, apply not far behind), so the time is when it is logged.
        ``trace``: a sampled request's stage trace (raftgate/stages.py).
        ``prepared(payload, request ID, time)``: told the entry's bytes before they are logged."""
        await self.node.admit()
        request_id = self.new_id()
        now = self._wall_ms()
        payload = stamp(data, request_id, now)
        if prepared is not None:
            prepared(payload, request_id, now)
        return await self.node.propose(payload, request_id, trace)
