"""The quota's decision (etcd's Available: live bytes + request + overhead < quota) is the same
whether the store's size is counted or bounded: a store far below its quota skips the count, one
near it counts, and a write that would pass the quota is refused either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from authstore.api.quota import OVERHEAD, Quota, live_bytes
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb


async def _never(_data: bytes) -> Any:
    raise AssertionError("no proposal expected")


@pytest.mark.parametrize("slack", [-4096, -1, 0, 1, 4096, 1 << 20, 1 << 30])
def test_available_decides_from_the_live_size(tmp_path: Path, slack: int) -> None:
    backend = Backend(tmp_path / "s", map_size=64 << 20)
    try:
        applier = Applier(backend, member_id=1)
        with applier.env.begin(write=True) as txn:
            for i in range(300):
                applier.kv.put(txn, pb.PutRequest(key=b"k%d" % i, value=b"v" * 500))
        size = live_bytes(applier.env)
        put = ipb.InternalRaftRequest(put=pb.PutRequest(key=b"x", value=b"y"))
        quota = Quota(applier, size + 100 + OVERHEAD + slack, 1, _never, lambda: 1)
        assert quota.available(put, 100) is (slack > 0)
        assert quota.available(ipb.InternalRaftRequest(delete_range=pb.DeleteRangeRequest(key=b"x")), 100)
    finally:
        backend.close()
