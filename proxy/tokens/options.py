"""The ``--auth-token`` option string (etcd's syntax): ``simple``, ``jwt,k=v,...`` or "" (no tokens).

Parsed exactly like etcd's decomposeOpts: comma-split, the first element is the provider type,
every other element must be ``key=value``; a malformed pair or a duplicate key is an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

# etcd's startup error texts (server/auth/store.go), kept byte for byte for operators' searches.
ERR_INVALID_AUTH_OPTS = "auth: invalid auth options"
ERR_INVALID_AUTH_METHOD = "auth: invalid auth signature method"
ERR_MISSING_KEY = "auth: missing key data"
ERR_KEY_MISMATCH = "auth: public and private keys don't match"

SIMPLE = "simple"
JWT = "jwt"
NOP = ""


class AuthOptionError(ValueError):
    """A bad --auth-token value; ``str()`` starts with etcd's error text."""

    def __init__(self, etcd_text: str, detail: str = "") -> None:
        super().__init__(f"{etcd_text}: {detail}" if detail else etcd_text)
        self.etcd_text = etcd_text


@dataclass(frozen=True)
class AuthTokenSpec:
    kind: str
    options: dict[str, str] = field(default_factory=dict)


def parse_auth_token(text: str) -> AuthTokenSpec:
    parts = text.split(",")
    kind = parts[0]
    options: dict[str, str] = {}
    for part in parts[1:]:
        pair = part.split("=")
        if len(pair) != 2:
            raise AuthOptionError(ERR_INVALID_AUTH_OPTS, f"malformed option {pair[0]!r} (want key=value)")
        key, value = pair
        if key in options:
            raise AuthOptionError(ERR_INVALID_AUTH_OPTS, f"duplicate option {key!r}")
        options[key] = value
    if kind not in (SIMPLE, JWT, NOP):
        raise AuthOptionError(ERR_INVALID_AUTH_OPTS, f"unknown token type {kind!r} (want simple or jwt)")
    return AuthTokenSpec(kind, options)
