"""StoreClient.watch_streams: the store client decides, after a watch stream to the store ended,
whether the proxy resumes on the leader or ends the client's stream (proxy/watch.py only resumes)."""

from __future__ import annotations

import asyncio
import time

import grpc
import grpc.aio

from proxy.store_client import StoreClient
from raftgate.errors import Err


def _error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


def test_a_refusal_ends_the_stream_and_a_lost_node_is_resumed() -> None:
    async def main() -> None:
        client = StoreClient("127.0.0.1:1")
        try:
            streams = client.watch_streams()
            refused = _error(grpc.StatusCode.UNAUTHENTICATED, "raftgate: internal port requires proxy credentials")
            assert await streams.ended(refused, time.monotonic()) is refused
            lost = _error(grpc.StatusCode.UNAVAILABLE, "Socket closed")
            assert await streams.ended(lost, time.monotonic()) is None
            not_leader = _error(*Err.NOT_LEADER.value)
            assert await streams.ended(not_leader, time.monotonic()) is None
            assert await streams.ended(None, time.monotonic()) is None  # closed by the store: resume
        finally:
            await client.close()

    asyncio.run(main())
