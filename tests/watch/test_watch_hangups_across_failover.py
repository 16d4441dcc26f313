"""Client Watch streams that go away at every moment of a failover leave nothing behind: gRPC
streams canceled 0..2 s after kill -9 of the leader (before, during and after their resume),
streams whose client never reads, streams that send a request over the size limit or one that
does not decode in that window, and the gateway's HTTP watches hung up (FIN or RST) across the
same window. Once every client is gone the proxy's sub-stream gauge and open-streams gauge are 0
and no store node holds a watch.

An attack on the fix in 0d62c4a (a stream ending as its resume's token check answers): passes there
(11 runs of 11, ~15 s each); with ``WatchProxy._identify`` back on ``asyncio.wait_for`` it failed
1 run in 4 (the sub-stream gauge stuck above 0)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import socket
import struct
import threading
from pathlib import Path

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.cluster import Cluster, unstarted_cluster
from tests.support.probes import wait_for_sample
from tests.support.processes import Program, free_port
from tests.support.put_load import put_until

pytestmark = pytest.mark.slow
SUBS = "raftgate_proxy_watch_substreams"
OPEN = "raftgate_proxy_open_streams"
OPEN_WATCHES = "raftgate_store_open_watches"
ROUNDS = 3
GRPC_STREAMS = 24
HTTP_STREAMS = 8
WATCH_METHOD = "/etcdserverpb.Watch/Watch"
HUGE = pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"c/" + b"x" * (1600 << 10))).SerializeToString()
GARBAGE = b"\x0a\xff\xff\xff"  # a create_request field whose length runs past the message


def _http_watch(gateway: tuple[str, int], key: bytes) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that takes little
    sock.settimeout(10)
    sock.connect(gateway)
    body = json.dumps({"create_request": {"key": base64.b64encode(key).decode(),
                                          "range_end": base64.b64encode(b"c0").decode()}}).encode()
    sock.sendall(b"POST /v3/watch HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def _hang_up(sock: socket.socket, reset: bool) -> None:
    if reset:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_hang_ups_at_every_moment_of_a_failover_leave_nothing(tmp_path: Path) -> None:
    cluster = unstarted_cluster(tmp_path)
    node_metrics = {}
    for node in cluster.nodes:
        node_metrics[node.name] = f"127.0.0.1:{free_port()}"
        node.argv += ["--metrics-addr", node_metrics[node.name]]
    metrics = f"127.0.0.1:{free_port()}"
    gateway = ("127.0.0.1", free_port())
    proxy = Program(tmp_path / "proxy",
                    ["proxy", "--listen-client-urls", f"http://{cluster.endpoint}",
                     "--store-endpoints", ",".join(n.internal for n in cluster.nodes),
                     "--internal-secret-file", str(tmp_path / "internal-secret"), "--bcrypt-cost", "4",
                     "--metrics-addr", metrics, "--listen-gateway-urls", f"http://{gateway[0]}:{gateway[1]}"],
                    "raftgate proxy:")
    cluster.extra_programs.append(proxy)
    rng = random.Random(7)
    try:
        starts = [threading.Thread(target=cluster.restart, args=(n,)) for n in cluster.nodes]
        for t in starts:
            t.start()
        proxy.start()
        for t in starts:
            t.join()
        asyncio.run(_scenario(cluster, gateway, rng))
        wait_for_sample(metrics, SUBS, 0, 30, "the sub-stream gauge to be back to 0")
        wait_for_sample(metrics, OPEN, 0, 30, "no Watch stream open in the proxy",
                        service="etcdserverpb.Watch", method="Watch")
        for node in cluster.nodes:
            wait_for_sample(node_metrics[node.name], OPEN_WATCHES, 0, 30, f"no watch open on {node.name}")
    finally:
        cluster.close(background=True)


async def _scenario(cluster: Cluster, gateway: tuple[str, int], rng: random.Random) -> None:
    opts = [("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0)]
    async with grpc.aio.insecure_channel(cluster.endpoint, options=opts) as kch:
        kv = pbg.KVStub(kch)
        async with asyncio.timeout(60):
            while True:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await kv.Put(pb.PutRequest(key=b"c/0", value=b"0"), timeout=5)
                    break
        stop = asyncio.Event()
        load = asyncio.ensure_future(put_until(kch, stop, b"c/", 5, []))
        try:
            for _ in range(ROUNDS):
                await _round(cluster, gateway, rng, opts)
        finally:
            stop.set()
            await load


async def _round(cluster: Cluster, gateway: tuple[str, int], rng: random.Random, opts: list) -> None:
    channels = [grpc.aio.insecure_channel(cluster.endpoint, options=opts) for _ in range(4)]
    calls = []
    readers = []
    for i in range(GRPC_STREAMS):
        ch = channels[i % len(channels)]
        call = ch.stream_stream(WATCH_METHOD)()  # raw bytes both ways
        for w in range(1 + i % 3):
            await call.write(pb.WatchRequest(create_request=pb.WatchCreateRequest(
                key=b"c/", range_end=b"c0", watch_id=10 + w)).SerializeToString())
        if i % 2:
            async def read(call: grpc.aio.StreamStreamCall = call) -> None:
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
                    while True:
                        await call.read()
            readers.append(asyncio.ensure_future(read()))
        calls.append(call)
    socks = await asyncio.gather(*(asyncio.to_thread(_http_watch, gateway, b"c/") for _ in range(HTTP_STREAMS)))
    await asyncio.sleep(0.5)  # the creates are answered (a few may not be: no matter)
    leader = await asyncio.to_thread(cluster.leader)
    await asyncio.to_thread(cluster.kill, leader)
    ends = [(rng.uniform(0, 2.0), "grpc", c) for c in calls] + [(rng.uniform(0, 2.0), "http", s) for s in socks]
    ends.sort(key=lambda e: e[0])
    t0 = asyncio.get_running_loop().time()
    for i, (at, kind, what) in enumerate(ends):
        delay = t0 + at - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)
        if kind == "grpc":
            if i % 5 == 1:  # a last request that ends the stream, sent without waiting for its end
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    await asyncio.wait_for(what.write(HUGE if i % 10 == 1 else GARBAGE), 1)
            else:
                what.cancel()
        else:
            _hang_up(what, reset=bool(i % 2))
    for c in calls:  # (those that sent a last request: ended by the proxy, or here)
        c.cancel()
    for r in readers:
        r.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    for ch in channels:
        await ch.close()
    await asyncio.to_thread(cluster.restart, leader)
