"""A FIFO bounded in bytes, with a ``room`` event for whoever fills it.

Streams hold what their reader has not taken yet (a watch client's answers in the proxy, a watch
stream's responses in the store); a reader that takes nothing must not make its producer buffer
without end, and a count of items says nothing of their size. The producer asks ``fits`` before it
adds or waits for ``room``; the queue counts the bytes of the ``bytes`` items it holds (others, such
as an error or the end of a stream, count nothing, so they always get in).

``room`` is cleared once the held bytes reach ``pause_at`` and set again once they fall to
``resume_at`` (half of ``pause_at`` unless given), so a producer that waits is woken for a good
share of room, not for every item taken.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

T = TypeVar("T")


class ByteQueue(asyncio.Queue[T], Generic[T]):
    """An ``asyncio.Queue`` (unbounded in items) that counts its ``bytes`` items' length in ``bytes``."""

    def __init__(self, pause_at: int, resume_at: int | None = None) -> None:
        super().__init__()
        if pause_at < 1:
            raise ValueError("pause_at must be at least one byte")
        self.pause_at = pause_at
        self.resume_at = pause_at // 2 if resume_at is None else resume_at
        if not 0 <= self.resume_at < pause_at:
            raise ValueError("resume_at must be below pause_at")
        #: bytes of the ``bytes`` items held
        self.bytes = 0
        #: set while the producer may add: cleared at ``pause_at`` bytes, set again at ``resume_at``
        self.room = asyncio.Event()
        self.room.set()

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes keep the queue below ``pause_at`` (an empty queue takes any
        one item, however large: a stream always moves)."""
        return self.bytes == 0 or self.bytes + size < self.pause_at

    # asyncio.Queue's own hooks: every put and get (waiting or not) goes through them
    def _put(self, item: T) -> None:
        super()._put(item)  # type: ignore[misc]
        if isinstance(item, bytes):
            self.bytes += len(item)
            if self.bytes >= self.pause_at:
                self.room.clear()

    def _get(self) -> T:
        item: T = super()._get()  # type: ignore[misc]
        if isinstance(item, bytes):
            self.bytes -= len(item)
            if self.bytes <= self.resume_at:
                self.room.set()
        return item
