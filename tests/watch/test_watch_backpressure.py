"""Trust item 8 in the store: a stream's queue is bounded in bytes; a watcher whose events do not
fit falls back to history (etcd's unsynced watchers) and is caught up once its reader takes what
is queued; if what it still needs is compacted meanwhile, it gets etcd's compacted cancel."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from authstore.api.watch.hub import Stream
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from tests.support.watch_world import World

LIMIT = 3000


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    wd = World(tmp_path / "store")
    yield wd
    wd.close()


def value(i: int) -> bytes:
    return b"%04d" % i + b"x" * 996


async def take(stream: Stream) -> pb.WatchResponse:
    """What the stream's writer does: take one response off the queue."""
    async with asyncio.timeout(10):
        item = await stream.queue.get()
    assert isinstance(item, bytes), item
    return pb.WatchResponse.FromString(item)


def test_a_watcher_over_the_bound_is_caught_up_from_history(world: World) -> None:

    async def scenario() -> None:
        s = Stream(limit=LIMIT)
        await world.create(s, b"k/", b"k0")  # its `created` answer is taken off the queue
        first = world.hub.rev + 1
        for i in range(20):  # 20 KB of events for a reader that takes nothing
            world.put(b"k/a", value=value(i))
            assert s.queue.bytes <= LIMIT + 1100, s.queue.bytes  # the bound and at most one more response
        w = s.watchers[0]
        assert not w.synced  # fell behind: its events stay in history, not in memory
        events: list[Any] = []
        while len(events) < 20:
            resp = await take(s)
            assert not resp.canceled, resp
            events += resp.events
            assert s.queue.bytes <= LIMIT + 1100
        assert [e.kv.mod_revision for e in events] == list(range(first, first + 20))
        assert [e.kv.value[:4] for e in events] == [b"%04d" % i for i in range(20)]
        async with asyncio.timeout(10):
            while not w.synced:  # caught up: back with the synced watchers
                await asyncio.sleep(0)
        world.put(b"k/a", value=value(20))
        assert [e.kv.value[:4] for e in (await take(s)).events] == [b"0020"]

    asyncio.run(scenario())


def test_a_watcher_behind_a_compaction_gets_the_compacted_cancel(world: World) -> None:

    async def scenario() -> None:
        s = Stream(limit=LIMIT)
        await world.create(s, b"k/", b"k0")  # its `created` answer is taken off the queue
        for i in range(20):
            world.put(b"k/a", value=value(i))
        assert not s.watchers[0].synced
        last = world.hub.rev
        world.apply(ipb.InternalRaftRequest(compaction=pb.CompactionRequest(revision=last)))
        got = [await take(s)]
        while not got[-1].canceled:
            got.append(await take(s))
        end = got[-1]
        assert (end.watch_id, end.canceled, end.compact_revision) == (0, True, last)
        seen = [e.kv.mod_revision for r in got for e in r.events]
        assert seen == list(range(seen[0], seen[0] + len(seen))) and seen[-1] < last  # in order, then the cancel
        assert not s.watchers

    asyncio.run(scenario())
