"""The per-stream bound holds with many stalled streams: the proxy holds about its 4 MiB each.

One stalled stream grows the proxy by about 10 MiB (test_watch_memory), but the bound it stands on
- the proxy stops reading the store stream once 4 MiB are untaken - leaks through gRPC's flow
control when many streams stall: with BDP probing the proxy's receive window toward the store
grows to many MiB per stream, and the store fills it. 40 stalled streams grew the proxy by 820 MiB
(about 20 MiB each) while the store held about 5 MiB each. Here 16 streams that never read watch a
prefix with prev_kv while 200 puts of 100 KiB go on; the proxy may grow by its 4 MiB per stream,
the 1 MiB inbox of the stream's share of the shared store stream and some room, not by what the
store would push.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from proxy.watch import CLIENT_BUFFER_BYTES
from proxy.watch_link import INBOX_BYTES
from tests.support.memory import memory_kib, value
from tests.support.processes import free_port, proxy_program, store_program, wait_serving

pytestmark = pytest.mark.slow

STREAMS = 16
CONNECTIONS = 4
PUTS = 200
#: the proxy's untaken answers (4 MiB), its sub-stream's inbox on the shared store stream (1 MiB:
#: it took the place of a flow-control window of the stream's own), and the allocator's share: at
#: the peak the two buffers held 5.1 MiB a stream while the proxy had grown by 7.3-8.2 MiB a stream
#: over ten runs (the unbounded proxy grew by about 20 MiB a stream)
PER_STREAM_MIB = (CLIENT_BUFFER_BYTES + INBOX_BYTES >> 20) + 3
ROOM_MIB = 30  # the shared stream's window, and what the proxy's RSS moves by anyway


def test_many_stalled_watch_streams_hold_their_bound_each(tmp_path: Path) -> None:
    store, internal = store_program(tmp_path, "--snapshot-count", "50", "--snapshot-catchup-entries", "10")
    port = free_port()
    proxy = proxy_program(tmp_path, internal, f"http://127.0.0.1:{port}")
    endpoint = f"127.0.0.1:{port}"
    with store, proxy:
        wait_serving(endpoint)
        assert proxy.proc is not None
        proxy_pid = proxy.proc.pid

        async def scenario() -> tuple[int, int]:
            opts = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 << 20)]
            channels = [grpc.aio.insecure_channel(endpoint, options=opts) for _ in range(CONNECTIONS + 1)]
            try:
                kv = pbg.KVStub(channels[-1])
                for i in range(20):  # warm up: code paths, pools, one reading watch
                    await kv.Put(pb.PutRequest(key=b"warm/%d" % i, value=value(i)))
                warm = pbg.WatchStub(channels[0]).Watch()
                await warm.write(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"warm/",
                                                                                      range_end=b"warm0")))
                assert (await warm.read()).created
                warm.cancel()
                before = memory_kib(proxy_pid, "VmRSS")
                calls = []
                for n in range(STREAMS):
                    call = pbg.WatchStub(channels[n % CONNECTIONS]).Watch()
                    await call.write(pb.WatchRequest(create_request=pb.WatchCreateRequest(
                        key=b"big/", range_end=b"big0", prev_kv=True)))
                    assert (await call.read()).created
                    calls.append(call)
                peak = before
                for i in range(PUTS):  # nobody reads the watches meanwhile
                    await kv.Put(pb.PutRequest(key=b"big/k", value=value(i)))
                    if i % 20 == 19:
                        peak = max(peak, memory_kib(proxy_pid, "VmRSS"))
                await kv.Range(pb.RangeRequest(key=b"big/k"))
                peak = max(peak, memory_kib(proxy_pid, "VmRSS"))
                for call in calls:
                    call.cancel()
                return before, peak
            finally:
                for ch in channels:
                    await ch.close()

        before, peak = asyncio.run(scenario())
    growth = (peak - before) // 1024
    print(f"proxy VmRSS {before // 1024} -> {peak // 1024} MiB with {STREAMS} stalled streams")
    assert growth <= STREAMS * PER_STREAM_MIB + ROOM_MIB, f"proxy grew by {growth} MiB"
