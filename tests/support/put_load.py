"""A writer that keeps putting through leader kills (watch failover tests), bounded in count and time."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg

#: Puts one writer makes at most, whatever the timing (the tests stop it long before).
MAX_PUTS = 20_000


async def put_until(ch: grpc.aio.Channel, stop: asyncio.Event, prefix: bytes, keys: int, acked: list[int]) -> None:
    """Puts ``prefix`` + ``n % keys`` until ``stop`` (or MAX_PUTS), appending each acknowledged
    revision to ``acked``; a put refused while there is no leader is tried again 50 ms later."""
    kv = pbg.KVStub(ch)
    for n in range(MAX_PUTS):
        if stop.is_set():
            return
        try:
            r = await kv.Put(pb.PutRequest(key=prefix + b"%d" % (n % keys), value=b"%d" % n), timeout=5)
            acked.append(r.header.revision)
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.05)
