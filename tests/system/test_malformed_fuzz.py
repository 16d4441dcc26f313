"""Every etcd v3 method, fed bytes that are not its request message, answers as etcd does and the
server keeps serving (Trust, "Done means").

The methods come from the etcdserverpb service descriptors, so a method added to protos/ is
fuzzed too. Each body is a run of well-formed fields (any field number and wire type) followed by
an ending no protobuf decoder accepts (an illegal wire type, field number 0, a truncated varint,
fixed or length-delimited value), so every decoder, Go's or Python's, refuses it. grpc-go answers
INTERNAL "grpc: error unmarshalling request: <reason>" for a unary call and INTERNAL "grpc: failed
to unmarshal the received message: <reason>" for a streaming one (etcd 3.5.1's older grpc-go leaves
out the colon); the reason is the decoder's own text, so only the prefix is compared. Each body
goes to a real etcd 3.5.1 and to raftgate side by side: the status codes must be equal.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.processes import EtcdServer, RaftgateLocal, new_server, skip_unless_available, stop_together

UNARY = "grpc: error unmarshalling request: "
STREAM = "grpc: failed to unmarshal the received message: "
STREAM_351 = "grpc: failed to unmarshal the received message"  # etcd 3.5.1: no colon
#: methods of the 3.7.1 contract that etcd 3.5.1 does not have (it answers UNIMPLEMENTED)
NOT_IN_351 = {"/etcdserverpb.KV/RangeStream"}
EXAMPLES = 6


def _methods() -> list[tuple[str, bool, bool]]:
    return [(f"/{svc.full_name}/{m.name}", m.client_streaming, m.server_streaming)
            for svc in rpc_pb2.DESCRIPTOR.services_by_name.values() for m in svc.methods]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


@st.composite
def _field(draw: st.DrawFn) -> bytes:
    """One well-formed field: any number, any wire type, a value of the right shape."""
    number = draw(st.integers(1, 40))
    wire_type = draw(st.sampled_from([0, 1, 2, 5]))
    tag = _varint(number << 3 | wire_type)
    if wire_type == 0:
        return tag + _varint(draw(st.integers(0, 2**64 - 1)))
    if wire_type == 1:
        return tag + draw(st.binary(min_size=8, max_size=8))
    if wire_type == 5:
        return tag + draw(st.binary(min_size=4, max_size=4))
    value = draw(st.binary(max_size=24))
    return tag + _varint(len(value)) + value


@st.composite
def _broken_ending(draw: st.DrawFn) -> bytes:
    number = draw(st.integers(1, 40))
    kind = draw(st.sampled_from(["wire type 6/7", "field 0", "varint", "fixed64", "fixed32", "length"]))
    if kind == "wire type 6/7":
        return _varint(number << 3 | draw(st.sampled_from([6, 7]))) + draw(st.binary(max_size=4))
    if kind == "field 0":
        return _varint(draw(st.sampled_from([0, 1, 2, 5])))
    if kind == "varint":  # every byte says "more follows", then the body ends
        return _varint(number << 3) + bytes(b | 0x80 for b in draw(st.binary(min_size=1, max_size=5)))
    if kind == "fixed64":
        return _varint(number << 3 | 1) + draw(st.binary(max_size=7))
    if kind == "fixed32":
        return _varint(number << 3 | 5) + draw(st.binary(max_size=3))
    length = draw(st.integers(1, 200))
    return _varint(number << 3 | 2) + _varint(length) + draw(st.binary(max_size=min(length - 1, 16)))


malformed = st.builds(lambda fields, end: b"".join(fields) + end, st.lists(_field(), max_size=3), _broken_ending())


def _call(channel: grpc.Channel, path: str, client_streaming: bool, server_streaming: bool, body: bytes,
          token: str) -> tuple[str, str]:
    """(status code name, details) of one call with raw bytes as its (first) request message."""
    same = {"request_serializer": None, "response_deserializer": None}
    md = (("token", token),)
    try:
        if client_streaming:
            list(channel.stream_stream(path, **same)(iter([body]), metadata=md, timeout=15))
        elif server_streaming:
            list(channel.unary_stream(path, **same)(body, metadata=md, timeout=15))
        else:
            channel.unary_unary(path, **same)(body, metadata=md, timeout=15)
    except grpc.RpcError as exc:
        return exc.code().name, exc.details() or ""  # type: ignore[attr-defined]
    return "OK", ""


class _Side:
    """A server with auth on and root's token, and a channel to it."""

    def __init__(self, server: EtcdServer | RaftgateLocal) -> None:
        self.server = server
        self.channel = grpc.insecure_channel(server.target)
        auth = rpc_pb2_grpc.AuthStub(self.channel)
        auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"), timeout=15)
        auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=15)
        auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=15)
        self.token = auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="rootpw"), timeout=15).token

    def still_serving(self) -> None:
        kv = rpc_pb2_grpc.KVStub(self.channel)
        md = (("token", self.token),)
        put = kv.Put(rpc_pb2.PutRequest(key=b"alive", value=b"yes"), metadata=md, timeout=15)
        got = kv.Range(rpc_pb2.RangeRequest(key=b"alive"), metadata=md, timeout=15)
        assert [kv.value for kv in got.kvs] == [b"yes"] and got.header.revision == put.header.revision


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, _Side]]:
    started: dict[str, _Side] = {}
    servers = []
    try:
        for kind in ("etcd", "raftgate"):
            skip_unless_available(kind)
            server = new_server(kind, tmp_path_factory.mktemp(f"fuzz-{kind}"))
            servers.append(server)
            server.start()
            started[kind] = _Side(server)
        yield started
    finally:
        for side in started.values():
            side.channel.close()
        stop_together(servers)


@pytest.mark.parametrize(("path", "client_streaming", "server_streaming"), _methods(), ids=lambda v: str(v))
def test_malformed_bytes_get_etcds_error(sides: dict[str, _Side], path: str, client_streaming: bool,
                                         server_streaming: bool) -> None:
    streaming = client_streaming or server_streaming

    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=[HealthCheck.too_slow])
    @given(body=malformed)
    def check(body: bytes) -> None:
        with pytest.raises(Exception):  # noqa: B017, PT011 - the body must be malformed for every decoder
            rpc_pb2.RangeRequest.FromString(body)
        code, detail = _call(sides["raftgate"].channel, path, client_streaming, server_streaming, body,
                             sides["raftgate"].token)
        assert code == "INTERNAL" and detail.startswith(STREAM if streaming else UNARY), (code, detail)
        if path in NOT_IN_351:
            return
        etcd_code, etcd_detail = _call(sides["etcd"].channel, path, client_streaming, server_streaming, body,
                                       sides["etcd"].token)
        assert etcd_code == code, (etcd_code, etcd_detail)
        assert etcd_detail.startswith(STREAM_351 if streaming else UNARY), etcd_detail

    check()
    for side in sides.values():
        side.still_serving()
