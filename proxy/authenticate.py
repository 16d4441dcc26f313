"""Authenticate, outside consensus: the password is checked in the proxy, the token is committed.

1. Store.Credentials: a linearizable read of the user's hash and flags and the auth revision R.
2. bcrypt on the worker pool (an unknown user still pays for one check, against the store's decoy
   hash at the users' own bcrypt cost: no enumeration by timing).
3. Store.Do(authenticate{name, prefix, checked_revision=R, ...}): the apply stage refuses it
   (ABORTED "raftgate: auth revision moved") if the auth revision moved since step 1, because the
   password may have changed meanwhile; the proxy then starts again, as etcd does, until the
   client's deadline (or DEFAULT_DEADLINE) passes: then etcd's `request timed out`.
4. Simple: the store's answer carries the token. JWT: the proxy signs {username, revision=R, exp}.

Lockout (authstore/state/auth/lockout.py) is the store's: a failed check, of a name that exists or
not, is recorded in the log (proxy/lockout.py) before the answer, when the store counts them; a
locked name (Credentials says so; apply refuses its authenticate entry too, should the lock come
in between) gets the wrong-password answer. Either way the caller sees one answer after one
bcrypt check and one log entry, and a verify-only proxy tells nothing of a locked name either.
``--auth-rate-limit`` bounds the calls a second of each client (etcd's ``too many requests``
beyond it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NoReturn

import grpc
import grpc.aio

from protos import wire
from protos.etcdserverpb import raft_internal_pb2, rpc_pb2
from protos.internal import AUTHENTICATE_FIELD
from proxy import metrics
from proxy.audit import handlers as audit
from proxy.lockout import FailureRecorder, RateLimiter
from proxy.passwords import PasswordHasher
from proxy.store_client import StoreClient
from proxy.tokens.jwt import JwtProvider
from raftgate.errors import REVISION_MOVED, Err, EtcdError, from_message
from raftgate.lockout_names import unknown_name_record
from raftgate.simple_token import generate_prefix

log = logging.getLogger(__name__)

#: How long Authenticate keeps retrying under auth churn when the client set no deadline.
DEFAULT_DEADLINE = 10.0


def is_revision_moved(error: grpc.aio.AioRpcError) -> bool:
    return error.code() == grpc.StatusCode.ABORTED and REVISION_MOVED in (error.details() or "")


#: the store's refusal of a sidecar's Authenticate -> the metrics result it counts as
_RESULTS: dict[Err, metrics.AuthResult] = {Err.AUTH_FAILED: "auth_failed", Err.AUTH_NOT_ENABLED: "not_enabled",
                                           Err.NO_PASSWORD_USER: "no_password", Err.VERIFY_ONLY: "verify_only",
                                           Err.TIMEOUT: "revision_retry_exhausted"}


class _Refused(Exception):
    """An Authenticate refusal and the metrics result it counts as (the client sees only ``err``)."""

    def __init__(self, err: Err, result: metrics.AuthResult) -> None:
        super().__init__(err.message)
        self.err = err
        self.result = result


class Authenticator:
    def __init__(
        self,
        store: StoreClient,
        hasher: PasswordHasher,
        *,
        jwt: JwtProvider | None,
        simple_ttl_seconds: int | None,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        default_deadline: float = DEFAULT_DEADLINE,
        rate_limit: float = 0.0,
        sidecar: bool = False,
    ) -> None:
        """``jwt`` set -> JWT tokens; else ``simple_ttl_seconds`` set -> simple tokens; else no tokens.

        ``default_deadline``: seconds of revision-moved retries when the client gave no deadline.
        ``rate_limit``: Authenticate calls a second per client peer (0: no limit).
        """
        self._store = store
        self._hasher = hasher
        self._jwt = jwt
        self._simple_ttl = simple_ttl_seconds
        self._clock_ms = clock_ms
        self.default_deadline = default_deadline
        self.failures = FailureRecorder(store)
        self._rate = RateLimiter(rate_limit) if rate_limit > 0 else None
        #: sidecar mode: the store checks the password and issues the token (no hashes here)
        self._sidecar = sidecar

    async def authenticate(self, request: rpc_pb2.AuthenticateRequest, timeout: float | None = None, *,
                           peer: str = "") -> bytes:
        """The serialized AuthenticateResponse, or EtcdError / AioRpcError. ``peer``: the client
        (``passwords.peer_host``) whose turn in the bcrypt queue the check takes."""
        try:
            if self._rate is not None and peer and not self._rate.allow(peer):
                raise _Refused(Err.TOO_MANY_REQUESTS, "rate_limited")
            if self._sidecar:
                answer = await self._by_store(request, timeout)
            else:
                answer = await self._authenticate(request.name, request.password, timeout, peer)
        except _Refused as e:
            metrics.authentication(e.result)
            raise EtcdError(e.err) from None
        except Exception:
            metrics.authentication("error")
            raise
        metrics.authentication("ok")
        return answer

    async def _by_store(self, request: rpc_pb2.AuthenticateRequest, timeout: float | None) -> bytes:
        """Sidecar mode: the store does all of Authenticate; its refusals are etcd's."""
        try:
            return await self._store.authenticate(request.SerializeToString(),
                                                  timeout if timeout is not None else self.default_deadline)
        except grpc.aio.AioRpcError as e:
            err = from_message(e.details() or "")
            if err is not None and err.code == e.code():
                raise _Refused(err, _RESULTS.get(err, "error")) from None
            raise

    async def _authenticate(self, name: str, password: str, timeout: float | None, peer: str) -> bytes:
        deadline = time.monotonic() + (timeout if timeout is not None else self.default_deadline)
        attempt = 0
        while True:
            if attempt:
                metrics.AUTHENTICATE_REVISION_RETRIES.inc()
            attempt += 1
            try:
                checked_revision = await self._check_password(name, password, deadline - time.monotonic(), peer)
                return await self._commit(name, checked_revision, deadline - time.monotonic())
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and timeout is None:
                    # the proxy's own bound, not the client's: etcd's answer when its context ends
                    raise _Refused(Err.TIMEOUT, "error") from None
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details() == Err.AUTH_FAILED.message:
                    raise _Refused(Err.AUTH_FAILED, "auth_failed") from None  # e.g. the name is locked out
                if not is_revision_moved(e):
                    raise
            if time.monotonic() >= deadline:
                # etcd retries until the request's context ends, then answers "request timed out".
                log.info("auth revision kept moving during Authenticate (%d attempts); giving up", attempt)
                raise _Refused(Err.TIMEOUT, "revision_retry_exhausted")
            log.info("auth revision moved during Authenticate; retrying")

    async def _check_password(self, name: str, password: str, timeout: float | None, peer: str) -> int:
        creds = await self._store.credentials(name, timeout)
        if not creds.auth_enabled:
            raise _Refused(Err.AUTH_NOT_ENABLED, "not_enabled")
        if creds.locked:
            audit.noted_locked()  # the operator's record says so; the caller's answer does not
        if not creds.found:
            await self._hasher.check_dummy(password, creds.password_hash, peer=peer)
            await self._failed(unknown_name_record(name), creds.lockout)
        if creds.no_password:
            raise _Refused(Err.NO_PASSWORD_USER, "no_password")
        if not await self._hasher.check(password, creds.password_hash, peer=peer) or creds.locked:
            await self._failed(name, creds.lockout)  # locked: the right password fails too
        if self._jwt is not None and self._jwt.verify_only:
            raise _Refused(Err.VERIFY_ONLY, "verify_only")
        if self._jwt is None and self._simple_ttl is None:
            # --auth-token "": etcd's nop provider issues nothing
            raise _Refused(Err.AUTH_FAILED, "no_token_provider")
        return creds.auth_revision

    async def _failed(self, name: str, lockout: bool) -> NoReturn:
        """A failed check: counted by the store's lockout (when on), then the wrong-password answer."""
        if lockout:
            await self.failures.record(name)
        raise _Refused(Err.AUTH_FAILED, "auth_failed")

    async def _commit(self, name: str, checked_revision: int, timeout: float | None) -> bytes:
        simple = self._jwt is None
        entry = raft_internal_pb2.InternalAuthenticateRequest(
            name=name,
            simple_token=generate_prefix() if simple else "",
            checked_revision=checked_revision,
            issued_at_unix_ms=self._clock_ms(),
            ttl_seconds=(self._simple_ttl or 0) if simple else 0,
        )
        data = wire.build_internal_request(None, AUTHENTICATE_FIELD, entry.SerializeToString())
        answer = wire.unwrap_field(await self._store.do(data, timeout), AUTHENTICATE_FIELD)
        if simple:
            return answer
        assert self._jwt is not None
        response = rpc_pb2.AuthenticateResponse.FromString(answer)
        response.token = self._jwt.sign(name, checked_revision)
        return response.SerializeToString()
