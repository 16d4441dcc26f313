"""JWT tokens (``--auth-token jwt,...``): signed by the proxy, verified locally without the store.

Claims are exactly etcd's ``{username, revision, exp}``; the header adds the signing key's ``kid``.
The keys (``raftgate/jwt_keys.py``) are re-read when their files change, several may verify, and
each is pinned to its algorithm (no ``none``, no algorithm confusion). Verification validates
``exp``/``nbf`` when present (an externally minted token without ``exp`` never expires, as in
etcd), and requires ``username`` to be a string and ``revision`` a JSON number that fits a uint64.
Signing, the claim checks and the cache of verified tokens are the store's own
(raftgate/token_verifier.py ``JwtKeys``): one set of rules for both programs. Successful
verifications are cached (raftgate/trust_cache.py) until they expire or the key set they were
verified under changes (a key rotated out, its retirement over, fetched keys too stale), so steady
traffic costs a hash and a dict lookup instead of a signature check, and no cached token outlives
its key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from proxy import metrics
from raftgate import jwt_keys
from raftgate.auth_token import (
    DEFAULT_TTL_NS,
    ERR_INVALID_AUTH_METHOD,
    ERR_INVALID_AUTH_OPTS,
    ERR_KEY_MISMATCH,
    ERR_MISSING_KEY,
    AuthOptionError,
    JwtOptions,
)
from raftgate.errors import Err, EtcdError
from raftgate.jwt_keys import SUPPORTED_ALGORITHMS, JwksFollower, KeyLoadError, KeyRing
from raftgate.token_verifier import JwtKeys, Verified, fingerprint

log = logging.getLogger(__name__)

_ETCD_TEXT = {
    KeyLoadError.INVALID: ERR_INVALID_AUTH_OPTS,
    KeyLoadError.MISSING: ERR_MISSING_KEY,
    KeyLoadError.MISMATCH: ERR_KEY_MISMATCH,
}


def _option_error(e: KeyLoadError) -> AuthOptionError:
    """etcd's start-up error for a key that cannot be used (``auth: public and private keys don't match``
    carries no detail, as in etcd)."""
    text = _ETCD_TEXT[e.reason]
    return AuthOptionError(text) if e.reason == KeyLoadError.MISMATCH else AuthOptionError(text, str(e))


def _key_reloaded(source: str, result: str) -> None:
    metrics.JWT_KEY_RELOADS.labels(source, result).inc()


class JwtProvider:
    """Signs and verifies etcd-compatible JWTs with the keys of a :class:`KeyRing` (each key with its
    pinned algorithm), following a JWKS URL when ``follower`` is given."""

    def __init__(
        self,
        sign_method: str,
        *,
        private_key: bytes | None = None,
        public_key: bytes | None = None,
        ttl_ns: int = DEFAULT_TTL_NS,
        clock: Callable[[], float] = time.time,
        keys: KeyRing | None = None,
        follower: JwksFollower | None = None,
    ) -> None:
        """Keys come from ``keys`` (files that may change), or else from the bytes given (fixed)."""
        if sign_method not in SUPPORTED_ALGORITHMS:
            raise AuthOptionError(ERR_INVALID_AUTH_METHOD, f"unsupported sign-method {sign_method!r}")
        if ttl_ns <= 0:
            raise AuthOptionError(ERR_INVALID_AUTH_OPTS, "ttl must be positive")
        self.algorithm = sign_method
        self.ttl_seconds = ttl_ns / 1e9
        if keys is None:
            try:
                material = jwt_keys.material_from_bytes(sign_method, private_key, public_key)
            except KeyLoadError as e:
                raise _option_error(e) from None
            keys = KeyRing(sign_method, material, retain_seconds=self.ttl_seconds, clock=clock)
        self.keys = keys
        self.follower = follower
        self.verify_only = keys.signing is None
        #: signs, checks etcd's claims and caches verified tokens, as the store does
        self._tokens = JwtKeys(keys, ttl_seconds=self.ttl_seconds, clock=clock)

    @classmethod
    def from_options(cls, options: JwtOptions, *, clock: Callable[[], float] = time.time) -> JwtProvider:
        """Builds the provider from the parsed ``jwt,`` options (raftgate/auth_token.py): etcd's
        ``sign-method``, ``pub-key``, ``priv-key``, ``ttl`` and raftgate's ``jwks-url`` / ``jwks-ca``.
        Key files are re-read when they change."""
        pub, priv, url = options.pub_key, options.priv_key, options.jwks_url
        method, ttl_ns = options.sign_method, options.ttl_ns
        try:
            for path in (pub, priv):  # etcd reads both files, whatever the method
                if path is not None and not jwt_keys.is_directory(path):
                    jwt_keys.read_key_file(path)
            if url and not priv and not pub:  # verify-only with fetched keys only: nothing in the files
                keys = KeyRing(method, jwt_keys.KeyMaterial(None, ()), retain_seconds=ttl_ns / 1e9, clock=clock)
            else:
                keys = KeyRing.from_files(method, priv, pub, retain_seconds=ttl_ns / 1e9, clock=clock,
                                          on_reload=_key_reloaded)
            follower = JwksFollower(keys, url, ca_file=options.jwks_ca, on_reload=_key_reloaded) if url else None
        except KeyLoadError as e:
            raise _option_error(e) from None
        return cls(method, ttl_ns=ttl_ns, clock=clock, keys=keys, follower=follower)

    def sign(self, username: str, revision: int) -> str:
        """A token with etcd's claims (``exp`` is now + ttl in whole seconds), and a ``kid`` header."""
        if self.verify_only:
            raise EtcdError(Err.VERIFY_ONLY)
        return self._tokens.sign(username, revision)

    def unknown_kid(self, token: str) -> str | None:
        """With a JWKS URL: the token's ``kid`` if no key has it yet (worth a fetch), else None."""
        if self.follower is None or self._tokens.cached(token) is not None:
            return None
        kid = KeyRing.kid_of(token)
        return kid if kid is not None and not self.keys.knows(kid) else None

    async def refresh_keys(self, kid: str) -> None:
        """Fetches the JWKS again for ``kid`` (rate-limited; bounded in time)."""
        if self.follower is not None:
            await self.follower.refresh_for(kid)

    def jwks_document(self) -> bytes | None:
        """The public keys as a JWKS (``/.well-known/jwks.json``); None for HMAC."""
        return self.keys.jwks_document()

    def verify(self, token: str) -> Verified | None:
        """The identity in a valid token, or None (bad signature, wrong alg, expired, bad claims).

        A cached token is answered until its ``exp`` and only while the key set is the one it was
        verified under: once its key has left the ring (rotated out, then its retirement over), the
        token is checked again and refused, whatever its ``exp``."""
        found, result = self._tokens.check(token)
        metrics.token_validation("jwt", result)
        if result == "invalid":
            log.info("invalid JWT %s", fingerprint(token))
        elif result == "expired":
            log.info("JWT %s expired", fingerprint(token))
        return found
