"""Raft's write-ahead log: checksummed records in segment files.

Three kinds of record: log entries, hard state (term, vote, commit) and snapshot markers. Replay
reads them in order: a marker resets the log to the snapshot's index, a hard-state record
replaces the previous one, and an entry at an index the log already holds replaces that entry
and everything after it (a new leader overwrote an uncommitted suffix). Every batch is written
and fsync'd once before anything that depends on it is sent or acknowledged.

Format (version 2): a segment starts with a 16-byte header (magic with the version, the chain
value it continues, a CRC of both); a record is ``u32 length | u32 payload CRC | u32 header CRC``
then the payload. The payload CRC is chained (seeded with the previous record's CRC, across
segments), so a record or a segment end that went missing shows; the header CRC protects the
length, so a damaged length is never taken for a short write.

A crash can tear only the end of the newest segment, and a tear looks one way: the last record
is short, or the file holds zeros from some point to its end (some filesystems extend the file
before the data lands). Only that is cut at start-up. A bad record anywhere else, or one followed
by anything but zeros, means the disk lost data, and the node refuses to start rather than guess.
Segments of the first format (no magic) are still read, with its weaker tail rule, and never
appended to; the first checkpoint removes them.

The newest segment is preallocated to its full size (zeros), so an append changes no file size
and is made durable with ``fdatasync``; its write position is kept here, not taken from the file.
The preallocated zeros after the last record are the zero-filled tail above: replay stops there.
At start-up the tail is cut back to its last sound record (a torn record is not left for new
records to be written over) and preallocated again; a segment the log moves past, and the newest
one at a clean close, is trimmed to what it holds. Creating a segment and a checkpoint still
``fsync`` the file and the directory. The log stays small through checkpoints: after the
state machine has durably applied up to a snapshot index, a new segment starts with the marker,
the hard state and the entries still needed, and every older segment is deleted.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import DecodeError

from authstore import failpoints, metrics
from authstore.raft.codec import conf_state_from_pb, conf_state_to_pb
from authstore.raft.types import Entry, HardState, SnapshotMetadata
from protos.raftpb import raft_pb2
from raftgate.private_files import PRIVATE_DIR_MODE, fsync_dir

# version 1 record: u32 payload length | u32 crc32(payload) | payload (read only)
_FRAME_V1 = struct.Struct(">II")
# version 2 segment header: magic | u32 chain seed | u32 crc32(magic, seed)
_MAGIC = b"RGWAL\x02\r\n"
_SEGMENT_HEADER = struct.Struct(">8sII")
# version 2 record: u32 payload length | u32 crc32(payload, chain) | u32 crc32(first 8 bytes) | payload
_FRAME = struct.Struct(">III")
_KIND = struct.Struct(">B")
_ENTRY = struct.Struct(">BQQB")  # kind, term, index, entry type; then data
_HARD = struct.Struct(">BQQQ")  # kind, term, vote, commit
_SNAP = struct.Struct(">BQQ")  # kind, index, term; then ConfState protobuf
KIND_ENTRY, KIND_HARD_STATE, KIND_SNAPSHOT = 1, 2, 3
SEGMENT_BYTES = 64 << 20
#: A sync at most this long counts as fast (``WAL.syncs_fast``): a local SSD syncs in about
#: 0.15 ms here; a disk that takes longer keeps writes off the event loop.
FAST_SYNC_SECONDS = 0.001
MAX_RECORD = 256 << 20


class WALCorrupt(Exception):
    """A record before the log's tail failed its checks, or the records contradict each other."""


@dataclass
class Replayed:
    """What the log holds after replay."""

    snapshot: SnapshotMetadata = field(default_factory=SnapshotMetadata)
    hard_state: HardState = field(default_factory=HardState)
    entries: list[Entry] = field(default_factory=list)


def _segment_name(seq: int) -> str:
    return f"{seq:016x}.wal"


def _encode_entry(e: Entry) -> bytes:
    return _ENTRY.pack(KIND_ENTRY, e.term, e.index, e.type) + e.data


def _encode_hard_state(hs: HardState) -> bytes:
    return _HARD.pack(KIND_HARD_STATE, hs.term, hs.vote, hs.commit)


def _encode_snapshot(md: SnapshotMetadata) -> bytes:
    return _SNAP.pack(KIND_SNAPSHOT, md.index, md.term) + conf_state_to_pb(md.conf_state).SerializeToString()


def _frame(payload: bytes, chain: int) -> tuple[bytes, int]:
    """One record and the chain value the next record continues."""
    crc = zlib.crc32(payload, chain)
    head = struct.pack(">II", len(payload), crc)
    return head + struct.pack(">I", zlib.crc32(head)) + payload, crc


def _segment_header(chain: int) -> bytes:
    return _SEGMENT_HEADER.pack(_MAGIC, chain, zlib.crc32(_MAGIC + struct.pack(">I", chain)))


def _is_v1_segment(data: bytes) -> bool:
    """Whether a segment without the magic starts with a sound first-format record."""
    if len(data) < _FRAME_V1.size:
        return False
    length, crc = _FRAME_V1.unpack_from(data)
    body = data[_FRAME_V1.size: _FRAME_V1.size + length]
    return 0 < length == len(body) and zlib.crc32(body) == crc


class WAL:
    def __init__(self, directory: Path, segment_bytes: int = SEGMENT_BYTES, *, preallocate: bool = True) -> None:
        """``preallocate=False`` leaves every segment exactly as long as what it holds (tests
        that locate records by file size)."""
        directory.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.preallocate = preallocate
        self._segments = sorted(directory.glob("*.wal"))
        self._chain = 0  # the payload CRC the next record continues
        self._tail_is_v1 = False
        self._offset = 0  # where the next record goes in the newest segment
        #: whether the last sync took at most FAST_SYNC_SECONDS (none yet: no)
        self.syncs_fast = False
        self.replayed = self._replay()
        self._fd = self._open_tail()

    # ---- start-up ----
    def _replay(self) -> Replayed:
        state = Replayed()
        for i, path in enumerate(self._segments):
            is_tail = i == len(self._segments) - 1
            data = path.read_bytes()
            if data[:len(_MAGIC)] != _MAGIC and _is_v1_segment(data):
                good = self._apply_all(state, path, self._records_v1(path.name, data, is_tail), 0)
                self._chain = 0
                self._tail_is_v1 = is_tail
            else:
                start = self._check_segment_header(path, data, first=i == 0, is_tail=is_tail)
                if start is None:  # the crash came while the segment was being created: start it again
                    with open(path, "wb") as f:
                        f.write(_segment_header(self._chain))
                        os.fsync(f.fileno())
                    self._offset = _SEGMENT_HEADER.size
                    continue
                good = self._apply_all(state, path, self._records(path.name, data, start, is_tail), start)
            if is_tail:
                self._offset = good
            if is_tail and good != len(data):  # a torn record or preallocated zeros: cut to the last sound record
                with open(path, "r+b") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())
        return state

    def _check_segment_header(self, path: Path, data: bytes, *, first: bool, is_tail: bool) -> int | None:
        """Where the records start; None for a newest segment whose header never fully reached the disk."""
        if len(data) >= _SEGMENT_HEADER.size:
            magic, seed, crc = _SEGMENT_HEADER.unpack_from(data)
            if magic == _MAGIC and crc == zlib.crc32(magic + struct.pack(">I", seed)):
                if first:
                    self._chain = seed
                elif seed != self._chain:
                    raise WALCorrupt(f"{path.name} does not continue the segment before it (records are missing)")
                return _SEGMENT_HEADER.size
        expected = _segment_header(0 if first else self._chain)
        written = data.rstrip(b"\0")  # a torn creation: part of the header, then zeros at most
        if is_tail and len(written) <= len(expected) and expected.startswith(written):
            return None
        raise WALCorrupt(f"{path.name}: not a raftgate WAL segment, or its header is damaged")

    def _apply_all(self, state: Replayed, path: Path, records: Iterator[tuple[bytes, int]], start: int) -> int:
        """Applies a segment's records to the state; returns where the last sound record ends (at
        least ``start``, the end of the segment header, which a cut keeps)."""
        good = start
        for payload, end in records:
            try:
                self._apply(state, path, payload)
            except (struct.error, DecodeError) as exc:
                raise WALCorrupt(f"{path.name} at byte {good}: malformed record ({exc})") from None
            good = end
        return good

    @staticmethod
    def _apply(state: Replayed, path: Path, payload: bytes) -> None:
        entries = state.entries
        kind = payload[0]
        if kind == KIND_ENTRY:
            _, term, index, etype = _ENTRY.unpack_from(payload)
            last = entries[-1].index if entries else state.snapshot.index
            if index <= state.snapshot.index or index > last + 1:
                raise WALCorrupt(f"{path.name}: entry {index} does not follow {last}")
            if index <= last:
                del entries[index - state.snapshot.index - 1:]
            entries.append(Entry(term, index, etype, bytes(payload[_ENTRY.size:])))
        elif kind == KIND_HARD_STATE:
            _, term, vote, commit = _HARD.unpack(payload)
            state.hard_state = HardState(term, vote, commit)
        elif kind == KIND_SNAPSHOT:
            _, index, term = _SNAP.unpack_from(payload)
            cs = conf_state_from_pb(raft_pb2.ConfState.FromString(payload[_SNAP.size:]))
            state.snapshot = SnapshotMetadata(cs, index, term)
            entries.clear()
        else:
            raise WALCorrupt(f"{path.name}: unknown record kind {kind}")

    def _records(self, name: str, data: bytes, pos: int, is_tail: bool) -> Iterator[tuple[bytes, int]]:
        """The sound records of a version-2 segment, each with where it ends; stops at a torn tail."""
        zeros_from: int | None = None
        while pos < len(data):
            problem, torn, end = "", False, len(data)
            if len(data) - pos < _FRAME.size:
                problem, torn = "truncated record header", True
            else:
                length, crc, head_crc = _FRAME.unpack_from(data, pos)
                end = pos + _FRAME.size + length
                if zlib.crc32(data[pos:pos + 8]) != head_crc:
                    problem, end = "record header checksum mismatch", pos + _FRAME.size
                elif not 0 < length <= MAX_RECORD:
                    problem = f"bad record length {length}"
                elif end > len(data):
                    problem, torn = "truncated record", True
                elif zlib.crc32(data[pos + _FRAME.size:end], self._chain) != crc:
                    problem = "checksum mismatch"
            if problem:
                if is_tail and not torn:
                    if zeros_from is None:
                        zeros_from = len(data.rstrip(b"\0"))
                    torn = zeros_from < end  # zeros from inside this record to the end of the file
                if is_tail and torn:
                    return
                why = ("data follows it, so this is not a torn write" if is_tail
                       else "the log has moved past this segment, so this is not a torn write")
                raise WALCorrupt(f"{name} at byte {pos}: {problem}; {why}")
            self._chain = crc
            yield data[pos + _FRAME.size:end], end
            pos = end

    @staticmethod
    def _records_v1(name: str, data: bytes, is_tail: bool) -> Iterator[tuple[bytes, int]]:
        """Records of a first-format segment (no header CRC): the old tail rule, plus a zero-filled tail."""
        pos = 0
        while pos < len(data):
            problem = None
            length = 0
            if pos + _FRAME_V1.size > len(data):
                problem = "truncated frame"
            elif not data[pos:].strip(b"\0"):
                problem = "zero-filled tail"
            else:
                length, crc = _FRAME_V1.unpack_from(data, pos)
                body = data[pos + _FRAME_V1.size: pos + _FRAME_V1.size + length]
                if length > MAX_RECORD or len(body) != length:
                    problem = "truncated record"
                elif zlib.crc32(body) != crc:
                    problem = "checksum mismatch"
                elif not body:
                    problem = "empty record"
            if problem:
                torn = (problem in ("truncated frame", "truncated record", "zero-filled tail")
                        or pos + _FRAME_V1.size + length >= len(data))
                if is_tail and torn:
                    return
                raise WALCorrupt(f"{name} at byte {pos}: {problem}")
            pos += _FRAME_V1.size + length
            yield body, pos

    def _open_tail(self) -> int:
        if not self._segments:
            return self._new_segment(1)
        if self._tail_is_v1:  # new records only ever go to a version-2 segment
            return self._new_segment(int(self._segments[-1].stem, 16) + 1)
        fd = os.open(self._segments[-1], os.O_WRONLY)
        if self._allocate(fd):
            os.fsync(fd)
        return fd

    def _new_segment(self, seq: int) -> int:
        """Creates a segment whose header is on disk before the directory names it."""
        path = self.dir / _segment_name(seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        header = _segment_header(self._chain)
        os.pwrite(fd, header, 0)
        self._offset = len(header)
        self._allocate(fd)
        os.fsync(fd)
        self._segments.append(path)
        fsync_dir(self.dir)
        return fd

    def _allocate(self, fd: int) -> bool:
        """Extends the newest segment with zeros to its full size, so that appends change no
        file size and ``fdatasync`` suffices; True if the file grew."""
        if not self.preallocate or os.fstat(fd).st_size >= self.segment_bytes:
            return False
        try:
            os.posix_fallocate(fd, 0, self.segment_bytes)
        except OSError:  # a filesystem without fallocate: a sparse file reads as zeros too
            os.ftruncate(fd, self.segment_bytes)
        return True

    def _trim(self, fd: int) -> None:
        """Cuts the preallocated zeros off a segment: only the newest may end in zeros."""
        if os.fstat(fd).st_size != self._offset:
            os.ftruncate(fd, self._offset)

    def _frames(self, payloads: list[bytes]) -> bytes:
        out = bytearray()
        for payload in payloads:
            record, self._chain = _frame(payload, self._chain)
            out += record
        return bytes(out)

    # ---- writing ----
    def save(self, hard_state: HardState | None, entries: list[Entry], sync: bool = True) -> None:
        """Writes entries then the hard state, with one fsync (group commit).

        ``sync=False`` is for a hard state whose only change is the commit index, which Raft
        can always learn again from the leader.
        """
        payloads = [_encode_entry(e) for e in entries]
        if hard_state is not None:
            payloads.append(_encode_hard_state(hard_state))
        if not payloads:
            return
        out = self._frames(payloads)
        os.pwrite(self._fd, out, self._offset)
        self._offset += len(out)
        if not (sync or entries):
            # Left unsynced, and the segment is not left behind either: only the newest segment
            # may hold tearable records. The next synced save moves on when the segment is full.
            return
        failpoints.hit("raftBeforeFsync")
        started = time.perf_counter()
        os.fdatasync(self._fd)  # the segment's size is preallocated: the data is all there is to sync
        took = time.perf_counter() - started
        self.syncs_fast = took <= FAST_SYNC_SECONDS
        metrics.WAL_FSYNC_DURATION.observe(took)
        if self._offset >= self.segment_bytes:
            self._trim(self._fd)
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = self._new_segment(int(self._segments[-1].stem, 16) + 1)

    def checkpoint(self, snapshot: SnapshotMetadata, hard_state: HardState, entries: list[Entry]) -> None:
        """Starts a new segment from a snapshot the state machine holds durably; drops the rest.

        ``entries`` are the log entries after ``snapshot.index`` that must survive a restart.
        """
        self._trim(self._fd)
        os.fsync(self._fd)  # the old segments stay until the new one is durable: keep them sound
        os.close(self._fd)
        old = list(self._segments)
        self._fd = self._new_segment(int(old[-1].stem, 16) + 1)
        out = self._frames([_encode_snapshot(snapshot), *(_encode_entry(e) for e in entries),
                            _encode_hard_state(hard_state)])
        os.pwrite(self._fd, out, self._offset)
        self._offset += len(out)
        started = time.perf_counter()
        os.fsync(self._fd)
        metrics.WAL_FSYNC_DURATION.observe(time.perf_counter() - started)
        failpoints.hit("walMidCheckpoint")
        for path in old:
            path.unlink(missing_ok=True)
        self._segments = self._segments[len(old):]
        fsync_dir(self.dir)

    def size(self) -> int:
        """Bytes the log holds (not counting the newest segment's preallocated zeros)."""
        older = sum(p.stat().st_size for p in self._segments[:-1] if p.exists())
        return older + self._offset

    def close(self) -> None:
        """A clean close leaves the newest segment as long as what it holds."""
        try:
            self._trim(self._fd)
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
