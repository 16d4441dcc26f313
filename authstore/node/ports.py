"""What the Raft node needs of the world besides the state machine: a log, peers, a clock and
workers. The store passes the real ones (wal.WAL, transport.Transport, SystemClock,
ThreadWorker); the deterministic simulation (tests/raft/fakes.py) passes in-memory ones, so the
proof runs the same driver that ships.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Awaitable, Callable
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

    #: Whether the last sync was fast: a write of one entry is then made on the event loop.
    syncs_fast: bool

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

    def active_peers(self) -> int:
        """How many other members the node is connected to now (etcd's rafthttp ActivePeers):
        the node waits for them before it fast-forwards its first election (RaftNode.start)."""
        ...

    async def close(self) -> None: ...


class Timer(Protocol):
    def cancel(self) -> Any: ...


class Clock(Protocol):
    """Time as the node sees it: timeouts and the tick. No wall clock: the time a request
    carries is stamped by the API layer before the node sees its bytes."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> Awaitable[None]: ...

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer: ...


class Worker(Protocol):
    """One thread of work, in submission order (the log writer; the apply thread)."""

    def run(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]: ...

    def shutdown(self) -> None: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> Awaitable[None]:
        return asyncio.sleep(seconds)

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer:
        return asyncio.get_running_loop().call_later(delay, fn, *args)


class ThreadWorker:
    """One thread running jobs in submission order; ``run`` returns a loop future for the call.

    Cheaper than an executor on the path of every write: no concurrent.futures.Future between
    the thread and the loop, and one wake-up of the loop for all the results (and ``call_soon``
    callbacks) that finish before the loop gets to them, instead of one each.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, Callable[..., Any], tuple[Any, ...],
                                            asyncio.Future[Any] | None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._ready: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []  # for the loop, in order
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._jobs.put((loop, fn, args, fut))
        return fut

    def call_soon(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
        """From the worker's thread: runs ``fn(*args)`` on the loop, in order with the results."""
        with self._lock:
            self._ready.append((fn, args))
            if len(self._ready) > 1:
                return  # the loop is woken already and takes this one with the others
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for fn, args in ready:
            fn(*args)

    def _main(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, fn, args, fut = job
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                self.call_soon(loop, _set_exception, fut, exc)
            else:
                self.call_soon(loop, _set_result, fut, result)
            del job, fn, args, fut

    def shutdown(self) -> None:
        """Runs the jobs already submitted, then ends the thread."""
        self._jobs.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()


def _set_result(fut: asyncio.Future[Any], result: Any) -> None:
    if not fut.done():
        fut.set_result(result)


def _set_exception(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
