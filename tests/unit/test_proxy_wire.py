"""The byte-concatenation builder and the oneof unwrapper agree with protobuf's own codec."""

from __future__ import annotations

import pytest

from protos import wire
from protos.etcdserverpb import raft_internal_pb2, rpc_pb2
from protos.storepb import store_pb2
from raftgate.methods import METHODS, Kind

REQUEST_FIELDS = {f.number: f.name for f in raft_internal_pb2.InternalRaftRequest.DESCRIPTOR.fields}
RESPONSE_FIELDS = {f.number: f.name for f in store_pb2.InternalResponse.DESCRIPTOR.fields}


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16383, 16384, 2**32, 2**63 - 1, 2**64 - 1])
def test_varint_roundtrip(value: int) -> None:
    encoded = wire.encode_varint(value)
    assert wire.decode_varint(encoded, 0) == (value, len(encoded))


def test_build_matches_protobuf() -> None:
    put = rpc_pb2.PutRequest(key=b"k" * 300, value=b"\x00\xff" * 100, lease=7, prev_kv=True)
    data = wire.build_internal_request(wire.encode_header("alice", 42), 4, put.SerializeToString())
    decoded = raft_internal_pb2.InternalRaftRequest.FromString(data)
    assert decoded.header.username == "alice" and decoded.header.auth_revision == 42
    assert decoded.put == put
    expected = raft_internal_pb2.InternalRaftRequest(
        header=raft_internal_pb2.RequestHeader(username="alice", auth_revision=42), put=put
    )
    assert decoded == expected


def test_empty_request_is_present() -> None:
    data = wire.build_internal_request(wire.encode_header("", 0), 1000, b"")
    decoded = raft_internal_pb2.InternalRaftRequest.FromString(data)
    assert decoded.HasField("auth_enable") and decoded.HasField("header")
    assert [f.name for f, _ in decoded.ListFields() if f.name not in ("header", "ID")] == ["auth_enable"]


def test_unknown_fields_survive() -> None:
    raw = rpc_pb2.RangeRequest(key=b"a").SerializeToString() + wire.length_delimited(999, b"future")
    decoded = raft_internal_pb2.InternalRaftRequest.FromString(wire.build_internal_request(None, 3, raw))
    assert decoded.range.key == b"a" and decoded.range.SerializeToString() == raw


def test_every_method_maps_to_its_internal_field() -> None:
    for method in METHODS:
        if method.kind is Kind.WATCH:  # Watch has its own store stream
            continue
        assert method.field in REQUEST_FIELDS, method
        decoded = raft_internal_pb2.InternalRaftRequest.FromString(wire.build_internal_request(None, method.field, b""))
        assert decoded.HasField(REQUEST_FIELDS[method.field]), method
        if method.kind not in (Kind.SNAPSHOT,):
            assert RESPONSE_FIELDS.get(method.field) == REQUEST_FIELDS[method.field], method


def test_unwrap_slices_the_oneof() -> None:
    inner = rpc_pb2.RangeResponse(header=rpc_pb2.ResponseHeader(revision=9), count=3, more=True)
    data = store_pb2.InternalResponse(range=inner).SerializeToString()
    assert wire.unwrap_field(data, 3) == inner.SerializeToString()
    empty = store_pb2.InternalResponse(auth_enable=rpc_pb2.AuthEnableResponse()).SerializeToString()
    assert wire.unwrap_field(empty, 1000) == b""


def test_unwrap_skips_other_fields_and_rejects_missing() -> None:
    data = wire.encode_varint(1 << 3) + wire.encode_varint(5) + wire.length_delimited(4, b"xy")
    assert wire.unwrap_field(data, 4) == b"xy"
    with pytest.raises(wire.WireError):
        wire.unwrap_field(data, 3)
    with pytest.raises(wire.WireError):
        wire.unwrap_field(b"", 3)
    with pytest.raises(wire.WireError):
        wire.unwrap_field(wire.length_delimited(3, b"abc")[:-1], 3)
    with pytest.raises(wire.WireError):
        wire.unwrap_field(b"\x80", 3)


def test_varints_and_fields_are_protobuf_s_bytes() -> None:
    """Every length class of varint, and the fields built from them, byte for byte as protobuf
    encodes them (the hand-written encoder has fast paths for small values)."""
    values = sorted({0, 1, 126, 127, 128, 255, 16383, 16384, 2**21 - 1, 2**21, 2**35, 2**56, 2**63 - 1, 2**64 - 1}
                    | {2**k + d for k in range(64) for d in (-1, 0, 1) if 0 <= 2**k + d < 2**64})
    for value in values:
        req = raft_internal_pb2.InternalRaftRequest(ID=value)
        assert wire.varint_field(1, value) == (req.SerializeToString() or b"\x08\x00")  # 0: protobuf omits it
        assert wire.decode_varint(wire.encode_varint(value), 0) == (value, len(wire.encode_varint(value)))
    for number in (1, 15, 16, 100, 2047, 2048, 3200):
        assert wire.length_delimited(number, b"ab") == wire.encode_varint(number << 3 | 2) + b"\x02ab"
    with pytest.raises(ValueError):
        wire.encode_varint(-1)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 70_000])
@pytest.mark.parametrize("identity", [("", 0, False, False), ("alice", 7, False, True), ("", 0, True, False),
                                      ("bob", 2**40, False, False)])
def test_stamped_requests_are_the_wire_encoders_bytes(size: int, identity: tuple[str, int, bool, bool]) -> None:
    """The proxy's stamp (cached header and field key) sends what the reference encoders build,
    for every method, request size and kind of identity, again and again (the cache answers)."""
    from proxy.identity import Identity
    from proxy.pipeline import stamp

    username, revision, invalid, simple = identity
    who = Identity(username, revision, simple_token="t" if simple else None, invalid_token=invalid)
    request = bytes(range(256)) * (size // 256) + bytes(size % 256)
    for method in METHODS:
        if method.field == 0:
            continue
        expected = wire.build_internal_request(
            wire.encode_header(username, revision, invalid_token=invalid, simple_token=simple), method.field, request)
        for _ in range(2):
            assert stamp(who, method, request) == expected
        header = raft_internal_pb2.RequestHeader.FromString(wire.unwrap_field(expected, wire.HEADER_FIELD))
        assert (header.username, header.auth_revision, header.simple_token) == (username, revision, simple)


@pytest.mark.parametrize("answer", [
    wire.length_delimited(4, b""),
    wire.length_delimited(4, b"x" * 127),
    wire.length_delimited(4, b"x" * 128),
    wire.length_delimited(4, b"x" * 70_000),
    wire.length_delimited(3, b"other") + wire.length_delimited(4, b"ours"),
    wire.length_delimited(4, b"first") + wire.length_delimited(4, b"last"),  # the last one wins
    wire.length_delimited(4, b"ours") + wire.varint_field(9, 5),
    wire.length_delimited(4, b"x" * 10)[:-1],  # truncated
    wire.length_delimited(3, b"other"),  # missing
    b"",
])
def test_the_proxy_unwraps_answers_as_the_wire_reference_does(answer: bytes) -> None:
    """The proxy's unwrap of a store answer (a shortcut for the usual one-field answer) gives what
    ``wire.unwrap_field`` gives, or fails as it does."""
    from proxy.pipeline import unwrap

    try:
        expected: bytes | type[Exception] = wire.unwrap_field(answer, 4)
    except wire.WireError:
        expected = wire.WireError
    if expected is wire.WireError:
        with pytest.raises(wire.WireError):
            unwrap(answer, 4)
    else:
        assert unwrap(answer, 4) == expected
