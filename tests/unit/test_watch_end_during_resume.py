"""A client Watch stream that ends at any loop turn of a resume (the store stream opening, the
token check, the lock held by the client's own create, the re-sent creates and cancels written
one by one, the first read, the backoff after a lost stream) leaves no store stream open, opens
none after its end, and leaves no task of its session running.

Found by CI (tests/watch/test_watch_shared_chaos.py: the sub-stream gauge at 26 of 24 streams):
Python 3.11's ``asyncio.wait_for`` returns its awaitable's result and drops the cancel when its task
is canceled in the turn that awaitable finishes. A stream that ended as its resume's token check
answered went on resuming, found its sub-stream canceled (retryable) and opened another for no
client, forever. Every step of the fake store below takes loop turns of its own, so a cancel lands
in each of them for some ``turn``: with ``_identify`` back on ``wait_for`` (and no
``state.closed`` guard) 34 of the 80 turns fail (store streams opened after the end, tasks left
running)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.storepb.store_pb2 import WatchBatch, WatchStreamRequest
from proxy.identity import Identity
from proxy.watch import WatchProxy
from tests.support.away_store import NoAbortContext

TURNS = 80  # more than a whole resume takes here (the resume is over by turn ~16: the last find it reading)


def _error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


class Call:
    """A store stream answering creates; the first is lost (the node died) once it has nothing more
    to answer, the others serve until canceled (a resume's creates get no `created`, as the store's)."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.canceled = asyncio.Event()
        self.answers: asyncio.Queue[bytes] = asyncio.Queue()
        self.next_id = 0

    async def write(self, data: bytes) -> None:
        await _turns(2)  # a write takes turns (the shared link's lock, the call's write)
        req = WatchStreamRequest.FromString(data).request
        if req.HasField("create_request") and not self.canceled.is_set():
            if req.create_request.watch_id and not self.number:
                return
            resp = pb.WatchResponse(header=pb.ResponseHeader(revision=10), watch_id=self.next_id, created=True)
            self.next_id += 1
            if self.number == 0 or not WatchStreamRequest.FromString(data).resume:
                self.answers.put_nowait(WatchBatch(responses=[resp.SerializeToString()]).SerializeToString())

    async def read(self) -> Any:
        if self.number == 0:
            if self.answers.empty():
                raise _error(grpc.StatusCode.UNAVAILABLE, "Socket closed")  # the node died
            return self.answers.get_nowait()
        get = asyncio.ensure_future(self.answers.get())
        gone = asyncio.ensure_future(self.canceled.wait())
        try:
            await asyncio.wait((get, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            get.cancel()
            gone.cancel()
        if self.canceled.is_set():
            raise _error(grpc.StatusCode.CANCELLED, "watch sub-stream canceled")
        return get.result()

    def cancel(self) -> bool:
        self.canceled.set()
        return True


class Streams:
    def __init__(self) -> None:
        self.opened: list[Call] = []
        self.closed_at: int | None = None  # len(opened) when the client stream ended

    async def open(self) -> Call:
        await _turns(2)  # a new link's start, the proof
        call = Call(len(self.opened))
        self.opened.append(call)
        return call

    def served(self) -> None:
        return None

    async def ended(self, _error: grpc.aio.AioRpcError | None, _started: float) -> BaseException | None:
        await _turns(3)  # the rediscovery and the backoff
        return None


class Store:
    def __init__(self) -> None:
        self.streams = Streams()

    def watch_streams(self) -> Streams:
        return self.streams


def _create(key: bytes) -> bytes:
    return pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key)).SerializeToString()


@pytest.mark.parametrize("turn", range(TURNS))
def test_a_stream_ending_at_any_turn_of_a_resume_leaves_no_store_stream(turn: int) -> None:
    async def scenario() -> None:
        store = Store()
        loop = asyncio.get_running_loop()
        checks = 0

        async def identify() -> Identity:
            nonlocal checks
            checks += 1
            await _turns(2)
            return Identity("bob", 1)

        async def requests() -> AsyncIterator[bytes]:
            yield _create(b"a")
            yield _create(b"b")
            for i in range(40):  # creates keep coming during the resume: the client takes the lock
                await asyncio.sleep(0)
                yield _create(b"c%d" % i)
            await asyncio.Event().wait()

        proxy = WatchProxy(store, identify)  # type: ignore[arg-type]
        before = asyncio.all_tasks()
        stream = proxy.serve(Identity("bob", 1), requests(), NoAbortContext())  # type: ignore[arg-type]

        async def consume() -> None:
            try:
                async for _ in stream:
                    pass
            finally:  # (serve's own end ran just before, in this turn)
                store.streams.closed_at = len(store.streams.opened)

        consumer = loop.create_task(consume())
        async with asyncio.timeout(10):  # the first stream is lost once its first answers are in
            while len(store.streams.opened) < 1:
                await asyncio.sleep(0)
        await _turns(turn)
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        await stream.aclose()
        await _turns(200)  # whatever the proxy would still do for the stream, it does now
        left = [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()]
        assert not left, f"tasks of the ended stream still run: {left}"
        assert len(store.streams.opened) == store.streams.closed_at, \
            "a store stream was opened after the client stream ended"
        open_calls = [c.number for c in store.streams.opened if not c.canceled.is_set() and c.number]
        assert not open_calls, f"store streams left open: {open_calls}"

    asyncio.run(asyncio.wait_for(scenario(), 30))
