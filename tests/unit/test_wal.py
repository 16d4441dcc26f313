"""The Raft write-ahead log: what survives a crash, what is cut, and what stops the node."""

from __future__ import annotations

from pathlib import Path

import pytest

from authstore.log.wal import WAL, WALCorrupt
from authstore.raft.types import ConfState, Entry, EntryType, HardState, SnapshotMetadata


def _entries(first: int, count: int, term: int = 1, size: int = 40) -> list[Entry]:
    return [Entry(term, i, EntryType.NORMAL, bytes([i % 251]) * size) for i in range(first, first + count)]


def test_entries_and_hard_state_survive_reopen_across_segments(tmp_path: Path) -> None:
    wal = WAL(tmp_path, segment_bytes=256)
    for start in range(1, 40, 3):
        wal.save(HardState(1, 7, start), _entries(start, 3))
    wal.close()
    assert len(list(tmp_path.glob("*.wal"))) > 1
    got = WAL(tmp_path, segment_bytes=256).replayed
    assert [e.index for e in got.entries] == list(range(1, 40))
    assert got.entries[16].data == bytes([17]) * 40
    assert got.hard_state == HardState(1, 7, 37)


def test_a_new_leader_overwrites_an_uncommitted_suffix(tmp_path: Path) -> None:
    wal = WAL(tmp_path)
    wal.save(HardState(1, 1, 2), _entries(1, 5, term=1))
    wal.save(HardState(2, 2, 2), _entries(3, 1, term=2))  # entries 3..5 of term 1 are replaced
    wal.close()
    got = WAL(tmp_path).replayed
    assert [(e.index, e.term) for e in got.entries] == [(1, 1), (2, 1), (3, 2)]


def test_torn_tail_is_cut(tmp_path: Path) -> None:
    wal = WAL(tmp_path)
    wal.save(HardState(1, 0, 5), _entries(1, 5))
    wal.close()
    segment = next(tmp_path.glob("*.wal"))
    whole = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(b"\x00\x00\x01\x00partial")  # a frame whose body never made it to disk
    wal = WAL(tmp_path)
    assert wal.replayed.entries[-1].index == 5
    assert segment.stat().st_size == whole
    wal.save(None, _entries(6, 1))
    wal.close()
    assert WAL(tmp_path).replayed.entries[-1].index == 6


def test_corrupt_tail_record_is_cut(tmp_path: Path) -> None:
    wal = WAL(tmp_path)
    wal.save(None, _entries(1, 3))
    wal.close()
    segment = next(tmp_path.glob("*.wal"))
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF  # the last record's checksum no longer matches
    segment.write_bytes(bytes(data))
    assert [e.index for e in WAL(tmp_path).replayed.entries] == [1, 2]


def test_corruption_before_the_tail_stops_the_node(tmp_path: Path) -> None:
    wal = WAL(tmp_path, segment_bytes=128)
    for start in range(1, 20, 2):
        wal.save(None, _entries(start, 2))
    wal.close()
    first = sorted(tmp_path.glob("*.wal"))[0]
    data = bytearray(first.read_bytes())
    data[20] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(WALCorrupt, match="checksum mismatch"):
        WAL(tmp_path, segment_bytes=128)


def test_a_gap_in_the_log_is_corruption(tmp_path: Path) -> None:
    wal = WAL(tmp_path)
    wal.save(None, _entries(1, 2))
    wal.save(None, _entries(5, 1))
    wal.close()
    with pytest.raises(WALCorrupt, match="does not follow"):
        WAL(tmp_path)


def test_checkpoint_keeps_only_what_is_needed(tmp_path: Path) -> None:
    wal = WAL(tmp_path, segment_bytes=128)
    for start in range(1, 30, 2):
        wal.save(HardState(3, 1, start), _entries(start, 2, term=3))
    snap = SnapshotMetadata(ConfState([1, 2, 3], [4]), index=25, term=3)
    wal.checkpoint(snap, HardState(3, 1, 28), _entries(26, 5, term=3))
    assert len(list(tmp_path.glob("*.wal"))) == 1
    wal.save(HardState(3, 1, 31), _entries(31, 1, term=3))
    wal.close()
    got = WAL(tmp_path).replayed
    assert (got.snapshot.index, got.snapshot.term, got.snapshot.conf_state) == (25, 3, ConfState([1, 2, 3], [4]))
    assert [e.index for e in got.entries] == [26, 27, 28, 29, 30, 31]
    assert got.hard_state == HardState(3, 1, 31)


def test_a_bad_record_followed_by_good_ones_is_not_a_tear(tmp_path: Path) -> None:
    wal = WAL(tmp_path)
    wal.save(HardState(1, 0, 3), _entries(1, 3))
    wal.close()
    segment = next(tmp_path.glob("*.wal"))
    data = bytearray(segment.read_bytes())
    data[20] ^= 0xFF  # inside the first record; fsync'd records follow it
    segment.write_bytes(bytes(data))
    with pytest.raises(WALCorrupt, match="checksum mismatch"):
        WAL(tmp_path)
