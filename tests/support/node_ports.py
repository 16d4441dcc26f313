"""Stand-ins for the ports a single RaftNode takes by constructor (authstore/node/ports.py, fsm.py),
shared by the node tests that drive one node by hand (the simulation's richer fakes: tests/raft/fakes.py).

``Events`` keeps one ordered record of WAL writes and sent messages, so a test can tell which came
first; the ``No*`` ports do nothing; the ``Recording``/``Counting`` ones count what the node asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from authstore.raft import Entry, HardState, Message


class Events:
    def __init__(self) -> None:
        self.log: list[Any] = []


class FakeWAL:
    syncs_fast = False  # ports.Log: every write on the log worker, as these tests count them

    def __init__(self, events: Events) -> None:
        self.events = events

    def save(self, hard_state: HardState | None, entries: list[Entry], must_sync: bool) -> None:
        self.events.log.append(("save", [e.index for e in entries], must_sync))


class FakePeers:
    """The node's ``Peers`` port: records what is sent, in order with the WAL's writes."""

    def __init__(self, events: Events) -> None:
        self.events = events

    def bind(self, receiver: Any) -> None:
        pass

    def send(self, m: Message) -> None:
        self.events.log.append(m)

    async def send_snapshot(self, msg: Message, path: Path) -> bool:
        return False

    def active_peers(self) -> int:
        return 0

    async def close(self) -> None:
        pass


class FakeStateMachine:
    """Nothing is committed in the one Ready handled here."""

    def apply(self, entries: Any, term: int) -> tuple[list[tuple[int, Any]], bool]:
        return [], False

    def on_decided(self, fn: Any) -> None:
        pass

    def snapshot(self, directory: Path) -> Path:
        raise AssertionError("no snapshot in this test")

    def restore(self, path: Path) -> int:
        raise AssertionError("no snapshot in this test")

    def sync(self) -> None:
        pass


class RecordingWAL:
    def __init__(self) -> None:
        self.saves: list[tuple[HardState | None, list[int], bool]] = []
        #: ports.Log: whether a lone write may be made on the event loop (the test sets it)
        self.syncs_fast = False

    def save(self, hard_state: HardState | None, entries: list[Entry], sync: bool = True) -> None:
        self.saves.append((hard_state, [e.index for e in entries], sync))

    def close(self) -> None:
        pass


class CountingWorker:
    """ports.Worker that runs jobs at once and counts them (each is a thread round trip in the store)."""

    def __init__(self) -> None:
        self.jobs = 0

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        self.jobs += 1
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(fn(*args))
        return fut

    def shutdown(self) -> None:
        pass


class NoWAL:
    syncs_fast = False
    def save(self, hard_state: HardState | None, entries: list[Any], must_sync: bool = True) -> None:
        pass

    def checkpoint(self, *args: Any) -> None:
        pass

    def close(self) -> None:
        pass


class NoPeers:
    def bind(self, receiver: Any) -> None:
        pass

    def send(self, m: Message) -> None:
        pass

    async def send_snapshot(self, msg: Message, path: Path) -> bool:
        return False

    def active_peers(self) -> int:
        return 0

    async def close(self) -> None:
        pass
