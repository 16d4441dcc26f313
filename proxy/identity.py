"""Step 2 of the pipeline: a client's token -> the identity the store will check.

No token -> the anonymous identity ("", 0) (the store answers "user name is empty" if auth is
on). A valid token -> (username, auth revision). An invalid or expired token ->
``invalid auth token`` - unless auth is disabled, in which case etcd ignores tokens entirely, so
the proxy asks the store whether auth is on before refusing. With ``defer_invalid`` the refusal
is left to the store instead (the UNRESOLVED identity): etcd validates a request's shape before
its token, and only the store decodes requests.

A Kubernetes workload token (``--oidc-issuer``: a JWT whose ``iss`` is that issuer) is verified by
:mod:`raftgate.workload_identity` (in a worker thread on a cache miss: it may fetch the issuer's
keys), its ``sub`` mapped to a user; the proxy then asks the store (Credentials, cached for at
most a second per user) whether the user exists and for the current auth revision, and stamps
both, marked revocable like a simple token: after any auth change the store refuses the stale
revision and the proxy resolves again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from protos import wire
from protos.etcdserverpb import rpc_pb2
from protos.internal import AUTH_STATUS_FIELD
from proxy import metrics
from proxy.store_client import StoreClient
from proxy.tokens.jwt import JwtProvider
from proxy.tokens.simple import SimpleTokenCache
from raftgate.errors import Err, EtcdError
from raftgate.simple_token import looks_like_simple_token
from raftgate.token_verifier import fingerprint, unverified_expiry
from raftgate.trust_cache import TrustCache
from raftgate.workload_identity import WorkloadIdentity, WorkloadRefused, WorkloadVerifier

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Identity:
    username: str
    revision: int
    #: The simple token this identity came from; a stale one may be re-resolved.
    simple_token: str | None = None
    #: The token did not resolve: the store refuses with ``invalid auth token`` after validation.
    invalid_token: bool = False
    #: A JWT's ``exp`` (unix seconds): the token dies then, also for the watches made with it.
    expires_at: float | None = None
    #: Sidecar mode: the client's token, forwarded for the store to verify (the name is unknown here).
    forward: str | None = None
    #: The user is a verified client certificate's CN (--client-cert-auth), stamped with the auth
    #: revision last seen: etcd resolves a CN at the current revision, so a stale one is re-resolved.
    certificate: bool = False
    #: The workload token this identity came from; its (user, revision) may be re-resolved.
    workload_token: str | None = None

    @property
    def reresolvable(self) -> bool:
        """Stamped from a cached resolution the store may call old: resolve again and retry."""
        return (self.simple_token is not None or self.workload_token is not None or self.certificate
                or self.forward is not None)


ANONYMOUS = Identity("", 0)
UNRESOLVED = Identity("", 0, invalid_token=True)
#: A workload user's (exists, auth revision) is asked of the store again after this long.
WORKLOAD_USER_FRESH_SECONDS = 1.0
WORKLOAD_USERS_CACHED = 4096
#: the series counted on every request of a cached simple token, looked up once
_SIMPLE_CACHE_HIT = metrics.TOKEN_VALIDATIONS.labels("simple", "cache_hit")


class Resolver:
    """Resolves tokens with the configured provider: simple (store-backed cache) or JWT (local);
    with ``workload``, Kubernetes workload tokens (by their issuer) first."""

    def __init__(self, store: StoreClient, *, jwt: JwtProvider | None, simple: SimpleTokenCache | None,
                 workload: WorkloadVerifier | None = None,
                 sidecar: bool = False) -> None:
        """``sidecar``: resolve nothing; every token is forwarded for the store to verify."""
        self._sidecar = sidecar
        self._store = store
        self._jwt = jwt
        self._simple = simple
        self._workload = workload
        self._inflight: dict[str, asyncio.Task[Identity | None]] = {}
        #: workload user -> the auth revision at which the store had it, for a second (the store
        #: refuses a stale revision itself: time is this entry's only bound)
        self._workload_users: TrustCache[int] = TrustCache(WORKLOAD_USERS_CACHED, clock=time.monotonic)
        #: the store's auth revision as last seen, for certificate identities (None: ask the store)
        self._certificate_revision: int | None = None

    async def resolve(self, token: str | None, timeout: float | None = None, *,
                      defer_invalid: bool = False, fresh: bool = False) -> Identity:
        """The caller's identity; an unusable token raises ``invalid auth token`` (auth on), or
        with ``defer_invalid`` gives UNRESOLVED, for the store to refuse after validating.
        ``fresh``: a simple token is looked up in the store now, never answered from the cache
        (for a check the store cannot repeat at its auth revision, e.g. a watch create)."""
        if token is None:
            return ANONYMOUS
        if self._sidecar:
            # exp read unverified, only to end a watch stream's watches when the token dies
            return Identity("", 0, expires_at=unverified_expiry(token), forward=token)
        if self._workload is not None:
            found = self._workload.cached(token)
            if found is not None or self._workload.is_workload_token(token):
                identity = await self._resolve_workload(token, found, timeout, fresh=fresh)
                if identity is not None:
                    return identity
                if defer_invalid:
                    return UNRESOLVED
                return await self._refuse(token, timeout)
        if self._jwt is not None:
            kid = self._jwt.unknown_kid(token)
            if kid is not None:  # following a JWKS URL: a key the signer added since the last fetch
                await self._jwt.refresh_keys(kid)
            found = self._jwt.verify(token)
            if found is not None:
                return Identity(found.username, found.revision, expires_at=found.expires_at)
        elif self._simple is not None and looks_like_simple_token(token):
            identity = None if fresh else self._cached_simple(token)  # the common case: no await
            if identity is None:
                identity = await (self._lookup(token, timeout) if fresh else self._resolve_simple(token, timeout))
            if identity is not None:
                return identity
        elif self._simple is not None:
            metrics.token_validation("simple", "invalid")
        if defer_invalid:
            log.debug("unresolved auth token %s; the store decides", fingerprint(token))
            return UNRESOLVED
        return await self._refuse(token, timeout)

    def invalidate(self, identity: Identity) -> None:
        """Forget a cached simple-token or workload resolution (the store said its revision is old)."""
        if identity.certificate and identity.revision == self._certificate_revision:
            self._certificate_revision = None
        if self._simple is not None and identity.simple_token is not None:
            self._simple.invalidate(identity.simple_token)
        if identity.workload_token is not None:
            self._workload_users.discard(identity.username)

    async def _resolve_workload(self, token: str, found: WorkloadIdentity | None,
                                timeout: float | None, *, fresh: bool = False) -> Identity | None:
        """A workload token -> (mapped user, current auth revision), or None (refused: the reason
        is logged with the token's fingerprint only)."""
        assert self._workload is not None
        if found is not None:
            metrics.token_validation("workload", "cache_hit")
        else:
            try:
                found = await asyncio.to_thread(self._workload.verify, token)
            except WorkloadRefused as e:
                metrics.token_validation("workload", "expired" if str(e) == "expired" else "invalid")
                log.info("workload token %s refused: %s", fingerprint(token), e)
                return None
            metrics.token_validation("workload", "valid")
        user = found.user
        known = None if fresh else self._workload_users.get(user)
        if known is not None:
            revision = known
        else:
            asked = time.monotonic()
            answer = await self._store.credentials(user, timeout)
            if not answer.auth_enabled:
                return ANONYMOUS
            if not answer.found:
                self._workload_users.discard(user)
                log.info("workload token %s refused: its user %r is not in the auth store", fingerprint(token), user)
                return None
            revision = answer.auth_revision
            self._workload_users.put(user, revision, until=asked + WORKLOAD_USER_FRESH_SECONDS)
        return Identity(user, revision, expires_at=found.expires_at, workload_token=token)

    async def resolve_certificate(self, name: str, timeout: float | None = None) -> Identity:
        """A verified client certificate's CN as the caller (etcd's AuthInfoFromTLS): the user
        ``name`` at the store's current auth revision. The revision is kept from the last answer:
        after an auth change the store refuses it as old without effect, and the caller asks again
        (``invalidate``), so no request pays a store round trip for it otherwise."""
        revision = self._certificate_revision
        if revision is None:
            revision = await self.auth_revision(timeout)
            self._certificate_revision = revision
        return Identity(name, revision, certificate=True)

    def _cached_simple(self, token: str) -> Identity | None:
        """A simple token's cached resolution (counted as a cache hit), or None."""
        assert self._simple is not None
        cached = self._simple.get(token)
        if cached is None:
            return None
        _SIMPLE_CACHE_HIT.inc()
        return Identity(cached.username, cached.revision, token)

    async def _resolve_simple(self, token: str, timeout: float | None) -> Identity | None:
        cached = self._cached_simple(token)
        if cached is not None:
            return cached
        # One store lookup per token at a time, in its own task: concurrent requests share it,
        # and a caller that is cancelled (its client went away) cancels only its own wait.
        pending = self._inflight.get(token)
        if pending is None:
            pending = asyncio.get_running_loop().create_task(self._lookup(token, timeout))
            self._inflight[token] = pending
            pending.add_done_callback(lambda task: self._lookup_done(token, task))
        return await asyncio.shield(pending)

    async def _lookup(self, token: str, timeout: float | None) -> Identity | None:
        assert self._simple is not None
        answer = await self._store.resolve_token(token, timeout)
        if not answer.auth_enabled:
            return ANONYMOUS
        if answer.valid:
            self._simple.put(token, answer.username, answer.auth_revision)
            metrics.token_validation("simple", "valid")
            return Identity(answer.username, answer.auth_revision, token)
        metrics.token_validation("simple", "invalid")
        return None

    def _lookup_done(self, token: str, task: asyncio.Task[Identity | None]) -> None:
        if self._inflight.get(token) is task:
            del self._inflight[token]
        if not task.cancelled():
            task.exception()  # mark retrieved: the waiters (if any) re-raise it themselves

    async def _refuse(self, token: str, timeout: float | None) -> Identity:
        """An unusable token is ignored when auth is off (etcd) and refused when it is on."""
        if not await self.auth_enabled(timeout):
            return ANONYMOUS
        log.info("invalid auth token %s", fingerprint(token))
        raise EtcdError(Err.INVALID_AUTH_TOKEN)

    async def auth_enabled(self, timeout: float | None = None) -> bool:
        """Asks the store (AuthStatus is open to anyone since etcd 3.7)."""
        return (await self._auth_status(timeout)).enabled

    async def auth_revision(self, timeout: float | None = None) -> int:
        """The store's current auth revision (AuthStatus)."""
        return int((await self._auth_status(timeout)).authRevision)

    async def _auth_status(self, timeout: float | None) -> rpc_pb2.AuthStatusResponse:
        data = wire.build_internal_request(wire.encode_header("", 0), AUTH_STATUS_FIELD, b"")
        answer = await self._store.do(data, timeout)
        return rpc_pb2.AuthStatusResponse.FromString(wire.unwrap_field(answer, AUTH_STATUS_FIELD))
