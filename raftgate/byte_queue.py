"""Bytes held against a bound (``ByteBudget``), and the FIFO built on it (``ByteQueue``).

Whatever holds what a reader has not taken yet (a watch client's answers in the proxy, a watch
stream's responses in the store, a DoStream's answers, a proxy watch's unanswered creates, the
audit log's records) must not buffer without end when its reader takes nothing, and a count of
items says nothing of their size. One budget counts the bytes: the producer asks ``fits`` before it
adds, or waits for ``room``; the holder ``charge``s what it adds and ``release``s what is taken.

``room`` is cleared once the held bytes reach ``pause_at`` and set again once they fall to
``resume_at`` (half of ``pause_at`` unless given), so a producer that waits is woken for a good
share of room, not for every item taken (``resume_at = pause_at - 1`` wakes it at once).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Generic, TypeVar, cast

T = TypeVar("T")


class ByteBudget:
    """A count of held bytes against ``pause_at``, with a ``room`` event for the producer.

    Not locked: a budget that threads share is used under its owner's lock, with a
    ``threading.Event`` for ``room`` (an ``asyncio.Event`` may only be set on its loop's thread;
    typed as one for the coroutines that wait on it, which a thread's budget has none of).
    Nothing is refused here: a producer that adds without asking ``fits`` goes over the bound.
    """

    __slots__ = ("pause_at", "resume_at", "bytes", "room")

    def __init__(self, pause_at: int, resume_at: int | None = None,
                 room: asyncio.Event | threading.Event | None = None) -> None:
        if pause_at < 1:
            raise ValueError("pause_at must be at least one byte")
        self.pause_at = pause_at
        self.resume_at = pause_at // 2 if resume_at is None else resume_at
        if not 0 <= self.resume_at < pause_at:
            raise ValueError("resume_at must be below pause_at")
        #: bytes held
        self.bytes = 0
        #: set while the producer may add: cleared at ``pause_at`` bytes, set again at ``resume_at``
        self.room = asyncio.Event() if room is None else cast(asyncio.Event, room)
        self.room.set()

    def fits(self, size: int) -> bool:
        """Whether ``size`` more bytes keep the count below ``pause_at`` (nothing held takes any
        one item, however large: a stream always moves)."""
        return self.bytes == 0 or self.bytes + size < self.pause_at

    def charge(self, size: int) -> None:
        """``size`` bytes more are held."""
        self.bytes += size
        if self.bytes >= self.pause_at:
            self.room.clear()

    def release(self, size: int) -> None:
        """``size`` bytes held are taken (or given back)."""
        self.bytes -= size
        if self.bytes <= self.resume_at:
            self.room.set()


def bytes_size(item: object) -> int:
    """What a ``bytes`` item holds; anything else (an error, the end of a stream) counts nothing."""
    return len(item) if isinstance(item, bytes) else 0


class ByteQueue(asyncio.Queue[T], ByteBudget, Generic[T]):
    """An ``asyncio.Queue`` (unbounded in items) whose items are charged to its budget by ``size``
    (by default ``bytes`` items their length; others, such as an error or the end of a stream,
    count nothing, so they always get in)."""

    def __init__(self, pause_at: int, resume_at: int | None = None,
                 size: Callable[[object], int] = bytes_size) -> None:
        asyncio.Queue.__init__(self)
        ByteBudget.__init__(self, pause_at, resume_at)
        self._size = size

    def peek(self) -> T | None:
        """The item ``get_nowait`` would return next, left in place (None when empty)."""
        return cast(T, self._queue[0]) if self.qsize() else None  # type: ignore[attr-defined]

    # asyncio.Queue's own hooks: every put and get (waiting or not) goes through them
    def _put(self, item: T) -> None:
        super()._put(item)  # type: ignore[misc]
        size = self._size(item)
        if size:
            self.charge(size)

    def _get(self) -> T:
        item: T = super()._get()  # type: ignore[misc]
        size = self._size(item)
        if size:
            self.release(size)
        return item
