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
    first: dict[str, str] = {}
    for item in metadata:
        key, value = item[0], item[1]
        if key in (TOKEN_KEY, AUTHORIZATION_KEY) and key not in first:
            first[key] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    token = first.get(TOKEN_KEY, first.get(AUTHORIZATION_KEY))
    if token is None:
        return None
    return token.removeprefix(BEARER_PREFIX)
