"""A client Watch stream that ends while the proxy resumes it on a new store stream (the token
checked again just then) leaves no store stream behind: the one opened for the resume is canceled
and no other is opened after the end.

Python 3.11's ``asyncio.wait_for`` returns the result, and drops the cancel, when its task is
canceled in the turn its awaitable finishes: the resume went on for a stream already ended and
kept a store stream (a sub-stream of the shared one) open for no client, forever."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from proxy.identity import Identity
from proxy.watch import WatchProxy
from tests.support.away_store import NoAbortContext


def _error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class Call:
    """A store stream: the first one is lost at once (the node died); the next serve until
    canceled."""

    def __init__(self, lost: bool) -> None:
        self.lost = lost
        self.canceled = asyncio.Event()

    async def write(self, data: bytes) -> None:
        return None

    async def read(self) -> Any:
        if self.lost:
            raise _error(grpc.StatusCode.UNAVAILABLE, "Socket closed")
        await self.canceled.wait()
        raise _error(grpc.StatusCode.CANCELLED, "watch sub-stream canceled")

    def cancel(self) -> bool:
        self.canceled.set()
        return True


class Streams:
    """StoreClient.watch_streams as proxy/watch.py sees it: every end may be resumed."""

    def __init__(self) -> None:
        self.opened: list[Call] = []

    async def open(self) -> Call:
        call = Call(lost=not self.opened)
        self.opened.append(call)
        return call

    def served(self) -> None:
        return None

    async def ended(self, _error: grpc.aio.AioRpcError | None, _started: float) -> BaseException | None:
        return None  # a node lost, a stream canceled: resumed on the leader, as the store client does


class Store:
    def __init__(self) -> None:
        self.streams = Streams()

    def watch_streams(self) -> Streams:
        return self.streams


@pytest.mark.parametrize("turns", range(8))
def test_a_stream_ending_as_its_resume_checks_the_token_leaves_no_store_stream_open(turns: int) -> None:
    """``turns``: loop turns between the token's answer and the client stream's end (the window
    where the cancel was lost is one of them)."""

    async def scenario() -> None:
        store = Store()
        loop = asyncio.get_running_loop()
        consumer: asyncio.Task[Any] | None = None

        def end_after(n: int) -> None:
            if n:
                loop.call_soon(end_after, n - 1)
            elif consumer is not None:
                consumer.cancel()  # the client went away: its handler is canceled

        checks = 0

        async def identify() -> Identity:
            nonlocal checks
            checks += 1
            if checks == 1:  # the resume's check of the token
                loop.call_soon(end_after, turns)
            return Identity("bob", 1)

        async def requests() -> AsyncIterator[bytes]:
            await asyncio.Event().wait()  # the client sends nothing more
            yield b""

        proxy = WatchProxy(store, identify)  # type: ignore[arg-type]
        stream = proxy.serve(Identity("bob", 1), requests(), NoAbortContext())  # type: ignore[arg-type]
        consumer = loop.create_task(anext(stream))
        await asyncio.gather(consumer, return_exceptions=True)
        await stream.aclose()
        for _ in range(100):  # whatever the proxy would still do for the stream, it does now
            await asyncio.sleep(0)
        assert len(store.streams.opened) == 2, "a store stream was opened after the client stream ended"
        assert all(call.canceled.is_set() for call in store.streams.opened), "a store stream was left open"

    asyncio.run(asyncio.wait_for(scenario(), 30))  # a wait that never ends fails, not hangs
