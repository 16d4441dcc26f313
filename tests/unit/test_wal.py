"""The write-ahead log: what survives a crash, what is cut, and what stops the node."""

from __future__ import annotations

from pathlib import Path

import pytest

from authstore.log.wal import WAL, Entry, WALCorrupt


def _entries(first: int, count: int, size: int = 40) -> list[Entry]:
    return [Entry(i, 1, bytes([i % 251]) * size) for i in range(first, first + count)]


def test_entries_survive_reopen_across_segments(tmp_path: Path) -> None:
    wal = WAL(tmp_path, segment_bytes=256)
    for start in range(1, 40, 3):
        wal.append(_entries(start, 3))
    wal.close()
    assert len(list(tmp_path.glob("*.wal"))) > 1
    wal = WAL(tmp_path, segment_bytes=256)
    assert (wal.first_index, wal.last_index) == (1, 39)
    got = list(wal.entries_from(17))
    assert [e.index for e in got] == list(range(17, 40))
    assert got[0].data == bytes([17]) * 40


def test_torn_tail_is_cut(tmp_path: Path) -> None:
    wal = WAL(tmp_path)
    wal.append(_entries(1, 5))
    wal.close()
    segment = next(tmp_path.glob("*.wal"))
    whole = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(b"\x00\x00\x01\x00partial")  # a frame whose body never made it to disk
    wal = WAL(tmp_path)
    assert wal.last_index == 5
    assert segment.stat().st_size == whole
    wal.append(_entries(6, 1))
    assert [e.index for e in wal.entries_from(1)][-1] == 6


def test_corrupt_tail_record_is_cut(tmp_path: Path) -> None:
    wal = WAL(tmp_path)
    wal.append(_entries(1, 3))
    wal.close()
    segment = next(tmp_path.glob("*.wal"))
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF  # the last record's checksum no longer matches
    segment.write_bytes(bytes(data))
    assert WAL(tmp_path).last_index == 2


def test_corruption_before_the_tail_stops_the_node(tmp_path: Path) -> None:
    wal = WAL(tmp_path, segment_bytes=128)
    for start in range(1, 20, 2):
        wal.append(_entries(start, 2))
    wal.close()
    first = sorted(tmp_path.glob("*.wal"))[0]
    data = bytearray(first.read_bytes())
    data[20] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(WALCorrupt, match="checksum mismatch"):
        WAL(tmp_path, segment_bytes=128)


def test_release_keeps_what_is_not_applied(tmp_path: Path) -> None:
    wal = WAL(tmp_path, segment_bytes=128)
    for start in range(1, 30, 2):
        wal.append(_entries(start, 2))
    wal.release(15)
    assert wal.first_index <= 16
    assert [e.index for e in wal.entries_from(16)][:3] == [16, 17, 18]
    wal.close()
    reopened = WAL(tmp_path, segment_bytes=128)
    assert reopened.last_index == 30


def test_log_continues_after_the_applied_index_when_empty(tmp_path: Path) -> None:
    wal = WAL(tmp_path, applied_index=500)
    assert wal.last_index == 500
    wal.append(_entries(501, 1))
    with pytest.raises(ValueError, match="log gap"):
        wal.append(_entries(503, 1))


def test_store_ahead_of_a_non_empty_log_is_refused(tmp_path: Path) -> None:
    wal = WAL(tmp_path)
    wal.append(_entries(1, 2))
    wal.close()
    with pytest.raises(WALCorrupt, match="past the log's end"):
        WAL(tmp_path, applied_index=10)
