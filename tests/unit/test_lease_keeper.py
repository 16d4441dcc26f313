"""The leader's lease keeper (authstore/api/lease_keeper.py) against a real apply stage and a fake Raft
node whose proposals apply at once, with a hand-moved clock: which renewals reach the log, what a
new leader assumes, when leases expire, and that apply itself reads no clock."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from authstore.api.lease_keeper import RENEW_LOG_FRACTION, LeaseKeeper
from authstore.api.stamp import ID_FIELD, TIME_FIELD
from authstore.raft.types import Entry, EntryType
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from protos import wire
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError

T = TypeVar("T")
EXTEND_MS = 1000


class FakeNode:
    """Just enough of RaftNode: proposals are stamped with the fake clock and applied at once."""

    def __init__(self, applier: Applier) -> None:
        self.id = 1
        self.applier = applier
        self.now = 1_000_000
        self.index = applier.applied_index()
        self.applied_index = self.index
        self.is_leader = True
        self.election_seconds = EXTEND_MS / 1000
        self.request_timeout = 1.0
        self.last_index = self.index
        self.kinds: list[str] = []
        self.keepers: list[LeaseKeeper] = []

    def apply(self, payload: bytes) -> Any:
        self.index += 1
        entries = [Entry(1, self.index, EntryType.NORMAL, payload)]
        results = self.applier.apply_batch(entries)
        self.applied_index = self.index
        for keeper in self.keepers:
            keeper.on_batch_results(entries, results)
        return results[0][1]

    def clock(self) -> int:
        return self.now

    async def propose(self, data: bytes) -> Any:
        if not self.is_leader:
            raise EtcdError(Err.NO_LEADER)
        payload = data + wire.varint_field(ID_FIELD, self.index + 1) + wire.varint_field(TIME_FIELD, self.now)
        req = ipb.InternalRaftRequest.FromString(payload)
        self.kinds.append(next(f.name for f, _ in req.ListFields() if f.message_type is not None))
        result = self.apply(payload)
        if isinstance(result, BaseException):
            raise result
        return result

    async def read_index(self) -> int:
        return self.index

    async def wait_applied(self, index: int) -> None:
        assert index <= self.applied_index


class World:
    def __init__(self, path: Path) -> None:
        self.backend = Backend(path)
        self.applier = Applier(self.backend, member_id=1)
        self.node = FakeNode(self.applier)
        self.keeper = self.new_keeper()

    def new_keeper(self, *, apply_first_entry: bool = True) -> LeaseKeeper:
        """This node becomes leader (again): a new keeper, then its first, empty entry."""
        for old in self.node.keepers:
            old.on_leader_change(2, 1)
        keeper = LeaseKeeper(self.node, self.applier, propose=self.node.propose, clock=self.node.clock)  # type: ignore[arg-type]
        self.node.keepers = [keeper]
        self.node.last_index = self.node.index + 1
        keeper.on_leader_change(self.node.id, 1)
        if apply_first_entry:
            self.node.apply(b"")
        return keeper

    async def grant(self, ttl: int, lease_id: int) -> None:
        await self.node.propose(ipb.InternalRaftRequest(lease_grant=pb.LeaseGrantRequest(TTL=ttl, ID=lease_id))
                                .SerializeToString())

    async def put(self, key: bytes, lease: int) -> None:
        await self.node.propose(ipb.InternalRaftRequest(put=pb.PutRequest(key=key, value=b"v", lease=lease))
                                .SerializeToString())

    def logged_deadline(self, lease_id: int) -> int | None:
        with self.applier.env.begin() as txn:
            rec = self.applier.lessor.get(txn, lease_id)
        return None if rec is None else rec.deadline_ms

    def keys(self) -> list[bytes]:
        with self.applier.env.begin() as txn:
            return [kv.key for kv in self.applier.kv.range(txn, pb.RangeRequest(key=b"\0", range_end=b"\0")).kvs]

    def revision(self) -> int:
        with self.applier.env.begin() as txn:
            return self.applier.kv.current_revision(txn)

    async def settle(self) -> None:
        for _ in range(5):
            await asyncio.sleep(0)


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = World(tmp_path)
    yield world
    world.backend.close()


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_renewals_reach_the_log_only_past_the_slack(w: World) -> None:
    async def scenario() -> None:
        await w.grant(10, 7)
        start = w.node.now
        assert w.logged_deadline(7) == start + 10_000
        w.node.now += 3_000  # new deadline 3 s past the logged one: within the 5 s slack
        assert await w.keeper.renew(7) == 10
        assert w.node.kinds.count("lease_renew") == 0
        assert w.logged_deadline(7) == start + 10_000
        ttl = await w.keeper.time_to_live(pb.LeaseTimeToLiveRequest(ID=7))
        assert (ttl.TTL, ttl.grantedTTL) == (10, 10)  # the leader's own deadline
        w.node.now += 3_000  # 6 s past: logged, with the entry's time
        assert await w.keeper.renew(7) == 10
        assert w.node.kinds.count("lease_renew") == 1
        assert w.logged_deadline(7) == w.node.now + 10_000
        # a client renewing every TTL/3 logs every second keep-alive
        for _ in range(6):
            w.node.now += 3_333
            assert await w.keeper.renew(7) == 10
        assert w.node.kinds.count("lease_renew") == 4

    run(scenario())
    assert RENEW_LOG_FRACTION == 0.5


def test_every_promised_deadline_is_within_the_slack_of_the_logged_one(w: World) -> None:
    async def scenario() -> None:
        await w.grant(6, 1)
        for step in (100, 1_900, 50, 2_999, 1, 1_000, 3_000, 2_000, 7, 1_993):
            w.node.now += step
            assert await w.keeper.renew(1) == 6
            promised = w.node.now + 6_000
            logged = w.logged_deadline(1)
            assert logged is not None and promised <= logged + 3_000

    run(scenario())


def test_expiry_goes_through_the_log_and_deletes_keys_in_one_revision(w: World) -> None:
    async def scenario() -> None:
        await w.grant(5, 3)
        await w.grant(60, 4)
        for k in (b"b", b"a", b"c"):
            await w.put(k, 3)
        await w.put(b"stay", 4)
        rev = w.revision()
        w.node.now += 4_999
        assert w.keeper.expire_due() == 0
        w.node.now += 1
        assert w.keeper.expire_due() == 1
        await w.settle()
        assert w.node.kinds[-1] == "lease_expire"
        assert w.keys() == [b"stay"]
        assert w.revision() == rev + 1
        assert w.logged_deadline(3) is None and w.logged_deadline(4) is not None
        assert await w.keeper.renew(3) == 0  # gone: TTL 0, as etcd answers in the stream
        ttl = await w.keeper.time_to_live(pb.LeaseTimeToLiveRequest(ID=3))
        assert ttl.TTL == -1

    run(scenario())


def test_keep_alive_of_an_expired_lease_waits_for_the_revoke_and_answers_zero(w: World) -> None:
    async def scenario() -> None:
        await w.grant(5, 9)
        await w.put(b"k", 9)
        w.node.now += 6_000  # past the deadline, before the expiry loop ran
        assert await w.keeper.renew(9) == 0
        assert w.keys() == [] and w.logged_deadline(9) is None
        assert w.node.kinds.count("lease_expire") == 1

    run(scenario())


def test_a_new_leader_never_expires_a_lease_before_any_deadline_promised_earlier(w: World) -> None:
    async def scenario() -> None:
        await w.grant(10, 5)
        await w.put(b"k", 5)
        w.node.now += 4_000
        assert await w.keeper.renew(5) == 10  # promised now + 10 s, not logged (within slack)
        promised = w.node.now + 10_000
        logged = w.logged_deadline(5)
        assert logged is not None and promised > logged
        # leadership moves away and back: the in-memory deadline is gone with it
        w.keeper.on_leader_change(2, 2)
        w.node.is_leader = False
        with pytest.raises(EtcdError) as e:
            await w.keeper.renew(5)
        assert e.value.err is Err.NOT_LEADER
        assert w.keeper.expire_due() == 0
        w.node.is_leader = True
        new = w.new_keeper()
        w.node.now = promised - 1
        assert new.expire_due() == 0
        w.node.now = logged + 5_000 + EXTEND_MS - 1  # logged + slack + election timeout
        assert new.expire_due() == 0
        w.node.now += 1
        assert new.expire_due() == 1
        await w.settle()
        assert w.keys() == []

    run(scenario())


def test_a_new_leader_gives_leases_past_their_deadline_an_election_timeout(w: World) -> None:
    async def scenario() -> None:
        await w.grant(2, 6)
        w.node.now += 60_000  # the lease expired long ago while nobody led
        new = w.new_keeper()
        ttl = await new.time_to_live(pb.LeaseTimeToLiveRequest(ID=6))
        assert ttl.TTL == EXTEND_MS // 1000
        w.node.now += EXTEND_MS - 1
        assert new.expire_due() == 0
        assert await new.renew(6) == 2  # a client that reaches the new leader in time keeps it
        w.node.now += 2_000
        assert new.expire_due() == 1
        await w.settle()
        assert w.logged_deadline(6) is None

    run(scenario())


def test_a_new_leader_waits_until_earlier_terms_are_applied(w: World) -> None:
    async def scenario() -> None:
        await w.grant(10, 8)
        keeper = w.new_keeper(apply_first_entry=False)
        w.node.now += 20_000
        assert keeper.expire_due() == 0  # not taken over yet: decides nothing, renews nothing
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(keeper.renew(8), 0.05)  # waits for the take-over
        w.node.apply(b"")  # our first entry: every lease gets an election timeout from now
        assert keeper.expire_due() == 0
        w.node.now += EXTEND_MS
        assert keeper.expire_due() == 1

    run(scenario())


def test_leases_granted_in_the_new_leaders_batch_keep_their_exact_deadline(w: World) -> None:
    async def scenario() -> None:
        await w.grant(10, 1)
        keeper = w.new_keeper(apply_first_entry=False)
        grant = ipb.InternalRaftRequest(lease_grant=pb.LeaseGrantRequest(TTL=5, ID=2)).SerializeToString()
        first = w.node.index + 1
        entries = [Entry(1, first, EntryType.NORMAL, b""),
                   Entry(1, first + 1, EntryType.NORMAL, grant + wire.varint_field(TIME_FIELD, w.node.now))]
        results = w.applier.apply_batch(entries)  # the first entry and a grant applied together
        w.node.index = w.node.applied_index = first + 1
        keeper.on_batch_results(entries, results)
        assert (await keeper.time_to_live(pb.LeaseTimeToLiveRequest(ID=2))).TTL == 5
        assert (await keeper.time_to_live(pb.LeaseTimeToLiveRequest(ID=1))).TTL == 10 + 5 + EXTEND_MS // 1000
        w.node.now += 5_000
        assert keeper.expire_due() == 1

    run(scenario())


def test_apply_skips_an_expiry_whose_deadline_a_later_entry_moved(w: World) -> None:
    async def scenario() -> None:
        await w.grant(10, 2)
        seen = w.logged_deadline(2)
        assert seen is not None
        w.node.now += 8_000
        await w.node.propose(ipb.InternalRaftRequest(lease_renew=ipb.LeaseRenewEntry(ID=2)).SerializeToString())
        await w.node.propose(ipb.InternalRaftRequest(
            lease_expire=ipb.LeaseExpireEntry(ID=2, deadline_ms=seen)).SerializeToString())
        assert w.logged_deadline(2) == w.node.now + 10_000
        # a renew entry never moves the deadline back, whatever the proposer's clock said
        w.node.now -= 5_000
        await w.node.propose(ipb.InternalRaftRequest(lease_renew=ipb.LeaseRenewEntry(ID=2)).SerializeToString())
        assert w.logged_deadline(2) == w.node.now + 15_000
        # internal entries for an unknown lease: renew reports it, expire is a no-op
        with pytest.raises(EtcdError) as e:
            await w.node.propose(ipb.InternalRaftRequest(lease_renew=ipb.LeaseRenewEntry(ID=99)).SerializeToString())
        assert e.value.err is Err.LEASE_NOT_FOUND
        await w.node.propose(ipb.InternalRaftRequest(
            lease_expire=ipb.LeaseExpireEntry(ID=99, deadline_ms=1)).SerializeToString())

    run(scenario())


def test_unknown_lease_keep_alive_answers_zero(w: World) -> None:
    assert run(w.keeper.renew(12345)) == 0


def test_min_ttl_follows_the_election_timeout() -> None:
    from authstore.main import min_lease_ttl

    def cfg(heartbeat: int, election: int) -> Any:
        return SimpleNamespace(heartbeat_interval_ms=heartbeat, election_timeout_ms=election)

    assert min_lease_ttl(cfg(100, 1000)) == 2  # etcd's default: 15 heartbeats of 100 ms -> 1.5 s -> 2 s
    assert min_lease_ttl(cfg(100, 3000)) == 5  # 4.5 s -> 5 s
    assert min_lease_ttl(cfg(50, 500)) == 1
    assert min_lease_ttl(cfg(100, 1050)) == 2  # whole ticks, as etcd counts them
