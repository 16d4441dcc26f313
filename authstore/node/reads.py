"""ReadIndex batching: every reader that arrives while one request is being prepared shares it."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable

from authstore.raft.raft import ReadState


class ReadBatcher:
    def __init__(self) -> None:
        self._pending: list[asyncio.Future[int]] = []
        self._in_flight: dict[bytes, list[asyncio.Future[int]]] = {}
        self._ctx = itertools.count(1)

    def add(self, fut: asyncio.Future[int]) -> None:
        self._pending.append(fut)

    def issue(self, read_index: Callable[[bytes], None]) -> None:
        """Sends one read-index request for every reader waiting since the last one."""
        if not self._pending:
            return
        ctx = next(self._ctx).to_bytes(8, "big")
        self._in_flight[ctx] = self._pending
        self._pending = []
        read_index(ctx)

    def answer(self, read_states: Iterable[ReadState]) -> None:
        for rs in read_states:
            for fut in self._in_flight.pop(rs.ctx, []):
                if not fut.done():
                    fut.set_result(rs.index)

    def fail_in_flight(self, exc: BaseException) -> None:
        """etcd: a read-index request that spans a leader change fails ("leader changed")."""
        for futures in self._in_flight.values():
            for fut in futures:
                if not fut.done():
                    fut.set_exception(exc)
        self._in_flight.clear()
