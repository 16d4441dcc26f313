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


def _leader_with(tmp_path: Path, wal: RecordingWAL, log_worker: CountingWorker) -> RaftNode:
    node = RaftNode(1, storage_with([1], []), wal, FakeStateMachine(), FakePeers(Events()),  # type: ignore[arg-type]
                    applied=0, snapshot_dir=tmp_path / "snap", log_worker=log_worker,
                    apply_worker=CountingWorker())
    node.rn.campaign()
    asyncio.run(_drive(node))
    assert node.rn.raft.state == StateType.LEADER
    return node


async def _drive(node: RaftNode) -> None:
    while (rd := node.rn.ready()) is not None:
        await node._handle(rd)  # noqa: SLF001 - the driver's loop, Ready by Ready


def test_a_lone_write_to_a_log_that_syncs_fast_is_made_on_the_loop(tmp_path: Path) -> None:
    """Issue 22: with a fast disk, a Ready of one entry is written and synced on the event loop
    (about 150 µs here) instead of a round trip to the log thread (about 120 µs more, measured
    with RAFTGATE_TRACE_STAGES): one client's Put is that much sooner. Made durable all the same."""
    wal, log_worker = RecordingWAL(), CountingWorker()
    wal.syncs_fast = True
    node = _leader_with(tmp_path, wal, log_worker)
    before, saves = log_worker.jobs, len(wal.saves)
    node.rn.propose(b"put")
    index = node.rn.raft.log.last_index()
    asyncio.run(_drive(node))
    assert node.rn.raft.log.committed == index
    assert log_worker.jobs == before, "a round trip to the log thread for a lone write on a fast disk"
    assert wal.saves[saves][1:] == ([index], True)


def test_a_batch_or_a_slow_disk_keeps_the_write_on_the_log_thread(tmp_path: Path) -> None:
    """A batch of entries, or any write while the log's last sync was slow, goes to the log thread:
    the loop keeps serving (reads, heartbeats arriving, health checks) while the disk works."""
    wal, log_worker = RecordingWAL(), CountingWorker()
    wal.syncs_fast = True
    node = _leader_with(tmp_path, wal, log_worker)
    before = log_worker.jobs
    node.rn.propose(b"put 1")
    node.rn.propose(b"put 2")
    asyncio.run(_drive(node))
    assert log_worker.jobs - before == 1, "a batch of two entries was not written on the log thread"
    wal.syncs_fast = False
    node.rn.propose(b"put 3")
    asyncio.run(_drive(node))
    assert log_worker.jobs - before == 2, "a lone write on a slow disk was not written on the log thread"
