"""Callers waiting on the apply stage: a proposal for its entry's result, a reader for an index."""

from __future__ import annotations

import asyncio
from typing import Any


class Waiters:
    def __init__(self) -> None:
        self._proposals: dict[int, asyncio.Future[Any]] = {}
        self._indexes: list[tuple[int, asyncio.Future[None]]] = []

    def add(self, request_id: int, fut: asyncio.Future[Any]) -> None:
        """A ValueError if ``request_id`` is already waited on: an entry's answer goes to whoever
        waits on its ID, so a second caller under it would take the first's answer (and the first
        time out); the ID is the API's to pick (authstore/api/proposer.py), the node holds it to it."""
        if request_id in self._proposals:
            raise ValueError(f"request ID {request_id:x} is already in flight")
        self._proposals[request_id] = fut

    def discard(self, request_id: int) -> None:
        """The proposal was answered, timed out, or its caller went away."""
        self._proposals.pop(request_id, None)

    def answer(self, request_id: int, result: Any) -> None:
        fut = self._proposals.pop(request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(result)

    def add_index(self, index: int, fut: asyncio.Future[None]) -> None:
        self._indexes.append((index, fut))

    def applied(self, applied_index: int) -> None:
        """Wakes everybody waiting for an index at or below ``applied_index``."""
        keep = []
        for index, fut in self._indexes:
            if index <= applied_index:
                if not fut.done():
                    fut.set_result(None)
            elif not fut.done():
                keep.append((index, fut))
        self._indexes = keep
