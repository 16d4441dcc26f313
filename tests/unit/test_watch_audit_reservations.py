"""--audit-fail-closed reserves a record's room for each watch create the proxy admits; the room is
given back when the store answers the create or the client's stream ends first. A create admitted
while the proxy was writing to a new store stream what the client had (its watches to resume, the
creates it sent while the store was away: the stream's lock held across writes the store is slow
to take), whose client went away right then, kept its room for good: enough such streams and a
fail-closed proxy refuses every request as if its audit log could not be written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from protos.etcdserverpb import rpc_pb2 as pb
from proxy.audit import handlers
from proxy.audit.records import MAX_RECORD_BYTES
from proxy.audit.writer import AuditLog
from proxy.identity import Identity
from proxy.watch import WatchProxy
from raftgate.methods import METHODS
from tests.support.away_store import AwayStore, NoAbortContext

WATCH = next(m for m in METHODS if m.name == "Watch")


class StalledCall:
    """A store stream whose writes the store does not take (HTTP/2 flow control) and that answers nothing."""

    def __init__(self) -> None:
        self.writing = asyncio.Event()

    async def write(self, _data: bytes) -> None:
        self.writing.set()
        await asyncio.Event().wait()

    async def read(self) -> Any:
        await asyncio.Event().wait()

    def cancel(self) -> bool:
        return True


def _create(key: bytes) -> bytes:
    return pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key)).SerializeToString()


def test_a_create_admitted_while_the_stream_resumes_gives_its_room_back_when_the_client_goes() -> None:
    async def scenario() -> None:
        log = AuditLog("-", "all", fail_closed=True, queue_bytes=2 * MAX_RECORD_BYTES)  # two rooms
        call = handlers.Call(WATCH, "ipv4:10.0.0.9:5000", user="bob", auth_revision=1)
        store = AwayStore(StalledCall())
        proxy = WatchProxy(store, events=handlers.WatchEvents(log, call))  # type: ignore[arg-type]
        sent: asyncio.Queue[bytes] = asyncio.Queue()
        read: list[int] = []

        async def requests() -> AsyncIterator[bytes]:
            while True:
                data = await sent.get()
                read.append(1)
                yield data

        stream = proxy.serve(Identity("bob", 1), requests(), NoAbortContext())  # type: ignore[arg-type]
        client = asyncio.get_running_loop().create_task(anext(stream))
        await sent.put(_create(b"a"))  # sent while the store is away: kept for the next stream
        while len(read) < 1:
            await asyncio.sleep(0)
        store.streams.back.set()  # the store is back: the proxy sends "a" on, the store takes nothing
        await store.streams.call.writing.wait()
        await sent.put(_create(b"b"))  # admitted, then waits for the stream the proxy is writing to
        while len(read) < 2:
            await asyncio.sleep(0)
        for _ in range(10):
            await asyncio.sleep(0)
        client.cancel()  # the client goes away
        await asyncio.gather(client, return_exceptions=True)
        await stream.aclose()
        for _ in range(10):
            await asyncio.sleep(0)
        assert log.admit() and log.admit(), "a room is still held for a stream that is gone"

    asyncio.run(asyncio.wait_for(scenario(), 30))  # a wait that never ends fails, not hangs
