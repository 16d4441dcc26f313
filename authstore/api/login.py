"""Authenticate for sidecar-class callers: the store checks the password itself.

A sidecar may not read password hashes (``Credentials``) nor propose an ``authenticate`` entry
(that registers a token for whatever name it carries: a password check the store cannot see is
one a sidecar could skip). It forwards the client's name and password; here, as a central proxy
does it (proxy/authenticate.py): a linearizable read of the user's hash and the auth revision R,
bcrypt on a bounded thread pool (never on the event loop, never in apply), then the same
``authenticate`` entry, which apply refuses if R moved (then again, until the deadline). Simple
tokens are registered by apply as today; JWTs are signed here with the store's private key, so
sidecars hold only public keys (or none).

Lockout is the same as through a central proxy: a failed check (a name that exists or not, or a
locked name with the right password) is put in the log as an ``auth_failures`` entry before the
answer, and a locked name gets the wrong-password answer; so failures spread over sidecars and
central proxies count toward one replicated lock.

Only a node that can put a failure into the log checks a password: the leader. Any other node
answers `not leader` (or `no leader`, `server stopped`) before it reads or checks anything, which
the sidecar's store client takes as "never taken" and sends to the leader; so a guess sent to a
follower (a stale leader guess, or a caller with the sidecar credential) is counted as one sent
to the leader, and the bcrypt work of sidecar logins stays on the leader's bounded lane. A failure
whose entry still cannot be logged (the node stopped leading meanwhile, the proposal timed out)
gets the store's error, never the wrong-password answer: the right password meets the same error
there (its ``authenticate`` entry fails the same way), so the answer tells nothing uncounted.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import bcrypt
from google.protobuf.message import DecodeError

from authstore.state.apply import AuthRevisionMoved
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from protos.storepb import store_pb2 as spb
from raftgate.errors import Err, EtcdError
from raftgate.fair_lane import FairLane
from raftgate.lockout_names import unknown_name_record
from raftgate.password_file import BCRYPT_MAX_BYTES
from raftgate.simple_token import generate_prefix
from raftgate.token_verifier import JwtKeys

QUEUE_PER_WORKER = 4
#: a stored hash longer than this is no bcrypt hash (those are 60 bytes): it never matches, and
#: a waiting check keeps only this much of it
MAX_HASH_BYTES = 64
DEADLINE_SECONDS = 10.0
_DUMMY_PASSWORD = b"raftgate: no such user"


class BcryptLane:
    """``workers`` threads and QUEUE_PER_WORKER waiting places per worker, shared between
    sidecar addresses by turns (raftgate/fair_lane.py): one sidecar alone may use the whole pool,
    waiting checks are served round-robin between addresses, and a full queue answers etcd's
    ``too many requests`` (making room for an address holding less than its share)."""

    def __init__(self, workers: int) -> None:
        self.lane = FairLane("bcrypt", workers, max(1, workers) * QUEUE_PER_WORKER,
                             BCRYPT_MAX_BYTES + MAX_HASH_BYTES)

    async def check(self, password: bytes, hashed: bytes, peer: str) -> bool:
        """Raises EtcdError TOO_MANY_REQUESTS when the queue is full (see FairLane)."""
        password = password[:BCRYPT_MAX_BYTES]  # all bcrypt reads: a waiting check holds no more
        whole, hashed = len(hashed) <= MAX_HASH_BYTES, hashed[:MAX_HASH_BYTES]  # longer: never matches
        return await self.lane.run(peer, lambda: _checkpw(password, hashed) and whole, len(password) + len(hashed))

    def close(self) -> None:
        self.lane.close()


def _checkpw(password: bytes, hashed: bytes) -> bool:
    if not hashed.startswith(b"$2"):
        return False
    try:
        return bcrypt.checkpw(password[:BCRYPT_MAX_BYTES], hashed)  # Go's bcrypt ignores bytes past 72
    except ValueError:
        return False


class StoreLogin:
    def __init__(self, credentials: Callable[[bytes], Awaitable[bytes]], commit: Callable[[bytes], Awaitable[Any]],
                 *, lead: Callable[[], Awaitable[None]], jwt: JwtKeys | None, simple_ttl_seconds: int,
                 workers: int, cost: int, record_failure: Callable[[str], Awaitable[None]] | None = None,
                 clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> None:
        self._credentials = credentials
        self._commit = commit
        #: returns if this node may take a login now (it leads), else raises the store's error
        self._lead = lead
        self._jwt = jwt
        self._simple_ttl = simple_ttl_seconds
        self._clock_ms = clock_ms
        self._lane = BcryptLane(workers)
        self._cost = cost
        self._dummy: bytes | None = None
        #: puts one failed check in the log (lockout); None: failures are not counted
        self._record_failure = record_failure

    async def authenticate(self, data: bytes, peer: str) -> bytes:
        """AuthenticateRequest bytes -> AuthenticateResponse bytes, or EtcdError (etcd's answers;
        a failure that could not be logged: the store's error, as ``record_failure`` raised it)."""
        await self._lead()  # before anything is read or checked: see the module's docstring
        try:
            req = pb.AuthenticateRequest.FromString(data)
        except DecodeError:
            raise EtcdError(Err.AUTH_FAILED) from None
        deadline = time.monotonic() + DEADLINE_SECONDS
        while True:
            revision = await self._check(req.name, req.password.encode("utf-8"), peer)
            try:
                return await self._issue(req.name, revision)
            except AuthRevisionMoved:
                if time.monotonic() >= deadline:
                    raise EtcdError(Err.TIMEOUT) from None
            await self._lead()  # the next check too: leadership may have moved meanwhile

    async def _check(self, name: str, password: bytes, peer: str) -> int:
        creds = spb.CredentialsResponse.FromString(await self._credentials(
            spb.CredentialsRequest(name=name).SerializeToString()))
        if not creds.auth_enabled:
            raise EtcdError(Err.AUTH_NOT_ENABLED)
        if not creds.found:
            await self._lane.check(password, creds.password_hash or await self._dummy_hash(), peer)
            await self._failed(unknown_name_record(name), creds.lockout)
        if creds.no_password:
            raise EtcdError(Err.NO_PASSWORD_USER)
        if not await self._lane.check(password, creds.password_hash, peer) or creds.locked:
            await self._failed(name, creds.lockout)  # locked: the right password fails too
        if self._jwt is not None and not self._jwt.can_sign:
            raise EtcdError(Err.VERIFY_ONLY)
        return creds.auth_revision

    async def _failed(self, name: str, lockout: bool) -> NoReturn:
        """A failed check: counted by the lockout (when on), then the wrong-password answer. Not
        counted: ``record_failure`` raises the store's error, and that is the answer."""
        if lockout and self._record_failure is not None:
            await self._record_failure(name)
        raise EtcdError(Err.AUTH_FAILED)

    async def _dummy_hash(self) -> bytes:
        if self._dummy is None:
            self._dummy = await self._lane.lane.run(
                "", lambda: bcrypt.hashpw(_DUMMY_PASSWORD, bcrypt.gensalt(self._cost, prefix=b"2a")))
        return self._dummy

    async def _issue(self, name: str, revision: int) -> bytes:
        simple = self._jwt is None
        entry = ipb.InternalAuthenticateRequest(
            name=name, simple_token=generate_prefix() if simple else "", checked_revision=revision,
            issued_at_unix_ms=self._clock_ms(), ttl_seconds=self._simple_ttl if simple else 0)
        response: pb.AuthenticateResponse = await self._commit(
            ipb.InternalRaftRequest(authenticate=entry).SerializeToString())
        if not simple:
            assert self._jwt is not None
            response.token = self._jwt.sign(name, revision)
        return response.SerializeToString()

    def close(self) -> None:
        self._lane.close()
