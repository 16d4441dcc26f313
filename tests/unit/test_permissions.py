"""Key-range permission coverage (authstore/state/auth/permissions.py) against a brute-force model.

The model checks every key of a finite universe that contains every grant and request endpoint:
if the union of grants misses part of [key, range_end), the lowest missed key is the request's
key or the end of some grant, so checking the universe is exact, not a sample.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from authstore.state.auth.permissions import IntervalSet, UserPermissions, grant_interval, merge
from protos.authpb import auth_pb2

READ, WRITE, READWRITE = auth_pb2.Permission.READ, auth_pb2.Permission.WRITE, auth_pb2.Permission.READWRITE

ALPHABET = b"\x00\x01abcd"  # \x01 and d: prefix ends of "\x00" and of "...c"
# "\xff" lies above every finite endpoint: it stands for "up to +inf".
UNIVERSE = [*sorted(bytes(p) for n in range(1, 5) for p in itertools.product(ALPHABET, repeat=n)), b"\xff"]


def prefix_end(key: bytes) -> bytes:
    """etcdctl's GetPrefixRangeEnd."""
    for i in range(len(key) - 1, -1, -1):
        if key[i] < 0xFF:
            return key[:i] + bytes([key[i] + 1])
    return b"\x00"


keys = st.lists(st.sampled_from(b"abc"), min_size=1, max_size=3).map(bytes) | st.just(b"\x00")


@st.composite
def ranges(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(key, range_end) as clients send them: single key, range, prefix, from-key, or inverted."""
    key = draw(keys)
    kind = draw(st.sampled_from(["single", "range", "prefix", "from", "whole"]))
    if kind == "single":
        return key, b""
    if kind == "prefix":
        return key, prefix_end(key)
    if kind == "from":
        return key, b"\x00"
    if kind == "whole":
        return b"\x00", b"\x00"
    return key, draw(keys)


def model_contains(grant: tuple[bytes, bytes], u: bytes) -> bool:
    key, end = grant
    if not end:
        return u == key
    if end == b"\x00":
        return u >= key
    return key <= u < end


def model_covers(grants: list[tuple[bytes, bytes]], key: bytes, end: bytes) -> bool:
    def hit(u: bytes) -> bool:
        return any(model_contains(g, u) for g in grants)

    if not key:
        return False
    if not end or (end != b"\x00" and end <= key):
        return hit(key)  # etcd checks an empty/inverted range like the point `key`
    upper = None if end == b"\x00" else end
    return all(hit(u) for u in UNIVERSE if u >= key and (upper is None or u < upper))


def perms(*grants: tuple[int, bytes, bytes]) -> UserPermissions:
    return UserPermissions.from_permissions(auth_pb2.Permission(permType=t, key=k, range_end=e) for t, k, e in grants)


@settings(max_examples=300, deadline=None)
@given(st.lists(ranges(), max_size=6), st.lists(ranges(), min_size=1, max_size=8))
def test_coverage_matches_model(grants: list[tuple[bytes, bytes]], requests: list[tuple[bytes, bytes]]) -> None:
    ivs = IntervalSet.of(iv for k, e in grants if (iv := grant_interval(k, e)) is not None)
    for key, end in requests:
        assert ivs.covers(key, end) == model_covers(grants, key, end), (grants, key, end)


@settings(max_examples=200, deadline=None)
@given(st.lists(ranges(), max_size=8))
def test_merged_intervals_are_sorted_disjoint_and_not_touching(grants: list[tuple[bytes, bytes]]) -> None:
    merged = merge(iv for k, e in grants if (iv := grant_interval(k, e)) is not None)
    for (b1, e1), (b2, _) in itertools.pairwise(merged):
        assert e1 is not None and e1 < b2
        assert b1 < b2
    for b, e in merged:
        assert e is None or b < e


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([READ, WRITE, READWRITE]), ranges()), max_size=6), ranges())
def test_read_and_write_are_separate(grants: list[tuple[int, tuple[bytes, bytes]]], req: tuple[bytes, bytes]) -> None:
    up = perms(*((t, k, e) for t, (k, e) in grants))
    reads = [r for t, r in grants if t in (READ, READWRITE)]
    writes = [r for t, r in grants if t in (WRITE, READWRITE)]
    assert up.covers(*req, write=False) == model_covers(reads, *req)
    assert up.covers(*req, write=True) == model_covers(writes, *req)


# ---- etcd's own examples (range_perm_cache_test.go, reference §5.2) ----


def test_gap_between_ranges_denies_the_whole_range_and_points_in_the_gap() -> None:
    p = perms((READ, b"a", b"c"), (READ, b"x", b"z"))
    assert not p.covers(b"a", b"z", write=False)
    assert not p.covers(b"f", b"", write=False)
    assert p.covers(b"a", b"c", write=False) and p.covers(b"b", b"", write=False) and p.covers(b"y", b"", write=False)


def test_adjacent_and_overlapping_grants_merge() -> None:
    assert perms((READ, b"a", b"f"), (READ, b"c", b"d"), (READ, b"f", b"z")).covers(b"a", b"z", write=False)
    assert perms((READ, b"a", b"c"), (READ, b"c", b"z")).covers(b"a", b"z", write=False)


def test_open_ended_request_needs_open_ended_grant() -> None:
    p = perms((READ, b"a", b"d"), (READ, b"a", b"b"), (READ, b"c", b"f"))
    assert not p.covers(b"a", b"\x00", write=False)
    assert p.covers(b"d", b"", write=False)
    assert not p.covers(b"f", b"", write=False)
    assert perms((READ, b"a", b"\x00")).covers(b"a", b"\x00", write=False)
    assert perms((READ, b"a", b"\x00")).covers(b"zzz", b"\x00", write=False)
    assert not perms((READ, b"b", b"\x00")).covers(b"a", b"\x00", write=False)


def test_whole_key_space_grant_covers_everything() -> None:
    p = perms((READWRITE, b"\x00", b"\x00"))
    for key, end in [(b"\x00", b"\x00"), (b"a", b""), (b"\xff\xff", b""), (b"a", b"\x00"), (b"\x00", b"\xff")]:
        assert p.covers(key, end, write=False) and p.covers(key, end, write=True)


def test_single_key_grant_is_only_that_key() -> None:
    p = perms((WRITE, b"foo", b""))
    assert p.covers(b"foo", b"", write=True)
    assert p.covers(b"foo", b"foo\x00", write=True)
    assert not p.covers(b"foo", b"foo\x00\x00", write=True)
    assert not p.covers(b"foo\x00", b"", write=True)
    assert not p.covers(b"fo", b"", write=True)
    assert not p.covers(b"foo", b"\x00", write=True)
    assert not p.covers(b"foo", b"", write=False)


def test_prefix_grant() -> None:
    p = perms((READ, b"foo/", prefix_end(b"foo/")))
    assert p.covers(b"foo/", b"", write=False)
    assert p.covers(b"foo/bar", b"", write=False)
    assert p.covers(b"foo/", b"foo0", write=False)
    assert p.covers(b"foo/a", b"foo/b", write=False)
    assert not p.covers(b"foo", b"", write=False)
    assert not p.covers(b"foo/", b"\x00", write=False)


@pytest.mark.parametrize("end", [b"a", b"b"])
def test_empty_or_inverted_request_range_is_checked_as_its_key(end: bytes) -> None:
    assert perms((READ, b"b", b"")).covers(b"b", end, write=False)
    assert not perms((READ, b"c", b"d")).covers(b"b", end, write=False)


def test_empty_key_is_never_covered() -> None:
    p = perms((READWRITE, b"\x00", b"\x00"))
    assert not p.covers(b"", b"", write=False)
    assert not p.covers(b"", b"\x00", write=False)


def test_invalid_or_unknown_grants_grant_nothing() -> None:
    p = UserPermissions.from_permissions(
        [
            auth_pb2.Permission(permType=READ, key=b"", range_end=b"\x00"),
            auth_pb2.Permission(permType=READ, key=b"b", range_end=b"a"),
            auth_pb2.Permission(permType=7, key=b"a", range_end=b"\x00"),  # type: ignore[arg-type]
        ]
    )
    assert len(p.read) == 0 and len(p.write) == 0
