"""A write is answered once its batch is decided, before the store's own commit and fsync.

The entry is durable in the log before it is applied, and apply is deterministic, so the results
of an executed batch are final: a crash before the LMDB commit replays the batch to the same
results. The node answers its callers from there (``StateMachine.on_decided`` -> ``RaftNode.decided``)
instead of after the commit's fsync, so a lone Put waits for one fsync (the log's), as in etcd.
What answers from the local state instead of the log (serializable reads, maintenance) first
waits for every answered batch to be applied (``RaftNode.settled``): it never misses a write
whose answer is out.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from authstore.api.proposer import Proposer
from authstore.node.driver import RaftNode
from authstore.raft.storage import MemoryStorage
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from tests.support.node_ports import NoPeers, NoWAL


def _no_exit() -> Any:
    raise AssertionError("the node failed (see the log)")


def test_a_put_is_answered_before_its_commit_and_local_reads_wait_for_it(tmp_path: Path) -> None:
    backend = Backend(tmp_path / "db", map_size=64 << 20)
    applier = Applier(backend, member_id=1)
    node = RaftNode(1, MemoryStorage.with_conf([1]), NoWAL(), applier, NoPeers(),  # type: ignore[arg-type]
                    applied=0, snapshot_dir=tmp_path / "snap", fail_stop=_no_exit)
    commit_may_go = threading.Event()
    holding = threading.Event()

    def hold_commit(index: int, results: list[tuple[int, Any]], _membership_changed: bool) -> None:
        if any(isinstance(r, pb.PutResponse) for _, r in results):
            holding.set()
            assert commit_may_go.wait(30), "the test never let the commit go"

    applier.on_decided(hold_commit)  # the commit (and its fsync) of the Put's batch takes long

    def committed_value() -> bytes | None:
        with applier.env.begin() as txn:
            kv = applier.kv.get(txn, b"k")
        return kv.value if kv is not None else None

    async def scenario() -> None:
        node.start()
        try:
            put = ipb.InternalRaftRequest(put=pb.PutRequest(key=b"k", value=b"v"))
            resp = await asyncio.wait_for(Proposer(node).propose(put.SerializeToString()), 30)
            assert isinstance(resp, pb.PutResponse) and resp.header.revision == 2
            assert await asyncio.to_thread(holding.wait, 30)
            assert committed_value() is None  # answered; its batch is not committed yet
            settled = asyncio.get_running_loop().create_task(node.settled())
            for _ in range(20):
                await asyncio.sleep(0)  # turns of the loop, no time: the commit is held
            assert not settled.done()  # a local read waits for the answered batch
            commit_may_go.set()
            await asyncio.wait_for(settled, 30)
            assert committed_value() == b"v"
            await asyncio.wait_for(node.settled(), 30)  # nothing pending: returns at once
        finally:
            commit_may_go.set()
            await node.stop()

    try:
        asyncio.run(scenario())
    finally:
        backend.close()
