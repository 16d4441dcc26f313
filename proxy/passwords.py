"""bcrypt for the proxy: hashing (UserAdd, UserChangePassword) and checking (Authenticate).

bcrypt costs ~50-100 ms of CPU at cost 10 and releases the GIL, so it runs on a thread pool:
N workers check N passwords at once and the event loop never blocks. The wait for a worker is
bounded: with ``queue_limit`` jobs already waiting, a new one is refused at once with etcd's
``too many requests`` instead of queueing for ever. Checks and hashing have separate pools and
bounds. A client (an address) may use every idle worker; waiting jobs are served round-robin
between addresses, and a full queue makes room for an address holding less than its share
(raftgate/fair_lane.py). Passwords never leave this module other than as hashes, and are never
logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import time
from collections.abc import Callable
from typing import TypeVar

import bcrypt

from proxy import metrics
from raftgate.errors import Err, EtcdError
from raftgate.fair_lane import FairLane
from raftgate.password_file import BCRYPT_MAX_BYTES

T = TypeVar("T")

DEFAULT_COST = 10
MIN_COST = 4
MAX_COST = 31
_DUMMY_PASSWORD = b"raftgate: no such user"


#: Default bound of jobs waiting for a worker, per worker.
QUEUE_PER_WORKER = 4
#: Workers of the administrative lane (UserAdd, UserChangePassword: rare, and never anonymous).
ADMIN_WORKERS = 1
#: A stored hash longer than this is no bcrypt hash (those are 60 bytes) and never matches.
MAX_HASH_BYTES = 64
#: The input one waiting job holds at most: the bytes of a password bcrypt reads, and a hash.
MAX_JOB_BYTES = BCRYPT_MAX_BYTES + MAX_HASH_BYTES


def peer_host(peer: str) -> str:
    """The client a gRPC peer string names, without its port (``ipv4:10.0.0.7:5123`` ->
    ``ipv4:10.0.0.7``; every Unix socket client is ``unix``): opening more connections does not
    make one client more peers."""
    if peer.startswith("unix"):
        return "unix"
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() else peer


class PasswordHasher:
    """Two lanes, each with its own workers and admission: password checks (Authenticate, open to
    anyone) and hashing (UserAdd, UserChangePassword), so a flood of logins never refuses or
    delays root's administration; within a lane, addresses share the workers by turns."""

    def __init__(self, cost: int = DEFAULT_COST, workers: int = 1, queue_limit: int | None = None) -> None:
        """``queue_limit``: jobs that may wait for a free worker, per lane (default QUEUE_PER_WORKER
        per worker)."""
        self.cost = cost
        workers = max(1, workers)
        self.queue_limit = QUEUE_PER_WORKER * workers if queue_limit is None else max(0, queue_limit)
        self._check = FairLane("bcrypt", workers, self.queue_limit, MAX_JOB_BYTES)
        self._admin = FairLane("bcrypt-admin", ADMIN_WORKERS, self.queue_limit, MAX_JOB_BYTES)
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
        return await self._run("check", _bounded_checkpw, *_check_input(password, _normalize(stored_hash)), peer=peer)

    async def check_dummy(self, password: str, decoy: bytes = b"", *, peer: str = "") -> None:
        """Spends the time of a real check, for unknown users (no user enumeration by timing).

        ``decoy``: the store's stand-in hash, at the cost the users' hashes actually have; without
        a well-formed one, the proxy's own (at ``--bcrypt-cost``).
        """
        hashed = decoy if _is_bcrypt_hash(decoy) else self._dummy_hash
        await self._run("check", _bounded_checkpw, *_check_input(password, hashed), peer=peer)

    async def _run(self, operation: metrics.BcryptOperation, fn: Callable[..., T], *args: object,
                   peer: str = "") -> T:
        """Runs ``fn`` on the operation's lane, counted in the queue-depth gauge until a worker
        picks it up. ``peer``: the client (``peer_host``), "" for the proxy's own jobs.

        Raises EtcdError TOO_MANY_REQUESTS when the lane's queue is full (at once), or when a job
        of an address holding less of the queue takes this one's waiting place (later).
        """

        depth = metrics.BCRYPT_QUEUE_DEPTH.labels(operation)
        picked_up = False

        def timed() -> T:
            nonlocal picked_up
            picked_up = True
            depth.dec()
            started = time.perf_counter()
            try:
                return fn(*args)
            finally:
                metrics.BCRYPT_DURATION.labels(operation).observe(time.perf_counter() - started)

        def uncount(_f: concurrent.futures.Future[T]) -> None:
            """A job that never ran (refused from the queue, cancelled) is still in the gauge."""
            if not picked_up:
                depth.dec()

        lane = self._admin if operation == "hash" else self._check
        nbytes = sum(len(a) for a in args if isinstance(a, bytes))
        depth.inc()
        try:
            future = lane.submit(peer, timed, nbytes)
        except BaseException:
            depth.dec()
            raise
        future.add_done_callback(uncount)
        return await asyncio.wrap_future(future)

    @property
    def pending(self) -> int:
        """Jobs on the pools, running or waiting."""
        return self._check.pending + self._admin.pending

    def close(self) -> None:
        for lane in (self._check, self._admin):
            lane.close()


def _check_input(password: str, hashed: bytes) -> tuple[bytes, bytes, bool]:
    """What a check needs, and no more, so a waiting check holds at most MAX_JOB_BYTES: the
    password's first 72 bytes (all bcrypt reads: Go's bcrypt ignores the rest when comparing),
    the hash's first MAX_HASH_BYTES, and whether that was all of it (a longer one is no bcrypt
    hash: it never matches, but costs the check's time as before)."""
    return password.encode("utf-8")[:BCRYPT_MAX_BYTES], hashed[:MAX_HASH_BYTES], len(hashed) <= MAX_HASH_BYTES


def _bounded_checkpw(raw: bytes, hashed: bytes, whole: bool) -> bool:
    return _checkpw(raw, hashed) and whole


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
