"""Many client Watch streams, sub-streams of one shared store stream, through kill -9 of the
leader of a 3-node cluster while other client streams open and close: every stream resumes with
its watch ids, every revision once, in order; the proxy's sub-stream gauge is back to the client
streams open."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.cluster import unstarted_cluster
from tests.support.probes import wait_for_sample
from tests.support.processes import Program, free_port
from tests.support.put_load import put_until

pytestmark = pytest.mark.slow
STREAMS = 24
SUBS = "raftgate_proxy_watch_substreams"


def test_many_sub_streams_survive_leader_kill_with_churn(tmp_path: Path) -> None:
    cluster = unstarted_cluster(tmp_path)
    metrics = f"127.0.0.1:{free_port()}"
    proxy = Program(tmp_path / "proxy",
                    ["proxy", "--listen-client-urls", f"http://{cluster.endpoint}",
                     "--store-endpoints", ",".join(n.internal for n in cluster.nodes),
                     "--internal-secret-file", str(tmp_path / "internal-secret"), "--bcrypt-cost", "4",
                     "--metrics-addr", metrics], "raftgate proxy:")
    cluster.extra_programs.append(proxy)
    try:
        starts = [threading.Thread(target=cluster.restart, args=(n,)) for n in cluster.nodes]
        for t in [*starts]:
            t.start()
        proxy.start()
        for t in starts:
            t.join()

        async def scenario() -> None:
            opts = [("grpc.use_local_subchannel_pool", 1)]
            async with grpc.aio.insecure_channel(cluster.endpoint, options=opts) as ch, \
                    grpc.aio.insecure_channel(cluster.endpoint, options=opts) as kch:
                kv = pbg.KVStub(kch)
                first = None
                while first is None:
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        first = (await kv.Put(pb.PutRequest(key=b"c/0", value=b"0"), timeout=5)).header.revision
                calls = [pbg.WatchStub(ch).Watch() for _ in range(STREAMS)]
                start = first + 1
                for i, call in enumerate(calls):
                    await call.write(pb.WatchRequest(create_request=pb.WatchCreateRequest(
                        key=b"c/", range_end=b"c0", start_revision=start, watch_id=100 + i)))
                    created = await call.read()
                    assert created.created and created.watch_id == 100 + i, created
                revs: list[list[int]] = [[] for _ in calls]
                stop = asyncio.Event()
                acked: list[int] = []

                async def reader(i: int) -> None:
                    while True:
                        resp = await calls[i].read()
                        assert not resp.canceled and not resp.created, resp
                        assert resp.watch_id == 100 + i
                        revs[i].extend(e.kv.mod_revision for e in resp.events)

                async def churn() -> None:
                    while not stop.is_set():
                        c = pbg.WatchStub(ch).Watch()
                        try:
                            await c.write(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"c/")))
                            await asyncio.wait_for(c.read(), 0.3)
                        except (TimeoutError, grpc.aio.AioRpcError):
                            pass
                        finally:
                            c.cancel()

                readers = [asyncio.ensure_future(reader(i)) for i in range(STREAMS)]
                tasks = [asyncio.ensure_future(put_until(kch, stop, b"c/", 5, acked)),
                         *(asyncio.ensure_future(churn()) for _ in range(4))]

                async def until(n: int) -> None:
                    async with asyncio.timeout(90):
                        while min(len(r) for r in revs) < n:
                            for t in readers:
                                if t.done():
                                    t.result()
                            await asyncio.sleep(0.05)

                await until(20)
                for _ in range(2):
                    leader = await asyncio.to_thread(cluster.leader)
                    await asyncio.to_thread(cluster.kill, leader)
                    await until(min(len(r) for r in revs) + 30)
                    await asyncio.to_thread(cluster.restart, leader)
                stop.set()
                await asyncio.gather(*tasks)
                last = max(acked)
                async with asyncio.timeout(60):
                    while min(r[-1] if r else 0 for r in revs) < last:
                        for t in readers:
                            if t.done():
                                t.result()
                        await asyncio.sleep(0.05)
                for r in revs:
                    assert r == list(range(start, r[-1] + 1))
                await asyncio.to_thread(wait_for_sample, metrics, SUBS, STREAMS, 30,
                                        "the sub-stream gauge to be back to the streams open")
                for t in readers:
                    t.cancel()
                for c in calls:
                    c.cancel()
            await asyncio.to_thread(wait_for_sample, metrics, SUBS, 0, 30,
                                    "the sub-stream gauge to be back to 0")

        asyncio.run(scenario())
    finally:
        cluster.close(background=True)
