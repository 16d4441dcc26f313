"""The shared cache of verifications (raftgate/trust_cache.py): an entry is answered only under the
basis it was verified under and before its end; bounded; no token kept."""

from __future__ import annotations

from raftgate.trust_cache import TrustCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_needs_its_basis_and_its_time() -> None:
    clock = Clock()
    cache: TrustCache[str] = TrustCache(8, clock=clock)
    cache.put("t", "alice", basis=(3, 1), until=1010.0)
    assert cache.get("t", (3, 1)) == "alice"
    assert cache.get("t", (4, 1)) is None  # the key set moved on: dropped, not only hidden
    assert cache.get("t", (3, 1)) is None and len(cache) == 0
    cache.put("t", "alice", basis=(3, 1), until=1010.0)
    clock.now = 1010.0
    assert cache.get("t", (3, 1)) is None
    cache.put("forever", "bob", basis=7)  # no exp: lives until its basis goes
    clock.now += 10 ** 9
    assert cache.get("forever", 7) == "bob"
    cache.discard("forever")
    assert cache.get("forever", 7) is None


def test_bounded_least_recently_used_first_and_no_token_held() -> None:
    cache: TrustCache[int] = TrustCache(2)
    secret = "header.payload-that-is-a-secret.signature"
    cache.put(secret, 1)
    cache.put("b", 2)
    assert cache.get(secret) == 1  # used: "b" is now the oldest
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get(secret) == 1 and cache.get("c") == 3
    assert all(secret.encode() not in key for key in cache._entries)  # sha256 digests only
    cache.put(b"pem bytes", 4)
    assert cache.get(b"pem bytes") == 4
