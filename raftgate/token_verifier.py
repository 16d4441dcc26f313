"""Tokens the store verifies itself, for callers it does not trust to name the user (sidecars).

A central proxy resolves a client's token and stamps the user name into the request; the store
believes it. A sidecar's credential is not trusted that far: it forwards the client's token and
the store verifies it with one of these verifiers. A verifier says whether a token is of its kind
(``recognizes``: a cheap look at its shape, never a verdict) and what identity it carries
(``verify``: None for a token of its kind that is not valid). The store asks the first verifier
that recognizes the token; kinds: simple tokens (the store holds them, authstore implements it),
etcd JWTs (here: a public key, the algorithm pinned), workload tokens (Kubernetes OIDC, wired in
the same way by ``raftgate/workload_identity.py``).

``JwtKeys`` is the one etcd-JWT engine of both programs (the proxy's ``JwtProvider`` wraps it):
a raftgate/jwt_keys.py ``KeyRing`` (keys that rotate with their files, ``kid`` headers, several
verification keys, each pinned to its algorithm), etcd's claims ``{username, revision, exp}``
checked by :func:`etcd_claims`, the cache of verified tokens, and the signer. In the store it
signs when given the private key: a sidecar's Authenticate is decided by the store (it checks the
password), so in JWT mode the store, not the sidecar, holds the key that mints. The token
fingerprint logs name tokens by, and the unverified read of claims used only to route a token or
end something sooner, are here too.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import jwt as pyjwt

from raftgate.jwt_keys import MAX_TOKEN_BYTES, POLL_INTERVAL_SECONDS, KeyLoadError, KeyRing
from raftgate.trust_cache import TrustCache

CACHE_SIZE = 4096

#: How a verification was decided (the proxy counts them by this label).
Outcome = Literal["cache_hit", "valid", "expired", "invalid"]


@dataclass(frozen=True)
class Verified:
    """The identity a valid token carries."""

    username: str
    #: The auth revision the token was issued at; None: judged at the store's current revision
    #: (a token whose validity the store looks up now, e.g. a workload token mapped to a user).
    revision: int | None
    #: A simple token: revoked by any auth change (the store marks the header ``simple_token``).
    revocable: bool = False
    #: unix seconds after which the token is dead (JWT ``exp``), else None
    expires_at: float | None = None


class TokenVerifier(Protocol):
    """One kind of token the store can verify without trusting the caller."""

    def recognizes(self, token: str) -> bool:
        """Whether ``token`` has this kind's shape (then this verifier alone decides)."""
        ...

    async def verify(self, token: str) -> Verified | None:
        """The identity of a valid token; None for an invalid, expired or revoked one."""
        ...


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and len(token) <= MAX_TOKEN_BYTES


def fingerprint(token: str) -> str:
    """The only form in which a token may be logged (etcd's redactToken: sha256, 12 hex chars);
    distinct strings keep distinct fingerprints (lone surrogates are hashed as they are)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def unverified_claims(token: str) -> dict[str, Any] | None:
    """A JWT's claims read WITHOUT checking its signature (None: not a JWT's shape, or malformed):
    only to route a token to its verifier or to end something sooner, never to grant anything."""
    if not looks_like_jwt(token):
        return None
    try:
        claims = pyjwt.decode(token, options={"verify_signature": False})
    except (pyjwt.PyJWTError, ValueError, TypeError):
        return None
    return claims if isinstance(claims, dict) else None


class JwtKeys:
    """etcd JWTs verified (and signed, given the private key) with a :class:`KeyRing`, the proxy's
    implementation: each key's algorithm pinned, ``kid`` headers, files re-read when they change
    and retired keys verifying until ``ttl_seconds`` after. Valid tokens are cached
    (raftgate/trust_cache.py) until their ``exp``, under the key set's generation: once a key has
    left the ring, no cached token it signed is answered."""

    def __init__(self, ring: KeyRing, *, ttl_seconds: float = 300.0, clock: Callable[[], float] = time.time) -> None:
        self.ring = ring
        self.algorithm = ring.algorithm
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._cache: TrustCache[Verified] = TrustCache(CACHE_SIZE, clock=clock)

    @classmethod
    def from_files(cls, algorithm: str, priv_path: str | None, pub_path: str | None, *, ttl_seconds: float = 300.0,
                   clock: Callable[[], float] = time.time, poll_interval: float = POLL_INTERVAL_SECONDS) -> JwtKeys:
        """``priv-key``/``pub-key`` as the proxy reads them (a PEM, a directory of PEMs, a JWKS);
        raises KeyLoadError (naming the files, never key material)."""
        ring = KeyRing.from_files(algorithm, priv_path, pub_path, retain_seconds=ttl_seconds, clock=clock,
                                  poll_interval=poll_interval)
        return cls(ring, ttl_seconds=ttl_seconds, clock=clock)

    @property
    def can_sign(self) -> bool:
        return self.ring.signing is not None

    def recognizes(self, token: str) -> bool:
        return looks_like_jwt(token)

    async def verify(self, token: str) -> Verified | None:
        return self.verify_now(token)

    def verify_now(self, token: str) -> Verified | None:
        return self.check(token)[0]

    def cached(self, token: str) -> Verified | None:
        """A token verified before, under the key set in force (no signature check)."""
        return self._cache.get(token, self.ring.generation())

    def check(self, token: str) -> tuple[Verified | None, Outcome]:
        """The identity in a valid token (or None), and how it was decided: ``cache_hit``, ``valid``,
        ``expired`` (a good signature, an ``exp`` passed) or ``invalid`` (anything else).

        A cached token is answered until its ``exp`` and only while the key set is the one it was
        verified under: once its key has left the ring (rotated out, then its retirement over), the
        token is checked again and refused, whatever its ``exp``."""
        if len(token) > MAX_TOKEN_BYTES:
            return None, "invalid"
        basis = self.ring.generation()  # files re-read if due (a stat per poll interval); read first
        hit = self._cache.get(token, basis)
        if hit is not None:
            return hit, "cache_hit"
        now = self._clock()
        payload = self.ring.verify(token)
        if payload is None:
            return None, "invalid"
        try:
            claims = json.loads(payload)
        except (ValueError, TypeError):
            return None, "invalid"
        if not isinstance(claims, dict):
            return None, "invalid"
        found = etcd_claims(claims, now)
        if found is None:
            exp = claims.get("exp")
            return None, "expired" if _number(exp) and not now < exp else "invalid"
        self._cache.put(token, found, basis=basis, until=found.expires_at)
        return found, "valid"

    def sign(self, username: str, revision: int) -> str:
        """A token with etcd's claims (``exp`` is now + ttl in whole seconds), and a ``kid`` header
        when the signing key is asymmetric."""
        if not self.can_sign:
            raise KeyLoadError("no priv-key: only verifies JWTs", KeyLoadError.MISSING)
        exp = int(self._clock() + self.ttl_seconds)
        payload = json.dumps({"exp": exp, "revision": revision, "username": username}, separators=(",", ":"))
        return self.ring.sign(payload.encode())


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def etcd_claims(claims: dict[str, Any], now: float) -> Verified | None:
    """etcd's claims: ``exp``/``nbf`` validated when present (an externally minted token without
    ``exp`` never expires, as in etcd), ``username`` a string, ``revision`` a JSON number that fits
    a uint64 (no auth revision is larger, and the stamped header holds a uint64)."""
    exp, nbf = claims.get("exp"), claims.get("nbf")
    if exp is not None and (not _number(exp) or not now < exp):
        return None
    if nbf is not None and (not _number(nbf) or now < nbf):
        return None
    username, revision = claims.get("username"), claims.get("revision")
    if not isinstance(username, str) or not _number(revision) or revision < 0 or revision >= 2**64:
        return None
    if isinstance(revision, float) and not revision.is_integer():
        return None
    return Verified(username, int(revision), expires_at=float(exp) if exp is not None else None)


def unverified_expiry(token: str) -> float | None:
    """A JWT's ``exp`` read WITHOUT checking its signature: only for a sidecar proxy to end a
    watch stream's watches when the token dies (the store verified the token; this can only make
    a stream end sooner, never grant anything)."""
    claims = unverified_claims(token)
    exp = claims.get("exp") if claims is not None else None
    return float(exp) if _number(exp) else None
