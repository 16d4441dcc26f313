"""The leader's side of leases: keep-alives, remaining TTL, and expiry through the log.

Every node holds each lease's *logged deadline* (``Lessor``: set by Grant and by logged renews,
from the entry's time, so every node applies the same). Only the leader runs the code here.

**Keep-alive.** etcd renews on the leader in memory, without a log entry, and loses those renewals
when the leader changes (a new leader refreshes every lease to its full TTL plus an election
timeout; optional checkpoints persist the remaining TTL every 5 minutes). raftgate keeps etcd's
cheap path and bounds what a leader change can lose: the leader keeps a deadline per lease in
memory (``_deadlines``) and renews there; it logs a renew (``lease_renew``, deadline = the entry's
time + TTL) only when the new deadline would be more than ``RENEW_LOG_FRACTION`` x TTL past the
logged one, and then answers the client only once that entry is applied. So every deadline a
client was ever promised is at most ``slack = RENEW_LOG_FRACTION x TTL`` past the logged deadline:
at most one log entry per lease per ``slack`` seconds (a client renewing every TTL/3, as clientv3
does, logs every second keep-alive; a 1-hour lease logs once per 30 minutes).

**Leader change.** A new leader starts once it has applied every entry of earlier terms (the
log position of its own first, empty entry, as etcd's ``Promote``). It then gives every lease the
deadline ``max(logged + slack, now) + election timeout``: never before any deadline promised by
an earlier leader (that is at most ``logged + slack``), plus an election timeout during which
clients could not reach any leader (etcd's ``extend``). A lease whose client is gone outlives its
deadline by at most ``slack`` + an election timeout after a leader change (etcd: up to the full
TTL + an election timeout, without checkpoints).

**Expiry** is decided by the leader every ``EXPIRY_INTERVAL`` (etcd: 500 ms) and applied through
the log as ``lease_expire{ID, deadline seen}``: an internal entry with no client identity, so it
needs no root token and works in every token mode (etcd mints an internal root token, which it
cannot do in verify-only JWT mode: there, expired leases stay). Apply revokes the lease (its keys
deleted in one revision) unless a later entry moved its logged deadline. A keep-alive of a lease
the leader considers expired waits for that revoke and answers TTL 0, as etcd's lessor does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from authstore.api.proposer import wall_ms
from authstore.raft.types import Entry
from authstore.state.apply import Applier
from authstore.state.lease.lessor import LeaseRecord, Lessor
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError

if TYPE_CHECKING:
    from authstore.node.driver import RaftNode

log = logging.getLogger("raftgate.store.lease")

#: a renew is logged when it would move the deadline more than this fraction of the TTL past the
#: logged one; it is also the most a leader change can add to a lease whose client is gone
RENEW_LOG_FRACTION = 0.5
#: how often the leader looks for expired leases (etcd: 500 ms)
EXPIRY_INTERVAL = 0.5
#: lease revokes in flight at once (etcd rate-limits revokes to 1000/s)
MAX_EXPIRING = 256
#: the expiry loop drops in-memory deadlines of leases revoked by clients every this many rounds
SWEEP_ROUNDS = 60


def slack_ms(ttl: int) -> int:
    return int(ttl * 1000 * RENEW_LOG_FRACTION)


class LeaseKeeper:
    """Keep-alives, TimeToLive and expiry on the leader; idle on followers."""

    def __init__(self, node: RaftNode, applier: Applier, *, propose: Callable[[bytes], Coroutine[Any, Any, Any]],
                 clock: Callable[[], int] = wall_ms, extend_ms: int | None = None,
                 interval: float = EXPIRY_INTERVAL) -> None:
        """``propose``: the API's (proposer.py), which stamps each entry's ID and time."""
        self.node = node
        self._propose = propose
        self.applier = applier
        self.clock = clock
        self.extend_ms = int(node.election_seconds * 1000) if extend_ms is None else extend_ms
        self.interval = interval
        self._deadlines: dict[int, int] = {}  # the leader's deadlines, past the logged ones
        self._expiring: dict[int, asyncio.Task[None]] = {}
        self._renewing: dict[int, asyncio.Task[Any]] = {}
        self._leading = False
        self._promote_index = 0
        self._ready = asyncio.Event()
        self._rounds = 0

    @property
    def lessor(self) -> Lessor:
        return self.applier.lessor  # the applier re-opens it after a snapshot install

    # ---- leadership ----
    def on_leader_change(self, leader: int, _term: int) -> None:
        """Called by the driver on every leader change (synchronously, before anything else runs)."""
        self._deadlines.clear()
        self._ready.clear()
        self._leading = leader == self.node.id
        if self._leading:
            # our own first (empty) entry: once applied, every entry of earlier terms is applied
            self._promote_index = self.node.last_index

    def on_batch_results(self, entries: list[Entry], results: list[tuple[int, Any]]) -> None:
        """Called by the driver after each applied batch, before anything else runs: the batch
        that applies our first entry is where this leader takes the leases over (etcd's Promote)."""
        if not self._leading or self._ready.is_set() or entries[-1].index < self._promote_index:
            return
        ours = {result.ID for entry, (_, result) in zip(entries, results, strict=True)
                if entry.index > self._promote_index and isinstance(result, pb.LeaseGrantResponse)}
        self._promote(ours)

    def _promote(self, granted_by_us: set[int]) -> None:
        now = self.clock()
        with self.applier.env.begin() as txn:
            records = self.lessor.all_records(txn)
        for lease_id, rec in records:
            if lease_id not in granted_by_us:  # those have exact deadlines: nobody renewed them elsewhere
                self._deadlines[lease_id] = max(rec.deadline_ms + slack_ms(rec.ttl), now) + self.extend_ms
        self._ready.set()
        log.info("leading: %d lease(s), none expires before %d ms from now", len(records), self.extend_ms)

    async def _lead(self) -> None:
        """Returns once this node leads and has taken over the leases; else raises NOT_LEADER."""
        if not self._leading or not self.node.is_leader:
            raise EtcdError(Err.NOT_LEADER)
        if not self._ready.is_set():
            try:
                async with asyncio.timeout(self.node.request_timeout):
                    await self._ready.wait()
            except TimeoutError:
                raise EtcdError(Err.TIMEOUT) from None

    async def before_read(self) -> None:
        """etcd's ensureLeadership + waitAppliedIndex before any lease request on the leader."""
        await self._lead()
        await self.node.wait_applied(await self.node.read_index())
        await self._lead()

    # ---- requests ----
    def _record(self, lease_id: int) -> LeaseRecord | None:
        with self.applier.env.begin() as txn:
            return self.lessor.get(txn, lease_id)

    def deadline(self, lease_id: int, rec: LeaseRecord) -> int:
        """The deadline the leader enforces: its own if it has one, never before the logged one."""
        mine = self._deadlines.get(lease_id)
        return rec.deadline_ms if mine is None else max(mine, rec.deadline_ms)

    async def renew(self, lease_id: int) -> int:
        """LeaseKeepAlive on the leader: the TTL, or 0 for an unknown or expired lease (etcd)."""
        await self._lead()
        rec = self._record(lease_id)
        if rec is None:
            return 0
        now = self.clock()
        if lease_id in self._expiring or self.deadline(lease_id, rec) <= now:
            await self._await_expiry(lease_id, rec)
            return 0
        new_deadline = now + rec.ttl * 1000
        if new_deadline > rec.deadline_ms + slack_ms(rec.ttl):
            try:
                await self._log_renew(lease_id)
            except EtcdError as exc:
                if exc.err is Err.LEASE_NOT_FOUND:
                    return 0
                raise
            rec = self._record(lease_id)
            if rec is None:
                return 0
        if self._leading:
            self._deadlines[lease_id] = max(self._deadlines.get(lease_id, 0), new_deadline)
        return rec.ttl

    async def _log_renew(self, lease_id: int) -> None:
        """One renew entry in flight per lease; concurrent keep-alives share it."""
        task = self._renewing.get(lease_id)
        if task is None:
            data = ipb.InternalRaftRequest(lease_renew=ipb.LeaseRenewEntry(ID=lease_id)).SerializeToString()
            task = asyncio.get_running_loop().create_task(self._propose(data))
            self._renewing[lease_id] = task

            def done(t: asyncio.Task[Any]) -> None:
                if self._renewing.get(lease_id) is t:
                    del self._renewing[lease_id]
                if not t.cancelled():
                    t.exception()  # retrieved here too: every waiter may have gone

            task.add_done_callback(done)
        await asyncio.shield(task)

    async def _await_expiry(self, lease_id: int, rec: LeaseRecord) -> None:
        task = self._expiring.get(lease_id) or self._start_expiry(lease_id, rec.deadline_ms)
        await asyncio.shield(task)
        if self._record(lease_id) is not None:
            # the revoke did not happen (leadership moved meanwhile): the client retries
            raise EtcdError(Err.LEADER_CHANGED)

    async def time_to_live(self, body: pb.LeaseTimeToLiveRequest) -> pb.LeaseTimeToLiveResponse:
        """LeaseTimeToLive on the leader, with the deadline the leader enforces."""
        await self._lead()
        now = self.clock()
        with self.applier.env.begin() as txn:
            resp = self.lessor.time_to_live(txn, body, now)
            rec = self.lessor.get(txn, body.ID)
        if rec is not None:
            resp.TTL = max(0, (self.deadline(body.ID, rec) - now) // 1000)
        return resp

    # ---- expiry ----
    async def run(self) -> None:
        """The expiry loop: runs on every node, acts only on the leader."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.expire_due()
            except Exception:  # the loop must outlive a bad round
                log.exception("lease expiry round failed")

    def expire_due(self) -> int:
        """One round: proposes the revoke of every lease past the leader's deadline; returns how many."""
        if not self._ready.is_set() or not self.node.is_leader:
            return 0
        now = self.clock()
        with self.applier.env.begin() as txn:
            due = self.lessor.due(txn, now)  # the leader's deadline is never before the logged one
            self._rounds += 1
            if self._rounds % SWEEP_ROUNDS == 0:
                for lease_id in [i for i in self._deadlines if not self.lessor.exists(txn, i)]:
                    del self._deadlines[lease_id]
        started = 0
        for lease_id, logged in due:
            if len(self._expiring) >= MAX_EXPIRING:
                break
            if lease_id in self._expiring or self._deadlines.get(lease_id, logged) > now:
                continue
            self._start_expiry(lease_id, logged)
            started += 1
        return started

    def _start_expiry(self, lease_id: int, logged_deadline: int) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._propose_expiry(lease_id, logged_deadline))
        self._expiring[lease_id] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._expiring.get(lease_id) is t:
                del self._expiring[lease_id]
                self._deadlines.pop(lease_id, None)

        task.add_done_callback(done)
        return task

    async def _propose_expiry(self, lease_id: int, logged_deadline: int) -> None:
        req = ipb.InternalRaftRequest(lease_expire=ipb.LeaseExpireEntry(ID=lease_id, deadline_ms=logged_deadline))
        try:
            await self._propose(req.SerializeToString())
        except EtcdError as exc:
            log.info("revoking expired lease %x: %s (retried next round)", lease_id, exc.message)
