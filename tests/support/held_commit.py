"""One store node in process whose batch commits a test can hold: answered, not yet committed.

A write is answered once its batch is decided, before the LMDB commit; what answers from the local
state must wait for that commit. Tests of that window (tests/unit/test_answer_before_commit.py,
tests/unit/test_token_resolve_caught_up.py) hold the commit of the batch they name here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from authstore.node.driver import RaftNode
from authstore.raft.storage import MemoryStorage
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from tests.support.node_ports import NoPeers, NoWAL

#: how long a held commit or a wait for it may take before the test fails
BOUND_SECONDS = 30


def _no_exit() -> Any:
    raise AssertionError("the node failed (see the log)")


class CommitHold:
    """Holds the commit of every batch whose results ``holds`` picks, until ``release``."""

    def __init__(self, applier: Applier, holds: Callable[[list[tuple[int, Any]]], bool]) -> None:
        self._holds = holds
        self._may_go = threading.Event()
        self._holding = threading.Event()
        applier.on_decided(self._hook)

    def _hook(self, index: int, results: list[tuple[int, Any]], _membership_changed: bool) -> None:
        if self._holds(results):  # on the apply thread, between decided and commit
            self._holding.set()
            assert self._may_go.wait(BOUND_SECONDS), "the test never let the commit go"

    async def held(self) -> None:
        """Returns once a picked batch is answered and its commit is held."""
        assert await asyncio.to_thread(self._holding.wait, BOUND_SECONDS), "no batch was held"

    def release(self) -> None:
        self._may_go.set()


async def loop_turns(count: int = 20) -> None:
    """Turns of the event loop, no time: what waits for a held commit is still waiting after them."""
    for _ in range(count):
        await asyncio.sleep(0)


def run_single_node(tmp_path: Path, holds: Callable[[list[tuple[int, Any]]], bool],
                    scenario: Callable[[Applier, RaftNode, CommitHold], Awaitable[None]]) -> None:
    """Runs ``scenario`` against one started node (a log that writes nothing) whose picked commits
    are held; the hold is released and the node stopped whatever happens."""
    backend = Backend(tmp_path / "db", map_size=64 << 20)
    applier = Applier(backend, member_id=1)
    node = RaftNode(1, MemoryStorage.with_conf([1]), NoWAL(), applier, NoPeers(),  # type: ignore[arg-type]
                    applied=0, snapshot_dir=tmp_path / "snap", fail_stop=_no_exit)
    hold = CommitHold(applier, holds)

    async def run() -> None:
        node.start()
        try:
            await scenario(applier, node, hold)
        finally:
            hold.release()
            await node.stop()

    try:
        asyncio.run(run())
    finally:
        backend.close()
