"""Oversized requests as a gRPC client sees them, side by side with real etcd.

etcd's server (grpc-go) refuses a request above max-request-bytes + 512 KiB with RESOURCE_EXHAUSTED
`grpc: received message larger than max (N vs. M)`; grpc-core words the same refusal differently,
so raftgate must refuse it itself, with grpc-go's words, on unary and streaming calls alike.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.processes import BACKENDS, EtcdServer, RaftgateLocal, new_server

LIMIT = 1536 * 1024 + 512 * 1024  # etcd's default max-request-bytes + grpcOverheadBytes


@pytest.fixture(scope="module", params=BACKENDS)
def channel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[grpc.Channel]:
    server: EtcdServer | RaftgateLocal = new_server(request.param, tmp_path_factory.mktemp(f"limits-{request.param}"))
    server.start()
    chan = grpc.insecure_channel(server.endpoint.removeprefix("http://"))
    yield chan
    chan.close()
    server.stop()


def _too_large(size: int) -> str:
    return f"grpc: received message larger than max ({size} vs. {LIMIT})"


@pytest.mark.parametrize("value_bytes", [LIMIT, 3 * 1024 * 1024])
def test_oversized_unary_request(channel: grpc.Channel, value_bytes: int) -> None:
    req = pb.PutRequest(key=b"big", value=b"x" * value_bytes)
    with pytest.raises(grpc.RpcError) as info:
        pbg.KVStub(channel).Put(req, timeout=30)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        _too_large(req.ByteSize()),
    )
    # The server is still fine, and a request at the limit's edge of the value still passes.
    pbg.KVStub(channel).Put(pb.PutRequest(key=b"small", value=b"x" * (1024 * 1024)), timeout=30)


def test_oversized_watch_request(channel: grpc.Channel) -> None:
    req = pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"k" * (LIMIT + 10)))
    responses = pbg.WatchStub(channel).Watch(iter([req]), timeout=30)
    with pytest.raises(grpc.RpcError) as info:
        list(responses)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        _too_large(req.ByteSize()),
    )


def test_oversized_keepalive_request(channel: grpc.Channel) -> None:
    """A client stream the handler reads in its own task (LeaseKeepAlive); the message is padded
    with an unknown field, which both servers skip after the size check."""
    pad = b"x" * (LIMIT + 10)
    length = len(pad)
    varint = bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        varint.append(byte | (0x80 if length else 0))
        if not length:
            break
    raw = b"\x08\x05\x12" + bytes(varint) + pad  # ID=5, then field 2 (unknown)
    call = channel.stream_stream("/etcdserverpb.Lease/LeaseKeepAlive", request_serializer=lambda b: b,
                                 response_deserializer=pb.LeaseKeepAliveResponse.FromString)
    with pytest.raises(grpc.RpcError) as info:
        list(call(iter([raw]), timeout=30))
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, _too_large(len(raw)))
