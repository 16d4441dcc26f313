"""A node never answers a read with older permissions than the proxy saw (issue 13, reads on every
node): a serializable read stamped with an auth revision the node has not applied yet (a
follower behind the node that resolved the caller's token) first catches up to a read point."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import lmdb

from authstore.api.server import StoreService
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2


class _Auth:
    def __init__(self) -> None:
        self.rev = 2

    def revision(self, _txn: lmdb.Transaction) -> int:
        return self.rev


class _Applier:
    """What the read path uses: the environment, the auth revision, and execute (which records
    the auth revision the read was authorized at)."""

    def __init__(self, env: lmdb.Environment) -> None:
        self.env = env
        self.auth = _Auth()
        self.read_at: list[int] = []

    def execute(self, _txn: lmdb.Transaction, _req: ipb.InternalRaftRequest, *, index: int, read: bool,
                kind: str | None = None) -> Any:
        self.read_at.append(self.auth.rev)
        return rpc_pb2.RangeResponse()


class _Node:
    """A follower whose next read point holds auth revision 3 (applied once it is waited for)."""

    def __init__(self, applier: _Applier) -> None:
        self.applier = applier
        self.read_points = 0

    async def read_index(self) -> int:
        self.read_points += 1
        return 7

    async def wait_applied(self, index: int) -> None:
        self.applier.auth.rev = 3

    async def settled(self) -> None:
        """Every answered write is committed (nothing pending here)."""


def _service(tmp_path: Path) -> tuple[StoreService, _Applier, _Node]:
    env = lmdb.open(str(tmp_path / "db"), max_dbs=2, map_size=1 << 20)
    applier = _Applier(env)
    node = _Node(applier)
    service = StoreService.__new__(StoreService)  # the read path alone: no hub, quota or tokens
    service.applier = applier  # type: ignore[assignment]
    service.node = node  # type: ignore[assignment]
    return service, applier, node


def _serializable_range(auth_revision: int) -> ipb.InternalRaftRequest:
    return ipb.InternalRaftRequest(header=ipb.RequestHeader(username="alice", auth_revision=auth_revision),
                                   range=rpc_pb2.RangeRequest(key=b"k", serializable=True))


def test_a_serializable_read_stamped_ahead_of_the_node_waits_for_that_revision(tmp_path: Path) -> None:
    service, applier, node = _service(tmp_path)
    req = _serializable_range(3)
    asyncio.run(service._dispatch(req, "range", req.SerializeToString()))
    assert applier.read_at == [3]  # authorized at the revision the proxy saw, never at 2
    assert node.read_points == 1


def test_a_serializable_read_the_node_is_current_for_stays_local(tmp_path: Path) -> None:
    service, applier, node = _service(tmp_path)
    req = _serializable_range(2)
    asyncio.run(service._dispatch(req, "range", req.SerializeToString()))
    assert applier.read_at == [2] and node.read_points == 0  # no ReadIndex round: as etcd
