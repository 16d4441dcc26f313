"""A simple token resolved after an auth change was answered carries the revision of that change.

The proxy resolves a simple token at the leader, and when the store refuses a request as `revision
of auth store is old` it resolves the token again and retries once. A write is answered once its
batch is decided, before the leader's own commit (test_answer_before_commit.py), and resolving
reads the committed state: so a token resolved between the answer to an auth change and its commit
came back at the revision before it, the retry was refused as old again, and the client got `auth
store is old` where etcd says `permission denied` (found as a rare failure of
tests/faults/test_follower_reads.py::test_a_revoked_permission_is_refused_on_every_node under a
loaded full suite: a follower had applied the revoke, the leader had not committed it). Resolving
now first waits for every answered batch to be applied (``RaftNode.settled``), as every other
answer from local state does.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from pathlib import Path
from typing import Any

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
from tests.support.node_ports import NoPeers, NoWAL

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


def test_a_token_resolved_after_an_answered_revoke_carries_the_revoke_s_revision(tmp_path: Path) -> None:
    backend = Backend(tmp_path / "db", map_size=64 << 20)
    applier = Applier(backend, member_id=1)
    node = RaftNode(1, MemoryStorage.with_conf([1]), NoWAL(), applier, NoPeers(),  # type: ignore[arg-type]
                    applied=0, snapshot_dir=tmp_path / "snap", fail_stop=_no_exit)
    proposer = Proposer(node)
    tokens = SimpleTokens(lambda: applier.env, lambda: applier.auth, proposer.propose, node.wait_applied,
                          lambda: node.last_index, node.settled)
    commit_may_go = threading.Event()
    holding = threading.Event()

    def hold_commit(index: int, results: list[tuple[int, Any]], _membership_changed: bool) -> None:
        if any(isinstance(r, pb.AuthRoleRevokePermissionResponse) for _, r in results):
            holding.set()
            assert commit_may_go.wait(30), "the test never let the commit go"

    applier.on_decided(hold_commit)  # the revoke's batch is answered, its commit takes long

    async def scenario() -> None:
        node.start()
        try:
            for req in _setup():
                await proposer.propose(req.SerializeToString())
            with applier.env.begin() as txn:
                before = applier.auth.revision(txn)
            login = ipb.InternalAuthenticateRequest(name="alice", simple_token=generate_prefix(),
                                                    checked_revision=before, issued_at_unix_ms=now_ms(),
                                                    ttl_seconds=300)  # fmt: skip
            issued = await proposer.propose(ipb.InternalRaftRequest(authenticate=login).SerializeToString())
            assert isinstance(issued, pb.AuthenticateResponse) and issued.token
            first = await tokens.resolve(issued.token)
            assert first.valid and first.auth_revision == before

            revoke = pb.AuthRoleRevokePermissionRequest(role="reader", key=READ.key, range_end=READ.range_end)
            as_root = ipb.InternalRaftRequest(header=ipb.RequestHeader(username="root", auth_revision=before),
                                              auth_role_revoke_permission=revoke)
            answer = await proposer.propose(as_root.SerializeToString())
            assert isinstance(answer, pb.AuthRoleRevokePermissionResponse)  # answered; its commit is held
            assert await asyncio.to_thread(holding.wait, 30)
            resolving = asyncio.get_running_loop().create_task(tokens.resolve(issued.token))
            for _ in range(20):
                await asyncio.sleep(0)  # turns of the loop, no time: the commit is held
            assert not resolving.done(), resolving.result()  # not at the revision before the revoke
            commit_may_go.set()
            async with asyncio.timeout(30):
                again = await resolving
            assert again.valid and again.auth_revision == before + 1
        finally:
            commit_may_go.set()
            await node.stop()

    try:
        asyncio.run(scenario())
    finally:
        backend.close()
