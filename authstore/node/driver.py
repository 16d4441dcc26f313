"""The driver: one asyncio task per store node moving the Raft core's output to the WAL, the
transport and the apply stage.

The core (``authstore/raft``) is a value that is stepped; everything with a side effect is here,
and reaches the world only through what the constructor is given: the state machine
(``fsm.StateMachine``), the log, the peers, the clock and the worker threads (``ports``). The
store passes the real ones (authstore/main.py); the simulation in tests/raft passes in-memory
ones, so what it proves is this code.
For each ``Ready``: make the snapshot, hard state and entries durable (one fsync, on the log
thread; a Ready of at most one entry is written and synced on the loop while the disk syncs fast,
which saves one client's write a thread round trip; a hard state whose only change is the commit
index is written on the loop, unsynced), then send the
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
import logging
import os
import random
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from authstore import failpoints, metrics
from authstore.node.fsm import StateMachine
from authstore.node.ports import Clock, Log, Peers, SystemClock, ThreadWorker, Worker
from authstore.node.reads import ReadBatcher
from authstore.node.snapshots import IncomingSnapshots, SnapshotSender, clear_snapshot_dir
from authstore.node.waiters import Waiters
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
from raftgate import stages
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
#: How long a member of several waits for its peers' connections before it fast-forwards its
#: first election, and how often it looks (etcd's adjustTicks: rafthttp.ConnReadTimeout, 50 ms).
PEER_WAIT_MS = 5000
PEER_POLL_MS = 50


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _exit_process() -> NoReturn:
    os._exit(70)


class ApplyError(Exception):
    """The state machine refused a batch for a reason local to this node (nothing of it applied)."""


class _DefaultExecutor:
    """The loop's default executor (copies of the state for followers run beside apply)."""

    def run(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        return asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def shutdown(self) -> None:
        pass


class RaftNode:
    def __init__(self, member_id: int, storage: MemoryStorage, wal: Log, fsm: StateMachine, peers: Peers, *,
                 applied: int, snapshot_dir: Path,
                 tick_seconds: float = 0.1, election_ticks: int = 10,
                 request_timeout: float = 7.0, snapshot_count: int = 10_000, catchup_entries: int = 5_000,
                 clock: Clock | None = None, log_worker: Worker | None = None, apply_worker: Worker | None = None,
                 copy_worker: Worker | None = None, rng: random.Random | None = None,
                 fail_stop: Callable[[], NoReturn] = _exit_process,
                 initial_election_tick_advance: bool = True) -> None:
        """``clock``, the workers and ``rng`` default to the real ones (system time, one thread
        each, a fresh seed); the simulation passes deterministic ones. ``fail_stop`` ends the
        process when the node can no longer persist or apply. Proposals arrive as bytes the API
        layer stamped with their request ID and time (authstore/api/proposer.py); the node reads
        none of them. ``initial_election_tick_advance``: etcd's flag of that name (``start``)."""
        self.id = member_id
        self.storage = storage
        self.wal = wal
        self.fsm = fsm
        self.peers = peers
        self.snapshot_dir = snapshot_dir
        clear_snapshot_dir(snapshot_dir)
        self.tick_seconds = tick_seconds
        self.request_timeout = request_timeout
        self.snapshot_count = snapshot_count
        self.catchup_entries = catchup_entries
        self.clock: Clock = clock or SystemClock()
        self._log_worker: Worker = log_worker or ThreadWorker("raft-io")
        self._apply_worker: Worker = apply_worker or ThreadWorker("apply")
        self._fail_stop = fail_stop
        seeded = rng is not None
        rng = rng or random.Random()
        self.rn = RawNode(Config(id=member_id, storage=storage, election_tick=election_ticks, heartbeat_tick=1,
                                 applied=applied, check_quorum=True, pre_vote=True, rng=rng))
        self.applied_index = applied
        #: the last index whose callers were answered before its batch committed (``decided``)
        self.decided_index = applied
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self.leader_id = 0
        self.term = storage.hard_state.term
        self.conf_state: ConfState = storage.snapshot().metadata.conf_state
        self.removed = False
        #: members this node applied the removal of: their messages are refused (see removed_by_peers)
        self._removed_ids: set[int] = set()
        self._membership_hooks: list[Callable[[], None]] = []
        self._removed_hooks: list[Callable[[], None]] = []
        self._leader_hooks: list[Callable[[int, int], None]] = []
        self._batch_hooks: list[Callable[[list[Entry], list[tuple[int, Any]]], None]] = []
        self._applied_hooks: list[Callable[[], None]] = []
        self._to_apply: asyncio.Queue[list[Entry]] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._ticks = 0
        self._waiters = Waiters()
        #: log index -> the stage trace of a sampled proposal in flight (raftgate/stages.py; else empty)
        self._traced: dict[int, list[int]] = {}
        # random per incarnation: a read answer the leader queued for an earlier one matches nothing
        self._reads = ReadBatcher(first_ctx=1 + (rng.getrandbits(62) if seeded else secrets.randbits(62)))
        self._incoming = IncomingSnapshots(snapshot_dir)
        self._snapshots = SnapshotSender(fsm, peers, snapshot_dir, copy_worker or _DefaultExecutor(),
                                         self._snapshot_sent)
        self._tasks: list[asyncio.Task[None]] = []
        self._leader_waiters: list[asyncio.Future[None]] = []
        self.election_seconds = tick_seconds * election_ticks
        self.election_ticks = election_ticks
        self.initial_election_tick_advance = initial_election_tick_advance
        peers.bind(self)
        fsm.on_decided(self.decided)

    # ---- hooks (each registers one more callback; called in registration order) ----
    def on_membership_change(self, fn: Callable[[], None]) -> None:
        """After a batch that changed the membership is applied, and after a snapshot install."""
        self._membership_hooks.append(fn)

    def on_removed(self, fn: Callable[[], None]) -> None:
        """Once, after the batch that removed this member is applied (the process stops)."""
        self._removed_hooks.append(fn)

    def on_leader_change(self, fn: Callable[[int, int], None]) -> None:
        """With (leader, term) on every change of the known leader, before anything else runs."""
        self._leader_hooks.append(fn)

    def on_batch_results(self, fn: Callable[[list[Entry], list[tuple[int, Any]]], None]) -> None:
        """With each applied batch and its results, once its proposals are answered (the lease keeper)."""
        self._batch_hooks.append(fn)

    def on_applied(self, fn: Callable[[], None]) -> None:
        """On the event loop right after each applied batch (the watch hub delivers its events)."""
        self._applied_hooks.append(fn)

    # ---- life cycle ----
    def start(self, members: int | None = None) -> None:
        """Starts the node. ``members``: how many members its membership holds now (the store's
        member list; on a new cluster, --initial-cluster); None: its Raft configuration's."""
        loop = self._event_loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(self._loop), name="raft-driver"),
                       loop.create_task(self._run(self._apply_loop), name="raft-apply"),
                       loop.create_task(self._ticker(), name="raft-ticker")]
        if self.conf_state_voters() == [self.id]:
            self.rn.campaign()  # the only voter: no reason to wait an election timeout
        if members is None:
            members = len(self.conf_state.voters) + len(self.conf_state.learners)
        self._adjust_ticks(members)
        self._wake.set()

    def _adjust_ticks(self, members: int) -> None:
        """etcd's adjustTicks: a new process need not wait a whole election timeout before it may
        campaign. A single member advances all but one tick of it now (fresh or restarted).
        Another, with --initial-election-tick-advance, advances all but two once more than one
        peer is connected (etcd's condition), so a member rejoining a cluster that has a leader
        still hears its heartbeat first (pre-vote protects the cluster too); without connected
        peers within PEER_WAIT_MS nothing is advanced. Ticks still draw nothing: the randomized
        part of the timeout remains."""
        if members == 1:
            ticks = self.election_ticks - 1
            log.info("started as single-node; fast-forwarding election ticks (local-member-id %x, forward-ticks %d, "
                     "forward-duration %s, election-ticks %d, election-timeout %s)", self.id, ticks,
                     self._duration(ticks), self.election_ticks, self._duration(self.election_ticks))
            self.advance_ticks(ticks)
            return
        if not self.initial_election_tick_advance:
            log.info("skipping initial election tick advance (election-ticks %d)", self.election_ticks)
            return
        log.info("starting initial election tick advance (election-ticks %d)", self.election_ticks)
        assert self._event_loop is not None
        self._tasks.append(self._event_loop.create_task(self._run(self._advance_once_peers_connect),
                                                        name="raft-tick-advance"))

    async def _advance_once_peers_connect(self) -> None:
        for _ in range(PEER_WAIT_MS // PEER_POLL_MS):
            await self.clock.sleep(PEER_POLL_MS / 1000)
            active = self.peers.active_peers()
            if active > 1:
                ticks = self.election_ticks - 2
                log.info("initialized peer connections; fast-forwarding election ticks (local-member-id %x, "
                         "forward-ticks %d, forward-duration %s, election-ticks %d, election-timeout %s, "
                         "active-remote-members %d)", self.id, ticks, self._duration(ticks), self.election_ticks,
                         self._duration(self.election_ticks), active)
                self.advance_ticks(ticks)
                return

    def advance_ticks(self, ticks: int) -> None:
        """etcd's advanceTicks: ``ticks`` more ticks at once, stepped into the core by the loop as
        the ticker's are, so they do nothing that as many ticks would not."""
        self._ticks += ticks
        self._wake.set()

    def _duration(self, ticks: int) -> str:
        return f"{round(ticks * self.tick_seconds * 1000)}ms"

    def conf_state_voters(self) -> list[int]:
        return list(self.rn.raft.trk.conf_state().voters)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._snapshots.cancel()
        await self.peers.close()
        await self._on_apply_thread(self.fsm.sync)
        self._log_worker.shutdown()
        self._apply_worker.shutdown()
        self.wal.close()

    def crash(self) -> None:
        """Stops at once, as a killed process would: the node's tasks and snapshot sends are
        cancelled, and nothing is synced, flushed or closed (what the node had not made durable
        is the caller's to lose). For fault injection (the simulation in tests/raft)."""
        for task in self._tasks:
            task.cancel()
        self._snapshots.cancel()

    def _io(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        """On the log thread: WAL writes."""
        return self._log_worker.run(fn, *args)

    def _on_apply_thread(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        """On the apply thread: everything that writes the state, in order."""
        return self._apply_worker.run(fn, *args)

    async def _ticker(self) -> None:
        while True:
            await self.clock.sleep(self.tick_seconds)
            self._ticks += 1
            self._wake.set()

    # ---- inputs from the transport (ports.Receiver) ----
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

    def is_removed(self, peer_id: int) -> bool:
        return peer_id in self._removed_ids

    def removed_by_peers(self) -> None:
        """A member that missed the entry removing it (away while it was committed; the leader
        then stops sending to it) learns it from the peers that refuse its messages, as etcd's
        do (its rafthttp answers a removed member 410 Gone), and stops like one that applied it."""
        if self.removed:
            return
        log.warning("this member was removed from the cluster (its peers refuse it); it stops")
        self.removed = True
        for hook in self._removed_hooks:
            hook()

    async def receive_snapshot(self, msg: Message, path: Path) -> None:
        """A leader sent the state as of a snapshot: keep the file until the core asks to install it."""
        assert msg.snapshot is not None
        self._incoming.keep(msg.snapshot.metadata.index, path)
        self.step(msg)

    # ---- the loop ----
    async def _run(self, body: Callable[[], Awaitable[None]]) -> None:
        try:
            await body()
        except asyncio.CancelledError:
            raise
        except ApplyError as exc:
            # Fail-stop: the batch was not committed; a restart applies it again from the log.
            log.critical("apply failed at %s; the node stops (fail-stop), nothing of the batch was committed",
                         exc.__cause__, exc_info=True)
            self._fail_stop()
        except BaseException:
            # Fail-stop: a node that cannot persist or apply must not keep answering as if it could.
            log.critical("the Raft driver failed; the node stops", exc_info=True)
            self._fail_stop()

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            ticks, self._ticks = self._ticks, 0
            for _ in range(ticks):
                self.rn.tick()
            now = self.clock.monotonic()
            if ticks:
                self._reads.retry(self.rn.read_index, now)  # a lost request or answer is asked for again
            self._reads.issue(self.rn.read_index, now)
            while (rd := self.rn.ready()) is not None:
                await self._handle(rd)
                self._reads.issue(self.rn.read_index, self.clock.monotonic())
            await self._maybe_snapshot()

    def _split_sends(self, messages: list[Message]) -> tuple[list[Message], list[Message]]:
        """(sent before the write, sent after it). A leader sends first and writes its own log
        meanwhile (Raft thesis 10.2.1): nothing it sends depends on its own write - except what
        promises that write (``AFTER_WRITE``: acks, votes), which its Ready may hold from before it
        led. A follower's answers promise what it wrote, so it sends only once that is durable."""
        if self.rn.raft.state != StateType.LEADER:
            return [], messages
        return [m for m in messages if m.type not in AFTER_WRITE], [m for m in messages if m.type in AFTER_WRITE]

    async def _handle(self, rd: Ready) -> None:
        if rd.hard_state is not None:
            self.term = rd.hard_state.term
        if rd.soft_state is not None:
            self._on_soft_state(rd.soft_state.lead, rd.soft_state.state)
        if rd.snapshot is not None:
            await self._install_snapshot(rd)
        if rd.soft_state is not None or rd.hard_state is not None:
            metrics.observe_leadership(leader=self.leader_id, term=self.term, me=self.id)
        early, late = self._split_sends(rd.messages)
        self._send(early)
        if rd.entries or (rd.hard_state is not None and rd.must_sync):
            metrics.observe_batch(len(rd.entries))
            if len(rd.entries) <= 1 and self.wal.syncs_fast:
                self.wal.save(rd.hard_state, rd.entries, rd.must_sync)  # no thread round trip
            else:
                await self._io(self.wal.save, rd.hard_state, rd.entries, rd.must_sync)
            if self._traced and rd.entries:
                self._stamp(stages.WAL_SYNCED, rd.entries[-1].index)
            if rd.entries:
                self.storage.append(rd.entries)
            if rd.hard_state is not None:
                self.storage.set_hard_state(rd.hard_state)
            failpoints.hit("raftAfterFsync")
        elif rd.hard_state is not None:
            # Only the commit index moved (a single node's commit follows every write): written
            # here, unsynced, without a round trip to the log thread. Nothing else writes the log
            # meanwhile (every log job is awaited by this task), and nothing waits for it to be
            # durable: a commit index promises nothing, Raft learns it again from the log.
            self.wal.save(rd.hard_state, [], False)
            self.storage.set_hard_state(rd.hard_state)
        self._send(late)
        if rd.committed_entries:
            if self._traced:
                self._stamp(stages.COMMITTED, rd.committed_entries[-1].index)
            self._to_apply.put_nowait(rd.committed_entries)
            if self._to_apply.qsize() >= MAX_APPLY_BACKLOG or any(
                    e.type == EntryType.CONF_CHANGE for e in rd.committed_entries):
                await self._to_apply.join()
        self._reads.answer(rd.read_states)
        self.rn.advance(rd)  # only now, with everything of this Ready durable
        metrics.observe_indexes(committed=self.storage.hard_state.commit, applied=self.applied_index)

    def _stamp(self, stage: int, upto: int) -> None:
        """Stamps ``stage`` on every traced proposal at or below log index ``upto`` not stamped yet."""
        t = stages.now()
        for index, trace in self._traced.items():
            if index <= upto and not trace[stage]:
                trace[stage] = t

    def _send(self, messages: list[Message]) -> None:
        for msg in messages:
            if msg.type == MessageType.MsgSnap:
                self._snapshots.send(msg)
            else:
                self.peers.send(msg)

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
        try:
            results, membership_changed = await self._on_apply_thread(self.fsm.apply, entries, self.term)
        except Exception as exc:
            raise ApplyError(exc) from exc
        for hook in self._applied_hooks:
            hook()
        removed_now = False
        for entry, (request_id, result) in zip(entries, results, strict=True):
            if entry.type == EntryType.CONF_CHANGE:
                cc = decode_conf_change(entry.data)
                self.conf_state = self.rn.apply_conf_change(cc)
                membership_changed = True
                if cc.type == ConfChangeType.REMOVE_NODE and cc.node_id != self.id:
                    self._removed_ids.add(cc.node_id)
                if cc.type == ConfChangeType.REMOVE_NODE and cc.node_id == self.id and not self.removed:
                    log.warning("this member was removed from the cluster; it stops")
                    self.removed = removed_now = True
            if request_id:
                self._waiters.answer(request_id, result)
        self.applied_index = max(self.applied_index, entries[-1].index)
        if self._traced:
            self._stamp(stages.APPLIED, entries[-1].index)
        for batch_hook in self._batch_hooks:
            batch_hook(entries, results)
        if membership_changed:
            for hook in self._membership_hooks:
                hook()
        self._waiters.applied(self.applied_index)
        if removed_now:
            for hook in self._removed_hooks:
                hook()

    def decided(self, index: int, results: list[tuple[int, Any]], membership_changed: bool) -> None:
        """On the apply thread (``StateMachine.on_decided``): a batch up to ``index`` is executed and
        about to commit; its callers are answered now, not after the state's own fsync. A batch
        that changed the membership is answered once applied (the core must see the change first)."""
        if self._event_loop is None or membership_changed:
            return
        if isinstance(self._apply_worker, ThreadWorker):  # shares the loop wake-up with the batch's result
            self._apply_worker.call_soon(self._event_loop, self._answer_decided, index, results)
        else:
            self._event_loop.call_soon_threadsafe(self._answer_decided, index, results)

    def _answer_decided(self, index: int, results: list[tuple[int, Any]]) -> None:
        if self._traced:
            self._stamp(stages.APPLIED, index)
        for request_id, result in results:
            if request_id:
                self._waiters.answer(request_id, result)
        self.decided_index = max(self.decided_index, index)

    async def caught_up(self) -> None:
        """Returns once every entry this node knows to be committed is applied: its state is then as
        new as any node's answer can be (a follower applies only what the leader told it committed,
        and an answered write is committed). ``settled`` asks less: only answered writes."""
        committed = self.rn.raft.log.committed
        if self.applied_index < committed:
            await self.wait_applied(committed)

    async def settled(self) -> None:
        """Returns once every batch whose callers were answered is applied, so what answers from
        the local state (serializable reads, maintenance) sees every answered write."""
        if self.decided_index > self.applied_index:
            await self.wait_applied(self.decided_index)

    def _on_soft_state(self, lead: int, state: StateType) -> None:
        if lead != self.leader_id:
            log.info("leader is now %x (term %d)", lead, self.term)
            self.leader_id = lead
            self._reads.fail_in_flight(EtcdError(Err.LEADER_CHANGED))
            if lead:
                for fut in self._leader_waiters:
                    if not fut.done():
                        fut.set_result(None)
                self._leader_waiters.clear()
            for hook in self._leader_hooks:
                hook(lead, self.term)

    # ---- snapshots ----
    async def _install_snapshot(self, rd: Ready) -> None:
        assert rd.snapshot is not None
        meta = rd.snapshot.metadata
        path = self._incoming.take(meta.index)
        await self._to_apply.join()
        store_index = await self._on_apply_thread(self.fsm.restore, path)
        failpoints.hit("raftMidSnapshotInstall")
        self.storage.apply_snapshot(rd.snapshot)
        hard_state = rd.hard_state or self.storage.hard_state
        await self._io(self.wal.checkpoint, meta, hard_state, [])
        self.conf_state = meta.conf_state
        self.applied_index = max(meta.index, self.applied_index)
        log.info("installed a snapshot at index %d (store at %d) from the leader", meta.index, store_index)
        for hook in self._membership_hooks:
            hook()
        self._waiters.applied(self.applied_index)

    def _snapshot_sent(self, peer_id: int, failed: bool) -> None:
        self.rn.report_snapshot(peer_id, failed=failed)
        self._wake.set()

    async def _maybe_snapshot(self) -> None:
        """Compacts the log once enough is applied: the state (synced) is the snapshot."""
        snap_index = self.storage.snapshot().metadata.index
        if self.applied_index - snap_index < self.snapshot_count:
            return
        index = self.applied_index
        await self._on_apply_thread(self.fsm.sync)
        snap = self.storage.create_snapshot(index, self.conf_state, b"")
        keep = self.storage.entries(index + 1, self.storage.last_index() + 1, 1 << 62)
        await self._io(self.wal.checkpoint, snap.metadata, self.storage.hard_state, keep)
        compact_to = index - self.catchup_entries
        if compact_to > self.storage.first_index():
            self.storage.compact(compact_to)
        log.info("snapshot at index %d; log compacted", index)

    # ---- the API the store service uses ----
    async def admit(self) -> None:
        """Returns once this node may log a request: a leader is known (waited for as
        ``_await_leader`` does) and apply is not too far behind the log (else etcd's back-pressure,
        `too many requests`). The API layer stamps the request after this, so its time is the
        time it is logged, then hands it to ``propose`` without awaiting anything in between."""
        await self._await_leader()
        if self.storage.hard_state.commit - self.applied_index > MAX_APPLY_LAG:
            raise EtcdError(Err.TOO_MANY_REQUESTS)

    async def propose(self, payload: bytes, request_id: int, trace: list[int] | None = None) -> Any:
        """Logs ``payload`` as it is (the API layer stamped it with ``request_id`` and its time);
        returns the apply stage's answer for the entry carrying ``request_id`` (or raises its
        error). The ID must be unique among this node's requests in flight (the API's generator;
        a ValueError, nothing logged, if it is not).
        ``trace``: a sampled request's stage trace (raftgate/stages.py), stamped on the way."""
        return await self._propose(request_id, lambda: self.rn.propose(payload), trace)

    async def propose_conf_change(self, cc: ConfChange, request_id: int) -> Any:
        """Logs a membership change whose context carries ``request_id`` (the API's)."""
        return await self._propose(request_id, lambda: self.rn.propose_conf_change(cc))

    async def _propose(self, request_id: int, put: Callable[[], None], trace: list[int] | None = None) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters.add(request_id, fut)
        leader = self.leader_id
        try:
            put()
        except ProposalDroppedError:
            self._waiters.discard(request_id)
            raise EtcdError(Err.NO_LEADER) from None
        metrics.observe_proposal()
        traced_at = 0
        if trace is not None:  # a leader appends a proposal to its log at once: this is its index
            traced_at = self.rn.raft.log.last_index()
            trace[stages.PROPOSED] = stages.now()
            self._traced[traced_at] = trace
        self._wake.set()
        try:
            result = await self._within_request_timeout(fut)
        except TimeoutError:
            raise EtcdError(Err.TIMEOUT_DUE_TO_LEADER_FAIL if self.leader_id != leader else Err.TIMEOUT) from None
        finally:
            self._waiters.discard(request_id)  # answered, timed out, or its caller went away
            if traced_at:
                self._traced.pop(traced_at, None)
        if isinstance(result, BaseException):
            raise result
        return result

    async def _within_request_timeout(self, fut: asyncio.Future[T]) -> T:
        """Awaits ``fut`` for at most the request timeout (then TimeoutError). A timer, not
        ``wait_for``: this is on the path of every request, and a timer costs a fraction."""
        timer = self.clock.call_later(self.request_timeout, _expire, fut)
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
        self._reads.add(fut)
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
        deadline = self.clock.monotonic() + 2 * self.election_seconds
        while not self.leader_id:
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                raise EtcdError(Err.NO_LEADER)
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._leader_waiters.append(fut)
            timer = self.clock.call_later(max(remaining, 0.001), _wake, fut)
            try:
                await fut
            finally:
                timer.cancel()

    async def wait_applied(self, index: int) -> None:
        if self.applied_index >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add_index(index, fut)
        try:
            await self._within_request_timeout(fut)
        except TimeoutError:
            raise EtcdError(Err.TIMEOUT) from None

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
