"""A failed password check that the store's lockout cannot count (the ``auth_failures`` entry is
refused or times out: no leader, a partition, an overloaded store) must not be answered as a
wrong password: the right password gets the store's error then (its ``authenticate`` entry fails
the same way), so "wrong password" vs "an error" would be a guessing oracle that no lockout
counts. Before the fix the failure was logged and dropped and the wrong-password answer given."""

from __future__ import annotations

import asyncio

import bcrypt
import grpc
import grpc.aio

from protos.etcdserverpb import rpc_pb2
from protos.storepb import store_pb2
from proxy.authenticate import Authenticator
from proxy.passwords import PasswordHasher
from raftgate.errors import EtcdError

HASH = bcrypt.hashpw(b"pw", bcrypt.gensalt(4))


class RefusingStore:
    """Reads work ("alice" exists, lockout on); every write is refused as when the store has no leader."""

    async def credentials(self, name: str, timeout: float | None = None) -> store_pb2.CredentialsResponse:
        return store_pb2.CredentialsResponse(auth_enabled=True, auth_revision=3, found=name == "alice",
                                             password_hash=HASH, lockout=True)

    async def do(self, data: bytes, timeout: float | None = None) -> bytes:
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                   "etcdserver: no leader")


def answer(name: str, password: str) -> tuple[str, str]:
    a = Authenticator(RefusingStore(), PasswordHasher(4, workers=2, queue_limit=64),  # type: ignore[arg-type]
                      jwt=None, simple_ttl_seconds=300)

    async def run() -> tuple[str, str]:
        try:
            await a.authenticate(rpc_pb2.AuthenticateRequest(name=name, password=password), 10, peer="ipv4:10.0.0.1")
        except EtcdError as e:
            return e.err.code.name, e.err.message
        except grpc.aio.AioRpcError as e:
            return e.code().name, e.details() or ""
        return "OK", ""

    return asyncio.run(run())


def test_an_uncounted_failure_answers_as_the_right_password_does() -> None:
    right = answer("alice", "pw")
    assert right == ("UNAVAILABLE", "etcdserver: no leader")
    assert answer("alice", "wrong") == right
    assert answer("ghost", "pw") == right
