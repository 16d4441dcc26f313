"""On a single node a Put costs one round trip to the log thread: the write of its entry (with
the fsync). The commit index that the next Ready carries alone is written without a hop (and, as
before, without an fsync): a commit index is never a promise, Raft learns it again from the log.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from authstore.node.driver import RaftNode
from authstore.raft import HardState, StateType
from tests.support.node_ports import CountingWorker, Events, FakePeers, FakeStateMachine, RecordingWAL
from tests.support.raft_helpers import storage_with


def test_a_put_on_a_single_node_takes_one_log_thread_round_trip(tmp_path: Path) -> None:
    wal, log_worker = RecordingWAL(), CountingWorker()
    node = RaftNode(1, storage_with([1], []), wal, FakeStateMachine(), FakePeers(Events()),  # type: ignore[arg-type]
                    applied=0, snapshot_dir=tmp_path / "snap", log_worker=log_worker,
                    apply_worker=CountingWorker())

    async def drive() -> None:
        while (rd := node.rn.ready()) is not None:
            await node._handle(rd)  # noqa: SLF001 - the driver's loop, Ready by Ready

    node.rn.campaign()
    asyncio.run(drive())
    assert node.rn.raft.state == StateType.LEADER
    before, saves = log_worker.jobs, len(wal.saves)
    node.rn.propose(b"put")
    index = node.rn.raft.log.last_index()
    asyncio.run(drive())
    assert node.rn.raft.log.committed == index
    assert log_worker.jobs - before == 1, "more than one round trip to the log thread for one Put"
    assert wal.saves[saves][1:] == ([index], True)
    assert wal.saves[-1] == (HardState(node.rn.raft.term, 1, index), [], False)  # the commit index, unsynced
