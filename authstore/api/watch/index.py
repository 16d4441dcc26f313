"""Open watchers by key interval, so an event finds its watchers without looking at the others.

One-key watches sit in a dict by key (O(1) per event). Ranges, prefixes and from-key watches sit
in an interval treap: a binary search tree ordered by start key (randomly balanced, expected depth
O(log W)) in which every node also knows the largest end key below it. A stabbing query for key k
descends only into subtrees whose largest end is above k and never right of a node starting after
k: one search path when nothing matches, at most a path per watcher it reports.

The index is owned by the event loop (see ``hub.py``); nothing here takes a lock.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any, Protocol

_FROM_KEY = b"\x00"  # etcd's range_end for "every key >= key"


class _Interval(Protocol):
    key: bytes
    range_end: bytes
    gid: int


def _end(w: _Interval) -> tuple[int, bytes]:
    """The exclusive end as a comparable value: (1, b"") is past every key (a from-key watch)."""
    return (1, b"") if w.range_end == _FROM_KEY else (0, w.range_end)


class _Node:
    __slots__ = ("end", "left", "max_end", "order", "prio", "right", "w")

    def __init__(self, w: _Interval, prio: float) -> None:
        self.w = w
        self.order = (w.key, w.gid)
        self.end = _end(w)
        self.max_end = self.end
        self.prio = prio
        self.left: _Node | None = None
        self.right: _Node | None = None


def _fix(n: _Node) -> _Node:
    m = n.end
    if n.left is not None and n.left.max_end > m:
        m = n.left.max_end
    if n.right is not None and n.right.max_end > m:
        m = n.right.max_end
    n.max_end = m
    return n


def _split(n: _Node | None, order: tuple[bytes, int]) -> tuple[_Node | None, _Node | None]:
    """(nodes before `order`, nodes at or after it)."""
    if n is None:
        return None, None
    if n.order < order:
        n.right, right = _split(n.right, order)
        return _fix(n), right
    left, n.left = _split(n.left, order)
    return left, _fix(n)


def _merge(a: _Node | None, b: _Node | None) -> _Node | None:
    """Joins two treaps where every order in `a` precedes every order in `b`."""
    if a is None:
        return b
    if b is None:
        return a
    if a.prio > b.prio:
        a.right = _merge(a.right, b)
        return _fix(a)
    b.left = _merge(a, b.left)
    return _fix(b)


class WatchIndex:
    def __init__(self, seed: Any = None) -> None:
        self._keys: dict[bytes, dict[int, Any]] = {}
        self._root: _Node | None = None
        self._all: dict[int, Any] = {}
        self._rng = random.Random(seed)
        #: Watchers a stabbing query looked at, in total (tests count matching work with it).
        self.visited = 0

    def __len__(self) -> int:
        return len(self._all)

    def __contains__(self, gid: int) -> bool:
        return gid in self._all

    def values(self) -> Iterator[Any]:
        return iter(self._all.values())

    def add(self, w: Any) -> None:
        if w.gid in self._all:
            return
        self._all[w.gid] = w
        if not w.range_end:
            self._keys.setdefault(w.key, {})[w.gid] = w
            return
        node = _Node(w, self._rng.random())
        left, right = _split(self._root, node.order)
        self._root = _merge(_merge(left, node), right)

    def remove(self, w: Any) -> None:
        if self._all.pop(w.gid, None) is None:
            return
        if not w.range_end:
            same = self._keys.get(w.key)
            if same is not None:
                same.pop(w.gid, None)
                if not same:
                    del self._keys[w.key]
            return
        left, rest = _split(self._root, (w.key, w.gid))
        _, right = _split(rest, (w.key, w.gid + 1))
        self._root = _merge(left, right)

    def stab(self, key: bytes) -> list[Any]:
        """Every watcher whose interval holds `key` (filters such as NOPUT are the caller's)."""
        same = self._keys.get(key)
        out = list(same.values()) if same else []
        visited = len(out)
        probe = (0, key)
        stack = [self._root]
        while stack:
            n = stack.pop()
            if n is None or n.max_end <= probe:
                continue  # nothing below ends after `key`
            visited += 1
            stack.append(n.left)
            if n.w.key <= key:
                if n.end > probe:
                    out.append(n.w)
                stack.append(n.right)
        self.visited += visited
        return out
