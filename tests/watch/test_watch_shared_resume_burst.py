"""A client Watch stream with many watches (within the store's per-stream caps) resumes across
kill -9 of the leader of 3 nodes: the proxy re-creates all of them at once on a sub-stream of the
new leader's shared stream, megabytes of requests that the sub-stream's watch serving takes one
create at a time. The store's bound of one sub-stream's unread requests (1 MiB) ended the
sub-stream with `too many requests` every time, and after RESUME_DEADLINE the client's stream."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.cluster import local_cluster

pytestmark = pytest.mark.slow
WATCHES = 9_900  # under --max-watches-per-stream (10,000)
KEY = b"k" * 400  # 4 MB of keys in all, under the per-stream bound (16 MiB)


def _key(i: int) -> bytes:
    return b"b/%05d/" % i + KEY


def test_a_stream_with_many_watches_resumes_across_a_leader_kill(tmp_path: Path) -> None:
    with local_cluster(tmp_path, nodes=3) as cluster:
        async def main() -> None:
            async with grpc.aio.insecure_channel(cluster.endpoint) as ch:
                kv = pbg.KVStub(ch)
                call = pbg.WatchStub(ch).Watch()
                for i in range(WATCHES):
                    await call.write(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=_key(i))))
                for _ in range(WATCHES):
                    created = await call.read()
                    assert created.created and not created.canceled, created
                leader = await asyncio.to_thread(cluster.leader)
                await asyncio.to_thread(cluster.kill, leader)
                rev = 0
                async with asyncio.timeout(60):
                    while not rev:
                        try:
                            rev = (await kv.Put(pb.PutRequest(key=_key(WATCHES - 1), value=b"v"), timeout=5)
                                   ).header.revision
                        except grpc.aio.AioRpcError:
                            await asyncio.sleep(0.2)  # the next attempt of a bounded retry loop
                async with asyncio.timeout(60):
                    resp = await call.read()
                assert not resp.canceled and [e.kv.mod_revision for e in resp.events] == [rev], resp
                assert resp.watch_id == WATCHES - 1
                call.cancel()

        asyncio.run(main())
