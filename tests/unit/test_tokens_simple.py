"""Simple token prefixes and the proxy's short-lived resolution cache."""

from __future__ import annotations

import re

from proxy.tokens.simple import SimpleTokenCache
from raftgate.simple_token import generate_prefix, looks_like_simple_token, token_index


def test_prefix_is_16_letters_and_random() -> None:
    prefixes = {generate_prefix() for _ in range(200)}
    assert len(prefixes) == 200
    assert all(re.fullmatch(r"[a-zA-Z]{16}", p) for p in prefixes)


def test_shape_check() -> None:
    assert looks_like_simple_token("wwhspQQcNCzmFvEU.53")
    for bad in (
        "",
        "wwhspQQcNCzmFvEU",
        "wwhspQQcNCzmFvEU.",
        "wwhspQQcNCzmFvE.1",
        "wwhspQQcNCzmFvEU.x",
        "wwhspQQcNCzmFvE1.2",
        "wwhspQQcNCzmFvEU.1\n",
        "a.b.c",
        "wwhspQQcNCzmFvEU." + "1" * 21,
    ):
        assert not looks_like_simple_token(bad), bad


def test_store_and_proxy_agree_on_the_shape() -> None:
    """The store parses a token the proxy let through, and nothing else (no crash on non-ASCII digits)."""
    assert token_index("wwhspQQcNCzmFvEU.53") == 53
    for text in ("wwhspQQcNCzmFvEU.53", "wwhspQQcNCzmFvEU.\u00b2", "wwhspQQcNCzmFvEU.\u0661\u0662",
                 "wwhspQQcNCzmFvEU.1\n", "wwhsp\u00e9QcNCzmFvEU.1", "wwhspQQcNCzmFvEU." + "1" * 21, ".1", ""):
        assert (token_index(text) is not None) == looks_like_simple_token(text), text


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_cache_freshness_is_min_of_one_second_and_quarter_ttl() -> None:
    assert SimpleTokenCache(300).fresh_for == 1.0
    assert SimpleTokenCache(2).fresh_for == 0.5


def test_cache_expires_and_invalidates() -> None:
    clock = Clock()
    cache = SimpleTokenCache(300, clock=clock)
    cache.put("t", "alice", 4)
    hit = cache.get("t")
    assert hit is not None and (hit.username, hit.revision) == ("alice", 4)
    clock.now += 0.99
    assert cache.get("t") is not None
    clock.now += 0.02
    assert cache.get("t") is None and len(cache) == 0
    cache.put("t", "alice", 4)
    cache.invalidate("t")
    assert cache.get("t") is None
    cache.invalidate("absent")
