"""Trust item 8: a watcher that never reads does not grow the proxy (or the store) without bound.

One client opens a watch with prev_kv and then stops reading; 600 puts of 100 KiB follow (about
120 MiB of events). The proxy buffers a bounded number of bytes per stream and then stops reading
from the store; the store buffers a bounded number of bytes per stream and then stops sending
that watcher live events, catching it up from MVCC history once its stream drains (etcd's
unsynced watchers). Memory is read from /proc/<pid>/status. When the client reads again it gets
every event, in order, each with its prev_kv: nothing lost, nothing twice.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.memory import memory_kib, value
from tests.support.processes import free_port, proxy_program, store_program, wait_serving
from tests.support.wclient import next_events

pytestmark = pytest.mark.slow

PUTS = 600
#: Growth allowed over the idle baseline: the stream's byte bound and gRPC's flow-control windows,
#: with room to spare; unbounded buffering grows by the ~120 MiB the puts carry.
PROXY_MARGIN_MIB = 40
STORE_MARGIN_MIB = 40


def test_a_watcher_that_never_reads_grows_nothing_and_misses_nothing(tmp_path: Path) -> None:
    # Raft keeps recent entries in memory until a snapshot: snapshot often, so the store's memory
    # shows what it holds for watchers, not its log of 100 KiB puts.
    store, internal = store_program(tmp_path, "--snapshot-count", "50", "--snapshot-catchup-entries", "10")
    port = free_port()
    proxy = proxy_program(tmp_path, internal, f"http://127.0.0.1:{port}")
    endpoint = f"127.0.0.1:{port}"
    with store, proxy:
        wait_serving(endpoint)
        assert proxy.proc is not None and store.proc is not None
        proxy_pid, store_pid = proxy.proc.pid, store.proc.pid

        async def scenario() -> tuple[dict[str, int], list[pb.Event]]:
            # Separate connections: the stalled stream must not share flow control with the puts.
            opts = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 << 20)]
            async with grpc.aio.insecure_channel(endpoint, options=opts) as wch, \
                    grpc.aio.insecure_channel(endpoint, options=opts) as kch:
                kv = pbg.KVStub(kch)
                for i in range(20):  # warm both programs up: code paths, pools, a reading watch
                    await kv.Put(pb.PutRequest(key=b"warm/%d" % i, value=value(i)))
                warm = pbg.WatchStub(wch).Watch()
                await warm.write(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"warm/",
                                                                                      range_end=b"warm0")))
                assert (await warm.read()).created
                warm.cancel()
                mem = {"proxy0": memory_kib(proxy_pid, "VmRSS"), "store0": memory_kib(store_pid, "RssAnon")}
                call = pbg.WatchStub(wch).Watch()
                await call.write(pb.WatchRequest(create_request=pb.WatchCreateRequest(
                    key=b"big/", range_end=b"big0", prev_kv=True)))
                created = await call.read()
                assert created.created and not created.canceled
                # ... and the client reads nothing more while the puts go on.
                revs = []
                for i in range(PUTS):
                    revs.append((await kv.Put(pb.PutRequest(key=b"big/k", value=value(i)))).header.revision)
                    if i % 50 == 49:
                        mem["proxy"] = max(mem.get("proxy", 0), memory_kib(proxy_pid, "VmRSS"))
                        mem["store"] = max(mem.get("store", 0), memory_kib(store_pid, "RssAnon"))
                # The puts are done; let the programs settle on what they hold for the stalled stream.
                await kv.Range(pb.RangeRequest(key=b"big/k"))
                mem["proxy"] = max(mem["proxy"], memory_kib(proxy_pid, "VmRSS"))
                mem["store"] = max(mem["store"], memory_kib(store_pid, "RssAnon"))
                got = await next_events(call, PUTS, timeout=300)
                call.cancel()
                mem["revs0"], mem["revs-1"] = revs[0], revs[-1]
                return mem, got

        mem, events = asyncio.run(scenario())
    proxy_growth = (mem["proxy"] - mem["proxy0"]) // 1024
    store_growth = (mem["store"] - mem["store0"]) // 1024
    print(f"proxy VmRSS {mem['proxy0'] // 1024} -> {mem['proxy'] // 1024} MiB, "
          f"store RssAnon {mem['store0'] // 1024} -> {mem['store'] // 1024} MiB")
    assert proxy_growth <= PROXY_MARGIN_MIB, f"proxy grew by {proxy_growth} MiB"
    assert store_growth <= STORE_MARGIN_MIB, f"store grew by {store_growth} MiB"
    assert [ev.kv.mod_revision for ev in events] == list(range(mem["revs0"], mem["revs-1"] + 1))
    assert [ev.kv.value[:8] for ev in events] == [b"%08d" % i for i in range(PUTS)]
    assert [ev.prev_kv.value[:8] for ev in events[1:]] == [b"%08d" % i for i in range(PUTS - 1)]
