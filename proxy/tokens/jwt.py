"""JWT tokens (``--auth-token jwt,...``): signed by the proxy, verified locally without the store.

Claims are exactly etcd's ``{username, revision, exp}``. Verification pins the configured
algorithm (no ``none``, no algorithm confusion), validates ``exp``/``nbf`` when present (an
externally minted token without ``exp`` never expires, as in etcd), and requires ``username`` to be
a string and ``revision`` a JSON number that fits a uint64. Successful verifications are cached by
token until they expire, so steady traffic costs one dict lookup instead of a signature check.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jwt as pyjwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import HMACAlgorithm

from proxy import metrics
from proxy.tokens.duration import parse_go_duration
from proxy.tokens.extract import fingerprint
from proxy.tokens.options import (
    ERR_INVALID_AUTH_METHOD,
    ERR_INVALID_AUTH_OPTS,
    ERR_KEY_MISMATCH,
    ERR_MISSING_KEY,
    AuthOptionError,
)
from raftgate.errors import Err, EtcdError

log = logging.getLogger(__name__)

DEFAULT_TTL_NS = 5 * 60 * 1_000_000_000
MAX_TOKEN_BYTES = 16 * 1024
MAX_KEY_FILE_BYTES = 1024 * 1024
CACHE_SIZE = 4096
KNOWN_OPTIONS = frozenset({"sign-method", "pub-key", "priv-key", "ttl"})

_HMAC = {"HS256": HMACAlgorithm.SHA256, "HS384": HMACAlgorithm.SHA384, "HS512": HMACAlgorithm.SHA512}
_RSA = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_EC_CURVES: dict[str, type[ec.EllipticCurve]] = {"ES256": ec.SECP256R1, "ES384": ec.SECP384R1, "ES512": ec.SECP521R1}
SUPPORTED_ALGORITHMS = frozenset({*_HMAC, *_RSA, *_EC_CURVES, "EdDSA"})


class _RawHMAC(HMACAlgorithm):
    """HMAC whose secret is the key file's raw bytes, whatever they look like (etcd's rule).

    PyJWT refuses PEM-looking HMAC secrets to stop algorithm confusion; here the algorithm is
    pinned and the secret is never a public key we also verify with, so the guard is not needed.
    """

    def prepare_key(self, key: str | bytes) -> bytes:
        key_bytes = key.encode() if isinstance(key, str) else bytes(key)
        if not key_bytes:
            raise pyjwt.InvalidKeyError("HMAC key must not be empty")
        return key_bytes

    def check_key_length(self, key: Any) -> str | None:
        return None


@dataclass(frozen=True)
class JwtIdentity:
    username: str
    revision: int
    expires_at: float | None


def _read_key_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as e:
        raise AuthOptionError(ERR_INVALID_AUTH_OPTS, f"cannot read key file {path!r}: {e.strerror}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise AuthOptionError(ERR_INVALID_AUTH_OPTS, f"key file {path!r} is too large")
    return data


def _load_private(alg: str, data: bytes) -> Any:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise AuthOptionError(ERR_INVALID_AUTH_OPTS, f"priv-key is not a PEM private key for {alg} ({e})") from None
    _check_key_family(alg, key, "priv-key")
    return key


def _load_public(alg: str, data: bytes) -> Any:
    """A PEM public key, or the public key of a PEM X.509 certificate (etcd accepts both)."""
    try:
        if b"-----BEGIN CERTIFICATE-----" in data:
            key = x509.load_pem_x509_certificate(data).public_key()
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise AuthOptionError(ERR_INVALID_AUTH_OPTS, f"pub-key is not a PEM public key for {alg} ({e})") from None
    _check_key_family(alg, key, "pub-key")
    return key


def _check_key_family(alg: str, key: Any, what: str) -> None:
    if alg in _RSA:
        ok = isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey)
    elif alg in _EC_CURVES:
        ok = isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) and isinstance(
            key.curve, _EC_CURVES[alg]
        )
    else:
        ok = isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey)
    if not ok:
        raise AuthOptionError(ERR_INVALID_AUTH_OPTS, f"{what} is not a key for {alg}")


def _public_der(key: Any) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


class JwtProvider:
    """Signs and verifies etcd-compatible JWTs with one pinned algorithm."""

    def __init__(
        self,
        sign_method: str,
        *,
        private_key: bytes | None = None,
        public_key: bytes | None = None,
        ttl_ns: int = DEFAULT_TTL_NS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if sign_method not in SUPPORTED_ALGORITHMS:
            raise AuthOptionError(ERR_INVALID_AUTH_METHOD, f"unsupported sign-method {sign_method!r}")
        if ttl_ns <= 0:
            raise AuthOptionError(ERR_INVALID_AUTH_OPTS, "ttl must be positive")
        self.algorithm = sign_method
        self.ttl_seconds = ttl_ns / 1e9
        self._clock = clock
        self._jws = pyjwt.PyJWS(algorithms=[sign_method])
        self._sign_key: Any = None
        self._verify_key: Any
        if sign_method in _HMAC:
            if not private_key:
                raise AuthOptionError(ERR_MISSING_KEY, f"{sign_method} needs priv-key (the shared secret)")
            self._jws.unregister_algorithm(sign_method)
            self._jws.register_algorithm(sign_method, _RawHMAC(_HMAC[sign_method]))
            self._sign_key = self._verify_key = bytes(private_key)
        else:
            priv = _load_private(sign_method, private_key) if private_key else None
            pub = _load_public(sign_method, public_key) if public_key else None
            if priv is None and pub is None:
                raise AuthOptionError(ERR_MISSING_KEY, f"{sign_method} needs priv-key and/or pub-key")
            if priv is not None and pub is not None and _public_der(priv.public_key()) != _public_der(pub):
                raise AuthOptionError(ERR_KEY_MISMATCH)
            self._sign_key = priv
            self._verify_key = pub if priv is None else priv.public_key()
        self.verify_only = self._sign_key is None
        self._cache: OrderedDict[str, JwtIdentity] = OrderedDict()
        if not self.verify_only:
            self._probe()

    @classmethod
    def from_options(cls, options: dict[str, str], *, clock: Callable[[], float] = time.time) -> JwtProvider:
        """Builds the provider from etcd's ``jwt,`` options (``sign-method``, ``pub-key``, ``priv-key``, ``ttl``)."""
        unknown = sorted(set(options) - KNOWN_OPTIONS)
        if unknown:
            log.warning("unknown JWT options ignored: %s", ", ".join(unknown))
        ttl_ns = DEFAULT_TTL_NS
        if options.get("ttl"):
            try:
                ttl_ns = parse_go_duration(options["ttl"])
            except ValueError as e:
                raise AuthOptionError(ERR_INVALID_AUTH_OPTS, str(e)) from None
        pub = _read_key_file(options["pub-key"]) if options.get("pub-key") else None
        priv = _read_key_file(options["priv-key"]) if options.get("priv-key") else None
        method = options.get("sign-method", "")
        if method not in SUPPORTED_ALGORITHMS:
            raise AuthOptionError(ERR_INVALID_AUTH_METHOD, f"unsupported sign-method {method!r}")
        return cls(method, private_key=priv, public_key=pub, ttl_ns=ttl_ns, clock=clock)

    def _probe(self) -> None:
        """Signs and verifies once at start-up, so a key that cannot work fails now, not at first login."""
        try:
            token = self.sign("probe", 1)
        except Exception as e:  # any failure means the key is unusable
            raise AuthOptionError(ERR_INVALID_AUTH_OPTS, f"cannot sign with priv-key: {e}") from None
        identity = self._verify_uncached(token)
        self._cache.clear()
        if identity is None:
            raise AuthOptionError(ERR_KEY_MISMATCH)

    def sign(self, username: str, revision: int) -> str:
        """A token with etcd's claims; ``exp`` is now + ttl in whole seconds."""
        if self.verify_only:
            raise EtcdError(Err.VERIFY_ONLY)
        exp = int(self._clock() + self.ttl_seconds)
        payload = json.dumps({"exp": exp, "revision": revision, "username": username}, separators=(",", ":"))
        return self._jws.encode(payload.encode(), self._sign_key, algorithm=self.algorithm)

    def verify(self, token: str) -> JwtIdentity | None:
        """The identity in a valid token, or None (bad signature, wrong alg, expired, bad claims)."""
        now = self._clock()
        hit = self._cache.get(token)
        if hit is not None:
            if hit.expires_at is None or now < hit.expires_at:
                self._cache.move_to_end(token)
                metrics.token_validation("jwt", "cache_hit")
                return hit
            del self._cache[token]
            metrics.token_validation("jwt", "expired")
            return None
        identity, result = self._verify_with_result(token)
        metrics.token_validation("jwt", result)
        if identity is not None:
            self._cache[token] = identity
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return identity

    def _verify_uncached(self, token: str) -> JwtIdentity | None:
        return self._verify_with_result(token)[0]

    def _verify_with_result(self, token: str) -> tuple[JwtIdentity | None, metrics.TokenResult]:
        """The identity, and the result label a validation counts as (``expired`` vs ``invalid``)."""
        if len(token) > MAX_TOKEN_BYTES:
            return None, "invalid"
        try:
            decoded = self._jws.decode_complete(token, key=self._verify_key, algorithms=[self.algorithm])
            claims = json.loads(decoded["payload"])
        except (pyjwt.PyJWTError, ValueError, TypeError) as e:
            log.info("invalid JWT %s: %s", fingerprint(token), type(e).__name__)
            return None, "invalid"
        if decoded["header"].get("alg") != self.algorithm or not isinstance(claims, dict):
            return None, "invalid"
        identity = self._check_claims(claims, token)
        if identity is not None:
            return identity, "valid"
        exp = claims.get("exp")
        expired = _is_number(exp) and not self._clock() < exp
        return None, "expired" if expired else "invalid"

    def _check_claims(self, claims: dict[str, Any], token: str) -> JwtIdentity | None:
        now = self._clock()
        exp = claims.get("exp")
        if exp is not None and (not _is_number(exp) or not now < exp):
            log.info("JWT %s expired or has a bad exp", fingerprint(token))
            return None
        nbf = claims.get("nbf")
        if nbf is not None and (not _is_number(nbf) or now < nbf):
            return None
        username = claims.get("username")
        revision = claims.get("revision")
        if not isinstance(username, str) or not _is_number(revision) or revision < 0:
            log.info("JWT %s lacks a string username or numeric revision", fingerprint(token))
            return None
        if isinstance(revision, float) and not revision.is_integer():
            return None
        if revision >= 2**64:  # no auth revision is that large, and the stamped header holds a uint64
            return None
        return JwtIdentity(username, int(revision), float(exp) if exp is not None else None)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
