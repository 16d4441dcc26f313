"""One cache for every verification raftgate keeps: a result never outlives what it relied on.

Every verifier that caches (the proxy's JWTs, the store's sidecar JWTs, workload tokens in both,
the proxy's simple-token resolutions and workload users, the store's classes of client
certificates, the CRL's verdicts on certificate chains) keeps its results in a :class:`TrustCache`. An entry holds

* the verified value;
* its **basis**: what the verification relied on, as the verifier read it *before* verifying - the
  generation of a key set (``KeyRing.generation()``, ``KeySet.generation()``), of a user map, or
  nothing for a result bounded by time alone. A key set's generation moves whenever a key stops
  verifying (rotated out of the files, its retirement grace over, fetched keys too stale, a JWKS
  file deleted) or the set changes at all;
* ``until``: when it dies by itself (a token's ``exp``, a freshness bound), or None.

A lookup answers only with the current basis equal to the entry's and before ``until``; any other
entry is dropped on sight. Reading the basis before verifying makes a race harmless: a key set that
changes during a verification leaves an entry that is never answered.

Keys are the sha256 of the token: 32 bytes an entry whatever the token's size, and no token is
held in memory longer than its request. Bounded (least recently used goes first); thread-safe.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


def token_digest(token: str | bytes) -> bytes:
    data = token if isinstance(token, bytes) else token.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).digest()


@dataclass(frozen=True)
class _Entry(Generic[V]):
    value: V
    basis: Hashable
    until: float | None


class TrustCache(Generic[V]):
    """token -> a verified value, answered while its basis holds and before ``until`` (``clock``)."""

    def __init__(self, size: int, *, clock: Callable[[], float] = time.time) -> None:
        if size < 1:
            raise ValueError("a trust cache holds at least one entry")
        self.size = size
        self._clock = clock
        self._entries: OrderedDict[bytes, _Entry[V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, token: str | bytes, basis: Hashable = None) -> V | None:
        """The value cached for ``token`` if verified under ``basis`` and not past ``until``."""
        digest = token_digest(token)
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            if entry.basis != basis or (entry.until is not None and not self._clock() < entry.until):
                del self._entries[digest]
                return None
            self._entries.move_to_end(digest)
            return entry.value

    def put(self, token: str | bytes, value: V, *, basis: Hashable = None, until: float | None = None) -> None:
        """Caches ``value``, verified under ``basis`` (read before the verification began)."""
        digest = token_digest(token)
        with self._lock:
            self._entries[digest] = _Entry(value, basis, until)
            self._entries.move_to_end(digest)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def discard(self, token: str | bytes) -> None:
        with self._lock:
            self._entries.pop(token_digest(token), None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
