"""Simple tokens (``--auth-token simple``): ``<16 letters>.<log index>``, registered by the store.

The proxy only draws the random prefix; the store's apply stage appends the entry index and owns
the token's sliding TTL. To keep steady traffic off the store, resolutions are cached for a short
time (at most 1 s and at most a quarter of the TTL), so the store still sees the token at least
once a second of use and its sliding TTL never runs out under an active client.

A cached resolution never outlives a revocation: requests stamped from it are marked
``simple_token``, and the store refuses them as old once the auth revision moved (every revocation
moves it); the proxy then resolves the token again before retrying, on whichever proxy it is.
"""

from __future__ import annotations

import re
import secrets
import string
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

PREFIX_LENGTH = 16
_LETTERS = string.ascii_letters
_FORMAT = re.compile(r"[A-Za-z]{16}\.[0-9]{1,20}")
CACHE_SIZE = 65536
MAX_CACHE_SECONDS = 1.0


def generate_prefix() -> str:
    """16 letters from a CSPRNG, the part of the token nobody can guess."""
    return "".join(secrets.choice(_LETTERS) for _ in range(PREFIX_LENGTH))


def looks_like_simple_token(token: str) -> bool:
    """Cheap shape check so junk never reaches the store."""
    return _FORMAT.fullmatch(token) is not None


@dataclass(frozen=True)
class Resolved:
    username: str
    revision: int
    at: float


class SimpleTokenCache:
    """token -> (username, auth revision), fresh for ``min(1 s, ttl / 4)``; bounded LRU."""

    def __init__(self, ttl_seconds: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.fresh_for = min(MAX_CACHE_SECONDS, ttl_seconds / 4)
        self._clock = clock
        self._entries: OrderedDict[str, Resolved] = OrderedDict()

    def get(self, token: str) -> Resolved | None:
        entry = self._entries.get(token)
        if entry is None:
            return None
        if self._clock() - entry.at >= self.fresh_for:
            del self._entries[token]
            return None
        self._entries.move_to_end(token)
        return entry

    def put(self, token: str, username: str, revision: int) -> Resolved:
        entry = Resolved(username, revision, self._clock())
        self._entries[token] = entry
        self._entries.move_to_end(token)
        if len(self._entries) > CACHE_SIZE:
            self._entries.popitem(last=False)
        return entry

    def invalidate(self, token: str) -> None:
        self._entries.pop(token, None)

    def __len__(self) -> int:
        return len(self._entries)
