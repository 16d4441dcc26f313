"""The ``--auth-token`` option string (etcd's syntax), one parser for the proxy and the store.

``simple``, ``jwt,k=v,...`` or "" (no tokens). Parsed as etcd's decomposeOpts and jwtOptions do
(server/auth/store.go, options.go): comma-split, the first element is the provider type (no
trimming), every other element exactly ``key=value``; a malformed pair or a duplicate key is an
error, an unknown key only a warning, an empty value the same as no value. For ``jwt``:
``sign-method`` one of jwt-go's names (case-sensitive), ``ttl`` a Go duration (default 5m). One
rule is stricter than etcd's: a ttl that is not positive is refused (etcd would mint tokens that
are born expired). Keys are loaded by the program (they are files that may change); this module
only decides what the string says, so both programs accept and refuse the same strings.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from raftgate.go_duration import parse_go_duration
from raftgate.jwt_keys import HMAC_ALGORITHMS, SUPPORTED_ALGORITHMS

log = logging.getLogger(__name__)

# etcd's startup error texts (server/auth/store.go), kept byte for byte for operators' searches.
ERR_INVALID_AUTH_OPTS = "auth: invalid auth options"
ERR_INVALID_AUTH_METHOD = "auth: invalid auth signature method"
ERR_MISSING_KEY = "auth: missing key data"
ERR_KEY_MISMATCH = "auth: public and private keys don't match"

SIMPLE = "simple"
JWT = "jwt"
NOP = ""

DEFAULT_TTL_NS = 5 * 60 * 1_000_000_000
#: etcd's four JWT options, and raftgate's two for a proxy that follows a JWKS URL
KNOWN_OPTIONS = frozenset({"sign-method", "pub-key", "priv-key", "ttl", "jwks-url", "jwks-ca"})


class AuthOptionError(ValueError):
    """A bad --auth-token value; ``str()`` starts with etcd's error text."""

    def __init__(self, etcd_text: str, detail: str = "") -> None:
        super().__init__(f"{etcd_text}: {detail}" if detail else etcd_text)
        self.etcd_text = etcd_text


@dataclass(frozen=True)
class JwtOptions:
    """The ``jwt,`` options, checked (the key files are named, not read)."""

    sign_method: str
    ttl_ns: int = DEFAULT_TTL_NS
    pub_key: str | None = None
    priv_key: str | None = None
    jwks_url: str | None = None
    jwks_ca: str | None = None

    @property
    def ttl_seconds(self) -> float:
        return self.ttl_ns / 1e9


@dataclass(frozen=True)
class AuthTokenSpec:
    kind: str
    options: dict[str, str] = field(default_factory=dict)
    #: set when ``kind`` is ``jwt``
    jwt: JwtOptions | None = None


def decompose(text: str) -> tuple[str, dict[str, str]]:
    """etcd's decomposeOpts: (type, options); a pair that is not exactly ``k=v`` or a repeated key is an error."""
    parts = text.split(",")
    options: dict[str, str] = {}
    for part in parts[1:]:
        pair = part.split("=")
        if len(pair) != 2:
            raise AuthOptionError(ERR_INVALID_AUTH_OPTS, f"malformed option {pair[0]!r} (want key=value)")
        key, value = pair
        if key in options:
            raise AuthOptionError(ERR_INVALID_AUTH_OPTS, f"duplicate option {key!r}")
        options[key] = value
    return parts[0], options


def jwt_options(options: dict[str, str]) -> JwtOptions:
    """The ``jwt,`` options checked in etcd's order (ttl, then the method); unknown keys are logged."""
    unknown = sorted(set(options) - KNOWN_OPTIONS)
    if unknown:
        log.warning("unknown JWT options ignored: %s", ", ".join(repr(k) for k in unknown))
    ttl_ns = DEFAULT_TTL_NS
    if options.get("ttl"):
        try:
            ttl_ns = parse_go_duration(options["ttl"])
        except ValueError as e:
            raise AuthOptionError(ERR_INVALID_AUTH_OPTS, str(e)) from None
    method = options.get("sign-method", "")
    if method not in SUPPORTED_ALGORITHMS:
        raise AuthOptionError(ERR_INVALID_AUTH_METHOD, f"unsupported sign-method {method!r}")
    if ttl_ns <= 0:
        raise AuthOptionError(ERR_INVALID_AUTH_OPTS, "ttl must be positive")
    url, ca = options.get("jwks-url") or None, options.get("jwks-ca") or None
    if url and method in HMAC_ALGORITHMS:
        raise AuthOptionError(ERR_INVALID_AUTH_OPTS, "jwks-url needs an asymmetric sign-method")
    if ca and not url:
        raise AuthOptionError(ERR_INVALID_AUTH_OPTS, "jwks-ca needs jwks-url")
    return JwtOptions(method, ttl_ns, options.get("pub-key") or None, options.get("priv-key") or None, url, ca)


def parse_auth_token(text: str) -> AuthTokenSpec:
    """The ``--auth-token`` string -> its spec; raises AuthOptionError with etcd's text."""
    kind, options = decompose(text)
    if kind not in (SIMPLE, JWT, NOP):
        raise AuthOptionError(ERR_INVALID_AUTH_OPTS, f"unknown token type {kind!r} (want simple or jwt)")
    return AuthTokenSpec(kind, options, jwt_options(options) if kind == JWT else None)
