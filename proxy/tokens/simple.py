"""Simple tokens (``--auth-token simple``) on the proxy's side; the format is :mod:`raftgate.simple_token`.

The proxy only draws the random prefix; the store's apply stage appends the entry index and owns
the token's sliding TTL. To keep steady traffic off the store, resolutions are cached for a short
time (at most 1 s and at most a quarter of the TTL), so the store still sees the token at least
once a second of use and its sliding TTL never runs out under an active client.

A cached resolution never outlives a revocation: requests stamped from it are marked
``simple_token``, and the store refuses them as old once the auth revision moved (every revocation
moves it); the proxy then resolves the token again before retrying, on whichever proxy it is. (The
store checks that dependency, the auth revision, itself; so the entries, kept in the shared
raftgate/trust_cache.py, are bounded by time alone.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from raftgate.trust_cache import TrustCache

CACHE_SIZE = 65536
MAX_CACHE_SECONDS = 1.0


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
        self._entries: TrustCache[Resolved] = TrustCache(CACHE_SIZE, clock=clock)

    def get(self, token: str) -> Resolved | None:
        return self._entries.get(token)

    def put(self, token: str, username: str, revision: int) -> Resolved:
        entry = Resolved(username, revision, self._clock())
        self._entries.put(token, entry, until=entry.at + self.fresh_for)
        return entry

    def invalidate(self, token: str) -> None:
        self._entries.discard(token)

    def __len__(self) -> int:
        return len(self._entries)
