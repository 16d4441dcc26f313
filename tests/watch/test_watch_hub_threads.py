"""Trust item 12: the watch hub under a real apply thread.

The driver runs watch creates on the apply thread (``between_batches``) while the event loop
delivers the previous batch's events. A hub whose state two threads change at once breaks with
"dictionary changed size during iteration", which reaches the driver and stops the store. The
unit tests' stand-in node runs creates inline, so only a real second thread can show it.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from authstore.api.watch.hub import Stream, WatchHub
from authstore.raft.types import Entry
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from protos.storepb import store_pb2 as spb

ROUNDS = 150
CREATES_PER_ROUND = 20


class _ThreadedNode:
    """The driver's threading: batches and `between_batches` on one real apply thread, `applied`
    on the event loop right after each batch."""

    is_leader = True

    def __init__(self, applier: Applier) -> None:
        self.applier = applier
        self.apply_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="apply")
        self._applied: list[Any] = []
        self.index = itertools.count(1)

    async def between_batches(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.apply_thread, fn, *args)

    async def apply(self, key: bytes) -> None:
        idx = next(self.index)
        req = ipb.InternalRaftRequest(ID=idx, header=ipb.RequestHeader(), put=pb.PutRequest(key=key, value=b"v"))
        entries = [Entry(term=1, index=idx, data=req.SerializeToString())]
        await asyncio.get_running_loop().run_in_executor(self.apply_thread, self.applier.apply_batch, entries)
        for fn in self._applied:
            fn()

    def on_applied(self, fn: Any) -> None:
        self._applied.append(fn)


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Threads switch often, so the two threads interleave within one pass over the watchers."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def create(key: bytes) -> spb.WatchStreamRequest:
    return spb.WatchStreamRequest(header=ipb.RequestHeader(), current_revision=True,
                                  request=pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key)))


def test_creates_on_the_apply_thread_while_the_loop_delivers(tmp_path: Path, fast_switching: None) -> None:
    applier = Applier(Backend(tmp_path / "store"), member_id=1)
    node = _ThreadedNode(applier)
    hub = WatchHub(applier, node, progress_interval=0)
    applier.subscribe_entries(hub.tap)
    errors: list[BaseException] = []

    def applied() -> None:
        try:
            hub.applied()
        except BaseException as exc:  # noqa: BLE001 - what the driver would die of
            errors.append(exc)

    node.on_applied(applied)

    async def scenario() -> Stream:
        stream = Stream()
        await hub._create(stream, create(b"k"))  # the watch that must see every put
        for r in range(ROUNDS):
            batch = asyncio.ensure_future(node.apply(b"k"))
            await asyncio.sleep(0)  # the batch goes to the apply thread first ...
            creates = [asyncio.ensure_future(hub._create(stream, create(b"other/%d/%d" % (r, i))))
                       for i in range(CREATES_PER_ROUND)]
            await asyncio.sleep(0)  # ... then the creates, which run there while the loop delivers
            await asyncio.gather(batch, *creates)
            if errors:
                break
        return stream

    try:
        stream = asyncio.run(scenario())
    finally:
        hub.close()
        node.apply_thread.shutdown(wait=True)
        applier.env.close()
    assert errors == []
    seen = []
    while not stream.queue.empty():
        item = stream.queue.get_nowait()
        assert isinstance(item, bytes), item
        resp = pb.WatchResponse.FromString(item)
        seen += [ev.kv.mod_revision for ev in resp.events if resp.watch_id == 0]
    assert seen == list(range(2, ROUNDS + 2))  # every put to k, once, in order
