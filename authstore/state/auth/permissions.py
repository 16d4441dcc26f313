"""A user's key permissions as merged, sorted, disjoint intervals, checked in O(log n).

Why merged intervals instead of etcd's interval tree: once overlapping and adjacent grants are
joined, "is [key, range_end) covered by the union of the grants" becomes "does the one interval
that contains `key` reach `range_end`", a single bisect. The answers are those of etcd 3.7.1's
``checkKeyPoint`` / ``checkKeyInterval`` (reference §5.1, §5.2), including its corner cases:

* a grant ``(k, "")`` is the point ``[k, k + "\\x00")``; ``(k, "\\x00")`` is ``[k, +inf)``;
* a request ``range_end`` of ``""`` is a point check: some grant contains ``key``;
* a request ``range_end`` of ``"\\x00"`` means ``[key, +inf)``: only open-ended grants reach it;
* a request whose ``range_end`` is at or below ``key`` (an empty range) is treated as a point
  check on ``key`` — that is what etcd's tree walk yields for such intervals;
* the empty key is etcd's "+inf" and is never covered.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from protos.authpb import auth_pb2

#: End of an open-ended interval.
INF: None = None

OPEN_END = b"\x00"

Interval = tuple[bytes, bytes | None]


def grant_interval(key: bytes, range_end: bytes) -> Interval | None:
    """The interval a stored Permission grants, or None if it grants nothing (empty or inverted)."""
    if not key:
        return None  # the empty key is +inf in etcd's byte order: nothing lies at or beyond it
    if not range_end:
        return (key, key + b"\x00")
    if range_end == OPEN_END:
        return (key, INF)
    if range_end <= key:
        return None
    return (key, range_end)


def _end_lt(a: bytes | None, b: bytes | None) -> bool:
    """a < b where None is +inf."""
    if a is None:
        return False
    return b is None or a < b


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorts and joins overlapping or touching intervals (``[a,c) + [c,z) = [a,z)``)."""
    out: list[Interval] = []
    for begin, end in sorted(intervals, key=lambda iv: iv[0]):
        if out:
            last_begin, last_end = out[-1]
            if last_end is None or begin <= last_end:  # overlaps or touches the previous one
                if _end_lt(last_end, end):
                    out[-1] = (last_begin, end)
                continue
        out.append((begin, end))
    return out


@dataclass(frozen=True, slots=True)
class IntervalSet:
    """Disjoint, sorted, non-touching intervals; ``ends[i] is None`` means +inf."""

    begins: tuple[bytes, ...] = ()
    ends: tuple[bytes | None, ...] = ()

    @classmethod
    def of(cls, intervals: Iterable[Interval]) -> IntervalSet:
        merged = merge(intervals)
        return cls(tuple(b for b, _ in merged), tuple(e for _, e in merged))

    def intervals(self) -> list[Interval]:
        return list(zip(self.begins, self.ends, strict=True))

    def __len__(self) -> int:
        return len(self.begins)

    def _containing(self, key: bytes) -> int:
        """Index of the interval that contains `key`, or -1."""
        i = bisect.bisect_right(self.begins, key) - 1
        if i < 0:
            return -1
        end = self.ends[i]
        return i if end is None or key < end else -1

    def covers(self, key: bytes, range_end: bytes = b"") -> bool:
        """Whether the request (key, range_end), in etcd's encoding, lies inside the union."""
        if not key:
            return False
        i = self._containing(key)
        if i < 0:
            return False
        if not range_end or (range_end != OPEN_END and range_end <= key):
            return True  # a point, or an empty/inverted range that etcd checks like the point `key`
        end = self.ends[i]
        if end is None:
            return True
        if range_end == OPEN_END:
            return False  # [key, +inf) needs an open-ended grant
        return range_end <= end


@dataclass(frozen=True, slots=True)
class UserPermissions:
    """The union of all of one user's roles, split by what it allows (READWRITE counts for both)."""

    read: IntervalSet = field(default_factory=IntervalSet)
    write: IntervalSet = field(default_factory=IntervalSet)

    @classmethod
    def from_permissions(cls, perms: Iterable[auth_pb2.Permission]) -> UserPermissions:
        """Unknown permission types grant nothing, as in etcd's cache builder."""
        read: list[Interval] = []
        write: list[Interval] = []
        for perm in perms:
            ivl = grant_interval(perm.key, perm.range_end)
            if ivl is None:
                continue
            if perm.permType in (auth_pb2.Permission.READ, auth_pb2.Permission.READWRITE):
                read.append(ivl)
            if perm.permType in (auth_pb2.Permission.WRITE, auth_pb2.Permission.READWRITE):
                write.append(ivl)
        return cls(IntervalSet.of(read), IntervalSet.of(write))

    def covers(self, key: bytes, range_end: bytes, *, write: bool) -> bool:
        return (self.write if write else self.read).covers(key, range_end)
