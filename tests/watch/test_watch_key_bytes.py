"""Every buffer bounded in bytes: the keys of open watches too.

Watches are capped by count (10,000 per stream, 20,000 per user), but each create may carry a key
and a range end of up to --max-request-bytes together. Without a byte bound, one stream of 200
watches with 1 MB keys made the store hold 500 MB and the proxy 400 MB, and the count caps
allowed about 30 GB per user. The store bounds the bytes of the keys and range ends its open
watches hold, per stream and per user: a create beyond is refused in-band with ResourceExhausted
(etcd's cancel shape) and the stream goes on.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.processes import store_and_proxy, wait_for

pytestmark = pytest.mark.slow
PER_STREAM = "rpc error: code = ResourceExhausted desc = etcdserver: too many watches on this stream"
PER_USER = "rpc error: code = ResourceExhausted desc = etcdserver: too many watches for this user"
KEY_BYTES = 700_000  # key and range end: about 1.4 MB per create, under --max-request-bytes
OPTIONS = [("grpc.max_send_message_length", 4 << 20), ("grpc.max_receive_message_length", 4 << 20)]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("watch-key-bytes")
    with store_and_proxy(workdir) as target:
        yield target


class Stream:
    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target, options=OPTIONS)
        self.requests: queue.Queue[pb.WatchRequest | None] = queue.Queue()
        self.answers = pbg.WatchStub(self.channel).Watch(self._send(), timeout=120)

    def _send(self) -> Iterator[pb.WatchRequest]:
        while (item := self.requests.get(timeout=120)) is not None:
            yield item

    def create(self, key: bytes, range_end: bytes = b"") -> pb.WatchResponse:
        self.requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key, range_end=range_end)))
        return next(self.answers)

    def close(self) -> None:
        self.requests.put(None)
        self.channel.close()


def _big(tag: str, i: int) -> tuple[bytes, bytes]:
    key = f"{tag}/{i:04d}/".encode() + b"k" * KEY_BYTES
    return key, key + b"\xff"


def _fill(stream: Stream, tag: str, creates: int) -> pb.WatchResponse | None:
    """Creates up to `creates` big watches; the first refusal, or None if none was refused."""
    for i in range(creates):
        resp = stream.create(*_big(tag, i))
        assert resp.created, resp
        if resp.canceled:
            return resp
    return None


def test_watch_keys_beyond_the_stream_bound_are_refused(target: str) -> None:
    stream = Stream(target)
    try:
        refused = _fill(stream, "s", 40)  # 56 MB of keys on one stream
        assert refused is not None, "40 watches of 1.4 MB of keys each were all created on one stream"
        assert (refused.watch_id, refused.cancel_reason) == (-1, PER_STREAM), refused
        small = stream.create(b"small")
        assert small.created and not small.canceled, small
    finally:
        stream.close()


def test_watch_keys_beyond_the_user_bound_are_refused(target: str) -> None:
    streams = [Stream(target) for _ in range(8)]
    try:
        refusals = [_fill(s, f"u{n}", 11) for n, s in enumerate(streams)]  # 8 x 15.4 MB
        reasons = {r.cancel_reason for r in refusals if r is not None}
        assert reasons == {PER_USER}, refusals
    finally:
        for s in streams:
            s.close()
    # the bytes of closed streams' watches are given back: a new stream fills up to its own bound
    wait_for(lambda: _stream_bound_reached(target), 60, "closed streams' watch key bytes to be released")


def _stream_bound_reached(target: str) -> bool:
    stream = Stream(target)
    try:
        refused = _fill(stream, "again", 40)
        return refused is not None and refused.cancel_reason == PER_STREAM
    finally:
        stream.close()
