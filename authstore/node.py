"""The driver between requests, the log and the apply stage, for a single store node.

It has the shape the Raft driver will take: proposals are queued, cut into batches, made durable
with one fsync per batch (group commit), then applied in log order on one thread; a proposer is
answered only after its entry is durable and applied. While one batch is being written and
applied, the next one fills up, so throughput grows with concurrency.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from authstore.log.wal import WAL, Entry

log = logging.getLogger("raftgate.store.node")

MAX_BATCH = 1024
# LMDB is synced (and log segments released) after this many applied entries.
SYNC_EVERY = 20_000

ApplyBatch = Callable[[Sequence[Entry]], list[Any]]


class Node:
    def __init__(self, wal: WAL, apply_batch: ApplyBatch, applied_index: int, sync: Callable[[], None],
                 term: int = 1) -> None:
        self.wal = wal
        self._apply_batch = apply_batch
        self._sync = sync
        self.term = max(term, wal.last_term, 1)
        self.applied_index = applied_index
        self._synced_index = applied_index
        self._queue: asyncio.Queue[tuple[bytes, asyncio.Future[Any]]] = asyncio.Queue()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="apply")
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def last_index(self) -> int:
        return self.wal.last_index

    def replay(self) -> int:
        """Applies durable entries the store has not applied yet (after a crash); returns how many."""
        pending = [e for e in self.wal.entries_from(self.applied_index + 1)]
        for start in range(0, len(pending), MAX_BATCH):
            chunk = pending[start:start + MAX_BATCH]
            self._apply_batch(chunk)
            self.applied_index = chunk[-1].index
        if pending:
            log.info("replayed %d log entries up to index %d", len(pending), self.applied_index)
        return len(pending)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="node-driver")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.get_running_loop().run_in_executor(self._pool, self._final_sync)
        self._pool.shutdown(wait=True)
        self.wal.close()

    def _final_sync(self) -> None:
        self._sync()

    async def propose(self, data: bytes) -> Any:
        """Puts data into the log; returns the apply stage's result once it is durable and applied."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self._queue.put((data, fut))
        return await fut

    async def read_index(self) -> int:
        """The index a linearizable read must wait for.

        A single node answers a proposer only after applying its entry, so everything acknowledged
        is already applied: the applied index is a valid read point. Raft replaces this with
        ReadIndex.
        """
        return self.applied_index

    async def wait_applied(self, index: int) -> None:
        if self.applied_index >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((index, fut))
        await fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            first = self.wal.last_index + 1
            entries = [Entry(first + i, self.term, data) for i, (data, _) in enumerate(batch)]
            try:
                results = await loop.run_in_executor(self._pool, self._persist_and_apply, entries)
            except Exception as exc:  # a disk failure: nothing in this batch may be acknowledged
                log.critical("log write or apply failed: %s", exc)
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                raise
            self.applied_index = entries[-1].index
            for (_, fut), result in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(result)
            self._wake_waiters()

    def _persist_and_apply(self, entries: list[Entry]) -> list[Any]:
        self.wal.append(entries)
        results = self._apply_batch(entries)
        last = entries[-1].index
        if last - self._synced_index >= SYNC_EVERY:
            self._sync()
            self.wal.release(last)
            self._synced_index = last
        return results

    def _wake_waiters(self) -> None:
        keep = []
        for index, fut in self._waiters:
            if index <= self.applied_index:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((index, fut))
        self._waiters = keep
