"""Review findings on the proxy: bcrypt ordering and bounds, shared token lookups, malformed
requests, and the store-side order of request validation before `invalid auth token`."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from authstore.api.server import unmarshal_error
from protos import wire
from protos.etcdserverpb import raft_internal_pb2, rpc_pb2, rpc_pb2_grpc
from protos.storepb import store_pb2
from proxy.identity import UNRESOLVED, Resolver
from proxy.passwords import PasswordHasher
from proxy.server import ProxyServer
from proxy.tokens.simple import SimpleTokenCache
from raftgate.errors import UNMARSHAL_ERROR_PREFIX, Err, EtcdError
from tests.support.fake_store import FakeStore, login, md, run

LONG = "x" * 73  # one byte over bcrypt's limit


def _count_hashes(proxy: ProxyServer) -> list[str]:
    """Records every password the proxy sends to bcrypt for hashing."""
    hashed: list[str] = []
    original = proxy.hasher.hash

    async def counting(password: str, **kw: Any) -> str:
        hashed.append(password)
        return await original(password, **kw)

    proxy.hasher.hash = counting  # type: ignore[method-assign]
    return hashed


async def _status(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return e.value.code(), e.value.details() or ""


def _err(err: Err) -> tuple[grpc.StatusCode, str]:
    return err.code, err.message


# --- 1. UserAdd / UserChangePassword: length, then caller, then bcrypt ----------------------------


def test_password_admin_refuses_unusable_callers_before_bcrypt(tmp_path: Path) -> None:
    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, proxy: ProxyServer) -> None:
        auth = rpc_pb2_grpc.AuthStub(ch)
        hashed = _count_hashes(proxy)
        add = rpc_pb2.AuthUserAddRequest(name="u", password="pw")
        change = rpc_pb2.AuthUserChangePasswordRequest(name="u", password="pw")
        sent = len(fake.requests)
        for call in (auth.UserAdd, auth.UserChangePassword):
            request = add if call is auth.UserAdd else change
            # auth on, no token: "user name is empty", without bcrypt
            assert await _status(call(request)) == _err(Err.USER_EMPTY)
            # a token that does not resolve: "invalid auth token", without bcrypt
            assert await _status(call(request, metadata=md("abcdefghijklmnop.999"))) == _err(Err.INVALID_AUTH_TOKEN)
            assert await _status(call(request, metadata=md("junk"))) == _err(Err.INVALID_AUTH_TOKEN)
        assert hashed == []
        assert [r for r in fake.requests[sent:] if not r.HasField("auth_status")] == []
        # bcrypt's length error comes first of all, even before the (missing) token
        assert await _status(auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="u", password=LONG))) == _err(
            Err.PASSWORD_TOO_LONG
        )
        assert await _status(
            auth.UserChangePassword(rpc_pb2.AuthUserChangePasswordRequest(name="u", password=LONG), metadata=md("junk"))
        ) == _err(Err.PASSWORD_TOO_LONG)
        # ...but a no-password user has no password to measure
        token = await login(ch)
        no_pw = rpc_pb2.AuthUserAddRequest(name="np", password=LONG, options={"no_password": True})
        await auth.UserAdd(no_pw, metadata=md(token))
        assert fake.requests[-1].auth_user_add.hashedPassword == "" and hashed == []
        # a valid caller is hashed and forwarded
        await auth.UserAdd(add, metadata=md(token))
        await auth.UserChangePassword(change, metadata=md(token))
        assert hashed == ["pw", "pw"]
        assert fake.requests[-1].auth_user_change_password.hashedPassword

    run(tmp_path, scenario)


def test_password_admin_with_auth_disabled_needs_no_identity(tmp_path: Path) -> None:
    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, proxy: ProxyServer) -> None:
        fake.auth_enabled = False
        hashed = _count_hashes(proxy)
        auth = rpc_pb2_grpc.AuthStub(ch)
        await auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="u", password="pw"))
        await auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="v", password="pw"), metadata=md("garbage"))
        assert hashed == ["pw", "pw"] and fake.requests[-1].auth_user_add.password == ""

    run(tmp_path, scenario)


# --- 1. the bcrypt queue is bounded --------------------------------------------------------------


def test_hasher_refuses_beyond_queue_limit() -> None:
    async def go() -> None:
        hasher = PasswordHasher(4, workers=1, queue_limit=1)
        release = threading.Event()
        try:
            blocker = asyncio.ensure_future(hasher._run("hash", release.wait))
            waiting = asyncio.ensure_future(hasher.hash("pw"))
            await asyncio.sleep(0.05)
            assert hasher.pending == 2
            with pytest.raises(EtcdError) as e:
                await hasher.hash("pw")
            assert e.value.err is Err.TOO_MANY_REQUESTS
            # password checks have their own lane: a full hashing queue does not refuse them
            assert await hasher.check("pw", b"") is False
            # a caller that gives up frees its place
            waiting.cancel()
            await asyncio.sleep(0.05)
            assert hasher.pending == 1
            release.set()
            await blocker
            assert hasher.pending == 0
            assert await hasher.hash("pw")
        finally:
            release.set()
            hasher.close()

    asyncio.run(go())


def test_full_bcrypt_queue_answers_too_many_requests(tmp_path: Path) -> None:
    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, proxy: ProxyServer) -> None:
        token = await login(ch)
        release = threading.Event()
        # --bcrypt-workers=2 --bcrypt-queue-limit=1: two running checks and one waiting fill the
        # check lane; the hashing lane (one worker) is full with one running and one waiting
        blockers = [asyncio.ensure_future(proxy.hasher._run("check", release.wait)) for _ in range(3)]
        blockers += [asyncio.ensure_future(proxy.hasher._run("hash", release.wait)) for _ in range(2)]
        try:
            await asyncio.sleep(0.05)
            auth = rpc_pb2_grpc.AuthStub(ch)
            too_many = _err(Err.TOO_MANY_REQUESTS)
            assert too_many == (grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: too many requests")
            assert await _status(auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="x"))) == too_many
            assert await _status(auth.Authenticate(rpc_pb2.AuthenticateRequest(name="ghost", password="x"))) == too_many
            add = rpc_pb2.AuthUserAddRequest(name="u", password="pw")
            assert await _status(auth.UserAdd(add, metadata=md(token))) == too_many
        finally:
            release.set()
            await asyncio.gather(*blockers)
        assert await login(ch)

    run(tmp_path, scenario, "--bcrypt-queue-limit=1")


# --- 3. a shared token lookup survives a cancelled caller ----------------------------------------


class _SlowStore:
    def __init__(self, *, fail: bool = False) -> None:
        self.release = asyncio.Event()
        self.calls = 0
        self.fail = fail

    async def resolve_token(self, token: str, timeout: float | None = None) -> store_pb2.ResolveTokenResponse:
        self.calls += 1
        await self.release.wait()
        if self.fail:
            raise RuntimeError("store down")
        return store_pb2.ResolveTokenResponse(auth_enabled=True, valid=True, username="alice", auth_revision=4)


def test_cancelled_caller_does_not_poison_shared_lookup() -> None:
    async def go() -> None:
        store = _SlowStore()
        resolver = Resolver(store, jwt=None, simple=SimpleTokenCache(300))  # type: ignore[arg-type]
        token = "abcdefghijklmnop.7"
        first = asyncio.ensure_future(resolver.resolve(token))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(resolver.resolve(token))
        await asyncio.sleep(0)
        first.cancel()  # the first caller (which started the lookup) goes away
        await asyncio.sleep(0)
        store.release.set()
        identity = await second
        assert (identity.username, identity.revision) == ("alice", 4)
        assert first.cancelled() and store.calls == 1
        # the result was cached by the lookup itself
        assert (await resolver.resolve(token)).username == "alice" and store.calls == 1

    asyncio.run(go())


def test_shared_lookup_failure_reaches_every_waiter() -> None:
    async def go() -> None:
        store = _SlowStore(fail=True)
        resolver = Resolver(store, jwt=None, simple=SimpleTokenCache(300))  # type: ignore[arg-type]
        waiters = [asyncio.ensure_future(resolver.resolve("abcdefghijklmnop.7")) for _ in range(3)]
        await asyncio.sleep(0)
        store.release.set()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in results) and store.calls == 1
        # nothing stays in flight: the next call asks again
        store.fail = False
        assert (await resolver.resolve("abcdefghijklmnop.7")).username == "alice" and store.calls == 2

    asyncio.run(go())


def test_unusable_token_can_be_deferred_to_the_store() -> None:
    async def go() -> None:
        resolver = Resolver(None, jwt=None, simple=SimpleTokenCache(300))  # type: ignore[arg-type]
        assert await resolver.resolve("junk", defer_invalid=True) is UNRESOLVED

    asyncio.run(go())


# --- 5. malformed requests get grpc-go's wording with the reason -------------------------------


def test_malformed_parsed_requests_get_grpc_go_wording(tmp_path: Path) -> None:
    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, proxy: ProxyServer) -> None:
        hashed = _count_hashes(proxy)
        for method, type_name in [
            ("Authenticate", "AuthenticateRequest"),
            ("UserAdd", "AuthUserAddRequest"),
            ("UserChangePassword", "AuthUserChangePasswordRequest"),
        ]:
            call = ch.unary_unary(f"/etcdserverpb.Auth/{method}")
            for data, reason in [(b"\x0f", "Wire format was corrupt"), (b"\x0a\x02\xff\xfe", "bad UTF-8")]:
                code, details = await _status(call(data))
                assert code == grpc.StatusCode.INTERNAL, (method, details)
                prefix = f"{UNMARSHAL_ERROR_PREFIX}Error parsing message with type 'etcdserverpb.{type_name}'"
                assert details.startswith(prefix), details
                assert reason in details
        assert hashed == []

    run(tmp_path, scenario)


def test_store_names_the_client_message_in_unmarshal_errors() -> None:
    from google.protobuf.message import DecodeError

    header = wire.encode_header("root", 3)
    data = wire.build_internal_request(header, 1102, b"\x0a\x02\xff\xfe")  # AuthUserGetRequest.name
    with pytest.raises(DecodeError) as e:
        raft_internal_pb2.InternalRaftRequest.FromString(data)
    text = unmarshal_error(data, e.value)
    assert text.startswith(UNMARSHAL_ERROR_PREFIX + "Error parsing message with type 'etcdserverpb.AuthUserGetRequest'")
    assert "UTF-8" in text


# --- 6. validation before `invalid auth token` ---------------------------------------------------


def test_unusable_token_is_forwarded_marked_and_validated_first(tmp_path: Path) -> None:
    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, proxy: ProxyServer) -> None:
        kv = rpc_pb2_grpc.KVStub(ch)
        for token in ("junk", "abcdefghijklmnop.999"):
            assert await _status(kv.Put(rpc_pb2.PutRequest(key=b""), metadata=md(token))) == _err(Err.EMPTY_KEY)
            assert fake.requests[-1].header.invalid_token and not fake.requests[-1].header.username
            assert await _status(kv.Range(rpc_pb2.RangeRequest(key=b"k"), metadata=md(token))) == _err(
                Err.INVALID_AUTH_TOKEN
            )
        # no extra AuthStatus round trip on this path: the store decides
        assert not any(r.HasField("auth_status") for r in fake.requests)
        # a good token is never marked
        token = await login(ch)
        await kv.Put(rpc_pb2.PutRequest(key=b"k"), metadata=md(token))
        assert not fake.requests[-1].header.invalid_token

    run(tmp_path, scenario)


def test_bcrypt_queue_limit_flag(tmp_path: Path) -> None:
    from proxy.config import ConfigError, load

    secret = tmp_path / "secret"
    secret.write_text("dev-secret\n")
    base = ["--store-endpoints=127.0.0.1:7000", f"--internal-secret-file={secret}", "--bcrypt-workers=3"]
    assert load(base, env={}).bcrypt_queue_limit == 12  # 4 per worker
    assert load([*base, "--bcrypt-queue-limit=0"], env={}).bcrypt_queue_limit == 0
    assert load(base, env={"RAFTGATE_PROXY_BCRYPT_QUEUE_LIMIT": "7"}).bcrypt_queue_limit == 7
    for bad in ("-1", "many"):
        with pytest.raises(ConfigError, match="--bcrypt-queue-limit"):
            load([*base, f"--bcrypt-queue-limit={bad}"], env={})


def test_internal_field_numbers_match_the_method_table() -> None:
    from protos.internal import AUTH_STATUS_FIELD, AUTHENTICATE_FIELD
    from raftgate.methods import METHODS

    fields = {m.name: m.field for m in METHODS}
    assert (fields["Authenticate"], fields["AuthStatus"]) == (AUTHENTICATE_FIELD, AUTH_STATUS_FIELD)
