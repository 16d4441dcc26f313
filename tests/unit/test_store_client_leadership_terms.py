"""Which shared watch streams discovery ends when the leader changes. The old leader's streams end
only when another node leads in a newer term than the leadership known; the known term was kept
while it was the highest seen, so after the store cluster was restored into a new cluster at the
same addresses (terms start again from 1, as `raftgate snapshot restore` makes it) no leader change
ever ended the old leader's streams again: a paused leader kept its client watches for good."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from protos.storepb import store_pb2
from proxy.store_client import StoreClient

TARGETS = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]


def _answering(answers: dict[str, store_pb2.LeaderResponse | None], target: str) -> Any:
    """What the node at ``target`` answers discovery (None: paused, no answer in time)."""
    async def proven(invoke: Any, timeout: float | None = None) -> store_pb2.LeaderResponse:
        answer = answers[target]
        if answer is None:
            raise grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(),
                                       grpc.aio.Metadata(), "deadline exceeded")
        return answer
    return proven


def test_a_paused_leader_after_the_cluster_was_restored_still_has_its_watch_streams_ended() -> None:
    async def main() -> None:
        client = StoreClient(TARGETS)
        answers: dict[str, store_pb2.LeaderResponse | None] = {}
        ended: list[str] = []


        for ep in client._endpoints:
            ep.proven = _answering(answers, ep.target)  # type: ignore[method-assign]
        client._end_watch_links = lambda ep: ended.append(ep.target)  # type: ignore[method-assign]

        def leads(leader: int, term: int, *, paused: int | None = None) -> None:
            for member, target in enumerate(TARGETS, start=1):
                answers[target] = None if member == paused else store_pb2.LeaderResponse(
                    member_id=member, leader_id=leader, raft_term=term)

        try:
            leads(1, 50)  # the first cluster, in term 50
            await client._discover()
            assert client._leader.target == TARGETS[0] and not ended
            leads(2, 2)  # restored into a new cluster at the same addresses: terms start again
            await client._discover()
            assert client._leader.target == TARGETS[1]
            ended.clear()
            leads(3, 3, paused=2)  # its leader paused (SIGSTOP): node 3 leads in a newer term
            await client._discover()
            assert client._leader.target == TARGETS[2]
            assert ended == [TARGETS[1]], ended
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_a_stale_answer_ends_no_watch_streams() -> None:
    """(Held before and after: an answer older than the leadership known ends nothing.)"""
    async def main() -> None:
        client = StoreClient(TARGETS)
        ended: list[str] = []
        answers: dict[str, store_pb2.LeaderResponse | None] = {
            target: store_pb2.LeaderResponse(member_id=member, leader_id=1, raft_term=5)
            for member, target in enumerate(TARGETS, start=1)}


        for ep in client._endpoints:
            ep.proven = _answering(answers, ep.target)  # type: ignore[method-assign]
        client._end_watch_links = lambda ep: ended.append(ep.target)  # type: ignore[method-assign]
        try:
            await client._discover()
            # only a node cut off since term 4 answers, naming itself
            answers[TARGETS[0]] = answers[TARGETS[1]] = None
            answers[TARGETS[2]] = store_pb2.LeaderResponse(member_id=3, leader_id=3, raft_term=4)
            await client._discover()
            assert not ended, ended
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 20))
