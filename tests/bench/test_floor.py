"""The floor (bench/floor.py) in-process: what the watch row measures it by must be a real watch
server to an etcd client: a create is answered and each Put reaches every open stream with its
key, in order; a stream the client ends gets nothing more."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio

from bench.floor import handlers
from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc


async def _floor(streams: set[asyncio.Queue[bytes]]) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers(handlers(streams))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_each_put_reaches_every_watch_stream_in_order_until_it_ends() -> None:
    async def run() -> None:
        streams: set[asyncio.Queue[bytes]] = set()
        server, target = await _floor(streams)
        try:
            async with grpc.aio.insecure_channel(target) as ch:
                watch, kv = rpc_pb2_grpc.WatchStub(ch), rpc_pb2_grpc.KVStub(ch)
                calls = [watch.Watch() for _ in range(3)]
                for call in calls:
                    await call.write(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"/w/")))
                    first = await asyncio.wait_for(call.read(), 10)
                    assert first.created and not first.canceled
                for i in range(5):
                    await kv.Put(rpc_pb2.PutRequest(key=f"/w/k{i}".encode(), value=b"v"), timeout=10)
                for call in calls:
                    keys: list[bytes] = []
                    while len(keys) < 5:  # (several Puts may share a message)
                        resp = await asyncio.wait_for(call.read(), 10)
                        keys += [ev.kv.key for ev in resp.events]
                    assert keys == [f"/w/k{i}".encode() for i in range(5)]
                    call.cancel()
                async with asyncio.timeout(10):
                    while streams:  # the server learns of each cancel when it comes
                        await asyncio.sleep(0.01)
        finally:
            await server.stop(None)

    asyncio.run(run())
