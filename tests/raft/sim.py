"""A deterministic simulation of a Raft cluster: RawNodes, a hostile network, crashes, clients.

Everything is driven by one seeded ``random.Random``, so a seed replays exactly. One *step* is one
event: a message delivered, a node ticked, a node's pending fsync completed, a client action, or a
fault (partition, heal, crash, restart, compaction, membership change, leadership transfer).

Persistence is modelled the way the real driver does it: a node takes a Ready, and only when its
"fsync" completes (at once or several steps later) are the entries / hard state / snapshot written
to its MemoryStorage, its messages sent and its committed entries applied; a leader sends its
messages when it takes the Ready, but for acknowledgements and votes (driver.AFTER_WRITE). A crash discards the
RawNode, the pending Ready and the state machine; a restart rebuilds from storage alone.

After every step the Raft safety properties are checked incrementally (election safety, log
matching, leader completeness, state machine safety, committed entries never change), and at the
end the clients' history is checked for linearizability.
"""

from __future__ import annotations

import pickle
import random
from collections import deque
from dataclasses import dataclass

from authstore.node.driver import AFTER_WRITE
from authstore.raft import (
    CompactedError,
    ConfChange,
    ConfChangeType,
    Config,
    ConfState,
    Entry,
    EntryType,
    MemoryStorage,
    Message,
    MessageType,
    ProposalDroppedError,
    RawNode,
    Ready,
    StateType,
    bootstrap,
)
from authstore.raft.codec import decode_conf_change
from tests.support.linearizability import CAS, DELETE, GET, PUT, History, Op, check

LEADER = StateType.LEADER
MsgSnap = MessageType.MsgSnap


class SafetyViolation(AssertionError):
    pass


@dataclass
class SimConfig:
    nodes: int = 3
    steps: int = 20_000
    check_quorum: bool = True
    pre_vote: bool = True
    drop: float = 0.03
    duplicate: float = 0.02
    #: chance that a node fsyncs right after taking a Ready (otherwise it lags a few steps)
    immediate_sync: float = 0.6
    clients: int = 4
    keys: int = 3
    op_timeout: int = 1500
    conf_changes: bool = True
    max_inflight: int = 4
    max_size_per_msg: int = 512
    #: chance that a step is a fault (partition, heal, crash, restart, compaction, conf change, transfer)
    fault_rate: float = 0.004


class SimNode:
    __slots__ = ("id", "storage", "rn", "pending", "kv", "seen", "applied", "conf", "proposals", "reads",
                 "waiting_reads", "checked_commit", "leader_term", "decommissioned", "incarnation")

    def __init__(self, id: int) -> None:
        self.id = id
        self.storage = MemoryStorage()
        self.rn: RawNode | None = None
        self.pending: Ready | None = None
        self.kv: dict[str, int] = {}
        self.seen: set[int] = set()
        self.applied = 0
        self.conf = ConfState()
        self.proposals: dict[int, Op] = {}
        self.reads: dict[bytes, Op] = {}
        self.waiting_reads: list[tuple[int, Op]] = []
        self.checked_commit = 0
        self.leader_term = 0
        self.decommissioned = False
        self.incarnation = 0


class Simulation:
    def __init__(self, seed: int, cfg: SimConfig) -> None:
        self.seed = seed
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.step_no = 0
        self.nodes: dict[int, SimNode] = {}
        self.net: list[Message] = []
        self.cut: set[tuple[int, int]] = set()
        self.history = History()
        self.client_ops: list[tuple[Op, int, int] | None] = [None] * cfg.clients  # (op, node, deadline)
        self.next_uid = 1
        self.next_node_id = cfg.nodes + 1
        # safety bookkeeping
        self.leaders: dict[int, int] = {}  # term -> leader id
        self.committed: dict[int, tuple[int, int, bytes]] = {}  # index -> (term, type, data)
        self.max_committed = 0
        self.entry_ids: dict[tuple[int, int], tuple[int, int, bytes]] = {}  # (index, term) -> (prev term, type, data)
        self.trace: deque[tuple] = deque(maxlen=60)
        self.stats = {"delivered": 0, "dropped": 0, "elections": 0, "crashes": 0, "snapshots_sent": 0,
                      "conf_changes": 0, "compactions": 0, "transfers": 0}
        self.chaos = True
        self.restarts: list[tuple[int, SimNode]] = []
        ids = list(range(1, cfg.nodes + 1))
        for id in ids:
            node = self.nodes[id] = SimNode(id)
            bootstrap(node.storage, ids)
            self._start(node)

    # --- node lifecycle ---------------------------------------------------------------------
    def _start(self, node: SimNode) -> None:
        snap = node.storage.snapshot()
        cfg = self.cfg
        node.rn = RawNode(Config(
            id=node.id, storage=node.storage, applied=snap.metadata.index, election_tick=10, heartbeat_tick=1,
            check_quorum=cfg.check_quorum, pre_vote=cfg.pre_vote, rng=random.Random(self.rng.getrandbits(32)),
            max_inflight_msgs=cfg.max_inflight, max_size_per_msg=cfg.max_size_per_msg))
        node.incarnation += 1
        if snap.data:
            node.kv, seen = pickle.loads(snap.data)
            node.seen = set(seen)
        else:
            node.kv, node.seen = {}, set()
        node.applied = snap.metadata.index
        node.conf = snap.metadata.conf_state
        node.checked_commit = snap.metadata.index
        node.leader_term = 0
        node.pending = None

    def _due_restarts(self) -> None:
        due = [(t, n) for t, n in self.restarts if t <= self.step_no]
        if not due:
            return
        self.restarts = [(t, n) for t, n in self.restarts if t > self.step_no]
        for _, n in due:
            if n.rn is None and not n.decommissioned:
                self._start(n)
                self.trace.append((self.step_no, "restart", n.id))
                self._pump(n)

    def _crash(self, node: SimNode) -> None:
        node.rn = None
        node.pending = None  # never fsync'd: lost
        for op in node.proposals.values():
            self._client_timeout(op)
        for op in node.reads.values():
            self._client_timeout(op)
        for _, op in node.waiting_reads:
            self._client_timeout(op)
        node.proposals, node.reads, node.waiting_reads = {}, {}, []
        self.stats["crashes"] += 1

    # --- safety checks ----------------------------------------------------------------------
    def fail(self, what: str) -> None:
        lines = [f"SAFETY VIOLATION at step {self.step_no} (seed {self.seed}, {self.cfg}): {what}",
                 "last events:"]
        lines += [f"  {ev}" for ev in self.trace]
        lines.append(f"replay: pytest tests/raft -k sim --sim-seed {self.seed}")
        raise SafetyViolation("\n".join(lines))

    def _record_committed(self, index: int, rec: tuple[int, int, bytes], observer_term: int) -> None:
        old = self.committed.get(index)
        if old is None:
            self.committed[index] = rec
            if index > self.max_committed:
                self.max_committed = index
            # leader completeness: leaders of later terms must already hold it
            for other in self.nodes.values():
                rn = other.rn
                if rn is not None and rn.raft.state == LEADER and rn.raft.term > observer_term:
                    self._check_has(other, index, rec, "a later-term leader lacks a committed entry")
        elif old != rec:
            self.fail(f"committed entry {index} changed: {old} -> {rec}")

    def _check_has(self, node: SimNode, index: int, rec: tuple[int, int, bytes], what: str) -> None:
        log = node.rn.raft.log  # type: ignore[union-attr]
        if index < log.first_index() - 1:
            return  # compacted into a snapshot, which only holds applied (committed) state
        try:
            t = log.term(index)
        except CompactedError:
            return
        if t != rec[0]:
            self.fail(f"{what}: node {node.id} has term {t} at {index}, committed term {rec[0]}")

    def _check_node(self, node: SimNode) -> None:
        rn = node.rn
        if rn is None:
            return
        r = rn.raft
        if r.state == LEADER and node.leader_term != r.term:
            node.leader_term = r.term
            self.stats["elections"] += 1
            other = self.leaders.setdefault(r.term, node.id)
            if other != node.id:
                self.fail(f"two leaders in term {r.term}: {other} and {node.id}")
            if self.max_committed:
                self._check_has(node, self.max_committed, self.committed[self.max_committed],
                                "new leader lacks a committed entry")
                if r.log.last_index() < self.max_committed:
                    self.fail(f"new leader {node.id} log ends at {r.log.last_index()} < committed {self.max_committed}")
        log = r.log
        c = log.committed
        if c > node.checked_commit:
            lo = max(node.checked_commit + 1, log.first_index())
            if lo <= c:
                for e in log.slice(lo, c + 1, 1 << 62):
                    self._record_committed(e.index, (e.term, e.type, e.data), r.term)
            node.checked_commit = c

    def _check_ready_entries(self, node: SimNode, rd: Ready) -> None:
        log = node.rn.raft.log  # type: ignore[union-attr]
        prev_term = -1
        committed = self.committed
        ids = self.entry_ids
        for e in rd.entries:
            if prev_term < 0:
                try:
                    prev_term = log.term(e.index - 1)
                except CompactedError:
                    prev_term = -1
            rec = (prev_term, e.type, e.data)
            key = (e.index, e.term)
            old = ids.get(key)
            if old is None:
                ids[key] = rec
            elif old != rec:
                # same (index, term) must mean same entry with the same predecessor term, which by
                # induction makes the whole prefixes equal (Log Matching)
                if old[1:] != rec[1:] or (old[0] >= 0 and prev_term >= 0):
                    self.fail(f"log matching: entry {key} on node {node.id} is {rec}, elsewhere {old}")
                if old[0] < 0:
                    ids[key] = rec
            # (a stale leader may well persist an entry at an index committed elsewhere; what must
            # never happen is a change below the node's own commit index)
            if e.index <= log.committed:
                c = committed.get(e.index)
                if c is not None and c != (e.term, e.type, e.data):
                    self.fail(f"node {node.id} persists {e!r} over its committed {c}")
            prev_term = e.term

    # --- driving nodes ----------------------------------------------------------------------
    def _pump(self, node: SimNode) -> None:
        """Takes the node's next Ready (if none is pending) and maybe fsyncs it right away."""
        for _ in range(8):
            rn = node.rn
            if rn is None or node.pending is not None:
                return
            rd = rn.ready()
            if rd is None:
                return
            if rd.entries:
                self._check_ready_entries(node, rd)
            if rn.raft.state == LEADER:
                # as the driver: a leader sends before its fsync, all but what promises that fsync
                self._send(rn, [m for m in rd.messages if m.type not in AFTER_WRITE])
                rd.messages = [m for m in rd.messages if m.type in AFTER_WRITE]
            node.pending = rd
            if self.rng.random() >= self.cfg.immediate_sync:
                return
            self._fsync(node)

    def _fsync(self, node: SimNode) -> None:
        rd = node.pending
        rn = node.rn
        assert rd is not None and rn is not None
        node.pending = None
        st = node.storage
        if rd.snapshot is not None:
            st.apply_snapshot(rd.snapshot)
        if rd.hard_state is not None:
            st.set_hard_state(rd.hard_state)
        if rd.entries:
            st.append(rd.entries)
        self._send(rn, rd.messages)
        if rd.snapshot is not None:
            md = rd.snapshot.metadata
            kv, seen = pickle.loads(rd.snapshot.data)
            node.kv, node.seen = kv, set(seen)
            node.applied = md.index
            node.conf = md.conf_state
        for e in rd.committed_entries:
            self._apply(node, rn, e)
        if rd.read_states:
            for rs in rd.read_states:
                op = node.reads.pop(rs.ctx, None)
                if op is not None:
                    node.waiting_reads.append((rs.index, op))
        if node.waiting_reads:
            self._serve_reads(node)
        rn.advance(rd)

    def _send(self, rn: RawNode, messages: list[Message]) -> None:
        """Puts messages on the network, some dropped or duplicated."""
        rng = self.rng
        net = self.net
        drop, dup = self.cfg.drop, self.cfg.duplicate
        for m in messages:
            r = rng.random()
            if r < drop:
                self.stats["dropped"] += 1
                if m.type == MsgSnap:
                    rn.report_snapshot(m.to, True)
                continue
            net.append(m)
            if r < drop + dup:
                net.append(m)

    def _apply(self, node: SimNode, rn: RawNode, e: Entry) -> None:
        if e.index != node.applied + 1:
            self.fail(f"node {node.id} applies {e.index} after {node.applied}")
        rec = (e.term, e.type, e.data)
        old = self.committed.get(e.index)
        if old is None:
            self._record_committed(e.index, rec, rn.raft.term)
        elif old != rec:
            self.fail(f"state machine safety: node {node.id} applies {rec} at {e.index}, others applied {old}")
        node.applied = e.index
        if e.type == EntryType.CONF_CHANGE:
            cc = decode_conf_change(e.data)
            node.conf = rn.apply_conf_change(cc)
            if cc.type == ConfChangeType.REMOVE_NODE:
                gone = self.nodes.get(cc.node_id)
                if gone is not None and not gone.decommissioned and gone is not node:
                    self._decommission(gone)
            return
        if not e.data:
            return
        uid, kind, key, arg = pickle.loads(e.data)
        kv = node.kv
        if uid in node.seen:
            return  # a proposal duplicated by the network: applied once
        node.seen.add(uid)
        cur = kv.get(key)
        if kind == PUT:
            kv[key] = arg
            result = None
        elif kind == DELETE:
            result = kv.pop(key, None) is not None
        else:  # CAS
            expected, new = arg
            result = cur == expected
            if result:
                if new is None:
                    kv.pop(key, None)
                else:
                    kv[key] = new
        op = node.proposals.pop(uid, None)
        if op is not None and op.status == "pending":
            self.history.ok(op, result)
            self._client_done(op)

    def _serve_reads(self, node: SimNode) -> None:
        keep = []
        for index, op in node.waiting_reads:
            if index <= node.applied:
                if op.status == "pending":
                    self.history.ok(op, node.kv.get(op.key))
                    self._client_done(op)
            else:
                keep.append((index, op))
        node.waiting_reads = keep

    def _decommission(self, node: SimNode) -> None:
        self._crash(node)
        node.decommissioned = True

    # --- clients ----------------------------------------------------------------------------
    def _client_done(self, op: Op) -> None:
        slot = self.client_ops[op.client]
        if slot is not None and slot[0] is op:
            self.client_ops[op.client] = None

    def _client_timeout(self, op: Op) -> None:
        if op.status == "pending":
            self.history.timeout(op)
        self._client_done(op)

    def _client_action(self) -> None:
        rng = self.rng
        now = self.step_no
        for slot in self.client_ops:
            if slot is not None and slot[2] < now:
                self._client_timeout(slot[0])
        idle = [c for c, s in enumerate(self.client_ops) if s is None]
        if not idle:
            return
        client = rng.choice(idle)
        alive = [n for n in self.nodes.values() if n.rn is not None]
        if not alive:
            return
        leaders = [n for n in alive if n.rn.raft.state == LEADER]  # type: ignore[union-attr]
        node = rng.choice(leaders) if leaders and rng.random() < 0.6 else rng.choice(alive)
        rn = node.rn
        assert rn is not None
        key = f"k{rng.randrange(self.cfg.keys)}"
        uid = self.next_uid
        self.next_uid += 1
        r = rng.random()
        if r < 0.35:
            op = self.history.invoke(client, GET, key)
            ctx = b"r%d" % uid
            node.reads[ctx] = op
            rn.read_index(ctx)
        else:
            if r < 0.7:
                kind, arg = PUT, uid
            elif r < 0.8:
                kind, arg = DELETE, None
            else:
                expected = rng.choice([None, *node.kv.values()]) if node.kv else None
                kind, arg = CAS, (expected, uid)
            op = self.history.invoke(client, kind, key, arg)
            try:
                rn.propose(pickle.dumps((uid, kind, key, arg)))
            except ProposalDroppedError:
                self.history.fail(op)
                return
            node.proposals[uid] = op
        self.client_ops[client] = (op, node.id, now + self.cfg.op_timeout)
        self.trace.append((now, "client", node.id, op.kind, key))
        self._pump(node)

    # --- faults -----------------------------------------------------------------------------
    def _fault(self) -> None:
        rng = self.rng
        r = rng.random()
        nodes = [n for n in self.nodes.values() if not n.decommissioned]
        alive = [n for n in nodes if n.rn is not None]
        down = [n for n in nodes if n.rn is None]
        if not self.chaos:
            return
        if r < 0.15:
            ids = [n.id for n in nodes]
            rng.shuffle(ids)
            k = rng.randrange(1, len(ids))
            a, b = set(ids[:k]), set(ids[k:])
            self.cut = {(x, y) for x in a for y in b} | {(y, x) for x in a for y in b}
            self.trace.append((self.step_no, "partition", sorted(a), sorted(b)))
        elif r < 0.35:
            self.cut.clear()
            self.trace.append((self.step_no, "heal"))
        elif r < 0.5:
            if alive and len(down) < (len(nodes) + 1) // 2:
                n = rng.choice(alive)
                self._crash(n)
                self.restarts.append((self.step_no + rng.randrange(100, 3000), n))
                self.trace.append((self.step_no, "crash", n.id))
        elif r < 0.7:
            if down:
                n = rng.choice(down)
                self._start(n)
                self.trace.append((self.step_no, "restart", n.id))
                self._pump(n)
        elif r < 0.82:
            if alive:
                n = rng.choice(alive)
                st = n.storage
                if n.applied - st.first_index() > 30 and n.applied > st.snapshot().metadata.index:
                    st.create_snapshot(n.applied, n.conf, pickle.dumps((n.kv, sorted(n.seen))))
                    st.compact(n.applied - rng.randrange(0, 10))
                    self.stats["compactions"] += 1
                    self.trace.append((self.step_no, "compact", n.id, n.applied))
        elif r < 0.9:
            leaders = [n for n in alive if n.rn.raft.state == LEADER]  # type: ignore[union-attr]
            if leaders:
                n = leaders[-1]
                voters = n.conf.voters
                if len(voters) > 1:
                    to = rng.choice(voters)
                    n.rn.transfer_leader(to)  # type: ignore[union-attr]
                    self.stats["transfers"] += 1
                    self.trace.append((self.step_no, "transfer", n.id, to))
                    self._pump(n)
        elif self.cfg.conf_changes:
            self._conf_change(alive)

    def _conf_change(self, alive: list[SimNode]) -> None:
        rng = self.rng
        leaders = [n for n in alive if n.rn.raft.state == LEADER]  # type: ignore[union-attr]
        if not leaders:
            return
        leader = leaders[-1]
        rn = leader.rn
        assert rn is not None
        conf = leader.conf
        if conf.learners:
            cc = ConfChange(ConfChangeType.ADD_NODE, conf.learners[0])
        elif len(conf.voters) >= self.cfg.nodes:
            cc = ConfChange(ConfChangeType.REMOVE_NODE, rng.choice(conf.voters))
        else:
            members = set(conf.voters) | set(conf.learners)
            spare = [n.id for n in self.nodes.values() if not n.decommissioned and n.id not in members]
            if spare:
                nid = spare[0]
            else:
                nid = self.next_node_id
                self.next_node_id += 1
                node = self.nodes[nid] = SimNode(nid)
                self._start(node)
            cc = ConfChange(ConfChangeType.ADD_LEARNER_NODE, nid)
        try:
            rn.propose_conf_change(cc)
        except ProposalDroppedError:
            return
        self.stats["conf_changes"] += 1
        self.trace.append((self.step_no, "conf", leader.id, cc))
        self._pump(leader)

    # --- main loop --------------------------------------------------------------------------
    def _deliver(self) -> None:
        net = self.net
        i = self.rng.randrange(len(net))
        m = net[i]
        net[i] = net[-1]
        net.pop()
        node = self.nodes.get(m.to)
        ok = node is not None and node.rn is not None and (m.frm, m.to) not in self.cut
        if m.type == MsgSnap:
            sender = self.nodes.get(m.frm)
            if sender is not None and sender.rn is not None:
                sender.rn.report_snapshot(m.to, not ok)
                self.stats["snapshots_sent"] += 1
                self._pump(sender)
        if not ok:
            self.stats["dropped"] += 1
            return
        self.stats["delivered"] += 1
        self.trace.append((self.step_no, "deliver", m))
        rn = node.rn  # type: ignore[union-attr]
        rn.step(m)  # type: ignore[union-attr]
        self._pump(node)  # type: ignore[arg-type]
        self._check_node(node)  # type: ignore[arg-type]

    def run(self) -> None:
        rng = self.rng
        cfg = self.cfg
        nodes = self.nodes
        phase_len = 4000
        for step in range(cfg.steps):
            self.step_no = step
            if step % phase_len == 0:
                # alternate chaos with calm periods in which the cluster can recover
                self.chaos = (step // phase_len) % 3 != 2
                if not self.chaos:
                    self.cut.clear()
                    for n in nodes.values():
                        if n.rn is None and not n.decommissioned:
                            self._start(n)
                            self._pump(n)
            if self.restarts and step & 15 == 0:
                self._due_restarts()
            r = rng.random()
            if self.net and r < 0.55:
                self._deliver()
                continue
            if r < 0.75:
                ids = [id for id, n in nodes.items() if n.rn is not None]
                if ids:
                    node = nodes[rng.choice(ids)]
                    node.rn.tick()  # type: ignore[union-attr]
                    self._pump(node)
                    self._check_node(node)
            elif r < 0.87:
                pend = [n for n in nodes.values() if n.pending is not None]
                if pend:
                    node = rng.choice(pend)
                    self._fsync(node)
                    self._pump(node)
                    self._check_node(node)
            elif r < 0.997 - cfg.fault_rate:
                self._client_action()
            elif r < 0.997:
                self._fault()
            if step & 63 == 0:
                for n in nodes.values():
                    self._check_node(n)
        self.history.close()

    def check_history(self) -> None:
        res = check(self.history.ops)
        if not res.ok:
            raise SafetyViolation(f"seed {self.seed}: history not linearizable\n{res.describe()}\n"
                                  f"replay: pytest tests/raft -k sim --sim-seed {self.seed}")

    def completed_ops(self) -> int:
        return sum(1 for op in self.history.ops if op.status == "ok")
