"""A store's Applier and WatchHub in one process, applying batches as the apply thread does (watch hub tests)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from authstore.api.watch.hub import Stream, WatchHub
from authstore.raft.types import Entry
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from protos.storepb import store_pb2 as spb


class _Node:
    is_leader = True

    async def between_batches(self, fn: Any, *args: Any) -> Any:
        return fn(*args)


class World:
    def __init__(self, path: Path, **hub_kw: Any) -> None:
        self.applier = Applier(Backend(path), member_id=1)
        self.hub = WatchHub(self.applier, _Node(), progress_interval=0, **hub_kw)
        self.applier.subscribe_entries(self.hub.tap)
        self.index = itertools.count(1)

    def put(self, *keys: bytes, value: bytes = b"v") -> None:
        self.apply(*(ipb.InternalRaftRequest(put=pb.PutRequest(key=key, value=value)) for key in keys))

    def apply(self, *reqs: ipb.InternalRaftRequest) -> None:
        """One batch, then the event loop's drain."""
        entries = []
        for req in reqs:
            req.ID = next(self.index)
            entries.append(Entry(term=1, index=req.ID, data=req.SerializeToString()))
        self.applier.apply_batch(entries)
        self.hub.applied()

    async def create(self, stream: Stream, key: bytes, end: bytes = b"", *, user: str = "",
                     resume: bool = False, watch_id: int = 0) -> pb.WatchResponse | None:
        """Creates through the hub's own path; the `created` answer (None for a resume)."""
        await self.hub._create(stream, spb.WatchStreamRequest(
            header=ipb.RequestHeader(username=user), current_revision=True, resume=resume,
            request=pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key, range_end=end,
                                                                         watch_id=watch_id))))
        if resume:
            return None
        return pb.WatchResponse.FromString(stream.queue.get_nowait())

    def close(self) -> None:
        self.hub.close()
        self.applier.env.close()
