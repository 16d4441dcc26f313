"""In-memory stand-ins for what RaftNode takes by constructor (authstore/node/ports.py and fsm.py),
for the deterministic simulation (node_sim.py): a log that loses unsynced writes on a crash, a
network that drops, duplicates, reorders and partitions, a manual clock, workers whose jobs run
when the simulation says so, and a small key-value state machine.

Nothing here reads the real clock or starts a thread; every choice comes from the simulation's
seeded ``random.Random``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import pickle
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from authstore.node.ports import Receiver
from authstore.raft.codec import decode_conf_change
from authstore.raft.types import Entry, EntryType, HardState, Message, MessageType, SnapshotMetadata
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.storepb import store_pb2 as spb

# ---- the log ----------------------------------------------------------------------------------

@dataclass
class LogState:
    """What a WAL holds, replayed: the newest snapshot marker, the hard state, the entries after it."""

    snapshot: SnapshotMetadata = field(default_factory=SnapshotMetadata)
    hard_state: HardState = field(default_factory=HardState)
    entries: list[Entry] = field(default_factory=list)

    def copy(self) -> LogState:
        return LogState(self.snapshot, self.hard_state, list(self.entries))

    def term_at(self, index: int) -> int:
        """The term of the entry at ``index`` (the snapshot's at its index); -1 if unknown."""
        if index == self.snapshot.index:
            return self.snapshot.term
        pos = index - self.snapshot.index - 1
        if 0 <= pos < len(self.entries):
            return self.entries[pos].term
        return -1

    def apply(self, record: tuple[Any, ...]) -> None:
        """One record, by the real WAL's replay rules (an entry at a held index replaces the suffix)."""
        kind = record[0]
        if kind == "entries":
            for e in record[1]:
                last = self.entries[-1].index if self.entries else self.snapshot.index
                if e.index <= self.snapshot.index or e.index > last + 1:
                    raise AssertionError(f"WAL: entry {e.index} does not follow {last}")
                if e.index <= last:
                    del self.entries[e.index - self.snapshot.index - 1:]
                self.entries.append(e)
        elif kind == "hard":
            self.hard_state = record[1]
        else:  # checkpoint: a new log from a snapshot
            _, md, hs, entries = record
            self.snapshot, self.hard_state, self.entries = md, hs, list(entries)


class FakeWAL:
    """ports.Log in memory. ``save`` with entries or ``sync`` is durable on return, as the real WAL
    (one fsync per batch); a commit-only hard state is written unsynced and a crash keeps a random
    prefix of the unsynced records, as a torn tail."""

    def __init__(self, on_save: Callable[[FakeWAL, list[Entry]], None] = lambda wal, entries: None,
                 on_commit: Callable[[FakeWAL, int, HardState], None] = lambda wal, old, hs: None,
                 *, syncs_fast: bool = False) -> None:
        #: ports.Log: True makes the driver write a lone entry on the loop, at once, as on a fast disk
        self.syncs_fast = syncs_fast
        self.durable = LogState()
        self.view = LogState()  # what was written, synced or not
        self.unsynced: list[tuple[Any, ...]] = []
        self.on_save = on_save  # entries about to be written (the simulation checks log matching)
        self.on_commit = on_commit  # a hard state with a higher commit index was written
        self.closed = False

    def _write(self, record: tuple[Any, ...]) -> None:
        self.view.apply(record)
        self.unsynced.append(record)

    def _sync(self) -> None:
        for record in self.unsynced:
            self.durable.apply(record)
        self.unsynced.clear()

    def save(self, hard_state: HardState | None, entries: list[Entry], sync: bool = True) -> None:
        assert not self.closed
        if entries:
            self.on_save(self, entries)
            self._write(("entries", list(entries)))
        if hard_state is not None:
            old = self.view.hard_state.commit
            self._write(("hard", hard_state))
            if hard_state.commit > old:
                self.on_commit(self, old, hard_state)
        if sync or entries:
            self._sync()

    def checkpoint(self, snapshot: SnapshotMetadata, hard_state: HardState, entries: list[Entry]) -> None:
        assert not self.closed
        self._sync()
        self._write(("checkpoint", snapshot, hard_state, list(entries)))
        self._sync()

    def close(self) -> None:
        self.closed = True

    def crash(self, rng: random.Random) -> None:
        """Power loss: the unsynced records are lost, but for a random prefix of them."""
        kept = self.unsynced[:rng.randrange(len(self.unsynced) + 1)] if self.unsynced else []
        self.unsynced = []
        for record in kept:
            self.durable.apply(record)
        self.view = self.durable.copy()
        self.closed = False


# ---- time and workers -------------------------------------------------------------------------

class _Timer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """ports.Clock: time moves only when the simulation advances it; due timers then fire in order."""

    def __init__(self, wall_ms: int = 1_700_000_000_000) -> None:
        self.now = 0.0
        self.wall_base_ms = wall_ms
        self._timers: list[tuple[float, int, _Timer, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self.now

    def wall_ms(self) -> int:
        return self.wall_base_ms + int(self.now * 1000)

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> _Timer:
        timer = _Timer()
        heapq.heappush(self._timers, (self.now + delay, next(self._seq), timer, fn, args))
        return timer

    def sleep(self, seconds: float) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.call_later(seconds, _resolve, fut)
        return fut

    def advance(self, seconds: float) -> None:
        self.now += seconds
        timers = self._timers
        while timers and timers[0][0] <= self.now:
            _, _, timer, fn, args = heapq.heappop(timers)
            if not timer.cancelled:
                fn(*args)

    def clear(self) -> None:
        """A crash: nothing scheduled by the dead process fires."""
        self._timers.clear()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class SimWorker:
    """ports.Worker: jobs run in submission order, one per simulation step that picks this worker
    (a thread that takes a while), or at once with probability ``immediate``. With probability
    ``hold`` a job's result is returned only at a later step (the apply thread's commit and fsync
    after the batch was decided): what the job told the loop meanwhile is seen before it returns."""

    def __init__(self, name: str, rng: random.Random, immediate: float, runnable: dict[SimWorker, None],
                 hold: float = 0.0) -> None:
        self.name = name
        self.rng = rng
        self.immediate = immediate
        self.hold = hold
        self.jobs: list[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]] = []
        #: a job that ran and whose result is not returned yet (the thread is still in it)
        self.held: tuple[Any, BaseException | None, asyncio.Future[Any]] | None = None
        self._runnable = runnable  # the simulation's workers with jobs (a dict: ordered, so deterministic)
        self.dead = False

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.dead:
            return fut  # never resolves: the process is gone
        if not self.jobs and self.held is None and self.rng.random() < self.immediate:
            _run_job(fn, args, fut)
        else:
            self.jobs.append((fn, args, fut))
            self._runnable[self] = None
        return fut

    def run_next(self) -> None:
        if self.held is not None:
            result, exc, fut = self.held
            self.held = None
            _finish_job(result, exc, fut)
        else:
            fn, args, fut = self.jobs.pop(0)
            if self.hold and self.rng.random() < self.hold:
                try:
                    self.held = (fn(*args), None, fut)
                except Exception as exc:  # noqa: BLE001 - handed over later, as a thread's would be
                    self.held = (None, exc, fut)
            else:
                _run_job(fn, args, fut)
        if not self.jobs and self.held is None:
            self._runnable.pop(self, None)

    def kill(self) -> None:
        self.dead = True
        self.jobs.clear()
        self.held = None
        self._runnable.pop(self, None)

    def shutdown(self) -> None:
        pass


def _run_job(fn: Callable[..., Any], args: tuple[Any, ...], fut: asyncio.Future[Any]) -> None:
    try:
        result = fn(*args)
    except Exception as exc:  # noqa: BLE001 - handed to the awaiting coroutine, as a thread's would be
        _finish_job(None, exc, fut)
        return
    _finish_job(result, None, fut)


def _finish_job(result: Any, exc: BaseException | None, fut: asyncio.Future[Any]) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


# ---- the network ------------------------------------------------------------------------------

@dataclass(slots=True)
class Parcel:
    """A message in flight, or a snapshot (its bytes and the sender's future for the outcome)."""

    msg: Message
    snapshot: bytes | None = None
    done: asyncio.Future[bool] | None = None


class FakeNetwork:
    """Messages in flight between nodes; the simulation delivers them in a random order."""

    def __init__(self, rng: random.Random, drop: float, duplicate: float, window: int = 16) -> None:
        self.rng = rng
        self.drop = drop
        self.duplicate = duplicate
        self.receivers: dict[int, Receiver] = {}
        self.snapshot_dirs: dict[int, Path] = {}
        #: oldest first; a delivery takes one of the oldest ``window`` (reordering, bounded delay)
        self.in_flight: deque[Parcel] = deque()
        self.window = window
        self.cut: set[tuple[int, int]] = set()
        self.stats = {"sent": 0, "dropped": 0, "delivered": 0, "snapshots": 0}
        self._tasks: dict[int, dict[asyncio.Task[None], None]] = {}
        #: sees every message as it is sent (the simulation checks what it promises is durable)
        self.on_send: Callable[[Message], None] = lambda msg: None
        self._incoming = itertools.count()

    def peers(self, node_id: int, snapshot_dir: Path) -> FakePeers:
        self.snapshot_dirs[node_id] = snapshot_dir
        return FakePeers(self, node_id)

    def down(self, node_id: int) -> None:
        """The node crashed: it receives nothing, and its snapshot receptions end."""
        self.receivers.pop(node_id, None)
        for task in self._tasks.pop(node_id, {}):
            task.cancel()

    def connected(self, node_id: int) -> int:
        """The other nodes ``node_id`` reaches now (up, and no partition between): ports.Peers.active_peers."""
        return sum(1 for other in self.receivers if other != node_id and (node_id, other) not in self.cut)

    def submit(self, parcel: Parcel) -> None:
        self.on_send(parcel.msg)
        self.stats["sent"] += 1
        r = self.rng.random()
        if r < self.drop:
            self._lost(parcel)
            return
        self.in_flight.append(parcel)
        if r < self.drop + self.duplicate and parcel.snapshot is None:
            self.in_flight.append(parcel)

    def _lost(self, parcel: Parcel) -> None:
        self.stats["dropped"] += 1
        if parcel.done is not None and not parcel.done.done():
            parcel.done.set_result(False)

    def deliver_one(self) -> Message | None:
        """Delivers a random message in flight; returns it (None if it was lost on the way)."""
        net = self.in_flight
        i = self.rng.randrange(min(len(net), self.window))
        parcel = net[i]
        del net[i]
        m = parcel.msg
        receiver = self.receivers.get(m.to)
        if receiver is None or (m.frm, m.to) in self.cut:
            self._lost(parcel)
            return None
        self.stats["delivered"] += 1
        if parcel.snapshot is None:
            receiver.step(m)
            return m
        self.stats["snapshots"] += 1
        path = self.snapshot_dirs[m.to] / f"incoming-{next(self._incoming)}.snap"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(parcel.snapshot)
        task = asyncio.get_running_loop().create_task(self._receive(receiver, parcel, path))
        tasks = self._tasks.setdefault(m.to, {})
        tasks[task] = None
        task.add_done_callback(lambda t: tasks.pop(t, None))
        return m

    @staticmethod
    async def _receive(receiver: Receiver, parcel: Parcel, path: Path) -> None:
        ok = False
        try:
            await receiver.receive_snapshot(parcel.msg, path)
            ok = True
        finally:
            path.unlink(missing_ok=True)
            if parcel.done is not None and not parcel.done.done():
                parcel.done.set_result(ok)


class FakePeers:
    """ports.Peers for one node, on the shared FakeNetwork."""

    def __init__(self, net: FakeNetwork, node_id: int) -> None:
        self.net = net
        self.id = node_id

    def bind(self, receiver: Receiver) -> None:
        self.net.receivers[self.id] = receiver

    def send(self, msg: Message) -> None:
        self.net.submit(Parcel(msg))

    async def send_snapshot(self, msg: Message, path: Path) -> bool:
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.net.submit(Parcel(msg, path.read_bytes(), done))
        return await done

    def active_peers(self) -> int:
        return self.net.connected(self.id)

    async def close(self) -> None:
        pass


# ---- the state machine ------------------------------------------------------------------------

class KVStateMachine:
    """fsm.StateMachine: a key-value map. A request is an InternalRaftRequest whose ``put`` carries
    the key and a pickled (kind, argument); results are what the linearizability model expects."""

    def __init__(self, node_id: int, on_apply: Callable[[int, Entry], None]) -> None:
        self.node_id = node_id
        self.on_apply = on_apply
        self.kv: dict[str, int] = {}
        self.applied = 0
        self.term = 0
        self._durable: tuple[int, dict[str, int]] = (0, {})
        self._decided: list[Callable[[int, list[tuple[int, Any]], bool], None]] = []

    def on_decided(self, fn: Callable[[int, list[tuple[int, Any]], bool], None]) -> None:
        self._decided.append(fn)

    def apply(self, entries: list[Entry], term: int) -> tuple[list[tuple[int, Any]], bool]:
        self.term = term
        results: list[tuple[int, Any]] = []
        applied = self.applied
        changed = False
        for e in entries:
            if e.index <= self.applied:
                results.append((0, None))
                continue
            if e.index != self.applied + 1:
                raise AssertionError(f"node {self.node_id} applies {e.index} after {self.applied}")
            self.on_apply(self.node_id, e)
            self.applied = e.index
            if e.type == EntryType.CONF_CHANGE:
                changed = True
                ctx = decode_conf_change(e.data).context
                results.append((spb.MemberContext.FromString(ctx).request_id if ctx else 0, None))
            elif not e.data:
                results.append((0, None))
            else:
                req = ipb.InternalRaftRequest.FromString(e.data)
                results.append((req.ID, self._execute(req.put.key.decode(), *pickle.loads(req.put.value))))
        if self.applied > applied:
            for fn in self._decided:
                fn(self.applied, results, changed)
        return results, changed

    def _execute(self, key: str, kind: str, arg: Any) -> Any:
        kv = self.kv
        if kind == "put":
            kv[key] = arg
            return None
        if kind == "delete":
            return kv.pop(key, None) is not None
        expected, new = arg  # cas
        if kv.get(key) != expected:
            return False
        if new is None:
            kv.pop(key, None)
        else:
            kv[key] = new
        return True

    def snapshot(self, directory: Path) -> Path:
        path = directory / "state.snap"
        path.write_bytes(pickle.dumps((self.applied, self.kv)))
        return path

    def restore(self, path: Path) -> int:
        self.applied, self.kv = pickle.loads(path.read_bytes())
        self._durable = (self.applied, dict(self.kv))
        return self.applied

    def sync(self) -> None:
        self._durable = (self.applied, dict(self.kv))

    def crash(self, rng: random.Random) -> None:
        """Power loss: what was applied since the last sync may be lost (or not); the dead node's
        registration goes with the process (the restarted node registers again)."""
        self._decided.clear()
        if rng.random() < 0.5:
            self.applied, kv = self._durable
            self.kv = dict(kv)


def is_snapshot(msg: Message) -> bool:
    return msg.type == MessageType.MsgSnap
