"""A watch stream through the proxy survives kill -9 of the store leader: every revision of the
watched prefix arrives once, in order, with no gap, while a writer keeps writing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest

from tests.support.cluster import local_cluster
from tests.support.put_load import put_until
from tests.support.wclient import WatchStream

pytestmark = pytest.mark.slow


def test_watch_order_across_leader_kill(tmp_path: Path) -> None:
    with local_cluster(tmp_path, nodes=3) as cluster:
        target = cluster.endpoint

        acked: list[int] = []
        stop = asyncio.Event()

        async def main() -> tuple[list[int], int]:
            async with grpc.aio.insecure_channel(target) as ch:
                ws = WatchStream(ch)
                created = await ws.create(b"w/", range_end=b"w0")
                start = created.header.revision + 1
                t = asyncio.get_running_loop().create_task(put_until(ch, stop, b"w/", 7, acked))
                revs: list[int] = []

                async def collect(n: int) -> None:
                    goal = len(revs) + n
                    while len(revs) < goal:
                        resp = await ws.recv(timeout=30)
                        assert not resp.canceled, resp
                        revs.extend(e.kv.mod_revision for e in resp.events)

                await collect(30)
                for _ in range(2):
                    leader = await asyncio.to_thread(cluster.leader)
                    await asyncio.to_thread(cluster.kill, leader)
                    await collect(40)
                    await asyncio.to_thread(cluster.restart, leader)
                stop.set()
                await asyncio.wait_for(t, 10)
                last = max(acked)
                while not revs or revs[-1] < last:
                    await collect(1)
                ws.close()
                return revs, start

        revs, start = asyncio.run(main())
        # one put per revision: the watch saw every revision from its start, once, in order
        assert revs == list(range(start, revs[-1] + 1))
        assert set(acked) <= set(revs)
