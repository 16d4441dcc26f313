"""A bounded worker lane shared fairly between client addresses (bcrypt in the proxy and the store).

Why this shape: bcrypt is slow on purpose, so its work is bounded; but capping each address at a
share of the lane refused a client that was alone (a sidecar, whose only client is its own pod on
127.0.0.1, could never use the whole lane, and its refused clients retried into a storm). Here:

* a job starts at once on any idle worker, whoever sends it: one address may use every worker;
* when every worker is busy, jobs wait in one queue per address, and a freed worker takes the
  next job round-robin between the addresses waiting: an address gets its turn however many jobs
  another one has queued, so shares are kept by the order of service, not by refusals;
* at most ``waiting_limit`` jobs wait in all (each holding at most ``max_job_bytes`` of input):
  a job arriving at a full queue is refused with etcd's ``too many requests``, unless its address
  holds fewer waiting places than the address holding the most, less one: then that address's
  newest waiting job is refused instead and the new one takes its place. A flood from one address
  can therefore fill an idle queue, but never keep another address out of its share.

Every structure here is bounded by ``waiting_limit`` (the addresses with waiting jobs included),
and every step under the lock takes constant time, however many addresses wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from raftgate.errors import Err, EtcdError

T = TypeVar("T")


@dataclass(eq=False)
class _Job(Generic[T]):
    peer: str
    fn: Callable[[], T]
    future: Future[T] = field(default_factory=Future)


class FairLane:
    """``workers`` threads; jobs beyond them wait (at most ``waiting_limit``), served round-robin
    between addresses. ``peer``: the client's address ("" for the server's own jobs, which is
    one more address)."""

    def __init__(self, name: str, workers: int, waiting_limit: int, max_job_bytes: int) -> None:
        self.workers = max(1, workers)
        self.waiting_limit = max(0, waiting_limit)
        self.max_job_bytes = max_job_bytes
        self._busy = 0  # workers running a job (or about to)
        self._waiting = 0
        # address -> its waiting jobs, oldest first; the addresses themselves in the order they
        # are served (a served address goes to the back while it has more waiting)
        self._queues: OrderedDict[str, OrderedDict[_Job[Any], None]] = OrderedDict()
        # waiting jobs an address holds -> the addresses holding that many; and the most any holds
        self._by_count: dict[int, dict[str, None]] = {}
        self._most = 0
        self._lock = threading.Lock()
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=name)

    @property
    def pending(self) -> int:
        """Jobs running or waiting."""
        with self._lock:
            return self._busy + self._waiting

    @property
    def waiting(self) -> int:
        with self._lock:
            return self._waiting

    def submit(self, peer: str, fn: Callable[[], T], nbytes: int = 0) -> Future[T]:
        """Starts ``fn`` on an idle worker or queues it; its Future ends with its result, or with
        EtcdError TOO_MANY_REQUESTS if a later job from a fairer-served address took its place.

        Raises EtcdError TOO_MANY_REQUESTS when the queue is full (see the module's docstring),
        ValueError for a job bigger than ``max_job_bytes``, RuntimeError once closed.
        """
        if nbytes > self.max_job_bytes:
            raise ValueError(f"a job of {nbytes} bytes is over the lane's {self.max_job_bytes}")
        job: _Job[T] = _Job(peer, fn)
        displaced: _Job[Any] | None = None
        with self._lock:
            if self._closed:
                raise RuntimeError("the lane is closed")
            if self._busy < self.workers:
                self._busy += 1
                start = True
            else:
                start = False
                if self._waiting >= self.waiting_limit:
                    displaced = self._displace_for(peer)  # raises when the newcomer has its share
                self._enqueue(job)
        if displaced is not None:
            with contextlib.suppress(InvalidStateError):  # its caller gave up meanwhile
                displaced.future.set_exception(EtcdError(Err.TOO_MANY_REQUESTS))
        if start:
            self._start(job)
        else:
            job.future.add_done_callback(lambda f: self._forget_if_cancelled(job))
        return job.future

    async def run(self, peer: str, fn: Callable[[], T], nbytes: int = 0) -> T:
        """``submit`` from a coroutine; a caller that gives up (cancelled) frees its waiting place."""
        return await asyncio.wrap_future(self.submit(peer, fn, nbytes))

    def close(self) -> None:
        """Waiting jobs are cancelled; running ones finish on their threads."""
        with self._lock:
            self._closed = True
            jobs = [job for queue in self._queues.values() for job in queue]
            self._queues.clear()
            self._by_count.clear()
            self._most = self._waiting = 0
        for job in jobs:
            job.future.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- under the lock: every step O(1), whatever the number of addresses and jobs -------------

    def _enqueue(self, job: _Job[Any]) -> None:
        queue = self._queues.get(job.peer)
        if queue is None:
            queue = self._queues[job.peer] = OrderedDict()
        queue[job] = None
        self._counted(job.peer, len(queue) - 1, len(queue))

    def _displace_for(self, peer: str) -> _Job[Any]:
        """The newest waiting job of an address holding the most waiting places, taken out of the
        queue for ``peer``'s new job; EtcdError TOO_MANY_REQUESTS if ``peer`` already holds as
        many as that address, less one (or there is no waiting place at all)."""
        own = len(self._queues.get(peer, ()))
        if self._most <= own + 1:
            raise EtcdError(Err.TOO_MANY_REQUESTS)
        victim = next(iter(self._by_count[self._most]))
        job, _ = self._queues[victim].popitem(last=True)
        self._dequeued(victim)
        return job

    def _next(self) -> _Job[Any] | None:
        """The job a freed worker runs next (round-robin between addresses), or None: idle."""
        if not self._queues:
            self._busy -= 1
            return None
        peer = next(iter(self._queues))
        job, _ = self._queues[peer].popitem(last=False)
        self._dequeued(peer)
        if peer in self._queues:
            self._queues.move_to_end(peer)  # its next job after every other address's
        return job

    def _dequeued(self, peer: str) -> None:
        """A job of ``peer`` left its queue."""
        left = len(self._queues[peer])
        if not left:
            del self._queues[peer]
        self._counted(peer, left + 1, left)

    def _counted(self, peer: str, before: int, after: int) -> None:
        self._waiting += after - before
        if before:
            holders = self._by_count[before]
            del holders[peer]
            if not holders:
                del self._by_count[before]
        if after:
            self._by_count.setdefault(after, {})[peer] = None
        self._most = max(self._most, after)
        while self._most and self._most not in self._by_count:
            self._most -= 1  # counts move by one: one step

    # --- outside the lock -----------------------------------------------------------------------

    def _forget_if_cancelled(self, job: _Job[Any]) -> None:
        """A waiting job whose caller gave up leaves the queue at once (its place is free)."""
        if not job.future.cancelled():
            return
        with self._lock:
            queue = self._queues.get(job.peer)
            if queue is not None and job in queue:
                del queue[job]
                self._dequeued(job.peer)

    def _start(self, job: _Job[Any]) -> None:
        try:
            self._pool.submit(self._work, job)
        except RuntimeError:  # shut down meanwhile
            with self._lock:
                self._busy -= 1
            job.future.cancel()
            raise

    def _work(self, job: _Job[Any] | None) -> None:
        """A worker's turn: runs the job, then whatever waits next, until nothing does."""
        while job is not None:
            ran = job.future.set_running_or_notify_cancel()
            if ran:
                try:
                    result, error = job.fn(), None
                except BaseException as e:  # handed to the caller, as an executor does
                    result, error = None, e
            with self._lock:  # the place is free before the caller hears: ``pending`` agrees
                done, job = job, self._next()
            if ran:
                if error is None:
                    done.future.set_result(result)
                else:
                    done.future.set_exception(error)
