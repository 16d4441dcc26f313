"""A simple token resolved after an auth change reached any node carries the revision of that change.

The proxy resolves a simple token at the leader, and when a node refuses a request as `revision of
auth store is old` it resolves the token again there and retries once: that second resolution must
come back at a revision no older than the refusing node's, or the retry is refused as old again and
the client gets `auth store is old` where etcd says `permission denied` (found as a rare failure of
tests/faults/test_follower_reads.py::test_a_revoked_permission_is_refused_on_every_node under a
loaded full suite). The leader's state lagged two ways: a write is answered once its batch is
decided, before the leader's own commit; and a follower applies an entry as soon as it learns the
commit index, which the leader sends before its own apply has even reached the batch (found by the
attack on the first fix, which waited for answered batches only). Resolving now first waits until
everything the node knows to be committed is applied (``RaftNode.caught_up``).
"""

from __future__ import annotations

import asyncio
import base64
import threading
from pathlib import Path
from typing import Any

import lmdb

from authstore.api.proposer import Proposer
from authstore.api.simple_tokens import SimpleTokens, now_ms
from authstore.node.driver import RaftNode
from authstore.raft.storage import MemoryStorage
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.simple_token import generate_prefix
from tests.support.held_commit import CommitHold, loop_turns, run_single_node
from tests.support.node_ports import NoWAL

#: what the proxy sends: base64 of a bcrypt hash (any one: nothing here checks the password)
ALICE_HASH = base64.b64encode(b"$2a$04$" + b"x" * 53).decode()
READ = auth_pb2.Permission(permType=auth_pb2.Permission.READ, key=b"/r/", range_end=b"/r0")


def _no_exit() -> Any:
    raise AssertionError("the node failed (see the log)")


def _setup() -> list[ipb.InternalRaftRequest]:
    no_password = auth_pb2.UserAddOptions(no_password=True)
    return [
        ipb.InternalRaftRequest(auth_user_add=pb.AuthUserAddRequest(name="root", options=no_password)),
        ipb.InternalRaftRequest(auth_role_add=pb.AuthRoleAddRequest(name="root")),
        ipb.InternalRaftRequest(auth_user_grant_role=pb.AuthUserGrantRoleRequest(user="root", role="root")),
        ipb.InternalRaftRequest(auth_user_add=pb.AuthUserAddRequest(name="alice", hashedPassword=ALICE_HASH)),
        ipb.InternalRaftRequest(auth_role_add=pb.AuthRoleAddRequest(name="reader")),
        ipb.InternalRaftRequest(auth_role_grant_permission=pb.AuthRoleGrantPermissionRequest(name="reader", perm=READ)),
        ipb.InternalRaftRequest(auth_user_grant_role=pb.AuthUserGrantRoleRequest(user="alice", role="reader")),
        ipb.InternalRaftRequest(auth_enable=pb.AuthEnableRequest()),
    ]


async def _login_alice(proposer: Proposer, revision: int) -> str:
    login = ipb.InternalAuthenticateRequest(name="alice", simple_token=generate_prefix(), checked_revision=revision,
                                            issued_at_unix_ms=now_ms(), ttl_seconds=300)  # fmt: skip
    issued = await proposer.propose(ipb.InternalRaftRequest(authenticate=login).SerializeToString())
    assert isinstance(issued, pb.AuthenticateResponse) and issued.token
    return issued.token


def _revoke_as_root(revision: int) -> bytes:
    revoke = pb.AuthRoleRevokePermissionRequest(role="reader", key=READ.key, range_end=READ.range_end)
    return ipb.InternalRaftRequest(header=ipb.RequestHeader(username="root", auth_revision=revision),
                                   auth_role_revoke_permission=revoke).SerializeToString()


def test_a_token_resolved_after_an_answered_revoke_carries_the_revoke_s_revision(tmp_path: Path) -> None:
    async def scenario(applier: Applier, node: RaftNode, hold: CommitHold) -> None:
        proposer = Proposer(node)
        tokens = SimpleTokens(lambda: applier.env, lambda: applier.auth, proposer.propose, node.wait_applied,
                              lambda: node.last_index, node.caught_up)
        for req in _setup():
            await proposer.propose(req.SerializeToString())
        with applier.env.begin() as txn:
            before = applier.auth.revision(txn)
        token = await _login_alice(proposer, before)
        first = await tokens.resolve(token)
        assert first.valid and first.auth_revision == before

        answer = await proposer.propose(_revoke_as_root(before))
        assert isinstance(answer, pb.AuthRoleRevokePermissionResponse)  # answered; its commit is held
        await hold.held()
        resolving = asyncio.get_running_loop().create_task(tokens.resolve(token))
        await loop_turns()  # the commit is held
        assert not resolving.done(), resolving.result()  # not at the revision before the revoke
        hold.release()
        async with asyncio.timeout(30):
            again = await resolving
        assert again.valid and again.auth_revision == before + 1

    run_single_node(tmp_path, lambda results: any(isinstance(r, pb.AuthRoleRevokePermissionResponse)
                                                  for _, r in results), scenario)  # fmt: skip


class LoopPeers:
    """Delivers each message to the addressed node on the event loop (a perfect network)."""

    def __init__(self, nodes: dict[int, RaftNode]) -> None:
        self._nodes = nodes

    def bind(self, receiver: Any) -> None:
        pass

    def send(self, m: Any) -> None:
        target = self._nodes.get(m.to)
        if target is not None:
            asyncio.get_running_loop().call_soon(target.step, m)

    async def send_snapshot(self, msg: Any, path: Path) -> bool:
        return False

    def active_peers(self) -> int:
        return len(self._nodes) - 1

    async def close(self) -> None:
        pass


def test_a_token_resolved_at_the_leader_after_a_follower_applied_a_revoke_carries_it(tmp_path: Path) -> None:
    nodes: dict[int, RaftNode] = {}
    appliers: dict[int, Applier] = {}
    backends = []
    for i in (1, 2, 3):
        backend = Backend(tmp_path / f"db{i}", map_size=64 << 20)
        backends.append(backend)
        appliers[i] = Applier(backend, member_id=i)
        nodes[i] = RaftNode(i, MemoryStorage.with_conf([1, 2, 3]), NoWAL(), appliers[i],  # type: ignore[arg-type]
                            LoopPeers(nodes), applied=0, snapshot_dir=tmp_path / f"snap{i}",
                            tick_seconds=0.02, election_ticks=10, fail_stop=_no_exit)
    hold = threading.Event()
    holding = threading.Event()
    go = threading.Event()

    def revision(i: int) -> int:
        with appliers[i].env.begin() as txn:
            return appliers[i].auth.revision(txn)

    async def scenario() -> None:
        for n in nodes.values():
            n.start()
        try:
            async with asyncio.timeout(30):
                while not any(n.is_leader for n in nodes.values()):
                    await asyncio.sleep(0.02)
            lid = next(i for i, n in nodes.items() if n.is_leader)
            leader, follower = nodes[lid], next(i for i in nodes if i != lid)
            proposer = Proposer(leader)
            tokens = SimpleTokens(lambda: appliers[lid].env, lambda: appliers[lid].auth, proposer.propose,
                                  leader.wait_applied, lambda: leader.last_index, leader.caught_up)
            for req in _setup():
                await proposer.propose(req.SerializeToString())
            before = revision(lid)
            token = await _login_alice(proposer, before)
            assert (await tokens.resolve(token)).auth_revision == before

            def hold_revoke(batch: lmdb.Transaction) -> None:  # the leader's apply thread, in the batch
                if hold.is_set() and appliers[lid].auth.revision(batch) > before:
                    holding.set()
                    assert go.wait(30), "never let go"

            appliers[lid].subscribe_entries(hold_revoke)
            hold.set()
            revoking = asyncio.get_running_loop().create_task(proposer.propose(_revoke_as_root(before)))
            assert await asyncio.to_thread(holding.wait, 30)
            async with asyncio.timeout(10):  # the follower learns the commit and applies the revoke
                while revision(follower) == before:
                    await asyncio.sleep(0.02)
            # the follower now refuses alice's requests stamped `before` as old; the proxy resolves
            # again at the leader: it must not get `before` back
            resolving = asyncio.get_running_loop().create_task(tokens.resolve(token))
            await asyncio.sleep(0.2)  # what must not happen has this long to happen: no condition to wait for
            early = resolving.result() if resolving.done() else None
            go.set()
            async with asyncio.timeout(30):
                await revoking
                again = await resolving
            assert early is None or early.auth_revision > before, (
                f"the leader resolved the token at revision {early.auth_revision} while follower {follower} "
                f"had applied the revoke (revision {revision(follower)}): the retry is refused as old again")
            assert again.auth_revision == before + 1
        finally:
            go.set()
            for n in nodes.values():
                await n.stop()

    try:
        asyncio.run(scenario())
    finally:
        for b in backends:
            b.close()
