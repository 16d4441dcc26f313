"""Snapshots between nodes: a leader streams a consistent copy of the state to a follower that
fell behind the log; a follower keeps what it received until the core asks to install it."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from authstore.node.fsm import StateMachine
from authstore.node.ports import Peers, Worker
from authstore.raft.types import Message
from raftgate.private_files import PRIVATE_DIR_MODE

log = logging.getLogger("raftgate.store.driver")


def clear_snapshot_dir(directory: Path) -> None:
    """Removes what an earlier run left in the snapshot directory (a kill -9 runs no cleanup).

    Copies being sent to a follower or a client, and snapshots received but not yet installed:
    none outlives the process that made it (received ones are named only in memory), and each is
    the size of the database, so a node that crashes repeatedly would otherwise fill its disk.
    """
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


class SnapshotSender:
    """At most one snapshot in flight per follower; the core hears how each one ended."""

    def __init__(self, fsm: StateMachine, peers: Peers, directory: Path, copier: Worker,
                 report: Callable[[int, bool], None]) -> None:
        self.fsm = fsm
        self.peers = peers
        self.directory = directory
        self.copier = copier
        self.report = report  # (peer, failed)
        self._out: set[int] = set()
        self._tasks: dict[asyncio.Task[None], None] = {}  # ordered: a simulation replays exactly

    def send(self, msg: Message) -> None:
        if msg.to in self._out:
            return
        self._out.add(msg.to)
        task = asyncio.get_running_loop().create_task(self._stream(msg))
        self._tasks[task] = None
        task.add_done_callback(lambda t: self._tasks.pop(t, None))

    async def _stream(self, msg: Message) -> None:
        """Sends a consistent copy of the state; it may be newer than the snapshot index the core
        names, which is safe because apply skips entries the state already holds."""
        ok = False
        tmp: Path | None = None
        try:
            self.directory.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix="snap-out-", dir=self.directory))
            path = await self.copier.run(self.fsm.snapshot, tmp)
            ok = await self.peers.send_snapshot(msg, path)
        except Exception:
            log.exception("could not send a snapshot to %x", msg.to)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            self._out.discard(msg.to)
            self.report(msg.to, not ok)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()


class IncomingSnapshots:
    """Snapshots received from a leader, by index, until the core installs one.

    Every arrival gets a file of its own: a leader may send its newest snapshot again (its first
    send failed on its side, or the follower fell back to probing) while the apply thread installs
    the first copy, and one renamed over the other would be swapped in half-way through that
    install, unseen."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._kept: dict[int, Path] = {}
        self._arrivals = 0
        self._installed = 0  # the core never installs a snapshot at or below one it installed

    def keep(self, index: int, path: Path) -> None:
        if index <= self._installed:
            path.unlink(missing_ok=True)
            return
        self.directory.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        self._arrivals += 1
        kept = self.directory / f"{index:016x}-{self._arrivals}.mdb"
        path.replace(kept)
        older = self._kept.pop(index, None)
        if older is not None:
            older.unlink(missing_ok=True)
        self._kept[index] = kept

    def take(self, index: int) -> Path:
        """The file for ``index``, the caller's alone; older ones are deleted (the core will never ask for them)."""
        path = self._kept.pop(index, None)
        if path is None:
            raise RuntimeError(f"raft asked to install snapshot {index}, which never arrived")
        self._installed = max(self._installed, index)
        for stale in [i for i in self._kept if i < index]:
            self._kept.pop(stale).unlink(missing_ok=True)
        return path
