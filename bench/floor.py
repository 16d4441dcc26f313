"""``python -m bench.floor --port P``: the floor, a bare gRPC-Python asyncio server.

It answers ``etcdserverpb.KV/Put`` and ``KV/Range`` with canned bytes and does nothing else: no
parsing of the request (the handlers take and return raw bytes), no auth, no store. Whatever any
Python gRPC server does per request costs at least this much, so raftgate's throughput as a share
of the floor's says how much room is left above gRPC-Python itself, on the same machine, in the
same run, with the same load. The answers have the size of a real answer (a header; Range: one
128-byte value, as the bench reads).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import grpc
import grpc.aio

from protos.etcdserverpb import rpc_pb2
from protos.mvccpb import kv_pb2

#: The methods the floor serves (the rows it has a value for are the Put and Range rows).
SERVICE = "etcdserverpb.KV"
READY = "bench.floor: serving on"


def canned() -> dict[str, bytes]:
    """The answer of each method, encoded once."""
    header = rpc_pb2.ResponseHeader(cluster_id=1, member_id=1, revision=1000, raft_term=2)
    kv = kv_pb2.KeyValue(key=b"/bench/r", value=b"x" * 128, create_revision=2, mod_revision=2, version=1)
    return {
        "Put": rpc_pb2.PutResponse(header=header).SerializeToString(),
        "Range": rpc_pb2.RangeResponse(header=header, kvs=[kv], count=1).SerializeToString(),
    }


def handlers() -> grpc.GenericRpcHandler:
    answers = canned()

    def unary(answer: bytes) -> grpc.RpcMethodHandler:
        async def handle(_request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
            return answer

        # No (de)serializers: the request stays bytes, the answer is sent as it is.
        return grpc.unary_unary_rpc_method_handler(handle)

    return grpc.method_handlers_generic_handler(SERVICE, {name: unary(a) for name, a in answers.items()})


async def serve(host: str, port: int) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((handlers(),))
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
