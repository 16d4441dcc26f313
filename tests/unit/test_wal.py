"""The Raft write-ahead log: what survives a crash, what is cut, and what stops the node."""

from __future__ import annotations

import os
import struct
import types
import zlib
from pathlib import Path

import pytest

from authstore.node.wal import WAL, Replayed, WALCorrupt
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
    assert wal.size() == whole and not segment.read_bytes()[whole:].strip(b"\0")  # cut (zeros may follow)
    wal.save(None, _entries(6, 1))
    wal.close()
    assert WAL(tmp_path).replayed.entries[-1].index == 6


def test_a_damaged_last_record_is_not_a_tear(tmp_path: Path) -> None:
    """A crash leaves a short record or zeros; a whole last record with wrong bytes is damage, not a tear."""
    wal = WAL(tmp_path)
    wal.save(None, _entries(1, 3))
    wal.close()
    segment = next(tmp_path.glob("*.wal"))
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF  # the last record's checksum no longer matches
    segment.write_bytes(bytes(data))
    with pytest.raises(WALCorrupt, match="checksum mismatch"):
        WAL(tmp_path)
    data[-1] = 0  # ... but zeros to the end are a write that never reached the disk
    segment.write_bytes(bytes(data))
    assert [e.index for e in WAL(tmp_path).replayed.entries] == [1, 2]


def test_segments_of_the_first_format_are_read_and_never_appended_to(tmp_path: Path) -> None:
    """A data dir written before the header CRC still starts; new records go to a new segment."""
    def v1(payload: bytes) -> bytes:
        return struct.pack(">II", len(payload), zlib.crc32(payload)) + payload

    old = b"".join(v1(struct.pack(">BQQB", 1, 1, i, 0) + b"v") for i in (1, 2))
    old += v1(struct.pack(">BQQQ", 2, 1, 3, 2)) + b"\x00\x00\x00"  # and a torn tail
    (tmp_path / f"{1:016x}.wal").write_bytes(old)
    wal = WAL(tmp_path)
    assert [e.index for e in wal.replayed.entries] == [1, 2]
    assert wal.replayed.hard_state == HardState(1, 3, 2)
    wal.save(HardState(1, 3, 3), _entries(3, 1))
    wal.close()
    assert (tmp_path / f"{1:016x}.wal").read_bytes() == old[:-3]
    got = WAL(tmp_path).replayed
    assert [e.index for e in got.entries] == [1, 2, 3] and got.hard_state == HardState(1, 3, 3)
    assert len(list(tmp_path.glob("*.wal"))) == 2


def test_a_missing_segment_stops_the_node(tmp_path: Path) -> None:
    """Records are chained across segments: a whole segment gone (or cut at a record boundary) shows."""
    wal = WAL(tmp_path, segment_bytes=100)
    for i in range(1, 8):
        wal.save(HardState(1, 1, i), [])
    wal.close()
    segments = sorted(tmp_path.glob("*.wal"))
    assert len(segments) >= 3
    segments[1].unlink()
    with pytest.raises(WALCorrupt, match="does not continue"):
        WAL(tmp_path, segment_bytes=100)


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


def test_a_corrupt_length_in_the_middle_of_the_newest_segment_stops_the_node(tmp_path: Path) -> None:
    """A damaged length must not pass for a torn tail: the synced records after it and the vote would be cut."""
    wal = WAL(tmp_path, preallocate=False)  # record ends are read from the file's size
    segment = next(tmp_path.glob("*.wal"))
    ends = []
    for i in range(1, 6):
        wal.save(None, _entries(i, 1))
        ends.append(segment.stat().st_size)
        wal.save(HardState(i, 2, i), [])
    wal.close()
    before = segment.read_bytes()
    data = bytearray(before)
    data[ends[1]] ^= 0x40  # the length of the hard state after entry 2 now claims more than the file holds
    segment.write_bytes(bytes(data))
    with pytest.raises(WALCorrupt):
        WAL(tmp_path)
    assert segment.stat().st_size == len(before)  # nothing was cut


def test_a_zero_filled_tail_is_cut(tmp_path: Path) -> None:
    """Some filesystems leave zeros after the last write that reached the disk: a torn tail, not corruption."""
    wal = WAL(tmp_path)
    wal.save(HardState(1, 2, 3), _entries(1, 3))
    wal.close()
    segment = next(tmp_path.glob("*.wal"))
    whole = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(bytes(4096))
    wal = WAL(tmp_path)
    assert [e.index for e in wal.replayed.entries] == [1, 2, 3]
    assert wal.replayed.hard_state == HardState(1, 2, 3)
    assert wal.size() == whole and not segment.read_bytes()[whole:].strip(b"\0")
    wal.save(None, _entries(4, 1))
    wal.close()
    assert WAL(tmp_path).replayed.entries[-1].index == 4


def _write_small_wal(directory: Path) -> tuple[list[tuple[int, int, int]], list[Replayed]]:
    """Writes a two-segment WAL one record per save; returns each record's (segment, start, end) and the
    state a replay must give after each prefix of the records."""
    wal = WAL(directory, segment_bytes=150, preallocate=False)  # record ends are read from file sizes
    records: list[tuple[int, int, int]] = []
    states = [Replayed()]
    plan: list[tuple[HardState | None, list[Entry]]] = []
    for i in range(1, 5):
        plan.append((None, _entries(i, 1, term=2, size=6)))
        plan.append((HardState(2, 3, i), []))
    for hs, entries in plan:
        before = {p.name: p.stat().st_size for p in directory.glob("*.wal")}
        wal.save(hs, entries)
        after = {p.name: p.stat().st_size for p in directory.glob("*.wal")}
        grown = [n for n in before if after[n] != before[n]]
        assert len(grown) == 1
        segments = sorted(after)
        records.append((segments.index(grown[0]), before[grown[0]], after[grown[0]]))
        prev = states[-1]
        states.append(Replayed(prev.snapshot, hs if hs is not None else prev.hard_state, prev.entries + entries))
    wal.close()
    assert len({seg for seg, _, _ in records}) == 2, "the test needs records in two segments"
    return records, states


def _outcome(directory: Path) -> Replayed | None:
    """The replay of the directory, or None when the WAL refuses to start."""
    try:
        wal = WAL(directory, segment_bytes=150)
    except WALCorrupt:
        return None
    got = wal.replayed
    wal.close()
    return got


def test_every_damaged_byte_gives_a_correct_prefix_or_a_clear_error(tmp_path: Path) -> None:
    """Flip, zero from, or cut at every byte of a small WAL: a replay is either a prefix of the records
    that a true tear explains, or a refusal; never a wrong record, never a lost record that a valid one follows."""
    src = tmp_path / "src"
    records, states = _write_small_wal(src)
    names = sorted(p.name for p in src.glob("*.wal"))
    originals = {n: (src / n).read_bytes() for n in names}
    tail = len(names) - 1
    work = tmp_path / "work"

    def run(seg: int, mutated: bytes) -> Replayed | None:
        if work.exists():
            for p in work.iterdir():
                p.unlink()
        work.mkdir(exist_ok=True)
        for n in names:
            (work / n).write_bytes(mutated if n == names[seg] else originals[n])
        got = _outcome(work)
        if got is not None:  # whatever was cut stays cut, and the log takes new records after it
            wal = WAL(work, segment_bytes=150)
            assert _same(wal.replayed, got)
            last = got.entries[-1].index if got.entries else 0
            wal.save(HardState(9, 9, 9), _entries(last + 1, 1))
            wal.close()
            again = _outcome(work)
            assert again is not None, "a log cut at start-up did not take new records"
            assert again.entries == got.entries + _entries(last + 1, 1) and again.hard_state == HardState(9, 9, 9)
        return got

    def first_damaged(seg: int, pos: int) -> int:
        """The first record a change at (seg, pos) touches (a segment header belongs to its first record)."""
        for r, (s, _start, end) in enumerate(records):
            if s == seg and pos < end:
                return r
        return len(records)

    for seg, name in enumerate(names):
        data = originals[name]
        for pos in range(len(data)):
            r = first_damaged(seg, pos)
            flipped = bytearray(data)
            flipped[pos] ^= 0xFF
            got = run(seg, bytes(flipped))
            if got is not None:  # only the very last record may be dropped, and only from the newest segment
                assert seg == tail and r == len(records) - 1, f"flip at {name}:{pos} lost record {r}"
                assert _same(got, states[r]), f"flip at {name}:{pos} replayed a wrong log"
            for how, mutated in (("zeros", data[:pos] + bytes(len(data) - pos)), ("cut", data[:pos])):
                got = run(seg, mutated)
                if seg != tail:
                    assert got is None, f"{how} at {name}:{pos} in an older segment was not refused"
                    continue
                assert got is not None, f"{how} at {name}:{pos}: a torn tail was refused"
                assert _same(got, states[r]), f"{how} at {name}:{pos} replayed a wrong log"


def _same(a: Replayed, b: Replayed) -> bool:
    return (a.hard_state, a.entries, a.snapshot.index) == (b.hard_state, b.entries, b.snapshot.index)


def test_a_segment_is_synced_before_the_log_moves_past_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the newest segment may be torn: an unsynced record left in an older one (a commit-only
    hard state, written without fsync) could vanish in a power loss and stop the node at start-up."""
    from authstore.node import wal as wal_module

    events: list[tuple[str, str]] = []
    real_fsync, real_fdatasync, real_pwrite = os.fsync, os.fdatasync, os.pwrite

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fdatasync(fd)

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        events.append(("write", os.readlink(f"/proc/self/fd/{fd}")))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(wal_module.os, "fsync", fsync)
    monkeypatch.setattr(wal_module.os, "fdatasync", fdatasync)
    monkeypatch.setattr(wal_module.os, "pwrite", pwrite)
    wal = WAL(tmp_path, segment_bytes=100)
    wal.save(None, _entries(1, 1))
    for i in range(1, 4):
        wal.save(HardState(1, 1, i), [], sync=False)  # the last of these fills the segment
    wal.checkpoint(SnapshotMetadata(ConfState([1]), index=1, term=1), HardState(1, 1, 3), [])
    monkeypatch.undo()
    wal.close()
    assert any(kind == "write" for kind, _ in events)
    for path in {p for kind, p in events if kind == "write"}:
        last_write = max(i for i, e in enumerate(events) if e == ("write", path))
        assert ("fsync", path) in events[last_write:], f"{Path(path).name} was left with an unsynced write"


def _torn_in_preallocated_segment(directory: Path) -> tuple[Path, int]:
    """A preallocated segment as a kill -9 mid-write leaves it: sound records, the first part of a
    record, then the preallocated zeros to the end. Returns the segment and where the sound records end."""
    wal = WAL(directory, segment_bytes=1 << 16)
    wal.save(HardState(1, 1, 2), _entries(1, 3))
    sound = wal.size()
    segment = next(directory.glob("*.wal"))
    assert segment.stat().st_size == 1 << 16  # preallocated
    wal.save(None, _entries(4, 1, size=3000))
    torn_end = wal.size()
    os.close(wal._fd)  # the process died: no clean close
    data = bytearray(segment.read_bytes())
    data[sound + 1500:torn_end] = bytes(torn_end - sound - 1500)  # half of the record reached the disk
    segment.write_bytes(bytes(data))
    return segment, sound


def test_a_torn_record_then_preallocated_zeros_is_the_end_of_the_log(tmp_path: Path) -> None:
    segment, sound = _torn_in_preallocated_segment(tmp_path)
    wal = WAL(tmp_path, segment_bytes=1 << 16)
    assert [e.index for e in wal.replayed.entries] == [1, 2, 3]
    assert wal.replayed.hard_state == HardState(1, 1, 2)
    assert wal.size() == sound
    assert not segment.read_bytes()[sound:].strip(b"\0"), "the torn record was left for new records to follow"
    wal.save(HardState(1, 1, 4), _entries(4, 1, size=10))  # shorter than the torn record
    os.close(wal._fd)  # killed again, before any clean close
    again = WAL(tmp_path, segment_bytes=1 << 16)
    assert [e.index for e in again.replayed.entries] == [1, 2, 3, 4]
    assert again.replayed.hard_state == HardState(1, 1, 4)
    again.close()


def test_a_preallocated_segment_is_trimmed_when_the_log_moves_past_it(tmp_path: Path) -> None:
    """Only the newest segment may end in zeros: an older one that did is refused at start-up."""
    wal = WAL(tmp_path, segment_bytes=4096)
    for i in range(1, 40):
        wal.save(HardState(1, 1, i), _entries(i, 1, size=200))
    segments = sorted(tmp_path.glob("*.wal"))
    assert len(segments) > 2
    for older in segments[:-1]:
        assert older.read_bytes()[-1:] != b"\0"
    assert segments[-1].stat().st_size == 4096
    os.close(wal._fd)  # no clean close
    got = WAL(tmp_path, segment_bytes=4096)
    assert [e.index for e in got.replayed.entries] == list(range(1, 40))
    got.close()
    assert sorted(tmp_path.glob("*.wal"))[-1].read_bytes()[-1:] != b"\0"  # a clean close trims the newest too


def test_appends_sync_with_fdatasync_and_new_segments_with_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from authstore.node import wal as wal_module

    calls: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    monkeypatch.setattr(wal_module.os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(wal_module.os, "fdatasync", lambda fd: (calls.append("fdatasync"), real_fdatasync(fd))[1])
    wal = WAL(tmp_path)
    calls.clear()
    wal.save(HardState(1, 1, 0), _entries(1, 2))
    wal.save(HardState(1, 1, 2), [], sync=False)
    assert calls == ["fdatasync"]
    calls.clear()
    wal.checkpoint(SnapshotMetadata(ConfState([1]), index=2, term=1), HardState(1, 1, 2), [])
    assert "fdatasync" not in calls and calls.count("fsync") >= 3  # old segment, new segment, directory
    monkeypatch.undo()
    wal.close()


def test_syncs_fast_tells_whether_the_last_sync_was_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver makes a lone write on the event loop only while the disk syncs fast; a fresh log
    has not synced yet and says no, and one slow sync is enough to send writes back to the log
    thread (a slow disk must not stall the loop). Time is faked: the sync takes what it is told."""
    import authstore.node.wal as wal_module

    clock = [0.0]
    took = [0.0]

    def fdatasync(_fd: int) -> None:
        clock[0] += took[0]

    monkeypatch.setattr(wal_module.os, "fdatasync", fdatasync)
    monkeypatch.setattr(wal_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    wal = WAL(tmp_path / "wal")
    assert wal.syncs_fast is False
    took[0] = wal_module.FAST_SYNC_SECONDS / 10
    wal.save(HardState(1, 1, 0), _entries(1, 1))
    assert wal.syncs_fast is True
    took[0] = wal_module.FAST_SYNC_SECONDS * 2
    wal.save(None, _entries(2, 1))
    assert wal.syncs_fast is False
    took[0] = 0.0
    wal.save(HardState(1, 1, 2), [], sync=False)  # not synced: says nothing about the disk
    assert wal.syncs_fast is False
    wal.close()
