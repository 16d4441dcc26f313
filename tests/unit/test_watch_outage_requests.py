"""A watch client keeps sending while the store is away: the proxy keeps its creates and other
requests up to UNSENT_BYTES (then reads no more of it), and once the store is back it sends each
of them exactly once (the creates in the client's order) and reads the rest of the client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from protos.etcdserverpb import rpc_pb2 as pb
from protos.storepb import store_pb2 as spb
from proxy.identity import Identity
from proxy.watch import UNSENT_BYTES, WatchProxy
from tests.support.away_store import AwayStore, NoAbortContext

KEY = 1 << 20  # creates of 1 MiB keys: the bound is a handful of them


class RecordingCall:
    """The store's stream once it is back: takes every write, answers each create (created)."""

    def __init__(self) -> None:
        self.written: list[spb.WatchStreamRequest] = []
        self._answers: asyncio.Queue[bytes] = asyncio.Queue()

    async def write(self, data: bytes) -> None:
        msg = spb.WatchStreamRequest.FromString(data)
        self.written.append(msg)
        if msg.request.HasField("create_request"):
            created = pb.WatchResponse(header=pb.ResponseHeader(revision=5), created=True, watch_id=len(self.written))
            self._answers.put_nowait(spb.WatchBatch(responses=[created.SerializeToString()]).SerializeToString())

    async def read(self) -> Any:
        return await self._answers.get()

    def cancel(self) -> bool:
        return True


def test_requests_sent_during_an_outage_are_held_within_the_bound_and_sent_once_when_the_store_is_back() -> None:
    creates = [pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"%d" % i + b"k" * KEY)) for i in range(8)]
    others = [pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=100 + i)) for i in range(8)]
    others.append(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))
    sent = [r for pair in zip(creates, others, strict=False) for r in pair] + others[len(creates):]

    async def scenario() -> None:
        store = AwayStore(RecordingCall())
        proxy = WatchProxy(store)  # type: ignore[arg-type]
        taken = 0

        async def requests() -> AsyncIterator[bytes]:
            nonlocal taken
            for request in sent:
                taken += 1
                yield request.SerializeToString()
            await asyncio.Event().wait()  # the client stays

        stream = proxy.serve(Identity("bob", 1), requests(), NoAbortContext())  # type: ignore[arg-type]
        client = asyncio.get_running_loop().create_task(anext(stream))
        for _ in range(200):
            await asyncio.sleep(0)
        held = sum(r.ByteSize() for r in sent[: taken - 1])  # the last one read waits for room
        assert taken < len(sent), "the proxy read on past its bound while the store was away"
        assert held <= UNSENT_BYTES + KEY + 64
        store.streams.back.set()
        for _ in range(2000):
            await asyncio.sleep(0)
            if taken == len(sent) and len(store.streams.call.written) == len(sent):
                break
        written = [w.request for w in store.streams.call.written]
        assert [w for w in written if w.HasField("create_request")] == creates  # each once, in order
        assert sorted(w.SerializeToString() for w in written if not w.HasField("create_request")) == sorted(
            r.SerializeToString() for r in others)  # each once
        client.cancel()
        await asyncio.gather(client, return_exceptions=True)
        await stream.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 30))  # a wait that never ends fails, not hangs
