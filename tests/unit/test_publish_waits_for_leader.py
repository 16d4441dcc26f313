"""A starting member publishes its attributes (and so says ready) as soon as a leader is known,
as etcd's publish does (its proposal waits for a leader): not at its next half-second look. A
single member leads within one election timeout of its start (the initial election tick
advance); a poll would hold its ready line up to half a second longer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from authstore.api import maintenance as maintenance_module
from authstore.api.maintenance import Maintenance, MemberInfo
from protos.etcdserverpb import rpc_pb2 as pb


class _Membership:
    def __init__(self) -> None:
        self.member = pb.Member(ID=1, name="")  # in the list (a new cluster's), attributes not published

    def get(self, _txn: object, _mid: int) -> pb.Member:
        return self.member

    def internal_urls(self, _txn: object, _mid: int) -> list[str]:
        return []

    def gateway_urls(self, _txn: object, _mid: int) -> list[str]:
        return []


class _Env:
    @contextlib.contextmanager
    def begin(self) -> Iterator[None]:
        yield None


class _Node:
    """No leader until ``elect``; ``admit`` waits for one, as RaftNode.admit does."""

    def __init__(self) -> None:
        self.id = 1
        self.leader_id = 0
        self._leader = asyncio.get_running_loop().create_future()

    def elect(self) -> None:
        self.leader_id = 1
        self._leader.set_result(None)

    async def admit(self) -> None:
        await self._leader


def _published_once_elected(monkeypatch: pytest.MonkeyPatch, first_wait_runs_out: bool) -> bool:
    """Whether publishing is done within a few loop turns of a leader becoming known, half-second
    polls never returning; ``first_wait_runs_out``: the first proposal fails `no leader` (its wait
    of two election timeouts for a leader ran out)."""
    from raftgate.errors import Err, EtcdError

    async def no_poll(_seconds: float) -> None:
        await asyncio.get_running_loop().create_future()  # a poll never returns here

    monkeypatch.setattr(maintenance_module, "asyncio", SimpleNamespace(sleep=no_poll))

    async def main() -> bool:
        node = _Node()
        membership = _Membership()
        applier: Any = SimpleNamespace(env=_Env(), membership=membership)
        proposals = 0

        async def propose(_data: bytes) -> None:
            nonlocal proposals
            proposals += 1
            if first_wait_runs_out and proposals == 1:
                raise EtcdError(Err.NO_LEADER)  # RaftNode.admit: no leader within two election timeouts
            await node.admit()
            membership.member = pb.Member(ID=1, name="s1")

        proposer: Any = SimpleNamespace(propose=propose)
        m = Maintenance(applier, node, proposer, MemberInfo("s1"), 0, "token")  # type: ignore[arg-type]
        publishing = asyncio.ensure_future(m.publish_attributes())
        for _ in range(10):
            await asyncio.sleep(0)
        node.elect()
        for _ in range(10):
            await asyncio.sleep(0)
        done = publishing.done()
        publishing.cancel()
        return done

    return asyncio.run(main())


def test_publishing_follows_the_leader_not_a_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _published_once_elected(monkeypatch, False), "published only at a later poll, not once the leader was known"


def test_publishing_asks_again_at_once_after_a_wait_for_a_leader_ran_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A member started without quorum: its proposal waited two election timeouts for a leader and
    failed `no leader`. It proposes again at once, so it waits for the leader again (etcd's
    publish retries at once: its proposal already waited its request timeout), and publishes as
    soon as one is known, not up to half a second later."""
    assert _published_once_elected(monkeypatch, True), \
        "published only at a later poll after `no leader`, not once the leader was known"
