"""A restarted follower rejoins: how long from its start until it hears the leader and has
caught up with the leader's log. The peer reconnect back-off decides most of it (the leader keeps
retrying its stream to the node while it is down). Times are printed, not asserted (a loaded
machine is slow); the back-off schedule itself is bounded in tests/unit/test_transport_backoff.py.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import grpc.aio
import pytest

from authstore.node.transport import PeerSecurity, Transport
from authstore.raft.types import Message, MessageType
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from tests.support.cluster import Client, Cluster, Node, distribution, program_cluster, retry_ok
from tests.support.processes import free_port, wait_for

#: These print measured rejoin times and assert none (the back-off's bound is asserted in
#: tests/unit/test_transport_backoff.py): about a minute, so they run when asked for.
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("RAFTGATE_MEASURE"),
                                 reason="a measurement, not a check: RAFTGATE_MEASURE=1 runs it")]

ROUNDS = 3
#: how long the follower stays down: long enough for a growing back-off to grow
DOWN_SECONDS = 8.0


def _status(cluster: Cluster, node: Node) -> rpc_pb2.StatusResponse | None:
    try:
        return cluster.do(node, ipb.InternalRaftRequest(header=ipb.RequestHeader(username="root"),
                                                        status=rpc_pb2.StatusRequest()), timeout=1.0)
    except grpc.RpcError:
        return None


def test_a_restarted_follower_rejoins(tmp_path: Path) -> None:
    with program_cluster(tmp_path, nodes=3) as cluster:
        client = Client(cluster.endpoint)
        ready: list[float] = []
        heard: list[float] = []
        caught_up: list[float] = []
        try:
            retry_ok(lambda: client.put(b"/warm", b"up", timeout=10), 30, "a first write")
            for r in range(ROUNDS):
                leader = cluster.leader()
                follower = cluster.followers(leader)[0]
                cluster.kill(follower)
                down_until = time.monotonic() + DOWN_SECONDS
                i = 0
                while time.monotonic() < down_until:  # writes it will have to catch up on
                    client.put(b"/while-down/%d/%d" % (r, i), b"x", timeout=10)
                    i += 1
                target = _status(cluster, leader)
                assert target is not None
                started = time.monotonic()
                cluster.restart(follower)
                ready.append(time.monotonic() - started)
                wait_for(lambda f=follower, lead=leader.member_id: (s := _status(cluster, f)) is not None
                         and s.leader == lead,
                         30, "the restarted follower to hear the leader")
                heard.append(time.monotonic() - started)
                wait_for(lambda f=follower, t=target.raftIndex: (s := _status(cluster, f)) is not None
                         and s.raftAppliedIndex >= t, 30, "the restarted follower to catch up")
                caught_up.append(time.monotonic() - started)
        finally:
            client.close()
        print("\n" + distribution("follower restarted -> says ready", ready))
        print(distribution("follower restarted -> hears the leader", heard))
        print(distribution("follower restarted -> applied the leader's index", caught_up))


@pytest.mark.parametrize("down_seconds", [1.0, 4.0, 10.0])
def test_peer_stream_reconnects_soon_after_the_peer_listens(down_seconds: float, tmp_path: Path) -> None:
    """The leader's side alone, in one process: heartbeats to a peer that is down for a while,
    then listens again. Prints how long until the first message arrives (the back-off's share of
    a rejoin, without a process's start-up)."""
    asyncio.run(_reconnect_after(down_seconds, tmp_path))


async def _reconnect_after(down_seconds: float, tmp_path: Path) -> None:
    security = PeerSecurity(secret=b"test-secret")
    port = free_port()
    arrived = asyncio.Event()
    sender = Transport(1, security, tmp_path)
    sender.bind(_Receiver(lambda _m: None))
    sender.set_peers({2: f"127.0.0.1:{port}"})

    async def heartbeats() -> None:
        while True:
            sender.send(Message(MessageType.MsgHeartbeat, to=2, frm=1, term=1))
            await asyncio.sleep(0.1)

    beating = asyncio.get_running_loop().create_task(heartbeats())
    server = grpc.aio.server(interceptors=security.interceptors(2))
    try:
        await asyncio.sleep(down_seconds)
        receiver = Transport(2, security, tmp_path)
        receiver.bind(_Receiver(lambda _m: arrived.set()))
        server.add_generic_rpc_handlers((receiver.handler(lambda: b""),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        listening = time.monotonic()
        await asyncio.wait_for(arrived.wait(), 30)
        print(f"\npeer down {down_seconds:.0f}s -> first message {time.monotonic() - listening:.2f}s "
              "after it listens again")
    finally:
        beating.cancel()
        await sender.close()
        await server.stop(0)


class _Receiver:
    """The node's side of the transport (``Receiver``): messages go to ``step``; no snapshots."""

    def __init__(self, step: Callable[[Message], None]) -> None:
        self.step = step

    async def receive_snapshot(self, _msg: Message, _path: Path) -> None:
        raise AssertionError("no snapshot expected")

    def report_unreachable(self, _peer_id: int) -> None:
        pass

    def is_removed(self, _peer_id: int) -> bool:
        return False

    def removed_by_peers(self) -> None:
        raise AssertionError("this member is not removed")
