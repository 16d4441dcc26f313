"""Raft's write-ahead log: length-prefixed, CRC-checked records in segment files.

Three kinds of record: log entries, hard state (term, vote, commit) and snapshot markers. Replay
reads them in order: a marker resets the log to the snapshot's index, a hard-state record
replaces the previous one, and an entry at an index the log already holds replaces that entry
and everything after it (a new leader overwrote an uncommitted suffix). Every batch is written
and fsync'd once before anything that depends on it is sent or acknowledged.

A record torn by a crash can only be at the end of the newest segment: it is cut at start-up.
A bad record anywhere else means the disk lost data, and the node refuses to start rather than
guess. The log stays small through checkpoints: after the state machine has durably applied up
to a snapshot index, a new segment starts with the marker, the hard state and the entries still
needed, and every older segment is deleted.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from authstore import failpoints, metrics
from authstore.raft.codec import conf_state_from_pb, conf_state_to_pb
from authstore.raft.types import Entry, HardState, SnapshotMetadata
from protos.raftpb import raft_pb2

# record: u32 payload length | u32 crc32(payload) | payload
_FRAME = struct.Struct(">II")
_KIND = struct.Struct(">B")
_ENTRY = struct.Struct(">BQQB")  # kind, term, index, entry type; then data
_HARD = struct.Struct(">BQQQ")  # kind, term, vote, commit
_SNAP = struct.Struct(">BQQ")  # kind, index, term; then ConfState protobuf
KIND_ENTRY, KIND_HARD_STATE, KIND_SNAPSHOT = 1, 2, 3
SEGMENT_BYTES = 64 << 20
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


def _frame(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


class WAL:
    def __init__(self, directory: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self.segment_bytes = segment_bytes
        self._segments = sorted(directory.glob("*.wal"))
        self.replayed = self._replay()
        self._fd = self._open_tail()

    # ---- start-up ----
    def _replay(self) -> Replayed:
        state = Replayed()
        entries = state.entries
        for i, path in enumerate(self._segments):
            is_tail = i == len(self._segments) - 1
            good = 0
            for payload, end in self._records(path, is_tail):
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
                good = end
            if is_tail and good != path.stat().st_size:
                with open(path, "r+b") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())
        return state

    @staticmethod
    def _records(path: Path, is_tail: bool) -> Iterator[tuple[bytes, int]]:
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            problem = None
            length = 0
            if pos + _FRAME.size > len(data):
                problem = "truncated frame"
            else:
                length, crc = _FRAME.unpack_from(data, pos)
                body = data[pos + _FRAME.size: pos + _FRAME.size + length]
                if length > MAX_RECORD or len(body) != length:
                    problem = "truncated record"
                elif zlib.crc32(body) != crc:
                    problem = "checksum mismatch"
                elif not body:
                    problem = "empty record"
            if problem:
                # Only the last record of the newest segment can be torn by a crash (a short or
                # unfinished write); a bad record with data after it is lost data, not a tear.
                torn = problem in ("truncated frame", "truncated record") or pos + _FRAME.size + length >= len(data)
                if is_tail and torn:
                    return
                raise WALCorrupt(f"{path.name} at byte {pos}: {problem}")
            pos += _FRAME.size + length
            yield body, pos

    def _open_tail(self) -> int:
        if not self._segments:
            return self._new_segment(1)
        return os.open(self._segments[-1], os.O_WRONLY | os.O_APPEND)

    def _new_segment(self, seq: int) -> int:
        path = self.dir / _segment_name(seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._segments.append(path)
        self._fsync_dir()
        return fd

    def _fsync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ---- writing ----
    def save(self, hard_state: HardState | None, entries: list[Entry], sync: bool = True) -> None:
        """Writes entries then the hard state, with one fsync (group commit).

        ``sync=False`` is for a hard state whose only change is the commit index, which Raft
        can always learn again from the leader.
        """
        out = bytearray()
        for e in entries:
            out += _frame(_encode_entry(e))
        if hard_state is not None:
            out += _frame(_encode_hard_state(hard_state))
        if not out:
            return
        os.write(self._fd, out)
        if sync or entries:
            failpoints.hit("raftBeforeFsync")
            with metrics.WAL_FSYNC_DURATION.time():
                os.fsync(self._fd)
        if os.fstat(self._fd).st_size >= self.segment_bytes:
            os.close(self._fd)
            self._fd = self._new_segment(int(self._segments[-1].stem, 16) + 1)

    def checkpoint(self, snapshot: SnapshotMetadata, hard_state: HardState, entries: list[Entry]) -> None:
        """Starts a new segment from a snapshot the state machine holds durably; drops the rest.

        ``entries`` are the log entries after ``snapshot.index`` that must survive a restart.
        """
        os.close(self._fd)
        old = list(self._segments)
        self._fd = self._new_segment(int(old[-1].stem, 16) + 1)
        out = bytearray(_frame(_encode_snapshot(snapshot)))
        for e in entries:
            out += _frame(_encode_entry(e))
        out += _frame(_encode_hard_state(hard_state))
        os.write(self._fd, out)
        with metrics.WAL_FSYNC_DURATION.time():
            os.fsync(self._fd)
        failpoints.hit("walMidCheckpoint")
        for path in old:
            path.unlink(missing_ok=True)
        self._segments = self._segments[len(old):]
        self._fsync_dir()

    def size(self) -> int:
        return sum(p.stat().st_size for p in self._segments if p.exists())

    def close(self) -> None:
        os.close(self._fd)
