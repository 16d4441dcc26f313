"""A revision is (main, sub): main counts write transactions, sub counts changes inside one.

Both halves are stored big-endian and unsigned so LMDB's byte order equals revision order, which
lets history be walked with a cursor and lets "newest revision <= R" be a single seek.
"""

from __future__ import annotations

import struct

_REV = struct.Struct(">QQ")

#: Length of an encoded revision.
SIZE = _REV.size


def encode(main: int, sub: int = 0) -> bytes:
    """Sortable bytes for (main, sub)."""
    return _REV.pack(main, sub)


def decode(data: bytes) -> tuple[int, int]:
    """(main, sub) from the first SIZE bytes of `data`."""
    return _REV.unpack_from(data)


def main_of(data: bytes) -> int:
    """The main revision alone, the part every visibility check needs."""
    return _REV.unpack_from(data)[0]
