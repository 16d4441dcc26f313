"""Tokens the store verifies itself, for callers it does not trust to name the user (sidecars).

A central proxy resolves a client's token and stamps the user name into the request; the store
believes it. A sidecar's credential is not trusted that far: it forwards the client's token and
the store verifies it with one of these verifiers. A verifier says whether a token is of its kind
(``recognizes``: a cheap look at its shape, never a verdict) and what identity it carries
(``verify``: None for a token of its kind that is not valid). The store asks the first verifier
that recognizes the token; kinds: simple tokens (the store holds them, authstore implements it),
etcd JWTs (here: a public key, the algorithm pinned), workload tokens (Kubernetes OIDC, wired in
the same way by ``raftgate/workload_identity.py``).

``JwtKeys`` also signs, when it was given the private key: a sidecar's Authenticate is decided by
the store (it checks the password), so in JWT mode the store, not the sidecar, holds the key that
mints. Claims are exactly etcd's ``{username, revision, exp}``, as the proxy's tokens have.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import jwt as pyjwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from jwt.algorithms import HMACAlgorithm

MAX_TOKEN_BYTES = 16 * 1024
MAX_KEY_FILE_BYTES = 1024 * 1024
CACHE_SIZE = 4096
_HMAC = {"HS256": HMACAlgorithm.SHA256, "HS384": HMACAlgorithm.SHA384, "HS512": HMACAlgorithm.SHA512}
ALGORITHMS = frozenset({*_HMAC, "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
                        "EdDSA"})


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


class _RawHMAC(HMACAlgorithm):
    """HMAC whose secret is the key file's raw bytes (etcd's rule; the algorithm is pinned)."""

    def prepare_key(self, key: str | bytes) -> bytes:
        key_bytes = key.encode() if isinstance(key, str) else bytes(key)
        if not key_bytes:
            raise pyjwt.InvalidKeyError("HMAC key must not be empty")
        return key_bytes

    def check_key_length(self, key: Any) -> str | None:
        return None


class TokenKeyError(ValueError):
    """A key file that cannot serve the configured algorithm."""


def read_key_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as e:
        raise TokenKeyError(f"cannot read key file {path!r}: {e.strerror}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise TokenKeyError(f"key file {path!r} is too large")
    return data


class JwtKeys:
    """Verifies etcd JWTs with one public key (or HMAC secret), one pinned algorithm; signs when
    it holds the private key. Valid tokens are cached until they expire (one dict lookup)."""

    def __init__(self, algorithm: str, *, public_key: bytes | None = None, private_key: bytes | None = None,
                 ttl_seconds: float = 300.0, clock: Callable[[], float] = time.time) -> None:
        if algorithm not in ALGORITHMS:
            raise TokenKeyError(f"unsupported sign-method {algorithm!r}")
        self.algorithm = algorithm
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._jws = pyjwt.PyJWS(algorithms=[algorithm])
        self._sign_key: Any = None
        if algorithm in _HMAC:
            secret = private_key or public_key
            if not secret:
                raise TokenKeyError(f"{algorithm} needs priv-key (the shared secret)")
            self._jws.unregister_algorithm(algorithm)
            self._jws.register_algorithm(algorithm, _RawHMAC(_HMAC[algorithm]))
            self._sign_key = self._verify_key = bytes(secret)
        else:
            try:
                priv = serialization.load_pem_private_key(private_key, password=None) if private_key else None
                if public_key and b"-----BEGIN CERTIFICATE-----" in public_key:
                    pub = x509.load_pem_x509_certificate(public_key).public_key()
                else:
                    pub = serialization.load_pem_public_key(public_key) if public_key else None
            except (ValueError, TypeError) as e:
                raise TokenKeyError(f"not a PEM key for {algorithm} ({e})") from None
            if priv is None and pub is None:
                raise TokenKeyError(f"{algorithm} needs pub-key and/or priv-key")
            self._sign_key = priv
            self._verify_key = pub if priv is None else priv.public_key()  # type: ignore[union-attr]
            if priv is not None and pub is not None and _der(self._verify_key) != _der(pub):
                raise TokenKeyError("priv-key and pub-key do not match")
        self._cache: OrderedDict[str, Verified] = OrderedDict()
        if self._sign_key is not None and self.verify_now(self.sign("probe", 1)) is None:
            raise TokenKeyError(f"cannot sign and verify with the key for {algorithm}")
        self._cache.clear()

    @property
    def can_sign(self) -> bool:
        return self._sign_key is not None

    def recognizes(self, token: str) -> bool:
        return looks_like_jwt(token)

    async def verify(self, token: str) -> Verified | None:
        return self.verify_now(token)

    def verify_now(self, token: str) -> Verified | None:
        now = self._clock()
        hit = self._cache.get(token)
        if hit is not None:
            if hit.expires_at is None or now < hit.expires_at:
                self._cache.move_to_end(token)
                return hit
            del self._cache[token]
            return None
        if len(token) > MAX_TOKEN_BYTES:
            return None
        try:
            decoded = self._jws.decode_complete(token, key=self._verify_key, algorithms=[self.algorithm])
            claims = json.loads(decoded["payload"])
        except (pyjwt.PyJWTError, ValueError, TypeError):
            return None
        if decoded["header"].get("alg") != self.algorithm or not isinstance(claims, dict):
            return None
        found = _claims(claims, now)
        if found is not None:
            self._cache[token] = found
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return found

    def sign(self, username: str, revision: int) -> str:
        """A token with etcd's claims; ``exp`` is now + ttl in whole seconds."""
        if self._sign_key is None:
            raise TokenKeyError("no priv-key: this store only verifies JWTs")
        exp = int(self._clock() + self.ttl_seconds)
        payload = json.dumps({"exp": exp, "revision": revision, "username": username}, separators=(",", ":"))
        return self._jws.encode(payload.encode(), self._sign_key, algorithm=self.algorithm)


def _der(key: Any) -> bytes:
    return key.public_bytes(serialization.Encoding.DER,  # type: ignore[no-any-return]
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _claims(claims: dict[str, Any], now: float) -> Verified | None:
    """etcd's claims, checked as the proxy checks them (proxy/tokens/jwt.py)."""
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
    if not looks_like_jwt(token):
        return None
    try:
        claims = pyjwt.decode(token, options={"verify_signature": False})
    except (pyjwt.PyJWTError, ValueError, TypeError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if _number(exp) else None


_DURATION = re.compile(r"(\d+(?:\.\d*)?)(h|ms|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_ttl(text: str) -> float:
    """Seconds of a Go duration such as ``5m``, ``1h30m``, ``90s`` (the JWT ``ttl=`` option)."""
    parts = _DURATION.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise TokenKeyError(f'time: invalid duration "{text}"')
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds <= 0:
        raise TokenKeyError("ttl must be positive")
    return seconds


def parse_auth_token(value: str) -> tuple[str, dict[str, str]]:
    """etcd's ``--auth-token`` value: ``simple`` or ``jwt,key=value,...`` -> (kind, options)."""
    kind, *rest = value.split(",")
    options: dict[str, str] = {}
    for item in rest:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise TokenKeyError(f"bad --auth-token option {item!r}")
        options[key.strip()] = val.strip()
    return kind.strip(), options
