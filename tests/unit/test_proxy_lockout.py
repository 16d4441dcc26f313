"""The proxy's side of lockout (proxy/lockout.py, proxy/authenticate.py), against a fake store:
a locked name fails even with the right password, failures are recorded (and batched while one
entry is under way), and the per-client rate limit."""

from __future__ import annotations

import asyncio
from typing import Any

import bcrypt
import pytest

from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from protos.storepb import store_pb2
from proxy.authenticate import Authenticator
from proxy.lockout import RateLimiter
from proxy.passwords import PasswordHasher
from raftgate.errors import Err, EtcdError

HASH = bcrypt.hashpw(b"pw", bcrypt.gensalt(4))


class Store:
    def __init__(self, *, locked: bool = False, lockout: bool = True, delay: float = 0.0) -> None:
        self.locked = locked
        self.lockout = lockout
        self.delay = delay
        self.entries: list[ipb.InternalRaftRequest] = []

    async def credentials(self, name: str, timeout: float | None = None) -> store_pb2.CredentialsResponse:
        return store_pb2.CredentialsResponse(auth_enabled=True, auth_revision=3, found=name == "alice",
                                             password_hash=HASH if name == "alice" else b"",
                                             lockout=self.lockout, locked=self.locked)

    async def do(self, data: bytes, timeout: float | None = None) -> bytes:
        req = ipb.InternalRaftRequest.FromString(data)
        self.entries.append(req)
        await asyncio.sleep(self.delay)
        if req.HasField("authenticate"):
            resp = rpc_pb2.AuthenticateResponse(token="t.1")
            return store_pb2.InternalResponse(authenticate=resp).SerializeToString()
        return store_pb2.InternalResponse(auth_status=rpc_pb2.AuthStatusResponse()).SerializeToString()


def authenticator(store: Store, **kw: Any) -> Authenticator:
    return Authenticator(store, PasswordHasher(4, workers=2, queue_limit=64), jwt=None,  # type: ignore[arg-type]
                         simple_ttl_seconds=300, **kw)


async def login(a: Authenticator, name: str, password: str, peer: str = "ipv4:10.0.0.1") -> Err | None:
    try:
        await a.authenticate(rpc_pb2.AuthenticateRequest(name=name, password=password), 10, peer=peer)
    except EtcdError as e:
        return e.err
    return None


def names(store: Store) -> list[str]:
    return [n for e in store.entries if e.HasField("auth_failures") for n in e.auth_failures.names]


def test_a_locked_name_fails_with_the_right_password_and_asks_no_token() -> None:
    store = Store(locked=True)
    assert asyncio.run(login(authenticator(store), "alice", "pw")) is Err.AUTH_FAILED
    assert names(store) == ["alice"] and not any(e.HasField("authenticate") for e in store.entries)


def test_failures_are_recorded_for_names_that_exist_or_not_and_only_with_lockout_on() -> None:
    store = Store()
    a = authenticator(store)
    assert asyncio.run(login(a, "alice", "wrong")) is Err.AUTH_FAILED
    assert asyncio.run(login(a, "ghost", "pw")) is Err.AUTH_FAILED
    assert asyncio.run(login(a, "alice", "pw")) is None
    assert names(store) == ["alice", "ghost"]
    off = Store(lockout=False)
    assert asyncio.run(login(authenticator(off), "ghost", "pw")) is Err.AUTH_FAILED
    assert off.entries == []


def test_concurrent_failures_share_entries() -> None:
    store = Store(delay=0.05)
    a = authenticator(store)

    async def storm() -> list[Err | None]:
        return await asyncio.gather(*(login(a, f"ghost{i}", "pw", peer=f"ipv4:10.0.0.{i}") for i in range(40)))

    assert asyncio.run(storm()) == [Err.AUTH_FAILED] * 40
    assert sorted(names(store)) == sorted(f"ghost{i}" for i in range(40))
    assert len(store.entries) < 40


def test_the_rate_limit_is_per_client_and_refills() -> None:
    now = [0.0]
    limit = RateLimiter(2, clock=lambda: now[0], max_peers=2)
    assert [limit.allow("a") for _ in range(3)] == [True, True, False]
    assert limit.allow("b")
    now[0] = 0.5
    assert limit.allow("a") and not limit.allow("a")
    limit.allow("c")  # a third client: the one seen least recently is forgotten
    assert len(limit._buckets) == 2


def test_the_rate_limit_answers_too_many_requests() -> None:
    a = authenticator(Store(), rate_limit=0.001)
    assert asyncio.run(login(a, "alice", "pw")) is None
    assert asyncio.run(login(a, "alice", "pw")) is Err.TOO_MANY_REQUESTS
    assert asyncio.run(login(a, "alice", "pw", peer="")) is None  # the proxy's own (identity mode)


@pytest.mark.parametrize("rate", [0.0])
def test_no_rate_limit_by_default(rate: float) -> None:
    a = authenticator(Store(), rate_limit=rate)
    assert all(asyncio.run(login(a, "alice", "pw")) is None for _ in range(5))


def test_the_rate_limit_applies_in_sidecar_mode_before_the_store() -> None:
    """A --sidecar proxy hands Authenticate to the store; its own rate limit still answers first."""
    store = Store()
    asked: list[bytes] = []

    async def authenticate(data: bytes, timeout: float | None = None) -> bytes:
        asked.append(data)
        return rpc_pb2.AuthenticateResponse(token="t.1").SerializeToString()

    store.authenticate = authenticate  # type: ignore[attr-defined]
    a = authenticator(store, rate_limit=0.001, sidecar=True)
    assert asyncio.run(login(a, "alice", "pw")) is None
    assert asyncio.run(login(a, "alice", "pw")) is Err.TOO_MANY_REQUESTS
    assert len(asked) == 1  # the refused call never reached the store


def test_the_audit_record_of_a_login_to_a_locked_name_says_locked() -> None:
    """The client gets the wrong-password answer either way; the operator's audit record tells a
    locked name (`"locked": true`) from a wrong password."""
    from proxy.audit import handlers
    from proxy.audit.records import build
    from raftgate.methods import METHODS

    method = next(m for m in METHODS if m.name == "Authenticate")

    async def attempt(store: Store, password: str) -> handlers.Call:
        call = handlers.Call(method=method, peer="ipv4:10.0.0.1")
        handlers.CURRENT.set(call)
        await login(authenticator(store), "alice", password)
        return call

    assert asyncio.run(attempt(Store(locked=True), "pw")).locked
    assert not asyncio.run(attempt(Store(), "wrong")).locked
    line = build(wall=0.0, method=method, user="alice", peer="p", result="x", auth_revision=0,
                 duration_ms=1.0, token_fp="", extra={"locked": True})
    assert b'"locked":true' in line
