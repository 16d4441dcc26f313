"""bcrypt for the proxy: hashing (UserAdd, UserChangePassword) and checking (Authenticate).

bcrypt costs ~50-100 ms of CPU at cost 10 and releases the GIL, so it runs on a thread pool:
N workers check N passwords at once and the event loop never blocks. The wait for a worker is
bounded: with ``queue_limit`` jobs already waiting, a new one is refused at once with etcd's
``too many requests`` instead of queueing for ever. Checks and hashing have separate pools and
bounds, and one client may hold only part of each. Passwords never leave this module other than
as hashes, and are never logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import bcrypt
from prometheus_client import Gauge

from proxy import metrics
from raftgate.errors import Err, EtcdError

T = TypeVar("T")

DEFAULT_COST = 10
MIN_COST = 4
MAX_COST = 31
BCRYPT_MAX_BYTES = 72
_DUMMY_PASSWORD = b"raftgate: no such user"


#: Default bound of jobs waiting for a worker, per worker.
QUEUE_PER_WORKER = 4
#: Share of a lane's places (running + waiting) one peer may hold at once.
PEER_SHARE = 0.5
#: Workers of the administrative lane (UserAdd, UserChangePassword: rare, and never anonymous).
ADMIN_WORKERS = 1


def peer_host(peer: str) -> str:
    """The client a gRPC peer string names, without its port (``ipv4:10.0.0.7:5123`` ->
    ``ipv4:10.0.0.7``; every Unix socket client is ``unix``): opening more connections does not
    make one client more peers."""
    if peer.startswith("unix"):
        return "unix"
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() else peer


class _Lane:
    """One bounded admission: ``workers`` threads, at most ``capacity`` jobs running or waiting,
    at most ``per_peer`` of them from one peer (jobs without a peer only count toward the total)."""

    def __init__(self, name: str, workers: int, queue_limit: int) -> None:
        self.capacity = workers + queue_limit
        self.per_peer = max(1, int(self.capacity * PEER_SHARE + 0.5))
        self.pending = 0  # submitted and not finished; changed on the loop and in done callbacks
        self._by_peer: dict[str, int] = {}
        self._lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    def admit(self, peer: str) -> None:
        """Takes a place, or raises EtcdError TOO_MANY_REQUESTS."""
        with self._lock:
            held = self._by_peer.get(peer, 0)
            if self.pending >= self.capacity or (peer and held >= self.per_peer):
                raise EtcdError(Err.TOO_MANY_REQUESTS)
            self.pending += 1
            if peer:
                self._by_peer[peer] = held + 1

    def release(self, peer: str) -> None:
        """A job left the pool (done, failed or cancelled): its place is free again."""
        with self._lock:
            self.pending -= 1
            if peer:
                left = self._by_peer[peer] - 1
                if left:
                    self._by_peer[peer] = left
                else:
                    del self._by_peer[peer]


class PasswordHasher:
    """Two lanes, each with its own workers and admission: password checks (Authenticate, open to
    anyone) and hashing (UserAdd, UserChangePassword), so a flood of logins never refuses or
    delays root's administration; and within a lane no peer holds more than PEER_SHARE of it."""

    def __init__(self, cost: int = DEFAULT_COST, workers: int = 1, queue_limit: int | None = None) -> None:
        """``queue_limit``: jobs that may wait for a free worker, per lane (default QUEUE_PER_WORKER
        per worker)."""
        self.cost = cost
        workers = max(1, workers)
        self.queue_limit = QUEUE_PER_WORKER * workers if queue_limit is None else max(0, queue_limit)
        self._check = _Lane("bcrypt", workers, self.queue_limit)
        self._admin = _Lane("bcrypt-admin", ADMIN_WORKERS, self.queue_limit)
        # Checked against when the user does not exist, so a miss costs the same time as a hit.
        self._dummy_hash = bcrypt.hashpw(_DUMMY_PASSWORD, bcrypt.gensalt(cost, prefix=b"2a"))

    async def hash(self, password: str, *, peer: str = "") -> str:
        """base64 of the bcrypt hash, as etcd puts it into ``hashedPassword``."""
        raw = password.encode("utf-8")
        if len(raw) > BCRYPT_MAX_BYTES:
            raise EtcdError(Err.PASSWORD_TOO_LONG)
        hashed = await self._run("hash", _hashpw, raw, self.cost, peer=peer)
        return base64.b64encode(hashed).decode("ascii")

    async def check(self, password: str, stored_hash: bytes, *, peer: str = "") -> bool:
        """True when ``password`` matches; a malformed or empty stored hash never matches."""
        return await self._run("check", _checkpw, password.encode("utf-8"), _normalize(stored_hash), peer=peer)

    async def check_dummy(self, password: str, decoy: bytes = b"", *, peer: str = "") -> None:
        """Spends the time of a real check, for unknown users (no user enumeration by timing).

        ``decoy``: the store's stand-in hash, at the cost the users' hashes actually have; without
        a well-formed one, the proxy's own (at ``--bcrypt-cost``).
        """
        hashed = decoy if _is_bcrypt_hash(decoy) else self._dummy_hash
        await self._run("check", _checkpw, password.encode("utf-8"), hashed, peer=peer)

    async def _run(self, operation: metrics.BcryptOperation, fn: Callable[..., T], *args: object,
                   peer: str = "") -> T:
        """Runs ``fn`` on the operation's lane, counted in the queue-depth gauge until a worker
        picks it up. ``peer``: the client (``peer_host``), "" for the proxy's own jobs.

        Raises EtcdError TOO_MANY_REQUESTS when the lane is full, or the peer holds its share.
        """

        depth = metrics.BCRYPT_QUEUE_DEPTH.labels(operation)

        def timed() -> T:
            depth.dec()
            started = time.perf_counter()
            try:
                return fn(*args)
            finally:
                metrics.BCRYPT_DURATION.labels(operation).observe(time.perf_counter() - started)

        lane = self._admin if operation == "hash" else self._check
        lane.admit(peer)
        depth.inc()
        try:
            future = lane.pool.submit(timed)
        except RuntimeError:  # the pool is shut down
            depth.dec()
            lane.release(peer)
            raise
        future.add_done_callback(lambda f: _uncount_if_cancelled(f, depth))
        future.add_done_callback(lambda _f: lane.release(peer))
        return await asyncio.wrap_future(future)

    @property
    def pending(self) -> int:
        """Jobs on the pools, running or waiting."""
        return self._check.pending + self._admin.pending

    def close(self) -> None:
        for lane in (self._check, self._admin):
            lane.pool.shutdown(wait=False, cancel_futures=True)


def _uncount_if_cancelled(future: concurrent.futures.Future[object], depth: Gauge) -> None:
    """A job cancelled before a worker took it never ran ``timed``, so it is still in the gauge."""
    if future.cancelled():
        depth.dec()


def _hashpw(raw: bytes, cost: int) -> bytes:
    return bcrypt.hashpw(raw, bcrypt.gensalt(cost, prefix=b"2a"))


def _checkpw(raw: bytes, hashed: bytes) -> bool:
    if not hashed:
        return False
    try:
        # Go's bcrypt ignores bytes past 72 when comparing; do the same instead of raising.
        return bcrypt.checkpw(raw[:BCRYPT_MAX_BYTES], hashed)
    except ValueError:
        return False


def _is_bcrypt_hash(value: bytes) -> bool:
    """``$2a$NN$`` + 53 characters, with a cost bcrypt accepts."""
    if len(value) != 60 or value[:4] not in (b"$2a$", b"$2b$", b"$2y$") or value[6:7] != b"$":
        return False
    cost = value[4:6]
    return cost.isdigit() and MIN_COST <= int(cost) <= MAX_COST


def _normalize(stored: bytes) -> bytes:
    """The store keeps the raw bcrypt hash; tolerate a base64-wrapped one too."""
    if not stored or stored.startswith(b"$2"):
        return stored
    try:
        decoded = base64.b64decode(stored, validate=True)
    except (binascii.Error, ValueError):
        return b""
    return decoded if decoded.startswith(b"$2") else b""
