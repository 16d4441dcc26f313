"""``python -m bench.floor --port P``: the floor, a bare gRPC-Python asyncio server.

It answers ``etcdserverpb.KV/Put`` and ``KV/Range`` with canned bytes and does nothing else: no
parsing of the request (the handlers take and return raw bytes), no auth, no store. Whatever any
Python gRPC server does per request costs at least this much, so raftgate's throughput as a share
of the floor's says how much room is left above gRPC-Python itself, on the same machine, in the
same run, with the same load. The answers have the size of a real answer (a header; Range: one
128-byte value, as the bench reads).

For the watch row it also serves ``etcdserverpb.Watch/Watch``: a stream's first request is
answered "created" and every later one is ignored; while a stream is open each Put is also an
event (its key and value, then read from the request, because a watcher must see the key it waits
for) queued to every open stream, and each stream's writer task sends what is queued when it can,
the events of several Puts in one message as raftgate's proxy merges them for a client that is
behind. Nothing else: no store, no revisions, no keys matched, no bounds (the bench's watchers
take everything). For that row it is a bare reference, not a limit: docs/performance.md, round 8,
measures patterns that do less per event.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator

import grpc
import grpc.aio

from protos.etcdserverpb import rpc_pb2
from protos.mvccpb import kv_pb2

#: The services the floor serves (the rows it has a value for: Put, Range and the watch fan-out).
SERVICE = "etcdserverpb.KV"
WATCH_SERVICE = "etcdserverpb.Watch"
#: Events merged into one message at most (etcd's own catch-up answers carry up to 1,000 revisions).
MAX_MERGED = 1000
READY = "bench.floor: serving on"


def canned() -> dict[str, bytes]:
    """The answer of each method, encoded once."""
    header = rpc_pb2.ResponseHeader(cluster_id=1, member_id=1, revision=1000, raft_term=2)
    kv = kv_pb2.KeyValue(key=b"/bench/r", value=b"x" * 128, create_revision=2, mod_revision=2, version=1)
    return {
        "Put": rpc_pb2.PutResponse(header=header).SerializeToString(),
        "Range": rpc_pb2.RangeResponse(header=header, kvs=[kv], count=1).SerializeToString(),
    }


def handlers(streams: set[asyncio.Queue[bytes]] | None = None) -> tuple[grpc.GenericRpcHandler, ...]:
    """The floor's services; ``streams`` holds one queue per open Watch stream (the events it has
    not sent)."""
    answers = canned()
    streams = set() if streams is None else streams
    header = rpc_pb2.ResponseHeader(cluster_id=1, member_id=1, revision=1000, raft_term=2)
    head = rpc_pb2.WatchResponse(header=header).SerializeToString()
    created = rpc_pb2.WatchResponse(header=header, created=True).SerializeToString()

    def unary(answer: bytes) -> grpc.RpcMethodHandler:
        async def handle(_request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
            return answer

        # No (de)serializers: the request stays bytes, the answer is sent as it is.
        return grpc.unary_unary_rpc_method_handler(handle)

    async def put(request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
        if streams:
            req = rpc_pb2.PutRequest.FromString(request)
            kv = kv_pb2.KeyValue(key=req.key, value=req.value, create_revision=2, mod_revision=1000, version=1)
            event = rpc_pb2.WatchResponse(events=[kv_pb2.Event(kv=kv)]).SerializeToString()  # one events field
            for queue in streams:
                queue.put_nowait(event)
        return answers["Put"]

    async def watch(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for _create in requests:
            break
        else:
            return
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        streams.add(queue)
        # dropped when the call ends, however it ends (a stream canceled while its message is being
        # sent leaves this generator paused until it is collected: no events for it meanwhile)
        context.add_done_callback(lambda _context: streams.discard(queue))
        yield created
        while True:
            events = [await queue.get()]
            while not queue.empty() and len(events) < MAX_MERGED:
                events.append(queue.get_nowait())
            yield head + b"".join(events)

    kv = {**{name: unary(a) for name, a in answers.items()}, "Put": grpc.unary_unary_rpc_method_handler(put)}
    watches = {"Watch": grpc.stream_stream_rpc_method_handler(watch)}
    return (grpc.method_handlers_generic_handler(SERVICE, kv),
            grpc.method_handlers_generic_handler(WATCH_SERVICE, watches))


async def serve(host: str, port: int) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers(handlers())
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise OSError(f"bench.floor: cannot listen on {host}:{port}")
    await server.start()
    print(f"{READY} {host}:{bound}", flush=True)
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args(argv)
    try:
        asyncio.run(serve(a.host, a.port))
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
