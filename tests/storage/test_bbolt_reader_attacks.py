"""BoltReader on damaged and hostile files: a BoltError saying what is wrong, or a valid read;
never another exception, a crash or a hang. Reads are bounded by the file: one walk of a tree
reads each page in use at most once whatever the file's page ids, counts and overflow counts say
(checked here by counting the bytes read, not by timing).

Files are built by hand here (pages of any layout, any page size) or by write_db and then
damaged; a damaged meta page may be given a matching checksum again ("resealed"), so hostile
metas reach the rest of the reader too.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import struct
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from authstore.etcd_format.bbolt import (
    BRANCH_PAGE,
    BUCKET_LEAF_FLAG,
    FREELIST_PAGE,
    LEAF_PAGE,
    MAGIC,
    META_PAGE,
    PAGE_SIZE,
    BoltError,
    BoltReader,
    fnv1a64,
    write_db,
)

# ---------------------------------------------------------------------------------------------
# a hand builder: pages of any content, so a test can write what write_db never would


def _leaf(pgid: int, items: list[tuple[int, bytes, bytes]], *, ps: int = PAGE_SIZE) -> bytes:
    off = 16 + 16 * len(items)
    elems, data = b"", b""
    for i, (flags, key, value) in enumerate(items):
        elems += struct.pack("<IIII", flags, off - (16 + 16 * i), len(key), len(value))
        data += key + value
        off += len(key) + len(value)
    pages = max(1, -(-off // ps))
    return _pad(struct.pack("<QHHI", pgid, LEAF_PAGE, len(items), pages - 1) + elems + data, ps)


def _branch(pgid: int, children: list[tuple[bytes, int]], *, ps: int = PAGE_SIZE) -> bytes:
    off = 16 + 16 * len(children)
    elems, data = b"", b""
    for i, (key, child) in enumerate(children):
        elems += struct.pack("<IIQ", off - (16 + 16 * i), len(key), child)
        data += key
        off += len(key)
    return _pad(struct.pack("<QHHI", pgid, BRANCH_PAGE, len(children), 0) + elems + data, ps)


def _meta(pgid: int, *, root: int, hwm: int, txid: int, ps: int = PAGE_SIZE, freelist: int = 2) -> bytes:
    meta = struct.pack("<IIIIQQQQQ", MAGIC, 2, ps, 0, root, 0, freelist, hwm, txid)
    return _pad(struct.pack("<QHHI", pgid, META_PAGE, 0, 0) + meta + struct.pack("<Q", fnv1a64(meta)), ps)


def _pad(page: bytes, ps: int) -> bytes:
    return page + bytes(-len(page) % ps)


def _bucket(root: int) -> bytes:
    return struct.pack("<QQ", root, 0)


def _inline(items: list[tuple[int, bytes, bytes]]) -> bytes:
    """A bucket header with its leaf page inline (no padding)."""
    page = _leaf(0, items, ps=1)
    return _bucket(0) + page


def _db(path: Path, pages: list[bytes], *, root: int = 3, txids: tuple[int, int] = (0, 1), ps: int = PAGE_SIZE,
        roots: tuple[int, int] | None = None) -> Path:
    """Pages 0-1 metas, 2 an empty freelist, then `pages` (each already numbered from 3)."""
    body = _pad(struct.pack("<QHHI", 2, FREELIST_PAGE, 0, 0), ps) + b"".join(pages)
    hwm = 2 + len(body) // ps
    r0, r1 = roots or (root, root)
    path.write_bytes(
        _meta(0, root=r0, hwm=hwm, txid=txids[0], ps=ps) + _meta(1, root=r1, hwm=hwm, txid=txids[1], ps=ps) + body
    )
    return path


def _refused(path: Path, action: Callable[[BoltReader], object], match: str) -> None:
    with pytest.raises(BoltError, match=match), BoltReader(path) as reader:
        action(reader)


def _all(bucket: bytes) -> Callable[[BoltReader], object]:
    return lambda reader: list(reader.items(bucket))


# ---------------------------------------------------------------------------------------------
# what the reader must accept


def test_hand_built_file_reads(tmp_path: Path) -> None:
    """The builder above makes valid files (so the refusals below are about the one defect)."""
    path = _db(tmp_path / "db", [
        _leaf(3, [(BUCKET_LEAF_FLAG, b"a", _inline([(0, b"k", b"v")])), (BUCKET_LEAF_FLAG, b"b", _bucket(4))]),
        _branch(4, [(b"k1", 5), (b"k3", 6)]),
        _leaf(5, [(0, b"k1", b"1"), (0, b"k2", b"2")]),
        _leaf(6, [(0, b"k3", b"3")]),
    ])
    with BoltReader(path) as reader:
        assert reader.buckets() == [b"a", b"b"]
        assert list(reader.items(b"a")) == [(b"k", b"v")]
        assert list(reader.items(b"b")) == [(b"k1", b"1"), (b"k2", b"2"), (b"k3", b"3")]
        assert [reader.get(b"b", k) for k in (b"k0", b"k1", b"k2", b"k3", b"k4")] == [None, b"1", b"2", b"3", None]


@pytest.mark.parametrize("ps", [1024, 16384, 65536])
def test_other_page_sizes_read(tmp_path: Path, ps: int) -> None:
    """etcd's page size is the OS's: 16 KiB or 64 KiB on some arm64 and ppc64le systems."""
    path = _db(tmp_path / "db", [
        _leaf(3, [(BUCKET_LEAF_FLAG, b"b", _bucket(4))], ps=ps),
        _leaf(4, [(0, b"k", b"v" * (ps + 10))], ps=ps),
    ], ps=ps)
    with BoltReader(path) as reader:
        assert reader.page_size == ps
        assert list(reader.items(b"b")) == [(b"k", b"v" * (ps + 10))]


def test_newest_valid_meta_wins(tmp_path: Path) -> None:
    """bbolt reads the valid meta with the higher txid, and the other one if that is damaged."""
    pages = [_leaf(3, [(BUCKET_LEAF_FLAG, b"old", _inline([]))]), _leaf(4, [(BUCKET_LEAF_FLAG, b"new", _inline([]))])]
    path = _db(tmp_path / "db", pages, txids=(8, 7), roots=(4, 3))
    with BoltReader(path) as reader:
        assert (reader.buckets(), reader.txid) == ([b"new"], 8)
    data = bytearray(path.read_bytes())
    data[16 + 16] ^= 0xFF  # meta 0's root: its checksum no longer matches
    path.write_bytes(data)
    with BoltReader(path) as reader:
        assert (reader.buckets(), reader.txid) == ([b"old"], 7)


def test_bytes_after_the_pages_are_ignored(tmp_path: Path) -> None:
    """etcd's snapshot sha256 trailer, or pages bbolt preallocated and never used."""
    path = tmp_path / "db"
    with open(path, "wb") as out:
        write_db(out, [(b"b", [(b"k", b"v")])])
    data = path.read_bytes()
    for tail in (hashlib.sha256(data).digest(), bytes(3 * PAGE_SIZE)):
        path.write_bytes(data + tail)
        with BoltReader(path) as reader:
            assert reader.data_size == len(data)
            assert list(reader.items(b"b")) == [(b"k", b"v")]


# ---------------------------------------------------------------------------------------------
# what the reader must refuse, each with what is wrong


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", "not a bbolt database"),
        (b"\x00" * 100, "not a bbolt database"),
        (os.urandom(3 * PAGE_SIZE), "not a bbolt database"),
    ],
)
def test_not_a_database(tmp_path: Path, content: bytes, match: str) -> None:
    (tmp_path / "db").write_bytes(content)
    with pytest.raises(BoltError, match=match):
        BoltReader(tmp_path / "db")


def test_not_a_regular_file(tmp_path: Path) -> None:
    with pytest.raises(BoltError, match="not a regular file"):
        BoltReader(tmp_path)
    os.mkfifo(tmp_path / "fifo")  # opening must not wait for a writer
    with pytest.raises(BoltError, match="not a regular file"):
        BoltReader(tmp_path / "fifo")


def test_both_metas_damaged(tmp_path: Path) -> None:
    path = _db(tmp_path / "db", [_leaf(3, [])])
    data = bytearray(path.read_bytes())
    data[60] ^= 1
    data[PAGE_SIZE + 60] ^= 1
    path.write_bytes(data)
    with pytest.raises(BoltError, match="checksum"):
        BoltReader(path)


def test_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with open(path, "wb") as out:
        write_db(out, [(b"b", [(b"%05d" % i, b"v" * 50) for i in range(2000)])])
    data = path.read_bytes()
    for size in (len(data) - 1, len(data) // 2, PAGE_SIZE * 2 + 5):
        path.write_bytes(data[:size])
        with pytest.raises(BoltError, match="the file has"):
            BoltReader(path)


def test_file_larger_than_the_limit(tmp_path: Path) -> None:
    path = _db(tmp_path / "db", [_leaf(3, [])])
    with pytest.raises(BoltError, match="larger than the limit"):
        BoltReader(path, max_bytes=PAGE_SIZE)


def test_meta_pointing_outside(tmp_path: Path) -> None:
    for root in (0, 1, 4, 2**64 - 1):
        path = _db(tmp_path / "db", [_leaf(3, [])], root=root)
        with pytest.raises(BoltError, match="root bucket page"):
            BoltReader(path)


def _one_bucket(path: Path, *pages: bytes) -> Path:
    """Bucket b"b" rooted at page 4, then `pages` from page 4 on."""
    return _db(path, [_leaf(3, [(BUCKET_LEAF_FLAG, b"b", _bucket(4))]), *pages])


def test_cycles_end(tmp_path: Path) -> None:
    """A branch page naming itself, two naming each other, one child named twice."""
    leaf = _leaf(6, [(0, b"k", b"v")])
    for pages, lookup_loops in (
        ([_branch(4, [(b"a", 4), (b"k", 6)]), _leaf(5, []), leaf], True),
        ([_branch(4, [(b"a", 5)]), _branch(5, [(b"a", 4)]), leaf], True),
        ([_branch(4, [(b"a", 6), (b"b", 6)]), _leaf(5, []), leaf], False),  # a lookup meets the leaf once
    ):
        path = _one_bucket(tmp_path / "db", *pages)
        _refused(path, _all(b"b"), "cycle|spans more pages|out of order")
        if lookup_loops:
            _refused(path, lambda r: [r.get(b"b", k) for k in (b"a", b"k", b"z")], "cycle|spans more pages")


def test_pages_that_are_not_tree_pages(tmp_path: Path) -> None:
    for target, match in ((0, "outside the pages"), (1, "outside the pages"), (2, "not a leaf or branch"),
                          (99, "outside the pages"), (2**63, "outside the pages")):
        path = _one_bucket(tmp_path / "db", _branch(4, [(b"a", target)]))
        _refused(path, _all(b"b"), match)


def _with(path: Path, offset: int, fmt: str, value: int) -> Path:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    path.write_bytes(data)
    return path


def test_counts_offsets_and_overflows_outside_the_page(tmp_path: Path) -> None:
    at = 4 * PAGE_SIZE  # page 4, the bucket's leaf
    cases = [
        (at + 10, "<H", 0xFFFF, "do not fit"),  # count
        (at + 12, "<I", 0xFFFFFFFF, "overflow pages"),  # overflow
        (at + 0, "<Q", 7, "says it is page 7"),  # id
        (at + 8, "<H", 0x03, "flags"),  # flags
        (at + 16 + 4, "<I", 0xFFFFFFF0, "outside its page"),  # element 0's pos
        (at + 16 + 4, "<I", 0, "outside its page"),  # data on top of the elements
        (at + 16 + 8, "<I", 0xFFFFFFFF, "outside its page"),  # ksize
        (at + 16 + 12, "<I", PAGE_SIZE, "outside its page"),  # vsize
        (at + 16 + 8, "<I", 0, "empty key"),
        (at + 16, "<I", 0x80, "unknown flags"),
    ]
    for offset, fmt, value, match in cases:
        path = _one_bucket(tmp_path / "db", _leaf(4, [(0, b"k1", b"v1"), (0, b"k2", b"v2")]))
        _refused(_with(path, offset, fmt, value), _all(b"b"), match)


def test_elements_sharing_their_data(tmp_path: Path) -> None:
    """Every element naming the same big value would copy it out once each: refused instead."""
    page = bytearray(_leaf(4, [(0, b"k%03d" % i, b"") for i in range(200)] + [(0, b"z", b"v" * 200_000)]))
    (last_pos,) = struct.unpack_from("<I", page, 16 + 16 * 200 + 4)
    for i in range(200):
        # element i: key "z" and the big value, at element 200's data (pos counts from each element)
        struct.pack_into("<III", page, 16 + 16 * i + 4, 16 * (200 - i) + last_pos, 1, 200_000)
    path = _one_bucket(tmp_path / "db", bytes(page))
    _refused(path, _all(b"b"), "overlap")


def test_keys_out_of_order(tmp_path: Path) -> None:
    path = _one_bucket(tmp_path / "db", _leaf(4, [(0, b"k2", b""), (0, b"k1", b"")]))
    _refused(path, _all(b"b"), "out of order")


def test_nested_bucket_is_an_error(tmp_path: Path) -> None:
    """etcd has top-level buckets only; a bucket inside one is reported, not read or skipped."""
    path = _one_bucket(tmp_path / "db", _leaf(4, [(0, b"a", b"1"), (BUCKET_LEAF_FLAG, b"inner", _inline([]))]))
    _refused(path, _all(b"b"), "nested bucket b'inner'")
    _refused(path, lambda r: r.get(b"b", b"inner"), "nested bucket b'inner'")
    with BoltReader(path) as reader:
        assert reader.get(b"b", b"a") == b"1"


def test_plain_key_in_the_root_bucket(tmp_path: Path) -> None:
    path = _db(tmp_path / "db", [_leaf(3, [(0, b"k", b"v")])])
    _refused(path, lambda r: r.buckets(), "plain key")
    _refused(path, _all(b"k"), "plain key")


def test_short_bucket_header_and_bad_inline_page(tmp_path: Path) -> None:
    for value, match in ((b"\x00" * 8, "header of 8 bytes"), (_bucket(0) + b"\x00" * 4, "no page header"),
                         (_bucket(0) + struct.pack("<QHHI", 0, BRANCH_PAGE, 0, 0), "not a leaf page"),
                         (_bucket(0) + struct.pack("<QHHI", 0, LEAF_PAGE, 3, 0), "do not fit")):
        path = _db(tmp_path / "db", [_leaf(3, [(BUCKET_LEAF_FLAG, b"b", value)])])
        _refused(path, _all(b"b"), match)


def test_closed_reader(tmp_path: Path) -> None:
    path = _db(tmp_path / "db", [_leaf(3, [])])
    reader = BoltReader(path)
    reader.close()
    reader.close()
    with pytest.raises(ValueError, match="closed"):
        reader.buckets()


# ---------------------------------------------------------------------------------------------
# fuzz: damage valid files at random


@functools.cache
def _base() -> bytes:
    """A write_db file with every page kind: inline, empty and big buckets, overflow values, two
    branch levels, a branching root."""
    import io

    buckets = [(b"a", [(b"k", b"v")]), (b"b", [(b"%06d" % i, b"x" * (i % 90)) for i in range(6000)]),
               (b"c", [(b"big%d" % i, bytes([i]) * (i * 2500)) for i in range(1, 5)]), (b"d", [])]
    buckets += [(b"e%04d" % i, []) for i in range(400)]
    out = io.BytesIO()
    write_db(out, buckets)
    return out.getvalue()


_U32 = [0, 1, 2, 3, 15, 16, 17, 255, 4095, 4096, 4097, 0x7FFF, 0xFFFF, 0x10000, 0x7FFFFFFF, 0xFFFFFFFF]
_U64 = [0, 1, 2, 3, 4, 100, 2**32, 2**63, 2**64 - 1]


def _mutation(pages: int) -> st.SearchStrategy[tuple[int, str, int]]:
    """(offset, struct format, value): one field of one page, or one byte anywhere."""
    page = st.integers(0, pages - 1)
    header = st.tuples(page, st.sampled_from([(0, "<Q"), (8, "<H"), (10, "<H"), (12, "<I")]),
                       st.one_of(st.sampled_from(_U32), st.integers(0, pages + 2)))
    element = st.tuples(page, st.tuples(st.integers(0, 30), st.sampled_from([0, 4, 8, 12])).map(
        lambda t: (16 + 16 * t[0] + t[1], "<I")), st.one_of(st.sampled_from(_U32), st.integers(0, pages + 2)))
    child = st.tuples(page, st.integers(0, 30).map(lambda i: (16 + 16 * i + 8, "<Q")),
                      st.one_of(st.sampled_from(_U64), st.integers(0, pages + 2)))
    meta = st.tuples(st.integers(0, 1), st.sampled_from([(16 + 8, "<I"), (16 + 16, "<Q"), (16 + 32, "<Q"),
                                                         (16 + 40, "<Q"), (16 + 48, "<Q")]),
                     st.one_of(st.sampled_from(_U64[:-1] + [PAGE_SIZE, 1024]), st.integers(0, pages + 2)))
    fields = st.one_of(header, element, child, meta).map(lambda t: (t[0] * PAGE_SIZE + t[1][0], t[1][1], t[2]))
    flip = st.tuples(st.integers(0, pages * PAGE_SIZE - 1), st.just("<B"), st.integers(0, 255))
    return st.one_of(fields, flip)


def _exercise(path: Path) -> int:
    """Everything a caller does with a file; each call either works or raises BoltError. The
    number of calls made."""
    calls = 1
    try:
        reader = BoltReader(path)
    except BoltError:
        return calls
    with reader:
        names: list[bytes] = [b"a", b"b", b"c", b"d", b"e0007", b"zz"]
        calls += 1
        with contextlib.suppress(BoltError):
            names += reader.buckets()
        for name in names[:12]:
            calls += 1
            with contextlib.suppress(BoltError, KeyError):
                list(reader.items(name))
            for key in (b"003000", b"big3", b"k"):
                calls += 1
                with contextlib.suppress(BoltError, KeyError):
                    reader.get(name, key)
    return calls


@given(
    mutations=st.lists(_mutation(len(_base()) // PAGE_SIZE), min_size=1, max_size=6),
    cut=st.one_of(st.none(), st.integers(0, len(_base()))),
    reseal=st.booleans(),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_damaged_files_are_read_or_refused(tmp_path_factory: pytest.TempPathFactory,
                                           mutations: list[tuple[int, str, int]], cut: int | None,
                                           reseal: bool) -> None:
    data = bytearray(_base())
    for offset, fmt, value in mutations:
        if offset + struct.calcsize(fmt) <= len(data):
            struct.pack_into(fmt, data, offset, value & ((1 << (8 * struct.calcsize(fmt))) - 1))
    if reseal:  # the damage reaches past the meta checksum
        for pgid in (0, 1):
            meta = bytes(data[pgid * PAGE_SIZE + 16 : pgid * PAGE_SIZE + 72])
            struct.pack_into("<Q", data, pgid * PAGE_SIZE + 72, fnv1a64(meta))
    if cut is not None:
        del data[cut:]
    path = tmp_path_factory.mktemp("fuzz") / "db"
    path.write_bytes(data)

    read = [0, 0]  # bytes, calls
    real_pread = os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        read[0] += n
        read[1] += 1
        return real_pread(fd, n, offset)

    with mock.patch.object(os, "pread", counting_pread):
        calls = _exercise(path)
    # every call reads at most each page in use twice (a bucket's lookup, then its walk)
    pages = len(data) // PAGE_SIZE + 2
    assert read[0] <= calls * 2 * (len(data) + 16 * pages) + 2 * 65536
    assert read[1] <= calls * 4 * pages + 2 * 32


def test_overflow_counts_cannot_make_reads_quadratic(tmp_path: Path) -> None:
    """100 leaves that each claim to run to the end of the file: a walk stops once it has read
    as many pages as the file has, instead of reading the rest of the file once per leaf."""
    count = 100
    hwm = 5 + count
    leaves = []
    for i in range(count):
        page = bytearray(_leaf(5 + i, [(0, b"k%03d" % i, b"v")]))
        struct.pack_into("<I", page, 12, hwm - 1 - (5 + i))  # overflow: to the last page
        leaves.append(bytes(page))
    path = _one_bucket(tmp_path / "db", _branch(4, [(b"k%03d" % i, 5 + i) for i in range(count)]), *leaves)
    read = [0]
    real_pread = os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        read[0] += n
        return real_pread(fd, n, offset)

    with mock.patch.object(os, "pread", counting_pread), BoltReader(path) as reader:
        with contextlib.suppress(BoltError):
            list(reader.items(b"b"))
        with contextlib.suppress(BoltError):
            reader.get(b"b", b"k050")
    assert read[0] <= 3 * path.stat().st_size
