"""A follower's ReadIndex request that is lost on the way (or whose answer is) is sent again, as
etcd's linearizableReadLoop does every 500 ms (readIndexRetryTime), instead of its readers waiting
out the request timeout; a late answer to an earlier attempt never answers another batch."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator

import pytest

from authstore.node.reads import ReadBatcher
from authstore.raft import ReadState
from authstore.raft.types import MessageType
from raftgate.errors import Err, EtcdError

from .fakes import Parcel
from .node_sim import TICK, NodeSimConfig, NodeSimulation


@pytest.fixture(autouse=True)
def _quiet_driver() -> Iterator[None]:
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def _drive(sim: NodeSimulation, done: Callable[[], bool], seconds: float) -> None:
    """Delivers every message in flight, then moves every clock one tick; until ``done`` or
    ``seconds`` of simulated time have passed."""
    for _ in range(round(seconds / TICK)):
        if done():
            return
        for _ in range(1000):
            if not sim.net.in_flight:
                break
            sim._run_soon(sim.net.deliver_one)
        for m in sim.members.values():
            if m.node is not None:
                sim._run_soon(m.clock.advance, TICK)


def _settled(sim: NodeSimulation) -> bool:
    nodes = [m.node for m in sim.members.values() if m.node is not None]
    leaders = {n.leader_id for n in nodes}
    return len(leaders) == 1 and 0 not in leaders and len({n.applied_index for n in nodes}) == 1 and all(
        n.applied_index == n.last_index for n in nodes)


@pytest.mark.parametrize("lost", [MessageType.MsgReadIndex, MessageType.MsgReadIndexResp], ids=lambda t: t.name)
def test_a_lost_read_index_request_is_sent_again(lost: MessageType) -> None:
    sim = NodeSimulation(1, NodeSimConfig(nodes=3, drop=0.0, duplicate=0.0, immediate=1.0, fault_rate=0.0,
                                          conf_changes=False))
    try:
        _drive(sim, lambda: _settled(sim), 30.0)
        assert _settled(sim), "no leader elected"
        follower = next(m.node for m in sim.members.values() if m.node is not None and not m.node.is_leader)
        assert follower is not None
        submit = sim.net.submit
        dropped: list[Parcel] = []

        def lossy(parcel: Parcel) -> None:
            """The network loses the first message of kind ``lost`` to or from the follower."""
            if not dropped and parcel.msg.type == lost and follower.id in (parcel.msg.frm, parcel.msg.to):
                dropped.append(parcel)
                return
            submit(parcel)

        sim.net.submit = lossy  # type: ignore[method-assign]
        reads: list[asyncio.Task[int]] = []
        sim._run_soon(lambda: reads.append(sim.loop.create_task(follower.read_index())))
        # past the request timeout (7 s): without a retry the read ends with `request timed out`
        _drive(sim, lambda: reads[0].done(), follower.request_timeout + 1.0)
        assert dropped, f"no {lost.name} was sent"
        assert reads[0].done()
        exc = reads[0].exception()
        assert exc is None, f"the read failed: {exc!r}"
        assert reads[0].result() >= 3  # the membership entries at least
    finally:
        sim.close()


def test_a_late_answer_to_an_earlier_attempt_answers_only_its_own_batch() -> None:
    loop = asyncio.new_event_loop()
    try:
        sent: list[bytes] = []
        batcher = ReadBatcher()
        first: asyncio.Future[int] = loop.create_future()
        batcher.add(first)
        batcher.issue(sent.append, 0.0)
        batcher.retry(sent.append, 0.2)
        assert len(sent) == 1  # not yet: etcd waits 500 ms before it sends again
        batcher.retry(sent.append, 0.5)
        assert len(sent) == 2 and sent[0] != sent[1]  # a new context for each attempt
        second: asyncio.Future[int] = loop.create_future()
        batcher.add(second)
        batcher.issue(sent.append, 0.6)
        assert len(sent) == 3 and sent[2] not in sent[:2]

        batcher.answer([ReadState(5, sent[1])])  # the retry's answer: the first batch
        assert first.result() == 5 and not second.done()
        batcher.answer([ReadState(6, sent[0])])  # the first attempt's late answer: nobody's now
        assert not second.done()
        batcher.retry(sent.append, 1.0)
        assert len(sent) == 3  # only the second batch is waiting, and only for 400 ms
        batcher.answer([ReadState(7, sent[2])])
        assert second.result() == 7

        # readers that all went away (timed out) are not asked for again
        third: asyncio.Future[int] = loop.create_future()
        batcher.add(third)
        batcher.issue(sent.append, 2.0)
        third.cancel()
        batcher.retry(sent.append, 3.0)
        assert len(sent) == 4

        # a leader change fails what is in flight; its late answers answer nothing
        fourth: asyncio.Future[int] = loop.create_future()
        batcher.add(fourth)
        batcher.issue(sent.append, 4.0)
        batcher.fail_in_flight(EtcdError(Err.LEADER_CHANGED))
        assert isinstance(fourth.exception(), EtcdError)
        batcher.retry(sent.append, 5.0)
        assert len(sent) == 5
    finally:
        loop.close()
