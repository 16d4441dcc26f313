"""authstore.etcd_format.bbolt: what write_db writes, BoltReader reads back unchanged, and the
same input always gives the same bytes; malformed input is a ValueError before or while writing.

The reader's side of hostile files is in test_bbolt_reader_attacks.py, and the checks against
etcd's own tools (a real snapshot read, a written file accepted) in test_bbolt_etcd_interop.py.
"""

from __future__ import annotations

import io
import random
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from authstore.etcd_format.bbolt import BRANCH_PAGE, PAGE_SIZE, BoltReader, write_db
from tests.support.bbolt_data import Buckets, big, bucket_sets, many


def _write(path: Path, buckets: Buckets, **kw: int) -> bytes:
    with open(path, "wb") as out:
        written = write_db(out, buckets, **kw)
    data = path.read_bytes()
    assert written == len(data)
    assert len(data) % PAGE_SIZE == 0
    return data


def _assert_reads_back(path: Path, buckets: Buckets) -> None:
    with BoltReader(path) as reader:
        assert reader.buckets() == [name for name, _ in buckets]
        for name, items in buckets:
            assert list(reader.items(name)) == items
            for key, value in items[:: max(1, len(items) // 20)]:
                assert reader.get(name, key) == value
            assert reader.get(name, b"\xff" * 40) is None or (b"\xff" * 40) in dict(items)
        with pytest.raises(KeyError):
            reader.items(b"\x00no such bucket\x00")
        with pytest.raises(KeyError):
            reader.get(b"\x00no such bucket\x00", b"k")


def _page_flags(data: bytes) -> Iterator[int]:
    """The flags of every page in a file (following overflow counts)."""
    pgid = 0
    while pgid * PAGE_SIZE < len(data):
        _, flags, _, overflow = struct.unpack_from("<QHHI", data, pgid * PAGE_SIZE)
        yield flags
        pgid += overflow + 1


def _first_key(data: bytes, pgid: int) -> bytes:
    """The first key under page `pgid` (its leftmost leaf's first key)."""
    at = pgid * PAGE_SIZE
    _, flags, count, _ = struct.unpack_from("<QHHI", data, at)
    assert count > 0
    if flags == BRANCH_PAGE:
        pos, ksize, child = struct.unpack_from("<IIQ", data, at + 16)
        key = data[at + 16 + pos : at + 16 + pos + ksize]
        assert _first_key(data, child) == key
        return key
    _, pos, ksize, _ = struct.unpack_from("<IIII", data, at + 16)
    return data[at + 16 + pos : at + 16 + pos + ksize]


def _assert_branch_keys_are_first_keys(data: bytes) -> None:
    """Newer bbolt's check (1.3.7+) wants each branch key to be the least key under it and
    below the next branch key; write_db uses each child's first key, as bbolt's own writes do."""
    pgid = 0
    while pgid * PAGE_SIZE < len(data):
        _, flags, count, overflow = struct.unpack_from("<QHHI", data, pgid * PAGE_SIZE)
        if flags == BRANCH_PAGE:
            keys = []
            for i in range(count):
                at = pgid * PAGE_SIZE + 16 + 16 * i
                pos, ksize, child = struct.unpack_from("<IIQ", data, at)
                keys.append(data[at + pos : at + pos + ksize])
                assert _first_key(data, child) == keys[-1]
            assert keys == sorted(set(keys))
        pgid += overflow + 1


@given(buckets=bucket_sets)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_round_trip(tmp_path_factory: pytest.TempPathFactory, buckets: Buckets) -> None:
    path = tmp_path_factory.mktemp("bolt") / "db"
    _write(path, buckets)
    _assert_reads_back(path, buckets)


def test_round_trip_with_branch_levels_big_values_and_long_keys(tmp_path: Path) -> None:
    """Thousands of keys (two branch levels), values of several pages, keys longer than a page
    (branch pages with overflow), empty and inline buckets side by side."""
    rng = random.Random(7)
    many = sorted({rng.randbytes(16): rng.randbytes(rng.randint(0, 300)) for _ in range(60_000)}.items())
    long_keys = sorted((bytes([i]) * 5000 + b"k", b"v%d" % i) for i in range(1, 12))
    buckets: Buckets = [
        (b"\x00", []),
        (b"big", sorted(big([0, PAGE_SIZE - 40, PAGE_SIZE, 5 * PAGE_SIZE + 3, 1 << 20]).items())),
        (b"empty", []),
        (b"long", long_keys),
        (b"many", many),
        (b"small", [(b"a", b"1"), (b"b", b"2")]),
    ]
    data = _write(tmp_path / "db", buckets)
    assert list(_page_flags(data)).count(BRANCH_PAGE) > 10
    _assert_branch_keys_are_first_keys(data)
    _assert_reads_back(tmp_path / "db", buckets)


def test_manybucket_sets_make_a_branching_root(tmp_path: Path) -> None:
    buckets: Buckets = [(b"bucket-%05d" % i, [(b"k", b"v")] if i % 3 else []) for i in range(2000)]
    data = _write(tmp_path / "db", buckets)
    assert BRANCH_PAGE in set(_page_flags(data))
    _assert_branch_keys_are_first_keys(data)
    _assert_reads_back(tmp_path / "db", buckets)


def test_empty_database(tmp_path: Path) -> None:
    data = _write(tmp_path / "db", [])
    assert len(data) == 4 * PAGE_SIZE  # two metas, the freelist, the empty root bucket
    with BoltReader(tmp_path / "db") as reader:
        assert reader.buckets() == []


@given(buckets=bucket_sets, tx_id=st.integers(1, 2**64 - 1))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_same_input_same_bytes(buckets: Buckets, tx_id: int) -> None:
    first, second = io.BytesIO(), io.BytesIO()
    write_db(first, buckets, tx_id=tx_id)
    # generators, not lists: the writer streams its input
    write_db(second, ((name, iter(items)) for name, items in buckets), tx_id=tx_id)
    assert first.getvalue() == second.getvalue()


def test_reader_reports_the_newest_txid(tmp_path: Path) -> None:
    for tx_id in (1, 2, 1234567):
        _write(tmp_path / "db", [(b"b", [(b"k", b"v")])], tx_id=tx_id)
        with BoltReader(tmp_path / "db") as reader:
            assert reader.txid == tx_id
            assert reader.page_size == PAGE_SIZE


class _PipeOnly(io.RawIOBase):
    """A stream that cannot seek (a pipe, a socket): the writer must still produce the file."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.data += b
        return len(b)


def test_unseekable_output_gets_the_same_bytes() -> None:
    buckets: Buckets = [(b"a", sorted(many(500, 1).items())), (b"b", [])]
    seekable, pipe = io.BytesIO(), _PipeOnly()
    assert write_db(pipe, buckets) == write_db(seekable, buckets)
    assert bytes(pipe.data) == seekable.getvalue()


def test_writer_starts_at_the_stream_position(tmp_path: Path) -> None:
    """A caller may put the database after other bytes of its own; metas land at its start."""
    out = io.BytesIO()
    out.write(b"prefix")
    written = write_db(out, [(b"b", [(b"k", b"v")])])
    assert out.getvalue()[:6] == b"prefix"
    (tmp_path / "db").write_bytes(out.getvalue()[6:])
    assert len(out.getvalue()) == 6 + written
    with BoltReader(tmp_path / "db") as reader:
        assert list(reader.items(b"b")) == [(b"k", b"v")]


@pytest.mark.parametrize(
    ("buckets", "message"),
    [
        ([(b"b", []), (b"a", [])], "ascending"),
        ([(b"a", []), (b"a", [])], "ascending"),
        ([(b"", [])], "empty"),
        ([(b"a", [(b"k2", b""), (b"k1", b"")])], "ascending"),
        ([(b"a", [(b"k", b""), (b"k", b"")])], "ascending"),
        ([(b"a", [(b"", b"v")])], "empty"),
        ([(b"a", [(b"x" * 32769, b"v")])], "32768"),
    ],
)
def test_bad_input_is_a_value_error(buckets: Buckets, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write_db(io.BytesIO(), buckets)


def test_tx_id_must_be_positive() -> None:
    with pytest.raises(ValueError):
        write_db(io.BytesIO(), [], tx_id=0)


def test_writer_memory_does_not_grow_with_the_database(tmp_path: Path) -> None:
    """150,000 pairs from a generator (a 28 MB file): the writer keeps one leaf page and one small
    entry per leaf written, not the database."""
    import tracemalloc

    def pairs() -> Iterator[tuple[bytes, bytes]]:
        for i in range(150_000):
            yield b"%016d" % i, b"v" * 150

    tracemalloc.start()
    try:
        with open(tmp_path / "db", "wb") as out:
            written = write_db(out, [(b"b", pairs())])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert written > 25_000_000
    assert peak < 5_000_000


def test_file_opened_for_appending(tmp_path: Path) -> None:
    """A file opened with "ab" cannot be written at an earlier position: its metas still land at
    the start of the database, after what the file held."""
    path = tmp_path / "db"
    path.write_bytes(b"head")
    with open(path, "ab") as out:
        written = write_db(out, [(b"b", [(b"k", b"v")])])
    data = path.read_bytes()
    assert data[:4] == b"head" and len(data) == 4 + written
    (tmp_path / "db2").write_bytes(data[4:])
    with BoltReader(tmp_path / "db2") as reader:
        assert list(reader.items(b"b")) == [(b"k", b"v")]
