"""A stand-in for the proxy's StoreClient as ``proxy.watch.WatchProxy`` uses it: the store is away
(no watch stream opens) until the test sets ``back``, then every stream the proxy opens is the
test's ``call``. For tests of what the proxy holds and sends around a store outage."""

from __future__ import annotations

import asyncio
from typing import Any, Generic, TypeVar

import grpc

C = TypeVar("C")


class AwayStreams(Generic[C]):
    def __init__(self, call: C) -> None:
        self.back = asyncio.Event()
        self.call = call

    async def open(self) -> C:
        await self.back.wait()
        return self.call

    def served(self) -> None:
        return None

    async def ended(self, _error: grpc.aio.AioRpcError | None, _started: float) -> BaseException | None:
        raise AssertionError("the store's stream never ends in these tests")


class AwayStore(Generic[C]):
    def __init__(self, call: C) -> None:
        self.streams = AwayStreams(call)

    def watch_streams(self) -> AwayStreams[C]:
        return self.streams


class NoAbortContext:
    """The handler's context in a test where no stream ends by an abort."""

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")
