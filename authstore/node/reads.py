"""ReadIndex batching: every reader that arrives while one request is being prepared shares it.

A request (or its answer) can be lost: the leader changed, a peer stream dropped it. As etcd's
linearizableReadLoop does (readIndexRetryTime), a batch unanswered for ``RETRY_SECONDS`` is asked
for again under a new context; the first answer to any of its contexts answers it, and a late
answer to one of them answers nothing (each context belongs to one batch only, and a batch's
contexts are all sent after its readers arrived, so any of them gives a valid read point).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable

from authstore.raft.raft import ReadState

#: etcd's readIndexRetryTime
RETRY_SECONDS = 0.5


class _Batch:
    __slots__ = ("futures", "ctxs", "sent_at")

    def __init__(self, futures: list[asyncio.Future[int]]) -> None:
        self.futures = futures
        self.ctxs: list[bytes] = []
        self.sent_at = 0.0


class ReadBatcher:
    def __init__(self, retry_seconds: float = RETRY_SECONDS, first_ctx: int = 1) -> None:
        """``first_ctx``: random per process (the driver's), so that an answer the leader sends
        to an earlier incarnation of this node never matches a read of this one (as etcd's
        request IDs, unique across restarts)."""
        self.retry_seconds = retry_seconds
        self._pending: list[asyncio.Future[int]] = []
        self._in_flight: dict[bytes, _Batch] = {}
        self._batches: list[_Batch] = []  # in flight, oldest first
        self._ctx = itertools.count(first_ctx)

    def add(self, fut: asyncio.Future[int]) -> None:
        self._pending.append(fut)

    def issue(self, read_index: Callable[[bytes], None], now: float) -> None:
        """Sends one read-index request for every reader waiting since the last one."""
        if not self._pending:
            return
        batch = _Batch(self._pending)
        self._pending = []
        self._batches.append(batch)
        self._send(batch, read_index, now)

    def retry(self, read_index: Callable[[bytes], None], now: float) -> None:
        """Asks again for each batch unanswered for ``retry_seconds``; forgets the batches whose
        readers all went away (timed out): a batch holds at most request timeout / retry contexts."""
        for batch in list(self._batches):
            if all(fut.done() for fut in batch.futures):
                self._forget(batch)
            elif now - batch.sent_at >= self.retry_seconds:
                self._send(batch, read_index, now)

    def _send(self, batch: _Batch, read_index: Callable[[bytes], None], now: float) -> None:
        ctx = next(self._ctx).to_bytes(8, "big")
        batch.ctxs.append(ctx)
        batch.sent_at = now
        self._in_flight[ctx] = batch
        read_index(ctx)

    def _forget(self, batch: _Batch) -> None:
        for ctx in batch.ctxs:
            self._in_flight.pop(ctx, None)
        self._batches.remove(batch)

    def answer(self, read_states: Iterable[ReadState]) -> None:
        for rs in read_states:
            batch = self._in_flight.get(rs.ctx)
            if batch is None:
                continue  # an earlier attempt's late answer: its batch is answered already
            self._forget(batch)
            for fut in batch.futures:
                if not fut.done():
                    fut.set_result(rs.index)

    def fail_in_flight(self, exc: BaseException) -> None:
        """etcd: a read-index request that spans a leader change fails ("leader changed")."""
        for batch in self._batches:
            for fut in batch.futures:
                if not fut.done():
                    fut.set_exception(exc)
        self._in_flight.clear()
        self._batches.clear()
