"""A write-ahead log of length-prefixed, CRC-checked records in segment files.

Nothing is applied or acknowledged before the batch holding it is fsync'd here. A record torn by
a crash can only be at the end of the newest segment: it is cut at start-up. A bad record anywhere
else means the disk lost data, and the node refuses to start rather than guess.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# record: u32 payload length | u32 crc32(payload) | payload
_FRAME = struct.Struct(">II")
# payload: u8 kind | u64 index | u64 term | data
_ENTRY = struct.Struct(">BQQ")
KIND_ENTRY = 1
SEGMENT_BYTES = 64 << 20
MAX_RECORD = 64 << 20


class WALCorrupt(Exception):
    """A record before the log's tail failed its checks."""


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    term: int
    data: bytes


def _segment_name(first_index: int) -> str:
    return f"{first_index:016x}.wal"


class WAL:
    def __init__(self, directory: Path, segment_bytes: int = SEGMENT_BYTES, applied_index: int = 0) -> None:
        """``applied_index`` is what the state machine already holds: the log continues after it
        even when every segment up to it was released."""
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.first_index = 0
        self.last_index = 0
        self.last_term = 0
        self._segments: list[tuple[int, Path]] = []
        self._load()
        if self._segments and not self.last_index:
            self.last_index = self._segments[-1][0] - 1  # an empty tail segment names its first index
        if applied_index > self.last_index:
            self.last_index = applied_index
            self._segments = [s for s in self._segments if s[1].stat().st_size]
            if self._segments:
                raise WALCorrupt(f"the store has applied index {applied_index}, past the log's end")
            for stale in self.dir.glob("*.wal"):
                stale.unlink()
        self._fd = self._open_tail()

    # ---- start-up ----
    def _load(self) -> None:
        paths = sorted(self.dir.glob("*.wal"))
        for i, path in enumerate(paths):
            first = int(path.stem, 16)
            self._segments.append((first, path))
            is_tail = i == len(paths) - 1
            good = 0
            for entry, end in self._scan(path, is_tail):
                if self.last_index and entry.index != self.last_index + 1:
                    raise WALCorrupt(f"{path.name}: index {entry.index} follows {self.last_index}")
                if not self.first_index:
                    self.first_index = entry.index
                self.last_index, self.last_term = entry.index, entry.term
                good = end
            if is_tail and good != path.stat().st_size:
                with open(path, "r+b") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())

    @staticmethod
    def _scan(path: Path, is_tail: bool) -> Iterator[tuple[Entry, int]]:
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            problem = None
            if pos + _FRAME.size > len(data):
                problem = "truncated frame"
            else:
                length, crc = _FRAME.unpack_from(data, pos)
                body = data[pos + _FRAME.size: pos + _FRAME.size + length]
                if length > MAX_RECORD or len(body) != length:
                    problem = "truncated record"
                elif zlib.crc32(body) != crc:
                    problem = "checksum mismatch"
            if problem:
                if is_tail:
                    return  # a torn write at the very end: cut it
                raise WALCorrupt(f"{path.name} at byte {pos}: {problem}")
            kind, index, term = _ENTRY.unpack_from(body)
            pos += _FRAME.size + length
            if kind == KIND_ENTRY:
                yield Entry(index, term, bytes(body[_ENTRY.size:])), pos

    def _open_tail(self) -> int:
        if not self._segments:
            path = self.dir / _segment_name(self.last_index + 1)
            self._segments.append((self.last_index + 1, path))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._fsync_dir()
            return fd
        return os.open(self._segments[-1][1], os.O_WRONLY | os.O_APPEND)

    def _fsync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ---- writing ----
    def append(self, entries: list[Entry]) -> None:
        """Writes a batch and fsyncs it once (group commit)."""
        if not entries:
            return
        out = bytearray()
        for e in entries:
            if e.index != self.last_index + 1:
                raise ValueError(f"log gap: {e.index} after {self.last_index}")
            body = _ENTRY.pack(KIND_ENTRY, e.index, e.term) + e.data
            out += _FRAME.pack(len(body), zlib.crc32(body))
            out += body
            self.last_index, self.last_term = e.index, e.term
            if not self.first_index:
                self.first_index = e.index
        os.write(self._fd, out)
        os.fsync(self._fd)
        if os.fstat(self._fd).st_size >= self.segment_bytes:
            self._rotate()

    def _rotate(self) -> None:
        os.close(self._fd)
        first = self.last_index + 1
        path = self.dir / _segment_name(first)
        self._segments.append((first, path))
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._fsync_dir()

    # ---- reading and releasing ----
    def entries_from(self, index: int) -> Iterator[Entry]:
        for i, (_first, path) in enumerate(self._segments):
            nxt = self._segments[i + 1][0] if i + 1 < len(self._segments) else None
            if nxt is not None and nxt <= index:
                continue
            for entry, _ in self._scan(path, is_tail=nxt is None):
                if entry.index >= index:
                    yield entry

    def release(self, upto: int) -> None:
        """Deletes whole segments whose entries are all <= upto (already durable in the store)."""
        while len(self._segments) > 1 and self._segments[1][0] <= upto + 1:
            _, path = self._segments.pop(0)
            path.unlink(missing_ok=True)
            self.first_index = self._segments[0][0]

    def close(self) -> None:
        os.close(self._fd)
