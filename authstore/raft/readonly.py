"""Pending ReadIndex requests on a leader, waiting for a heartbeat quorum to confirm leadership.

Each request records the commit index at the time it arrived. Once a quorum has answered a
heartbeat carrying the request's context, no other leader can have committed anything newer, so
reading the state machine after it has applied up to that index is linearizable. Heartbeats
are ordered: an acknowledged context also confirms every request queued before it.
"""

from __future__ import annotations

from .types import Message


class ReadIndexStatus:
    __slots__ = ("req", "index", "acks")

    def __init__(self, req: Message, index: int) -> None:
        self.req = req
        self.index = index
        self.acks: set[int] = set()


class ReadOnly:
    __slots__ = ("pending", "queue")

    def __init__(self) -> None:
        self.pending: dict[bytes, ReadIndexStatus] = {}
        self.queue: list[bytes] = []

    def add_request(self, index: int, req: Message) -> None:
        ctx = req.context
        if ctx in self.pending:
            return
        self.pending[ctx] = ReadIndexStatus(req, index)
        self.queue.append(ctx)

    def recv_ack(self, id: int, ctx: bytes) -> set[int] | None:
        rs = self.pending.get(ctx)
        if rs is None:
            return None
        rs.acks.add(id)
        return rs.acks

    def advance(self, ctx: bytes) -> list[ReadIndexStatus]:
        """Releases every request up to and including ctx (in arrival order)."""
        try:
            i = self.queue.index(ctx)
        except ValueError:
            return []
        released = [self.pending.pop(c) for c in self.queue[:i + 1]]
        del self.queue[:i + 1]
        return released

    def last_pending(self) -> bytes:
        return self.queue[-1] if self.queue else b""
