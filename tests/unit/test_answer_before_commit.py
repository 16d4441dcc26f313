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
from pathlib import Path

from authstore.api.proposer import Proposer
from authstore.node.driver import RaftNode
from authstore.state.apply import Applier
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from tests.support.held_commit import CommitHold, loop_turns, run_single_node


def test_a_put_is_answered_before_its_commit_and_local_reads_wait_for_it(tmp_path: Path) -> None:
    async def scenario(applier: Applier, node: RaftNode, hold: CommitHold) -> None:
        def committed_value() -> bytes | None:
            with applier.env.begin() as txn:
                kv = applier.kv.get(txn, b"k")
            return kv.value if kv is not None else None

        put = ipb.InternalRaftRequest(put=pb.PutRequest(key=b"k", value=b"v"))
        resp = await asyncio.wait_for(Proposer(node).propose(put.SerializeToString()), 30)
        assert isinstance(resp, pb.PutResponse) and resp.header.revision == 2
        await hold.held()
        assert committed_value() is None  # answered; its batch is not committed yet
        settled = asyncio.get_running_loop().create_task(node.settled())
        await loop_turns()  # the commit is held
        assert not settled.done()  # a local read waits for the answered batch
        hold.release()
        await asyncio.wait_for(settled, 30)
        assert committed_value() == b"v"
        await asyncio.wait_for(node.settled(), 30)  # nothing pending: returns at once

    # the commit (and its fsync) of the Put's batch takes long
    run_single_node(tmp_path, lambda results: any(isinstance(r, pb.PutResponse) for _, r in results), scenario)
