"""A failed Authenticate of a name that does not exist costs a small log entry, whatever the
name's length: the name a client sends is bounded only by the request size (1.5 MiB), and each
failure waits for its ``auth_failures`` entry, so without a bound every failed guess with a huge
unknown name would write that name into every node's log (etcd writes nothing for a failure).
Names that exist are root's own and are recorded as they are.

Finding: each failed guess with a huge unknown name wrote the whole name (up to 1.5 MiB) into every
node's log (failed before the fix).
"""

from __future__ import annotations

import asyncio

import bcrypt

from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from protos.storepb import store_pb2
from proxy.authenticate import Authenticator
from proxy.passwords import PasswordHasher
from raftgate.errors import Err, EtcdError

HUGE = "x" * (1 << 20)
HASH = bcrypt.hashpw(b"pw", bcrypt.gensalt(4))


class Store:
    """Only "alice" exists; lockout is on; every entry is kept."""

    def __init__(self) -> None:
        self.entries: list[ipb.InternalRaftRequest] = []

    async def credentials(self, name: str, timeout: float | None = None) -> store_pb2.CredentialsResponse:
        return store_pb2.CredentialsResponse(auth_enabled=True, auth_revision=3, found=name == "alice",
                                             password_hash=HASH, lockout=True)

    async def do(self, data: bytes, timeout: float | None = None) -> bytes:
        self.entries.append(ipb.InternalRaftRequest.FromString(data))
        return store_pb2.InternalResponse(auth_status=rpc_pb2.AuthStatusResponse()).SerializeToString()


def authenticator(store: Store) -> Authenticator:
    return Authenticator(store, PasswordHasher(4, workers=2, queue_limit=64), jwt=None,  # type: ignore[arg-type]
                         simple_ttl_seconds=300)


async def login(a: Authenticator, name: str, password: str) -> Err | None:
    try:
        await a.authenticate(rpc_pb2.AuthenticateRequest(name=name, password=password), 10, peer="ipv4:10.0.0.1")
    except EtcdError as e:
        return e.err
    return None


def names(store: Store) -> list[str]:
    return [n for e in store.entries if e.HasField("auth_failures") for n in e.auth_failures.names]


def test_a_huge_unknown_name_costs_a_small_entry_and_is_still_counted_as_one_name() -> None:
    store = Store()
    a = authenticator(store)
    assert asyncio.run(login(a, HUGE, "pw")) is Err.AUTH_FAILED
    assert asyncio.run(login(a, HUGE, "other")) is Err.AUTH_FAILED
    assert asyncio.run(login(a, HUGE[:-1] + "y", "pw")) is Err.AUTH_FAILED
    recorded = names(store)
    assert len(recorded) == 3
    assert all(len(n.encode()) <= 256 for n in recorded)
    assert recorded[0] == recorded[1] != recorded[2]  # the same name counts together, another apart
    assert sum(len(e.SerializeToString()) for e in store.entries) < 1024


def test_a_short_unknown_name_and_an_existing_name_are_recorded_as_they_are() -> None:
    store = Store()
    a = authenticator(store)
    assert asyncio.run(login(a, "ghost", "pw")) is Err.AUTH_FAILED
    assert asyncio.run(login(a, "alice", "wrong")) is Err.AUTH_FAILED
    assert names(store) == ["ghost", "alice"]


def test_a_sidecar_login_with_a_huge_unknown_name_records_a_small_entry() -> None:
    """The store checks sidecars' logins itself (authstore/api/login.py): the same bound holds there."""
    from authstore.api.login import StoreLogin

    recorded: list[str] = []

    async def credentials(data: bytes) -> bytes:
        name = store_pb2.CredentialsRequest.FromString(data).name
        return store_pb2.CredentialsResponse(auth_enabled=True, auth_revision=3, found=name == "alice",
                                             password_hash=HASH, lockout=True).SerializeToString()

    async def commit(data: bytes) -> bytes:
        raise AssertionError("a failed login commits no token")

    async def record(name: str) -> None:
        recorded.append(name)

    async def lead() -> None:
        pass  # this node leads

    async def attempt(name: str) -> Err | None:
        login = StoreLogin(credentials, commit, lead=lead, jwt=None, simple_ttl_seconds=300, workers=2, cost=4,
                           record_failure=record)
        try:
            await login.authenticate(rpc_pb2.AuthenticateRequest(name=name, password="pw").SerializeToString(),
                                     peer="ipv4:10.0.0.9")
        except EtcdError as e:
            return e.err
        return None

    assert asyncio.run(attempt(HUGE)) is Err.AUTH_FAILED
    assert asyncio.run(attempt(HUGE)) is Err.AUTH_FAILED
    assert len(recorded) == 2 and recorded[0] == recorded[1] and len(recorded[0].encode()) <= 256
