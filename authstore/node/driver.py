"""The driver: one asyncio task per store node moving the Raft core's output to the WAL, the
transport and the apply stage.

The core (``authstore/raft``) is a value that is stepped; everything with a side effect is here.
For each ``Ready``: make the snapshot, hard state and entries durable (one fsync), then send the
messages (they may promise what was just made durable), then hand the committed entries to the
apply task, then answer read-index requests, then ``advance``. A leader sends first and writes
its own log meanwhile, as etcd does (Raft thesis 10.2.1): nothing it sends depends on its own
write, and nothing is applied, so no client hears of an entry, before that write is durable. The
exception: acknowledgements and votes it made in the same Ready before it led (AFTER_WRITE) still
wait for the write.

Apply runs on its own thread, in log order, while the next Ready is already being written and
sent; only a batch with a membership change is applied before ``advance`` (the core must see it
first). While one Ready is being handled, proposals and messages keep arriving and are stepped
in, so the next Ready carries a larger batch: throughput grows with concurrency.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import secrets
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from authstore import failpoints, metrics
from authstore.node.transport import Transport
from authstore.node.wal import WAL
from authstore.raft.codec import decode_conf_change
from authstore.raft.raft import Config, ProposalDroppedError
from authstore.raft.rawnode import RawNode, Ready
from authstore.raft.storage import MemoryStorage
from authstore.raft.types import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    StateType,
)
from authstore.state.apply import Applier, ApplyFailed
from protos import wire
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError

log = logging.getLogger("raftgate.store.driver")

T = TypeVar("T")
MAX_APPLY_LAG = 5000
#: Committed batches waiting for the apply thread before the Raft loop waits for it (a follower's
#: apply must not fall behind its log without bound).
MAX_APPLY_BACKLOG = 64
#: Messages that promise what the Ready writes (entries, term and vote): sent only after the write,
#: by a leader too (etcd-raft's msgsAfterAppend).
AFTER_WRITE = frozenset({MessageType.MsgAppResp, MessageType.MsgVoteResp})
ID_FIELD = ipb.InternalRaftRequest.DESCRIPTOR.fields_by_name["ID"].number
TIME_FIELD = ipb.InternalRaftRequest.DESCRIPTOR.fields_by_name["time_unix_ms"].number


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _clear_snapshot_dir(directory: Path) -> None:
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


class RaftNode:
    def __init__(self, member_id: int, storage: MemoryStorage, wal: WAL, applier: Applier, *, applied: int,
                 snapshot_dir: Path, tick_seconds: float = 0.1, election_ticks: int = 10,
                 request_timeout: float = 7.0, snapshot_count: int = 10_000, catchup_entries: int = 5_000) -> None:
        self.id = member_id
        self.storage = storage
        self.wal = wal
        self.applier = applier
        self.snapshot_dir = snapshot_dir
        _clear_snapshot_dir(snapshot_dir)
        self.tick_seconds = tick_seconds
        self.request_timeout = request_timeout
        self.snapshot_count = snapshot_count
        self.catchup_entries = catchup_entries
        self.rn = RawNode(Config(id=member_id, storage=storage, election_tick=election_ticks, heartbeat_tick=1,
                                 applied=applied, check_quorum=True, pre_vote=True, rng=random.Random()))
        self.transport: Transport | None = None
        self.applied_index = applied
        self.leader_id = 0
        self.term = storage.hard_state.term
        self.conf_state: ConfState = storage.snapshot().metadata.conf_state
        self.removed = False
        self.on_membership_change: Callable[[], None] = lambda: None
        #: Called once, after the batch that removed this member is applied (the process stops).
        self.on_removed: Callable[[], None] = lambda: None
        self.on_leader_change: Callable[[int, int], None] = lambda leader, term: None
        #: Called with each applied batch and its results before anything else runs (the lease keeper).
        self.on_batch_results: Callable[[list[Entry], list[tuple[int, Any]]], None] = lambda entries, results: None
        #: Called on the event loop after each applied batch (the watch hub delivers its events).
        self.on_applied: Callable[[], None] = lambda: None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raft-io")
        self._apply_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="apply")
        self._to_apply: asyncio.Queue[list[Entry]] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._ticks = 0
        self._ids = itertools.count(secrets.randbits(40) << 20)
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._applied_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._pending_reads: list[asyncio.Future[int]] = []
        self._reads_in_flight: dict[bytes, list[asyncio.Future[int]]] = {}
        self._read_ctx = itertools.count(1)
        self._incoming_snapshots: dict[int, Path] = {}
        self._snapshots_out: set[int] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._leader_waiters: list[asyncio.Future[None]] = []
        self.election_seconds = tick_seconds * election_ticks

    # ---- life cycle ----
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(self._loop), name="raft-driver"),
                       loop.create_task(self._run(self._apply_loop), name="raft-apply"),
                       loop.create_task(self._ticker(), name="raft-ticker")]
        if self.conf_state_voters() == [self.id]:
            self.rn.campaign()  # the only voter: no reason to wait an election timeout
        self._wake.set()

    def conf_state_voters(self) -> list[int]:
        return list(self.rn.raft.trk.conf_state().voters)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.transport is not None:
            await self.transport.close()
        await self._on_apply_thread(self.applier.backend.sync)
        self._pool.shutdown(wait=True)
        self._apply_pool.shutdown(wait=True)
        self.wal.close()

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        """On the log thread: WAL writes."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _on_apply_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """On the apply thread: everything that writes the store, in order."""
        return await asyncio.get_running_loop().run_in_executor(self._apply_pool, fn, *args)

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.tick_seconds)
            self._ticks += 1
            self._wake.set()

    # ---- inputs from the transport ----
    def step(self, msg: Message) -> None:
        if self.removed:
            return
        try:
            self.rn.step(msg)
        except ValueError:
            log.warning("dropped a %s from %x", MessageType(msg.type).name, msg.frm)
            return
        self._wake.set()

    def report_unreachable(self, peer_id: int) -> None:
        self.rn.report_unreachable(peer_id)

    async def receive_snapshot(self, msg: Message, path: Path) -> None:
        """A leader sent the store as of a snapshot: keep the file until the core asks to install it."""
        self.snapshot_dir.mkdir(parents=True, exist_ok=True)
        assert msg.snapshot is not None
        index = msg.snapshot.metadata.index
        kept = self.snapshot_dir / f"{index:016x}.mdb"
        path.replace(kept)
        self._incoming_snapshots[index] = kept
        self.step(msg)

    # ---- the loop ----
    async def _run(self, body: Callable[[], Awaitable[None]]) -> None:
        try:
            await body()
        except asyncio.CancelledError:
            raise
        except ApplyFailed as exc:
            # Fail-stop: the batch was not committed; a restart applies it again from the log.
            log.critical("apply failed at %s; the node stops (fail-stop), nothing of the batch was committed",
                         exc, exc_info=True)
            os._exit(70)
        except BaseException:
            # Fail-stop: a node that cannot persist or apply must not keep answering as if it could.
            log.critical("the Raft driver failed; the node stops", exc_info=True)
            os._exit(70)

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            ticks, self._ticks = self._ticks, 0
            for _ in range(ticks):
                self.rn.tick()
            self._issue_reads()
            while (rd := self.rn.ready()) is not None:
                await self._handle(rd)
                self._issue_reads()
            await self._maybe_snapshot()

    async def _handle(self, rd: Ready) -> None:
        if rd.hard_state is not None:
            self.term = rd.hard_state.term
            self.applier.term = self.term
        if rd.soft_state is not None:
            self._on_soft_state(rd.soft_state.lead, rd.soft_state.state)
        if rd.snapshot is not None:
            await self._install_snapshot(rd)
        if rd.soft_state is not None or rd.hard_state is not None:
            metrics.observe_leadership(leader=self.leader_id, term=self.term, me=self.id)
        # A leader sends before its write, except what promises that write (acks, votes): the Ready
        # may hold those from before it led (a follower's MsgAppResp for entries in rd.entries).
        early: list[Message] = []
        late = rd.messages
        if self.rn.raft.state == StateType.LEADER:
            early = [m for m in rd.messages if m.type not in AFTER_WRITE]
            late = [m for m in rd.messages if m.type in AFTER_WRITE]
        self._send(early)
        if rd.entries or rd.hard_state is not None:
            metrics.observe_batch(len(rd.entries))
            await self._io(self.wal.save, rd.hard_state, rd.entries, rd.must_sync)
            if rd.entries:
                self.storage.append(rd.entries)
            if rd.hard_state is not None:
                self.storage.set_hard_state(rd.hard_state)
            failpoints.hit("raftAfterFsync")
        self._send(late)
        if rd.committed_entries:
            self._to_apply.put_nowait(rd.committed_entries)
            if self._to_apply.qsize() >= MAX_APPLY_BACKLOG or any(
                    e.type == EntryType.CONF_CHANGE for e in rd.committed_entries):
                await self._to_apply.join()
        for rs in rd.read_states:
            for fut in self._reads_in_flight.pop(rs.ctx, []):
                if not fut.done():
                    fut.set_result(rs.index)
        self.rn.advance(rd)
        metrics.observe_indexes(committed=self.storage.hard_state.commit, applied=self.applied_index)

    def _send(self, messages: list[Message]) -> None:
        for msg in messages:
            if msg.type == MessageType.MsgSnap:
                self._send_snapshot(msg)
            elif self.transport is not None:
                self.transport.send(msg)

    async def _apply_loop(self) -> None:
        """Applies committed batches in log order; merges batches that queued meanwhile."""
        while True:
            entries = await self._to_apply.get()
            merged = 1
            while not self._to_apply.empty():
                entries = entries + self._to_apply.get_nowait()
                merged += 1
            try:
                await self._apply(entries)
            finally:
                for _ in range(merged):
                    self._to_apply.task_done()

    async def _apply(self, entries: list[Entry]) -> None:
        results = await self._on_apply_thread(self.applier.apply_batch, entries)
        self.on_applied()
        membership_changed = removed_now = False
        for entry, (request_id, result) in zip(entries, results, strict=True):
            if entry.type == EntryType.CONF_CHANGE:
                cc = decode_conf_change(entry.data)
                self.conf_state = self.rn.apply_conf_change(cc)
                membership_changed = True
                if cc.type == ConfChangeType.REMOVE_NODE and cc.node_id == self.id and not self.removed:
                    log.warning("this member was removed from the cluster; it stops")
                    self.removed = removed_now = True
            elif isinstance(result, pb.MemberUpdateResponse | pb.MemberListResponse):
                membership_changed = True
            if request_id:
                fut = self._waiters.pop(request_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(result)
        self.applied_index = max(self.applied_index, entries[-1].index)
        self.on_batch_results(entries, results)
        if membership_changed:
            self.on_membership_change()
        self._wake_applied()
        if removed_now:
            self.on_removed()

    def _on_soft_state(self, lead: int, state: StateType) -> None:
        if lead != self.leader_id:
            log.info("leader is now %x (term %d)", lead, self.term)
            self.leader_id = lead
            # etcd: a read-index request that spans a leader change fails with "leader changed".
            for futures in self._reads_in_flight.values():
                for fut in futures:
                    if not fut.done():
                        fut.set_exception(EtcdError(Err.LEADER_CHANGED))
            self._reads_in_flight.clear()
            if lead:
                for fut in self._leader_waiters:
                    if not fut.done():
                        fut.set_result(None)
                self._leader_waiters.clear()
            self.on_leader_change(lead, self.term)

    # ---- snapshots ----
    async def _install_snapshot(self, rd: Ready) -> None:
        assert rd.snapshot is not None
        meta = rd.snapshot.metadata
        path = self._incoming_snapshots.pop(meta.index, None)
        if path is None:
            raise RuntimeError(f"raft asked to install snapshot {meta.index}, which never arrived")
        for stale in [i for i in self._incoming_snapshots if i < meta.index]:
            self._incoming_snapshots.pop(stale).unlink(missing_ok=True)
        await self._to_apply.join()
        store_index = await self._on_apply_thread(self.applier.restore, path)
        failpoints.hit("raftMidSnapshotInstall")
        self.storage.apply_snapshot(rd.snapshot)
        hard_state = rd.hard_state or self.storage.hard_state
        await self._io(self.wal.checkpoint, meta, hard_state, [])
        self.conf_state = meta.conf_state
        self.applied_index = max(meta.index, self.applied_index)
        log.info("installed a snapshot at index %d (store at %d) from the leader", meta.index, store_index)
        self.on_membership_change()
        self._wake_applied()

    def _send_snapshot(self, msg: Message) -> None:
        if msg.to in self._snapshots_out or self.transport is None:
            return
        self._snapshots_out.add(msg.to)
        asyncio.get_running_loop().create_task(self._stream_snapshot(msg))

    async def _stream_snapshot(self, msg: Message) -> None:
        """Sends a consistent copy of the store; it may be newer than the snapshot index the core
        names, which is safe because apply skips entries the store already holds."""
        ok = False
        tmp: Path | None = None
        try:
            self.snapshot_dir.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix="snap-out-", dir=self.snapshot_dir))
            path = await asyncio.get_running_loop().run_in_executor(None, self.applier.backend.copy_to, tmp)
            assert self.transport is not None
            ok = await self.transport.send_snapshot(msg, path)
        except Exception:
            log.exception("could not send a snapshot to %x", msg.to)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            self._snapshots_out.discard(msg.to)
            self.rn.report_snapshot(msg.to, failed=not ok)
            self._wake.set()

    async def _maybe_snapshot(self) -> None:
        """Compacts the log once enough is applied: the store (synced) is the snapshot."""
        snap_index = self.storage.snapshot().metadata.index
        if self.applied_index - snap_index < self.snapshot_count:
            return
        index = self.applied_index
        await self._on_apply_thread(self.applier.backend.sync)
        snap = self.storage.create_snapshot(index, self.conf_state, b"")
        keep = self.storage.entries(index + 1, self.storage.last_index() + 1, 1 << 62)
        await self._io(self.wal.checkpoint, snap.metadata, self.storage.hard_state, keep)
        compact_to = index - self.catchup_entries
        if compact_to > self.storage.first_index():
            self.storage.compact(compact_to)
        log.info("snapshot at index %d; log compacted", index)

    # ---- the API the store service uses ----
    async def propose(self, data: bytes) -> Any:
        """Puts a request into the log; returns the apply stage's answer (or raises its error)."""
        await self._await_leader()
        if self.storage.hard_state.commit - self.applied_index > MAX_APPLY_LAG:
            raise EtcdError(Err.TOO_MANY_REQUESTS)  # etcd's back-pressure when apply falls behind
        request_id = next(self._ids)
        payload = data + wire.varint_field(ID_FIELD, request_id) + wire.varint_field(TIME_FIELD, now_ms())
        return await self._propose(request_id, lambda: self.rn.propose(payload))

    async def propose_conf_change(self, cc: ConfChange, request_id: int) -> Any:
        return await self._propose(request_id, lambda: self.rn.propose_conf_change(cc))

    def new_request_id(self) -> int:
        return next(self._ids)

    async def _propose(self, request_id: int, put: Callable[[], None]) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = fut
        leader = self.leader_id
        try:
            put()
        except ProposalDroppedError:
            self._waiters.pop(request_id, None)
            raise EtcdError(Err.NO_LEADER) from None
        metrics.observe_proposal()
        self._wake.set()
        try:
            result = await self._within_request_timeout(fut)
        except TimeoutError:
            raise EtcdError(Err.TIMEOUT_DUE_TO_LEADER_FAIL if self.leader_id != leader else Err.TIMEOUT) from None
        finally:
            self._waiters.pop(request_id, None)  # answered, timed out, or its caller went away
        if isinstance(result, BaseException):
            raise result
        return result

    async def _within_request_timeout(self, fut: asyncio.Future[T]) -> T:
        """Awaits ``fut`` for at most the request timeout (then TimeoutError). A timer, not
        ``wait_for``: this is on the path of every request, and a timer costs a fraction."""
        timer = asyncio.get_running_loop().call_later(self.request_timeout, _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()

    async def between_batches(self, fn: Callable[..., T], *args: Any) -> T:
        """Runs `fn` on the apply thread between two batches: it sees a whole batch or none."""
        return await self._on_apply_thread(fn, *args)

    async def read_index(self) -> int:
        """A linearizable read point confirmed by a quorum (ReadIndex); many readers share one."""
        await self._await_leader()
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending_reads.append(fut)
        self._wake.set()
        try:
            return await self._within_request_timeout(fut)
        except TimeoutError:
            raise EtcdError(Err.TIMEOUT) from None

    async def must_lead(self) -> None:
        """Returns once a leader is known and it is this node; else `not leader` (or `no leader`).

        Client writes are proposed on the leader only. A follower would forward them, and a
        forwarded proposal that a broken peer stream drops is never retried by Raft: its client
        would wait out the request timeout, and a write cannot be sent again. `not leader` is
        never taken, so the proxy finds the leader and sends the write there instead. (Reads may
        be forwarded: the proxy retries a read that timed out.)"""
        await self._await_leader()
        if not self.is_leader:
            raise EtcdError(Err.NOT_LEADER)

    async def _await_leader(self) -> None:
        """During an election, waits up to two election timeouts for a leader before answering
        etcd's `no leader`: a client should not see the blink of a normal failover."""
        if self.removed:
            raise EtcdError(Err.STOPPED)
        if self.leader_id:
            return
        deadline = time.monotonic() + 2 * self.election_seconds
        while not self.leader_id:
            if time.monotonic() >= deadline:
                raise EtcdError(Err.NO_LEADER)
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._leader_waiters.append(fut)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, max(deadline - time.monotonic(), 0.001))

    def _issue_reads(self) -> None:
        if not self._pending_reads:
            return
        ctx = next(self._read_ctx).to_bytes(8, "big")
        self._reads_in_flight[ctx] = self._pending_reads
        self._pending_reads = []
        self.rn.read_index(ctx)

    async def wait_applied(self, index: int) -> None:
        if self.applied_index >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._applied_waiters.append((index, fut))
        try:
            await self._within_request_timeout(fut)
        except TimeoutError:
            raise EtcdError(Err.TIMEOUT) from None

    def _wake_applied(self) -> None:
        keep = []
        for index, fut in self._applied_waiters:
            if index <= self.applied_index:
                if not fut.done():
                    fut.set_result(None)
            elif not fut.done():
                keep.append((index, fut))
        self._applied_waiters = keep

    @property
    def last_index(self) -> int:
        return self.storage.last_index()

    @property
    def is_leader(self) -> bool:
        return self.rn.raft.state == StateType.LEADER

    @property
    def is_learner(self) -> bool:
        return self.id in self.conf_state.learners

    def progress(self) -> dict[int, tuple[int, int, str]]:
        return self.rn.status().progress

    def transfer_leader(self, target: int) -> None:
        self.rn.transfer_leader(target)
        self._wake.set()
