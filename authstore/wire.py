"""Protobuf wire framing done by hand where it saves decoding and re-encoding a whole message.

Concatenated protobuf encodings merge, so a field can be added to an encoded message by appending
its tag and value, and a message can be embedded as a field by prefixing tag and length.
"""

from __future__ import annotations


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def embed(field_number: int, payload: bytes) -> bytes:
    """Encodes ``payload`` as a length-delimited field."""
    return varint(field_number << 3 | 2) + varint(len(payload)) + payload


def int_field(field_number: int, value: int) -> bytes:
    """Encodes a non-negative int64 / uint64 field."""
    return varint(field_number << 3) + varint(value)


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def unwrap(data: bytes) -> tuple[int, bytes]:
    """Splits a message holding exactly one length-delimited field into (number, payload)."""
    if not data:
        return 0, b""
    tag, pos = read_varint(data, 0)
    if tag & 7 != 2:
        raise ValueError("not a length-delimited field")
    length, pos = read_varint(data, pos)
    if pos + length != len(data):
        raise ValueError("trailing bytes after the field")
    return tag >> 3, data[pos:]
