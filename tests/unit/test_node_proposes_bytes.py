"""The API layer picks each request's ID and wall time and stamps them into the bytes
(authstore/api/proposer.py, as etcdserver does); the node logs exactly the bytes it is handed,
answers the caller waiting on the ID it is given, and never reads the wall clock: a node knows no
command schema, and what a request carries is decided before it reaches the log."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from authstore.api.proposer import Proposer
from authstore.api.stamp import stamp
from authstore.node.driver import RaftNode
from authstore.node.ports import SystemClock, Timer
from authstore.raft.storage import MemoryStorage
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from tests.support.node_ports import NoPeers, NoWAL


class NoWallClock:
    """The node's clock (ports.Clock) with real timeouts and ticks, and a wall clock that fails."""

    def __init__(self) -> None:
        self._real = SystemClock()
        self.wall_reads = 0

    def monotonic(self) -> float:
        return self._real.monotonic()

    def sleep(self, seconds: float) -> Awaitable[None]:
        return self._real.sleep(seconds)

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Timer:
        return self._real.call_later(delay, fn, *args)

    def wall_ms(self) -> int:
        self.wall_reads += 1
        raise AssertionError("the node read the wall clock")


def _no_exit() -> Any:
    raise AssertionError("the node failed (see the log)")


def _run(tmp_path: Path, scenario: Callable[[RaftNode, NoWallClock], Awaitable[None]]) -> None:
    backend = Backend(tmp_path / "db", map_size=64 << 20)
    clock = NoWallClock()
    node = RaftNode(1, MemoryStorage.with_conf([1]), NoWAL(), Applier(backend, member_id=1),  # type: ignore[arg-type]
                    NoPeers(), applied=0, snapshot_dir=tmp_path / "snap", clock=clock, fail_stop=_no_exit)

    async def main() -> None:
        node.start()
        try:
            await asyncio.wait_for(scenario(node, clock), 30)
        finally:
            await node.stop()

    try:
        asyncio.run(main())
    finally:
        backend.close()


def _logged(node: RaftNode) -> bytes:
    index = node.storage.last_index()
    (entry,) = node.storage.entries(index, index + 1, 1 << 62)
    return entry.data


def test_the_node_logs_the_bytes_it_is_given_and_never_reads_the_wall_clock(tmp_path: Path) -> None:
    async def scenario(node: RaftNode, clock: NoWallClock) -> None:
        put = ipb.InternalRaftRequest(put=pb.PutRequest(key=b"k", value=b"v")).SerializeToString()
        payload = stamp(put, 77, 1_700_000_000_123)  # as the API layer stamps it
        await node.admit()
        resp = await node.propose(payload, 77)
        assert isinstance(resp, pb.PutResponse) and resp.header.revision == 2
        assert _logged(node) == payload
        assert clock.wall_reads == 0

    _run(tmp_path, scenario)


def test_the_api_layer_picks_each_requests_id_and_time(tmp_path: Path) -> None:
    async def scenario(node: RaftNode, clock: NoWallClock) -> None:
        proposer = Proposer(node, wall_ms=lambda: 1_700_000_000_456, rng=random.Random(7))
        handed: list[tuple[bytes, int, int]] = []
        for value in (b"1", b"2"):
            put = ipb.InternalRaftRequest(put=pb.PutRequest(key=b"k", value=value)).SerializeToString()
            resp = await proposer.propose(put, prepared=lambda *told: handed.append(told))
            assert isinstance(resp, pb.PutResponse)
            payload, request_id, time_ms = handed[-1]
            assert _logged(node) == payload
            logged = ipb.InternalRaftRequest.FromString(payload)
            assert (logged.ID, logged.time_unix_ms, logged.put.value) == (request_id, 1_700_000_000_456, value)
        assert handed[0][1] != handed[1][1]  # each request its own ID
        assert clock.wall_reads == 0

    _run(tmp_path, scenario)


def test_a_second_proposal_under_an_id_in_flight_is_refused_and_nobody_gets_anothers_answer(
        tmp_path: Path) -> None:
    """The node answers whoever waits on an entry's ID. Two callers under one ID (the ID is the
    API's to pick) must not cross: the second is refused before anything is logged, and the first
    gets its own answer (not a timeout while the second takes the first's result)."""

    async def scenario(node: RaftNode, _clock: NoWallClock) -> None:
        node.request_timeout = 2.0  # before the fix the first caller waits it out
        await node.admit()
        puts = [stamp(ipb.InternalRaftRequest(put=pb.PutRequest(key=b"k", value=v)).SerializeToString(), 5, 1)
                for v in (b"first", b"second")]
        first = asyncio.create_task(node.propose(puts[0], 5))
        second = asyncio.create_task(node.propose(puts[1], 5))
        results = await asyncio.gather(first, second, return_exceptions=True)
        assert isinstance(results[0], pb.PutResponse), results[0]  # its own answer: the put it logged
        assert results[0].header.revision == 2
        assert isinstance(results[1], ValueError), results[1]  # refused, not handed the first's answer
        storage = node.storage
        logged = [e.data for e in storage.entries(storage.first_index(), storage.last_index() + 1, 1 << 62)]
        assert puts[0] in logged and puts[1] not in logged  # the refused one never reached the log

    _run(tmp_path, scenario)


def test_a_request_proposed_before_a_leader_is_known_is_stamped_with_the_time_it_is_logged(
        tmp_path: Path) -> None:
    """The proposer waits for the node to take a request (a leader known) before it reads the time:
    a request that waited out an election carries the time it entered the log, not the time it
    arrived (the lease checks and lockouts that apply it compare that time)."""
    backend = Backend(tmp_path / "db", map_size=64 << 20)
    node = RaftNode(1, MemoryStorage.with_conf([1]), NoWAL(), Applier(backend, member_id=1),  # type: ignore[arg-type]
                    NoPeers(), applied=0, snapshot_dir=tmp_path / "snap", clock=NoWallClock(), fail_stop=_no_exit)
    proposer = Proposer(node, wall_ms=lambda: 2_000 if node.leader_id else 1_000, rng=random.Random(3))
    put = ipb.InternalRaftRequest(put=pb.PutRequest(key=b"k", value=b"v")).SerializeToString()
    handed: list[tuple[bytes, int, int]] = []

    async def main() -> None:
        proposing = asyncio.create_task(proposer.propose(put, prepared=lambda *told: handed.append(told)))
        await asyncio.sleep(0)  # it arrived before the node had a leader
        assert not node.leader_id and not handed
        node.start()
        try:
            await asyncio.wait_for(proposing, 30)
        finally:
            await node.stop()
        ((payload, _request_id, time_ms),) = handed
        assert time_ms == 2_000 and ipb.InternalRaftRequest.FromString(payload).time_unix_ms == 2_000

    try:
        asyncio.run(main())
    finally:
        backend.close()
