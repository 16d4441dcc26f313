"""Authenticate's guards in the proxy: failed checks recorded for the store's lockout, and a
per-client rate limit.

The lockout itself is decided by the store (authstore/state/auth/lockout.py), so every proxy and
node agree: the proxy only records each failed password check as an ``auth_failures`` entry.
Failures that happen while one entry is on its way travel together in the next one (as Nagle
does: a lone failure is never held), so a storm of failures costs few log entries.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

from protos import wire
from protos.etcdserverpb import raft_internal_pb2
from proxy.store_client import StoreClient

log = logging.getLogger(__name__)

AUTH_FAILURES_FIELD: int = raft_internal_pb2.InternalRaftRequest.DESCRIPTOR.fields_by_name["auth_failures"].number
#: Names one entry carries at most (the store reads no more: MAX_NAMES_PER_ENTRY there).
MAX_NAMES = 256
#: Bytes of names one entry carries at most (a single longer name travels alone).
MAX_BATCH_BYTES = 64 << 10
RECORD_TIMEOUT = 5.0
#: Clients the rate limiter remembers; beyond it the one seen least recently is forgotten.
MAX_PEERS = 10_000


class FailureRecorder:
    def __init__(self, store: StoreClient, timeout: float = RECORD_TIMEOUT) -> None:
        self._store = store
        self._timeout = timeout
        self._pending: collections.deque[tuple[str, asyncio.Future[None]]] = collections.deque()
        self._sender: asyncio.Task[None] | None = None
        self.entries = 0  # entries sent (tests and the benchmark read it)

    async def record(self, name: str) -> None:
        """Returns once the failure is in the log; raises the store's error when it could not be
        put there: a failure the lockout does not count must not be answered as a wrong password
        (the right password gets that error too, so the caller learns nothing uncounted)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved even if the caller left
        self._pending.append((name, fut))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send())
        await asyncio.shield(fut)

    def _take(self) -> list[tuple[str, asyncio.Future[None]]]:
        batch: list[tuple[str, asyncio.Future[None]]] = []
        size = 0
        while self._pending and len(batch) < MAX_NAMES:
            size += len(self._pending[0][0].encode())
            if batch and size > MAX_BATCH_BYTES:
                break
            batch.append(self._pending.popleft())
        return batch

    async def _send(self) -> None:
        while self._pending:
            batch = self._take()
            entry = raft_internal_pb2.AuthFailuresEntry(names=[name for name, _ in batch])
            data = wire.build_internal_request(None, AUTH_FAILURES_FIELD, entry.SerializeToString())
            error: Exception | None = None
            try:
                self.entries += 1
                await self._store.do(data, self._timeout)
            except Exception as exc:  # each caller gets the store's error, not the wrong-password answer
                log.warning("could not record %d failed Authenticate calls: %s", len(batch), type(exc).__name__)
                error = exc
            for _, fut in batch:
                if not fut.done():
                    if error is None:
                        fut.set_result(None)
                    else:
                        fut.set_exception(error)


class RateLimiter:
    """A token bucket per client (``passwords.peer_host``): ``rate`` calls a second, bursts of
    ``max(1, rate)``; a client not seen for a while starts with a full bucket."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic, max_peers: int = MAX_PEERS) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)
        self._clock = clock
        self._max_peers = max_peers
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def allow(self, peer: str) -> bool:
        now = self._clock()
        tokens, last = self._buckets.pop(peer, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - last) * self.rate)
        allowed = tokens >= 1.0
        if allowed:
            tokens -= 1.0
        self._buckets[peer] = (tokens, now)
        while len(self._buckets) > self._max_peers:
            self._buckets.popitem(last=False)
        return allowed
