"""A deterministic simulation of a cluster of real RaftNodes (authstore/node/driver.py).

Each node is the driver that ships, built with in-memory stand-ins (fakes.py) for what it takes
by constructor: a WAL that loses unsynced writes on a crash, a network that drops, duplicates,
reorders and partitions, a manual clock, and workers whose jobs (WAL writes, apply batches,
state copies) run when the simulation says so. The state machine is the store's own Applier on a
temporary LMDB (``store=True``), or a small dict that loses what it applied since its last sync
on a crash (fakes.KVStateMachine). So the proof covers the driver's own order of
work: a leader sending before its own fsync, a follower answering only after its fsync, apply on
its own "thread" behind the log, batching, ReadIndex batching, snapshots sent and installed,
log compaction, crashes and restarts, partitions, leader transfers and membership changes.

All nodes share one asyncio loop. One *step* is one scheduler event (a message delivered, a
worker's next job run, one node's clock advanced by a tick, a client action, or a fault), after
which the loop runs until nothing is ready; everything comes from one seeded ``random.Random``,
so a seed replays exactly (``pytest tests/raft -k node_sim --sim-seed N``).

Checked: election safety and leader completeness (on each node touched), log matching (on every
WAL write), committed entries never change and state-machine safety (on every apply, and on
every commit index written), Raft's persistence rule (a vote granted or entries acknowledged are
durable in the sender's WAL when the message leaves), and at the end the clients' history for
linearizability.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import random
import tempfile
import traceback
from asyncio.events import _set_running_loop
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from authstore.api.proposer import Proposer
from authstore.node.driver import RaftNode
from authstore.raft import ConfChange, ConfChangeType, Entry, EntryType, MemoryStorage, Snapshot, StateType
from authstore.raft.codec import decode_conf_change, encode_conf_change
from authstore.raft.storage import CompactedError
from authstore.raft.types import HardState, Message, MessageType
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from protos.storepb import store_pb2 as spb
from raftgate.errors import EtcdError
from tests.support.linearizability import CAS, DELETE, GET, PUT, History, Op, check

from .fakes import FakeNetwork, FakeWAL, KVStateMachine, ManualClock, SimWorker
from .sim import SafetyViolation

LEADER = StateType.LEADER
TICK = 0.1


class StoreStateMachine:
    """The store's Applier on a temporary LMDB, as fsm.StateMachine, with the simulation's apply
    check in front. LMDB commits are synced, so a crash loses nothing applied; it reopens the store."""

    def __init__(self, node_id: int, path: Path, on_apply: Any) -> None:
        self.node_id = node_id
        self.path = path
        self.on_apply = on_apply
        self.applier = Applier(Backend(path, map_size=64 << 20), member_id=node_id)

    def apply(self, entries: list[Entry], term: int) -> tuple[list[tuple[int, Any]], bool]:
        applied = self.applier.applied_index()
        for e in entries:
            if e.index > applied:
                if e.index != applied + 1:
                    raise AssertionError(f"node {self.node_id} applies {e.index} after {applied}")
                self.on_apply(self.node_id, e)
                applied = e.index
        return self.applier.apply(entries, term)

    def on_decided(self, fn: Any) -> None:
        self.applier.on_decided(fn)

    def snapshot(self, directory: Path) -> Path:
        return self.applier.snapshot(directory)

    def restore(self, path: Path) -> int:
        return self.applier.restore(path)

    def sync(self) -> None:
        self.applier.sync()

    def read(self, key: str) -> int | None:
        with self.applier.env.begin() as txn:
            kvs = self.applier.kv.range(txn, pb.RangeRequest(key=key.encode())).kvs
        return int(kvs[0].value) if kvs else None

    def crash(self, _rng: random.Random) -> None:
        """Reopens the store: a new Applier, with no hooks (the restarted node registers again)."""
        self.applier.backend.close()
        self.applier = Applier(Backend(self.path, map_size=64 << 20), member_id=self.node_id)

    def close(self) -> None:
        self.applier.backend.close()


def _store_output(resp: Any) -> Any:
    """What the linearizability model expects of the store's response to a write."""
    if isinstance(resp, pb.DeleteRangeResponse):
        return resp.deleted > 0
    if isinstance(resp, pb.TxnResponse):
        return resp.succeeded
    return None


@dataclass
class NodeSimConfig:
    nodes: int = 3
    steps: int = 20_000
    drop: float = 0.03
    duplicate: float = 0.02
    #: chance that a worker job (a WAL write, an apply batch) runs at once rather than steps later
    immediate: float = 0.5
    #: chance that an apply batch returns a step after it was decided (its commit takes a while):
    #: its callers are answered early (StateMachine.on_decided), before the node counts it applied
    hold_apply: float = 0.5
    clients: int = 4
    keys: int = 3
    conf_changes: bool = True
    #: the driver's own compaction: small, so snapshots are taken, sent and installed often
    snapshot_count: int = 40
    catchup_entries: int = 8
    #: chance that a step is a fault (partition, heal, crash, restart, conf change, transfer)
    fault_rate: float = 0.004
    #: check Raft's persistence rule on every message sent (off: only the end-to-end properties)
    check_persistence: bool = True
    #: the store's own state machine (authstore/state/apply.py's Applier on LMDB) instead of a dict
    store: bool = False
    #: the log syncs fast: the driver writes a Ready of one entry on the loop, not on the log worker
    fast_log: bool = False


@dataclass(eq=False)
class Member:
    id: int
    wal: FakeWAL
    fsm: KVStateMachine
    snap_dir: Path
    clock: ManualClock = field(default_factory=ManualClock)
    node: RaftNode | None = None
    #: the API's side of the node's proposals (request IDs and time), one per incarnation as in the store
    proposer: Proposer | None = None
    workers: list[SimWorker] = field(default_factory=list)
    clients: dict[asyncio.Task[None], None] = field(default_factory=dict)
    checked_commit: int = 0
    leader_term: int = 0
    decommissioned: bool = False


class NodeSimulation:
    def __init__(self, seed: int, cfg: NodeSimConfig, workdir: Path | None = None) -> None:
        self.seed = seed
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.step_no = 0
        shm = "/dev/shm" if cfg.store and Path("/dev/shm").is_dir() else None  # LMDB syncs each commit
        self._tmp = None if workdir is not None else tempfile.TemporaryDirectory(prefix="node-sim-", dir=shm)
        self.workdir = workdir if workdir is not None else Path(self._tmp.name)  # type: ignore[union-attr]
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._loop_error)
        self.errors: list[str] = []
        self.violation: SafetyViolation | None = None  # the first one, wherever it was raised
        self._touched: Member | None = None
        self.net = FakeNetwork(self.rng, cfg.drop, cfg.duplicate)
        self.net.on_send = self._on_send
        self.runnable: dict[SimWorker, None] = {}
        self.members: dict[int, Member] = {}
        self.history = History()
        self.writes: list[tuple[Op, int]] = []  # every write proposed, with its request's uid
        self.applied_uids: set[int] = set()  # the uids of writes some node applied
        self.busy = [False] * cfg.clients
        self.next_uid = 1
        self.next_node_id = cfg.nodes + 1
        self.leaders: dict[int, int] = {}  # term -> leader id
        self.committed: dict[int, tuple[int, int, bytes]] = {}  # index -> (term, type, data)
        self.max_committed = 0
        self.entry_ids: dict[tuple[int, int], tuple[int, int, bytes]] = {}  # (index, term) -> (prev term, type, data)
        self.trace: deque[tuple[Any, ...]] = deque(maxlen=60)
        self.stats = {"elections": 0, "crashes": 0, "conf_changes": 0, "transfers": 0, "applied": 0,
                      "early_answers": 0}
        self.chaos = True
        self.restarts: list[tuple[int, Member]] = []
        ids = list(range(1, cfg.nodes + 1))
        boot = [Entry(1, i + 1, EntryType.CONF_CHANGE, encode_conf_change(ConfChange(ConfChangeType.ADD_NODE, v)))
                for i, v in enumerate(ids)]
        for mid in ids:
            m = self._member(mid)
            m.wal.save(HardState(term=1, vote=0, commit=len(boot)), boot)  # as a new store's first entries
        for mid in ids:
            self._run_soon(self._start, self.members[mid])

    # --- the loop -----------------------------------------------------------------------------
    def _loop_error(self, _loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        text = "".join(traceback.format_exception(exc)) if exc else context.get("message", "")
        self.errors.append(str(text))

    def _fail_stop(self) -> Any:
        """The driver's fail-stop (it could not persist or apply): in the simulation, a failure."""
        self.errors.append("the driver stopped (fail-stop):\n" + traceback.format_exc())
        raise SafetyViolation("fail-stop")

    def settle(self) -> None:
        """Runs the loop until nothing is ready (it has no timers: all time is the members' clocks).

        The loop is stepped by hand (``_run_once``, the running loop set around it): a step costs
        a fraction of a ``run_forever`` round, and the simulation is mostly loop rounds."""
        loop = self.loop
        ready = loop._ready  # type: ignore[attr-defined]
        _set_running_loop(loop)
        try:
            while ready:
                loop._run_once()  # type: ignore[attr-defined]
        finally:
            _set_running_loop(None)
        if self.violation is not None:
            raise self.violation
        if self.errors:
            self.fail("an error inside the driver or the simulation:\n" + self.errors[0])

    def _run_soon(self, fn: Any, *args: Any) -> None:
        """Runs ``fn`` inside the loop (it may create tasks), then settles."""
        _set_running_loop(self.loop)
        try:
            fn(*args)
        finally:
            _set_running_loop(None)
        self.settle()

    def close(self) -> None:
        """Stops every node (as crashes) and closes the loop; a violation already raised is not raised again."""
        for m in self.members.values():
            if m.node is not None:
                self._kill(m)
        self.violation, self.errors = None, []
        with contextlib.suppress(SafetyViolation):
            self.settle()
        self.loop.close()
        if self.cfg.store:
            for m in self.members.values():
                m.fsm.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    # --- members ------------------------------------------------------------------------------
    def _member(self, mid: int) -> Member:
        fsm: Any = (StoreStateMachine(mid, self.workdir / f"store{mid}", self._on_apply) if self.cfg.store
                    else KVStateMachine(mid, self._on_apply))
        m = Member(mid, FakeWAL(self._on_save, self._on_durable_commit, syncs_fast=self.cfg.fast_log), fsm,
                   self.workdir / f"n{mid}")
        self.members[mid] = m
        return m

    def _start(self, m: Member) -> None:
        st = m.wal.durable
        storage = MemoryStorage()
        if st.snapshot.index:
            storage.apply_snapshot(Snapshot(b"", st.snapshot))
        if st.entries:
            storage.append(st.entries)
        storage.set_hard_state(st.hard_state)
        rng = self.rng
        m.workers = [SimWorker(f"{m.id}/{name}", rng, self.cfg.immediate, self.runnable,
                               hold=self.cfg.hold_apply if name == "apply" else 0.0)
                     for name in ("log", "apply", "copy")]
        node_rng = random.Random(rng.getrandbits(32))
        node = RaftNode(m.id, storage, m.wal, m.fsm, self.net.peers(m.id, m.snap_dir),
                        applied=st.snapshot.index,
                        snapshot_dir=m.snap_dir, tick_seconds=TICK, election_ticks=10, request_timeout=7.0,
                        snapshot_count=self.cfg.snapshot_count, catchup_entries=self.cfg.catchup_entries,
                        clock=m.clock, log_worker=m.workers[0], apply_worker=m.workers[1], copy_worker=m.workers[2],
                        rng=node_rng, fail_stop=self._fail_stop)
        m.node = node
        # the IDs' seed from the node's generator, drawn after the node's own draws (as the node
        # drew it before the API layer picked IDs: a seed replays the same run as then)
        m.proposer = Proposer(node, wall_ms=m.clock.wall_ms, rng=node_rng)
        m.checked_commit = st.snapshot.index
        m.leader_term = 0
        node.start()

    def _kill(self, m: Member) -> None:
        """The process dies: its tasks and pending work vanish, unsynced writes are lost."""
        node = m.node
        assert node is not None
        m.node = m.proposer = None
        node.crash()
        for worker in m.workers:
            worker.kill()
        for task in list(m.clients):
            task.cancel()
        self.net.down(m.id)
        m.wal.crash(self.rng)
        m.fsm.crash(self.rng)
        m.clock.clear()

    def _crash(self, m: Member) -> None:
        self._kill(m)
        self.stats["crashes"] += 1
        self.trace.append((self.step_no, "crash", m.id))

    def _restart(self, m: Member) -> None:
        if m.node is None and not m.decommissioned:
            self._start(m)
            self.trace.append((self.step_no, "restart", m.id))

    def _decommission(self, mid: int) -> None:
        m = self.members.get(mid)
        if m is None or m.decommissioned:
            return
        m.decommissioned = True
        if m.node is not None:
            self._kill(m)
        self.trace.append((self.step_no, "decommission", mid))

    # --- safety checks ------------------------------------------------------------------------
    def fail(self, what: str) -> None:
        lines = [f"SAFETY VIOLATION at step {self.step_no} (seed {self.seed}, {self.cfg}): {what}", "last events:"]
        lines += [f"  {ev}" for ev in self.trace]
        lines.append(f"replay: pytest tests/raft -k node_sim --sim-seed {self.seed}")
        violation = SafetyViolation("\n".join(lines))
        if self.violation is None:
            self.violation = violation
        raise violation

    def _record_committed(self, index: int, rec: tuple[int, int, bytes], observer_term: int) -> None:
        old = self.committed.get(index)
        if old is None:
            self.committed[index] = rec
            if index > self.max_committed:
                self.max_committed = index
            for other in self.members.values():  # leader completeness: later-term leaders hold it
                node = other.node
                if node is not None and node.rn.raft.state == LEADER and node.rn.raft.term > observer_term:
                    self._check_has(other, index, rec, "a later-term leader lacks a committed entry")
        elif old != rec:
            self.fail(f"committed entry {index} changed: {old} -> {rec}")

    def _check_has(self, m: Member, index: int, rec: tuple[int, int, bytes], what: str) -> None:
        log = m.node.rn.raft.log  # type: ignore[union-attr]
        if index < log.first_index() - 1:
            return  # compacted into a snapshot, which only holds applied (committed) state
        try:
            t = log.term(index)
        except CompactedError:
            return
        if t != rec[0]:
            self.fail(f"{what}: node {m.id} has term {t} at {index}, committed term {rec[0]}")

    def _check_member(self, m: Member) -> None:
        node = m.node
        if node is None:
            return
        r = node.rn.raft
        if r.state == LEADER and m.leader_term != r.term:
            m.leader_term = r.term
            self.stats["elections"] += 1
            self.trace.append((self.step_no, "leader", m.id, r.term))
            other = self.leaders.setdefault(r.term, m.id)
            if other != m.id:
                self.fail(f"two leaders in term {r.term}: {other} and {m.id}")
            if self.max_committed:
                self._check_has(m, self.max_committed, self.committed[self.max_committed],
                                "new leader lacks a committed entry")
                if r.log.last_index() < self.max_committed:
                    self.fail(f"new leader {m.id} log ends at {r.log.last_index()} < committed {self.max_committed}")

    def _on_send(self, msg: Message) -> None:
        """Raft's persistence rule, as each message leaves: a vote granted, or entries acknowledged,
        must already be durable in the sender's WAL (a crash must not make it take them back)."""
        if msg.reject or msg.type not in (MessageType.MsgAppResp, MessageType.MsgVoteResp):
            return
        if not self.cfg.check_persistence:
            return
        d = self.members[msg.frm].wal.durable
        if msg.type == MessageType.MsgVoteResp:
            if (d.hard_state.term, d.hard_state.vote) != (msg.term, msg.to):
                self.fail(f"node {msg.frm} grants its vote in term {msg.term} to {msg.to} before that vote is "
                          f"durable (its WAL holds term {d.hard_state.term}, vote {d.hard_state.vote})")
            return
        last = d.entries[-1].index if d.entries else d.snapshot.index
        if msg.index > last:
            self.fail(f"node {msg.frm} acknowledges entries up to {msg.index} while its WAL holds {last} durably")

    def _on_save(self, wal: FakeWAL, entries: list[Entry]) -> None:
        """Log matching, on every WAL write: one (index, term) is one entry with one predecessor."""
        prev_term = wal.view.term_at(entries[0].index - 1)
        ids = self.entry_ids
        for e in entries:
            rec = (prev_term, e.type, e.data)
            key = (e.index, e.term)
            old = ids.get(key)
            if old is None:
                ids[key] = rec
            elif old != rec:
                if old[1:] != rec[1:] or (old[0] >= 0 and prev_term >= 0):
                    self.fail(f"log matching: entry {key} written as {rec}, elsewhere {old}")
                if old[0] < 0:
                    ids[key] = rec
            if e.index <= wal.view.hard_state.commit:
                c = self.committed.get(e.index)
                if c is not None and c != (e.term, e.type, e.data):
                    self.fail(f"a node overwrites its committed entry {e.index} ({c}) with {e!r}")
            prev_term = e.term

    def _on_durable_commit(self, wal: FakeWAL, old: int, hs: HardState) -> None:
        """A commit index a node wrote: the entries up to it (in its log) are committed."""
        view = wal.view
        for e in view.entries[max(old, view.snapshot.index) - view.snapshot.index:
                              hs.commit - view.snapshot.index]:
            self._record_committed(e.index, (e.term, e.type, e.data), hs.term)

    def _on_apply(self, mid: int, e: Entry) -> None:
        """State-machine safety, on every apply: an index is applied as one entry everywhere."""
        self.stats["applied"] += 1
        rec = (e.term, e.type, e.data)
        old = self.committed.get(e.index)
        if old is None:
            m = self.members[mid]
            self._record_committed(e.index, rec, m.node.rn.raft.term if m.node is not None else 0)
        elif old != rec:
            self.fail(f"state machine safety: node {mid} applies {rec} at {e.index}, others applied {old}")
        if e.type == EntryType.CONF_CHANGE:
            cc = decode_conf_change(e.data)
            if cc.type == ConfChangeType.REMOVE_NODE and cc.node_id != mid:
                self.loop.call_soon(self._decommission, cc.node_id)
        elif e.data:
            self.applied_uids.add(ipb.InternalRaftRequest.FromString(e.data).header.ID)

    # --- clients ------------------------------------------------------------------------------
    def _client_action(self) -> None:
        rng = self.rng
        idle = [c for c, busy in enumerate(self.busy) if not busy]
        alive = [m for m in self.members.values() if m.node is not None]
        if not idle or not alive:
            return
        client = rng.choice(idle)
        leaders = [m for m in alive if m.node.is_leader]  # type: ignore[union-attr]
        m = rng.choice(leaders) if leaders and rng.random() < 0.6 else rng.choice(alive)
        key = f"k{rng.randrange(self.cfg.keys)}"
        uid = self.next_uid
        self.next_uid += 1
        r = rng.random()
        if r < 0.35:
            op = self.history.invoke(client, GET, key)
        elif r < 0.7:
            op = self.history.invoke(client, PUT, key, uid)
        elif r < 0.8:
            op = self.history.invoke(client, DELETE, key)
        else:
            expected = rng.choice([None, *self._values(m)])
            op = self.history.invoke(client, CAS, key, (expected, uid))
        self.busy[client] = True
        task = self.loop.create_task(self._client(client, op, m, uid))
        m.clients[task] = None
        task.add_done_callback(lambda t: m.clients.pop(t, None))
        self.trace.append((self.step_no, "client", m.id, op.kind, key))

    def _values(self, m: Member) -> list[int]:
        """Values the member holds now (a CAS often expects one of them)."""
        if not self.cfg.store:
            return list(m.fsm.kv.values())
        return [v for v in (m.fsm.read(f"k{i}") for i in range(self.cfg.keys)) if v is not None]

    def _request(self, op: Op, uid: int) -> bytes:
        """A write as the store's request; header.ID carries the uid (so the check knows it was applied)."""
        key = str(op.key).encode()
        req = ipb.InternalRaftRequest(header=ipb.RequestHeader(ID=uid))
        if not self.cfg.store:
            req.put.CopyFrom(pb.PutRequest(key=key, value=pickle.dumps((op.kind, op.arg))))
        elif op.kind == PUT:
            req.put.CopyFrom(pb.PutRequest(key=key, value=str(op.arg).encode()))
        elif op.kind == DELETE:
            req.delete_range.CopyFrom(pb.DeleteRangeRequest(key=key))
        else:
            expected, new = op.arg
            cmp = (pb.Compare(key=key, target=pb.Compare.VERSION, result=pb.Compare.EQUAL, version=0)
                   if expected is None else
                   pb.Compare(key=key, target=pb.Compare.VALUE, result=pb.Compare.EQUAL, value=str(expected).encode()))
            then = (pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key)) if new is None
                    else pb.RequestOp(request_put=pb.PutRequest(key=key, value=str(new).encode())))
            req.txn.CopyFrom(pb.TxnRequest(compare=[cmp], success=[then]))
        return req.SerializeToString()

    async def _client(self, client: int, op: Op, m: Member, uid: int) -> None:
        """As the store's service: reads at a ReadIndex once applied; writes on the leader only."""
        node, proposer = m.node, m.proposer
        assert node is not None and proposer is not None
        try:
            if op.kind == GET:
                try:
                    await node.wait_applied(await node.read_index())
                except EtcdError:
                    self.history.timeout(op)
                    return
                self.history.ok(op, m.fsm.read(op.key) if self.cfg.store else m.fsm.kv.get(op.key))
                return
            try:
                await node.must_lead()
            except EtcdError:
                self.history.fail(op)  # never proposed
                return
            self.writes.append((op, uid))
            try:
                result = await proposer.propose(self._request(op, uid))
            except EtcdError:
                self.history.timeout(op)  # perhaps applied, perhaps not
                return
            if node.decided_index > node.applied_index:
                self.stats["early_answers"] += 1  # answered once decided, before its batch returned
            if self.cfg.store:
                result = _store_output(result)
            self.history.ok(op, result)
        except asyncio.CancelledError:
            if op.status == "pending":
                self.history.timeout(op)  # the node crashed under it
        finally:
            self.busy[client] = False

    # --- faults -------------------------------------------------------------------------------
    def _fault(self) -> None:
        rng = self.rng
        r = rng.random()
        live = [m for m in self.members.values() if not m.decommissioned]
        alive = [m for m in live if m.node is not None]
        down = [m for m in live if m.node is None]
        if r < 0.15:
            ids = [m.id for m in live]
            rng.shuffle(ids)
            k = rng.randrange(1, len(ids)) if len(ids) > 1 else 1
            a, b = set(ids[:k]), set(ids[k:])
            self.net.cut = {(x, y) for x in a for y in b} | {(y, x) for x in a for y in b}
            self.trace.append((self.step_no, "partition", sorted(a), sorted(b)))
        elif r < 0.35:
            self.net.cut = set()
            self.trace.append((self.step_no, "heal"))
        elif r < 0.55:
            if alive and len(down) < (len(live) + 1) // 2:
                # most often a node with a WAL write not yet done: the crash that tests the driver's order
                writing = [m for m in alive if m.workers[0].jobs]
                m = rng.choice(writing if writing and rng.random() < 0.7 else alive)
                self._crash(m)
                self.restarts.append((self.step_no + rng.randrange(10, 3000), m))
        elif r < 0.7:
            if down:
                self._restart(rng.choice(down))
        elif r < 0.85:
            leaders = [m for m in alive if m.node.is_leader]  # type: ignore[union-attr]
            if leaders:
                m = leaders[-1]
                voters = m.node.conf_state.voters  # type: ignore[union-attr]
                if len(voters) > 1:
                    to = rng.choice(voters)
                    m.node.transfer_leader(to)  # type: ignore[union-attr]
                    self.stats["transfers"] += 1
                    self.trace.append((self.step_no, "transfer", m.id, to))
        elif self.cfg.conf_changes:
            self._conf_change(alive)

    def _conf_change(self, alive: list[Member]) -> None:
        leaders = [m for m in alive if m.node.is_leader]  # type: ignore[union-attr]
        if not leaders:
            return
        leader = leaders[-1]
        node = leader.node
        assert node is not None
        conf = node.conf_state
        if conf.learners:
            cc = ConfChange(ConfChangeType.ADD_NODE, conf.learners[0])
        elif len(conf.voters) >= self.cfg.nodes:
            cc = ConfChange(ConfChangeType.REMOVE_NODE, self.rng.choice(conf.voters))
        else:
            members = set(conf.voters) | set(conf.learners)
            spare = [m.id for m in self.members.values() if not m.decommissioned and m.id not in members]
            if spare:
                nid = spare[0]
            else:
                nid = self.next_node_id
                self.next_node_id += 1
                self._start(self._member(nid))
            cc = ConfChange(ConfChangeType.ADD_LEARNER_NODE, nid)
        assert leader.proposer is not None
        rid = leader.proposer.new_id()
        cc = ConfChange(cc.type, cc.node_id, spb.MemberContext(request_id=rid).SerializeToString())
        self.stats["conf_changes"] += 1
        self.trace.append((self.step_no, "conf", leader.id, cc.type.name, cc.node_id))
        task = self.loop.create_task(self._propose_conf_change(node, cc, rid))
        leader.clients[task] = None
        task.add_done_callback(lambda t: leader.clients.pop(t, None))

    @staticmethod
    async def _propose_conf_change(node: RaftNode, cc: ConfChange, rid: int) -> None:
        with contextlib.suppress(EtcdError, asyncio.CancelledError):
            await node.propose_conf_change(cc, rid)

    # --- main loop ----------------------------------------------------------------------------
    def _step(self) -> None:
        rng = self.rng
        r = rng.random()
        touched: Member | None = None
        if self.net.in_flight and r < 0.55:
            m = self.net.deliver_one()
            if m is not None:
                self.trace.append((self.step_no, "deliver", m))
                touched = self.members.get(m.to)
        elif r < 0.7:
            if self.runnable:
                worker = rng.choice(list(self.runnable))
                worker.run_next()
                touched = self.members.get(int(worker.name.split("/")[0]))
        elif r < 0.82:
            alive = [m for m in self.members.values() if m.node is not None]
            if alive:
                touched = rng.choice(alive)
                touched.clock.advance(TICK)
        elif r < 0.997 - self.cfg.fault_rate:
            self._client_action()
        elif r < 0.997 and self.chaos:
            self._fault()
        self._touched = touched

    def run(self) -> None:
        cfg = self.cfg
        phase_len = 4000
        for step in range(cfg.steps):
            self.step_no = step
            if step % phase_len == 0:
                # chaos, then a calm period in which the cluster can recover
                self.chaos = (step // phase_len) % 3 != 2
                if not self.chaos:
                    self.net.cut = set()
                    for m in list(self.members.values()):
                        self._run_soon(self._restart, m)
            if self.restarts and step & 15 == 0:
                due = [m for t, m in self.restarts if t <= step]
                self.restarts = [(t, m) for t, m in self.restarts if t > step]
                for m in due:
                    self._run_soon(self._restart, m)
            self._touched = None
            self._run_soon(self._step)
            if self._touched is not None:
                self._check_member(self._touched)
            if step & 63 == 0:
                for m in self.members.values():
                    self._check_member(m)
        self.history.close()

    def check_history(self) -> None:
        # A write whose outcome its client never learned, and which no node ever applied, had no
        # effect anything observed (reads see applied state only): it is dropped from the search,
        # which otherwise tries it at every point after its invocation.
        for op, uid in self.writes:
            if op.status == "timeout" and uid not in self.applied_uids:
                op.status = "fail"
        res = check(self.history.ops)
        if not res.ok:
            raise SafetyViolation(f"seed {self.seed}: history not linearizable\n{res.describe()}\n"
                                  f"replay: pytest tests/raft -k node_sim --sim-seed {self.seed}")

    def completed_ops(self) -> int:
        return sum(1 for op in self.history.ops if op.status == "ok")
