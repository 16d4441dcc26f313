"""Sidecar identity mode: token-less requests from this pod are sent as one configured identity.

The application in the pod talks to the proxy over loopback or a Unix socket and needs no
credentials and no auth code; the proxy logs in by itself (through its own Authenticate flow,
in-process) with the mounted identity, keeps the token fresh and lends it to requests that carry
none. The identity is lent only when both the listener the request came in on and the peer are
local (loopback or Unix socket): a request from the network without a token stays anonymous, and
a request that carries a token is handled as usual.

Token lifecycle (what clientv3 does for its user, done here for the pod):
* the first lent request logs in; concurrent requests share that one login;
* JWTs the proxy signs are renewed shortly before they expire; simple tokens slide while used;
* a request refused with ``invalid auth token``, ``revision of auth store is old`` or ``user name
  is empty`` gets a new token (files re-read first) and is retried once;
* a changed user name (or a new JWT file) takes effect at once; a changed password is used at the
  next login, so the current token keeps working until the store invalidates it;
* when auth is disabled, lent requests go anonymous until the store says a user is needed.
A failed login is not retried for a second unless the files change, so a wrong password costs at
most one bcrypt check per second. Neither the password nor a token is ever logged.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable
from urllib.parse import unquote

from protos.etcdserverpb import rpc_pb2
from proxy import metrics
from proxy.authenticate import Authenticator
from proxy.identity_file import IdentityFiles, JwtCredential, PasswordCredential
from proxy.tokens.jwt import JwtProvider
from raftgate.errors import Err, EtcdError

log = logging.getLogger(__name__)

LOGIN_TIMEOUT_SECONDS = 10.0
FAILED_LOGIN_BACKOFF_SECONDS = 1.0
#: A JWT is renewed once less than this share of its lifetime is left.
RENEW_FRACTION = 0.1

#: Store answers after which a lent request gets a new token and is retried once.
REFRESH_ON: dict[Err, metrics.RefreshReason] = {
    Err.INVALID_AUTH_TOKEN: "invalid_token",
    Err.AUTH_OLD_REVISION: "old_revision",
    Err.USER_EMPTY: "user_empty",
}


def is_local_listener(address: str) -> bool:
    """A listen address only this host can reach: a Unix socket or a loopback address."""
    if address.startswith("unix:"):
        return True
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_local_peer(peer: str) -> bool:
    """A gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, ``unix:...``) that is local."""
    peer = unquote(peer or "")
    if peer.startswith("unix:"):
        return True
    for prefix in ("ipv4:", "ipv6:"):
        if peer.startswith(prefix):
            host = peer[len(prefix):].rsplit(":", 1)[0].strip("[]")
            try:
                ip = ipaddress.ip_address(host.split("%", 1)[0])
            except ValueError:
                return False
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            return ip.is_loopback
    return False


class Sidecar:
    """Holds the lent identity's token: logs in, renews, and refreshes after a refusal."""

    def __init__(
        self,
        files: IdentityFiles,
        authenticator: Authenticator | None,
        jwt: JwtProvider | None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._files = files
        self._authenticator = authenticator
        self._jwt = jwt
        self._clock = clock
        self._token: str | None = None
        self._renew_at: float | None = None
        #: Files version at which the store said auth is disabled (lend no token).
        self._anonymous_version: int | None = None
        self._login_task: asyncio.Task[str | None] | None = None
        self._failure: tuple[int, float, EtcdError] | None = None
        for reason in metrics.REFRESH_REASONS:  # zero series, only on proxies in identity mode
            metrics.IDENTITY_REFRESHES.labels(reason)
        for result in ("ok", "error"):
            metrics.IDENTITY_RELOADS.labels(result)

    @property
    def username(self) -> str | None:
        cred = self._files.current
        return cred.username if isinstance(cred, PasswordCredential) else None

    async def token(self) -> str | None:
        """The token to lend now (None: auth is disabled, send anonymously)."""
        self._poll_files()
        if self._token is not None:
            if self._renew_at is None or self._clock() < self._renew_at:
                return self._token
            metrics.identity_refresh("expired")
            self._token = None
        elif self._anonymous_version == self._files.version:
            return None
        return await self._login()

    async def refresh(self, stale: str | None, reason: metrics.RefreshReason) -> str | None:
        """A new token after ``stale`` was refused; shares a refresh another request already made."""
        self._poll_files(force=True)
        if self._token is not None and self._token != stale:
            return self._token
        if self._login_task is None:
            metrics.identity_refresh(reason)
        self._token = None
        self._anonymous_version = None
        return await self._login()

    def _poll_files(self, *, force: bool = False) -> None:
        before = self._files.current
        if not self._files.poll(force=force):
            return
        after = self._files.current
        self._failure = None
        password_only = (
            isinstance(before, PasswordCredential)
            and isinstance(after, PasswordCredential)
            and before.username == after.username
        )
        if not password_only:  # another user, or a new token: switch now
            metrics.identity_refresh("credentials_changed")
            self._token = None
            self._anonymous_version = None

    async def _login(self) -> str | None:
        if self._failure is not None:
            version, at, error = self._failure
            if version == self._files.version and self._clock() - at < FAILED_LOGIN_BACKOFF_SECONDS:
                raise EtcdError(error.err)
        if self._login_task is None:
            task = asyncio.get_running_loop().create_task(self._do_login(self._files.version))
            self._login_task = task
            task.add_done_callback(self._login_done)
        # Shielded: one caller's deadline must not cancel the login the others wait for.
        return await asyncio.shield(self._login_task)

    def _login_done(self, task: asyncio.Task[str | None]) -> None:
        if self._login_task is task:
            self._login_task = None
        if not task.cancelled():
            task.exception()  # retrieved here: waiters re-raise it themselves

    async def _do_login(self, version: int) -> str | None:
        cred = self._files.current
        if isinstance(cred, JwtCredential):
            self._token, self._renew_at = cred.token, None
            return self._token
        assert self._authenticator is not None
        request = rpc_pb2.AuthenticateRequest(name=cred.username, password=cred.password)
        try:
            answer = await self._authenticator.authenticate(request, LOGIN_TIMEOUT_SECONDS)
        except EtcdError as e:
            if e.err is Err.AUTH_NOT_ENABLED:
                self._anonymous_version = version
                self._token = None
                return None
            self._failure = (version, self._clock(), e)
            log.warning("sidecar identity %r could not log in: %s", cred.username, e.message)
            raise
        token = rpc_pb2.AuthenticateResponse.FromString(answer).token
        self._failure = None
        self._token = token
        self._renew_at = None
        if self._jwt is not None:
            self._renew_at = self._clock() + self._jwt.ttl_seconds * (1 - RENEW_FRACTION)
        log.info("sidecar identity %r logged in", cred.username)
        return token
