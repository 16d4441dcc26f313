"""A store leader that stops answering without its connections closing (SIGSTOP: a hung
process, as a node whose host froze): a new leader is elected, and every client Watch stream
whose sub-streams ride the paused node's shared stream resumes on the new leader, with no gap."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.cluster import local_cluster

pytestmark = pytest.mark.slow


def test_watches_on_a_paused_leader_resume_on_the_new_one(tmp_path: Path) -> None:
    with local_cluster(tmp_path, nodes=3) as cluster:
        async def main() -> None:
            async with grpc.aio.insecure_channel(cluster.endpoint) as ch:
                kv = pbg.KVStub(ch)
                first = (await kv.Put(pb.PutRequest(key=b"p/0", value=b"0"), timeout=10)).header.revision
                calls = [pbg.WatchStub(ch).Watch() for _ in range(3)]
                for call in calls:
                    await call.write(pb.WatchRequest(create_request=pb.WatchCreateRequest(
                        key=b"p/", range_end=b"p0", start_revision=first + 1)))
                    assert (await call.read()).created
                leader = await asyncio.to_thread(cluster.leader)
                assert leader.foreign_pid is not None
                os.kill(leader.foreign_pid, signal.SIGSTOP)
                try:
                    await asyncio.to_thread(cluster.leader, 60.0, cluster.followers(leader))
                    rev = 0
                    async with asyncio.timeout(60):
                        while not rev:
                            try:
                                rev = (await kv.Put(pb.PutRequest(key=b"p/1", value=b"1"), timeout=5)).header.revision
                            except grpc.aio.AioRpcError:
                                await asyncio.sleep(0.2)  # the next attempt of a bounded retry loop
                    for call in calls:
                        async with asyncio.timeout(30):
                            got: list[int] = []
                            while not got or got[-1] < rev:
                                resp = await call.read()
                                assert not resp.canceled, resp
                                got.extend(e.kv.mod_revision for e in resp.events)
                        assert got == list(range(first + 1, rev + 1))
                finally:
                    os.kill(leader.foreign_pid, signal.SIGKILL)
                for call in calls:
                    call.cancel()

        asyncio.run(main())
