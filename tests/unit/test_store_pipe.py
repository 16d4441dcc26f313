"""The proxy's batched Do stream gives each caller what a unary Store.Do would have given it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from harness import free_port

from protos.storepb import store_pb2
from proxy.store_client import _unreached
from proxy.store_pipe import StorePipe

METHOD = "/raftgate.storepb.Store/DoStream"
Behaviour = Callable[[store_pb2.DoCall], Awaitable[store_pb2.DoResult | None]]


async def _serve(port: int, behaviour: Behaviour, seen: list[bytes]) -> grpc.aio.Server:
    """A DoStream that answers every call with ``behaviour`` as its own task (None: never)."""

    async def do_stream(batches: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        out: asyncio.Queue[store_pb2.DoResult] = asyncio.Queue()

        async def one(call: store_pb2.DoCall) -> None:
            result = await behaviour(call)
            if result is not None:
                out.put_nowait(result)

        async def read() -> None:
            async for raw in batches:
                for call in store_pb2.DoBatch.FromString(raw).calls:
                    seen.append(call.request)
                    asyncio.get_running_loop().create_task(one(call))

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                result = await out.get()
                if result.message == "abort the stream":
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
                yield store_pb2.DoResultBatch(results=[result]).SerializeToString()
        finally:
            reader.cancel()

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "raftgate.storepb.Store", {"DoStream": grpc.stream_stream_rpc_method_handler(do_stream)}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


def _run(behaviour: Behaviour, scenario: Callable[[StorePipe, list[bytes]], Awaitable[None]]) -> None:
    async def main() -> None:
        port = free_port()
        seen: list[bytes] = []
        server = await _serve(port, behaviour, seen)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        pipe = StorePipe(channel, METHOD, ())
        try:
            await scenario(pipe, seen)
        finally:
            await pipe.close()
            await channel.close()
            await server.stop(None)

    asyncio.run(main())


def test_answers_match_their_calls_in_any_order() -> None:
    async def behaviour(call: store_pb2.DoCall) -> store_pb2.DoResult:
        n = int(call.request)
        await asyncio.sleep(0.001 * (10 - n))  # the first sent is answered last
        if n == 3:
            return store_pb2.DoResult(id=call.id, code=grpc.StatusCode.PERMISSION_DENIED.value[0],
                                      message="etcdserver: permission denied")
        return store_pb2.DoResult(id=call.id, response=b"answer-" + call.request)

    async def scenario(pipe: StorePipe, seen: list[bytes]) -> None:
        results = await asyncio.gather(*(pipe.do(str(n).encode(), 5.0) for n in range(10)), return_exceptions=True)
        for n, result in enumerate(results):
            if n == 3:
                assert isinstance(result, grpc.aio.AioRpcError)
                assert (result.code(), result.details()) == (grpc.StatusCode.PERMISSION_DENIED,
                                                             "etcdserver: permission denied")
            else:
                assert result == f"answer-{n}".encode()
        assert sorted(seen) == sorted(str(n).encode() for n in range(10))

    _run(behaviour, scenario)


def test_a_broken_stream_fails_what_it_carried_and_the_next_call_reconnects() -> None:
    async def behaviour(call: store_pb2.DoCall) -> store_pb2.DoResult | None:
        if call.request == b"slow":
            return None  # still in flight when the stream breaks
        if call.request == b"break":
            return store_pb2.DoResult(id=call.id, message="abort the stream")
        return store_pb2.DoResult(id=call.id, response=b"ok")

    async def scenario(pipe: StorePipe, seen: list[bytes]) -> None:
        slow = asyncio.ensure_future(pipe.do(b"slow", 5.0))
        while b"slow" not in seen:
            await asyncio.sleep(0.001)
        with pytest.raises(grpc.aio.AioRpcError) as broke:
            await pipe.do(b"break", 5.0)
        with pytest.raises(grpc.aio.AioRpcError) as lost:
            await slow
        for error in (broke.value, lost.value):
            # sent, then the connection went: the outcome is unknown, so it is not "unreached"
            assert error.code() == grpc.StatusCode.UNAVAILABLE and not _unreached(error)
        assert await pipe.do(b"again", 5.0) == b"ok"

    _run(behaviour, scenario)


def test_a_deadline_ends_the_call_not_the_stream() -> None:
    async def behaviour(call: store_pb2.DoCall) -> store_pb2.DoResult | None:
        return None if call.request == b"never" else store_pb2.DoResult(id=call.id, response=b"ok")

    async def scenario(pipe: StorePipe, _seen: list[bytes]) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pipe.do(b"never", 0.05)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert await pipe.do(b"fine", 5.0) == b"ok"

    _run(behaviour, scenario)


def test_no_store_listening_reads_as_unreached() -> None:
    async def main() -> None:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}")
        pipe = StorePipe(channel, METHOD, ())
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pipe.do(b"anything", 5.0)
            assert _unreached(err.value)  # so the client retries it elsewhere: nothing was taken
        finally:
            await pipe.close()
            await channel.close()

    asyncio.run(main())
