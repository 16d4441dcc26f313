"""A watch created with ``fragment`` whose revision was cut into parts: when the store stream fails
after the client got some parts and before the last, the proxy resumes the watch from that
revision, and the new stream sends the whole revision again. The client, which was still
gathering the parts, must get only the events it lacks and then the last part (a client appends
parts until one comes without ``fragment``): never an event twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.mvccpb import kv_pb2
from protos.storepb import store_pb2 as spb
from proxy.identity import Identity
from proxy.watch import WatchProxy
from tests.support.away_store import NoAbortContext


def answer(keys: bytes, *, fragment: bool) -> bytes:
    """Events of revision 12 on the keys named by ``keys`` (one letter each)."""
    events = [kv_pb2.Event(kv=kv_pb2.KeyValue(key=bytes([k]), mod_revision=12)) for k in keys]
    return pb.WatchResponse(header=pb.ResponseHeader(revision=12), events=events,
                            fragment=fragment).SerializeToString()


class Call:
    """One store stream: answers a create that is not a resume with `created` at revision 10."""

    def __init__(self) -> None:
        self.written: list[spb.WatchStreamRequest] = []
        self.answers: asyncio.Queue[Any] = asyncio.Queue()

    async def write(self, data: bytes) -> None:
        msg = spb.WatchStreamRequest.FromString(data)
        self.written.append(msg)
        if msg.request.HasField("create_request") and not msg.resume:
            created = pb.WatchResponse(header=pb.ResponseHeader(revision=10), created=True)
            self.send(created.SerializeToString())

    def send(self, *responses: bytes) -> None:
        self.answers.put_nowait(spb.WatchBatch(responses=list(responses)).SerializeToString())

    async def read(self) -> Any:
        return await self.answers.get()

    def cancel(self) -> bool:
        return True


class Streams:
    """The store's watch streams, one call after the other; a stream that ends is opened again."""

    def __init__(self, *calls: Call) -> None:
        self.calls = list(calls)

    async def open(self) -> Call:
        if not self.calls:
            await asyncio.Event().wait()
        return self.calls.pop(0)

    def served(self) -> None:
        return None

    async def ended(self, _error: grpc.aio.AioRpcError | None, _started: float) -> BaseException | None:
        return None


class Store:
    def __init__(self, streams: Streams) -> None:
        self.streams = streams

    def watch_streams(self) -> Streams:
        return self.streams


@pytest.mark.parametrize("replay", [
    [answer(b"abc", fragment=False)],  # the new leader sends the revision whole
    [answer(b"ab", fragment=True), answer(b"c", fragment=False)],  # cut as before
    [answer(b"a", fragment=True), answer(b"bc", fragment=False)],  # cut elsewhere
])
def test_a_resume_inside_a_fragmented_revision_sends_no_event_twice(replay: list[bytes]) -> None:
    async def scenario() -> list[pb.WatchResponse]:
        first, second = Call(), Call()
        proxy = WatchProxy(Store(Streams(first, second)))  # type: ignore[arg-type]

        async def requests() -> AsyncIterator[bytes]:
            yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"a", range_end=b"z",
                                                                       fragment=True)).SerializeToString()
            await asyncio.Event().wait()  # the client stays

        stream = proxy.serve(Identity("bob", 1), requests(), NoAbortContext())  # type: ignore[arg-type]
        got = [pb.WatchResponse.FromString(await anext(stream))]  # created
        first.send(answer(b"ab", fragment=True))
        got.append(pb.WatchResponse.FromString(await anext(stream)))
        first.answers.put_nowait(grpc.aio.EOF)  # the stream ends: the proxy resumes on the next
        while not second.written:
            await asyncio.sleep(0)
        resumed = second.written[0]
        assert resumed.resume and resumed.request.create_request.start_revision == 11  # after created at 10
        second.send(*replay)
        while not got[-1].events or got[-1].fragment:
            got.append(pb.WatchResponse.FromString(await anext(stream)))
        await stream.aclose()
        return got

    got = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert got[0].created
    parts = got[1:]
    assert [e.kv.key for p in parts for e in p.events] == [b"a", b"b", b"c"]  # each once
    assert [p.fragment for p in parts] == [True] * (len(parts) - 1) + [False]
