"""What the Raft node needs of the world besides the state machine: a log, peers, a clock and
workers. The store passes the real ones (wal.WAL, transport.Transport, SystemClock,
ThreadWorker); the deterministic simulation (tests/raft/fakes.py) passes in-memory ones, so the
proof runs the same driver that ships.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from authstore.raft.types import Entry, HardState, Message, SnapshotMetadata

T = TypeVar("T")


class Log(Protocol):
    """The write-ahead log (wal.WAL). Replay happens before the node is built."""

    def save(self, hard_state: HardState | None, entries: list[Entry], sync: bool = True) -> None:
        """Appends entries then the hard state; durable on return unless ``sync`` is False and
        there are no entries (a commit-index-only change)."""
        ...

    def checkpoint(self, snapshot: SnapshotMetadata, hard_state: HardState, entries: list[Entry]) -> None:
        """Restarts the log from a snapshot the state machine holds durably, keeping ``entries``."""
        ...

    def close(self) -> None: ...


class Receiver(Protocol):
    """What a transport delivers to: the node."""

    def step(self, msg: Message) -> None: ...

    async def receive_snapshot(self, msg: Message, path: Path) -> None: ...

    def report_unreachable(self, peer_id: int) -> None: ...

    def is_removed(self, peer_id: int) -> bool:
        """True for a member this node saw removed from the cluster."""
        ...

    def removed_by_peers(self) -> None:
        """A peer refused this node's messages: this member was removed while it was away."""
        ...


class Peers(Protocol):
    """The peer transport (transport.Transport): best effort, may lose messages."""

    def bind(self, receiver: Receiver) -> None:
        """Names the node that incoming messages go to (once, when the node is built)."""
        ...

    def send(self, msg: Message) -> None: ...

    async def send_snapshot(self, msg: Message, path: Path) -> bool:
        """Streams the state copy at ``path`` with ``msg``; True once the peer took it."""
        ...

    async def close(self) -> None: ...


class Timer(Protocol):
    def cancel(self) -> Any: ...


class Clock(Protocol):
    """Time as the node sees it: timeouts, the tick, and the wall clock stamped into entries."""

    def monotonic(self) -> float: ...

    def wall_ms(self) -> int: ...

    def sleep(self, seconds: float) -> Awaitable[None]: ...

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer: ...


class Worker(Protocol):
    """One thread of work, in submission order (the log writer; the apply thread)."""

    def run(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]: ...

    def shutdown(self) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def sleep(self, seconds: float) -> Awaitable[None]:
        return asyncio.sleep(seconds)

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer:
        return asyncio.get_running_loop().call_later(delay, fn, *args)


class ThreadWorker:
    """A single-thread executor: ``run`` returns the loop's future for the call directly."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def run(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
