"""A read-index answer can reach a node after it restarted (the leader queued it for the old
process). Each incarnation starts its read contexts somewhere new, so such an answer matches no
read of the new process: matched, it would hand a new read an old read point (a stale read)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from authstore.node.driver import RaftNode
from authstore.raft import ReadState
from tests.support.node_ports import Events, FakePeers, FakeStateMachine, RecordingWAL
from tests.support.raft_helpers import storage_with


def test_a_late_answer_to_an_earlier_incarnations_read_answers_no_read_of_the_new_one(tmp_path: Path) -> None:
    sent: list[bytes] = []

    def incarnation() -> RaftNode:
        return RaftNode(1, storage_with([1, 2, 3], []), RecordingWAL(), FakeStateMachine(),  # type: ignore[arg-type]
                        FakePeers(Events()), applied=0, snapshot_dir=tmp_path / "snap")

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        old = incarnation()
        old._reads.add(loop.create_future())  # noqa: SLF001 - a read in flight when the process died
        old._reads.issue(sent.append, 0.0)  # noqa: SLF001
        new = incarnation()
        read: asyncio.Future[int] = loop.create_future()
        new._reads.add(read)  # noqa: SLF001
        new._reads.issue(sent.append, 0.0)  # noqa: SLF001
        new._reads.answer([ReadState(index=5, ctx=sent[0])])  # noqa: SLF001 - the old read's answer, late
        return read.done()

    assert not asyncio.run(main()), "a new read took the read point of a read made before the restart"
