"""A node never promises durability before its write, even in the Ready in which it became leader.

The driver (authstore/node/driver.py) lets a leader send its Ready's messages before writing its
own log: a leader's MsgApp and heartbeats promise nothing about its disk. But a Ready gathers
every message since the last one, and a node may have been a follower when some were made: it
took a leader's entries and queued its MsgAppResp, then (the leader went quiet, or MsgTimeoutNow)
won an election before the driver took the Ready. That Ready says LEADER and carries the
follower's acknowledgement of entries it also asks to write. Sent before the write, the old leader
(still at its term) may commit with it and answer its client; if this node dies before its write,
the entry is on one disk of three and an election between the other two loses an acknowledged
write. Acknowledgements (MsgAppResp) and votes (MsgVoteResp) must leave only after the write, as
etcd-raft keeps them in msgsAfterAppend.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from authstore.node.driver import RaftNode
from authstore.raft import Config, Entry, Message, MessageType, RawNode, StateType
from tests.support.node_ports import Events, FakePeers, FakeStateMachine, FakeWAL
from tests.support.raft_helpers import storage_with

M = MessageType
PROMISES = frozenset({M.MsgAppResp, M.MsgVoteResp})


def _follower_turned_leader() -> tuple[RawNode, Any]:
    """Node 2 of {1,2,3}: takes leader 1's entry 2 and queues its ack, then wins term 2 (votes of 3)."""
    st = storage_with([1, 2, 3], [1])
    rn = RawNode(Config(id=2, storage=st, election_tick=10, heartbeat_tick=1, check_quorum=True, pre_vote=True,
                        rng=random.Random(2)))
    while (rd := rn.ready()) is not None:
        if rd.entries:
            st.append(rd.entries)
        rn.advance(rd)
    rn.step(Message(M.MsgApp, to=2, frm=1, term=1, index=1, log_term=1, entries=[Entry(1, 2, data=b"x")], commit=1))
    for _ in range(30):
        rn.tick()
        if rn.raft.state != StateType.FOLLOWER:
            break
    rn.step(Message(M.MsgPreVoteResp, to=2, frm=3, term=rn.raft.term + 1))
    rn.step(Message(M.MsgVoteResp, to=2, frm=3, term=rn.raft.term))
    assert rn.raft.state == StateType.LEADER
    return rn, st


def test_a_new_leader_sends_the_acks_it_made_as_a_follower_only_after_its_write(tmp_path: Path) -> None:
    rn, st = _follower_turned_leader()
    events = Events()
    node = RaftNode(2, st, FakeWAL(events), FakeStateMachine(), FakePeers(events),  # type: ignore[arg-type]
                    applied=0, snapshot_dir=tmp_path / "snap")
    node.rn = rn
    rd = rn.ready()
    assert rd is not None and rd.soft_state is not None and rd.soft_state.state == StateType.LEADER
    assert 2 in [e.index for e in rd.entries]

    async def handle() -> None:
        await node._handle(rd)  # noqa: SLF001 - one Ready through the driver, as its loop does

    asyncio.run(handle())
    node._log_worker.shutdown()  # noqa: SLF001
    node._apply_worker.shutdown()  # noqa: SLF001
    saved = next(i for i, e in enumerate(events.log) if isinstance(e, tuple))
    early = [m for m in events.log[:saved] if m.type in PROMISES]
    assert not early, f"sent before the write of entries {events.log[saved][1]}: {early}"
    late = [m for m in events.log[saved + 1:] if isinstance(m, Message)]
    assert any(m.type == M.MsgAppResp and m.to == 1 and m.index == 2 for m in late)
    # the leader's own replication still goes out before its write (Raft thesis 10.2.1)
    assert any(m.type == M.MsgVote or m.type == M.MsgApp for m in events.log[:saved])
