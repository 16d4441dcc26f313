"""Where a client's token travels: gRPC metadata ``token``, or ``authorization`` (the gateway's name).

Follows etcd's AuthInfoFromCtx: the ``token`` key wins over ``authorization``, the first value
of the chosen key is used, and a leading ``Bearer `` is stripped (etcd >= 3.6.13 / 3.7.0).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

TOKEN_KEY = "token"
AUTHORIZATION_KEY = "authorization"
BEARER_PREFIX = "Bearer "


def extract_token(metadata: Iterable[Any] | None) -> str | None:
    """The token from invocation metadata, or None when the client sent none.

    An empty value is returned as "" (present but empty): etcd treats it as a token that fails
    to resolve, not as an anonymous call.
    """
    if not metadata:
        return None
    token: Any = None
    for item in metadata:  # one pass: the first ``token`` ends it, the first ``authorization`` is kept
        key = item[0]
        if key == TOKEN_KEY:
            token = item[1]
            break
        if key == AUTHORIZATION_KEY and token is None:
            token = item[1]
    if token is None:
        return None
    if isinstance(token, bytes):
        token = token.decode("utf-8", "replace")
    return str(token).removeprefix(BEARER_PREFIX)
