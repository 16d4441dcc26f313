"""Protobuf wire framing by hand, where it saves decoding and re-encoding a whole message.

Concatenated protobuf encodings merge. So the proxy never decodes a client's request just to wrap
it: an InternalRaftRequest is the stamped header field followed by the client's bytes under the
request's field number, and an InternalResponse oneof is unwrapped by slicing. The store likewise
appends the entry's time field to the request bytes and frames its answer without a copy of the
message tree. The store sees exactly the bytes the client sent (unknown fields included).
"""

from __future__ import annotations

from protos.etcdserverpb import raft_internal_pb2

HEADER_FIELD = 100
_WIRE_VARINT = 0
_WIRE_I64 = 1
_WIRE_LEN = 2
_WIRE_I32 = 5


class WireError(ValueError):
    """The store's answer is not the message we expected (a bug or version skew, never client input)."""


#: Every one-byte varint, encoded: tags of low field numbers and short lengths are most varints.
_ONE_BYTE = [bytes((i,)) for i in range(0x80)]
#: Tags already encoded (a handful of field numbers are used, on every request).
_TAGS: dict[int, bytes] = {}


def encode_varint(value: int) -> bytes:
    if value < 0x80:
        if value < 0:
            raise ValueError("varint must be non-negative")
        return _ONE_BYTE[value]
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(key: int) -> bytes:
    tag = _TAGS.get(key)
    if tag is None:
        tag = _TAGS[key] = encode_varint(key)
    return tag


def decode_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Returns (value, next position)."""
    result = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def length_delimited(field_number: int, payload: bytes) -> bytes:
    """One length-delimited field: tag, length, bytes (present even when empty)."""
    return _tag((field_number << 3) | _WIRE_LEN) + encode_varint(len(payload)) + payload


def varint_field(field_number: int, value: int) -> bytes:
    """One non-negative integer field (int64 / uint64)."""
    return _tag((field_number << 3) | _WIRE_VARINT) + encode_varint(value)


def encode_header(username: str, auth_revision: int, *, invalid_token: bool = False,
                  simple_token: bool = False) -> bytes:
    """The serialized RequestHeader field (field 100) of an InternalRaftRequest.

    ``invalid_token``: the client's token did not resolve; the store validates the request, then
    refuses it with ``invalid auth token`` (when auth is enabled), in etcd's order of checks.
    ``simple_token``: the identity is a (possibly cached) simple-token resolution; the store
    refuses it as old after any auth change, whatever the request.
    """
    header = raft_internal_pb2.RequestHeader(username=username, auth_revision=auth_revision,
                                             invalid_token=invalid_token, simple_token=simple_token)
    return length_delimited(HEADER_FIELD, header.SerializeToString())


def build_internal_request(header_field: bytes | None, field_number: int, request: bytes) -> bytes:
    """InternalRaftRequest bytes = header field + the raw request under its field number."""
    body = length_delimited(field_number, request)
    return header_field + body if header_field else body


def unwrap_field(message: bytes, field_number: int) -> bytes:
    """The payload of length-delimited ``field_number`` in ``message``, by slicing.

    Raises WireError when the field is absent, so a store answering with the wrong oneof member
    can never be mistaken for a valid (empty) response.
    """
    view = memoryview(message)
    pos = 0
    found: tuple[int, int] | None = None
    while pos < len(view):
        key, pos = decode_varint(view, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == _WIRE_LEN:
            length, pos = decode_varint(view, pos)
            end = pos + length
            if end > len(view):
                raise WireError("truncated field")
            if number == field_number:
                found = (pos, end)  # last occurrence wins, as in protobuf
            pos = end
        elif wire_type == _WIRE_VARINT:
            _, pos = decode_varint(view, pos)
        elif wire_type == _WIRE_I64:
            pos += 8
        elif wire_type == _WIRE_I32:
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire_type}")
        if pos > len(view):
            raise WireError("truncated field")
    if found is None:
        raise WireError(f"field {field_number} missing from store response")
    return bytes(view[found[0] : found[1]])
