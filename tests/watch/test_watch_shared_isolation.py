"""Client Watch streams sharing one store stream (proxy/watch_link.py) stay isolated, with real
processes: one client that stops reading while heavy traffic goes on neither delays nor loses
another client's events; its own sub-stream is closed (it held too much) and its watches resumed
from the store's history once it reads again: every client gets every event once, in order. The
store's per-user cap is exactly the watches open (auth off: one user), so the resume fits only if
the closed sub-stream's watches are gone at the store before the new one's are made."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.memory import value
from tests.support.probes import sample, scrape
from tests.support.processes import free_port, proxy_program, store_program, wait_serving
from tests.support.wclient import next_events

PUTS = 120
FAST = 20
SLOW_CLOSES = "raftgate_proxy_watch_slow_closes_total"


def test_a_stalled_client_neither_delays_nor_loses_the_others(tmp_path: Path) -> None:
    store, internal = store_program(tmp_path, "--snapshot-count", "50", "--snapshot-catchup-entries", "10",
                                    "--max-watches-per-user", str(FAST + 1))
    port, metrics = free_port(), f"127.0.0.1:{free_port()}"
    proxy = proxy_program(tmp_path, internal, f"http://127.0.0.1:{port}", "--metrics-addr", metrics)
    endpoint = f"127.0.0.1:{port}"
    with store, proxy:
        wait_serving(endpoint)

        async def scenario() -> None:
            opts = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 << 20)]
            async with grpc.aio.insecure_channel(endpoint, options=opts) as sch, \
                    grpc.aio.insecure_channel(endpoint, options=opts) as fch, \
                    grpc.aio.insecure_channel(endpoint, options=opts) as kch:
                create = pb.WatchRequest(create_request=pb.WatchCreateRequest(
                    key=b"big/", range_end=b"big0", prev_kv=True))
                stalled = pbg.WatchStub(sch).Watch()
                await stalled.write(create)
                assert (await stalled.read()).created
                fast = [pbg.WatchStub(fch).Watch() for _ in range(FAST)]
                for call in fast:
                    await call.write(create)
                    assert (await call.read()).created
                readers = [asyncio.ensure_future(next_events(call, PUTS)) for call in fast]
                kv = pbg.KVStub(kch)
                revs = [(await kv.Put(pb.PutRequest(key=b"big/k", value=value(i)))).header.revision
                        for i in range(PUTS)]
                want = list(range(revs[0], revs[-1] + 1))
                for got in await asyncio.gather(*readers):
                    assert [e.kv.mod_revision for e in got] == want
                    assert [e.prev_kv.value[:8] for e in got[1:]] == [b"%08d" % i for i in range(PUTS - 1)]
                assert sample(scrape(metrics), SLOW_CLOSES) >= 1  # the stalled one was closed
                got = await next_events(stalled, PUTS)
                assert [e.kv.mod_revision for e in got] == want
                assert [e.kv.value[:8] for e in got] == [b"%08d" % i for i in range(PUTS)]
                assert [e.prev_kv.value[:8] for e in got[1:]] == [b"%08d" % i for i in range(PUTS - 1)]
                # nothing more (no duplicate after the resume): a put after is the next event
                rev = (await kv.Put(pb.PutRequest(key=b"big/k", value=b"last"))).header.revision
                for call in [stalled, *fast]:
                    nxt = await next_events(call, 1)
                    assert [e.kv.mod_revision for e in nxt] == [rev]
                for call in [stalled, *fast]:
                    call.cancel()

        asyncio.run(scenario())
