"""A sidecar's failed login the store cannot count gets the store's error (issue 21, item 2).

The store checks a sidecar's password itself (authstore/api/login.py) and puts each failure into
the log (``auth_failures``) before it answers. When that entry cannot be proposed (the proposal
times out, the node stops leading between the check and the proposal) the failure is not counted:
answering it as a wrong password would be a guessing oracle no lockout counts - the right
password gets the store's error then (its ``authenticate`` entry fails the same way). The central
proxy answers so since commit 288cc95; before this fix the store logged the failure, dropped it
and answered the wrong-password answer. A node that does not lead refuses before it checks.

Driven through the real StoreService (its proposal path, lockout on) over a fake node whose
proposals fail; Credentials is the only part replaced (the user's hash, no LMDB).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import bcrypt
import pytest

from authstore import metrics
from authstore.api.callers import Classifier
from authstore.api.interceptors import Refusal
from authstore.api.login import StoreLogin
from authstore.api.quota import Quota
from authstore.api.server import StoreService
from authstore.api.simple_tokens import SimpleTokens, StoreSimpleTokens
from authstore.api.watch.hub import WatchHub
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from protos.storepb import store_pb2
from raftgate.errors import Err, EtcdError

HASH = bcrypt.hashpw(b"pw", bcrypt.gensalt(4))


class _Node:
    """A node whose proposals fail with ``propose_error``; ``lead_for``: how many leadership
    checks it passes before it stops leading (None: it keeps leading)."""

    id = 1
    applied_index = 0
    last_index = 0
    is_leader = True

    def __init__(self, propose_error: Err | None = None, lead_for: int | None = None) -> None:
        self.propose_error = propose_error
        self.lead_for = lead_for
        self.proposed: list[ipb.InternalRaftRequest] = []

    async def must_lead(self) -> None:
        if self.lead_for is not None:
            if self.lead_for <= 0:
                raise EtcdError(Err.NOT_LEADER)
            self.lead_for -= 1

    async def propose(self, data: bytes, *_args: Any, **_kw: Any) -> Any:
        self.proposed.append(ipb.InternalRaftRequest.FromString(data))
        if self.propose_error is not None:
            raise EtcdError(self.propose_error)
        return rpc_pb2.AuthenticateResponse() if self.proposed[-1].HasField("authenticate") \
            else rpc_pb2.AuthStatusResponse()

    async def settled(self) -> None:
        pass

    async def caught_up(self) -> None:
        pass

    async def wait_applied(self, index: int) -> None:
        pass

    async def read_index(self) -> int:
        return 0


class _Maintenance:
    quota_bytes = 1 << 30

    def handles(self, kind: str) -> bool:
        return False


class _Service(StoreService):
    """Credentials from a table instead of LMDB: "alice" (password "pw") exists, lockout is on."""

    reads = 0

    async def credentials(self, data: bytes, context: Any = None) -> bytes:
        self.reads += 1
        name = store_pb2.CredentialsRequest.FromString(data).name
        return store_pb2.CredentialsResponse(auth_enabled=True, auth_revision=3, found=name == "alice",
                                             password_hash=HASH, lockout=True).SerializeToString()


@pytest.fixture(autouse=True)
def _no_gauge_left_behind() -> Iterator[None]:
    """A StoreService binds the process-wide locked-names gauge to itself; this fake one (no LMDB)
    must not stay bound, or a later test in the same process scrapes it and fails."""
    yield
    metrics.AUTH_LOCKED_NAMES.set_function(lambda: 0)


def _service(node: _Node) -> _Service:
    """Built as authstore/main.py builds it: the parts, the service over them, its login."""
    applier: Any = object()
    tokens = SimpleTokens(lambda: applier.env, lambda: applier.auth, node.propose, node.wait_applied,
                          lambda: node.last_index, node.caught_up)
    service = _Service(applier, node, _Maintenance(), proposer=node, watch_hub=WatchHub(applier, node),  # type: ignore[arg-type]
                       quota=Quota(applier, _Maintenance.quota_bytes, node.id, node.propose, lambda: 0),
                       tokens=tokens, verifiers=[StoreSimpleTokens(tokens)], classifier=Classifier(),
                       lockout_attempts=3, lockout_duration_ms=600_000)
    service.serve_logins(StoreLogin(service.credentials, service.commit_authenticate, lead=service.may_login,
                                    jwt=None, simple_ttl_seconds=300, workers=1, cost=4,
                                    record_failure=service.record_failure))
    return service


def _answer(node: _Node, name: str, password: str) -> tuple[str, str]:
    service = _service(node)

    async def run() -> tuple[str, str]:
        try:
            await service.login.authenticate(
                rpc_pb2.AuthenticateRequest(name=name, password=password).SerializeToString(), "10.0.0.9")
        except EtcdError as e:
            return e.code.name, e.message
        except Refusal as e:  # the store's gRPC code and message
            return e.code.name, e.message
        finally:
            service.login.close()
        return "OK", ""

    return asyncio.run(run())


@pytest.mark.parametrize("error", [Err.TIMEOUT, Err.TIMEOUT_DUE_TO_LEADER_FAIL, Err.NO_LEADER,
                                   Err.TOO_MANY_REQUESTS])
def test_a_failure_whose_entry_cannot_be_proposed_gets_the_stores_error(error: Err) -> None:
    right = _answer(_Node(propose_error=error), "alice", "pw")
    assert right == (error.code.name, error.message)
    assert _answer(_Node(propose_error=error), "alice", "wrong") == right
    assert _answer(_Node(propose_error=error), "ghost", "pw") == right


def test_a_node_that_stops_leading_after_the_check_answers_not_leader() -> None:
    """`not leader` was never taken: the sidecar's store client sends the login to the new
    leader, which checks and counts it."""
    not_leader = (Err.NOT_LEADER.code.name, Err.NOT_LEADER.message)
    assert _answer(_Node(lead_for=1), "alice", "pw") == not_leader
    assert _answer(_Node(lead_for=1), "alice", "wrong") == not_leader
    assert _answer(_Node(lead_for=1), "ghost", "pw") == not_leader


def test_a_node_that_does_not_lead_checks_no_password() -> None:
    node = _Node(lead_for=0)
    service = _service(node)

    async def run() -> Err | None:
        try:
            await service.login.authenticate(
                rpc_pb2.AuthenticateRequest(name="alice", password="wrong").SerializeToString(), "10.0.0.9")
        except EtcdError as e:
            return e.err
        finally:
            service.login.close()
        return None

    assert asyncio.run(run()) is Err.NOT_LEADER
    assert service.reads == 0 and node.proposed == []


def test_a_failure_that_is_proposed_is_the_wrong_password_answer() -> None:
    node = _Node()
    assert _answer(node, "alice", "wrong") == (Err.AUTH_FAILED.code.name, Err.AUTH_FAILED.message)
    assert [e.auth_failures.names for e in node.proposed] == [["alice"]]
    assert node.proposed[0].auth_failures.attempts == 3  # this node's policy
    assert _answer(_Node(), "alice", "pw") == ("OK", "")
