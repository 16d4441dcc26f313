"""A lone write made on the event loop (a WAL that syncs fast, issue 22) that fails - a full disk,
an I/O error - stops the node exactly as a failed write on the log thread does: fail-stop, and
the write is neither applied nor answered."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from authstore.node.driver import RaftNode
from authstore.raft import Entry, HardState
from authstore.raft.storage import MemoryStorage
from tests.support.node_ports import FakeStateMachine, NoPeers


class FailingWAL:
    """ports.Log: syncs fast (so a lone entry is written on the loop); the write of ``fail_on`` fails."""

    syncs_fast = True

    def __init__(self, fail_on: bytes) -> None:
        self.fail_on = fail_on
        self.durable: list[bytes] = []

    def save(self, hard_state: HardState | None, entries: list[Entry], must_sync: bool = True) -> None:
        if any(e.data == self.fail_on for e in entries):
            raise OSError(28, "No space left on device")
        self.durable += [e.data for e in entries]

    def checkpoint(self, *args: Any) -> None:
        pass

    def close(self) -> None:
        pass


class RecordingFSM(FakeStateMachine):
    """Records what is applied (nothing of a failed write may be)."""

    def __init__(self) -> None:
        self.applied: list[bytes] = []

    def apply(self, entries: Any, term: int) -> tuple[list[tuple[int, Any]], bool]:
        self.applied += [e.data for e in entries if e.data]
        return [(0, None) for _ in entries], False


@pytest.mark.parametrize("syncs_fast", [True, False])  # on the loop; on the log thread, as before
def test_a_failed_write_stops_the_node_and_nothing_is_applied_or_answered(tmp_path: Path, syncs_fast: bool) -> None:
    wal, fsm = FailingWAL(b"doomed"), RecordingFSM()
    wal.syncs_fast = syncs_fast
    stopped: list[bool] = []

    def fail_stop() -> Any:
        stopped.append(True)  # the real one ends the process; here the driver's task ends

    node = RaftNode(1, MemoryStorage.with_conf([1]), wal, fsm, NoPeers(),  # type: ignore[arg-type]
                    applied=0, snapshot_dir=tmp_path / "snap", fail_stop=fail_stop)
    node.request_timeout = 1.0

    async def main() -> None:
        node.start()
        try:
            await asyncio.wait_for(node.admit(), 30)
            answer = asyncio.create_task(node.propose(b"doomed", 7))
            for _ in range(3000):
                if stopped or answer.done():
                    break
                await asyncio.sleep(0.01)
            assert stopped, "the node kept running after its WAL write failed"
            done, _ = await asyncio.wait([answer], timeout=3)
            if done:
                assert answer.exception() is not None, "a write that is not durable was answered"
            else:
                answer.cancel()
        finally:
            node.crash()
    asyncio.run(main())
    assert b"doomed" not in fsm.applied and b"doomed" not in wal.durable
